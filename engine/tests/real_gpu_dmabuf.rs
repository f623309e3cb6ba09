//! dma-buf export of REAL CUDA memory (`device::dmabuf`, the second step of RDMA
//! registration of device memory). Needs a CUDA GPU and driver; run with
//! `TE_REAL_GPU=1 cargo test -p transfer-engine --test real_gpu_dmabuf -- --ignored`.
//! (`ibv_reg_dmabuf_mr` itself needs an HCA as well: not covered here.)

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

use std::os::fd::AsRawFd;

use transfer_engine::device::{self, dmabuf};

#[test]
#[ignore = "needs a CUDA GPU: TE_REAL_GPU=1 cargo test --test real_gpu_dmabuf -- --ignored"]
fn real_cuda_memory_exports_as_a_dma_buf_of_its_allocation() {
    // `--ignored` selects it on hosts without a GPU too: there it fails, never passing
    // untested.
    assert!(
        std::env::var_os("TE_REAL_GPU").is_some(),
        "needs a CUDA GPU and its driver: set TE_REAL_GPU=1 on a host that has them"
    );
    let rt = device::runtime().unwrap();
    rt.set_device(0).unwrap();
    let len = 64 << 20;
    let p = rt.malloc(len).unwrap();
    // A range inside the allocation: the export names the whole allocation.
    let buf = dmabuf::export(&rt, p + (2 << 20), 1 << 20).unwrap();
    assert_eq!(buf.offset(), 2 << 20);
    let link = std::fs::read_link(format!("/proc/self/fd/{}", buf.fd().as_raw_fd())).unwrap();
    println!("exported {p:#x}+{len}: fd -> {}", link.display());
    assert!(link.to_string_lossy().contains("dmabuf"), "{link:?}");
    // Outside any allocation: refused with the driver's error, no fd.
    let err = dmabuf::export(&rt, 0x1000, 4096).unwrap_err();
    println!("refused: {err}");
    assert!(err.contains("cuMemGetAddressRange_v2"), "{err}");
    drop(buf);
    rt.free(p).unwrap();
}
