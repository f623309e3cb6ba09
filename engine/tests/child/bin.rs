//! `te-test-child`: the child processes of the engine's integration tests, one binary
//! that plays the role its first argument names. A test starts it through
//! `common::child_command(role)` with the role's environment; a role that returns prints
//! [`common::CHILD_DONE`] (`play.rs`), so its parent knows it ran to its end. Not a test itself:
//! `cargo test` lists and runs tests only, and a child entry point among them would pass
//! having done nothing. Built for this crate's tests only (the `test-child` feature).

#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    reason = "test support, sharing the tests' modules: a panic is the parent test's failure"
)]

#[path = "../common.rs"]
mod common;
#[path = "../fake_gpu/mod.rs"]
mod fake_gpu;
#[path = "../ipc_support/mod.rs"]
mod ipc_support;
#[path = "../meta_common/mod.rs"]
mod meta_common;
mod play;
mod rdma_device_memory;
mod rdma_engine;
mod rdma_soft_nic;
#[path = "../soft_nic/mod.rs"]
mod soft_nic;
mod verbs_soft_nic;

use transfer_engine::verbs::Verbs;

/// Every role, by the name a test starts it with.
const ROLES: &[play::Role] = &[
    ("peer", common::peer_main),
    ("meta-engine", meta_common::meta_child_main),
    ("ipc-peer", ipc_support::peer_main),
    ("verbs-load", verbs_load),
    ("verbs-soft-nic", verbs_soft_nic::run),
    (
        "rdma-engine-moves-bytes",
        rdma_engine::moves_bytes_both_ways,
    ),
    (
        "rdma-engine-injected-failure",
        rdma_engine::rdma_failure_is_the_rdma_path,
    ),
    (
        "rdma-engine-force-hca",
        rdma_engine::force_hca_without_rdma_fails_with_the_reason,
    ),
    ("rdma-device-peer", rdma_device_memory::peer),
    (
        "rdma-device-memory",
        rdma_device_memory::device_memory_both_ways,
    ),
    (
        "rdma-device-force-hca-register",
        rdma_device_memory::force_hca_refuses_memory_it_cannot_register,
    ),
    (
        "rdma-device-force-hca-staged-peer",
        rdma_device_memory::force_hca_fails_requests_to_a_peers_staged_buffer,
    ),
    (
        "rdma-soft-nic-moves-bytes",
        rdma_soft_nic::moves_bytes_child,
    ),
    (
        "rdma-soft-nic-injected-errors",
        rdma_soft_nic::with_injected_errors,
    ),
    ("rdma-soft-nic-target", rdma_soft_nic::target),
    ("rdma-soft-nic-two-processes", rdma_soft_nic::two_processes),
    (
        "rdma-soft-nic-peer-killed",
        rdma_soft_nic::peer_killed_mid_batch,
    ),
];

/// `verbs-load` (`verbs_loader.rs`): prints what `Verbs::load()` gave, from this
/// process's `MC_IBVERBS_PATH`.
fn verbs_load() {
    match Verbs::load() {
        Ok(v) => println!("RESULT loaded {}", v.path()),
        Err(e) => println!("RESULT unavailable {e:?} | {e}"),
    }
}

fn main() {
    play::play("te-test-child", ROLES);
}
