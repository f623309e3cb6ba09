//! RDMA interop with upstream's published wheel, both ways, bytes verified, over the soft
//! NIC (engine/tests/soft_nic/: a SOFTWARE stand-in for libibverbs.so.1, not RDMA
//! hardware) with two HCAs:
//! - upstream's engine as initiator (`upstream_peer.py initiator`, protocol `rdma`) reads
//!   our target's pattern, writes its own (batched, reversed blocks, unaligned, whole
//!   range), and we check our buffer holds it;
//! - our engine as initiator reads an upstream target's pattern and writes another one
//!   back, which the upstream target checks.
//!
//! Upstream's topology discovery needs `/dev/infiniband/uverbsN` and
//! `/sys/class/infiniband`, so each case runs in a child process (`e2e-test-child`) inside
//! `run-in-ns.sh`'s private mount namespace (`unshare -rm`), and starts the upstream
//! process from there. Upstream loads the soft NIC through `LD_LIBRARY_PATH`, ours through
//! `MC_IBVERBS_PATH`; with protocol `rdma` upstream installs no TCP transport, and ours runs
//! with `MC_FORCE_HCA=1`, so no byte can take TCP.
//!
//! Fails, saying what is missing, without the upstream venv (`scripts/setup-upstream.sh`
//! or `UPSTREAM_PYTHON`) or user namespaces (root, or unprivileged ones allowed).
//!
//!   UPSTREAM_PYTHON=... cargo test -p e2e --test rdma_interop_soft_nic

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

#[path = "child/rdma_interop.rs"]
mod roles;
#[path = "../../engine/tests/soft_nic/mod.rs"]
mod soft_nic;

use std::process::Command;

use e2e::find_upstream_python;
use roles::{CHILD_DONE, HCAS};
use soft_nic::SoftFabric;

/// What this machine lacks to run the interop cases, if anything: both are expected where
/// the suite runs (scripts/test.sh sets up the upstream venv; root, or unprivileged user
/// namespaces, for `unshare -rm`).
fn missing() -> Option<String> {
    if let Err(e) = find_upstream_python() {
        return Some(e);
    }
    match Command::new("unshare").args(["-rm", "true"]).output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "unprivileged user namespaces are unavailable (`unshare -rm true`: {}); \
             upstream needs run-in-ns.sh's private /dev/infiniband and /sys/class",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("`unshare` (util-linux) cannot run: {e}")),
    }
}

/// Runs `role` (`tests/child/rdma_interop.rs`) inside run-in-ns.sh's namespace on a fresh
/// two-HCA fabric and asserts it passed.
fn run_in_namespace(role: &str) {
    if let Some(why) = missing() {
        panic!("{role} cannot run here: {why}");
    }
    let fabric = SoftFabric::new(&HCAS);
    let mut cmd = Command::new("timeout");
    cmd.args(["180", "unshare", "-rm"])
        .arg(soft_nic::source_dir().join("upstream/run-in-ns.sh"))
        .arg(env!("CARGO_BIN_EXE_e2e-test-child"))
        .arg(role)
        .env("MC_FORCE_HCA", "1")
        // For the upstream process; ours dlopens MC_IBVERBS_PATH and links no verbs.
        .env("LD_LIBRARY_PATH", soft_nic::library().parent().unwrap())
        .env_remove("MC_FORCE_TCP")
        .env_remove("MC_TE_FILTERS")
        .env_remove("MOONCAKE_RDMA_DEVICES");
    fabric.apply_to(&mut cmd);
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{role} failed ({}):\n{text}",
        out.status
    );
    assert!(text.contains(CHILD_DONE), "{role} did not run:\n{text}");
}

#[test]
fn upstream_initiator_reads_and_writes_our_rdma_target() {
    run_in_namespace("upstream-initiator");
}

#[test]
fn our_initiator_reads_and_writes_an_upstream_rdma_target() {
    run_in_namespace("our-initiator");
}
