//! The data server stages device memory within MC_TCP_STAGING_BUDGET_MB,
//! with a FAKE CUDA runtime (see fake_gpu/fake_runtime.c) that counts the
//! pinned host allocations alive. Its own test binary: the count is per process.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]
mod fake_gpu;
mod raw_peer;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use raw_peer::{connect_from, dribble, wait_closed};
use transfer_engine::device::{staging_pool, Vendor};
use transfer_engine::wire::tcp::RequestHeader;
use transfer_engine::{Config, HostBuffer, OpCode, Request, TransferEngine};

fn write_header(to: u64, len: u64) -> [u8; 24] {
    RequestHeader {
        size: len,
        addr: to,
        opcode: OpCode::Write,
        v2: true,
    }
    .encode()
}

#[test]
fn device_staging_stays_within_its_budget() {
    fake_gpu::install_fake(Vendor::Cuda);
    // The budget is per process and the last engine started sets it: start
    // the initiator first, then the target with one stager's worth (4 MiB).
    let initiator = fake_gpu::engine();
    let io_timeout = Duration::from_secs(4);
    let target = TransferEngine::new(
        "127.0.0.1",
        "P2PHANDSHAKE",
        Config {
            tcp_staging_budget: 4 << 20,
            tcp_status_timeout: io_timeout,
            ..Config::default()
        },
    )
    .unwrap();
    let len = 16 << 20;
    let dst = fake_gpu::device_buffer(0, &vec![0u8; len]);
    target.register_memory(dst, len as u64, "*").unwrap();
    let data_port = SocketAddr::from(([127, 0, 0, 1], target.data_port()));

    // A hostile peer starts a 2 MiB write into device memory and dribbles
    // it a byte at a time, holding the only stager.
    let stop = Arc::new(AtomicBool::new(false));
    let hog = connect_from("127.0.0.2", data_port);
    let dribbler = dribble(
        hog.try_clone().unwrap(),
        write_header(dst, 2 << 20).to_vec(),
        stop.clone(),
    );
    let waited = Instant::now();
    while staging_pool::live_stagers() < 1 {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "no stager taken"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    // A second request for device memory waits for a stager, up to the I/O
    // timeout, then its connection is closed.
    let started = Instant::now();
    let mut starved = connect_from("127.0.0.3", data_port);
    starved.write_all(&write_header(dst, 4096)).unwrap();
    wait_closed(&mut starved, Duration::from_secs(60));
    assert!(started.elapsed() >= io_timeout, "{:?}", started.elapsed());
    assert_eq!(staging_pool::live_stagers(), 1);

    // The hostile peer goes; a legitimate engine writes 16 MiB into device
    // memory on several connections at once, all staged through one stager.
    stop.store(true, Ordering::Release);
    dribbler.join().unwrap();
    drop(hog);
    let data = fake_gpu::pattern(len, 12);
    let src = HostBuffer::new(len);
    src.write_at(0, &data).unwrap();
    let seg = target.session_id().to_string();
    let w = Request::new(OpCode::Write, src.addr(), dst, len as u64);
    // SAFETY: every local buffer of the request is test-owned and outlives the call.
    unsafe { initiator.transfer_sync(&seg, &[w]) }.unwrap();
    assert!(
        fake_gpu::device_bytes(dst, len) == data,
        "wrong bytes landed"
    );
    let back = HostBuffer::new(len);
    let r = Request::new(OpCode::Read, back.addr(), dst, len as u64);
    // SAFETY: every local buffer of the request is test-owned and outlives the call.
    unsafe { initiator.transfer_sync(&seg, &[r]) }.unwrap();
    assert!(back.to_vec() == data, "wrong bytes read back");

    // Never more than one stager's two pinned chunks at once.
    assert!(staging_pool::live_stagers() <= 1);
    let [_, peak] = fake_gpu::pinned();
    assert!(peak <= 2, "{peak} pinned chunks alive at once");
}
