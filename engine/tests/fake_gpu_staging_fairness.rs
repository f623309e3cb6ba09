//! A connection streaming writes into device memory keeps its stager across them (so their
//! copies land while the next write comes in) only while no other connection waits for a
//! stager. With a FAKE CUDA runtime (fake_gpu/fake_runtime.c) whose copies take 2 ms at
//! each stream synchronisation, and a budget of one stager. Its own test binary: the
//! budget is per process.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]
mod common;
mod fake_gpu;
mod raw_peer;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use raw_peer::connect_from;
use transfer_engine::device::{staging_pool, Vendor};
use transfer_engine::wire::tcp::{RequestHeader, Status, STATUS_LEN};
use transfer_engine::{Config, HostBuffer, OpCode, Request, TransferEngine};

#[test]
fn a_streaming_connection_gives_its_stager_up_to_one_that_waits() {
    fake_gpu::install_fake(Vendor::Cuda);
    // SAFETY (edition 2021: set_var is safe): read by the fake at each synchronisation;
    // this binary holds only this test.
    std::env::set_var("FAKE_COPY_DELAY_US", "2000");
    let mut config = Config::from_env().unwrap();
    config.tcp_lanes_per_peer = 1;
    config.tcp_caller_conns = 0;
    let initiator = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", config).unwrap();
    // Started last: its budget (one stager) is the process's. A request waits 500 ms at
    // most for a stager.
    let target = TransferEngine::new(
        "127.0.0.1",
        "P2PHANDSHAKE",
        Config {
            tcp_staging_budget: 4 << 20,
            tcp_status_timeout: Duration::from_millis(500),
            ..Config::default()
        },
    )
    .unwrap();
    const ONE: usize = 1 << 20;
    let len = 16 * ONE;
    let dst = fake_gpu::device_buffer(0, &vec![0u8; len]);
    target.register_memory(dst, len as u64, "*").unwrap();
    let src = HostBuffer::new(len);
    src.write_at(0, &fake_gpu::pattern(len, 3)).unwrap();
    initiator
        .register_memory(src.addr(), len as u64, "*")
        .unwrap();

    // 600 writes of 1 MiB on one connection: 1.2 s at least, the server never without
    // the next write's bytes.
    let writes: Vec<Request> = (0..600)
        .map(|i| {
            let at = ((i % 16) * ONE) as u64;
            Request::new(OpCode::Write, src.addr() + at, dst + at, ONE as u64)
        })
        .collect();
    let seg = target.session_id().to_string();
    let landed = fake_gpu::stats()[1];
    // SAFETY: `src` is test-owned and outlives the batch (waited for below).
    let stream = unsafe { initiator.submit(&seg, &writes) }.unwrap();
    let waited = Instant::now();
    while staging_pool::live_stagers() < 1 {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "no stager taken"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The stream under way with its stager kept across writes: three copied into the
    // device (the initiator's memory is host memory: every copy is the target's).
    common::wait_until(
        Duration::from_secs(60),
        "three streamed writes landed",
        || fake_gpu::stats()[1] - landed >= 3,
    );

    // Another peer's write of 4 KiB into device memory is served meanwhile.
    let data_port = SocketAddr::from(([127, 0, 0, 1], target.data_port()));
    let mut other = connect_from("127.0.0.3", data_port);
    let header = RequestHeader {
        size: 4096,
        addr: dst,
        opcode: OpCode::Write,
        v2: true,
    };
    let asked = Instant::now();
    other.write_all(&header.encode()).unwrap();
    other.write_all(&[7u8; 4096]).unwrap();
    other
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut status = [0u8; STATUS_LEN];
    let answered = other.read_exact(&mut status);
    let took = asked.elapsed();
    assert!(
        answered.is_ok(),
        "the other peer's write got no status ({answered:?} after {took:?}): the streaming \
         connection kept the only stager"
    );
    assert!(
        matches!(Status::decode(&status), Ok(Status::Ok)),
        "{status:?}"
    );
    assert!(
        !stream.is_finished(),
        "served only after the stream ended ({took:?}): nothing shows it was shared"
    );
    stream.wait().unwrap();
    assert!(staging_pool::live_stagers() <= 1);
}
