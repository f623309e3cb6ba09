//! Our engines on different hosts (network namespaces of `e2e::netns`, joined by a bridge)
//! over TCP: bytes moved and verified both ways, and a 256 MiB read whose target's link is
//! cut after its first MiB: the call fails, naming the peer, within the transfer deadline
//! (`MC_TRANSFER_TIMEOUT` plus 1 ns per byte, docs/benchmarks.md records the time), the
//! caller's buffer is not written after it returns, and once the link is back the next
//! transfer between the same two engines succeeds. Needs root (CI runs as root); without
//! namespaces these tests fail, saying why.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

use std::time::{Duration, Instant};

use e2e::netns::{wait_rx, HostSpec, Net, Peer};

const CHILD: &str = env!("CARGO_BIN_EXE_e2e-test-child");
const MIB: u64 = 1 << 20;
/// `MC_TRANSFER_TIMEOUT` for these engines: the engine's least.
const TIMEOUT_S: u64 = 5;

fn two_hosts() -> Net {
    Net::new(&[HostSpec { subnets: vec![0] }, HostSpec { subnets: vec![0] }])
        .unwrap_or_else(|e| panic!("{e}"))
}

fn envs() -> Vec<(&'static str, &'static str)> {
    vec![("MC_TRANSFER_TIMEOUT", "5"), ("MC_FORCE_TCP", "1")]
}

fn peer(net: &Net, i: usize, size: u64, seed: u64) -> Peer {
    let h = net.host(i);
    Peer::spawn(CHILD, h, &h.addr().to_string(), size, seed, &envs())
}

/// [`peer`] with only the first `fill` bytes of its buffer holding its pattern (filling
/// 256 MiB costs seconds in a debug build; only what a test checks needs it).
fn peer_filled(net: &Net, i: usize, size: u64, seed: u64, fill: u64) -> Peer {
    let h = net.host(i);
    let fill = fill.to_string();
    let mut envs = envs();
    envs.push(("NETNS_FILL", &fill));
    Peer::spawn(CHILD, h, &h.addr().to_string(), size, seed, &envs)
}

#[test]
fn tcp_between_two_hosts_moves_verified_bytes() {
    let net = two_hosts();
    let size = 8 * MIB + 12_345;
    let mut a = peer(&net, 0, size, 1);
    let mut b = peer(&net, 1, size, 2);
    assert!(
        b.session.starts_with("10.200.0.2:"),
        "B publishes its host's address: {}",
        b.session
    );
    let long = Duration::from_secs(30);
    let r = a.call(
        &format!("read {} {} 0 0 {size} 2", b.session, b.buffer),
        long,
    );
    assert!(r["ok"] == true && r["verified"] == true, "A reads B: {r}");
    // A's buffer now holds B's pattern: a part of it written back at an odd offset, and read
    // by B from A, is B's pattern where it lands.
    let r = a.call(
        &format!("write {} {} 4099 {}", b.session, b.buffer, 3 * MIB),
        long,
    );
    assert!(r["ok"] == true, "A writes B: {r}");
    let r = b.call(&format!("check 4099 {} 2", 3 * MIB), long);
    assert!(r["ok"] == true, "B holds what A wrote: {r}");
    let r = b.call(
        &format!("read {} {} 7 7 {} 2", a.session, a.buffer, MIB),
        long,
    );
    assert!(r["ok"] == true && r["verified"] == true, "B reads A: {r}");
}

#[test]
fn a_cut_link_fails_a_256_mib_read_in_bound_and_the_next_transfer_recovers() {
    let net = two_hosts();
    let size = 256 * MIB;
    let mut a = peer_filled(&net, 0, size, 1, 0);
    let b = peer_filled(&net, 1, size, 2, 5 * MIB);
    let long = Duration::from_secs(30);
    // A first transfer opens the link, so what is cut is a link in use.
    let r = a.call(
        &format!("read {} {} 0 0 {MIB} 2", b.session, b.buffer),
        long,
    );
    assert!(
        r["ok"] == true && r["verified"] == true,
        "warm-up read: {r}"
    );
    // Shaped to 800 Mbit/s, the read takes seconds: the cut lands after its first MiB and
    // long before its end, whatever the machine's speed.
    net.shape(1, 800_000).unwrap();
    let rx0 = e2e::netns::rx_bytes(a.pid(), "eth0").expect("A's eth0 counters");
    let tag = a.send(&format!("read {} {} 0 0 {size} 2", b.session, b.buffer));
    let started = Instant::now();
    let rx = wait_rx(a.pid(), "eth0", rx0, MIB, Duration::from_secs(10))
        .expect("the first MiB of the read arrived");
    net.cut(1).unwrap();
    let cut_at = started.elapsed();
    let r = a.wait(&tag, Duration::from_secs(TIMEOUT_S + 25));
    let took = started.elapsed();
    assert!(r["ok"] == false, "the read through a cut link failed: {r}");
    let err = r["error"].as_str().unwrap_or_default();
    assert!(
        err.contains(&b.session),
        "the error names the peer {}: {err}",
        b.session
    );
    // The deadline is the batch's (TIMEOUT_S + 1 ns/byte); a second of slack for a busy
    // machine.
    let bound =
        Duration::from_secs(TIMEOUT_S) + Duration::from_nanos(size) + Duration::from_secs(1);
    assert!(
        took <= bound,
        "failed after {took:?}, over {bound:?}: {err}"
    );
    println!(
        "netns: cut after {} KiB ({cut_at:?} in); the read failed {took:?} after submit \
         (bound {bound:?}): {err}",
        (rx - rx0) >> 10
    );
    assert!(a.call("snapshot", long)["ok"] == true);
    net.unshape(1).unwrap();
    net.restore(1).unwrap();
    // What was in flight when the link was cut arrives now, if anything still sends it: the
    // caller's buffer must not change.
    std::thread::sleep(Duration::from_secs(2));
    let r = a.call("unchanged", long);
    assert!(
        r["ok"] == true,
        "A's buffer was written after the failed read returned"
    );
    let started = Instant::now();
    let r = a.call(
        &format!("read {} {} {MIB} {MIB} {} 2", b.session, b.buffer, 4 * MIB),
        long,
    );
    assert!(
        r["ok"] == true && r["verified"] == true,
        "the read after the link came back: {r}\nA:\n{}",
        a.stderr_tail(20)
    );
    println!(
        "netns: first read after the restore took {:?}",
        started.elapsed()
    );
    let r = a.call(
        &format!("write {} {} 0 {}", b.session, b.buffer, 2 * MIB),
        long,
    );
    assert!(r["ok"] == true, "a write after the link came back: {r}");
}

/// The harness removes every namespace it made when dropped, and those of a process that
/// is gone when the next one is made.
#[test]
fn the_harness_leaves_no_namespace_behind() {
    let ours = |prefix: &str| -> Vec<String> {
        std::fs::read_dir("/run/netns")
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(prefix))
                    .collect()
            })
            .unwrap_or_default()
    };
    // A pid above the kernel's largest (4194304) is never alive.
    let stale = format!("{}4194999-0-br", e2e::netns::PREFIX);
    let made = std::process::Command::new("ip")
        .args(["netns", "add", &stale])
        .status()
        .unwrap();
    assert!(
        made.success(),
        "cannot make a namespace: these tests need root"
    );
    let net = two_hosts();
    assert!(
        ours(&stale).is_empty(),
        "a dead process's namespace is removed"
    );
    let mine = format!("{}{}-", e2e::netns::PREFIX, std::process::id());
    let names: Vec<String> = [net.host(0).ns.clone(), net.host(1).ns.clone()].into();
    for n in &names {
        assert!(ours(n).len() == 1, "{n} exists while the net lives");
    }
    drop(net);
    for n in &names {
        assert!(
            ours(n).is_empty(),
            "{n} is gone after the drop ({:?})",
            ours(&mine)
        );
    }
}
