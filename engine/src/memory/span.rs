//! The one place where bytes move between sockets and raw memory.
//!
//! Registered and caller memory is shared with other threads, with peers (through the
//! kernel) and with the application, so no `&[u8]` / `&mut [u8]` is ever formed over it:
//! a [`MemSpan`] is a pointer and a length, and its methods hand that pointer straight to
//! `recv(2)` / `sendmsg(2)` or `copy_nonoverlapping`. Every `unsafe` of that movement is
//! in this file, under the one contract of [`MemSpan::new`].
//!
//! A [`SocketCut`] lets another thread stop the I/O of a connection at once: it shuts the
//! socket down (waking a blocked `recv`/`send`) and raises a flag that the loops here check
//! before every system call, so bytes a peer keeps sending after the cut never land.

use std::io;
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Something that holds memory and can be told to let go of it now (a connection).
pub trait Abort: Send + Sync + std::fmt::Debug {
    /// Stops every access in progress; the holder releases its pins soon after.
    fn abort(&self);
}

/// The cut-off switch of one connection, and the deadline of the request it carries now.
#[derive(Debug)]
pub struct SocketCut {
    stream: TcpStream,
    cut: AtomicBool,
    created: Instant,
    /// Nanoseconds after `created` by which the current request must be done; 0: none.
    deadline_ns: AtomicU64,
}

impl SocketCut {
    /// A switch for `stream` (a clone of the connection's socket).
    pub fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            cut: AtomicBool::new(false),
            created: Instant::now(),
            deadline_ns: AtomicU64::new(0),
        }
    }

    /// Whether the connection was cut.
    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::Acquire)
    }

    /// Every read and write from now fails once `within` has passed (a peer that sends
    /// one byte at a time cannot hold the connection longer); `None` lifts the deadline.
    pub fn set_deadline(&self, within: Option<Duration>) {
        let ns = within.map_or(0, |d| {
            let at = self.created.elapsed() + d;
            u64::try_from(at.as_nanos()).unwrap_or(u64::MAX).max(1)
        });
        self.deadline_ns.store(ns, Ordering::Release);
    }

    /// Fails if the connection was cut or the request's deadline has passed.
    pub fn check(&self) -> io::Result<()> {
        if self.is_cut() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the connection was cut to release memory (timeout, interrupt or unregister)",
            ));
        }
        let deadline = self.deadline_ns.load(Ordering::Acquire);
        if deadline != 0 && self.created.elapsed().as_nanos() > u128::from(deadline) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the request did not complete by its deadline",
            ));
        }
        Ok(())
    }
}

impl Abort for SocketCut {
    fn abort(&self) {
        self.cut.store(true, Ordering::Release);
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// `len` bytes of memory at `addr` that this thread may move bytes into and out of.
#[derive(Debug, Clone, Copy)]
pub struct MemSpan {
    addr: u64,
    len: usize,
}

impl MemSpan {
    /// A span over `[addr, addr+len)`.
    ///
    /// # Safety
    /// For as long as the span is used, the range must be mapped host memory that nobody
    /// frees: registered memory pinned against unregistration, or caller memory lent for
    /// a transfer that has not been drained. Concurrent access by others is allowed (the
    /// span never creates a reference), but its bytes are then unspecified.
    pub unsafe fn new(addr: u64, len: usize) -> Self {
        Self { addr, len }
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the span is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first `n` bytes of the span (all of it if shorter).
    pub fn head(&self, n: usize) -> MemSpan {
        MemSpan {
            addr: self.addr,
            len: n.min(self.len),
        }
    }

    /// The part of the span from byte `from` on (empty past the end).
    pub fn tail(&self, from: usize) -> MemSpan {
        let from = from.min(self.len);
        MemSpan {
            addr: self.addr + from as u64,
            len: self.len - from,
        }
    }

    /// Fills the whole span from `sock`, stopping as soon as `cut` is raised.
    pub fn recv_from(&self, sock: &TcpStream, cut: &SocketCut) -> io::Result<()> {
        self.recv_with_spare(sock, cut, &mut [], None).map(|_| ())
    }

    /// Fills the whole span from `sock`, as [`recv_from`](Self::recv_from), and lets the
    /// same system calls carry on into `spare` with whatever the peer sent next (the next
    /// header or status, when it is already there): returns how many bytes of `spare` were
    /// filled. Never waits for bytes of `spare`. With `before_wait`, the first call only
    /// takes what is there, and `before_wait` runs once before the first call that may
    /// wait (to send what the peer may be waiting for).
    pub fn recv_with_spare(
        &self,
        sock: &TcpStream,
        cut: &SocketCut,
        spare: &mut [u8],
        before_wait: Option<&mut dyn FnMut() -> io::Result<()>>,
    ) -> io::Result<usize> {
        Self::recv_all_with_spare(*self, &[], sock, cut, spare, before_wait)
    }

    /// Fills `head`, then every span of `more`, in order, as
    /// [`recv_with_spare`](Self::recv_with_spare) fills one span: each system call takes in
    /// as many of them as the socket holds.
    pub fn recv_all_with_spare(
        head: MemSpan,
        more: &[MemSpan],
        sock: &TcpStream,
        cut: &SocketCut,
        spare: &mut [u8],
        mut before_wait: Option<&mut dyn FnMut() -> io::Result<()>>,
    ) -> io::Result<usize> {
        const NONE: libc::iovec = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        let total = head.len + more.iter().map(|s| s.len).sum::<usize>();
        // On the stack for up to 64 spans, a TCP run's worth (the hot path allocates nothing).
        let mut on_stack = [NONE; 2 + 64];
        let mut on_heap = Vec::new();
        let iov: &mut [libc::iovec] = match on_stack.get_mut(..more.len() + 2) {
            Some(part) => part,
            None => {
                on_heap.resize(more.len() + 2, NONE);
                &mut on_heap
            }
        };
        let spare_iov = libc::iovec {
            iov_base: spare.as_mut_ptr() as *mut libc::c_void,
            iov_len: spare.len(),
        };
        let spans = std::iter::once(&head).chain(more);
        for (v, from) in iov
            .iter_mut()
            .zip(spans.map(MemSpan::iovec).chain([spare_iov]))
        {
            *v = from;
        }
        // The first iovec not yet full; spans of no bytes need no call.
        let mut first = 0;
        let mut off = 0usize;
        let mut extra = 0usize;
        let mut flags = if before_wait.is_some() {
            libc::MSG_DONTWAIT
        } else {
            0
        };
        while off < total {
            cut.check()?;
            while iov.get(first).is_some_and(|v| v.iov_len == 0) && first + 1 < iov.len() {
                first += 1;
            }
            let calls = iov.get(first..).unwrap_or_default();
            let calls = calls.get(..calls.len().min(IOV_MAX)).unwrap_or_default();
            // SAFETY: every iovec but the last lies in a span (what is left of it), valid for
            // writing by the contract of `new`; the last is `spare`, borrowed mutably. The
            // kernel fills them in order, so `spare` only gets bytes once the spans are full.
            let n = unsafe { recv_iov(sock.as_raw_fd(), calls, flags) };
            if n > 0 {
                let n = n as usize;
                let into_spans = n.min(total - off);
                off += into_spans;
                extra = n - into_spans;
                consume(iov.get_mut(first..).unwrap_or_default(), into_spans);
            } else if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            } else {
                let e = io::Error::last_os_error();
                if flags == 0 || e.kind() != io::ErrorKind::WouldBlock {
                    retry_or(e)?;
                }
            }
            if flags != 0 && off < total {
                flags = 0;
                if let Some(f) = before_wait.take() {
                    f()?;
                }
            }
        }
        cut.check()?;
        Ok(extra)
    }

    /// Sends `head`, then the whole span, to `sock` (one system call when the socket takes
    /// it all), stopping as soon as `cut` is raised.
    pub fn send_to(&self, sock: &TcpStream, head: &[u8], cut: &SocketCut) -> io::Result<()> {
        let mut iov = [iovec_of(head), self.iovec()];
        send_all(sock, &mut iov, cut)
    }

    /// Sends every piece in order, each its head and then its span (if any), in as few
    /// system calls as the socket takes, stopping as soon as `cut` is raised: pipelined
    /// requests leave in one `sendmsg`.
    pub fn send_pieces(
        sock: &TcpStream,
        pieces: &[(&[u8], Option<MemSpan>)],
        cut: &SocketCut,
    ) -> io::Result<()> {
        let mut iov = Vec::with_capacity(pieces.len() * 2);
        for (head, span) in pieces {
            iov.push(iovec_of(head));
            if let Some(span) = span {
                iov.push(span.iovec());
            }
        }
        send_all(sock, &mut iov, cut)
    }

    fn iovec(&self) -> libc::iovec {
        libc::iovec {
            iov_base: self.addr as usize as *mut libc::c_void,
            iov_len: self.len,
        }
    }

    /// Copies `src` into the start of the span.
    pub fn write_from(&self, src: &[u8]) -> Result<(), SpanTooShort> {
        if src.len() > self.len {
            return Err(SpanTooShort {
                need: src.len(),
                have: self.len,
            });
        }
        // SAFETY: `src.len()` bytes fit in the span (checked), valid by the contract of
        // `new`; a borrowed slice cannot overlap memory nobody may reference.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.addr as usize as *mut u8, src.len())
        };
        Ok(())
    }

    /// Copies all of `src` to the start of this span (a replica in this process's own
    /// segment: the store's local copy). The two spans may overlap.
    pub fn copy_from(&self, src: &MemSpan) -> Result<(), SpanTooShort> {
        if src.len > self.len {
            return Err(SpanTooShort {
                need: src.len,
                have: self.len,
            });
        }
        // SAFETY: both spans are valid for their lengths by the contract of `new`, and
        // `src.len` bytes fit in this one (checked); `copy` allows overlap.
        unsafe {
            std::ptr::copy(
                src.addr as usize as *const u8,
                self.addr as usize as *mut u8,
                src.len,
            )
        };
        Ok(())
    }

    /// Copies the start of the span into `dst`.
    pub fn read_into(&self, dst: &mut [u8]) -> Result<(), SpanTooShort> {
        if dst.len() > self.len {
            return Err(SpanTooShort {
                need: dst.len(),
                have: self.len,
            });
        }
        // SAFETY: as `write_from`, in the other direction.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.addr as usize as *const u8,
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        Ok(())
    }

    /// Sets every byte of the span to `byte`.
    pub fn fill(&self, byte: u8) {
        // SAFETY: the whole span is valid for writing by the contract of `new`.
        unsafe { std::ptr::write_bytes(self.addr as usize as *mut u8, byte, self.len) };
    }
}

/// The span of caller memory lent to a transfer: `[addr, addr+len)` of a slice that a
/// transport thread has taken ([`Held`](crate::transport::Held)), outside every
/// registered region.
///
/// Crate-private and safe because its only caller holds the proof in its type: a taken
/// slice, whose submitter lent the range until the batch finishes or is drained
/// (`TransferEngine::submit`'s contract), and whose batch the taking thread entered, so a
/// drain waits for it before the memory goes back.
pub(crate) fn lent(addr: u64, len: usize) -> MemSpan {
    // SAFETY: see above; the range stays mapped and unfreed while the slice is held.
    unsafe { MemSpan::new(addr, len) }
}

/// A span over `buf`, for tests of the code that moves bytes through spans. The test
/// keeps `buf` alive and unborrowed while the span is used.
#[cfg(test)]
pub(crate) fn test_span(buf: &mut [u8]) -> MemSpan {
    // SAFETY: `buf` is writable for its length; the test outlives every use of the span.
    unsafe { MemSpan::new(buf.as_mut_ptr() as u64, buf.len()) }
}

/// A copy larger than the span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{need} bytes do not fit in a span of {have}")]
pub struct SpanTooShort {
    /// Bytes asked for.
    pub need: usize,
    /// Bytes in the span.
    pub have: usize,
}

fn iovec_of(bytes: &[u8]) -> libc::iovec {
    libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    }
}

/// Sends all of `iov` (advancing it past what went out), checking `cut` before every
/// system call. The iovecs come from borrowed slices and [`MemSpan`]s, so they describe
/// readable memory.
fn send_all(sock: &TcpStream, iov: &mut [libc::iovec], cut: &SocketCut) -> io::Result<()> {
    let mut first = 0usize;
    loop {
        // Empty iovecs (an empty head or span) need no system call of their own.
        while iov.get(first).is_some_and(|v| v.iov_len == 0) {
            first += 1;
        }
        if first == iov.len() {
            return Ok(());
        }
        cut.check()?;
        let end = iov.len().min(first + IOV_MAX);
        let part = iov.get(first..end).unwrap_or_default();
        // SAFETY: every iovec describes readable memory (a borrowed slice, or a span
        // valid by the contract of `MemSpan::new`), advanced only within itself below.
        let n = unsafe { send_iov(sock.as_raw_fd(), part) };
        match n {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n if n > 0 => consume(iov.get_mut(first..).unwrap_or_default(), n as usize),
            _ => retry_or(io::Error::last_os_error())?,
        }
    }
}

/// `sendmsg` and `recvmsg` take at most IOV_MAX (1024) iovecs a call.
const IOV_MAX: usize = 1024;

/// Advances `iov` past `n` bytes that a system call moved: the iovecs it filled or emptied
/// become empty, the one it stopped in starts where it stopped.
fn consume(iov: &mut [libc::iovec], mut n: usize) {
    for v in iov {
        if n == 0 {
            break;
        }
        let step = n.min(v.iov_len);
        v.iov_base = (v.iov_base as usize + step) as *mut libc::c_void;
        v.iov_len -= step;
        n -= step;
    }
}

/// # Safety
/// Every iovec must describe memory valid for reading.
unsafe fn send_iov(fd: RawFd, iov: &[libc::iovec]) -> isize {
    // SAFETY: a zeroed msghdr is the empty message; we set only the iovec array, which
    // outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: `msg` points at `iov`, readable by the caller's contract. MSG_NOSIGNAL:
    // a peer that went away is an EPIPE error, not a SIGPIPE for the process.
    unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) }
}

/// `recvmsg(2)` into `iov`.
///
/// # Safety
/// Every iovec must describe memory valid for writing.
unsafe fn recv_iov(fd: RawFd, iov: &[libc::iovec], flags: libc::c_int) -> isize {
    // SAFETY: as `send_iov`: the empty message with only the iovec array set.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: `msg` points at `iov`, writable by the caller's contract.
    unsafe { libc::recvmsg(fd, &mut msg, flags) }
}

/// Interrupted calls are retried; a socket timeout (EAGAIN under SO_RCVTIMEO) is reported
/// as `TimedOut`.
fn retry_or(e: io::Error) -> io::Result<()> {
    match e.kind() {
        io::ErrorKind::Interrupted => Ok(()),
        io::ErrorKind::WouldBlock => Err(io::Error::new(io::ErrorKind::TimedOut, e)),
        _ => Err(e),
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, reason = "tests index known-good data")]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn moves_bytes_both_ways_with_a_header() {
        let (a, mut b) = pair();
        let cut = SocketCut::new(a.try_clone().unwrap());
        let src: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        // SAFETY: `src` outlives every use of the span.
        let span = unsafe { MemSpan::new(src.as_ptr() as u64, src.len()) };
        let t = std::thread::spawn(move || {
            let mut got = vec![0u8; 100_003];
            b.read_exact(&mut got).unwrap();
            b.write_all(&got[3..]).unwrap();
            got
        });
        span.send_to(&a, b"hdr", &cut).unwrap();
        let echoed = t.join().unwrap();
        assert_eq!(&echoed[..3], b"hdr");
        let mut dst = vec![0u8; src.len()];
        // SAFETY: `dst` outlives every use of the span.
        let out = unsafe { MemSpan::new(dst.as_mut_ptr() as u64, dst.len()) };
        out.recv_from(&a, &cut).unwrap();
        let mut copy = vec![0u8; dst.len()];
        out.read_into(&mut copy).unwrap();
        assert_eq!(copy, src);
    }

    /// Many pieces through a small send buffer: `sendmsg` takes part of an iovec at a
    /// time, so the advance over partial sends is exercised; empty heads and spans add
    /// nothing.
    #[test]
    fn pieces_leave_in_order_through_partial_sends() {
        let (a, mut b) = pair();
        socket2::SockRef::from(&a)
            .set_send_buffer_size(4096)
            .unwrap();
        let cut = SocketCut::new(a.try_clone().unwrap());
        let payloads: Vec<Vec<u8>> = (0..40u32)
            .map(|i| (0..(i * 997) % 20_000).map(|j| (i + j) as u8).collect())
            .collect();
        let heads: Vec<Vec<u8>> = (0..40u8)
            .map(|i| vec![i; usize::from(i % 3) * 12])
            .collect();
        let mut want = Vec::new();
        let pieces: Vec<(&[u8], Option<MemSpan>)> = heads
            .iter()
            .zip(&payloads)
            .enumerate()
            .map(|(i, (h, p))| {
                want.extend_from_slice(h);
                // Every third piece is a header alone (a read request).
                let span = (i % 3 != 1).then(|| {
                    want.extend_from_slice(p);
                    // SAFETY: `payloads` outlives the send below.
                    unsafe { MemSpan::new(p.as_ptr() as u64, p.len()) }
                });
                (h.as_slice(), span)
            })
            .collect();
        let n = want.len();
        let t = std::thread::spawn(move || {
            let mut got = vec![0u8; n];
            b.read_exact(&mut got).unwrap();
            got
        });
        MemSpan::send_pieces(&a, &pieces, &cut).unwrap();
        assert_eq!(t.join().unwrap(), want);
    }

    /// What follows the span comes along into `spare` when it is already there, and the
    /// span never gets a byte more than its length.
    #[test]
    fn a_receive_reads_ahead_into_spare_only_past_the_span() {
        let (a, mut b) = pair();
        let cut = SocketCut::new(a.try_clone().unwrap());
        b.write_all(&[7u8; 1000]).unwrap();
        b.write_all(b"NEXT-HEADER").unwrap();
        let mut dst = vec![0u8; 1100];
        // SAFETY: `dst` outlives the span.
        let span = unsafe { MemSpan::new(dst.as_mut_ptr() as u64, 1000) };
        let mut spare = [0u8; 64];
        // Both writes are in the socket by now on loopback; wait to be sure.
        std::thread::sleep(Duration::from_millis(50));
        let extra = span.recv_with_spare(&a, &cut, &mut spare, None).unwrap();
        assert_eq!(&spare[..extra], b"NEXT-HEADER");
        assert!(dst[..1000].iter().all(|&x| x == 7));
        assert!(dst[1000..].iter().all(|&x| x == 0), "written past the span");
        // Nothing there after the span: it returns without waiting for `spare`.
        b.write_all(&[9u8; 10]).unwrap();
        // SAFETY: as above.
        let ten = unsafe { MemSpan::new(dst.as_mut_ptr() as u64, 10) };
        assert_eq!(ten.recv_with_spare(&a, &cut, &mut spare, None).unwrap(), 0);
        assert!(dst[..10].iter().all(|&x| x == 9));
    }

    #[test]
    fn a_cut_stops_a_blocked_receive_and_every_later_byte() {
        let (a, mut b) = pair();
        let cut = std::sync::Arc::new(SocketCut::new(a.try_clone().unwrap()));
        let mut dst = vec![0u8; 1 << 20];
        let addr = dst.as_mut_ptr() as u64;
        b.write_all(&[1u8; 1000]).unwrap();
        let c2 = cut.clone();
        let reader = std::thread::spawn(move || {
            // SAFETY: `dst` outlives the thread (joined below).
            let span = unsafe { MemSpan::new(addr, 1 << 20) };
            span.recv_from(&a, &c2)
        });
        // The reader now waits for bytes that do not come; the cut must end that wait.
        cut.abort();
        let err = reader.join().unwrap().unwrap_err();
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::ConnectionAborted | io::ErrorKind::UnexpectedEof
            ),
            "{err}"
        );
        // The peer keeps sending; nothing more may land.
        let _ = b.write_all(&[2u8; 1000]);
        assert!(!dst.contains(&2));
    }

    #[test]
    fn a_request_deadline_stops_a_dribbling_peer() {
        let (a, mut b) = pair();
        let cut = SocketCut::new(a.try_clone().unwrap());
        cut.set_deadline(Some(Duration::ZERO));
        b.write_all(&[1u8; 10]).unwrap();
        let mut dst = vec![0u8; 100];
        // SAFETY: `dst` outlives the span.
        let span = unsafe { MemSpan::new(dst.as_mut_ptr() as u64, 100) };
        let err = span.recv_from(&a, &cut).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        cut.set_deadline(None);
        assert!(cut.check().is_ok());
    }

    #[test]
    fn copies_are_bounded_by_the_span() {
        let mut mem = [0u8; 8];
        // SAFETY: `mem` outlives the span.
        let span = unsafe { MemSpan::new(mem.as_mut_ptr() as u64, 8) };
        assert_eq!(
            span.write_from(&[1; 9]),
            Err(SpanTooShort { need: 9, have: 8 })
        );
        span.fill(3);
        let mut out = [0u8; 8];
        span.read_into(&mut out).unwrap();
        assert_eq!(out, [3; 8]);
    }
}
