//! Same-host GPU IPC across the hosts of `e2e::netns`, under the FAKE CUDA runtime
//! (`engine/tests/fake_gpu/fake_runtime.c`, built here: device memory is host memory behind
//! the runtime's API; no GPU is involved). Namespaces of one machine share its kernel's boot
//! id, which is what tells the engine which peers are on its host, so each host is given an
//! identity of its own (`MC_HOST_ID`, as distinct machines have distinct boot ids). Two
//! engines inside one host move device bytes over IPC; between two hosts over TCP, with no
//! IPC handle opened. Needs root and `cc` (CI has both); without them it fails, saying why.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{ChildStdin, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use e2e::netns::{Host, HostSpec, Net};
use e2e::KillOnDrop;
use serde_json::Value;

const CHILD: &str = env!("CARGO_BIN_EXE_e2e-test-child");
const SIZE: u64 = (2 << 20) + 4099;

/// Builds the fake CUDA runtime once into this test's scratch directory.
fn fake_runtime() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("netns-fake-cuda");
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libcudart.so.12");
    let part = dir.join(format!("libcudart.so.12.{}", std::process::id()));
    let src = e2e::repo_root().join("engine/tests/fake_gpu/fake_runtime.c");
    let status = std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O1", "-pthread", "-DPREFIX=cuda", "-o"])
        .arg(&part)
        .arg(&src)
        .status()
        .expect("a C compiler (cc) builds the fake GPU runtime");
    assert!(status.success(), "building {} failed", src.display());
    // Renamed into place: a process loading it never sees half a file.
    std::fs::rename(&part, &lib).unwrap();
    lib
}

/// A `netns-gpu-peer` child.
struct GpuPeer {
    _child: KillOnDrop,
    stdin: ChildStdin,
    lines: Receiver<String>,
    session: String,
    buffer: u64,
}

impl GpuPeer {
    fn spawn(lib: &PathBuf, host: &Host, host_id: &str, seed: u64) -> Self {
        let mut child = KillOnDrop(
            host.command(CHILD)
                .arg("netns-gpu-peer")
                .env("MC_CUDART_PATH", lib)
                .env("MC_GPU_RUNTIME", "cuda")
                .env("MC_HOST_ID", host_id)
                .env("MC_TRANSFER_TIMEOUT", "5")
                .env("NETNS_HOST", host.addr().to_string())
                .env("NETNS_SIZE", SIZE.to_string())
                .env("NETNS_SEED", seed.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let stdin = child.0.stdin.take().unwrap();
        let lines = e2e::line_channel(child.0.stdout.take().unwrap());
        let mut p = Self {
            _child: child,
            stdin,
            lines,
            session: String::new(),
            buffer: 0,
        };
        let hello = p.next();
        p.session = hello["session"].as_str().unwrap().to_string();
        p.buffer = hello["buffer"].as_u64().unwrap();
        p
    }

    fn next(&mut self) -> Value {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(30))
            .expect("netns-gpu-peer answers within 30 s (its log is above)");
        serde_json::from_str(&line).unwrap()
    }

    fn call(&mut self, cmd: &str) -> Value {
        writeln!(self.stdin, "t {cmd}").unwrap();
        self.next()
    }
}

#[test]
fn gpu_ipc_inside_a_host_and_tcp_between_hosts() {
    let lib = fake_runtime();
    let one = || HostSpec { subnets: vec![0] };
    let net = Net::new(&[one(), one()]).unwrap_or_else(|e| panic!("{e}"));
    let (h0, h1) = (net.host(0), net.host(1));
    let mut a = GpuPeer::spawn(&lib, h0, &h0.ns, 1);
    let mut a2 = GpuPeer::spawn(&lib, h0, &h0.ns, 2);
    let mut b = GpuPeer::spawn(&lib, h1, &h1.ns, 3);

    let r = a.call(&format!("write {} {}", b.session, b.buffer));
    assert!(r["ok"] == true, "A writes B's device memory: {r}");
    assert_eq!(
        r["ipc_opened"], 0,
        "no IPC handle opened between hosts: {r}"
    );
    assert!(b.call("check 1")["ok"] == true, "B holds A's bytes");

    let r = a.call(&format!("write {} {}", a2.session, a2.buffer));
    assert!(r["ok"] == true, "A writes A2's device memory: {r}");
    assert!(
        r["ipc_opened"].as_i64().unwrap() >= 1,
        "inside one host the write goes over IPC: {r}"
    );
    assert!(a2.call("check 1")["ok"] == true, "A2 holds A's bytes");
}
