//! Copies between this process's device memory and a peer's allocation mapped here, on
//! one stream per device, owning the proofs of both ends until their stream is
//! synchronised.
//!
//! The local end of a copy is a [`LocalMemory`] value, whose range stays valid while it
//! lives; the remote end a [`PeerRange`], cut inside a [`PeerMapping`] that it keeps open.
//! [`PendingCopies::enqueue`] takes both and merges copies whose ranges follow each other
//! on both sides into one run (each runtime call costs microseconds beyond its bytes).
//! [`PendingCopies::synchronize`] issues the runs, synchronises every stream used, and
//! only then lets go of the mappings and hands each local value back with how its copy
//! went. Nothing is issued before `synchronize`, so nothing runs that it does not wait for.
//!
//! Order of calls: `enqueue` any number of times, then `synchronize`; again as needed.

use std::ffi::c_void;
use std::sync::Arc;

use super::peer_mapping::{PeerMapping, PeerRange};
use super::{DeviceError, Runtime, Stream};

/// Local memory a device copy may read and write while the value lives: a taken slice's
/// range (registered memory pinned against unregistration, or caller memory lent until
/// the slice is finished).
///
/// Crate-private and safe for the reason `memory::span::lent` is: this layer sits below
/// the memory registry and cannot check a pin itself, so the implementor vouches, and
/// the only one (the IPC copier's taken slice) holds the proof in its type, a
/// `transport::Held`, whose range comes from the memory layer's span. A new implementor
/// takes on the same duty: the range is the same for the value's whole life, and valid
/// for device copies until the value is dropped.
pub(crate) trait LocalMemory {
    /// The device holding the range, and the range.
    fn local_range(&self) -> LocalRange;
}

/// `len` bytes of device memory at `addr` on `device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LocalRange {
    /// The device whose stream carries the copy.
    pub device: u32,
    /// Address of the first byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: usize,
}

/// Which way a copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Local memory into the peer's (a write).
    ToPeer,
    /// The peer's memory into local memory (a read).
    FromPeer,
}

/// Why a copy was refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CopyError {
    /// A runtime call failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The remote range does not lie inside the peer's mapping.
    #[error(
        "{len} bytes at {addr:#x} do not lie inside the peer's mapping ({size} bytes at {base:#x})"
    )]
    OutsideMapping {
        /// Address here of the range.
        addr: u64,
        /// Its length.
        len: u64,
        /// Base of the mapping here.
        base: u64,
        /// Its size.
        size: u64,
    },
    /// The two ends have different lengths.
    #[error("the local range has {local} bytes and the peer's {remote}: a copy needs one length")]
    Lengths {
        /// Bytes of the local end.
        local: usize,
        /// Bytes of the remote end.
        remote: usize,
    },
}

/// A copy [`PendingCopies::enqueue`] did not take: its local value, handed back, and why.
pub(crate) struct Refused<K> {
    /// The local end, untouched.
    pub local: K,
    /// Why.
    pub why: CopyError,
}

/// What [`PendingCopies::synchronize`] did.
#[must_use]
pub(crate) struct Synchronized<K> {
    /// Every local end enqueued, handed back once its stream is synchronised, with how its
    /// copy went.
    pub done: Vec<(K, Result<(), CopyError>)>,
    /// The batch call that failed, if one did: its runs (and those of later streams) were
    /// then issued one by one.
    pub batch_failed: Option<DeviceError>,
}

/// The runtime calls copies make; a trait so that the bookkeeping around them is tested
/// without a GPU.
pub(crate) trait StreamCalls {
    /// Makes `device` current on the calling thread.
    fn set_device(&self, device: u32) -> Result<(), DeviceError>;
    /// A new stream on the current device.
    fn stream_create(&self) -> Result<Stream, DeviceError>;
    /// Waits for the work queued on `s`.
    fn stream_sync(&self, s: Stream) -> Result<(), DeviceError>;
    /// Destroys `s`, which is not used afterwards.
    fn stream_destroy(&self, s: Stream);
    /// Enqueues `dst <- src` for `len` bytes on `s`.
    ///
    /// # Safety
    /// As [`Runtime::copy_async`]: both ranges valid for `len` bytes until `s` is
    /// synchronised.
    unsafe fn copy_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        s: Stream,
    ) -> Result<(), DeviceError>;
    /// Enqueues each `(dst, src, len)` of `copies` on `s` in one call.
    ///
    /// # Safety
    /// As [`Runtime::copy_batch_async`].
    unsafe fn copy_batch_async(
        &self,
        copies: &[(u64, u64, usize)],
        s: Stream,
    ) -> Result<(), DeviceError>;
}

impl StreamCalls for Runtime {
    fn set_device(&self, device: u32) -> Result<(), DeviceError> {
        Runtime::set_device(self, device)
    }

    fn stream_create(&self) -> Result<Stream, DeviceError> {
        Runtime::stream_create(self)
    }

    fn stream_sync(&self, s: Stream) -> Result<(), DeviceError> {
        Runtime::stream_sync(self, s)
    }

    fn stream_destroy(&self, s: Stream) {
        Runtime::stream_destroy(self, s);
    }

    unsafe fn copy_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        s: Stream,
    ) -> Result<(), DeviceError> {
        // SAFETY: forwarded from the caller.
        unsafe { Runtime::copy_async(self, dst as *mut u8, src as *const u8, len, s) }
    }

    unsafe fn copy_batch_async(
        &self,
        copies: &[(u64, u64, usize)],
        s: Stream,
    ) -> Result<(), DeviceError> {
        let dsts: Vec<*mut c_void> = copies.iter().map(|c| c.0 as *mut c_void).collect();
        let srcs: Vec<*const c_void> = copies.iter().map(|c| c.1 as *const c_void).collect();
        let sizes: Vec<usize> = copies.iter().map(|c| c.2).collect();
        // SAFETY: forwarded from the caller; the three slices have one length.
        unsafe { Runtime::copy_batch_async(self, &dsts, &srcs, &sizes, s) }
    }
}

/// The copies of one thread, one stream per device, with the ends they touch.
pub(crate) struct PendingCopies<K, C: StreamCalls = Runtime> {
    calls: Arc<C>,
    /// The device current on this thread, as last set here: a `SetDevice` per copy would
    /// be a runtime call per block, paid on the path scattered blocks take.
    current: Option<u32>,
    streams: Vec<DeviceStream<K>>,
}

/// One device's stream, its runs not yet synchronised and their ends.
struct DeviceStream<K> {
    device: u32,
    stream: Stream,
    runs: Vec<Run>,
    /// The ends of the runs' copies, in the runs' order.
    members: Vec<Member<K>>,
}

/// One device copy covering the next `members` copies of its stream, whose ranges
/// follow each other on both sides.
struct Run {
    dst: u64,
    src: u64,
    len: usize,
    members: usize,
    /// Why it could not be issued.
    failed: Option<CopyError>,
}

impl Run {
    /// Extends the run by a copy that starts where it ends, on both sides.
    fn extend(&mut self, dst: u64, src: u64, len: usize) -> bool {
        let step = self.len as u64;
        let follows = self.dst.checked_add(step) == Some(dst)
            && self.src.checked_add(step) == Some(src)
            && self.len.checked_add(len).is_some();
        if follows {
            self.len += len;
            self.members += 1;
        }
        follows
    }
}

/// Both ends of one copy, held until its stream is synchronised.
struct Member<K> {
    local: K,
    mapping: Arc<PeerMapping>,
}

impl<K, C: StreamCalls> PendingCopies<K, C> {
    /// No copies yet; streams are created as devices are first used.
    pub(crate) fn new(calls: Arc<C>) -> Self {
        Self {
            calls,
            current: None,
            streams: Vec::new(),
        }
    }

    /// Takes the copy between `local` and `remote` (`direction` says which way), issued
    /// by the next [`synchronize`](Self::synchronize) on the local device's stream. A
    /// copy whose ends differ in length, or whose device has no stream, is refused.
    pub(crate) fn enqueue(
        &mut self,
        local: K,
        remote: PeerRange,
        direction: Direction,
    ) -> Result<(), Refused<K>>
    where
        K: LocalMemory,
    {
        let range = local.local_range();
        if range.len != remote.len() {
            let why = CopyError::Lengths {
                local: range.len,
                remote: remote.len(),
            };
            return Err(Refused { local, why });
        }
        let (dst, src) = match direction {
            Direction::ToPeer => (remote.addr(), range.addr),
            Direction::FromPeer => (range.addr, remote.addr()),
        };
        let s = match self.stream_for(range.device) {
            Ok(s) => s,
            Err(e) => {
                return Err(Refused {
                    local,
                    why: e.into(),
                })
            }
        };
        s.members.push(Member {
            local,
            mapping: remote.into_mapping(),
        });
        if !s
            .runs
            .last_mut()
            .is_some_and(|r| r.extend(dst, src, range.len))
        {
            s.runs.push(Run {
                dst,
                src,
                len: range.len,
                members: 1,
                failed: None,
            });
        }
        Ok(())
    }

    /// Issues every copy enqueued (with `batch`, the runs of a stream that has several
    /// in one batch call, where the runtime has one), synchronises each stream used, and
    /// hands back every local end with its result; the mappings are let go of here.
    pub(crate) fn synchronize(&mut self, batch: bool) -> Synchronized<K> {
        let Self {
            calls,
            current,
            streams,
        } = self;
        // Every stream's copies first: the streams of several devices run at once.
        let mut batch_failed = None;
        for s in streams.iter_mut() {
            if let Some(e) = issue(&**calls, current, s, batch && batch_failed.is_none()) {
                batch_failed = Some(e);
            }
        }
        let mut done = Vec::new();
        for s in streams.iter_mut().filter(|s| !s.members.is_empty()) {
            let synced = use_device(&**calls, current, s.device)
                .and_then(|()| calls.stream_sync(s.stream))
                .map_err(CopyError::from);
            let mut members = std::mem::take(&mut s.members).into_iter();
            for r in s.runs.drain(..) {
                let result = match r.failed {
                    Some(e) => Err(e),
                    None => synced.clone(),
                };
                for Member { local, mapping } in members.by_ref().take(r.members) {
                    done.push((local, result.clone()));
                    // The stream is synchronised: nothing copies to or from it any more.
                    drop(mapping);
                }
            }
        }
        Synchronized { done, batch_failed }
    }

    /// The stream of `device`, created (on that device) at its first use.
    fn stream_for(&mut self, device: u32) -> Result<&mut DeviceStream<K>, DeviceError> {
        let i = match self.streams.iter().position(|s| s.device == device) {
            Some(i) => i,
            None => {
                use_device(&*self.calls, &mut self.current, device)?;
                let stream = self.calls.stream_create()?;
                self.streams.push(DeviceStream {
                    device,
                    stream,
                    runs: Vec::new(),
                    members: Vec::new(),
                });
                self.streams.len() - 1
            }
        };
        Ok(&mut self.streams[i])
    }
}

impl<K, C: StreamCalls> Drop for PendingCopies<K, C> {
    fn drop(&mut self) {
        for s in self.streams.drain(..) {
            if !s.members.is_empty() {
                // Only if `synchronize` was cut short: whatever it issued lands before
                // its ends go.
                let _ = self.calls.stream_sync(s.stream);
            }
            drop(s.members);
            if self.calls.set_device(s.device).is_ok() {
                self.calls.stream_destroy(s.stream);
            }
        }
    }
}

/// Issues the runs of `s`: in one batch call when `batch` and there are several, else (or
/// when that call fails, returned) one by one. A run that cannot be issued keeps why.
fn issue<K>(
    calls: &impl StreamCalls,
    current: &mut Option<u32>,
    s: &mut DeviceStream<K>,
    batch: bool,
) -> Option<DeviceError> {
    if s.runs.is_empty() {
        return None;
    }
    if let Err(e) = use_device(calls, current, s.device) {
        for r in &mut s.runs {
            r.failed = Some(e.clone().into());
        }
        return None;
    }
    let mut batch_failed = None;
    if batch && s.runs.len() >= 2 {
        let runs: Vec<(u64, u64, usize)> = s.runs.iter().map(|r| (r.dst, r.src, r.len)).collect();
        // SAFETY: as for one run below, for every run. Copies of one batch land in no
        // given order, as copies of different threads already do.
        match unsafe { calls.copy_batch_async(&runs, s.stream) } {
            Ok(()) => return None,
            Err(e) => {
                // Whatever part of the batch the runtime may have enqueued drains before
                // the runs go again one by one: the same bytes copied again are the same.
                let _ = calls.stream_sync(s.stream);
                batch_failed = Some(e);
            }
        }
    }
    for r in &mut s.runs {
        // SAFETY: a run covers copies whose ranges follow each other on both sides, so
        // it covers exactly their ends: each local end is a `LocalMemory` value (valid
        // while it lives), each remote end was cut inside its `PeerMapping`. The stream's
        // members own both, the values and the mappings, until `synchronize` (or drop)
        // has synchronised the stream.
        if let Err(e) = unsafe { calls.copy_async(r.dst, r.src, r.len, s.stream) } {
            r.failed = Some(e.into());
        }
    }
    batch_failed
}

/// Makes `device` current unless it already is.
fn use_device(
    calls: &impl StreamCalls,
    current: &mut Option<u32>,
    device: u32,
) -> Result<(), DeviceError> {
    if *current != Some(device) {
        *current = None;
        calls.set_device(device)?;
        *current = Some(device);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
