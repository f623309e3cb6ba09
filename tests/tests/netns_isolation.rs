//! Per-peer isolation across hosts (`e2e::netns`): one initiator reads from three targets
//! at once, each behind a link shaped to the same rate. With one target's link slowed to
//! 1% of that rate and another's cut, the batches to the healthy one keep their throughput:
//! the test prints the ratio against the same batches with every link healthy
//! (docs/benchmarks.md records it) and asserts a generous floor. Needs root (CI runs as
//! root); without namespaces it fails, saying why.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

use std::time::Duration;

use e2e::netns::{HostSpec, Net, Peer};
use serde_json::Value;

const CHILD: &str = env!("CARGO_BIN_EXE_e2e-test-child");
const MIB: u64 = 1 << 20;
/// Each target's buffer, and one read.
const PIECE: u64 = 4 * MIB;
/// Reads per batch run to each target.
const COUNT: u64 = 8;
/// Every target's link, in kbit/s; the slow one gets 1% of it.
const RATE_KBIT: u64 = 400_000;

/// Reads `COUNT` x `PIECE` from each target at once (target `k` into A's slot `k`) and
/// returns the replies in target order.
fn round(a: &mut Peer, targets: &[Peer]) -> Vec<Value> {
    let tags: Vec<String> = targets
        .iter()
        .enumerate()
        .map(|(k, t)| {
            a.send(&format!(
                "read {} {} 0 {} {PIECE} {} {COUNT}",
                t.session,
                t.buffer,
                k as u64 * PIECE,
                k + 2
            ))
        })
        .collect();
    let mut replies = vec![Value::Null; targets.len()];
    for _ in 0..targets.len() {
        let r = a.wait_any(Duration::from_secs(40));
        let k = tags
            .iter()
            .position(|t| r["tag"] == *t)
            .expect("a known tag");
        replies[k] = r;
    }
    replies
}

fn mib_per_s(r: &Value) -> f64 {
    assert!(
        r["ok"] == true && r["verified"] == true,
        "healthy target: {r}"
    );
    (COUNT * PIECE) as f64 / MIB as f64 / (r["ms"].as_f64().unwrap() / 1e3)
}

#[test]
fn a_slow_and_a_dead_peer_leave_the_healthy_peers_throughput_alone() {
    let one = || HostSpec { subnets: vec![0] };
    let net = Net::new(&[one(), one(), one(), one()]).unwrap_or_else(|e| panic!("{e}"));
    let envs = [("MC_TRANSFER_TIMEOUT", "5"), ("MC_FORCE_TCP", "1")];
    let spawn = |i: usize, size: u64, seed: u64| {
        let h = net.host(i);
        Peer::spawn(CHILD, h, &h.addr().to_string(), size, seed, &envs)
    };
    let mut a = spawn(0, 3 * PIECE, 1);
    let targets: Vec<Peer> = (1..4).map(|i| spawn(i, PIECE, i as u64 + 1)).collect();
    for i in 1..4 {
        net.shape(i, RATE_KBIT).unwrap();
    }
    // The first round opens every link; the second is the healthy figure.
    round(&mut a, &targets);
    let healthy = round(&mut a, &targets);
    let base = mib_per_s(&healthy[0]);
    for r in &healthy[1..] {
        mib_per_s(r);
    }
    net.shape(2, RATE_KBIT / 100).unwrap();
    net.cut(3).unwrap();
    let degraded = round(&mut a, &targets);
    let kept = mib_per_s(&degraded[0]);
    assert!(
        degraded[1]["ok"] == false,
        "the slow target's reads outlast the deadline: {}",
        degraded[1]
    );
    assert!(
        degraded[2]["ok"] == false,
        "the cut target's reads fail: {}",
        degraded[2]
    );
    let ratio = kept / base;
    println!(
        "netns isolation: healthy target {kept:.1} MiB/s with a 1% peer and a cut peer, \
         {base:.1} MiB/s with all links healthy: {:.0}%; slow peer {}, cut peer {}",
        ratio * 100.0,
        degraded[1]["error"],
        degraded[2]["error"]
    );
    assert!(
        ratio >= 0.5,
        "the healthy target kept {:.0}% of its throughput",
        ratio * 100.0
    );
}
