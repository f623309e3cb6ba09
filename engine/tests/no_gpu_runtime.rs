//! No GPU runtime can be loaded: host memory works, device locations fail
//! with an error naming every library tried, nothing crashes.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]
use transfer_engine::{Config, TransferEngine};

#[test]
fn device_registration_without_a_runtime_lists_what_was_tried() {
    std::env::set_var("MC_GPU_RUNTIME", "cuda");
    std::env::set_var("MC_CUDART_PATH", "/nonexistent/libcudart.so.12");
    std::env::set_var("CUDA_HOME", "/nonexistent-cuda");
    let e = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", Config::default()).unwrap();
    let buf = vec![0u8; 4096];
    let err = e
        .register_memory(buf.as_ptr() as u64, 4096, "cuda:0")
        .unwrap_err();
    let text = err.to_string();
    for tried in [
        "/nonexistent/libcudart.so.12 (no such file)",
        "libcudart.so.13 (not found)",
        "libcudart.so.12 (not found)",
        "/nonexistent-cuda/lib64/libcudart.so",
    ] {
        assert!(text.contains(tried), "{tried} missing from: {text}");
    }
    // Auto-detection falls back to host memory, which still registers.
    e.register_memory(buf.as_ptr() as u64, 4096, "*").unwrap();
    assert!(e.registered_regions()[0].2.starts_with("cpu:"));
}
