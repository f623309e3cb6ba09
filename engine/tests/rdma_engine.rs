//! Two engines in two processes, started as `initialize(..., "rdma", ...)` starts them,
//! moving verified bytes over the RDMA transport. The verbs library is the soft NIC (a
//! SOFTWARE stand-in for libibverbs.so.1, `tests/soft_nic/`): discovery reads its
//! synthetic sysfs tree, the engine loads it through `MC_IBVERBS_PATH`, and the bytes
//! move through its `process_vm_writev` / `process_vm_readv` data path.
//!
//! Every engine here runs in a child process (`te-test-child`, its roles in
//! `tests/child/rdma_engine.rs`) because the verbs library and the `MC_*` configuration
//! are read once per process.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod common;
mod soft_nic;

use soft_nic::SoftFabric;

/// Runs `role` (`tests/child/rdma_engine.rs`) in a child process with `fabric`'s
/// environment, protocol `rdma` and `env`; returns its combined output, asserting it passed.
fn run_child(role: &str, fabric: &SoftFabric, env: &[(&str, &str)]) -> String {
    let mut cmd = soft_nic::rdma_child(common::child_command(role), fabric);
    cmd.env("MC_FORCE_HCA", "1").envs(env.iter().copied());
    common::run_passing(cmd, role)
}

#[test]
fn engines_move_verified_bytes_over_1_2_and_4_soft_hcas() {
    for n in [1, 2, 4] {
        let names: Vec<String> = (0..n).map(|i| format!("soft_{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let fabric = SoftFabric::new(&refs);
        run_child("rdma-engine-moves-bytes", &fabric, &[]);
    }
}

#[test]
fn an_injected_remote_access_error_fails_the_request_so_the_bytes_went_over_rdma() {
    let fabric = SoftFabric::new(&["soft_0"]);
    run_child(
        "rdma-engine-injected-failure",
        &fabric,
        &[("SOFTNIC_FAIL", "rem_access@hca:soft_0")],
    );
}

#[test]
fn force_hca_with_a_filter_naming_a_missing_hca_fails_initialize() {
    let fabric = SoftFabric::new(&["soft_0"]);
    run_child(
        "rdma-engine-force-hca",
        &fabric,
        &[("MC_TE_FILTERS", "soft_9")],
    );
}
