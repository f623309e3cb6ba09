//! A data server's send out of device memory waits for its copies out of the device by
//! querying the stream and yielding the CPU in between, not by synchronising it (which
//! spins in the runtime). The FAKE runtime (fake_gpu/fake_runtime.c) runs a stream's
//! copies only once a query (or a synchronisation) finds them, the query before that
//! answering "not ready": bytes sent before their copy ran show in what comes back.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]
mod fake_gpu;
use fake_gpu::{
    device_buffer, device_bytes, engine, install_fake, pattern, queries_not_ready, requests,
};
use transfer_engine::device::staging::CHUNK;
use transfer_engine::device::Vendor;
use transfer_engine::{HostBuffer, OpCode};

/// Reads out of the target's device memory into host memory and into device memory, of
/// whole chunks and a ragged tail: every byte comes back, and the target's sends found
/// their copies still running at a query at least once a chunk. Then, with a runtime that
/// numbers "not ready" otherwise (CUDA before 10: 34), the sends fall back to
/// synchronising, and the bytes still come back.
#[test]
fn sends_out_of_device_memory_wait_for_their_copies_between_queries() {
    install_fake(Vendor::Cuda);
    // SAFETY (edition 2021: set_var is safe): read by the fake at each query; this binary
    // holds only this test.
    std::env::set_var("FAKE_COPY_DELAY_US", "200");
    let initiator = engine();
    let target = engine();
    const N: usize = 8;
    let len = N * CHUNK + 4097;
    let data = pattern(len, 51);
    let src = device_buffer(0, &data);
    target.register_memory(src, len as u64, "*").unwrap();
    let seg = target.session_id().to_string();
    let host = HostBuffer::new(len);
    initiator
        .register_memory(host.addr(), len as u64, "*")
        .unwrap();
    let dev = device_buffer(0, &vec![0u8; len]);
    initiator.register_memory(dev, len as u64, "*").unwrap();

    let read_all = |into: u64| {
        let mut reads = requests(OpCode::Read, into, src, N, CHUNK);
        reads.push(transfer_engine::Request {
            op: OpCode::Read,
            local: into + (N * CHUNK) as u64,
            remote: src + (N * CHUNK) as u64,
            len: 4097,
        });
        // SAFETY: both destinations are test-owned and outlive the batch (waited for).
        unsafe { initiator.submit(&seg, &reads) }
            .unwrap()
            .wait()
            .unwrap();
    };

    let before = queries_not_ready();
    read_all(host.addr());
    read_all(dev);
    let after = queries_not_ready();
    assert!(host.to_vec() == data, "reads into host memory: other bytes");
    assert!(
        device_bytes(dev, len) == data,
        "reads into device memory: other bytes"
    );
    let not_ready = after - before;
    assert!(
        not_ready >= 2 * (N as u64 + 1),
        "the sends found their copies running at {not_ready} queries, fewer than one a chunk"
    );

    // "Not ready" numbered as CUDA 9 did: a failure to the query's reading, so the send
    // synchronises instead, which reports the copy's own result (here, success).
    std::env::set_var("FAKE_NOT_READY_RC", "34");
    host.fill(0);
    read_all(host.addr());
    std::env::remove_var("FAKE_NOT_READY_RC");
    assert!(
        host.to_vec() == data,
        "reads after a query's unknown answer: other bytes"
    );
}
