//! Always-on transfer metrics: per transport and per peer (segment name), bytes read and
//! written, requests, failures by kind, and latency histograms per transport.
//!
//! Recording happens once per finished request and once per finished batch, from the
//! thread that finishes it, with relaxed atomic adds on entries the batch already holds
//! (the peer's entry hangs off the engine's cached segment, so a submit adds no lookup).
//! The histograms are `prometheus-client`'s: one uncontended mutex per observation.
//! Peers are capped at [`PEER_CAP`] entries; later names share the [`OTHER_PEERS`] entry,
//! so a stream of distinct segment names cannot grow memory.
//!
//! The Prometheus text exposition is `prometheus-client`'s encoder; [`MetricsServer`]
//! serves it on `MC_METRICS_PORT`, on the bounded server of `http_serve`.

mod exposition;
mod server;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::error::TransferError;
use exposition::Exposition;
pub use server::MetricsServer;

/// Most peers tracked by name; the rest are summed under [`OTHER_PEERS`].
pub const PEER_CAP: usize = 1024;
/// The entry of peers beyond [`PEER_CAP`].
pub const OTHER_PEERS: &str = "other";
/// Metric name prefix.
pub const PREFIX: &str = "mooncake_te_";

/// Failure kinds, one per [`TransferError`] variant, in the order of [`failure_kind`].
pub const FAILURE_KINDS: [&str; 7] = [
    "peer_unreachable",
    "peer_lost",
    "address_rejected",
    "protocol",
    "local_not_registered",
    "timeout",
    "canceled",
];

/// The index in [`FAILURE_KINDS`] of `e`'s kind.
pub fn failure_kind(e: &TransferError) -> usize {
    match e {
        TransferError::PeerUnreachable { .. } => 0,
        TransferError::PeerLost { .. } => 1,
        TransferError::AddressRejected { .. } => 2,
        TransferError::Protocol { .. } => 3,
        TransferError::LocalNotRegistered { .. } => 4,
        TransferError::Timeout(_) => 5,
        TransferError::Canceled(_) => 6,
    }
}

/// What a transport counts about its own connections, and the bytes it served to peers
/// (zeros where it counts nothing; the README's metric table says which transport counts
/// what).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransportCounters {
    /// Connections opened to peers (RDMA: endpoints set up; IPC: peer handles opened).
    pub connects: u64,
    /// Connections opened again after one to the same peer broke (RDMA: an endpoint
    /// rebuilt after its queue pairs failed).
    pub reconnects: u64,
    /// Slices sent again after their connection broke (RDMA: over another HCA pair).
    pub retries: u64,
    /// Bytes peers read from our registered memory, served by our threads (TCP only).
    pub served_bytes_read: u64,
    /// Bytes peers wrote into our registered memory, served by our threads (TCP only).
    pub served_bytes_written: u64,
}

/// The atomics a transport counts [`TransportCounters`] into (relaxed: only read for
/// metrics).
#[derive(Debug, Default)]
pub struct ConnectionCounters {
    /// See [`TransportCounters::connects`].
    pub connects: AtomicU64,
    /// See [`TransportCounters::reconnects`].
    pub reconnects: AtomicU64,
    /// See [`TransportCounters::retries`].
    pub retries: AtomicU64,
    /// See [`TransportCounters::served_bytes_read`].
    pub served_bytes_read: AtomicU64,
    /// See [`TransportCounters::served_bytes_written`].
    pub served_bytes_written: AtomicU64,
}

impl ConnectionCounters {
    /// Adds `n` to `counter` (one of this struct's fields).
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> TransportCounters {
        TransportCounters {
            connects: self.connects.load(Ordering::Relaxed),
            reconnects: self.reconnects.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            served_bytes_read: self.served_bytes_read.load(Ordering::Relaxed),
            served_bytes_written: self.served_bytes_written.load(Ordering::Relaxed),
        }
    }
}

/// Request counters of one transport or one peer.
#[derive(Debug, Default)]
pub struct Counters {
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    requests: AtomicU64,
    failures: [AtomicU64; FAILURE_KINDS.len()],
}

/// A copy of [`Counters`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CounterSnapshot {
    /// Bytes of completed reads.
    pub bytes_read: u64,
    /// Bytes of completed writes.
    pub bytes_written: u64,
    /// Requests finished (completed or failed).
    pub requests: u64,
    /// Failed requests by kind, in [`FAILURE_KINDS`] order.
    pub failures: [u64; FAILURE_KINDS.len()],
}

impl CounterSnapshot {
    /// `(kind, count)` pairs.
    pub fn failures_by_kind(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        FAILURE_KINDS
            .iter()
            .copied()
            .zip(self.failures.iter().copied())
    }

    /// Failed requests of kind `kind` (a [`FAILURE_KINDS`] name; 0 for an unknown one).
    pub fn failures_of(&self, kind: &str) -> u64 {
        self.failures_by_kind()
            .find(|(k, _)| *k == kind)
            .map_or(0, |(_, n)| n)
    }
}

impl Counters {
    fn record(&self, read: bool, len: u64, result: Option<&TransferError>) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        match result {
            Some(e) => {
                self.failures[failure_kind(e)].fetch_add(1, Ordering::Relaxed);
            }
            None if read => {
                self.bytes_read.fetch_add(len, Ordering::Relaxed);
            }
            None => {
                self.bytes_written.fetch_add(len, Ordering::Relaxed);
            }
        }
    }

    /// The counters now.
    pub fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            failures: std::array::from_fn(|i| self.failures[i].load(Ordering::Relaxed)),
        }
    }
}

/// A latency histogram in seconds, with its count and sum kept beside it for snapshots.
#[derive(Debug)]
pub struct Latency {
    histogram: Histogram,
    count: AtomicU64,
    sum_ns: AtomicU64,
}

/// Count and sum of a [`Latency`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencySnapshot {
    /// Observations.
    pub count: u64,
    /// Their sum, in seconds.
    pub sum_seconds: f64,
}

impl Latency {
    fn new() -> Self {
        // 1 µs to ~33 s, doubling.
        Self {
            histogram: Histogram::new(exponential_buckets(1e-6, 2.0, 26)),
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }

    fn observe(&self, d: Duration) {
        self.histogram.observe(d.as_secs_f64());
        self.count.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Count and sum now.
    pub fn snapshot(&self) -> LatencySnapshot {
        LatencySnapshot {
            count: self.count.load(Ordering::Relaxed),
            sum_seconds: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// Metrics of one transport.
#[derive(Debug)]
pub struct TransportMetrics {
    protocol: &'static str,
    counters: Counters,
    request_latency: Latency,
    batch_latency: Latency,
}

impl TransportMetrics {
    fn new(protocol: &'static str) -> Self {
        Self {
            protocol,
            counters: Counters::default(),
            request_latency: Latency::new(),
            batch_latency: Latency::new(),
        }
    }
}

/// One request of a batch as the recorder sees it.
#[derive(Debug, Clone, Copy)]
pub struct RequestInfo {
    /// Index into the recorder's transports.
    pub transport: u8,
    /// A read (else a write).
    pub read: bool,
    /// Its length.
    pub len: u64,
}

/// Most transports one batch records into (an engine runs at most three: IPC, RDMA,
/// TCP); requests over a transport beyond these count for the peer only.
pub const MAX_BATCH_TRANSPORTS: usize = 4;

/// What a batch records into when its requests finish. Building one allocates nothing
/// for a single-request batch (the latency benchmark's case), one slice otherwise.
#[derive(Debug)]
pub struct Recorder {
    peer: Arc<Counters>,
    /// The engine's count of batches whose last request is being counted after its
    /// waiter was woken.
    trailing: Arc<AtomicUsize>,
    transports: [Option<Arc<TransportMetrics>>; MAX_BATCH_TRANSPORTS],
    requests: Requests,
}

#[derive(Debug)]
enum Requests {
    One(RequestInfo),
    Many(Box<[RequestInfo]>),
}

impl Requests {
    fn collect(requests: impl IntoIterator<Item = RequestInfo>) -> Self {
        let mut it = requests.into_iter();
        match (it.next(), it.next()) {
            (Some(a), None) => Self::One(a),
            (None, _) => Self::Many(Box::default()),
            (Some(a), Some(b)) => Self::Many([a, b].into_iter().chain(it).collect()),
        }
    }

    fn get(&self, i: usize) -> Option<&RequestInfo> {
        match self {
            Self::One(r) => (i == 0).then_some(r),
            Self::Many(rs) => rs.get(i),
        }
    }
}

impl Recorder {
    /// Request `i` finished after `elapsed` with `result` (`Some`: its error).
    pub fn request_done(&self, i: usize, result: Option<&TransferError>, elapsed: Duration) {
        let Some(r) = self.requests.get(i) else {
            return;
        };
        self.peer.record(r.read, r.len, result);
        let transport = self.transports.get(usize::from(r.transport));
        if let Some(t) = transport.and_then(Option::as_ref) {
            t.counters.record(r.read, r.len, result);
            t.request_latency.observe(elapsed);
        }
    }

    /// The whole batch finished after `elapsed` (counted on the peer's own transport).
    pub fn batch_done(&self, elapsed: Duration) {
        if let Some(t) = self.transports.first().and_then(Option::as_ref) {
            t.batch_latency.observe(elapsed);
        }
    }

    /// The batch is about to be seen finished with its last request not counted yet:
    /// snapshots wait until [`end_trailing`](Self::end_trailing).
    pub fn begin_trailing(&self) {
        self.trailing.fetch_add(1, Ordering::AcqRel);
    }

    /// The last request of a batch seen finished is counted.
    pub fn end_trailing(&self) {
        self.trailing.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The engine's metrics.
#[derive(Debug)]
pub struct Metrics {
    transports: Vec<Arc<TransportMetrics>>,
    peers: RwLock<HashMap<String, Arc<Counters>>>,
    other: Arc<Counters>,
    peer_cap: usize,
    /// Batches seen finished whose last request is still being counted (`Recorder`).
    trailing: Arc<AtomicUsize>,
}

/// A copy of the metrics of one transport.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TransportSnapshot {
    /// Its protocol.
    pub protocol: &'static str,
    /// Requests it moved.
    pub counters: CounterSnapshot,
    /// What it counts about its connections.
    pub connections: TransportCounters,
    /// Request completion latency.
    pub request_latency: LatencySnapshot,
    /// Batch completion latency.
    pub batch_latency: LatencySnapshot,
}

/// A copy of the engine's metrics ([`TransferEngine::metrics`](crate::engine::TransferEngine::metrics)).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsSnapshot {
    /// Per transport, in the engine's order of preference.
    pub transports: Vec<TransportSnapshot>,
    /// Per peer segment name, sorted; [`OTHER_PEERS`] last when any peer was beyond the cap.
    pub peers: Vec<(String, CounterSnapshot)>,
    /// The cap on peers tracked by name.
    pub peer_cap: usize,
}

impl Metrics {
    /// Metrics for transports `protocols` (in the engine's order), peers capped at [`PEER_CAP`].
    pub fn new(protocols: &[&'static str]) -> Self {
        Self::with_peer_cap(protocols, PEER_CAP)
    }

    /// [`new`](Self::new) with another peer cap (tests).
    pub fn with_peer_cap(protocols: &[&'static str], peer_cap: usize) -> Self {
        Self {
            transports: protocols
                .iter()
                .map(|p| Arc::new(TransportMetrics::new(p)))
                .collect(),
            peers: RwLock::new(HashMap::new()),
            other: Arc::new(Counters::default()),
            peer_cap,
            trailing: Arc::default(),
        }
    }

    /// The entry of peer `segment` (the shared [`OTHER_PEERS`] entry beyond the cap).
    pub fn peer(&self, segment: &str) -> Arc<Counters> {
        if let Some(c) = self.peers.read().get(segment) {
            return c.clone();
        }
        let mut peers = self.peers.write();
        if let Some(c) = peers.get(segment) {
            return c.clone();
        }
        if peers.len() >= self.peer_cap {
            return self.other.clone();
        }
        let c = Arc::new(Counters::default());
        peers.insert(segment.to_string(), c.clone());
        c
    }

    /// A recorder for a batch to `peer` whose requests travel over `protocols` (by
    /// [`RequestInfo::transport`]); a protocol without metrics records nothing.
    pub fn recorder(
        &self,
        peer: Arc<Counters>,
        protocols: impl Iterator<Item = &'static str>,
        requests: impl IntoIterator<Item = RequestInfo>,
    ) -> Recorder {
        let mut transports: [Option<Arc<TransportMetrics>>; MAX_BATCH_TRANSPORTS] =
            Default::default();
        for (slot, p) in transports.iter_mut().zip(protocols) {
            *slot = self.transports.iter().find(|t| t.protocol == p).cloned();
        }
        Recorder {
            peer,
            trailing: self.trailing.clone(),
            transports,
            requests: Requests::collect(requests),
        }
    }

    /// A copy of the metrics, with the transports' own counters `connections`.
    pub fn snapshot(&self, connections: &[(&'static str, TransportCounters)]) -> MetricsSnapshot {
        self.settle();
        let transports = self
            .transports
            .iter()
            .map(|t| TransportSnapshot {
                protocol: t.protocol,
                counters: t.counters.snapshot(),
                connections: connections
                    .iter()
                    .find(|(p, _)| *p == t.protocol)
                    .map(|(_, c)| *c)
                    .unwrap_or_default(),
                request_latency: t.request_latency.snapshot(),
                batch_latency: t.batch_latency.snapshot(),
            })
            .collect();
        let mut peers: Vec<(String, CounterSnapshot)> = self
            .peers
            .read()
            .iter()
            .map(|(k, v)| (k.clone(), v.snapshot()))
            .collect();
        peers.sort_by(|a, b| a.0.cmp(&b.0));
        let other = self.other.snapshot();
        if other.requests > 0 {
            peers.push((OTHER_PEERS.to_string(), other));
        }
        MetricsSnapshot {
            transports,
            peers,
            peer_cap: self.peer_cap,
        }
    }

    /// Waits until every batch seen finished is counted (a few hundred ns, unless the
    /// counting thread was preempted; 100 ms at the very most), so that a snapshot taken
    /// after a transfer returned includes it.
    fn settle(&self) {
        let start = Instant::now();
        while self.trailing.load(Ordering::Acquire) > 0
            && start.elapsed() < Duration::from_millis(100)
        {
            std::thread::yield_now();
        }
    }

    /// The metrics in the Prometheus text format (names in the README).
    pub fn prometheus_text(&self, connections: &[(&'static str, TransportCounters)]) -> String {
        let exposition = Exposition {
            snapshot: self.snapshot(connections),
            histograms: self
                .transports
                .iter()
                .map(|t| {
                    (
                        t.protocol,
                        t.request_latency.histogram.clone(),
                        t.batch_latency.histogram.clone(),
                    )
                })
                .collect(),
        };
        let mut registry = Registry::default();
        registry.register_collector(Box::new(exposition));
        let mut out = String::new();
        // Writing into a String cannot fail; an encoder error would leave it partial.
        if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
            tracing::warn!("cannot encode the metrics");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test")]

    use super::*;

    #[test]
    fn peers_beyond_the_cap_share_the_other_entry() {
        let m = Metrics::with_peer_cap(&["tcp"], 4);
        for i in 0..100 {
            let peer = m.peer(&format!("host{i}:1"));
            let rec = m.recorder(
                peer,
                ["tcp"].into_iter(),
                [RequestInfo {
                    transport: 0,
                    read: false,
                    len: 10,
                }],
            );
            rec.request_done(0, None, Duration::from_micros(5));
        }
        let s = m.snapshot(&[]);
        assert_eq!(s.peers.len(), 5, "4 named + other");
        assert_eq!(s.peers[4].0, OTHER_PEERS);
        assert_eq!(s.peers[4].1.requests, 96);
        assert_eq!(s.peers[4].1.bytes_written, 960);
        assert_eq!(s.transports[0].counters.requests, 100);
        assert_eq!(s.transports[0].request_latency.count, 100);
        assert_eq!(m.peers.read().len(), 4);
    }

    #[test]
    fn a_recorder_keeps_transport_indices_and_one_request_inline() {
        let m = Metrics::new(&["tcp"]);
        let write = |transport, len| RequestInfo {
            transport,
            read: false,
            len,
        };
        // Transport 0 has no metrics: request 0 counts for the peer only, request 1 on tcp.
        let rec = m.recorder(
            m.peer("p:1"),
            ["unmetered", "tcp"].into_iter(),
            [write(0, 5), write(1, 7)],
        );
        for i in 0..3 {
            rec.request_done(i, None, Duration::ZERO);
        }
        let s = m.snapshot(&[]);
        assert_eq!(s.transports[0].counters.bytes_written, 7);
        assert_eq!(s.peers[0].1.bytes_written, 12);
        let one = m.recorder(m.peer("p:1"), ["tcp"].into_iter(), [write(0, 3)]);
        assert!(matches!(one.requests, Requests::One(_)));
    }

    #[test]
    fn a_snapshot_waits_for_a_batch_counted_after_its_waiter_woke() {
        let m = Arc::new(Metrics::new(&["tcp"]));
        let rec = m.recorder(
            m.peer("p:1"),
            ["tcp"].into_iter(),
            [RequestInfo {
                transport: 0,
                read: false,
                len: 64,
            }],
        );
        rec.begin_trailing();
        let counter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2));
            rec.request_done(0, None, Duration::from_micros(5));
            rec.batch_done(Duration::from_micros(5));
            rec.end_trailing();
        });
        let tcp = &m.snapshot(&[]).transports[0];
        assert_eq!(tcp.counters.bytes_written, 64);
        assert_eq!(tcp.request_latency.count, 1);
        assert_eq!(tcp.batch_latency.count, 1);
        counter.join().ok();
    }

    #[test]
    fn failures_are_counted_by_kind_and_move_no_bytes() {
        let m = Metrics::new(&["tcp"]);
        let rec = m.recorder(
            m.peer("p:1"),
            ["tcp"].into_iter(),
            [RequestInfo {
                transport: 0,
                read: true,
                len: 8,
            }; 2],
        );
        rec.request_done(0, None, Duration::ZERO);
        let e = TransferError::Timeout(Duration::from_secs(1));
        rec.request_done(1, Some(&e), Duration::ZERO);
        rec.batch_done(Duration::from_millis(1));
        let s = m.snapshot(&[(
            "tcp",
            TransportCounters {
                connects: 1,
                reconnects: 2,
                retries: 3,
                served_bytes_read: 4,
                served_bytes_written: 5,
            },
        )]);
        let t = &s.transports[0];
        assert_eq!(t.counters.bytes_read, 8);
        assert_eq!(t.counters.failures_of("timeout"), 1);
        assert_eq!(t.connections.retries, 3);
        assert_eq!(t.batch_latency.count, 1);
        let text = m.prometheus_text(&[("tcp", TransportCounters::default())]);
        assert!(
            text.contains("mooncake_te_failures_total{transport=\"tcp\",kind=\"timeout\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("mooncake_te_peer_bytes_read_total{peer=\"p:1\"} 8"),
            "{text}"
        );
        assert!(
            text.contains("mooncake_te_batch_latency_seconds_count{transport=\"tcp\"} 1"),
            "{text}"
        );
    }
}
