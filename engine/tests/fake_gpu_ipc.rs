//! Same-host GPU IPC (`nvlink_intra`) between two processes under the FAKE CUDA runtime
//! (fake_gpu/fake_runtime.c): selection, descriptor fields, handle caching, teardown.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]
mod fake_gpu;
mod ipc_support;

use std::time::{Duration, Instant};

use transfer_engine::device::Vendor;

fn common_wait(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

#[test]
fn ipc_peer_process() {
    if std::env::var("TE_IPC_PEER").is_ok() {
        ipc_support::peer_main();
    }
}

#[test]
fn cuda_device_to_device_goes_over_ipc_with_one_open_per_allocation() {
    ipc_support::device_to_device_goes_over_ipc(Vendor::Cuda);
}

#[test]
fn cuda_host_memory_and_mixes_use_tcp() {
    ipc_support::host_memory_and_mixes_use_tcp(Vendor::Cuda);
}

#[test]
fn cuda_disabled_or_other_host_use_tcp() {
    ipc_support::disabled_or_other_host_use_tcp(Vendor::Cuda);
}

#[test]
fn cuda_mappings_close_on_unregister_and_peer_exit() {
    ipc_support::mappings_close_on_unregister_and_peer_exit(Vendor::Cuda);
}
