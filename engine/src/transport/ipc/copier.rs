//! Copy threads: each owns one stream per device, takes a group of slices, issues one
//! asynchronous device-to-device copy per run of adjacent slices (one per slice where
//! they are scattered), synchronises its stream and completes the group. Several
//! threads keep several groups in flight.
//!
//! The memory contract: a slice is [`take`](Slice::take)n (its batch entered, its local
//! region pinned) before its copy is issued, and finished only after the stream holding
//! the copy is synchronised. A copy the device has started cannot be cut, so the
//! [`Abort`] of these carriers does nothing: `cancel_and_drain` and `unregister_memory`
//! wait until the stream's group is done — bounded by the time the copies take, not by
//! a peer — and the slices not yet issued are skipped once their batch is canceled.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use super::imports::Mapping;
use crate::device::ipc::IpcRuntime;
use crate::device::Stream;
use crate::error::TransferError;
use crate::memory::Abort;
use crate::transport::{Held, Slice};
use crate::wire::tcp::OpCode;

/// One slice, with where its remote range is mapped here.
pub(super) struct Copy {
    pub slice: Slice,
    /// Address here of the slice's remote range.
    pub remote: u64,
    /// Kept open until the copy is done.
    pub mapping: Arc<Mapping>,
    /// The device whose stream issues the copy.
    pub device: u32,
    /// The peer, for error messages (one string shared by the batch's copies).
    pub peer: Arc<str>,
}

/// A device copy cannot be cut: see the module documentation.
#[derive(Debug)]
struct DeviceCopies;

impl Abort for DeviceCopies {
    fn abort(&self) {}
}

/// The copy threads; dropping it lets each finish its queue and joins them.
pub(super) struct Copier {
    queues: Vec<Sender<Vec<Copy>>>,
    next: AtomicUsize,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Copier {
    pub fn start(ipc: &Arc<IpcRuntime>, count: usize) -> Result<Self, std::io::Error> {
        let mut queues = Vec::new();
        let mut threads = Vec::new();
        for i in 0..count.max(1) {
            let (tx, rx) = crossbeam_channel::unbounded::<Vec<Copy>>();
            let ipc = ipc.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("te-ipc-copy-{i}"))
                    .spawn(move || run(&ipc, &rx))?,
            );
            queues.push(tx);
        }
        Ok(Self {
            queues,
            next: AtomicUsize::new(0),
            threads,
        })
    }

    /// Spreads `copies` over the threads in contiguous groups, one group per thread.
    pub fn post(&self, mut copies: Vec<Copy>) {
        let groups = self.queues.len().min(copies.len()).max(1);
        let per = copies.len().div_ceil(groups);
        while !copies.is_empty() {
            let rest = copies.split_off(per.min(copies.len()));
            let group = std::mem::replace(&mut copies, rest);
            self.post_group(group);
        }
    }

    /// Hands `group` whole to the next thread: a piece of a batch still being cut.
    pub fn post_group(&self, group: Vec<Copy>) {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.queues.len();
        if let Some(q) = self.queues.get(i) {
            if let Err(e) = q.send(group) {
                for c in e.into_inner() {
                    c.slice
                        .finish(Err(TransferError::Canceled("the engine is shutting down")));
                }
            }
        }
    }
}

impl Drop for Copier {
    fn drop(&mut self) {
        self.queues.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One device copy covering the slices `members` (indices into the group's taken
/// slices), whose ranges follow each other on both sides.
struct Run {
    device: u32,
    stream: Stream,
    dst: u64,
    src: u64,
    len: u64,
    members: std::ops::Range<usize>,
}

impl Run {
    /// Extends the run by a copy that starts where it ends, on both sides.
    fn extend(&mut self, device: u32, dst: u64, src: u64, len: u64) -> bool {
        let follows = self.device == device
            && self.dst.checked_add(self.len) == Some(dst)
            && self.src.checked_add(self.len) == Some(src);
        if follows {
            self.len += len;
            self.members.end += 1;
        }
        follows
    }
}

fn run(ipc: &IpcRuntime, queue: &Receiver<Vec<Copy>>) {
    let carrier: Arc<dyn Abort> = Arc::new(DeviceCopies);
    let mut streams: HashMap<u32, Stream> = HashMap::new();
    let mut last_batch = 0u64;
    let rt = ipc.runtime().clone();
    // The device current on this thread: a `SetDevice` per copy is a runtime call per
    // block, paid on the path scattered blocks take.
    let mut current: Option<u32> = None;
    while let Ok(group) = queue.recv() {
        // Taken slices, and the copies covering them: slices adjacent on both sides (a
        // request cut into slices, consecutive blocks of a tensor) go in one copy, since
        // each copy costs microseconds beyond its bytes.
        let mut taken: Vec<(Held, Arc<Mapping>, u32, Arc<str>)> = Vec::with_capacity(group.len());
        let mut runs: Vec<Run> = Vec::new();
        let mut failed: Vec<(Held, TransferError)> = Vec::new();
        for c in group {
            let Some(held) = c.slice.take(&carrier, &mut last_batch) else {
                continue;
            };
            let stream = match stream_for(&rt, &mut streams, &mut current, c.device) {
                Ok(s) => s,
                Err(e) => {
                    failed.push((held, device_error(&c.peer, e.to_string())));
                    continue;
                }
            };
            let local = held.local_span();
            let (dst, src) = match held.slice().op {
                OpCode::Write => (c.remote, local.addr()),
                OpCode::Read => (local.addr(), c.remote),
            };
            let len = local.len() as u64;
            let index = taken.len();
            taken.push((held, c.mapping, c.device, c.peer));
            if !runs
                .last_mut()
                .is_some_and(|r| r.extend(c.device, dst, src, len))
            {
                runs.push(Run {
                    device: c.device,
                    stream,
                    dst,
                    src,
                    len,
                    members: index..index + 1,
                });
            }
        }
        // Issue every run; a member of a run that could not be issued fails with it.
        let mut errors: Vec<Option<String>> = vec![None; taken.len()];
        for r in &runs {
            let issued = usize::try_from(r.len)
                .map_err(|_| "copy too large".to_string())
                .and_then(|len| {
                    use_device(&rt, &mut current, r.device).map_err(|e| e.to_string())?;
                    // SAFETY: each member's local range is pinned by its `Held` until it
                    // is finished below, after the stream is synchronised; each remote
                    // range lies inside its mapping (checked against the driver's size
                    // when it was resolved), kept open by the member until then. The
                    // members' ranges follow each other, so the run covers exactly them.
                    unsafe { rt.copy_async(r.dst as *mut u8, r.src as *const u8, len, r.stream) }
                        .map_err(|e| e.to_string())
                });
            if let Err(e) = issued {
                for i in r.members.clone() {
                    if let Some(slot) = errors.get_mut(i) {
                        *slot = Some(e.clone());
                    }
                }
            }
        }
        // Every stream used by this group, synchronised once.
        let mut results: HashMap<u32, Result<(), String>> = HashMap::new();
        for r in &runs {
            if let std::collections::hash_map::Entry::Vacant(slot) = results.entry(r.device) {
                slot.insert(
                    use_device(&rt, &mut current, r.device)
                        .and_then(|()| rt.stream_sync(r.stream))
                        .map_err(|e| e.to_string()),
                );
            }
        }
        for ((held, mapping, device, peer), error) in taken.into_iter().zip(errors) {
            let r = match (error, results.get(&device)) {
                (Some(e), _) => Err(device_error(&peer, e)),
                (None, Some(Ok(()))) => Ok(()),
                (None, Some(Err(e))) => Err(device_error(&peer, e.clone())),
                (None, None) => Err(device_error(&peer, "not synchronised".into())),
            };
            held.finish(r);
            drop(mapping);
        }
        for (held, e) in failed {
            held.finish(Err(e));
        }
    }
    for (device, s) in streams {
        if rt.set_device(device).is_ok() {
            rt.stream_destroy(s);
        }
    }
}

/// Makes `device` current unless it already is.
fn use_device(
    rt: &crate::device::Runtime,
    current: &mut Option<u32>,
    device: u32,
) -> Result<(), crate::device::DeviceError> {
    if *current != Some(device) {
        *current = None;
        rt.set_device(device)?;
        *current = Some(device);
    }
    Ok(())
}

fn stream_for(
    rt: &crate::device::Runtime,
    streams: &mut HashMap<u32, Stream>,
    current: &mut Option<u32>,
    device: u32,
) -> Result<Stream, crate::device::DeviceError> {
    use_device(rt, current, device)?;
    if let Some(&s) = streams.get(&device) {
        return Ok(s);
    }
    let s = rt.stream_create()?;
    streams.insert(device, s);
    Ok(s)
}

fn device_error(peer: &str, reason: String) -> TransferError {
    TransferError::PeerGone {
        peer: peer.to_string(),
        reason: format!("device copy over IPC failed: {reason}"),
    }
}
