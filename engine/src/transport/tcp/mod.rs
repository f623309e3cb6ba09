//! TCP v2 as upstream speaks it (and v1 for old peers).
//!
//! The server answers one request after another on each connection, so it
//! serves upstream clients (a connection per request) and ours (persistent,
//! pipelined connections, several per peer) alike.

// Peer input is parsed here: an index out of range must be an error, never a panic.
#![deny(clippy::indexing_slicing)]

mod budget;
pub mod client;
mod cut_reader;
mod halfway;
mod landing;
mod read_ahead;
mod read_run;
mod resolved_hosts;
mod same_host;
pub mod server;
mod spin;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::causes::UnusableCause;
use super::{Slice, Transport, TransportError};
use crate::config::Config;
use crate::error::Unreachable;
use crate::memory::MemoryRegistry;
use crate::net;
use crate::wire::descriptor::SegmentDesc;
use crate::wire::session::{HostPort, SegmentId};
use budget::LaneBudget;
use client::{Framing, LinkCounters, PeerLink};
use resolved_hosts::ResolvedHosts;
use server::TcpServer;

/// The protocol name in descriptors.
pub const PROTOCOL: &str = "tcp";

/// Stripes of requests in local device memory are this large at least: one staging
/// chunk (see `slice_size_for`).
const DEVICE_STRIPE: u64 = crate::device::staging::CHUNK as u64;

/// The TCP transport: a data-port server for peers, and links (lanes of persistent
/// connections) to each peer's data port.
pub struct TcpTransport {
    config: Config,
    host: String,
    data_port: u16,
    // Dropped before the server (field order): lanes stop, failing queued slices, first.
    links: Mutex<HashMap<(SocketAddr, Framing), Arc<PeerLink>>>,
    /// Peers' data hosts given by name, resolved once per `resolved_hosts::TTL`.
    hosts: ResolvedHosts,
    counters: Arc<LinkCounters>,
    /// Lanes shared by every link (`MC_TCP_LANE_BUDGET`).
    lanes: Arc<LaneBudget>,
    _server: TcpServer,
    // Dropped last: stagers the lanes and the server give back when they stop are freed.
    _staging: crate::device::staging_pool::StagingUser,
}

impl TcpTransport {
    /// Listens on `ip` (a port in the RPC range) and serves `memory` to peers; `host` is
    /// the name peers are told to connect to.
    pub fn start(
        ip: IpAddr,
        host: &str,
        memory: Arc<MemoryRegistry>,
        config: &Config,
    ) -> Result<Self, TransportError> {
        let (min, max) = (config.min_rpc_port, config.max_rpc_port);
        let io = |what: String| {
            move |source| TransportError::Io {
                what: what.clone(),
                source,
            }
        };
        let range = format!(
            "no free TCP data port on {ip} in {min}-{max} (MC_MIN_RPC_PORT/MC_MAX_RPC_PORT)"
        );
        let listener = net::bind_in_range(ip, min, max, 1024).map_err(io(range.clone()))?;
        let data_port = listener.local_addr().map_err(io(range))?.port();
        let staging = crate::device::staging_pool::user();
        crate::device::staging_pool::configure(config);
        // A lane and a receiver for each lane that may run at once.
        crate::device::spare_stagers::configure(
            2 * config.tcp_lane_budget.max(config.tcp_lanes_per_peer),
        );
        let counters = Arc::<LinkCounters>::default();
        let server = TcpServer::start(listener, memory, config, counters.clone())
            .map_err(io("cannot start the TCP data server".into()))?;
        Ok(Self {
            config: config.clone(),
            host: host.to_string(),
            data_port,
            links: Mutex::new(HashMap::new()),
            hosts: ResolvedHosts::default(),
            counters,
            lanes: LaneBudget::new(config.tcp_lane_budget, config.tcp_lanes_per_peer),
            _server: server,
            _staging: staging,
        })
    }

    /// The data port peers connect to.
    pub fn data_port(&self) -> u16 {
        self.data_port
    }

    /// How requests to `peer` are framed: v2 unless it is older or `MC_TCP_PROTO=1`; writes
    /// in runs when it says it takes them and `MC_TCP_WRITE_RUNS` does not turn them off.
    fn framing(&self, peer: &SegmentDesc) -> Framing {
        let v2 = peer.tcp_proto_version >= 2 && self.config.tcp_proto != Some(1);
        Framing {
            v2,
            write_runs: v2 && peer.tcp_write_runs && self.config.tcp_write_runs,
        }
    }

    /// Where the segment's data port listens.
    fn data_addr(
        &self,
        segment: &SegmentId,
        peer: &SegmentDesc,
    ) -> Result<SocketAddr, TransportError> {
        // Newer upstreams say where their data port listens; a wildcard says nothing.
        let host: &str = match peer.tcp_data_host.as_deref() {
            Some(h) if !h.is_empty() && h != "0.0.0.0" && h != "::" => h.trim_matches(['[', ']']),
            _ => &segment.rpc().host,
        };
        // IP literals (vLLM and SGLang name hosts by IP): no resolver call, nor allocation.
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(SocketAddr::new(ip, peer.tcp_data_port));
        }
        let port = peer.tcp_data_port;
        let resolve = || {
            net::resolve(host, port, self.config.use_ipv6)?
                .first()
                .map(SocketAddr::ip)
                .ok_or_else(|| std::io::Error::other("no address"))
        };
        match self.hosts.ip_of(host, Instant::now(), resolve) {
            Ok(ip) => Ok(SocketAddr::new(ip, port)),
            Err(e) => {
                let data = HostPort {
                    host: host.to_string(),
                    port,
                };
                Err(TransportError::Unusable {
                    segment: segment.to_string(),
                    protocol: PROTOCOL,
                    cause: UnusableCause::DataAddress {
                        data: data.session_id(),
                        source: e,
                    },
                })
            }
        }
    }

    fn link(&self, addr: SocketAddr, framing: Framing) -> Result<Arc<PeerLink>, TransportError> {
        let mut links = self.links.lock();
        if let Some(l) = links.get(&(addr, framing)) {
            return Ok(l.clone());
        }
        let link = Arc::new(
            PeerLink::new(
                addr,
                framing,
                &self.config,
                self.counters.clone(),
                &self.lanes,
            )
            .map_err(|source| TransportError::Io {
                what: format!("cannot start connection threads to {addr}"),
                source,
            })?,
        );
        links.insert((addr, framing), link.clone());
        Ok(link)
    }
}

impl Transport for TcpTransport {
    fn counters(&self) -> crate::metrics::TransportCounters {
        self.counters.snapshot()
    }

    fn protocol(&self) -> &'static str {
        PROTOCOL
    }

    fn describe(&self, desc: &mut SegmentDesc) {
        desc.protocol.push(PROTOCOL.into());
        desc.tcp_data_port = self.data_port;
        desc.tcp_data_host = Some(self.host.clone());
        desc.tcp_proto_version = 2;
        desc.tcp_write_runs = true;
    }

    fn reaches(&self, peer: &SegmentDesc) -> bool {
        peer.speaks_tcp()
    }

    fn unreachable(&self, segment: &SegmentId, peer: &SegmentDesc) -> Option<Unreachable> {
        let addr = self.data_addr(segment, peer).ok()?;
        let link = self
            .links
            .lock()
            .get(&(addr, self.framing(peer)))
            .cloned()?;
        link.unreachable()
    }

    fn slice_size(&self) -> u64 {
        self.config.tcp_stripe_size
    }

    /// Device memory is staged through pinned chunks, copied on the device's streams while
    /// the socket moves the chunk before, within a request and (since each send copies the
    /// next request's first chunk ahead, and each receive leaves its last copies landing)
    /// across requests. Requests are cut at [`DEVICE_STRIPE`], one chunk, at least: on the
    /// 16-CPU host, reads into GPU memory moved 1-19% more in stripes of 2 MiB than of
    /// 4 MiB (host reads cut at 4 MiB left the same share of the CPUs idle), GPU-to-GPU
    /// writes 2-4% more; stripes of 1 MiB moved those writes 7-10% less
    /// (docs/benchmarks.md, session 13). Before copies went ahead across requests, 1 MiB
    /// stripes lost 20%.
    fn slice_size_for(&self, device: bool) -> u64 {
        if device {
            self.config.tcp_stripe_size.max(DEVICE_STRIPE)
        } else {
            self.config.tcp_stripe_size
        }
    }

    fn post(
        &self,
        segment: &SegmentId,
        peer: &SegmentDesc,
        slices: Vec<Slice>,
    ) -> Result<(), TransportError> {
        let addr = self.data_addr(segment, peer)?;
        let link = self.link(addr, self.framing(peer))?;
        // A batch its caller waits for at once may run on the caller's thread.
        let waited = slices.first().is_some_and(|s| s.batch.caller_waits());
        if waited && slices.len() == 1 {
            slices.into_iter().for_each(|s| link.send_lone(s));
            return Ok(());
        }
        let slices = if waited {
            link.send_here(slices)
        } else {
            slices
        };
        slices.into_iter().for_each(|s| link.send(s));
        Ok(())
    }

    fn rest_idle(&self) {
        for link in self.links.lock().values() {
            link.rest_if_idle(budget::REST_AFTER);
        }
    }

    fn evict_idle(&self) {
        let idle = self.config.tcp_link_idle_timeout;
        let evicted: Vec<Arc<PeerLink>> = {
            let mut links = self.links.lock();
            let gone: Vec<_> = links
                .iter()
                .filter(|(_, l)| l.evictable(idle))
                .map(|(k, _)| *k)
                .collect();
            gone.iter().filter_map(|k| links.remove(k)).collect()
        };
        // Staging memory nobody used for as long goes too.
        crate::device::spare_stagers::trim(idle);
        crate::device::staging_pool::trim(idle);
        // Joined outside the lock: a lane may take a moment to notice.
        for link in evicted {
            tracing::debug!(
                "closing the idle connections to {} (no work for {idle:?}, MC_TCP_LINK_IDLE_SEC, or the peer is gone)",
                link.peer()
            );
            drop(link);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stripes(stripe: Option<u64>) -> [u64; 2] {
        let mut config = Config::default();
        if let Some(s) = stripe {
            config.tcp_stripe_size = s;
        }
        let memory = Arc::new(MemoryRegistry::new());
        let t = TcpTransport::start(IpAddr::from([127, 0, 0, 1]), "127.0.0.1", memory, &config)
            .expect("a TCP transport on loopback");
        [t.slice_size_for(false), t.slice_size_for(true)]
    }

    #[test]
    fn device_memory_is_cut_in_stripes_of_one_staging_chunk_at_least() {
        assert_eq!(DEVICE_STRIPE, 2 << 20);
        assert_eq!(stripes(None), [1 << 20, DEVICE_STRIPE]);
        assert_eq!(stripes(Some(64 << 10)), [64 << 10, DEVICE_STRIPE]);
        assert_eq!(stripes(Some(16 << 20)), [16 << 20, 16 << 20]);
    }
}
