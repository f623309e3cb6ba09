//! The store across hosts (`e2e::netns`): `mooncake_master` on a host of its own, store
//! clients on two others, each lending a segment. Objects put by one client into the
//! other's segment are read back, verified, from both; then the second client's link is
//! cut: a put into its segment fails and leaves nothing readable, and after `--client_ttl`
//! the master drops the segment and its objects (the time is printed), while the first
//! client keeps putting and getting; once the link is back, the second client mounts its
//! segment again. Needs root (CI runs as root); without namespaces it
//! fails, saying why.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use e2e::netns::{HostSpec, Net, Peer};
use e2e::KillOnDrop;

const CHILD: &str = env!("CARGO_BIN_EXE_e2e-test-child");
const MIB: u64 = 1 << 20;
const CLIENT_TTL_S: u64 = 2;

/// `GET http://HOST:9003PATH` from host `from`: the body, or `None` when it does not answer.
fn master_http(net: &Net, from: usize, path: &str) -> Option<String> {
    let url = format!("http://{}:9003{path}", net.host(0).addr());
    let out = net
        .host(from)
        .command("curl")
        .args(["-sS", "-m", "2", &url])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn client(net: &Net, i: usize) -> Peer {
    let (host, master) = (
        net.host(i).addr().to_string(),
        format!("{}:50051", net.host(0).addr()),
    );
    let segment = (16 * MIB).to_string();
    let envs = [
        ("NETNS_HOST", host.as_str()),
        ("NETNS_MASTER", master.as_str()),
        ("NETNS_SEGMENT", segment.as_str()),
        ("MC_FORCE_TCP", "1"),
        ("MC_TRANSFER_TIMEOUT", "5"),
    ];
    Peer::spawn_role(CHILD, net.host(i), "netns-store-client", &envs)
}

#[test]
fn clients_on_two_hosts_share_objects_and_a_cut_client_is_dropped() {
    let one = || HostSpec { subnets: vec![0] };
    let net = Net::new(&[one(), one(), one()]).unwrap_or_else(|e| panic!("{e}"));
    let m = net.host(0).addr();
    let args = format!(
        "--rpc_address={m} --rpc_port=50051 --metrics_host={m} --metrics_port=9003 --client_ttl={CLIENT_TTL_S}"
    );
    let _master = KillOnDrop(
        net.host(0)
            .command(CHILD)
            .arg("netns-store-master")
            .env("NETNS_MASTER_ARGS", &args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let until = Instant::now() + Duration::from_secs(30);
    while master_http(&net, 1, "/health").is_none() {
        assert!(
            Instant::now() < until,
            "the master on {m} did not answer /health"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (mut a, mut b) = (client(&net, 1), client(&net, 2));
    let long = Duration::from_secs(30);
    let segments = || master_http(&net, 1, "/get_all_segments").unwrap_or_default();
    assert!(
        segments().contains(&a.session) && segments().contains(&b.session),
        "both segments mounted: {}",
        segments()
    );

    // A puts into B's segment; both read it back across the hosts.
    let r = a.call(&format!("put k1 {MIB} 1 {}", b.session), long);
    assert!(r["ok"] == true, "put k1 into B's segment: {r}");
    let placed = master_http(&net, 1, "/query_key?key=k1").unwrap();
    assert!(
        placed.contains(&b.session),
        "k1 lies in B's segment: {placed}"
    );
    for (who, p) in [("A", &mut a), ("B", &mut b)] {
        let r = p.call("get k1 1", long);
        assert!(
            r["ok"] == true && r["verified"] == true && r["len"] == MIB,
            "{who} gets k1: {r}"
        );
    }

    // B's link cut: a put into its segment fails, and leaves nothing to read. Meanwhile
    // the master drops B's segment after client_ttl, with the objects in it.
    net.cut(2).unwrap();
    let cut = Instant::now();
    let b_name = b.session.clone();
    let (put, dropped) = std::thread::scope(|s| {
        let watch = s.spawn(|| {
            let until = cut + Duration::from_secs(CLIENT_TTL_S * 5 + 10);
            while segments().contains(&b_name) {
                if Instant::now() > until {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Some(cut.elapsed())
        });
        let put = a.call(&format!("put k2 {MIB} 2 {b_name}"), long);
        (put, watch.join().unwrap())
    });
    assert!(
        put["ok"] == false,
        "a put into the cut host's segment succeeded: {put}"
    );
    let r = a.call("get k2 2", long);
    assert!(
        r["ok"] == false,
        "the failed put left a readable object: {r}"
    );
    let dropped = dropped.unwrap_or_else(|| {
        panic!("B's segment is still mounted long after its link was cut (client_ttl {CLIENT_TTL_S} s)")
    });
    println!(
        "netns_store: the put into the cut host failed in {:.0} ms ({}); its segment was dropped {:.2} s after the cut (client_ttl {CLIENT_TTL_S} s)",
        put["ms"].as_f64().unwrap_or(0.0),
        put["error"],
        dropped.as_secs_f64()
    );
    // The last heartbeat came up to a quarter of client_ttl before the cut; the sweep and
    // the polling add up to a few hundred milliseconds.
    let ttl = Duration::from_secs(CLIENT_TTL_S);
    assert!(
        dropped >= ttl * 3 / 4 && dropped <= ttl + Duration::from_secs(1),
        "dropped {dropped:?} after the cut, outside [3/4, 1] client_ttl + 1 s"
    );
    let r = a.call("get k1 1", long);
    assert!(
        r["ok"] == false
            && r["error"]
                .as_str()
                .unwrap_or("")
                .contains("OBJECT_NOT_FOUND"),
        "k1, which lay in the dropped segment, is still readable: {r}"
    );

    // A keeps working with what is left: its own segment.
    let r = a.call(&format!("put k3 {MIB} 3"), long);
    assert!(r["ok"] == true, "put k3 after B's segment went: {r}");
    let r = a.call("get k3 3", long);
    assert!(r["ok"] == true && r["verified"] == true, "get k3: {r}");

    // The link back: B's client mounts its segment again, and objects go there again.
    net.restore(2).unwrap();
    let restored = Instant::now();
    while !segments().contains(&b.session) {
        assert!(
            restored.elapsed() < Duration::from_secs(20),
            "B's segment not mounted again 20 s after its link came back:\n{}",
            b.stderr_tail(20)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "netns_store: mounted again {:.2} s after the link came back",
        restored.elapsed().as_secs_f64()
    );
    let r = a.call(&format!("put k4 {MIB} 4 {}", b.session), long);
    assert!(r["ok"] == true, "put k4 into B's segment again: {r}");
    let r = b.call("get k4 4", long);
    assert!(r["ok"] == true && r["verified"] == true, "B gets k4: {r}");
}
