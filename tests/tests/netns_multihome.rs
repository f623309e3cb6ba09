//! A multi-homed host (`e2e::netns`): one host on two subnets, a peer on each. An engine
//! named by a host name (bound to every address) is reached from both subnets, each peer
//! resolving the name to the address on its own subnet; an engine publishing one of its
//! addresses (`local_hostname` an IP: it binds and publishes that one) is reached from that
//! subnet, and from the other the peer gets a clear error in bounded time, as it does for a
//! published address where no host answers. Needs root (CI runs as root); without
//! namespaces it fails, saying why.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

use std::time::Duration;

use e2e::netns::{HostSpec, Net, Peer};

const CHILD: &str = env!("CARGO_BIN_EXE_e2e-test-child");
const SIZE: u64 = 1 << 20;
const ENVS: [(&str, &str); 3] = [
    ("MC_TRANSFER_TIMEOUT", "5"),
    ("MC_FORCE_TCP", "1"),
    ("MC_HANDSHAKE_CONNECT_TIMEOUT", "2"),
];
/// How long a peer may take to say that a published address cannot be reached: the
/// kernel's failed neighbour discovery (about 3 s), or the handshake's connect timeout
/// (`MC_HANDSHAKE_CONNECT_TIMEOUT`, 2 s here) for a silent host, and slack.
const UNREACHABLE_BOUND: Duration = Duration::from_secs(6);

fn net() -> Net {
    let net = Net::new(&[
        HostSpec {
            subnets: vec![0, 1],
        },
        HostSpec { subnets: vec![0] },
        HostSpec { subnets: vec![1] },
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    let (m0, m1) = (net.host(0).addr_on(0), net.host(0).addr_on(1));
    net.hosts_file(0, &[(m0, "multihomed")]).unwrap();
    net.hosts_file(1, &[(m0, "multihomed")]).unwrap();
    net.hosts_file(2, &[(m1, "multihomed")]).unwrap();
    net
}

fn peer(net: &Net, i: usize, local_hostname: &str, seed: u64) -> Peer {
    Peer::spawn(CHILD, net.host(i), local_hostname, SIZE, seed, &ENVS)
}

fn reads(p: &mut Peer, session: &str, buffer: u64) -> serde_json::Value {
    p.call(
        &format!("read {session} {buffer} 0 0 {SIZE} 1"),
        Duration::from_secs(30),
    )
}

#[test]
fn a_multi_homed_host_is_reached_from_each_subnet() {
    let net = net();
    let m = peer(&net, 0, "multihomed", 1);
    assert!(m.session.starts_with("multihomed:"), "{}", m.session);
    let mut p0 = peer(&net, 1, &net.host(1).addr().to_string(), 2);
    let mut p1 = peer(&net, 2, &net.host(2).addr().to_string(), 3);
    for (name, p) in [("subnet 0", &mut p0), ("subnet 1", &mut p1)] {
        let r = reads(p, &m.session, m.buffer);
        assert!(
            r["ok"] == true && r["verified"] == true,
            "the peer on {name}: {r}"
        );
    }
}

#[test]
fn a_published_address_is_reached_from_its_subnet_and_a_clear_error_elsewhere() {
    let net = net();
    let m1 = net.host(0).addr_on(1).to_string();
    let m = peer(&net, 0, &m1, 1);
    assert!(m.session.starts_with(&format!("{m1}:")), "{}", m.session);
    let mut p0 = peer(&net, 1, &net.host(1).addr().to_string(), 2);
    let mut p1 = peer(&net, 2, &net.host(2).addr().to_string(), 3);
    let r = reads(&mut p1, &m.session, m.buffer);
    assert!(
        r["ok"] == true && r["verified"] == true,
        "the peer on subnet 1: {r}"
    );
    // Subnet 0 has no route to the published address; an address on subnet 0 that no host
    // has (as when a wrong address is published); one whose packets are lost silently.
    let port = m.session.rsplit(':').next().unwrap();
    let silent = std::net::Ipv4Addr::new(10, 200, 0, 78);
    net.silent_neighbour(1, 0, silent).unwrap();
    for session in [
        m.session.clone(),
        format!("10.200.0.77:{port}"),
        format!("{silent}:{port}"),
    ] {
        let r = reads(&mut p0, &session, m.buffer);
        assert!(r["ok"] == false, "{session} from subnet 0: {r}");
        let err = r["error"].as_str().unwrap_or_default();
        let ms = r["ms"].as_f64().unwrap();
        assert!(err.contains(&session), "the error names {session}: {err}");
        assert!(
            ms <= UNREACHABLE_BOUND.as_secs_f64() * 1e3,
            "{session}: the error came after {ms} ms: {err}"
        );
        println!("netns multihome: {session} from subnet 0 failed in {ms:.0} ms: {err}");
    }
}
