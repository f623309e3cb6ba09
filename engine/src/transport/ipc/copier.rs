//! Copy threads: each owns one stream per device, takes a group of slices, issues one
//! asynchronous device-to-device copy per run of adjacent slices (one per slice where
//! they are scattered; the runs of a group in one `cudaMemcpyBatchAsync` where the
//! runtime has it), synchronises its stream and completes the group. Several threads
//! keep several groups in flight.
//!
//! The memory contract: a slice is [`take`](Slice::take)n (its batch entered, its local
//! region pinned) before its copy is issued, and finished only after the stream holding
//! the copy is synchronised. A copy the device has started cannot be cut, so the
//! [`Abort`] of these carriers does nothing: `cancel_and_drain` and `unregister_memory`
//! wait until the stream's group is done — bounded by the time the copies take, not by
//! a peer — and the slices not yet issued are skipped once their batch is canceled.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
    batch: Arc<Batching>,
}

/// Shared by the copy threads: whether scattered runs go in batch calls.
struct Batching {
    on: AtomicBool,
}

impl Batching {
    /// Stops batching after a batch call failed: said once, then one copy per run.
    fn failed(&self, why: &str) {
        if self.on.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                "IPC copies: the batch call failed ({why}); copies are issued one by one from now on \
                 (MC_IPC_BATCH_COPY=0 does so from the start)"
            );
        }
    }
}

impl Copier {
    /// `count` threads; `batch`: scattered runs of a group go in one batch call where
    /// the runtime has one (`MC_IPC_BATCH_COPY`).
    pub fn start(ipc: &Arc<IpcRuntime>, count: usize, batch: bool) -> Result<Self, std::io::Error> {
        let batch = Arc::new(Batching {
            on: AtomicBool::new(batch && ipc.runtime().batch_copy().is_ok()),
        });
        let mut queues = Vec::new();
        let mut threads = Vec::new();
        for i in 0..count.max(1) {
            let (tx, rx) = crossbeam_channel::unbounded::<Vec<Copy>>();
            let ipc = ipc.clone();
            let batch = batch.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("te-ipc-copy-{i}"))
                    .spawn(move || run(&ipc, &rx, &batch))?,
            );
            queues.push(tx);
        }
        Ok(Self {
            queues,
            next: AtomicUsize::new(0),
            threads,
            batch,
        })
    }

    /// Whether scattered runs go in batch calls now (off when asked, when the runtime
    /// has none, or after one failed).
    pub fn batching(&self) -> bool {
        self.batch.on.load(Ordering::Relaxed)
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

// size: one copy thread's loop; its streams, current device and last batch live across
// the groups it takes. Not cut into steps yet.
fn run(ipc: &IpcRuntime, queue: &Receiver<Vec<Copy>>, batch: &Batching) {
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
        let mut batched = vec![false; runs.len()];
        if batch.on.load(Ordering::Relaxed) {
            issue_batches(&rt, &mut current, &runs, &mut batched, batch);
        }
        for (r, _) in runs.iter().zip(&batched).filter(|(_, &b)| !b) {
            if let Err(e) = issue(&rt, &mut current, r) {
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

/// One device copy for run `r`.
fn issue(rt: &crate::device::Runtime, current: &mut Option<u32>, r: &Run) -> Result<(), String> {
    let len = usize::try_from(r.len).map_err(|_| "copy too large".to_string())?;
    use_device(rt, current, r.device).map_err(|e| e.to_string())?;
    // SAFETY: each member's local range is pinned by its `Held` until it is finished,
    // after the stream is synchronised; each remote range lies inside its mapping
    // (checked against the driver's size when it was resolved), kept open by the member
    // until then. The members' ranges follow each other, so the run covers exactly them.
    unsafe { rt.copy_async(r.dst as *mut u8, r.src as *const u8, len, r.stream) }
        .map_err(|e| e.to_string())
}

/// The runs of each device that has several, in one batch call per device; marks in
/// `batched` the runs so enqueued. A failed call turns batching off and leaves its runs
/// unmarked, to be issued one by one (after the stream has drained whatever part of the
/// batch the runtime may have enqueued: the same bytes copied again are the same).
fn issue_batches(
    rt: &crate::device::Runtime,
    current: &mut Option<u32>,
    runs: &[Run],
    batched: &mut [bool],
    batch: &Batching,
) {
    let mut devices: Vec<u32> = runs.iter().map(|r| r.device).collect();
    devices.sort_unstable();
    devices.dedup();
    for device in devices {
        let mine: Vec<usize> = (0..runs.len())
            .filter(|&i| runs.get(i).is_some_and(|r| r.device == device))
            .collect();
        let (Some(&first), true) = (mine.first(), mine.len() >= 2) else {
            continue;
        };
        let Some(stream) = runs.get(first).map(|r| r.stream) else {
            continue;
        };
        let mut dsts = Vec::with_capacity(mine.len());
        let mut srcs = Vec::with_capacity(mine.len());
        let mut sizes = Vec::with_capacity(mine.len());
        for r in mine.iter().filter_map(|&i| runs.get(i)) {
            let Ok(len) = usize::try_from(r.len) else {
                return;
            };
            dsts.push(r.dst as *mut std::ffi::c_void);
            srcs.push(r.src as *const std::ffi::c_void);
            sizes.push(len);
        }
        let issued = use_device(rt, current, device).and_then(|()| {
            // SAFETY: as for one copy in `issue`, for every run. Copies of one batch run in
            // no given order, as copies of different copy threads already do.
            unsafe { rt.copy_batch_async(&dsts, &srcs, &sizes, stream) }
        });
        match issued {
            Ok(()) => {
                for &i in &mine {
                    if let Some(b) = batched.get_mut(i) {
                        *b = true;
                    }
                }
            }
            Err(e) => {
                batch.failed(&e.to_string());
                let _ = rt.stream_sync(stream);
                return;
            }
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
