//! Transports move slices of requests between engines. The engine holds them as
//! `dyn` [`Transport`] and knows none of their types; TCP is always present, RDMA and
//! same-host GPU IPC plug in beside it.
//!
//! A transport contributes its part of the segment descriptor, serves peers on its own
//! listeners, takes [`Slice`]s and completes each on its batch. Before it touches a
//! slice's local memory it [`take`](Slice::take)s the slice on the connection that carries
//! it, so that a canceled batch or an unregistered region can cut that connection and
//! know when the memory is free again.

pub mod ipc;
pub mod tcp;

use std::sync::Arc;

use thiserror::Error;

use crate::error::TransferError;
use crate::memory::{Abort, MemSpan, Pin, Region};
use crate::task::BatchState;
use crate::wire::descriptor::{BufferDesc, SegmentDesc};
use crate::wire::session::SegmentId;
use crate::wire::tcp::OpCode;

/// Why a transport could not take work for a peer or start.
#[derive(Debug, Error)]
pub enum TransportError {
    /// The peer's descriptor lacks what this transport needs.
    #[error("segment {segment} cannot be reached over {protocol}: {reason}")]
    Unusable {
        /// Segment name.
        segment: String,
        /// This transport's protocol.
        protocol: &'static str,
        /// What is missing or wrong.
        reason: String,
    },
    /// A listener, thread or socket could not be set up.
    #[error("{what}: {source}")]
    Io {
        /// What was being set up.
        what: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
}

/// Starts the transports this host can serve, in the order the engine prefers them:
/// each listens on `ip` and serves `memory`; `host` is the name peers are told.
pub fn start(
    ip: std::net::IpAddr,
    host: &str,
    memory: Arc<crate::memory::MemoryRegistry>,
    config: &crate::config::Config,
) -> Result<Vec<Arc<dyn Transport>>, TransportError> {
    let tcp = tcp::TcpTransport::start(ip, host, memory.clone(), config)?;
    let mut out: Vec<Arc<dyn Transport>> = vec![Arc::new(tcp)];
    // Same-host GPU IPC, where a GPU runtime with devices is loaded.
    let gpu = crate::device::runtime()
        .ok()
        .is_some_and(|rt| rt.device_count() > 0);
    if gpu {
        match ipc::IpcTransport::start(memory, config) {
            Ok(t) => out.push(Arc::new(t)),
            Err(why) => tracing::warn!("same-host GPU IPC is unavailable: {why}"),
        }
    }
    Ok(out)
}

/// A transport behind the engine.
pub trait Transport: Send + Sync {
    /// The protocol name peers advertise (`tcp`, `rdma`, ...).
    fn protocol(&self) -> &'static str;

    /// Adds what peers need to reach this transport to the local descriptor.
    fn describe(&self, desc: &mut SegmentDesc);

    /// Whether this transport can move data to the peer described by `peer`.
    fn reaches(&self, peer: &SegmentDesc) -> bool;

    /// Whether this transport takes one request to `peer` whatever the peer's protocol:
    /// the engine asks every transport per request before it falls back to the one that
    /// [`reaches`](Self::reaches) the peer. `local_device`: the GPU holding the local
    /// range, if any; `remote`: the peer's buffer holding the remote range. The same-host
    /// IPC transport takes device-to-device requests this way.
    fn takes(&self, _peer: &SegmentDesc, _local_device: Option<u32>, _remote: &BufferDesc) -> bool {
        false
    }

    /// What this transport decided (for logs and the topology dump), if it has anything
    /// to say beyond its protocol.
    fn decision(&self) -> Option<String> {
        None
    }

    /// Why the peer recently could not be reached, if it could not: the engine then
    /// fetches its descriptor again (it may have restarted elsewhere).
    fn unreachable(&self, segment: &SegmentId, peer: &SegmentDesc) -> Option<String>;

    /// The largest piece a request is cut into.
    fn slice_size(&self) -> u64;

    /// Queues `slices` to the peer; each completes (or fails) on its batch.
    fn post(
        &self,
        segment: &SegmentId,
        peer: &SegmentDesc,
        slices: Vec<Slice>,
    ) -> Result<(), TransportError>;

    /// Drops per-peer state (connections, threads) that went idle or whose peer is gone.
    fn evict_idle(&self) {}

    /// A region was registered: prepare what peers need to reach it (memory keys, IPC
    /// handles). An error fails the registration, which is then undone.
    fn on_register(&self, _region: &Arc<Region>) -> Result<(), TransportError> {
        Ok(())
    }

    /// A region was unregistered and no engine thread touches it any more: release what
    /// [`on_register`](Self::on_register) prepared.
    fn on_unregister(&self, _region: &Arc<Region>) {}

    /// Answers a peer's connection request (handshake type 0, upstream's RDMA endpoint
    /// setup), if this transport serves it.
    fn handle_connection(&self, _json: &str) -> Option<String> {
        None
    }
}

/// One piece of a request, as a transport moves it.
#[derive(Debug)]
pub struct Slice {
    /// Read or write.
    pub op: OpCode,
    /// Local address (source of a write, destination of a read).
    pub local: u64,
    /// Remote address.
    pub remote: u64,
    /// Bytes.
    pub len: u64,
    /// The GPU holding the local range, if it is device memory.
    pub local_device: Option<u32>,
    /// The registered region holding the local range, if it is registered.
    pub local_region: Option<Arc<Region>>,
    /// The batch it belongs to.
    pub batch: Arc<BatchState>,
    /// Index of its request in the batch.
    pub task: usize,
    /// Times it was re-sent after a connection broke.
    pub retries: u8,
}

impl Slice {
    /// Completes a slice that was never taken (skipped or failed before any I/O).
    pub fn finish(self, result: Result<(), TransferError>) {
        self.batch.slice_done(self.task, result);
    }

    /// Takes the slice for I/O on the connection `carrier`: from now until the returned
    /// [`Held`] is finished or released, cutting `carrier` is how others stop the access.
    /// A slice of a canceled batch, or whose local region is being unregistered, is
    /// finished here instead and `None` returned. `last_batch` is the carrier's memo of
    /// the last batch it took a slice of (0: none), so that consecutive slices of one
    /// batch register the carrier with it once.
    pub fn take(self, carrier: &Arc<dyn Abort>, last_batch: &mut u64) -> Option<Held> {
        let known = *last_batch == self.batch.id();
        *last_batch = self.batch.id();
        if !self.batch.enter(carrier, known) {
            self.finish(Err(TransferError::Canceled(
                "its batch was canceled (deadline, interrupt or shutdown)",
            )));
            return None;
        }
        let pin = match &self.local_region {
            None => None,
            Some(region) => match region.pin(carrier) {
                Some(pin) => Some(pin),
                None => {
                    self.batch.leave();
                    self.finish(Err(TransferError::Canceled(
                        "its local buffer was unregistered",
                    )));
                    return None;
                }
            },
        };
        Some(Held { slice: self, pin })
    }
}

/// A slice whose local memory a transport thread may touch.
#[derive(Debug)]
pub struct Held {
    slice: Slice,
    pin: Option<Pin>,
}

impl Held {
    /// The slice.
    pub fn slice(&self) -> &Slice {
        &self.slice
    }

    /// The local memory of the slice.
    pub fn local_span(&self) -> MemSpan {
        let (addr, len) = (self.slice.local, self.slice.len);
        match self.pin.as_ref().and_then(|p| p.span(addr, len)) {
            Some(span) => span,
            // SAFETY: the submitter lent [local, local+len) until the batch finishes or
            // is drained (`TransferEngine::submit`); this thread entered the batch, so a
            // drain waits for `finish`/`release` before the memory goes back.
            None => unsafe { MemSpan::new(addr, len as usize) },
        }
    }

    /// Completes the slice: the memory is no longer touched.
    pub fn finish(self, result: Result<(), TransferError>) {
        let Held { slice, pin } = self;
        drop(pin);
        slice.batch.leave();
        slice.finish(result);
    }

    /// Gives the slice back untouched from now on (to be sent again elsewhere).
    pub fn release(self) -> Slice {
        let Held { slice, pin } = self;
        drop(pin);
        slice.batch.leave();
        slice
    }
}
