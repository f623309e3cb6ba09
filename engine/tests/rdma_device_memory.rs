//! GPU memory over RDMA, without a GPU or an HCA: two engine processes, the FAKE CUDA or MUSA
//! runtime (`tests/fake_gpu/`: "device" memory is a memfd mapped PROT_NONE, reached only
//! through the runtime's copies) and the soft NIC (`tests/soft_nic/`: a SOFTWARE
//! stand-in for libibverbs.so.1). The soft NIC plays an HCA with the peer-memory module
//! (it reaches fake device memory through its own mapping of the memfd), one without it
//! (`SOFTNIC_REFUSE_MR=fake_gpu`: `ibv_reg_mr` fails with EFAULT), and one without
//! dma-buf support (`SOFTNIC_REFUSE_DMABUF=1`), so each step of the registration order
//! (`transport::rdma::register`) runs: peer memory, dma-buf, staged over TCP, and the
//! `MC_FORCE_HCA=1` error.
//!
//! Every engine runs in a child process (`te-test-child`, its roles in
//! `tests/child/rdma_device_memory.rs`): the verbs library, the GPU runtime and the `MC_*`
//! configuration are read once per process.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod common;
mod soft_nic;

use soft_nic::SoftFabric;

/// Runs `role` (`tests/child/rdma_device_memory.rs`) in a child with a fresh fabric's
/// environment, protocol `rdma`, the fake CUDA runtime and `env`; `MC_FORCE_HCA=1` when
/// `force`. Returns its output, asserting it passed.
fn run_child(role: &str, force: bool, env: &[(&str, &str)]) -> String {
    let fabric = SoftFabric::new(&["soft_0", "soft_1"]);
    let mut cmd = soft_nic::rdma_child(common::child_command(role), &fabric);
    cmd.env("MC_DISABLE_IPC", "1")
        .env("MC_LOG_LEVEL", "info")
        .env_remove("RUST_LOG")
        .env_remove("TE_TEST_PEER")
        .envs(env.iter().copied());
    if force {
        cmd.env("MC_FORCE_HCA", "1");
    }
    common::run_passing(cmd, role)
}

fn copies_in(text: &str) -> u64 {
    let line = text.lines().find_map(|l| l.split_once("COPIES ")).unwrap();
    line.1.trim().parse().unwrap()
}

#[test]
fn device_memory_registered_through_peer_memory_moves_over_rdma() {
    let text = run_child("rdma-device-memory", true, &[]);
    // No device copy here: the NIC read and wrote device memory itself.
    assert_eq!(copies_in(&text), 0, "{text}");
    assert!(
        !text.contains("STAGED") && !text.contains("dma-buf"),
        "{text}"
    );
}

#[test]
fn device_memory_refused_by_ibv_reg_mr_is_registered_through_dma_buf() {
    let text = run_child(
        "rdma-device-memory",
        true,
        &[("SOFTNIC_REFUSE_MR", "fake_gpu")],
    );
    assert_eq!(copies_in(&text), 0, "{text}");
    assert!(text.contains("registered through dma-buf"), "{text}");
    assert!(!text.contains("STAGED"), "{text}");
}

#[test]
fn device_memory_no_hca_can_register_is_staged_over_tcp_with_one_warning() {
    let text = run_child(
        "rdma-device-memory",
        false,
        &[
            ("SOFTNIC_REFUSE_MR", "fake_gpu"),
            ("SOFTNIC_REFUSE_DMABUF", "1"),
        ],
    );
    // The bytes went through pinned staging buffers (device copies here).
    assert!(copies_in(&text) > 0, "{text}");
    assert_eq!(text.matches("device memory is STAGED").count(), 1, "{text}");
    assert!(text.contains("nvidia-peermem"), "{text}");
}

#[test]
fn force_hca_makes_unregistrable_device_memory_an_error_naming_the_module() {
    run_child(
        "rdma-device-force-hca-register",
        true,
        &[
            ("SOFTNIC_REFUSE_MR", "fake_gpu"),
            ("SOFTNIC_REFUSE_DMABUF", "1"),
        ],
    );
}

#[test]
fn musa_memory_refused_by_ibv_reg_mr_is_registered_through_the_musa_dma_buf_calls() {
    // Upstream has only the peer-memory path on MUSA; we try muMemGetHandleForAddressRange.
    let text = run_child(
        "rdma-device-memory",
        true,
        &[
            ("TE_FAKE_VENDOR", "musa"),
            ("SOFTNIC_REFUSE_MR", "fake_gpu"),
        ],
    );
    assert_eq!(copies_in(&text), 0, "{text}");
    assert!(text.contains("musa memory at"), "{text}");
    assert!(text.contains("registered through dma-buf"), "{text}");
}

#[test]
fn musa_memory_no_hca_can_register_is_staged_naming_mthreads_peermem() {
    let text = run_child(
        "rdma-device-memory",
        false,
        &[
            ("TE_FAKE_VENDOR", "musa"),
            ("SOFTNIC_REFUSE_MR", "fake_gpu"),
            ("SOFTNIC_REFUSE_DMABUF", "1"),
        ],
    );
    assert!(copies_in(&text) > 0, "{text}");
    assert_eq!(text.matches("device memory is STAGED").count(), 1, "{text}");
    assert!(text.contains("mthreads-peermem"), "{text}");
}

#[test]
fn force_hca_fails_requests_to_a_peers_staged_buffer_instead_of_using_tcp() {
    run_child(
        "rdma-device-force-hca-staged-peer",
        true,
        &[
            ("SOFTNIC_REFUSE_MR", "fake_gpu"),
            ("SOFTNIC_REFUSE_DMABUF", "1"),
        ],
    );
}
