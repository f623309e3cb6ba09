//! Copy threads: each takes a group of slices and hands them to its
//! [`PendingCopies`], which issues one asynchronous device-to-device copy per run of
//! adjacent slices (one per slice where they are scattered; the runs of a stream in one
//! `cudaMemcpyBatchAsync` where the runtime has it), on one stream per device, and
//! synchronises the streams before it hands the slices back to be completed. Several
//! threads keep several groups in flight.
//!
//! The memory contract: a slice is [`take`](Slice::take)n (its batch entered, its local
//! region pinned) before its copy is enqueued, and the [`Held`] goes into the
//! [`PendingCopies`] with the peer's mapping: both stay there until the stream holding
//! the copy is synchronised, and only then is the slice finished. A copy the device has
//! started cannot be cut, so the [`Abort`] of these carriers does nothing:
//! `cancel_and_drain` and `unregister_memory` wait until the stream's group is done —
//! bounded by the time the copies take, not by a peer — and the slices not yet taken are
//! skipped once their batch is canceled.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use crate::device::ipc::IpcRuntime;
use crate::device::peer_copies::{CopyError, Direction, LocalMemory, LocalRange, PendingCopies};
use crate::device::peer_mapping::PeerRange;
use crate::error::TransferError;
use crate::memory::Abort;
use crate::transport::{Held, Slice};
use crate::wire::tcp::OpCode;

/// One slice, with where its remote range is mapped here.
pub(super) struct Copy {
    pub slice: Slice,
    /// The slice's remote range, mapped here (its mapping kept open until the copy is
    /// done).
    pub remote: PeerRange,
    /// The device holding the local range, whose stream issues the copy.
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

/// A taken slice on its way through the device's copies: its local range is valid until
/// it is finished ([`Held`]'s contract), which is what [`LocalMemory`] asks.
struct Taken {
    held: Held,
    device: u32,
    peer: Arc<str>,
}

impl LocalMemory for Taken {
    fn local_range(&self) -> LocalRange {
        let span = self.held.local_span();
        LocalRange {
            device: self.device,
            addr: span.addr(),
            len: span.len(),
        }
    }
}

/// One copy thread: takes each group's slices, copies them and completes them once their
/// streams are synchronised. Its streams live across groups.
fn run(ipc: &IpcRuntime, queue: &Receiver<Vec<Copy>>, batch: &Batching) {
    let carrier: Arc<dyn Abort> = Arc::new(DeviceCopies);
    let mut copies: PendingCopies<Taken> = PendingCopies::new(ipc.runtime().clone());
    let mut last_batch = 0u64;
    while let Ok(group) = queue.recv() {
        for c in group {
            let Some(held) = c.slice.take(&carrier, &mut last_batch) else {
                continue;
            };
            let direction = match held.slice().op {
                OpCode::Write => Direction::ToPeer,
                OpCode::Read => Direction::FromPeer,
            };
            let taken = Taken {
                held,
                device: c.device,
                peer: c.peer,
            };
            if let Err(refused) = copies.enqueue(taken, c.remote, direction) {
                let Taken { held, peer, .. } = refused.local;
                held.finish(Err(device_error(&peer, refused.why)));
            }
        }
        let synced = copies.synchronize(batch.on.load(Ordering::Relaxed));
        if let Some(e) = &synced.batch_failed {
            batch.failed(&e.to_string());
        }
        for (Taken { held, peer, .. }, result) in synced.done {
            held.finish(result.map_err(|e| device_error(&peer, e)));
        }
    }
}

/// A failed copy's error: the runtime's own where it refused the copy, so that a reader
/// finds the `DeviceError` as the source.
fn device_error(peer: &str, e: CopyError) -> TransferError {
    match e {
        CopyError::Device(d) => TransferError::device_copy(peer, d),
        other => TransferError::device_copy(peer, other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceError;
    use crate::error::LinkLoss;

    /// The copy's error as the request's cause, or `None` if it is not a device copy's.
    fn copy_cause(e: &TransferError) -> Option<&crate::error::SharedSource> {
        match e {
            TransferError::PeerLost {
                cause: LinkLoss::DeviceCopy(source),
                ..
            } => Some(source),
            _ => None,
        }
    }

    #[test]
    fn a_refused_copy_keeps_the_runtime_s_error_as_source() {
        let device = DeviceError {
            call: "cuMemcpyPeerAsync".into(),
            code: 1,
            message: "invalid argument".into(),
        };
        let e = device_error("decode-1", CopyError::Device(device.clone()));
        let found = copy_cause(&e).and_then(|s| s.downcast_ref::<DeviceError>());
        assert_eq!(found, Some(&device), "{e:?}");
        let e = device_error(
            "decode-1",
            CopyError::Lengths {
                local: 8,
                remote: 4,
            },
        );
        let found = copy_cause(&e).and_then(|s| s.downcast_ref::<CopyError>());
        assert_eq!(
            found,
            Some(&CopyError::Lengths {
                local: 8,
                remote: 4
            }),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "connection to peer decode-1 lost: device copy over IPC failed: the local range \
             has 8 bytes and the peer's 4: a copy needs one length"
        );
    }
}
