//! Support of the metadata store tests (`http_metadata.rs`, `etcd_metadata.rs`): engines
//! named for a store, a reading helper, and an engine in a child process to kill.

#![allow(dead_code)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test support: a panic here is the calling test's failure report \
              (clippy.toml's allow-*-in-tests covers #[test] functions, not their helpers)"
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};

use crate::common::{pattern, Buf};
use transfer_engine::{Config, OpCode, Request, TransferEngine};

/// A segment name unique within this test binary (the port part is only a name here).
pub fn name() -> String {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!(
        "127.0.0.1:{}",
        30000 + u32::from(n) + 100 * (std::process::id() % 300)
    )
}

pub fn engine_in(name: &str, url: &str, cluster: &str) -> TransferEngine {
    let config = Config {
        metadata_cluster_id: cluster.into(),
        ..Config::default()
    };
    TransferEngine::new(name, url, config).unwrap()
}

/// Reads `len` bytes at `remote` of `segment` into a fresh buffer.
pub fn read(e: &TransferEngine, segment: &str, remote: u64, len: usize) -> Result<Vec<u8>, String> {
    let local = Buf::new(len);
    let req = [Request::new(OpCode::Read, local.addr(), remote, len as u64)];
    // SAFETY: `local` outlives the synchronous call; nothing else touches it meanwhile.
    unsafe { e.transfer_sync(segment, &req) }.map_err(|err| err.to_string())?;
    Ok(local.to_vec())
}

/// The engine process of the kill tests (role `meta-engine`):
/// `TE_META_CHILD="<connection string> <name> <seed>"`; the configuration from the
/// environment.
pub fn meta_child_main() {
    let spec = std::env::var("TE_META_CHILD").expect("TE_META_CHILD=\"<url> <name> <seed>\"");
    let v: Vec<&str> = spec.split_whitespace().collect();
    let e = TransferEngine::new(v[1], v[0], Config::from_env().unwrap()).unwrap();
    let buf = Buf::new(4096);
    buf.write_at(0, &pattern(4096, v[2].parse().unwrap()))
        .unwrap();
    e.register_memory(buf.addr(), 4096, "cpu:0").unwrap();
    let mut out = std::io::stdout();
    writeln!(out, "READY {}", buf.addr()).unwrap();
    // Serve until killed (or the test closes stdin).
    let mut sink = String::new();
    let _ = std::io::stdin().read_to_string(&mut sink);
}

/// A child process, killed and reaped when dropped.
pub struct Reaped(pub Child);

impl Reaped {
    /// SIGKILL, and wait until it is gone.
    pub fn kill(&mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the engine process of [`meta_child_main`] and returns it with its buffer's address.
#[allow(clippy::zombie_processes, reason = "reaped by `Reaped`")]
pub fn spawn_child(url: &str, name: &str, seed: u64, env: &[(&str, &str)]) -> (Reaped, u64) {
    let mut child = crate::common::child_command("meta-engine")
        .env("TE_META_CHILD", format!("{url} {name} {seed}"))
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let child = Reaped(child);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "child died before READY"
        );
        if let Some(addr) = line.split_once("READY ").map(|(_, a)| a) {
            return (child, addr.trim().parse().unwrap());
        }
    }
}

/// Three engines in cluster `one` and one in `two` on the store `conn`: the three read each
/// other's bytes; the fourth sees none of them, and none of them sees it. `also` runs with
/// the four names (the last in `two`) while the engines live.
pub fn check_cluster_partition(conn: &str, also: impl FnOnce(&[String])) {
    let names: Vec<String> = (0..4).map(|_| name()).collect();
    let ones: Vec<TransferEngine> = names[..3]
        .iter()
        .map(|n| engine_in(n, conn, "one"))
        .collect();
    let other = engine_in(&names[3], conn, "two");
    let bufs: Vec<Buf> = (0..4).map(|_| Buf::new(4096)).collect();
    for (i, e) in ones.iter().chain([&other]).enumerate() {
        bufs[i].write_at(0, &pattern(4096, 10 + i as u64)).unwrap();
        e.register_memory(bufs[i].addr(), 4096, "cpu:0").unwrap();
    }
    for (i, e) in ones.iter().enumerate() {
        let j = (i + 1) % 3;
        assert_eq!(
            read(e, &names[j], bufs[j].addr(), 4096).unwrap(),
            pattern(4096, 10 + j as u64)
        );
    }
    for j in 0..3 {
        let err = read(&other, &names[j], bufs[j].addr(), 64).unwrap_err();
        assert!(err.contains("not registered"), "{err}");
    }
    let err = read(&ones[0], &names[3], bufs[3].addr(), 64).unwrap_err();
    assert!(err.contains("not registered"), "{err}");
    also(&names);
}

/// `b` registers more memory after `a` cached its descriptor: `a` reads it (the refresh on a
/// miss); `a` probes `b` through the store; a segment the store does not know fails naming it.
pub fn check_late_registration_and_unknown_segment(
    a: &TransferEngine,
    b: &TransferEngine,
    b_name: &str,
) {
    let late = Buf::new(4096);
    late.write_at(0, &pattern(4096, 77)).unwrap();
    b.register_memory(late.addr(), 4096, "cpu:0").unwrap();
    assert_eq!(
        read(a, b_name, late.addr(), 4096).unwrap(),
        pattern(4096, 77)
    );
    a.probe(b_name).unwrap();
    let ghost = "127.0.0.1:9";
    let err = read(a, ghost, 0x1000, 8).unwrap_err();
    assert!(
        err.contains(ghost) && err.contains("not registered"),
        "{err}"
    );
    b.unregister_memory(late.addr()).unwrap();
}

/// A second engine of this process under the name of a live first one (Python's
/// `initialize` called again) takes the name over; the first, dropped, leaves the second's
/// entries alone, and a peer reaches the second.
pub fn check_same_name_again_in_process(conn: &str) {
    let shared = name();
    let a = engine_in(&name(), conn, "");
    let first = engine_in(&shared, conn, "");
    let second = engine_in(&shared, conn, "");
    drop(first);
    let buf = Buf::new(4096);
    buf.write_at(0, &pattern(4096, 31)).unwrap();
    second.register_memory(buf.addr(), 4096, "cpu:0").unwrap();
    assert_eq!(
        read(&a, &shared, buf.addr(), 4096).unwrap(),
        pattern(4096, 31)
    );
    a.probe(&shared).unwrap();
}

/// Two engines named by plain names (no address, no port: a pod or role name that no
/// resolver knows) move verified bytes both ways through the store at `url`. Each
/// publishes an address of this host (one a socket can bind), never its name; with
/// `MC_TCP_BIND_ADDRESS` that address. `stored(name, host)` checks what the store holds
/// for each engine while both live.
pub fn plain_names_move_bytes(url: &str, stored: impl Fn(&str, &str)) {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let tag = format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let a = TransferEngine::new(&format!("mc-prefill-{tag}"), url, Config::default()).unwrap();
    let pinned = Config {
        tcp_bind_address: Some("127.0.0.1".parse().unwrap()),
        ..Config::default()
    };
    let b_name = format!("mc-decode-{tag}");
    let b = TransferEngine::new(&b_name, url, pinned).unwrap();
    assert_eq!(b.session_id(), b_name, "the name is the segment");
    assert_eq!(b.published_host(), "127.0.0.1", "MC_TCP_BIND_ADDRESS");
    let ip: std::net::IpAddr = a.published_host().parse().unwrap_or_else(|_| {
        panic!(
            "{} published {:?}, not an address",
            a.session_id(),
            a.published_host()
        )
    });
    std::net::TcpListener::bind((ip, 0))
        .unwrap_or_else(|e| panic!("published {ip}, which is no address of this host: {e}"));

    let len = 1 << 20;
    let (a_buf, b_buf) = (Buf::new(len), Buf::new(len));
    a_buf.write_at(0, &pattern(len, 41)).unwrap();
    b_buf.write_at(0, &pattern(len, 42)).unwrap();
    a.register_memory(a_buf.addr(), len as u64, "cpu:0")
        .unwrap();
    b.register_memory(b_buf.addr(), len as u64, "cpu:0")
        .unwrap();
    // A reads B (B published 127.0.0.1), B reads A (A published its interface address).
    assert_eq!(
        read(&a, &b_name, b_buf.addr(), len).unwrap(),
        pattern(len, 42)
    );
    assert_eq!(
        read(&b, a.session_id(), a_buf.addr(), len).unwrap(),
        pattern(len, 41)
    );
    let w = [Request::new(
        OpCode::Write,
        a_buf.addr(),
        b_buf.addr(),
        len as u64,
    )];
    // SAFETY: both buffers outlive the synchronous call.
    unsafe { a.transfer_sync(&b_name, &w) }.unwrap();
    assert_eq!(b_buf.to_vec(), pattern(len, 41));
    for e in [&a, &b] {
        stored(e.session_id(), e.published_host());
    }
}
