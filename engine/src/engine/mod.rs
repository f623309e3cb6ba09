//! The public API: initialize, register memory, submit batches of reads and
//! writes to peer segments, wait, notify, probe.

mod advertise;
pub mod error;
mod housekeeping;
mod location;
mod submit;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::config::Config;
use crate::memory::MemoryRegistry;
use crate::metadata::etcd::EtcdStore;
use crate::metadata::handshake::{self, HandshakeServer};
use crate::metadata::http::HttpStore;
use crate::metadata::{MetadataStore, P2pStore, RpcMeta};
use crate::metrics::{Counters, Metrics, MetricsServer, MetricsSnapshot, TransportCounters};
use crate::net;
use crate::notify_queue::{NotifyQueue, REFUSED_REPLY};
use crate::task::BatchState;
use crate::transport::{Transport, TransportRequest};
use crate::wire::descriptor::{BufferDesc, NotifyMsg, SegmentDesc, PROBE_REPLY};
use crate::wire::handshake::MessageType;
use crate::wire::session::{HostPort, SegmentId};
use crate::wire::tcp::OpCode;
use error::{ConnProblem, EngineError, HandshakeAnswer};
use housekeeping::Housekeeping;
use location::resolve_location;

/// The connection string of peer-to-peer handshake mode.
pub const P2P_HANDSHAKE: &str = "P2PHANDSHAKE";

/// Which metadata store a connection string names.
enum StoreKind {
    P2p,
    Http(String),
    Etcd(String),
}

impl StoreKind {
    fn parse(conn: &str) -> Result<Self, EngineError> {
        if conn == P2P_HANDSHAKE {
            return Ok(Self::P2p);
        }
        let unsupported = |problem| {
            Err(EngineError::Unsupported {
                conn: conn.to_string(),
                problem,
            })
        };
        match conn.split_once("://") {
            Some(("http", _)) => Ok(Self::Http(conn.to_string())),
            Some(("https", _)) => unsupported(ConnProblem::Https),
            Some(("etcd", _)) => Ok(Self::Etcd(conn.to_string())),
            Some((scheme, _)) => unsupported(ConnProblem::UnknownScheme(scheme.to_string())),
            None => unsupported(ConnProblem::NoScheme),
        }
    }
}

/// One read or write of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Read (remote to local) or write (local to remote).
    pub op: OpCode,
    /// Local address.
    pub local: u64,
    /// Remote address in the target segment.
    pub remote: u64,
    /// Bytes.
    pub len: u64,
}

impl Request {
    /// `op` of `len` bytes between local `local` and remote `remote`.
    pub const fn new(op: OpCode, local: u64, remote: u64, len: u64) -> Self {
        Self {
            op,
            local,
            remote,
            len,
        }
    }
}

/// How a batch is carried, beyond its requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubmitOptions {
    /// The submitter waits for the batch at once (see
    /// [`submit_to_wait`](TransferEngine::submit_to_wait)).
    pub caller_waits: bool,
    /// A local NIC to carry every request of the batch (upstream's `nic_hint`), in place
    /// of the topology's choice. It must name one of the NICs of a transport that chooses
    /// among several (RDMA's HCAs: a name this engine does not use is refused before any
    /// byte moves); a batch whose transports have no such choice (TCP, IPC) accepts it
    /// with nothing to pick. `None` (or an empty name): the topology chooses.
    pub nic: Option<String>,
}

/// The options of a synchronous call: the submitter waits at once, the topology picks.
const CALLER_WAITS: SubmitOptions = SubmitOptions {
    caller_waits: true,
    nic: None,
};

/// A notification received from a peer.
pub type Notify = NotifyMsg;

/// A submitted batch; clone freely, wait from any thread.
pub type Batch = Arc<BatchState>;

/// A transfer engine: the handshake listener, the registered memory, and its
/// transports (each with its own listeners and connections to peers).
pub struct TransferEngine {
    // Dropped first: stop housekeeping and serving handshakes before the rest goes away.
    _housekeeping: Housekeeping,
    _rpc: HandshakeServer,
    _metrics_server: Option<crate::metrics::MetricsServer>,
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    session_id: String,
    host: String,
    rpc_port: u16,
    memory: Arc<MemoryRegistry>,
    store: Box<dyn MetadataStore>,
    transports: Vec<Arc<dyn Transport>>,
    segments: RwLock<HashMap<String, Arc<Segment>>>,
    notifies: NotifyQueue,
    metrics: Metrics,
}

struct Segment {
    // An `Arc` so a submit takes the descriptor in one pointer copy.
    desc: RwLock<Arc<SegmentDesc>>,
    // The peer's metrics entry, looked up once per cached segment, not per submit.
    peer_metrics: Arc<Counters>,
}

impl TransferEngine {
    /// Starts an engine named after `local_hostname` (its port, if any, is
    /// ignored in P2P mode: the session id is `host:rpc_port`).
    ///
    /// `metadata`: `P2PHANDSHAKE`, `http://host:port/path` (an HTTP metadata server) or
    /// `etcd://h1:2379[,h2:2379...]`. With a store the session id (segment name) is
    /// `local_hostname` verbatim; the engine publishes its handshake address and descriptor
    /// there, and removes them when dropped.
    pub fn new(local_hostname: &str, metadata: &str, config: Config) -> Result<Self, EngineError> {
        Self::with_transports(
            local_hostname,
            metadata,
            config,
            &TransportRequest::default(),
        )
    }

    /// [`new`](Self::new) with the transports `request` asks for (`initialize`'s
    /// `protocol` and `device_name`): an unserved protocol, or RDMA required by
    /// `MC_FORCE_HCA` but unusable, fails with the reason.
    pub fn with_transports(
        local_hostname: &str,
        metadata: &str,
        config: Config,
        request: &TransportRequest,
    ) -> Result<Self, EngineError> {
        let kind = StoreKind::parse(metadata)?;
        let name_host = HostPort::parse(local_hostname, config.handshake_port)?.host;
        let ip = net::listen_ip(&name_host, config.tcp_bind_address, config.use_ipv6);
        let host = match kind {
            // P2P: the session id is built from the name's host, which peers resolve.
            StoreKind::P2p => name_host,
            StoreKind::Http(_) | StoreKind::Etcd(_) => {
                advertise::announce(local_hostname, &name_host, &config)
            }
        };
        let (rpc_listener, rpc_port) = bind_handshake(ip, &config)?;
        let (session_id, store) = open_store(kind, local_hostname, &host, rpc_port, &config)?;
        let memory = Arc::new(MemoryRegistry::new());
        let transports = crate::transport::start(
            ip,
            &host,
            &session_id,
            rpc_port,
            memory.clone(),
            &config,
            request,
        )?;
        let notify_bytes = config.notify_queue_bytes;
        let protocols: Vec<&'static str> = transports.iter().map(|t| t.protocol()).collect();
        let metrics_addr = config
            .metrics_port
            .map(|port| SocketAddr::new(config.metrics_bind_address.unwrap_or(ip), port));
        let inner = Arc::new(Inner {
            metrics: Metrics::new(&protocols),
            store,
            config,
            session_id,
            host,
            rpc_port,
            memory,
            transports,
            segments: RwLock::new(HashMap::new()),
            notifies: NotifyQueue::new(notify_bytes),
        });
        let weak = Arc::downgrade(&inner);
        let handler = Arc::new(move |kind: MessageType, json: &str| {
            weak.upgrade()
                .and_then(|inner| inner.handle_rpc(kind, json))
        });
        let limits = handshake::ServerLimits::from_config(&inner.config);
        let rpc = HandshakeServer::start_with(rpc_listener, limits, handler).map_err(|source| {
            EngineError::Listen {
                what: "cannot start the handshake server".into(),
                source,
            }
        })?;
        let housekeeping = Housekeeping::start(Arc::downgrade(&inner))?;
        let metrics_server = match metrics_addr {
            None => None,
            Some(addr) => Some(serve_metrics(&inner, addr)?),
        };
        // Published once peers can reach our handshake port (a store may probe it), and
        // nothing fallible comes after it but `leave` on failure.
        inner.join_store()?;
        let desc = inner.local_desc();
        tracing::info!(
            "transfer engine {} up: handshake port {rpc_port}, transports {:?}, TCP data port {} (v2)",
            inner.session_id,
            desc.protocol,
            desc.tcp_data_port
        );
        Ok(Self {
            inner,
            _housekeeping: housekeeping,
            _rpc: rpc,
            _metrics_server: metrics_server,
        })
    }

    /// A copy of the transfer metrics: per transport and per peer segment (see
    /// [`crate::metrics`]).
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner
            .metrics
            .snapshot(&self.inner.transport_counters())
    }

    /// The metrics in the Prometheus text format (what `MC_METRICS_PORT` serves).
    pub fn metrics_text(&self) -> String {
        self.inner
            .metrics
            .prometheus_text(&self.inner.transport_counters())
    }

    /// Where the metrics endpoint listens (`MC_METRICS_PORT`; port 0 picks a free one).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self._metrics_server.as_ref().map(MetricsServer::addr)
    }

    /// The host peers are told to reach this engine at: P2P, the host part of the session
    /// id; with a store, the address published in its `rpc_meta` entry and descriptor
    /// (see `advertise.rs`: `MC_TCP_BIND_ADDRESS`, the name when it is or resolves to an
    /// address of this host, else the first up non-loopback address).
    pub fn published_host(&self) -> &str {
        &self.inner.host
    }

    /// The session id peers use as `target_hostname`: `host:rpc_port`.
    pub fn session_id(&self) -> &str {
        &self.inner.session_id
    }

    /// The handshake (RPC) port.
    pub fn rpc_port(&self) -> u16 {
        self.inner.rpc_port
    }

    /// The TCP data port (as advertised in the descriptor).
    pub fn data_port(&self) -> u16 {
        self.inner.local_desc().tcp_data_port
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Registers `[addr, addr+len)` for remote access.
    ///
    /// `location` is `cpu:N`, `musa:N`, `cuda:N` or `*` (detect: a device
    /// pointer becomes `musa:N`/`cuda:N`, host memory `cpu:<NUMA node>`). A
    /// device location needs the vendor runtime; when it cannot be loaded the
    /// error lists every library tried.
    pub fn register_memory(&self, addr: u64, len: u64, location: &str) -> Result<(), EngineError> {
        let location = resolve_location(addr, location)?;
        let region = self.inner.memory.register(addr, len, &location)?;
        for (i, t) in self.inner.transports.iter().enumerate() {
            if let Err(e) = t.on_register(&region) {
                self.inner.memory.unregister(addr, |region| {
                    for done in self.inner.transports.iter().take(i) {
                        done.on_unregister(region);
                    }
                })?;
                return Err(e.into());
            }
        }
        Ok(self.inner.store.publish(&self.inner.local_desc())?)
    }

    /// Unregisters the region starting at `addr`. Returns once no engine thread touches
    /// it: peer connections in the middle of an access to it are cut (the peer sees its
    /// request fail), not waited for.
    pub fn unregister_memory(&self, addr: u64) -> Result<(), EngineError> {
        // The transports release the region (RDMA deregisters it from the HCAs, which
        // gives back its leases) once no engine thread touches it any more.
        self.inner.memory.unregister(addr, |region| {
            for t in &self.inner.transports {
                t.on_unregister(region);
            }
        })?;
        Ok(self.inner.store.publish(&self.inner.local_desc())?)
    }

    /// `(addr, len, location)` of every registered region, locations resolved.
    pub fn registered_regions(&self) -> Vec<(u64, u64, String)> {
        self.inner.memory.snapshot()
    }

    /// What each transport decided (protocol, one line), for the topology dump: e.g.
    /// whether same-host device-to-device requests go over GPU IPC.
    pub fn transport_decisions(&self) -> Vec<(&'static str, String)> {
        self.inner
            .transports
            .iter()
            .filter_map(|t| t.decision().map(|d| (t.protocol(), d)))
            .collect()
    }

    /// The local topology JSON (upstream's `get_local_topology` shape), narrowed by
    /// `MC_TE_FILTERS` and `device_name` as `initialize` narrows it.
    pub fn local_topology(&self, device_name: &str) -> Result<String, EngineError> {
        let topo = crate::topology::local(&self.inner.config, device_name)
            .map_err(|cause| crate::transport::select::Refusal::Topology { cause })
            .map_err(crate::transport::TransportError::Refused)?;
        Ok(crate::topology::to_json(&topo.matrix))
    }

    /// This engine's descriptor, as peers receive it.
    pub fn local_descriptor(&self) -> SegmentDesc {
        self.inner.local_desc()
    }

    /// The registered buffers of `segment` (its cached descriptor; opened on first use).
    pub fn segment_buffers(&self, segment: &str) -> Result<Vec<BufferDesc>, EngineError> {
        if segment == self.inner.session_id {
            return Ok(self.inner.local_desc().buffers);
        }
        let id = self.inner.segment_id(segment)?;
        let (seg, _) = self.inner.open_segment(&id)?;
        let buffers = seg.desc.read().buffers.clone();
        Ok(buffers)
    }

    /// Drops the cached descriptor of `segment`; the next use fetches it again.
    pub fn forget_segment(&self, segment: &str) {
        self.inner.segments.write().remove(segment);
    }

    /// Submits a batch of requests to `segment` and returns at once.
    ///
    /// Requests whose remote range the peer has not registered fail without
    /// any I/O; others complete on the returned batch. The batch's deadline is
    /// `MC_TRANSFER_TIMEOUT` plus 1 ns per byte.
    ///
    /// # Safety
    /// Every local range `[local, local+len)` must be valid (and, for reads,
    /// writable) until the batch has finished, or until
    /// [`BatchState::cancel_and_drain`] (which [`BatchState::wait`] calls on a
    /// timeout) has returned.
    pub unsafe fn submit(&self, segment: &str, requests: &[Request]) -> Result<Batch, EngineError> {
        let id = self.inner.segment_id(segment)?;
        self.inner.submit(&id, requests, &SubmitOptions::default())
    }

    /// [`submit`](Self::submit) with `options` (the caller's NIC, whether it waits at once).
    ///
    /// # Safety
    /// As [`submit`](Self::submit).
    pub unsafe fn submit_with(
        &self,
        segment: &str,
        requests: &[Request],
        options: &SubmitOptions,
    ) -> Result<Batch, EngineError> {
        let id = self.inner.segment_id(segment)?;
        self.inner.submit(&id, requests, options)
    }

    /// [`submit`](Self::submit) for a caller that waits for the batch at once (a
    /// synchronous call): over TCP, a request alone in the batch (small, host memory), or
    /// a batch to a busy link (host memory, `MC_TCP_CALLER_CONNS`), may be sent on the
    /// calling thread before this returns, saving thread hand-offs. The returned batch is
    /// waited for as any other.
    ///
    /// # Safety
    /// As [`submit`](Self::submit).
    pub unsafe fn submit_to_wait(
        &self,
        segment: &str,
        requests: &[Request],
    ) -> Result<Batch, EngineError> {
        let id = self.inner.segment_id(segment)?;
        self.inner.submit(&id, requests, &CALLER_WAITS)
    }

    /// Submits and waits until the batch's deadline. On a timeout the batch is drained
    /// before this returns: the local memory is no longer touched.
    ///
    /// # Safety
    /// Every local range must be valid (and, for reads, writable) for the call.
    pub unsafe fn transfer_sync(
        &self,
        segment: &str,
        requests: &[Request],
    ) -> Result<(), EngineError> {
        // The caller's contract covers the lending; the internal path is safe code.
        let id = self.inner.segment_id(segment)?;
        let batch = self.inner.submit(&id, requests, &CALLER_WAITS)?;
        batch.wait().map_err(|source| EngineError::Transfer {
            segment: segment.to_string(),
            source,
        })
    }

    /// Sends a notification to `segment`'s engine.
    pub fn send_notify(&self, segment: &str, msg: &Notify) -> Result<(), EngineError> {
        let id = self.inner.segment_id(segment)?;
        let rpc = self.inner.store.rpc_address(&id)?;
        let reply =
            handshake::request(&rpc, MessageType::Notify, &msg.encode(), &self.inner.config)?;
        let reply = NotifyMsg::decode(&reply)?;
        if reply.notify_msg != "success" {
            return Err(EngineError::Handshake {
                peer: segment.to_string(),
                answer: HandshakeAnswer::NotifyRefused(reply.notify_msg),
            });
        }
        Ok(())
    }

    /// Takes the notifications received so far.
    pub fn take_notifies(&self) -> Vec<Notify> {
        self.inner.notifies.take()
    }

    /// Notifications refused so far because the queue held
    /// `MC_NOTIFY_QUEUE_BYTES` already (their senders were told).
    pub fn dropped_notifies(&self) -> u64 {
        self.inner.notifies.dropped()
    }

    /// Checks that `segment`'s engine answers on its handshake port.
    pub fn probe(&self, segment: &str) -> Result<(), EngineError> {
        let id = self.inner.segment_id(segment)?;
        let rpc = self.inner.store.rpc_address(&id)?;
        let reply = handshake::request(&rpc, MessageType::Probe, "{}", &self.inner.config)?;
        if crate::wire::descriptor::probe_reply_ok(&reply) {
            Ok(())
        } else {
            Err(EngineError::Handshake {
                peer: segment.to_string(),
                answer: HandshakeAnswer::UnexpectedProbeReply(reply),
            })
        }
    }
}

/// The handshake listener on `ip`, at the first free port of `MC_MIN_RPC_PORT` to
/// `MC_MAX_RPC_PORT`, and its port.
fn bind_handshake(ip: IpAddr, config: &Config) -> Result<(TcpListener, u16), EngineError> {
    let (min, max) = (config.min_rpc_port, config.max_rpc_port);
    let listen_err = |source: std::io::Error| EngineError::Listen {
        what: format!(
            "no free handshake port on {ip} in {min}-{max} (MC_MIN_RPC_PORT/MC_MAX_RPC_PORT)"
        ),
        source,
    };
    let rpc_listener =
        net::bind_in_range(ip, min, max, config.handshake_listen_backlog).map_err(listen_err)?;
    let rpc_port = rpc_listener.local_addr().map_err(listen_err)?.port();
    Ok((rpc_listener, rpc_port))
}

/// The session id (segment name) and the metadata store of an engine named
/// `local_hostname` whose handshake listener is at `host:rpc_port`.
fn open_store(
    kind: StoreKind,
    local_hostname: &str,
    host: &str,
    rpc_port: u16,
    config: &Config,
) -> Result<(String, Box<dyn MetadataStore>), EngineError> {
    Ok(match kind {
        StoreKind::P2p => {
            let id = HostPort {
                host: host.to_string(),
                port: rpc_port,
            }
            .session_id();
            (id, Box::new(P2pStore::new(config.clone())))
        }
        StoreKind::Http(url) => {
            // Store mode: the segment name is `local_hostname` verbatim (upstream).
            SegmentId::parse(local_hostname, config.handshake_port)?;
            let store = HttpStore::new(&url, &config.metadata_cluster_id, config.clone())?;
            (local_hostname.to_string(), Box::new(store))
        }
        StoreKind::Etcd(conn) => {
            SegmentId::parse(local_hostname, config.handshake_port)?;
            let store = EtcdStore::new(&conn, config.clone())?;
            (local_hostname.to_string(), Box::new(store))
        }
    })
}

/// Serves `inner`'s metrics at `addr` (`MC_METRICS_PORT`) for as long as the engine lives.
fn serve_metrics(inner: &Arc<Inner>, addr: SocketAddr) -> Result<MetricsServer, EngineError> {
    let weak = Arc::downgrade(inner);
    let render = Box::new(move || {
        weak.upgrade()
            .map(|inner| inner.metrics.prometheus_text(&inner.transport_counters()))
            .unwrap_or_default()
    });
    let server = MetricsServer::start(addr, render).map_err(|source| EngineError::Listen {
        what: format!("cannot serve metrics on {addr} (MC_METRICS_PORT)"),
        source,
    })?;
    tracing::info!("metrics at http://{}/metrics", server.addr());
    Ok(server)
}

impl Inner {
    /// Announces this engine in the metadata store: its handshake address, then its
    /// descriptor; on failure it leaves the store again.
    fn join_store(&self) -> Result<(), EngineError> {
        let rpc_meta = RpcMeta {
            ip_or_host_name: self.host.clone(),
            rpc_port: self.rpc_port,
        };
        let joined = self
            .store
            .join(&self.session_id, &rpc_meta)
            .and_then(|()| self.store.publish(&self.local_desc()));
        if let Err(e) = joined {
            self.store.leave();
            return Err(e.into());
        }
        Ok(())
    }

    fn segment_id(&self, name: &str) -> Result<SegmentId, EngineError> {
        Ok(SegmentId::parse(name, self.config.handshake_port)?)
    }

    fn local_desc(&self) -> SegmentDesc {
        let mut desc = SegmentDesc {
            name: self.session_id.clone(),
            protocol: Vec::new(),
            tcp_data_port: 0,
            tcp_data_host: None,
            tcp_proto_version: 0,
            tcp_write_runs: false,
            timestamp: net::timestamp_now(),
            buffers: self
                .memory
                .snapshot()
                .into_iter()
                .map(|(addr, length, _)| BufferDesc {
                    name: self.session_id.clone(),
                    addr,
                    length,
                    ..BufferDesc::default()
                })
                .collect(),
            host_id: None,
            pid: None,
            pid_ns: None,
            ipc_control: None,
            ipc_fd_socket: None,
            devices: Vec::new(),
            priority_matrix: Default::default(),
        };
        for t in &self.transports {
            t.describe(&mut desc);
        }
        desc
    }

    fn handle_rpc(&self, kind: MessageType, json: &str) -> Option<String> {
        match kind {
            MessageType::Metadata => Some(self.local_desc().encode()),
            MessageType::Notify => match NotifyMsg::decode(json) {
                Ok(n) => Some(match self.notifies.push(n) {
                    Ok(()) => NotifyMsg::success_reply().encode(),
                    Err(_) => NotifyMsg {
                        name: String::new(),
                        notify_msg: REFUSED_REPLY.into(),
                    }
                    .encode(),
                }),
                Err(e) => {
                    tracing::warn!("malformed notify ignored: {e}");
                    None
                }
            },
            MessageType::Probe => Some(PROBE_REPLY.to_string()),
            MessageType::IpcControl => {
                let forget = |name: &str| {
                    self.segments
                        .write()
                        .retain(|_, s| s.desc.read().name != name);
                };
                let reply = self
                    .transports
                    .iter()
                    .find_map(|t| t.handle_ipc_control(json, &forget));
                Some(reply.unwrap_or_else(|| {
                    r#"{"ok":false,"error":"this engine runs no same-host GPU IPC transport"}"#
                        .to_string()
                }))
            }
            MessageType::Connection => {
                if let Some(reply) = self
                    .transports
                    .iter()
                    .find_map(|t| t.handle_connection(json))
                {
                    return Some(reply);
                }
                tracing::warn!("RDMA connection request refused: this engine serves TCP only");
                Some(
                    serde_json::json!({
                        "local_nic_path": "", "peer_nic_path": "", "qp_num": [],
                        "reply_msg": "RDMA is not available on this engine (TCP only)"
                    })
                    .to_string(),
                )
            }
        }
    }

    /// The segment and whether its descriptor was fetched just now.
    fn open_segment(&self, id: &SegmentId) -> Result<(Arc<Segment>, bool), EngineError> {
        if let Some(s) = self.segments.read().get(id.name()) {
            return Ok((s.clone(), false));
        }
        let desc = self.store.fetch(id)?;
        let seg = Arc::new(Segment {
            desc: RwLock::new(Arc::new(desc)),
            peer_metrics: self.metrics.peer(id.name()),
        });
        self.segments
            .write()
            .insert(id.name().to_string(), seg.clone());
        Ok((seg, true))
    }

    fn transport_counters(&self) -> Vec<(&'static str, TransportCounters)> {
        self.transports
            .iter()
            .map(|t| (t.protocol(), t.counters()))
            .collect()
    }

    fn refresh_segment(&self, id: &SegmentId, seg: &Segment) -> Result<(), EngineError> {
        let desc = self.store.fetch(id)?;
        *seg.desc.write() = Arc::new(desc);
        Ok(())
    }

    fn transport_for(
        &self,
        id: &SegmentId,
        desc: &SegmentDesc,
    ) -> Result<Arc<dyn Transport>, EngineError> {
        self.transports
            .iter()
            .find(|t| t.reaches(desc))
            .cloned()
            .ok_or_else(|| EngineError::NoCommonTransport {
                segment: id.to_string(),
                peer_serves: desc.protocol.clone(),
                ours: self.transports.iter().map(|t| t.protocol()).collect(),
            })
    }
}

impl Drop for TransferEngine {
    fn drop(&mut self) {
        // Peers may be in the middle of reads and writes of registered memory: cut them and
        // wait until they let go, so the caller may free that memory once this returns.
        // (Connections to peers, and with them every access to local buffers, are closed
        // and joined when the transports drop with `inner`.)
        self.inner.memory.unregister_all(|region| {
            for t in &self.inner.transports {
                t.on_unregister(region);
            }
        });
        // Remove our entries from the metadata store (a no-op in P2P mode).
        self.inner.store.leave();
    }
}

impl std::fmt::Debug for TransferEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferEngine")
            .field("session_id", &self.inner.session_id)
            .field("host", &self.inner.host)
            .finish()
    }
}
