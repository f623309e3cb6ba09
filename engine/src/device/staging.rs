//! Moving bytes between a socket and device memory through pinned host
//! buffers, with asynchronous copies overlapped with socket I/O.
//!
//! Pinned chunks (two by default), each with its own stream, per device and thread: while
//! the socket fills (or drains) one chunk, the others are being copied on their streams.
//! A chunk is reused only after its stream has been synchronised.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::sync::Arc;

use super::{DeviceError, Runtime, Stream};

/// Bytes per staging chunk, unless `MC_TCP_STAGING_CHUNK_KB` says otherwise.
pub const CHUNK: usize = 1 << 20;

/// Chunks (each with its own stream) per stager, unless `MC_TCP_STAGING_CHUNKS` says otherwise.
pub const CHUNKS: usize = 2;

/// How a stager is cut: `chunks` pinned buffers of `chunk` bytes, each with a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Bytes per buffer (one copy's size at most).
    pub chunk: usize,
    /// Buffers per stager: how many copies one transfer keeps in flight.
    pub chunks: usize,
}

impl Shape {
    /// The process's shape, read once from the environment (an experiment's knob: the
    /// defaults are what the benchmarks chose).
    pub fn current() -> Self {
        static SHAPE: std::sync::OnceLock<Shape> = std::sync::OnceLock::new();
        *SHAPE.get_or_init(|| {
            let var = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
            Shape {
                chunk: var("MC_TCP_STAGING_CHUNK_KB").map_or(CHUNK, |kb| kb.clamp(64, 16384) << 10),
                chunks: var("MC_TCP_STAGING_CHUNKS").map_or(CHUNKS, |n| n.clamp(2, 8)),
            }
        })
    }

    /// Pinned bytes one stager of this shape holds.
    pub fn bytes(self) -> usize {
        self.chunk * self.chunks
    }
}

/// Pinned buffers and their streams on one device.
pub(crate) struct Stager {
    rt: Arc<Runtime>,
    chunk: usize,
    bufs: Vec<*mut u8>,
    streams: Vec<Stream>,
    /// A copy out of (or into) this buffer may still run: wait before reusing it.
    pending: Vec<bool>,
    /// The buffer the next received chunk goes to: goes round across calls, so that a
    /// call's first chunk never waits for the last copy of the call before.
    next: usize,
}

// SAFETY: the pinned buffers and streams are process-wide runtime handles,
// usable from any host thread once the device is set (callers set it before
// each use); a Stager is owned by one thread at a time, never shared.
unsafe impl Send for Stager {}

impl Stager {
    pub(crate) fn new(rt: Arc<Runtime>, device: u32) -> Result<Self, DeviceError> {
        let shape = Shape::current();
        rt.set_device(device)?;
        let mut s = Self {
            rt,
            chunk: shape.chunk,
            bufs: Vec::with_capacity(shape.chunks),
            streams: Vec::with_capacity(shape.chunks),
            pending: vec![false; shape.chunks],
            next: 0,
        };
        // What was made before a failure is freed by drop.
        for _ in 0..shape.chunks {
            let buf = s.rt.host_alloc(shape.chunk)?;
            s.bufs.push(buf);
            match s.rt.stream_create() {
                Ok(stream) => s.streams.push(stream),
                Err(e) => {
                    s.rt.free_host(s.bufs.pop().expect("pushed above"));
                    return Err(e);
                }
            }
        }
        Ok(s)
    }

    /// Reads `len` bytes from `src` into device memory at `dst`. The copies of the last
    /// chunks may still be running on return: [`settle`](Self::settle) before anyone is
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
        if len == 0 {
            self.settle()?;
        }
        let mut off = 0;
        while off < len {
            let n = self.chunk.min(len - off);
            let b = self.next;
            self.next = (b + 1) % self.bufs.len();
            self.wait(b)?;
            // SAFETY: bufs[b] is a chunk-sized pinned buffer not in use by any copy.
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
                // The other buffers hold the last chunks of the calls before, if any.
                self.settle_except(b)?;
                f()?;
            }
            off += n;
        }
        earlier_landed.map_or(Ok(()), |f| f())
    }

    /// Waits for every copy still running: the bytes received so far have landed.
    pub(crate) fn settle(&mut self) -> io::Result<()> {
        self.settle_except(usize::MAX)
    }

    /// Waits for the copies of every buffer but `keep`; the first error is returned, every
    /// buffer waited for regardless.
    fn settle_except(&mut self, keep: usize) -> io::Result<()> {
        let mut result = Ok(());
        for b in (0..self.bufs.len()).filter(|&b| b != keep) {
            let waited = self.wait(b);
            result = result.and(waited);
        }
        result
    }

    /// Waits for the copy out of buffer `b`, if one runs.
    fn wait(&mut self, b: usize) -> io::Result<()> {
        if !self.pending[b] {
            return Ok(());
        }
        self.pending[b] = false;
        self.rt
            .stream_sync(self.streams[b])
            .map_err(io::Error::other)
    }

    pub(crate) fn send_from(
        &mut self,
        dst: &mut impl Write,
        prefix: &[u8],
        src: u64,
        len: usize,
    ) -> io::Result<()> {
        self.settle()?;
        let depth = self.bufs.len();
        let pieces = self.pieces(len);
        let result = (|| {
            for (k, &(off, n)) in pieces.iter().enumerate().take(depth) {
                self.issue_out(k, src + off as u64, n)?;
            }
            dst.write_all(prefix)?;
            for (k, &(_, n)) in pieces.iter().enumerate() {
                let b = k % depth;
                self.wait(b)?;
                // SAFETY: the copy into bufs[b] has completed (stream synchronised).
                let out = unsafe { std::slice::from_raw_parts(self.bufs[b], n) };
                dst.write_all(out)?;
                if let Some(&(off, n)) = pieces.get(k + depth) {
                    self.issue_out(k + depth, src + off as u64, n)?;
                }
            }
            Ok(())
        })();
        // Copies still running write into the buffers, not the caller's memory: settled
        // so that the buffers can be reused or freed.
        let settled = self.settle();
        result.and(settled)
    }

    /// The (offset, length) of each copy out of `len` bytes: with a ramp, the first are
    /// small, so the first bytes go out after a short copy rather than a whole chunk's.
    fn pieces(&self, len: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::with_capacity(len.div_ceil(self.chunk) + 4);
        let mut size = if ramp() {
            (self.chunk / 8).max(4096)
        } else {
            self.chunk
        };
        let mut off = 0;
        while off < len {
            let n = size.min(len - off);
            out.push((off, n));
            off += n;
            size = (size * 2).min(self.chunk);
        }
        out
    }

    fn issue_out(&mut self, k: usize, src: u64, n: usize) -> io::Result<()> {
        let b = k % self.bufs.len();
        // SAFETY: src..+n lies in the caller's device range; bufs[b] is free and holds
        // a chunk, at least n bytes.
        unsafe {
            self.rt
                .copy_async(self.bufs[b], src as *const u8, n, self.streams[b])
        }
        .map_err(io::Error::other)?;
        self.pending[b] = true;
        Ok(())
    }
}

fn ramp() -> bool {
    static RAMP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *RAMP.get_or_init(|| std::env::var("MC_TCP_STAGING_RAMP").is_ok_and(|v| v == "1"))
}

impl Drop for Stager {
    fn drop(&mut self) {
        let _ = self.settle();
        for &s in &self.streams {
            self.rt.stream_destroy(s);
        }
        for &b in &self.bufs {
            self.rt.free_host(b);
        }
    }
}

thread_local! {
    static STAGERS: RefCell<HashMap<u32, Stager>> = RefCell::new(HashMap::new());
}

fn with_stager<T>(device: u32, f: impl FnOnce(&mut Stager) -> io::Result<T>) -> io::Result<T> {
    let rt = super::runtime().map_err(io::Error::other)?;
    STAGERS.with(|cell| {
        let mut map = cell.borrow_mut();
        let stager = match map.entry(device) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Stager::new(rt.clone(), device).map_err(io::Error::other)?)
            }
        };
        rt.set_device(device).map_err(io::Error::other)?;
        f(stager)
    })
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
    with_stager(device, Stager::settle)
}

/// Writes `prefix`, then `len` bytes of device memory at `src` on `device`, to `dst`.
pub fn send_from(
    device: u32,
    dst: &mut impl Write,
    prefix: &[u8],
    src: u64,
    len: usize,
) -> io::Result<()> {
    with_stager(device, |s| s.send_from(dst, prefix, src, len))
}
