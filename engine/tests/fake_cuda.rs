//! Device memory with a FAKE CUDA runtime (see fake_gpu/fake_runtime.c).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]
mod fake_gpu;
use transfer_engine::device::Vendor;

#[test]
fn detects_cuda_locations() {
    fake_gpu::detects_locations(Vendor::Cuda);
}

#[test]
fn moves_cuda_memory_both_ways_through_staging() {
    fake_gpu::moves_device_memory_both_ways(Vendor::Cuda);
}
