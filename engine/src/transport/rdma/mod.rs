//! RDMA as upstream speaks it: RC queue pairs set up through the type-0 handshake,
//! RDMA WRITE / READ of registered memory, upstream's descriptor form.
//!
//! Written against the [`backend`] traits; [`fake`] is an in-process fake fabric for
//! tests. Per HCA one worker thread (`worker`) owns that HCA's endpoints (one per peer
//! NIC, `MC_NUM_QP_PER_EP` queue pairs each), posts work requests and polls the HCA's
//! completion queue; its `setup` thread does the endpoint handshakes, so that polling
//! never waits on a peer. A failed slice goes back to `Shared::dispatch`, which picks the
//! next path (another local HCA, then another remote one) up to `MC_RETRY_CNT` times;
//! the endpoint whose queue pair failed is rebuilt for later slices.
//!
//! Device memory is registered with the peer-memory module, else through dma-buf, else
//! kept as *staged*: not advertised to peers' NICs, every request touching it goes over
//! TCP (see [`register`] for the order and the reasons).
//!
//! Not done yet: regions are not split at the device's `max_mr_size`; idle endpoints are closed only beyond
//! `MC_MAX_EP_PER_CTX`; upstream's optional ready-ACK round trip is not offered.
//!
//! # Memory contract
//!
//! The NIC reads or writes a slice's local memory from the moment its work request is
//! posted until its completion is polled. So the worker [`take`](Slice::take)s each slice
//! with its endpoint's `EndpointCut` as carrier, and finishes or
//! releases it only when the completion is polled. Cutting (from
//! `BatchState::cancel_and_drain`, or from `MemoryRegistry::unregister` for a pinned local
//! region) moves the endpoint's queue pairs to ERROR: the HCA stops and completes every
//! outstanding request with a flush status, the worker polls those and lets go, and only
//! then does the drain or the unregister return. The endpoint is rebuilt (new queue pairs,
//! a new handshake) for later slices.
//!
//! On the target side a peer's NIC writes and reads our registered memory with no thread
//! of ours involved. [`Transport::on_unregister`] deregisters the region's memory region
//! on every HCA; `ibv_dereg_mr` returns only once the HCA no longer accesses the memory,
//! and every later request with the old remote key fails at the peer with a remote access
//! error. That is why unregistering is sound without any cooperation from peers.

// Peer input is parsed here: an index out of range must be an error, never a panic.
#![deny(clippy::indexing_slicing)]

pub mod backend;
mod connector;
mod endpoint_cut;
pub mod fake;
mod path;
mod peer;
pub(crate) mod register;
mod setup;
pub mod verbs_backend;
mod worker;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Sender};
use parking_lot::{Mutex, RwLock};

use super::{Slice, Transport, TransportError};
use crate::config::Config;
use crate::error::{LinkLoss, TransferError, Unreachable, Violation};
use crate::memory::Region;
use crate::metrics::ConnectionCounters;
use crate::transport::causes::{RegisterCause, UnusableCause};
use crate::wire::descriptor::{BufferDesc, DeviceDesc, SegmentDesc};
use crate::wire::rdma::{format_gid, split_nic_path, ConnectMsg};
use crate::wire::session::SegmentId;
use backend::{MrKeys, Nic, QueuePair, RemoteQp};
pub use connector::{Connector, ExchangeError, HandshakeConnector};
use path::Choice;
use peer::{staged_at_peer, Peer};
use worker::{Msg, Work};

/// The protocol name in descriptors.
pub const PROTOCOL: &str = "rdma";

/// Upstream's topology JSON: per location, `[preferred HCAs, available HCAs]`.
pub type Topology = BTreeMap<String, [Vec<String>; 2]>;

/// RDMA settings, with upstream's variable names and defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaParams {
    /// `MC_SLICE_SIZE`: bytes per work request (65536).
    pub slice_size: u64,
    /// `MC_FRAGMENT_RATIO`: a tail of at most `slice_size / ratio` rides with the slice
    /// before it (4).
    pub fragment_ratio: u64,
    /// `MC_NUM_QP_PER_EP`: queue pairs per endpoint (2); both sides must agree.
    pub num_qp_per_ep: usize,
    /// `MC_MAX_WR`: send queue depth of each queue pair (256).
    pub max_wr: usize,
    /// `MC_RETRY_CNT`: times a failed slice is sent again on another path (9).
    pub retry_cnt: usize,
    /// `MC_IB_PORT`: HCA port (1).
    pub ib_port: u8,
    /// `MC_GID_INDEX`: GID index, or -1 to pick one (RoCE v2 first).
    pub gid_index: i32,
    /// `MC_MTU`: path MTU cap in bytes (4096).
    pub mtu: u32,
    /// `MC_MAX_EP_PER_CTX`: endpoints per HCA (65536), active and passive each.
    pub max_ep_per_ctx: usize,
    /// `MC_MAX_CQE_PER_CTX`: completion queue entries per HCA (4096), which also caps
    /// the requests outstanding on one HCA.
    pub max_cqe: usize,
    /// `MC_FORCE_HCA=1`: device memory no HCA can register is an error, not staged.
    pub force_hca: bool,
}

impl Default for RdmaParams {
    fn default() -> Self {
        Self {
            slice_size: 65536,
            fragment_ratio: 4,
            num_qp_per_ep: 2,
            max_wr: 256,
            retry_cnt: 9,
            ib_port: 1,
            gid_index: -1,
            mtu: 4096,
            max_ep_per_ctx: 65536,
            max_cqe: 4096,
            force_hca: false,
        }
    }
}

/// The memory registrations of one region, one per HCA (device order); none for a
/// staged region.
#[derive(Debug)]
struct RegionKeys {
    /// The region they belong to (another may be registered at the same address later).
    region: Weak<Region>,
    len: u64,
    location: String,
    keys: Vec<MrKeys>,
    how: register::Registration,
}

impl RegionKeys {
    fn staged(&self) -> bool {
        self.how == register::Registration::Staged
    }
}

/// Queue pairs of the endpoints peers set up towards us, per HCA, oldest first.
#[derive(Default)]
struct Passive {
    endpoints: HashMap<(usize, String), Vec<Arc<dyn QueuePair>>>,
    order: VecDeque<(usize, String)>,
}

/// What the transport's threads share.
pub(crate) struct Shared {
    local_name: String,
    nics: Vec<Arc<dyn Nic>>,
    params: RdmaParams,
    topology: Topology,
    /// Candidate local HCAs per location (and for unknown locations).
    local_choices: HashMap<String, Choice>,
    any_local: Choice,
    regions: RwLock<BTreeMap<u64, RegionKeys>>,
    connector: Arc<dyn Connector>,
    passive: Mutex<Passive>,
    workers: Vec<Sender<Msg>>,
    rr: AtomicUsize,
    /// Last handshake failure per segment, so the engine can look the peer up again.
    dead: Mutex<HashMap<String, (Instant, Unreachable)>>,
    /// Endpoints set up and rebuilt, slices retried over another HCA pair.
    pub(crate) counters: ConnectionCounters,
}

/// How long a failed handshake is reported by [`Transport::unreachable`].
const DEAD_PEER_HOLD: Duration = Duration::from_millis(500);

impl Shared {
    fn nic_names(&self) -> Vec<&str> {
        self.nics.iter().map(|n| n.name()).collect()
    }

    /// Sends `work` to the worker of its next path, or fails it once every attempt is
    /// spent.
    pub(crate) fn dispatch(&self, mut work: Work) {
        if work.route.attempt > self.params.retry_cnt {
            let err = work
                .route
                .last_error
                .take()
                .unwrap_or(TransferError::PeerLost {
                    peer: work.route.peer.segment.clone(),
                    cause: LinkLoss::NoPathLeft,
                });
            let attempts = work.route.attempt;
            return work.fail(err.after_attempts(attempts));
        }
        let location = work
            .slice
            .local_region
            .as_ref()
            .map_or("*", |r| r.location.as_str());
        let by_location = self.local_choices.get(location).unwrap_or(&self.any_local);
        let names = self.nics.iter().map(|n| n.name());
        let Some(local) = path::local(work.slice.batch.nic_hint(), names, by_location) else {
            // The engine checked the hint against `local_nics` before posting.
            return work.fail(TransferError::Canceled("unknown nic_hint"));
        };
        let peer = work.route.peer.segment.clone();
        let Some(remote) = work
            .route
            .peer
            .buffers
            .get(work.route.buffer)
            .map(|b| &b.choice)
        else {
            let index = work.route.buffer;
            return work.fail(TransferError::Protocol {
                peer,
                violation: Violation::BufferIndex { index },
            });
        };
        let Some((l, r)) = path::route(&local, remote, work.route.rr, work.route.attempt) else {
            return work.fail(TransferError::PeerUnreachable {
                peer,
                cause: Unreachable::NoRdmaDevice,
            });
        };
        work.route.remote_dev = r;
        match self.workers.get(l) {
            Some(tx) => {
                if let Err(e) = tx.send(Msg::Work(work)) {
                    if let Msg::Work(w) = e.into_inner() {
                        w.fail(TransferError::Canceled("the RDMA transport shut down"));
                    }
                }
            }
            None => work.fail(TransferError::Canceled("the RDMA transport has no HCA")),
        }
    }

    fn lkey(&self, region: &Region, nic: usize) -> Option<u32> {
        let regions = self.regions.read();
        let r = regions.get(&region.addr)?;
        r.keys.get(nic).map(|k| k.lkey)
    }

    fn mark_dead(&self, segment: &str, why: &Unreachable) {
        let mut dead = self.dead.lock();
        if dead.len() > 4096 {
            dead.retain(|_, (at, _)| at.elapsed() < DEAD_PEER_HOLD);
        }
        dead.insert(segment.to_string(), (Instant::now(), why.clone()));
    }

    /// The passive side of the endpoint handshake: checks the request, creates and
    /// connects our queue pairs, and answers with them (or a `reply_msg` refusal).
    fn accept(&self, json: &str) -> String {
        match self.try_accept(json) {
            Ok(reply) => reply.encode(),
            Err(why) => {
                tracing::warn!("RDMA connection request refused: {why}");
                ConnectMsg {
                    payload: String::new(),
                    local_nic_path: String::new(),
                    local_lid: 0,
                    local_gid: String::new(),
                    peer_nic_path: String::new(),
                    qp_num: Vec::new(),
                    ready_ack: None,
                    reply_msg: why,
                }
                .encode()
            }
        }
    }

    fn try_accept(&self, json: &str) -> Result<ConnectMsg, String> {
        let msg = ConnectMsg::decode(json).map_err(|e| format!("malformed request: {e}"))?;
        split_nic_path(&msg.local_nic_path).map_err(|e| e.to_string())?;
        let (_, nic_name) = split_nic_path(&msg.peer_nic_path).map_err(|e| e.to_string())?;
        let idx = self
            .nics
            .iter()
            .position(|n| n.name() == nic_name)
            .ok_or_else(|| {
                format!(
                    "no HCA {nic_name:?} in this engine (it uses {:?})",
                    self.nic_names()
                )
            })?;
        let want = self.params.num_qp_per_ep;
        if msg.qp_num.len() != want {
            return Err(format!(
                "queue pair count mismatch: the request has {}, this engine uses {want} \
                 (MC_NUM_QP_PER_EP must be the same on both sides; check MC_MAX_EP_PER_CTX)",
                msg.qp_num.len()
            ));
        }
        let gid = msg.gid().map_err(|e| e.to_string())?;
        let nic = self.nics.get(idx).ok_or("HCA index out of range")?;
        let qps = connect_qps(nic.as_ref(), &self.params, &msg.qp_num, msg.local_lid, gid)?;
        let port = nic.port();
        let reply = ConnectMsg {
            payload: String::new(),
            local_nic_path: format!("{}@{}", self.local_name, nic.name()),
            local_lid: port.lid,
            local_gid: format_gid(&port.gid),
            peer_nic_path: msg.local_nic_path.clone(),
            qp_num: qps.iter().map(|q| q.qp_num()).collect(),
            ready_ack: None,
            reply_msg: String::new(),
        };
        let key = (idx, msg.local_nic_path);
        let mut passive = self.passive.lock();
        // A peer that rebuilt its endpoint replaces the old one; the oldest go first
        // beyond the cap (their peers see errors and set up again).
        if passive.endpoints.insert(key.clone(), qps).is_none() {
            passive.order.push_back(key);
        }
        while passive.endpoints.len() > self.params.max_ep_per_ctx.max(1) {
            let Some(old) = passive.order.pop_front() else {
                break;
            };
            if let Some(qps) = passive.endpoints.remove(&old) {
                qps.iter().for_each(|q| q.to_error());
            }
        }
        Ok(reply)
    }
}

/// Creates one queue pair per remote number and connects each to it.
fn connect_qps(
    nic: &dyn Nic,
    params: &RdmaParams,
    remote: &[u32],
    lid: u16,
    gid: backend::Gid,
) -> Result<Vec<Arc<dyn QueuePair>>, String> {
    let depth = u32::try_from(params.max_wr).unwrap_or(u32::MAX);
    let mut qps = Vec::with_capacity(remote.len());
    for &qp_num in remote {
        let qp = nic
            .create_qp(depth)
            .map_err(|e| format!("cannot create a queue pair on {}: {e}", nic.name()))?;
        qp.connect(&RemoteQp { qp_num, lid, gid })
            .map_err(|e| format!("cannot connect a queue pair on {}: {e}", nic.name()))?;
        qps.push(qp);
    }
    Ok(qps)
}

/// The RDMA transport.
pub struct RdmaTransport {
    shared: Arc<Shared>,
    /// Peers' descriptors as last checked, by segment name.
    peers: Mutex<HashMap<String, (SegmentDesc, Arc<Peer>)>>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for RdmaTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaTransport")
            .field("local_name", &self.shared.local_name)
            .field("nics", &self.shared.nic_names())
            .finish()
    }
}

/// Most peers whose checked descriptors are kept.
const MAX_PEERS: usize = 4096;

impl RdmaTransport {
    /// Starts the transport over the HCAs `hcas` (opened through the verbs library that
    /// `MC_IBVERBS_PATH` names, or `libibverbs.so.1`), in that device order.
    /// `local_name` is this engine's server name (the `<server>` of its NIC paths; the
    /// session id in P2P mode), `topology` the location → `[preferred, available]` HCA
    /// map (upstream's topology JSON), `params` the `MC_*` RDMA settings; endpoint
    /// handshakes go through the engine's handshake client with `config`'s bounds.
    pub fn start(
        local_name: &str,
        hcas: &[verbs_backend::HcaSpec],
        topology: Topology,
        params: RdmaParams,
        config: &Config,
    ) -> Result<Self, TransportError> {
        let unusable = |cause: UnusableCause| TransportError::Unusable {
            segment: local_name.to_string(),
            protocol: PROTOCOL,
            cause,
        };
        let verbs = crate::verbs::shared().map_err(|e| unusable(e.into()))?;
        let mut nics: Vec<Arc<dyn Nic>> = Vec::with_capacity(hcas.len());
        for hca in hcas {
            let nic = verbs_backend::VerbsNic::open(&verbs, hca, &params)
                .map_err(|e| unusable(UnusableCause::OpenHca(e)))?;
            nics.push(Arc::new(nic));
        }
        let connector = Arc::new(HandshakeConnector::new(config));
        Self::with_nics(local_name, nics, topology, params, connector)
    }

    /// Starts the transport over `nics` (in device order: the order of every buffer's
    /// keys in our descriptor). `local_name` is this engine's server name (the
    /// `<server>` of our NIC paths), `topology` the local location → `[preferred,
    /// available]` HCA map, `connector` how handshakes reach peers.
    pub fn with_nics(
        local_name: &str,
        nics: Vec<Arc<dyn Nic>>,
        topology: Topology,
        params: RdmaParams,
        connector: Arc<dyn Connector>,
    ) -> Result<Self, TransportError> {
        if nics.is_empty() {
            return Err(TransportError::Unusable {
                segment: local_name.to_string(),
                protocol: PROTOCOL,
                cause: UnusableCause::NoHca,
            });
        }
        let names: Vec<&str> = nics.iter().map(|n| n.name()).collect();
        let local_choices = topology
            .keys()
            .map(|loc| (loc.clone(), Choice::new(&topology, loc, &names)))
            .collect();
        let any_local = Choice::new(&Topology::new(), "*", &names);
        let mut senders = Vec::new();
        let mut receivers = Vec::new();
        for _ in &nics {
            let (tx, rx) = unbounded();
            senders.push(tx);
            receivers.push(rx);
        }
        let shared = Arc::new(Shared {
            local_name: local_name.to_string(),
            nics,
            params,
            topology,
            local_choices,
            any_local,
            regions: RwLock::new(BTreeMap::new()),
            connector,
            passive: Mutex::new(Passive::default()),
            workers: senders,
            rr: AtomicUsize::new(0),
            dead: Mutex::new(HashMap::new()),
            counters: ConnectionCounters::default(),
        });
        let mut threads = Vec::new();
        for (i, rx) in receivers.into_iter().enumerate() {
            let s = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("te-rdma-{i}"))
                .spawn(move || worker::Worker::new(s, i).run(rx));
            match spawned {
                Ok(t) => threads.push(t),
                Err(source) => {
                    stop(&shared, threads);
                    return Err(TransportError::Io {
                        what: "cannot start an RDMA worker thread".into(),
                        source,
                    });
                }
            }
        }
        Ok(Self {
            shared,
            peers: Mutex::new(HashMap::new()),
            threads,
        })
    }

    /// The HCA names, in device order.
    pub fn nic_names(&self) -> Vec<String> {
        self.shared
            .nic_names()
            .into_iter()
            .map(str::to_string)
            .collect()
    }

    fn peer(&self, segment: &SegmentId, desc: &SegmentDesc) -> Result<Arc<Peer>, TransportError> {
        let mut peers = self.peers.lock();
        if let Some((known, peer)) = peers.get(segment.name()) {
            if known == desc {
                return Ok(peer.clone());
            }
        }
        let peer =
            Arc::new(
                Peer::from_desc(segment, desc).map_err(|cause| TransportError::Unusable {
                    segment: segment.to_string(),
                    protocol: PROTOCOL,
                    cause,
                })?,
            );
        if peers.len() >= MAX_PEERS {
            peers.clear();
        }
        peers.insert(segment.name().to_string(), (desc.clone(), peer.clone()));
        Ok(peer)
    }
}

impl RdmaTransport {
    /// Whether our `region` is staged (no HCA registered it).
    /// The peer buffer `s` goes to, or why it cannot go over RDMA: its local memory is not
    /// registered or is staged, or the peer's is outside every buffer or staged.
    fn target_of(
        &self,
        segment: &SegmentId,
        peer: &Peer,
        s: &Slice,
    ) -> Result<usize, TransferError> {
        let Some(region) = s.local_region.as_ref() else {
            return Err(TransferError::LocalNotRegistered {
                addr: s.local,
                len: s.len,
                protocol: PROTOCOL,
            });
        };
        // Staged memory reaches us only when the peer has no TCP to go to instead.
        if self.is_staged(region) {
            return Err(TransferError::PeerUnreachable {
                peer: segment.to_string(),
                cause: Unreachable::LocalStaged { addr: region.addr },
            });
        }
        let Some(buffer) = peer.buffer(s.remote, s.len) else {
            return Err(TransferError::AddressRejected {
                peer: segment.to_string(),
                addr: s.remote,
                len: s.len,
            });
        };
        if peer
            .buffers
            .get(buffer)
            .is_some_and(|b| b.rkeys.iter().all(|&k| k == 0))
        {
            return Err(TransferError::PeerUnreachable {
                peer: segment.to_string(),
                cause: Unreachable::PeerStaged {
                    addr: s.remote,
                    force_hca: self.shared.params.force_hca,
                },
            });
        }
        Ok(buffer)
    }

    fn is_staged(&self, region: &Region) -> bool {
        let regions = self.shared.regions.read();
        regions.get(&region.addr).is_some_and(RegionKeys::staged)
    }
}

fn stop(shared: &Shared, threads: Vec<JoinHandle<()>>) {
    for tx in &shared.workers {
        let _ = tx.send(Msg::Stop);
    }
    for t in threads {
        let _ = t.join();
    }
}

impl Drop for RdmaTransport {
    fn drop(&mut self) {
        stop(&self.shared, std::mem::take(&mut self.threads));
        self.shared.passive.lock().endpoints.clear();
        let regions = std::mem::take(&mut *self.shared.regions.write());
        for r in regions.values() {
            for (nic, keys) in self.shared.nics.iter().zip(&r.keys) {
                nic.deregister(*keys);
            }
        }
    }
}

impl Transport for RdmaTransport {
    fn protocol(&self) -> &'static str {
        PROTOCOL
    }

    fn describe(&self, desc: &mut SegmentDesc) {
        if !desc.protocol.iter().any(|p| p == PROTOCOL) {
            desc.protocol.insert(0, PROTOCOL.into());
        }
        desc.devices = self
            .shared
            .nics
            .iter()
            .map(|n| {
                let port = n.port();
                DeviceDesc {
                    name: n.name().to_string(),
                    lid: port.lid,
                    gid: format_gid(&port.gid),
                }
            })
            .collect();
        desc.priority_matrix = self.shared.topology.clone();
        let regions = self.shared.regions.read();
        for b in &mut desc.buffers {
            if let Some(r) = regions.get(&b.addr).filter(|r| r.len == b.length) {
                b.name = r.location.clone();
                if r.staged() {
                    // Key 0 on every device: no NIC reaches it; peers use TCP.
                    b.rkey = vec![0; self.shared.nics.len()];
                    b.lkey = vec![0; self.shared.nics.len()];
                } else {
                    b.rkey = r.keys.iter().map(|k| k.rkey).collect();
                    b.lkey = r.keys.iter().map(|k| k.lkey).collect();
                }
            }
        }
    }

    fn reaches(&self, peer: &SegmentDesc) -> bool {
        peer.speaks_rdma()
    }

    fn local_nics(&self) -> Vec<String> {
        self.shared
            .nics
            .iter()
            .map(|n| n.name().to_string())
            .collect()
    }

    fn declines(&self, local: Option<&Region>, remote: &BufferDesc) -> bool {
        // With MC_FORCE_HCA=1 a peer's staged buffer is an error (in `post`), not TCP.
        local.is_some_and(|l| self.is_staged(l))
            || (staged_at_peer(remote) && !self.shared.params.force_hca)
    }

    fn unreachable(&self, segment: &SegmentId, _peer: &SegmentDesc) -> Option<Unreachable> {
        let dead = self.shared.dead.lock();
        dead.get(segment.name())
            .filter(|(at, _)| at.elapsed() < DEAD_PEER_HOLD)
            .map(|(_, why)| why.clone())
    }

    fn counters(&self) -> crate::metrics::TransportCounters {
        self.shared.counters.snapshot()
    }

    fn slice_size(&self) -> u64 {
        self.shared.params.slice_size.max(1)
    }

    fn post(
        &self,
        segment: &SegmentId,
        peer: &SegmentDesc,
        slices: Vec<Slice>,
    ) -> Result<(), TransportError> {
        let peer = self.peer(segment, peer)?;
        let shared = &self.shared;
        let limit = path::fragment_limit(self.slice_size(), shared.params.fragment_ratio);
        let mut pending: Option<Work> = None;
        for s in slices {
            let buffer = match self.target_of(segment, &peer, &s) {
                Ok(buffer) => buffer,
                Err(e) => {
                    s.finish(Err(e));
                    continue;
                }
            };
            if let Some(p) = pending.as_mut() {
                if p.absorbs(&s, buffer, limit) {
                    p.slice.len += s.len;
                    p.route.extra.push(s);
                    continue;
                }
            }
            let rr = shared.rr.fetch_add(1, Ordering::Relaxed);
            let work = Work::new(s, peer.clone(), buffer, rr);
            if let Some(done) = pending.replace(work) {
                shared.dispatch(done);
            }
        }
        if let Some(done) = pending {
            shared.dispatch(done);
        }
        Ok(())
    }

    fn on_register(&self, region: &Arc<Region>) -> Result<(), TransportError> {
        let (keys, how) = register::register(&self.shared, region)?;
        let mut regions = self.shared.regions.write();
        if regions.contains_key(&region.addr) {
            // A region unregistered from this address whose release has not run yet: its
            // memory regions hold leases that its unregister waits for, so they must not
            // be lost under the new entry.
            drop(regions);
            for (nic, k) in self.shared.nics.iter().zip(&keys) {
                nic.deregister(*k);
            }
            return Err(TransportError::Register {
                addr: region.addr,
                len: region.len,
                protocol: PROTOCOL,
                cause: RegisterCause::StillUnregistering,
            });
        }
        regions.insert(
            region.addr,
            RegionKeys {
                region: Arc::downgrade(region),
                len: region.len,
                location: region.location.clone(),
                keys,
                how,
            },
        );
        Ok(())
    }

    fn on_unregister(&self, region: &Arc<Region>) {
        // The region is retired: our slices on it were flushed or completed before its
        // pins dropped. Deregistering stops peers' NICs (see the module doc) and gives the
        // region's leases back, which `unregister` waits for.
        let removed = {
            let mut regions = self.shared.regions.write();
            match regions.get(&region.addr) {
                Some(r) if std::ptr::eq(r.region.as_ptr(), Arc::as_ptr(region)) => {
                    regions.remove(&region.addr)
                }
                _ => None,
            }
        };
        if let Some(r) = removed {
            for (nic, keys) in self.shared.nics.iter().zip(&r.keys) {
                nic.deregister(*keys);
            }
        }
    }

    fn handle_connection(&self, json: &str) -> Option<String> {
        Some(self.shared.accept(json))
    }
}

#[cfg(test)]
mod tests;
