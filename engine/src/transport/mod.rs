//! Transports move slices of requests between engines. The engine holds them as
//! `dyn` [`Transport`] and knows none of their types; TCP is always present, RDMA and
//! same-host GPU IPC plug in beside it.
//!
//! A transport contributes its part of the segment descriptor, serves peers on its own
//! listeners, takes [`Slice`]s and completes each on its batch. Before it touches a
//! slice's local memory it [`take`](Slice::take)s the slice on the connection that carries
//! it, so that a canceled batch or an unregistered region can cut that connection and
//! know when the memory is free again.

pub mod causes;
pub mod ipc;
pub mod rdma;
pub mod select;
pub mod tcp;

use std::sync::Arc;

use thiserror::Error;

use crate::error::{TransferError, Unreachable};
use crate::memory::{Abort, MemSpan, Pin, Region};
use crate::task::BatchState;
use crate::wire::descriptor::{BufferDesc, SegmentDesc};
use crate::wire::session::SegmentId;
use crate::wire::tcp::OpCode;

/// Why a transport could not take work for a peer or start.
#[derive(Debug, Error)]
pub enum TransportError {
    /// The peer's descriptor lacks what this transport needs.
    #[error("segment {segment} cannot be reached over {protocol}: {cause}")]
    Unusable {
        /// Segment name.
        segment: String,
        /// This transport's protocol.
        protocol: &'static str,
        /// What is missing or wrong.
        #[source]
        cause: causes::UnusableCause,
    },
    /// The requested transports cannot be started: why (protocol not served, RDMA
    /// required by `MC_FORCE_HCA` but unusable, a bad `MC_CUSTOM_TOPO_JSON`, ...).
    #[error(transparent)]
    Refused(#[from] select::Refusal),
    /// Memory could not be registered with the transport's devices.
    #[error("cannot register {addr:#x}+{len} for {protocol}: {cause}")]
    Register {
        /// Start address.
        addr: u64,
        /// Length.
        len: u64,
        /// The transport's protocol.
        protocol: &'static str,
        /// What failed, and what to do.
        #[source]
        cause: causes::RegisterCause,
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

/// What `initialize` asked for: its `protocol` and `device_name` arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportRequest {
    /// `tcp`, `rdma`, `""` (automatic), `nvlink_intra`, `musa`; others are refused.
    pub protocol: String,
    /// Comma list of HCAs narrowing discovery (empty: all).
    pub device_name: String,
}

impl Default for TransportRequest {
    /// TCP only: what engines built without `initialize`'s arguments get.
    fn default() -> Self {
        Self {
            protocol: "tcp".into(),
            device_name: String::new(),
        }
    }
}

impl TransportRequest {
    /// `protocol` with HCA list `device_name`.
    pub fn new(protocol: &str, device_name: &str) -> Self {
        Self {
            protocol: protocol.into(),
            device_name: device_name.into(),
        }
    }
}

/// Starts the transports `request` and this host call for ([`select`]), in the order
/// the engine prefers them (TCP, always present, last): each listens on `ip` and serves
/// `memory`; `host` is the name peers are told, `session_id` our segment name and
/// `rpc_port` our handshake port.
/// Warnings are logged once per process.
pub fn start(
    ip: std::net::IpAddr,
    host: &str,
    session_id: &str,
    rpc_port: u16,
    memory: Arc<crate::memory::MemoryRegistry>,
    config: &crate::config::Config,
    request: &TransportRequest,
) -> Result<Vec<Arc<dyn Transport>>, TransportError> {
    let plan = plan(config, request)?;
    for w in &plan.warnings {
        if crate::log_throttle::first_time(w) {
            tracing::warn!("{w}");
        }
    }
    for n in &plan.notes {
        tracing::info!("{n}");
    }
    let mut out: Vec<Arc<dyn Transport>> = Vec::new();
    // Same-host GPU IPC: asked for (`nvlink_intra`, `musa`), or automatic for device
    // memory between segments of this host (`select` says when).
    if plan.ipc || plan.ipc_auto {
        let control = crate::wire::session::HostPort {
            host: host.to_string(),
            port: rpc_port,
        }
        .session_id();
        match ipc::IpcTransport::start(memory.clone(), config, session_id, &control) {
            Ok(t) => out.push(Arc::new(t)),
            Err(reason) if plan.ipc => {
                return Err(select::Refusal::GpuUnavailable {
                    protocol: request.protocol.clone(),
                    cause: select::GpuBlocker::IpcStart { reason },
                }
                .into())
            }
            Err(why) => {
                let w = format!("same-host GPU IPC is unavailable: {why}");
                if crate::log_throttle::first_time(&w) {
                    tracing::warn!("{w}");
                }
            }
        }
    }
    if let Some(rdma) = &plan.rdma {
        match rdma_transport(rdma, session_id, config) {
            Ok(t) => out.push(t),
            Err(why) if config.force_hca => {
                return Err(select::Refusal::RdmaRequired {
                    cause: select::RdmaBlocker::Start(Box::new(why)),
                }
                .into())
            }
            Err(why) => {
                let w = format!("falling back to TCP: the RDMA transport cannot start: {why}");
                if crate::log_throttle::first_time(&w) {
                    tracing::warn!("{w}");
                }
            }
        }
    }
    out.push(Arc::new(tcp::TcpTransport::start(
        ip, host, memory, config,
    )?));
    Ok(out)
}

/// Gathers what [`select::decide`] needs (probing RDMA only when it matters) and decides.
pub fn plan(
    config: &crate::config::Config,
    request: &TransportRequest,
) -> Result<select::Plan, TransportError> {
    let protocol = request.protocol.as_str();
    let probing = select::probes_rdma(protocol, config.force_tcp);
    let topology = match probing {
        true => Some(
            crate::topology::local(config, &request.device_name)
                .map_err(|cause| select::Refusal::Topology { cause })?,
        ),
        false => None,
    };
    let verbs = probing.then(verbs_probe);
    // Every protocol may start IPC on its own accord, unless MC_FORCE_TCP.
    let gpu = match !config.force_tcp {
        true => match crate::device::runtime() {
            Ok(rt) => select::GpuPresence::Runtime {
                vendor: rt.vendor(),
                devices: rt.device_count(),
            },
            Err(e) => select::GpuPresence::Absent(e),
        },
        false => select::GpuPresence::NotProbed,
    };
    let peer_memory = crate::topology::sysfs::peer_memory_module(&config.sysfs_root);
    select::decide(&select::Inputs {
        protocol,
        force_tcp: config.force_tcp,
        force_hca: config.force_hca,
        topology: topology.as_ref(),
        verbs: verbs.as_ref(),
        memlock: memlock(),
        gpu: &gpu,
        peer_memory_module: peer_memory,
    })
    .map_err(TransportError::Refused)
}

/// The names of the devices the verbs library lists, or why it cannot be loaded
/// (no library, no kernel support, no device).
fn verbs_probe() -> Result<Vec<String>, String> {
    let verbs = crate::verbs::shared().map_err(|e| e.to_string())?;
    let devices = verbs.devices().map_err(|e| e.to_string())?;
    Ok(devices.into_iter().map(|d| d.name).collect())
}

/// Starts the RDMA transport over `plan`'s HCAs; `session_id` is the `<server>` of our
/// NIC paths.
fn rdma_transport(
    plan: &select::RdmaPlan,
    session_id: &str,
    config: &crate::config::Config,
) -> Result<Arc<dyn Transport>, TransportError> {
    let unusable = |cause| TransportError::Unusable {
        segment: session_id.to_string(),
        protocol: rdma::PROTOCOL,
        cause,
    };
    let hcas = plan
        .hcas
        .iter()
        .map(|h| {
            let narrow = |value: u32, what: &'static str| {
                u8::try_from(value).map_err(|_| {
                    unusable(causes::UnusableCause::OutOfRange {
                        what,
                        value,
                        hca: h.name.clone(),
                    })
                })
            };
            Ok(rdma::verbs_backend::HcaSpec {
                name: h.name.clone(),
                port: narrow(h.port, "port")?,
                gid_index: narrow(h.gid_index, "GID index")?,
            })
        })
        .collect::<Result<Vec<_>, TransportError>>()?;
    let params = rdma::RdmaParams {
        slice_size: config.rdma_slice_size,
        fragment_ratio: u64::from(config.fragment_ratio),
        num_qp_per_ep: config.num_qp_per_ep as usize,
        max_wr: config.max_wr as usize,
        retry_cnt: config.retry_cnt as usize,
        ib_port: u8::try_from(config.ib_port).map_err(|_| {
            unusable(causes::UnusableCause::IbPort {
                value: config.ib_port,
            })
        })?,
        gid_index: config.gid_index,
        mtu: config.mtu,
        force_hca: config.force_hca,
        ..rdma::RdmaParams::default()
    };
    let t = rdma::RdmaTransport::start(session_id, &hcas, plan.matrix.clone(), params, config)?;
    Ok(Arc::new(t))
}

/// RLIMIT_MEMLOCK and whether CAP_IPC_LOCK lifts it, for this process.
pub fn memlock() -> select::Memlock {
    let limit = crate::sys::memlock_limit();
    // CapEff is a hex mask; CAP_IPC_LOCK is bit 14.
    let cap_ipc_lock = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("CapEff:"))?;
            u64::from_str_radix(line["CapEff:".len()..].trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << 14) != 0);
    select::Memlock {
        limit,
        cap_ipc_lock,
    }
}

/// How often the engine's housekeeping calls [`Transport::rest_idle`].
pub const REST_TICK: std::time::Duration = std::time::Duration::from_millis(25);

/// A `nic_hint` that names none of the NICs a transport of the batch chooses among.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("nic_hint {name:?} is not one of this engine's {protocol} devices ({}); name one of them, or pass \"\" to let the topology choose", .nics.join(", "))]
pub struct UnknownNic {
    /// The name the caller passed.
    pub name: String,
    /// The transport that has no NIC of that name.
    pub protocol: &'static str,
    /// The NICs it does choose among.
    pub nics: Vec<String>,
}

/// Why `nic_hint` `name` cannot carry a batch over `transports`, if it cannot: each
/// transport that chooses among several local NICs must have one of that name; those
/// without the choice accept any name, having nothing to pick.
pub(crate) fn unknown_nic(name: &str, transports: &[Arc<dyn Transport>]) -> Option<UnknownNic> {
    transports.iter().find_map(|t| {
        let nics = t.local_nics();
        (!nics.is_empty() && !nics.iter().any(|n| n == name)).then(|| UnknownNic {
            name: name.to_string(),
            protocol: t.protocol(),
            nics,
        })
    })
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

    /// Whether this transport, though it [`reaches`](Self::reaches) the peer, cannot move
    /// this one request, which then goes to the next transport that reaches the peer
    /// (TCP). `local`: the registered region holding the local range, if any; `remote`:
    /// the peer's buffer. RDMA declines device memory that no HCA could register (staged
    /// regions, ours or the peer's; see `transport::rdma`).
    fn declines(&self, _local: Option<&Region>, _remote: &BufferDesc) -> bool {
        false
    }

    /// The local NICs this transport chooses among per slice (RDMA's HCAs), which a
    /// batch's `nic_hint` may name; empty where there is no such choice (TCP, IPC), and a
    /// hint is then accepted and has nothing to pick.
    fn local_nics(&self) -> Vec<String> {
        Vec::new()
    }

    /// What this transport decided (for logs and the topology dump), if it has anything
    /// to say beyond its protocol.
    fn decision(&self) -> Option<String> {
        None
    }

    /// Why the peer recently could not be reached, if it could not: the engine then
    /// fetches its descriptor again (it may have restarted elsewhere).
    fn unreachable(&self, segment: &SegmentId, peer: &SegmentDesc) -> Option<Unreachable>;

    /// The largest piece a request is cut into.
    fn slice_size(&self) -> u64;

    /// The largest piece a request whose local memory is a device's (`device`) or the
    /// host's is cut into; [`slice_size`](Self::slice_size) unless a transport moves the
    /// two differently.
    fn slice_size_for(&self, device: bool) -> u64 {
        let _ = device;
        self.slice_size()
    }

    /// Queues `slices` to the peer; each completes (or fails) on its batch.
    fn post(
        &self,
        segment: &SegmentId,
        peer: &SegmentDesc,
        slices: Vec<Slice>,
    ) -> Result<(), TransportError>;

    /// Drops per-peer state (connections, threads) that went idle or whose peer is gone.
    /// Called about once a second.
    fn evict_idle(&self) {}

    /// Gives back what peers without work for a moment hold of a shared allowance (TCP's
    /// lane budget). Called every [`REST_TICK`].
    fn rest_idle(&self) {}

    /// What this transport counts about its connections (connects, reconnects, re-sent
    /// slices); zeros for a transport that counts none.
    fn counters(&self) -> crate::metrics::TransportCounters {
        crate::metrics::TransportCounters::default()
    }

    /// A region was registered: prepare what peers need to reach it (memory keys, IPC
    /// handles). An error fails the registration, which is then undone.
    fn on_register(&self, _region: &Arc<Region>) -> Result<(), TransportError> {
        Ok(())
    }

    /// A region was unregistered and no engine thread touches it any more: release what
    /// [`on_register`](Self::on_register) prepared, and stop peers that reach it without
    /// us (the IPC transport waits, within `MC_IPC_REVOKE_TIMEOUT`, for same-host peers
    /// to close their mappings). `unregister_memory` returns after this, once every
    /// [`Lease`](crate::memory::Lease) of the region is given back: a transport that
    /// leased the region to a device (RDMA's memory registrations) drops its leases here.
    fn on_unregister(&self, _region: &Arc<Region>) {}

    /// Answers a peer's connection request (handshake type 0, upstream's RDMA endpoint
    /// setup), if this transport serves it.
    fn handle_connection(&self, _json: &str) -> Option<String> {
        None
    }

    /// Answers a same-host IPC control message (handshake type 16, between our engines
    /// only), if this transport serves it. `forget` drops the engine's cached descriptor
    /// of the segment of that (descriptor) name.
    fn handle_ipc_control(&self, _json: &str, _forget: &dyn Fn(&str)) -> Option<String> {
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
            // Outside registered memory: the submitter lent it (`memory::span::lent`).
            None => crate::memory::span::lent(addr, len as usize),
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
