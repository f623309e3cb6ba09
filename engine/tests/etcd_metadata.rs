//! Engines discovering each other through a real etcd (Debian's `etcd-server`, started by
//! this test on 127.0.0.1 with a temporary data directory): register, discover, transfer
//! with verified bytes; cluster ids; an engine killed with SIGKILL (its keys expire with
//! its lease, its name initializes again at once); etcd stopped mid-run and restarted;
//! an unreachable etcd fails `initialize` with the reason.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod common;
mod meta_common;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{pattern, wait_for, Buf};
use meta_common::{engine_in, name, plain_names_move_bytes, read, spawn_child, Reaped};
use transfer_engine::{Config, TransferEngine};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An etcd server on 127.0.0.1, its data in a temporary directory removed on drop.
struct Etcd {
    proc: Option<Reaped>,
    dir: PathBuf,
    client_port: u16,
    peer_port: u16,
}

impl Etcd {
    fn start() -> Self {
        let dir =
            std::env::temp_dir().join(format!("te-etcd-{}-{}", std::process::id(), free_port()));
        let mut e = Self {
            proc: None,
            dir,
            client_port: free_port(),
            peer_port: free_port(),
        };
        e.restart();
        e
    }

    fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    fn conn(&self) -> String {
        format!("etcd://{}", self.endpoint())
    }

    /// Starts etcd (again, on the same ports and data) and waits until it is healthy.
    #[allow(clippy::zombie_processes, reason = "reaped by `Reaped`")]
    fn restart(&mut self) {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new("etcd")
            .args(["--name", "te-test", "--data-dir"])
            .arg(&self.dir)
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
            .args(["--initial-cluster", &format!("te-test={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "etcd starts (Debian package etcd-server; scripts/install-deps.sh installs it)",
            );
        self.proc = Some(Reaped(child));
        let health = format!("{client}/health");
        assert!(
            wait_for(Duration::from_secs(30), || ureq::get(&health)
                .call()
                .ok()
                .and_then(|mut r| r.body_mut().read_to_string().ok())
                .is_some_and(|b| b.contains("true"))),
            "etcd did not become healthy"
        );
    }

    /// SIGKILL.
    fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ttl_config(cluster: &str) -> Config {
    Config {
        metadata_cluster_id: cluster.into(),
        metadata_lease_ttl: Duration::from_secs(2),
        ..Config::default()
    }
}

#[test]
fn register_discover_transfer_over_etcd() {
    let etcd = Etcd::start();
    let (a_name, b_name) = (name(), name());
    // Two endpoints, one of them dead: the client uses the live one.
    let conn = format!("etcd://127.0.0.1:{},{}", free_port(), etcd.endpoint());
    let a = engine_in(&a_name, &conn, "");
    let b = engine_in(&b_name, &etcd.conn(), "");

    let len = 1 << 20;
    let b_buf = Buf::new(len);
    b_buf.write_at(0, &pattern(len, 1)).unwrap();
    b.register_memory(b_buf.addr(), len as u64, "cpu:0")
        .unwrap();
    assert_eq!(
        read(&a, &b_name, b_buf.addr(), len).unwrap(),
        pattern(len, 1)
    );

    meta_common::check_late_registration_and_unknown_segment(&a, &b, &b_name);

    // B leaves: its keys go with its lease.
    drop(b);
    a.forget_segment(&b_name);
    let err = a.segment_buffers(&b_name).unwrap_err().to_string();
    assert!(err.contains("not registered"), "{err}");
}

#[test]
fn engines_with_plain_names_move_bytes_through_etcd() {
    let etcd = Etcd::start();
    plain_names_move_bytes(&etcd.conn(), |_, _| {});
}

#[test]
fn a_cluster_id_partitions_engines_in_etcd() {
    let etcd = Etcd::start();
    meta_common::check_cluster_partition(&etcd.conn(), |_| {});
}

#[test]
fn a_killed_engine_is_replaced_at_once_and_its_keys_expire() {
    let etcd = Etcd::start();
    let a = TransferEngine::new(&name(), &etcd.conn(), ttl_config("")).unwrap();
    let b_name = name();
    let env = [("MC_METADATA_LEASE_TTL_SEC", "2")];
    let (mut child, addr) = spawn_child(&etcd.conn(), &b_name, 5, &env);
    assert_eq!(read(&a, &b_name, addr, 4096).unwrap(), pattern(4096, 5));
    // Kept alive past its TTL by the child's renewals.
    assert!(!wait_for(Duration::from_secs(4), || {
        a.forget_segment(&b_name);
        a.segment_buffers(&b_name).is_err()
    }));

    // While it lives, the name is refused.
    let err = TransferEngine::new(&b_name, &etcd.conn(), ttl_config("")).unwrap_err();
    assert!(err.to_string().contains("in use by a live engine"), "{err}");

    // Killed, and back at once under the same name: A reaches the new instance.
    child.kill();
    let started = Instant::now();
    let b = TransferEngine::new(&b_name, &etcd.conn(), ttl_config("")).unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    let buf = Buf::new(4096);
    buf.write_at(0, &pattern(4096, 6)).unwrap();
    b.register_memory(buf.addr(), 4096, "cpu:0").unwrap();
    assert_eq!(
        read(&a, &b_name, buf.addr(), 4096).unwrap(),
        pattern(4096, 6)
    );

    // Another engine killed and not restarted: its keys expire with its lease.
    let c_name = name();
    let (mut child, _) = spawn_child(&etcd.conn(), &c_name, 7, &env);
    a.segment_buffers(&c_name).unwrap();
    child.kill();
    assert!(
        wait_for(Duration::from_secs(20), || {
            a.forget_segment(&c_name);
            a.segment_buffers(&c_name)
                .is_err_and(|e| e.to_string().contains("not registered"))
        }),
        "the killed engine's keys did not expire"
    );
}

#[test]
fn etcd_stopped_mid_run_then_restarted() {
    let mut etcd = Etcd::start();
    let (a_name, b_name) = (name(), name());
    let a = TransferEngine::new(&a_name, &etcd.conn(), ttl_config("")).unwrap();
    let b = TransferEngine::new(&b_name, &etcd.conn(), ttl_config("")).unwrap();
    let buf = Buf::new(4096);
    buf.write_at(0, &pattern(4096, 3)).unwrap();
    b.register_memory(buf.addr(), 4096, "cpu:0").unwrap();
    assert_eq!(
        read(&a, &b_name, buf.addr(), 4096).unwrap(),
        pattern(4096, 3)
    );

    etcd.kill();
    // Engines that know each other go on.
    for _ in 0..3 {
        assert_eq!(
            read(&a, &b_name, buf.addr(), 4096).unwrap(),
            pattern(4096, 3)
        );
    }
    // A new lookup fails, naming the store.
    a.forget_segment(&b_name);
    let err = a.segment_buffers(&b_name).unwrap_err().to_string();
    assert!(err.contains(&etcd.conn()), "{err}");

    etcd.restart();
    assert!(
        wait_for(Duration::from_secs(30), || a
            .segment_buffers(&b_name)
            .is_ok()),
        "lookups did not recover after etcd came back"
    );
    assert_eq!(
        read(&a, &b_name, buf.addr(), 4096).unwrap(),
        pattern(4096, 3)
    );
}

#[test]
fn an_unreachable_etcd_fails_initialize_with_the_reason() {
    let conn = format!("etcd://127.0.0.1:{}", free_port());
    let started = Instant::now();
    let err = TransferEngine::new(&name(), &conn, Config::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains(&conn), "{err}");
    assert!(started.elapsed() < Duration::from_secs(20), "{err}");
    let err = TransferEngine::new(&name(), "etcd://a:1,,b:2", Config::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("empty endpoint"), "{err}");
}

#[test]
fn the_same_name_again_in_one_process_over_etcd() {
    let etcd = Etcd::start();
    meta_common::check_same_name_again_in_process(&etcd.conn());
}
