//! The metadata stores on a host of their own (`e2e::netns`): our HTTP metadata server, and
//! a real etcd (Debian's `etcd-server`, as `scripts/etcd-local.sh` runs it), each in one
//! namespace, with two engines on two other hosts that find each other through it and move
//! verified bytes both ways, named by their addresses and by plain names. Needs root (CI
//! runs as root); without namespaces it fails, saying why.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use e2e::netns::{HostSpec, Net, Peer};
use e2e::KillOnDrop;

const CHILD: &str = env!("CARGO_BIN_EXE_e2e-test-child");
const SIZE: u64 = 2 << 20;
const HALF: u64 = SIZE / 2;

fn three_hosts() -> Net {
    let one = || HostSpec { subnets: vec![0] };
    Net::new(&[one(), one(), one()]).unwrap_or_else(|e| panic!("{e}"))
}

/// Engines on hosts 1 and 2 with the store `metadata`, named by their addresses and then by
/// plain names that no resolver knows (each publishes its host's address, and the peer
/// connects there): each reads the first half of the other's buffer into the second half
/// of its own.
fn engines_find_each_other(net: &Net, metadata: &str) {
    for plain in [false, true] {
        let name = |i: usize| match plain {
            false => net.host(i).addr().to_string(),
            true => format!("mc-role-{i}"),
        };
        pair_moves_bytes(net, metadata, name(1), name(2));
    }
}

fn pair_moves_bytes(net: &Net, metadata: &str, a_name: String, b_name: String) {
    let envs = [
        ("MC_TRANSFER_TIMEOUT", "5"),
        ("MC_FORCE_TCP", "1"),
        ("NETNS_METADATA", metadata),
    ];
    let spawn = |i: usize, name: &str| Peer::spawn(CHILD, net.host(i), name, SIZE, i as u64, &envs);
    let (mut a, mut b) = (spawn(1, &a_name), spawn(2, &b_name));
    assert_eq!(b.session, b_name, "store mode: the name");
    let long = Duration::from_secs(30);
    let r = b.call(
        &format!("read {} {} 0 {HALF} {HALF} 1", a.session, a.buffer),
        long,
    );
    assert!(
        r["ok"] == true && r["verified"] == true,
        "B ({b_name}) reads A ({a_name}) through {metadata}: {r}"
    );
    let r = a.call(
        &format!("read {} {} 0 {HALF} {HALF} 2", b.session, b.buffer),
        long,
    );
    assert!(
        r["ok"] == true && r["verified"] == true,
        "A ({a_name}) reads B ({b_name}): {r}\n{}",
        a.stderr_tail(20)
    );
}

#[test]
fn our_http_metadata_server_on_its_own_host() {
    let net = three_hosts();
    let listen = format!("{}:8080", net.host(0).addr());
    let mut server = KillOnDrop(
        net.host(0)
            .command(CHILD)
            .arg("netns-http-metadata")
            .env("NETNS_LISTEN", &listen)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut hello = String::new();
    BufReader::new(server.0.stdout.take().unwrap())
        .read_line(&mut hello)
        .unwrap();
    let url: serde_json::Value = serde_json::from_str(&hello).unwrap();
    let url = url["url"].as_str().unwrap().to_string();
    assert!(url.contains(&listen), "{url}");
    engines_find_each_other(&net, &url);
}

#[test]
fn etcd_on_its_own_host() {
    let net = three_hosts();
    let ip = net.host(0).addr();
    let data = DataDir(std::env::temp_dir().join(format!("netns-etcd-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&data.0);
    let client = format!("http://{ip}:2379");
    let peer = format!("http://{ip}:2380");
    let _etcd = KillOnDrop(
        net.host(0)
            .command("etcd")
            .args(["--name", "netns", "--data-dir"])
            .arg(&data.0)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("netns={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start etcd (scripts/install-deps.sh installs it): {e}")
            }),
    );
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let out = net
            .host(1)
            .command("curl")
            .args(["-fsS", &format!("{client}/health")])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&out.stdout).contains("true") {
            break;
        }
        assert!(
            Instant::now() < until,
            "etcd on {ip} did not become healthy"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    engines_find_each_other(&net, &format!("etcd://{ip}:2379"));
}

/// etcd's data directory, removed when the test ends (declared before etcd: dropped after).
struct DataDir(std::path::PathBuf);

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
