//! The IPC copy threads' batch call in CUDA 12.8's signature (`cudaMemcpyBatchAsync` with
//! `failIdx`), under the FAKE CUDA runtime reporting version 12.8: a process of its own,
//! since the runtime's version is read once, when it loads.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]
mod common;
mod fake_gpu;
mod ipc_support;

#[test]
fn scattered_requests_go_in_batches_with_the_cuda_12_signature() {
    // SAFETY (edition 2021: set_var is safe): the only other test of this binary reads
    // no variable of the fake; set before the runtime loads.
    std::env::set_var("FAKE_CUDART_VERSION", "12080");
    ipc_support::scattered_requests_go_in_batches(
        transfer_engine::device::Vendor::Cuda,
        "CUDA 12.8 signature, with failIdx",
    );
}
