//! Transfer metrics after real transfers between two engines on loopback: counters per
//! transport and per peer, a rejected request counted by kind, latency histograms, and
//! the Prometheus endpoint scraped over HTTP.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use transfer_engine::{Config, HostBuffer, OpCode, Request, TransferEngine};

const LEN: u64 = 4096;

fn scrape(addr: SocketAddr, request: &str) -> (String, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    (head.to_string(), body.to_string())
}

/// Sample lines of a text exposition: `name{labels}` -> value.
fn parse(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse::<f64>().unwrap())
        })
        .collect()
}

/// A P2P engine on loopback; `metrics_port`: its endpoint (0: a free port).
fn engine(metrics_port: Option<u16>) -> TransferEngine {
    let config = Config {
        metrics_port,
        ..Config::default()
    };
    TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", config).unwrap()
}

/// The TCP transport's metrics of `e`.
fn tcp_metrics(e: &TransferEngine) -> transfer_engine::metrics::TransportSnapshot {
    e.metrics()
        .transports
        .into_iter()
        .find(|t| t.protocol == "tcp")
        .unwrap()
}

/// A buffer of `len` bytes registered with `e`, and `e`'s segment name.
fn registered(e: &TransferEngine, len: u64) -> (HostBuffer, String) {
    let buf = HostBuffer::new(len as usize);
    e.register_memory(buf.addr(), len, "cpu:0").unwrap();
    (buf, e.session_id().to_string())
}

#[test]
fn transfers_are_counted_and_served_in_prometheus_text() {
    let initiator = engine(Some(0));
    let peer = engine(None);
    let (remote, seg) = registered(&peer, LEN);
    let local = HostBuffer::new(LEN as usize);
    local.fill(7);
    let write = Request::new(OpCode::Write, local.addr(), remote.addr(), LEN);
    let read = Request::new(OpCode::Read, local.addr(), remote.addr(), LEN / 2);
    // SAFETY: both buffers outlive the calls.
    unsafe { initiator.transfer_sync(&seg, &[write, read]) }.unwrap();
    // Outside every buffer the peer registered.
    let bad = Request::new(OpCode::Write, local.addr(), remote.addr() + (1 << 40), 16);
    // SAFETY: as above.
    assert!(unsafe { initiator.transfer_sync(&seg, &[bad]) }.is_err());

    let m = initiator.metrics();
    let tcp = m.transports.iter().find(|t| t.protocol == "tcp").unwrap();
    assert_eq!(tcp.counters.bytes_written, LEN);
    assert_eq!(tcp.counters.bytes_read, LEN / 2);
    assert_eq!(tcp.counters.requests, 3);
    assert_eq!(tcp.counters.failures_of("address_rejected"), 1);
    assert_eq!(tcp.counters.failures.iter().sum::<u64>(), 1);
    assert_eq!(tcp.request_latency.count, 3);
    assert_eq!(tcp.batch_latency.count, 2);
    assert!(tcp.request_latency.sum_seconds > 0.0);
    assert!(tcp.connections.connects >= 1, "{:?}", tcp.connections);
    assert_eq!(m.peers.len(), 1, "{:?}", m.peers);
    let (name, p) = &m.peers[0];
    assert_eq!(name, &seg);
    assert_eq!(
        (p.bytes_written, p.bytes_read, p.requests),
        (LEN, LEN / 2, 3)
    );
    assert_eq!(p.failures_of("address_rejected"), 1);
    // The target counts nothing: it initiated nothing.
    assert!(peer.metrics().peers.is_empty());

    let addr = initiator.metrics_addr().unwrap();
    let (head, body) = scrape(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let first = parse(&body);
    for name in [
        "mooncake_te_bytes_read_total{transport=\"tcp\"}",
        "mooncake_te_bytes_written_total{transport=\"tcp\"}",
        "mooncake_te_requests_total{transport=\"tcp\"}",
        "mooncake_te_failures_total{transport=\"tcp\",kind=\"address_rejected\"}",
        "mooncake_te_connects_total{transport=\"tcp\"}",
        "mooncake_te_reconnects_total{transport=\"tcp\"}",
        "mooncake_te_retries_total{transport=\"tcp\"}",
        "mooncake_te_request_latency_seconds_count{transport=\"tcp\"}",
        "mooncake_te_batch_latency_seconds_sum{transport=\"tcp\"}",
        "mooncake_te_request_latency_seconds_bucket{le=\"+Inf\",transport=\"tcp\"}",
    ] {
        assert!(first.contains_key(name), "{name} missing from:\n{body}");
    }
    let peer_written = format!("mooncake_te_peer_bytes_written_total{{peer=\"{seg}\"}}");
    assert_eq!(first[&peer_written], LEN as f64, "{body}");
    assert_eq!(
        first["mooncake_te_failures_total{transport=\"tcp\",kind=\"address_rejected\"}"],
        1.0
    );
    assert!(body.contains("# TYPE mooncake_te_request_latency_seconds histogram"));

    // SAFETY: as above.
    unsafe { initiator.transfer_sync(&seg, &[write]) }.unwrap();
    let (_, body) = scrape(addr, "GET /metrics HTTP/1.0\r\n\r\n");
    let second = parse(&body);
    assert_eq!(second[&peer_written], 2.0 * LEN as f64);
    assert_eq!(second["mooncake_te_requests_total{transport=\"tcp\"}"], 4.0);
    assert_eq!(
        second["mooncake_te_request_latency_seconds_count{transport=\"tcp\"}"],
        4.0
    );

    let (head, _) = scrape(addr, "GET /other HTTP/1.1\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    let (head, _) = scrape(addr, "POST /metrics HTTP/1.1\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 405"), "{head}");
    // A scraper that sends an endless head is answered and dropped, and the endpoint
    // still serves the next one.
    {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // The server may answer 431 and close before all of it is sent.
        let _ =
            s.write_all(format!("GET /metrics HTTP/1.1\r\nX: {}", "a".repeat(20_000)).as_bytes());
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let out = String::from_utf8_lossy(&out);
        assert!(out.is_empty() || out.starts_with("HTTP/1.1 431"), "{out}");
    }
    let (head, _) = scrape(addr, "GET /metrics HTTP/1.1\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

#[test]
fn no_endpoint_without_a_metrics_port() {
    let e = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", Config::default()).unwrap();
    assert!(e.metrics_addr().is_none());
    assert!(e.metrics_text().contains("mooncake_te_requests_total"));
}

/// A lone small request, which runs on the caller's thread over the link's direct
/// connection: the one the peer closed is seen before use and replaced.
#[test]
fn a_direct_connection_the_peer_closed_is_counted_as_a_reconnect() {
    connection_closed_by_the_peer_then(1);
}

/// Two requests in a batch, which go to the lanes.
#[test]
fn a_lane_connection_the_peer_closed_is_counted_as_a_reconnect() {
    connection_closed_by_the_peer_then(2);
}

/// An initiator with `lanes` lanes per peer, and a peer that closes data connections idle
/// for 1 s.
fn with_a_peer_closing_idle_connections(lanes: usize) -> (TransferEngine, TransferEngine) {
    let initiator = TransferEngine::new(
        "127.0.0.1",
        "P2PHANDSHAKE",
        Config {
            tcp_lanes_per_peer: lanes,
            ..Config::default()
        },
    )
    .unwrap();
    let peer = TransferEngine::new(
        "127.0.0.1",
        "P2PHANDSHAKE",
        Config {
            tcp_server_idle_timeout: Duration::from_secs(1),
            ..Config::default()
        },
    )
    .unwrap();
    (initiator, peer)
}

/// `n` writes of `LEN` bytes, block `i` of `local` to block `i` of `remote`.
fn writes_of(n: u64, local: &HostBuffer, remote: &HostBuffer) -> Vec<Request> {
    (0..n)
        .map(|i| {
            Request::new(
                OpCode::Write,
                local.addr() + i * LEN,
                remote.addr() + i * LEN,
                LEN,
            )
        })
        .collect()
}

fn connection_closed_by_the_peer_then(requests: usize) {
    // One lane: with several, the lane that spins after a lone request may take every
    // later one, and a lane whose connection went stale never gets work to notice it.
    let (initiator, peer) = with_a_peer_closing_idle_connections(1);
    let len = LEN * requests as u64;
    let remote = HostBuffer::new(len as usize);
    peer.register_memory(remote.addr(), len, "cpu:0").unwrap();
    let local = HostBuffer::new(len as usize);
    local.write_at(0, &vec![7u8; len as usize]).unwrap();
    let writes = writes_of(requests as u64, &local, &remote);
    let tcp = |e: &TransferEngine| tcp_metrics(e).connections;
    // SAFETY: both buffers outlive the calls.
    unsafe { initiator.transfer_sync(peer.session_id(), &writes) }.unwrap();
    let before = tcp(&initiator);
    assert_eq!(before.reconnects, 0, "{before:?}");
    std::thread::sleep(Duration::from_millis(2500));
    remote.write_at(0, &vec![0u8; len as usize]).unwrap();
    // SAFETY: as above.
    unsafe { initiator.transfer_sync(peer.session_id(), &writes) }.unwrap();
    let after = tcp(&initiator);
    assert_eq!(remote.to_vec(), local.to_vec());
    assert_eq!(before.connects, 1, "{before:?}");
    assert_eq!(after.reconnects, 1, "{after:?}");
    assert_eq!(after.connects, 2, "{after:?}");
}

/// The target side: bytes peers wrote into and read from our registered memory over TCP,
/// scraped from the target's endpoint while an initiator transfers, and equal to the
/// bytes moved once it is done (a rejected request serves nothing).
#[test]
fn bytes_served_to_peers_are_scraped_while_transfers_run() {
    const ROUNDS: u64 = 200;
    const W: u64 = 64 << 10;
    const R: u64 = 24 << 10;
    let target = engine(Some(0));
    let initiator = engine(None);
    let (remote, seg) = registered(&target, W);
    let local = HostBuffer::new(W as usize);
    let (write, read) = (
        Request::new(OpCode::Write, local.addr(), remote.addr(), W),
        Request::new(OpCode::Read, local.addr(), remote.addr(), R),
    );
    let addr = target.metrics_addr().unwrap();
    let served = |body: &str| {
        let m = parse(body);
        let get = |name: &str| m.get(&format!("{name}{{transport=\"tcp\"}}")).copied();
        (
            get("mooncake_te_served_bytes_written_total").unwrap() as u64,
            get("mooncake_te_served_bytes_read_total").unwrap() as u64,
        )
    };
    let mut seen = Vec::new();
    std::thread::scope(|s| {
        let worker = s.spawn(|| {
            for _ in 0..ROUNDS {
                // SAFETY: both buffers outlive the calls.
                unsafe { initiator.transfer_sync(&seg, &[write, read]) }.unwrap();
            }
            let bad = Request::new(OpCode::Write, local.addr(), remote.addr() + (1 << 40), 16);
            // SAFETY: as above.
            assert!(unsafe { initiator.transfer_sync(&seg, &[bad]) }.is_err());
        });
        while !worker.is_finished() {
            seen.push(served(&scrape(addr, "GET /metrics HTTP/1.1\r\n\r\n").1));
        }
        worker.join().unwrap();
    });
    assert!(
        seen.windows(2)
            .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1),
        "served counters went down: {seen:?}"
    );
    assert!(
        seen.iter()
            .all(|&(w, r)| w <= ROUNDS * W && r <= ROUNDS * R),
        "{seen:?}"
    );
    // The last status left the target just before it counted: wait for the count.
    let want = (ROUNDS * W, ROUNDS * R);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut last = served(&scrape(addr, "GET /metrics HTTP/1.1\r\n\r\n").1);
    while last != want && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        last = served(&scrape(addr, "GET /metrics HTTP/1.1\r\n\r\n").1);
    }
    assert_eq!(last, want, "{seen:?}");
    let mid = seen.iter().filter(|&&s| s != (0, 0) && s != want).count();
    assert!(mid >= 1, "no scrape saw a transfer in progress: {seen:?}");
    // The initiator served nothing; the target initiated nothing.
    let i = tcp_metrics(&initiator);
    assert_eq!(
        (
            i.connections.served_bytes_written,
            i.connections.served_bytes_read
        ),
        (0, 0)
    );
    assert_eq!(i.counters.bytes_written, want.0);
    assert_eq!(tcp_metrics(&target).counters.requests, 0);
}

/// Every lane's connection closed by the peer's idle timeout: a batch after that finds them
/// stale before use and reconnects, so no request fails on one and needs its one re-send
/// (which, landing on another stale connection, would fail it as `PeerLost`).
#[test]
fn a_batch_after_the_peer_closed_every_lane_connection_succeeds() {
    let (initiator, peer) = with_a_peer_closing_idle_connections(4);
    const N: u64 = 32;
    let remote = HostBuffer::new((LEN * N) as usize);
    peer.register_memory(remote.addr(), LEN * N, "cpu:0")
        .unwrap();
    let local = HostBuffer::new((LEN * N) as usize);
    for round in 0..3u8 {
        local
            .write_at(0, &vec![round + 1; (LEN * N) as usize])
            .unwrap();
        let writes = writes_of(N, &local, &remote);
        // SAFETY: both buffers outlive the calls.
        unsafe { initiator.transfer_sync(peer.session_id(), &writes) }
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(remote.to_vec(), local.to_vec(), "round {round}");
        std::thread::sleep(Duration::from_millis(1500));
    }
    let c = tcp_metrics(&initiator).connections;
    assert_eq!(c.retries, 0, "{c:?}");
    assert!(c.reconnects >= 2, "{c:?}");
}
