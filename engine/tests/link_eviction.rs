//! Connections and lane threads to peers that went away do not pile up: a peer that
//! restarts (here: six times, each a new engine on new ports) leaves idle links behind,
//! and those are closed after `MC_TCP_LINK_IDLE_SEC`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

use std::time::{Duration, Instant};

use transfer_engine::{Config, HostBuffer, OpCode, Request, TransferEngine};

/// Threads of this process whose name starts with `prefix`.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

fn write_and_check(initiator: &TransferEngine, seed: u8) {
    let peer = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", Config::default()).unwrap();
    let remote = HostBuffer::new(4096);
    peer.register_memory(remote.addr(), 4096, "cpu:0").unwrap();
    let local = HostBuffer::new(4096);
    local.fill(seed);
    let req = Request::new(OpCode::Write, local.addr(), remote.addr(), 4096);
    // SAFETY: both buffers outlive the call.
    unsafe { initiator.transfer_sync(peer.session_id(), &[req]) }.unwrap();
    assert!(remote.to_vec().iter().all(|&b| b == seed));
}

#[test]
fn links_to_restarted_peers_are_closed_once_idle() {
    let initiator = TransferEngine::new(
        "127.0.0.1",
        "P2PHANDSHAKE",
        Config {
            tcp_link_idle_timeout: Duration::from_secs(1),
            ..Config::default()
        },
    )
    .unwrap();
    let lanes = initiator.config().tcp_lanes_per_peer;
    for round in 0..6 {
        write_and_check(&initiator, round + 1);
    }
    let peak = threads_named("te-lane-");
    assert!(peak >= lanes, "lanes of the last peer: {peak}");
    // Idle links go within the idle time plus one housekeeping period.
    let t0 = Instant::now();
    while threads_named("te-lane-") + threads_named("te-recv-") > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{} lane and {} receiver threads left to gone peers",
            threads_named("te-lane-"),
            threads_named("te-recv-")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // A peer that comes back later is reached on fresh connections.
    write_and_check(&initiator, 0xEE);
}
