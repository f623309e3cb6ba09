//! A small buffer in front of a connection's socket, so that the system call that
//! finishes one message also brings in the start of the next when the peer already sent
//! it: a pipelined header (server) or status (client) then costs no `poll` and no `recv`
//! of its own. Payloads still go straight between the socket and their memory; at most
//! [`READ_AHEAD`] bytes of one are copied through here.
//!
//! What a peer can make this spend is the fixed buffer: bytes are only read ahead into
//! its free room, and a message is taken out only once it is whole.

use std::io::{self, Read};
use std::net::TcpStream;
use std::os::fd::AsFd;

use super::cut_reader::CutStream;
use crate::memory::{MemSpan, SocketCut};

/// Bytes read ahead at most: a lone 4 KiB request or reply with its header fits, so it
/// arrives in one `recv`.
pub const READ_AHEAD: usize = 8 << 10;

const CACHE_LINE: u64 = 64;

/// Payloads from this size on are received cache-line aligned (see `recv_span`).
const REALIGN_FROM: usize = 64 << 10;

/// Bytes read ahead behind a payload: room for the headers or statuses that follow it,
/// little of the next payload (which would be copied once more through here; 8 KiB of
/// each 32 KiB write is a quarter more copying).
const AFTER_PAYLOAD: usize = 512;

/// Bytes received and not yet taken.
pub struct ReadAhead {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Default for ReadAhead {
    fn default() -> Self {
        Self {
            buf: vec![0; READ_AHEAD].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }
}

impl ReadAhead {
    /// Bytes buffered.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Takes the next `N` bytes, reading from `stream` until they are here (whatever
    /// else the socket holds comes along, up to the buffer's room). `follows`: payload
    /// bytes known to come after the message; when they do not fit the buffer, little of
    /// them is read ahead (they go straight to their memory instead of through here).
    /// `Ok(None)`: the peer closed the connection before the first of them.
    pub fn take<const N: usize>(
        &mut self,
        stream: &mut CutStream,
        follows: u64,
    ) -> io::Result<Option<[u8; N]>> {
        const { assert!(N <= READ_AHEAD) };
        self.make_room_for::<N>();
        let fits = follows.saturating_add(N as u64) <= READ_AHEAD as u64;
        let limit = if fits {
            self.buf.len()
        } else {
            self.buf.len().min(self.start + N + AFTER_PAYLOAD)
        };
        while self.buffered() < N {
            let room = self.buf.get_mut(self.end..limit).unwrap_or_default();
            match stream.read(room) {
                Ok(0) if self.buffered() == 0 => return Ok(None),
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.end += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let out = self.peek::<N>();
        self.start += N;
        Ok(out)
    }

    /// Brings in, without waiting, what the socket holds of the next `N` bytes and no
    /// more (so no payload behind them comes through here): a message the peer already
    /// sent can then be looked at with [`peek`](Self::peek). A failed read is left for the
    /// next one that waits to report.
    pub fn fill_without_wait<const N: usize>(&mut self, stream: &TcpStream) {
        const { assert!(N <= READ_AHEAD) };
        if self.buffered() >= N {
            return;
        }
        self.make_room_for::<N>();
        let want = N - self.buffered();
        let Some(room) = self.buf.get_mut(self.end..self.end + want) else {
            return;
        };
        if let Ok(n) = crate::sys::socket::recv(stream.as_fd(), room, libc::MSG_DONTWAIT) {
            self.end += n;
        }
    }

    /// Moves what is buffered to the front when the next `N` bytes would not fit behind it.
    fn make_room_for<const N: usize>(&mut self) {
        if self.buffered() < N && self.buf.len() - self.start < N {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// Drops the next `n` bytes, looked at with [`peek`](Self::peek) (at most what is
    /// buffered).
    pub fn skip(&mut self, n: usize) {
        self.start += n.min(self.buffered());
    }

    /// The next `N` bytes, left in place, if they are all here.
    pub fn peek<const N: usize>(&self) -> Option<[u8; N]> {
        let bytes = self.buf.get(self.start..self.end)?.get(..N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Some(out)
    }

    /// Fills `span`: the buffered bytes first, the rest straight from the socket, with
    /// whatever follows it read ahead into the buffer by the same system calls;
    /// `before_wait` as [`MemSpan::recv_with_spare`].
    pub fn recv_span(
        &mut self,
        stream: &TcpStream,
        cut: &SocketCut,
        span: MemSpan,
        before_wait: Option<&mut dyn FnMut() -> io::Result<()>>,
    ) -> io::Result<()> {
        self.recv_spans(stream, cut, &[span], before_wait)
    }

    /// Fills every span of `spans` in order, as [`recv_span`](Self::recv_span) fills one:
    /// the system calls take in as many of them at once as the socket holds.
    pub fn recv_spans(
        &mut self,
        stream: &TcpStream,
        cut: &SocketCut,
        spans: &[MemSpan],
        mut before_wait: Option<&mut dyn FnMut() -> io::Result<()>>,
    ) -> io::Result<()> {
        // The first span the buffered bytes do not fill, and where in it they stop.
        let mut next = None;
        for (i, span) in spans.iter().enumerate() {
            let have = self.buffered().min(span.len());
            if have > 0 {
                let from = self
                    .buf
                    .get(self.start..self.start + have)
                    .unwrap_or_default();
                span.write_from(from)
                    .map_err(|e| io::Error::other(format!("read-ahead copy: {e:?}")))?;
                self.start += have;
            }
            if have < span.len() {
                next = Some((i, span.tail(have)));
                break;
            }
        }
        let Some((i, mut first)) = next else {
            return cut.check();
        };
        let more = spans.get(i + 1..).unwrap_or_default();
        // The buffer is empty now (the spans took all of it).
        self.start = 0;
        self.end = 0;
        // The kernel copies a large payload slower into memory that does not start on a
        // cache line (4 MiB writes served 5-7% slower on the 2-core VM when the bytes taken
        // from here left the rest 40 bytes off): the few bytes up to the next line first.
        let skew = (first.addr() % CACHE_LINE) as usize;
        if skew != 0 && first.len() >= REALIGN_FROM {
            // This receive may wait: whatever the peer may be waiting for goes first.
            if let Some(f) = before_wait.take() {
                f()?;
            }
            let lead = first.head(CACHE_LINE as usize - skew);
            lead.recv_from(stream, cut)?;
            first = first.tail(lead.len());
        }
        let spare = self.buf.get_mut(..AFTER_PAYLOAD).unwrap_or_default();
        self.end = MemSpan::recv_all_with_spare(first, more, stream, cut, spare, before_wait)?;
        Ok(())
    }

    /// `stream` read through this buffer, for readers that take bytes by [`Read`]
    /// (staging of device memory, discarding a rejected payload).
    pub fn reader<'a>(&'a mut self, stream: CutStream<'a>) -> Through<'a> {
        Through {
            ahead: self,
            stream,
        }
    }
}

/// See [`ReadAhead::reader`].
pub struct Through<'a> {
    ahead: &'a mut ReadAhead,
    stream: CutStream<'a>,
}

impl Read for Through<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let a = &mut *self.ahead;
        if a.buffered() == 0 {
            return self.stream.read(out);
        }
        let n = a.buffered().min(out.len());
        let (Some(dst), Some(src)) = (out.get_mut(..n), a.buf.get(a.start..a.start + n)) else {
            return Ok(0);
        };
        dst.copy_from_slice(src);
        a.start += n;
        Ok(n)
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, reason = "tests index known-good data")]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;
    use std::time::Duration;

    fn pair() -> (TcpStream, TcpStream, SocketCut) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        let cut = SocketCut::new(a.try_clone().unwrap());
        (a, b, cut)
    }

    /// A peer that sends a message a byte at a time: it is taken whole once all is here.
    #[test]
    fn a_message_in_dribbles_is_taken_whole() {
        let (a, mut b, cut) = pair();
        let t = std::thread::spawn(move || {
            for byte in 1..=24u8 {
                b.write_all(&[byte]).unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
            b
        });
        let mut ahead = ReadAhead::default();
        let mut own = CutStream {
            stream: &a,
            cut: &cut,
        };
        let got = ahead.take::<24>(&mut own, 0).unwrap().unwrap();
        assert_eq!(got.to_vec(), (1..=24u8).collect::<Vec<_>>());
        assert_eq!(ahead.buffered(), 0);
        // Closed before a message: none; closed inside one: an error.
        drop(t.join().unwrap());
        assert!(ahead.take::<8>(&mut own, 0).unwrap().is_none());
    }

    #[test]
    fn a_close_inside_a_message_is_an_error() {
        let (a, mut b, cut) = pair();
        b.write_all(&[1, 2, 3]).unwrap();
        drop(b);
        let mut ahead = ReadAhead::default();
        let mut own = CutStream {
            stream: &a,
            cut: &cut,
        };
        let err = ahead.take::<8>(&mut own, 0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    /// Header, payload and the next header sent together: one `take` brings the payload's
    /// start, `recv_span` the rest and the next header, which is then taken without
    /// reading; the span gets its bytes and no more.
    #[test]
    fn a_pipelined_stream_is_split_at_its_messages() {
        let (a, mut b, cut) = pair();
        let payload: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut wire = b"HEADER-1".to_vec();
        wire.extend_from_slice(&payload);
        wire.extend_from_slice(b"HEADER-2");
        b.write_all(&wire).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let mut ahead = ReadAhead::default();
        let mut own = CutStream {
            stream: &a,
            cut: &cut,
        };
        assert_eq!(&ahead.take::<8>(&mut own, 0).unwrap().unwrap(), b"HEADER-1");
        assert!(ahead.buffered() > 0, "the payload's start came along");
        let mut dst = vec![0u8; payload.len() + 16];
        let span = crate::memory::span::test_span(&mut dst[..payload.len()]);
        ahead.recv_span(&a, &cut, span, None).unwrap();
        assert!(dst[..payload.len()] == payload[..]);
        assert!(dst[payload.len()..].iter().all(|&x| x == 0));
        assert_eq!(ahead.peek::<8>(), Some(*b"HEADER-2"));
        // Taken from the buffer: the socket is empty and the peer silent, so a read
        // would block.
        a.set_nonblocking(true).unwrap();
        assert_eq!(&ahead.take::<8>(&mut own, 0).unwrap().unwrap(), b"HEADER-2");
        assert_eq!(ahead.peek::<1>(), None);
    }

    /// A peer that floods the socket: only the buffer's room is read, whatever it sends.
    #[test]
    fn a_flood_fills_the_buffer_and_no_more() {
        let (a, mut b, cut) = pair();
        let t = std::thread::spawn(move || {
            let _ = b.write_all(&vec![5u8; 1 << 20]);
        });
        std::thread::sleep(Duration::from_millis(50));
        let mut ahead = ReadAhead::default();
        let mut own = CutStream {
            stream: &a,
            cut: &cut,
        };
        ahead.take::<8>(&mut own, 0).unwrap().unwrap();
        assert!(ahead.buffered() <= READ_AHEAD - 8);
        let mut small = [0u8; 100];
        let n = ahead.reader(own).read(&mut small).unwrap();
        assert_eq!(n, 100);
        drop(a);
        t.join().unwrap();
    }

    /// Looking for the next message without waiting: nothing sent, nothing read and no
    /// wait; sent in two parts, the first part now and the whole once the rest is here;
    /// never the payload behind it.
    #[test]
    fn a_look_ahead_reads_what_is_here_of_one_message_and_no_more() {
        let (a, mut b, _cut) = pair();
        let mut ahead = ReadAhead::default();
        let started = std::time::Instant::now();
        ahead.fill_without_wait::<24>(&a);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "it waited for the peer"
        );
        assert_eq!(ahead.buffered(), 0);
        b.write_all(&[7u8; 10]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        ahead.fill_without_wait::<24>(&a);
        assert_eq!(ahead.buffered(), 10);
        assert_eq!(ahead.peek::<24>(), None);
        b.write_all(&[8u8; 14 + 4096]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        ahead.fill_without_wait::<24>(&a);
        assert_eq!(ahead.buffered(), 24);
        assert!(ahead.peek::<24>().is_some());
        assert_eq!(
            crate::net::bytes_queued(&a).unwrap(),
            4096,
            "the payload behind the message stays in the socket"
        );
    }
}
