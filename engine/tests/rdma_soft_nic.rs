//! The RDMA transport over real verbs calls, served by the soft NIC (a SOFTWARE stand-in
//! for libibverbs.so.1, `engine/tests/soft_nic/`). The bytes move through the soft NIC's
//! `process_vm_writev` / `process_vm_readv` data path.
//!
//! Two set-ups: two transports in one child process (each with its own contexts on the
//! same soft HCAs) wired by an in-process connector that hands each endpoint request to
//! the other's `handle_connection`; and two processes, a target serving its descriptor
//! and endpoint requests on a real handshake listener, and an initiator started with
//! `RdmaTransport::start` (the engine's handshake client). The children are
//! `te-test-child`, their roles in `tests/child/rdma_soft_nic.rs`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod common;
#[path = "child/rdma_soft_nic.rs"]
mod roles;
mod soft_nic;

/// Runs `role` on a fresh fabric of `hcas` with `env`; returns its stdout, asserting that
/// it passed.
fn run_child(role: &str, hcas: &[&str], env: &[(&str, &str)]) -> String {
    let fabric = soft_nic::SoftFabric::new(hcas);
    let mut cmd = common::child_command(role);
    fabric.apply_to(&mut cmd);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "child {role} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("CHILD OK"), "{stdout}");
    stdout
}

/// Needs real RDMA hardware (and the system's libibverbs, or `MC_IBVERBS_PATH`):
/// `MC_TEST_RDMA_HCA=mlx5_0[,mlx5_1] MC_TEST_RDMA_GID_INDEX=3 cargo test -p
/// transfer-engine --test rdma_soft_nic -- --ignored real_hca`. Two transports in this
/// process move verified bytes over the named HCAs (loopback through the port).
#[test]
#[ignore = "needs a real RDMA HCA: set MC_TEST_RDMA_HCA (and MC_TEST_RDMA_GID_INDEX)"]
fn real_hca_loopback_moves_bytes() {
    let list = std::env::var("MC_TEST_RDMA_HCA")
        .expect("set MC_TEST_RDMA_HCA to the HCA(s) to test, e.g. mlx5_0");
    let hcas: Vec<String> = list.split(',').map(str::to_string).collect();
    roles::moves_bytes(&hcas);
}

#[test]
fn moves_verified_bytes_over_1_2_and_4_soft_hcas() {
    for hcas in [
        &["soft_0"][..],
        &["soft_0", "soft_1"][..],
        &["soft_0", "soft_1", "soft_2", "soft_3"][..],
    ] {
        run_child("rdma-soft-nic-moves-bytes", hcas, &[]);
    }
}

#[test]
fn an_injected_retry_exceeded_is_retried_over_rebuilt_queue_pairs() {
    run_child(
        "rdma-soft-nic-injected-errors",
        &["soft_0", "soft_1"],
        &[("SOFTNIC_FAIL", "retry_exc@3"), ("RDMA_EXPECT", "ok")],
    );
}

#[test]
fn a_remote_access_error_on_every_path_fails_the_request() {
    run_child(
        "rdma-soft-nic-injected-errors",
        &["soft_0", "soft_1"],
        &[
            ("SOFTNIC_FAIL", "rem_access@hca:soft_0"),
            ("RDMA_EXPECT", "rejected"),
        ],
    );
}

#[test]
fn two_processes_over_1_2_and_4_soft_hcas() {
    for hcas in [
        &["soft_0"][..],
        &["soft_0", "soft_1"][..],
        &["soft_0", "soft_1", "soft_2", "soft_3"][..],
    ] {
        run_child("rdma-soft-nic-two-processes", hcas, &[]);
    }
}

#[test]
fn a_peer_killed_mid_batch_fails_the_batch() {
    let out = run_child("rdma-soft-nic-peer-killed", &["soft_0", "soft_1"], &[]);
    let line = out.lines().find(|l| l.contains("after the kill"));
    println!("{}", line.unwrap_or_else(|| panic!("{out}")));
}
