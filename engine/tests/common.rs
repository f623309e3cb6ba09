//! Test support: child processes (the `te-test-child` binary, `tests/child/`), a peer
//! engine in one of them, page-aligned buffers, patterns and hashes.

#![allow(dead_code)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test support: a panic here is the calling test's failure report \
              (clippy.toml's allow-*-in-tests covers #[test] functions, not their helpers)"
)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use transfer_engine::{Config, TransferEngine};

/// Bytes of guard zone on each side of the peer's registered region.
pub const GUARD: u64 = 64 << 10;
/// Fill of the guard zones, which must never change.
pub const GUARD_FILL: u8 = 0x5A;

/// The line `te-test-child` prints once a role has returned (`child/play.rs`).
pub const CHILD_DONE: &str = "te-test-child: done";

/// `te-test-child` playing `role` (`tests/child/bin.rs` lists them). Cargo names its
/// scratch directory to test targets only, when they are built: the child has it as the
/// variable `CARGO_TARGET_TMPDIR` (`fake_gpu` builds its runtime there), and passes it on
/// to the children it starts.
pub fn child_command(role: &str) -> Command {
    let mut cmd = Command::new(child_exe());
    cmd.arg(role);
    #[cfg(test)]
    cmd.env("CARGO_TARGET_TMPDIR", env!("CARGO_TARGET_TMPDIR"));
    cmd
}

/// Runs a [`child_command`] and returns its combined output, asserting that it passed and
/// that its role ran to its end.
pub fn run_passing(mut cmd: Command, role: &str) -> String {
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{role} failed:\n{text}");
    assert!(text.contains(CHILD_DONE), "{role} did not run:\n{text}");
    text
}

fn child_exe() -> PathBuf {
    // Cargo names the binary to integration tests only; in the binary itself (a child
    // starting a peer) it is the running executable.
    #[cfg(test)]
    return PathBuf::from(env!("CARGO_BIN_EXE_te-test-child"));
    #[cfg(not(test))]
    return std::env::current_exe().expect("te-test-child knows its own path");
}

/// Polls `done` until it holds (true) or `limit` passes (false).
pub fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// Polls `done` until it holds; panics saying `what` did not happen once `limit` passes.
pub fn wait_until(limit: Duration, what: &str, done: impl FnMut() -> bool) {
    assert!(wait_for(limit, done), "{what}: not within {limit:?}");
}

/// Deterministic, non-periodic test data.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// FNV-1a, enough to compare buffers across processes.
pub fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// A page-aligned, zeroed heap buffer.
pub use transfer_engine::HostBuffer as Buf;

/// A local engine on loopback, with the protocol `TE_TEST_PROTOCOL` names (default
/// `tcp`) and the rest of its configuration from the environment.
pub fn engine() -> TransferEngine {
    let protocol = std::env::var("TE_TEST_PROTOCOL").unwrap_or_else(|_| "tcp".into());
    let config = Config::from_env().expect("MC_* variables parse");
    let request = transfer_engine::transport::TransportRequest::new(&protocol, "");
    TransferEngine::with_transports("127.0.0.1", "P2PHANDSHAKE", config, &request)
        .expect("engine starts")
}

/// The peer process: an engine whose region `[addr, addr+len)` holds
/// `pattern(len, seed)`, with guard zones around it that are not registered.
pub struct Peer {
    pub child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub session: String,
    pub addr: u64,
    pub len: u64,
}

impl Peer {
    pub fn spawn(len: u64, seed: u64) -> Self {
        Self::spawn_as("peer", len, seed)
    }

    /// A peer playing `role` instead of `peer` ([`peer_main`]): one that prints the same
    /// `PEER` line and answers `hash` the same way, of other memory.
    #[allow(clippy::zombie_processes)] // waited for in `Drop`
    pub fn spawn_as(role: &str, len: u64, seed: u64) -> Self {
        let mut child = child_command(role)
            .env("TE_TEST_PEER", format!("{len} {seed}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("peer process starts");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                stdout.read_line(&mut line).unwrap() > 0,
                "peer exited before it was ready"
            );
            if let Some(rest) = line.split_once("PEER ").map(|(_, r)| r) {
                let v: Vec<&str> = rest.split_whitespace().collect();
                return Self {
                    child,
                    stdin,
                    stdout,
                    session: v[0].to_string(),
                    addr: v[1].parse().unwrap(),
                    len: v[2].parse().unwrap(),
                };
            }
        }
    }

    /// FNV of the peer's bytes `[addr, addr+len)` (guard zones included if asked).
    pub fn hash(&mut self, addr: u64, len: u64) -> u64 {
        writeln!(self.stdin, "hash {addr} {len}").unwrap();
        let mut line = String::new();
        loop {
            line.clear();
            assert!(self.stdout.read_line(&mut line).unwrap() > 0, "peer died");
            if let Some(h) = line.split_once("HASH ").map(|(_, r)| r) {
                return h.trim().parse().unwrap();
            }
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The peer process (role `peer`): `TE_TEST_PEER="<len> <seed>"`.
pub fn peer_main() {
    let spec = std::env::var("TE_TEST_PEER").expect("TE_TEST_PEER=\"<len> <seed>\"");
    let mut it = spec.split_whitespace().map(|s| s.parse::<u64>().unwrap());
    let (len, seed) = (it.next().unwrap(), it.next().unwrap());
    let buf = Buf::new((len + 2 * GUARD) as usize);
    buf.fill(GUARD_FILL);
    buf.write_at(GUARD as usize, &pattern(len as usize, seed))
        .unwrap();
    let engine = engine();
    engine
        .register_memory(buf.addr() + GUARD, len, "cpu:0")
        .unwrap();
    let mut out = std::io::stdout();
    writeln!(
        out,
        "PEER {} {} {}",
        engine.session_id(),
        buf.addr() + GUARD,
        len
    )
    .unwrap();
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line.unwrap();
        let v: Vec<&str> = line.split_whitespace().collect();
        if v.first() == Some(&"hash") {
            let (a, n): (u64, u64) = (v[1].parse().unwrap(), v[2].parse().unwrap());
            let off = (a - buf.addr()) as usize;
            writeln!(out, "HASH {}", fnv(&buf.read_at(off, n as usize).unwrap())).unwrap();
        }
    }
    std::process::exit(0);
}
