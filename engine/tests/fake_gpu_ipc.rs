//! Same-host GPU IPC (`nvlink_intra`) between two processes under the FAKE CUDA runtime
//! (fake_gpu/fake_runtime.c): selection, descriptor fields, handle caching, teardown.
//! The scenarios are in ipc_support/mod.rs.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]
mod common;
mod fake_gpu;
mod ipc_support;

ipc_tests!(transfer_engine::device::Vendor::Cuda);
