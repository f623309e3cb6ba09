//! Moving bytes between a socket and device memory through pinned host
//! buffers, with asynchronous copies overlapped with socket I/O.
//!
//! Two pinned 2 MiB chunks and two streams per device and thread: while the socket
//! fills (or drains) one chunk, the other is being copied on its own stream.
//! A chunk is reused only after its stream has been synchronised.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{spare_stagers, DeviceError, Runtime, Stream};

/// Bytes per staging chunk. Each copy costs the calling thread a runtime call (about
/// 22 µs on the H200 host, more under load) and a synchronisation: 2 MiB chunks moved
/// GPU memory to GPU memory over TCP 2-15% faster than 1 MiB ones there, while 4 MiB
/// ones and a third chunk in flight moved less (docs/benchmarks.md, session 12).
pub const CHUNK: usize = 2 << 20;

/// Bytes of a chunk written to the socket at a time; between the pieces of a last chunk
/// the next request is looked for. Against whole chunks, on the 16-CPU H200 host (loopback,
/// 4 MiB x 64 GPU to GPU, one initiator, targets kept, 6 rounds), quarters moved reads
/// 1.06-1.09x and writes out of our GPU 1.01-1.10x with no more requests copied ahead
/// (halves, on another machine start: reads 1.00-1.09x, writes 0.97-1.03x;
/// docs/benchmarks.md, session 21).
pub const PIECE: usize = CHUNK / 4;

/// Pinned bytes one [`Stager`] holds.
pub const STAGER_BYTES: usize = 2 * CHUNK;

/// Two pinned chunks and two streams on one device.
pub(crate) struct Stager {
    rt: Arc<Runtime>,
    bufs: [*mut u8; 2],
    streams: [Stream; 2],
    /// A copy out of (or into) this buffer may still run: wait before reusing it.
    pending: [bool; 2],
    /// The buffer the next received chunk goes to: alternates across calls, so that a
    /// call's first chunk never waits for the last copy of the call before.
    next: usize,
    /// The first chunk of the range sent next, copied out by the last send.
    copied: Option<Copied>,
}

// SAFETY: the pinned buffers and streams are process-wide runtime handles,
// usable from any host thread once the device is set (callers set it before
// each use); a Stager is owned by one thread at a time, never shared.
unsafe impl Send for Stager {}

impl Stager {
    pub(crate) fn new(rt: Arc<Runtime>, device: u32) -> Result<Self, DeviceError> {
        rt.set_device(device)?;
        let b0 = rt.host_alloc(CHUNK)?;
        let b1 = rt.host_alloc(CHUNK).inspect_err(|_| rt.free_host(b0))?;
        let s0 = rt.stream_create();
        let s1 = rt.stream_create();
        match (s0, s1) {
            (Ok(s0), Ok(s1)) => Ok(Self {
                rt,
                bufs: [b0, b1],
                streams: [s0, s1],
                pending: [false; 2],
                next: 0,
                copied: None,
            }),
            (s0, s1) => {
                for s in [&s0, &s1].into_iter().flatten() {
                    rt.stream_destroy(*s);
                }
                rt.free_host(b0);
                rt.free_host(b1);
                match (s0, s1) {
                    (Err(e), _) | (_, Err(e)) => Err(e),
                    (Ok(_), Ok(_)) => unreachable!("handled by the first arm"),
                }
            }
        }
    }

    /// Reads `len` bytes from `src` into device memory at `dst`. The copies of the last
    /// chunk may still be running on return: [`settle`](Self::settle) before anyone is
    /// told the bytes landed. Copies left running by earlier calls land while this call's
    /// first chunk comes off the socket; `earlier_landed` runs once they have (before this
    /// call's bytes are all read), so their statuses or completions go out without a wait
    /// of their own.
    pub(crate) fn receive_into(
        &mut self,
        src: &mut impl Read,
        dst: u64,
        len: usize,
        earlier_landed: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        let mut earlier_landed = Some(earlier_landed);
        // The buffers are about to be overwritten.
        self.copied = None;
        if len == 0 {
            self.settle()?;
        }
        let mut off = 0;
        while off < len {
            let n = CHUNK.min(len - off);
            let b = self.next;
            self.next ^= 1;
            self.wait(b)?;
            // SAFETY: bufs[b] is a CHUNK-byte pinned buffer not in use by any copy.
            let chunk = unsafe { std::slice::from_raw_parts_mut(self.bufs[b], n) };
            src.read_exact(chunk)?;
            // SAFETY: dst+off..+n lies in the caller's device range; the
            // chunk stays untouched until this stream is synchronised.
            unsafe {
                self.rt.copy_async(
                    (dst + off as u64) as *mut u8,
                    self.bufs[b],
                    n,
                    self.streams[b],
                )
            }
            .map_err(io::Error::other)?;
            self.pending[b] = true;
            if let Some(f) = earlier_landed.take() {
                // The other buffer holds the last chunk of the call before, if any.
                self.wait(b ^ 1)?;
                f()?;
            }
            off += n;
        }
        earlier_landed.map_or(Ok(()), |f| f())
    }

    /// Waits for every copy still running: the bytes received so far have landed.
    pub(crate) fn settle(&mut self) -> io::Result<()> {
        self.settle_as(Wait::Spin)
    }

    /// Waits for the copy out of buffer `b`, if one runs.
    fn wait(&mut self, b: usize) -> io::Result<()> {
        self.wait_as(b, Wait::Spin)
    }

    fn wait_as(&mut self, b: usize, how: Wait) -> io::Result<()> {
        if !self.pending[b] {
            return Ok(());
        }
        self.pending[b] = false;
        let s = self.streams[b];
        match how {
            Wait::Spin => self.rt.stream_sync(s),
            Wait::Yield => self.rt.stream_sync_yielding(s),
        }
        .map_err(io::Error::other)
    }

    fn settle_as(&mut self, how: Wait) -> io::Result<()> {
        let first = self.wait_as(0, how);
        first.and(self.wait_as(1, how))
    }

    /// Writes `prefix`, then `len` bytes of device memory at `src`, to `dst`. With
    /// `copied`, the first chunk was copied out by the send before (as its next range).
    /// While the last chunk goes, `next` is asked for the range sent next from this
    /// stager, after each [`PIECE`] of it until it names one: its first chunk is copied
    /// out then. Every copy has landed on return, failed or not: none reads device memory
    /// after this returns, and `next`'s guard is dropped only then.
    pub(crate) fn send_from<G>(
        &mut self,
        dst: &mut impl Write,
        prefix: &[u8],
        src: u64,
        len: usize,
        copied: bool,
        mut next: impl FnMut() -> Option<NextSend<G>>,
    ) -> io::Result<()> {
        let chunks = len.div_ceil(CHUNK);
        let size = |k: usize| CHUNK.min(len - k * CHUNK);
        let copied = self
            .copied
            .take()
            .filter(|c| copied && chunks > 0 && c.src == src && c.len == size(0));
        SENDS.fetch_add(1, Ordering::Relaxed);
        if copied.is_some() {
            SENDS_COPIED_AHEAD.fetch_add(1, Ordering::Relaxed);
        }
        // A send waits for its copies out of the device yielding: a data server's
        // threads send while others copy, and spinning in the runtime took CPUs from them
        // (reads out of GPU memory moved 1.03x, docs/benchmarks.md, session 18).
        let how = Wait::Yield;
        self.settle_as(how)?;
        let first = copied.map_or(0, |c| c.buf);
        let buf = |k: usize| (first + k) % 2;
        let mut next_copied = None;
        let mut guard = None;
        let result = (|| {
            if chunks > 0 && copied.is_none() {
                self.issue_out(buf(0), src, size(0))?;
            }
            dst.write_all(prefix)?;
            for k in 0..chunks {
                let b = buf(k);
                self.wait_as(b, how)?;
                // One copy at a time: two issued together share the copy engine and the
                // first lands later, while one copy takes a fraction of a chunk's send.
                if k + 1 < chunks {
                    self.issue_out(b ^ 1, src + ((k + 1) * CHUNK) as u64, size(k + 1))?;
                }
                // SAFETY: the copy into bufs[b] has completed (stream synchronised).
                let chunk = unsafe { std::slice::from_raw_parts(self.bufs[b], size(k)) };
                for piece in chunk.chunks(PIECE) {
                    // A next range that came in while the last chunk goes is still copied
                    // out ahead: a peer with one read out asks for the next when half of
                    // this one is in (see the TCP client's `DEVICE_READS_OUT`).
                    if k + 1 == chunks && next_copied.is_none() {
                        if let Some(n) = next().filter(|n| n.len > 0) {
                            let len = CHUNK.min(n.len);
                            self.issue_out(b ^ 1, n.addr, len)?;
                            next_copied = Some(Copied {
                                src: n.addr,
                                len,
                                buf: b ^ 1,
                            });
                            guard = Some(n.guard);
                        }
                    }
                    dst.write_all(piece)?;
                }
            }
            Ok(())
        })();
        // Copies still running read device memory (the next range's first chunk) or fill
        // buffers about to be reused or freed: settled, whatever happened.
        let settled = self.settle_as(how);
        drop(guard);
        let result = result.and(settled);
        if result.is_ok() {
            self.copied = next_copied;
        }
        result
    }

    /// The first chunk of a next range was copied out by the last send.
    pub(crate) fn holds_copied(&self) -> bool {
        self.copied.is_some()
    }

    /// Copies `n` bytes of device memory at `src` into buffer `b`, which is free.
    fn issue_out(&mut self, b: usize, src: u64, n: usize) -> io::Result<()> {
        // SAFETY: src..+n lies in the caller's device range; bufs[b] is free.
        unsafe {
            self.rt
                .copy_async(self.bufs[b], src as *const u8, n, self.streams[b])
        }
        .map_err(io::Error::other)?;
        self.pending[b] = true;
        Ok(())
    }
}

/// How a wait for a stream's copies waits.
#[derive(Debug, Clone, Copy)]
enum Wait {
    /// Synchronises the stream (the runtime spins while the copy runs).
    Spin,
    /// Queries the stream, yielding the CPU between queries.
    Yield,
}

/// Device memory sent next from the same stager (see [`Stager::send_from`]); `guard`
/// keeps it registered until the copy out of it has landed.
pub struct NextSend<G> {
    /// First byte.
    pub addr: u64,
    /// Bytes.
    pub len: usize,
    /// Held until the copy has landed.
    pub guard: G,
}

/// A first chunk copied out ahead of its send, into buffer `buf`.
#[derive(Debug, Clone, Copy)]
struct Copied {
    src: u64,
    len: usize,
    buf: usize,
}

impl Drop for Stager {
    fn drop(&mut self) {
        let _ = self.settle();
        for b in 0..2 {
            self.rt.stream_destroy(self.streams[b]);
            self.rt.free_host(self.bufs[b]);
        }
    }
}

/// This thread's stagers, one per device; given back as spares when the thread ends.
#[derive(Default)]
struct ThreadStagers(HashMap<u32, Stager>);

impl ThreadStagers {
    /// Gives every stager back as a spare, settled and holding nothing copied ahead; one
    /// whose copies failed is freed instead.
    fn give_back_all(&mut self) {
        for (device, mut s) in self.0.drain() {
            if s.settle().is_ok() {
                s.copied = None;
                spare_stagers::give_back(device, s);
            }
        }
    }
}

impl Drop for ThreadStagers {
    fn drop(&mut self) {
        self.give_back_all();
    }
}

thread_local! {
    static STAGERS: RefCell<ThreadStagers> = RefCell::default();
}

fn with_stager<T>(device: u32, f: impl FnOnce(&mut Stager) -> io::Result<T>) -> io::Result<T> {
    let rt = super::runtime().map_err(io::Error::other)?;
    STAGERS.with(|cell| {
        let mut mine = cell.borrow_mut();
        let stager = match mine.0.entry(device) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let s = match spare_stagers::take(device) {
                    Some(s) => s,
                    None => Stager::new(rt.clone(), device).map_err(io::Error::other)?,
                };
                e.insert(s)
            }
        };
        rt.set_device(device).map_err(io::Error::other)?;
        f(stager)
    })
}

/// Gives this thread's stagers back (see [`spare_stagers`]): called by a thread about to
/// wait for work, once the copies it left running have been settled and reported.
pub fn give_back_thread_stagers() {
    // Taken out of the cell first: settling and freeing run outside the borrow. Most
    // threads that wait for work moved host memory only and hold none.
    let mut mine = STAGERS.with(|cell| {
        let mut cell = cell.borrow_mut();
        (!cell.0.is_empty()).then(|| std::mem::take(&mut *cell))
    });
    if let Some(mine) = mine.as_mut() {
        mine.give_back_all();
    }
}

/// Reads `len` bytes from `src` into device memory at `dst` on `device`.
pub fn receive_into(device: u32, src: &mut impl Read, dst: u64, len: usize) -> io::Result<()> {
    with_stager(device, |s| {
        let received = s.receive_into(src, dst, len, || Ok(()));
        let settled = s.settle();
        received.and(settled)
    })
}

/// As [`receive_into`], leaving the last copies running: [`settle`] before the bytes are
/// used. Copies left running by the call before on this thread and device have landed
/// once `earlier_landed` runs (before this call returns).
pub fn receive_landing(
    device: u32,
    src: &mut impl Read,
    dst: u64,
    len: usize,
    earlier_landed: impl FnOnce() -> io::Result<()>,
) -> io::Result<()> {
    with_stager(device, |s| s.receive_into(src, dst, len, earlier_landed))
}

/// Waits for the copies this thread left running on `device`.
pub fn settle(device: u32) -> io::Result<()> {
    // A thread without a stager for `device` has no copies there to wait for.
    let mine = STAGERS.with(|cell| cell.borrow().0.contains_key(&device));
    if !mine {
        return Ok(());
    }
    with_stager(device, Stager::settle)
}

/// Writes `prefix`, then `len` bytes of device memory at `src` on `device`, to `dst`,
/// through this thread's stager, copying ahead across its sends as
/// [`Stager::send_from`] says.
pub fn send_from<G>(
    device: u32,
    dst: &mut impl Write,
    prefix: &[u8],
    src: u64,
    len: usize,
    copied: bool,
    next: impl FnMut() -> Option<NextSend<G>>,
) -> io::Result<()> {
    with_stager(device, |s| s.send_from(dst, prefix, src, len, copied, next))
}

/// Sends out of device memory in this process.
static SENDS: AtomicU64 = AtomicU64::new(0);
/// Of those, sends whose first chunk was copied out while the send before went.
static SENDS_COPIED_AHEAD: AtomicU64 = AtomicU64::new(0);

/// (sends out of device memory, of which copied ahead) in this process so far: how often
/// a send found its first chunk already out of the device (see [`Stager::send_from`]).
pub fn copy_ahead_counts() -> [u64; 2] {
    [
        SENDS.load(Ordering::Relaxed),
        SENDS_COPIED_AHEAD.load(Ordering::Relaxed),
    ]
}
