//! Upstream's published wheel over the soft NIC (engine/tests/soft_nic/: a SOFTWARE
//! stand-in for libibverbs.so.1, not RDMA hardware), protocol "rdma": two upstream
//! processes WRITE and READ verified bytes through it.
//!
//! Upstream's topology discovery insists on `/dev/infiniband/uverbsN` character devices
//! and reads `/sys/class/infiniband`; `run-in-ns.sh` provides both in a private mount
//! namespace (`unshare -rm`: needs unprivileged user namespaces, nothing on the host
//! changes). The soft NIC replaces upstream's libibverbs through `LD_LIBRARY_PATH`.
//!
//!   scripts/setup-upstream.sh && cargo test -p e2e --test upstream_soft_nic

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

#[path = "../../engine/tests/soft_nic/mod.rs"]
mod soft_nic;

use std::process::{Command, Output};

use e2e::upstream_python;
use soft_nic::SoftFabric;

fn upstream(fabric: &SoftFabric, in_namespace: bool, args: &[&str]) -> Output {
    let mut cmd = Command::new("timeout");
    cmd.arg("120");
    if in_namespace {
        cmd.args(["unshare", "-rm"])
            .arg(soft_nic::source_dir().join("upstream/run-in-ns.sh"));
    }
    cmd.arg(upstream_python()).args(args);
    fabric.apply_to(&mut cmd);
    cmd.env("LD_LIBRARY_PATH", soft_nic::library().parent().unwrap());
    cmd.output().unwrap()
}

#[test]
fn upstream_writes_and_reads_over_two_soft_hcas() {
    let fabric = SoftFabric::new(&["soft_0", "soft_1"]);
    let script = soft_nic::source_dir().join("upstream/write_read.py");
    let out = upstream(&fabric, true, &[script.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "upstream over the soft NIC failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    for line in [
        "write rc 0",
        "target sees written bytes: True",
        "read rc 0",
        "initiator sees read bytes: True",
    ] {
        assert!(
            stdout.contains(line),
            "missing '{line}':\n{stdout}\n{stderr}"
        );
    }
    // RDMA for real (no TCP fallback): both HCAs found, RDMA transport, endpoints up.
    assert!(stderr.contains("Found 2 HCAs"), "{stderr}");
    assert!(stderr.contains("installTransport, type=rdma"), "{stderr}");
    assert!(stderr.contains("Received RDMA ready ACK"), "{stderr}");
}

/// What stops upstream without the namespace: its device check on /dev/infiniband
/// (on a host with real HCAs this test does not apply).
#[test]
fn upstream_without_dev_infiniband_finds_no_soft_hca() {
    let fabric = SoftFabric::new(&["soft_0"]);
    let out = upstream(
        &fabric,
        false,
        &[
            "-c",
            "from mooncake.engine import TransferEngine\n\
             print(TransferEngine().initialize('127.0.0.1', 'P2PHANDSHAKE', 'rdma', 'soft_0'))",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Device soft_0 path /dev/infiniband/uverbs0 does not exist"),
        "{stderr}"
    );
    assert!(stderr.contains("Found 0 HCAs"), "{stderr}");
}
