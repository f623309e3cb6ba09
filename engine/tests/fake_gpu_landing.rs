//! Writes into device memory that land while the next write is received: a status never
//! goes out before its bytes have landed. The FAKE runtime (fake_gpu/fake_runtime.c)
//! makes copies when their stream is synchronised, and here takes 3 ms to do so: a write
//! reported done too early is caught by the bytes read right after the call returns.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]
mod fake_gpu;
use fake_gpu::{device_buffer, device_bytes, engine, install_fake, pattern, requests};
use transfer_engine::device::Vendor;
use transfer_engine::{HostBuffer, OpCode, Request};

#[test]
fn pipelined_writes_into_device_memory_are_done_only_once_landed() {
    install_fake(Vendor::Cuda);
    // SAFETY (edition 2021: set_var is safe): read by the fake at each synchronisation;
    // this binary holds only this test.
    std::env::set_var("FAKE_COPY_DELAY_US", "3000");
    let initiator = engine();
    let target = engine();
    // Many requests of one staging chunk or a few (host memory is cut in 1 MiB
    // stripes), pipelined on each connection, and a ragged tail.
    let len = (12 << 20) + 4097;
    let dst = device_buffer(1, &vec![0u8; len]);
    target.register_memory(dst, len as u64, "*").unwrap();
    let seg = target.session_id().to_string();
    for round in 0..3u64 {
        let mut data = pattern(len, round + 11);
        initiator
            .register_memory(data.as_mut_ptr() as u64, len as u64, "*")
            .unwrap();
        // Three requests: two large ones, cut into stripes, and a small one.
        let cut = [0, 5 << 20, len - 4097, len];
        let reqs: Vec<Request> = cut
            .windows(2)
            .map(|w| Request {
                op: OpCode::Write,
                local: data.as_ptr() as u64 + w[0] as u64,
                remote: dst + w[0] as u64,
                len: (w[1] - w[0]) as u64,
            })
            .collect();
        // SAFETY: `data` is test-owned and outlives the call.
        unsafe { initiator.transfer_sync(&seg, &reqs) }.unwrap();
        let landed = device_bytes(dst, len);
        let wrong = landed.iter().zip(&data).position(|(a, b)| a != b);
        assert_eq!(
            wrong, None,
            "round {round}: the write was reported done before byte {wrong:?} landed"
        );
        // Read back through the same connections: a read of device memory comes after
        // the writes before it have landed.
        let mut back = vec![0u8; len];
        let r = Request {
            op: OpCode::Read,
            local: back.as_mut_ptr() as u64,
            remote: dst,
            len: len as u64,
        };
        // SAFETY: `back` is test-owned and outlives the call.
        unsafe { initiator.transfer_sync(&seg, &[r]) }.unwrap();
        assert!(back == data, "round {round}: read back other bytes");
        initiator.unregister_memory(data.as_ptr() as u64).unwrap();
    }
    target.unregister_memory(dst).unwrap();
}

/// The slow-copy fake, an initiator with one lane (and no caller connections), so that
/// its batches queue on one connection, and a target.
fn one_lane_pair() -> (
    transfer_engine::TransferEngine,
    transfer_engine::TransferEngine,
) {
    install_fake(Vendor::Cuda);
    std::env::set_var("FAKE_COPY_DELAY_US", "3000");
    let mut config = transfer_engine::Config::from_env().unwrap();
    config.tcp_lanes_per_peer = 1;
    config.tcp_caller_conns = 0;
    let initiator =
        transfer_engine::TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", config).unwrap();
    (initiator, engine())
}

/// One lane, and batches of one 1 MiB write each submitted back to back: they queue on
/// one connection, so each write's copies are still running while the next one is
/// received. Each batch, once done, must find its own bytes in place, while the batches
/// after it are still in flight.
#[test]
fn each_pipelined_write_is_done_only_once_its_own_bytes_landed() {
    let (initiator, target) = one_lane_pair();
    const N: usize = 12;
    const ONE: usize = 1 << 20;
    let dst = device_buffer(0, &vec![0u8; N * ONE]);
    target.register_memory(dst, (N * ONE) as u64, "*").unwrap();
    let seg = target.session_id().to_string();
    let data = pattern(N * ONE, 21);
    initiator
        .register_memory(data.as_ptr() as u64, (N * ONE) as u64, "*")
        .unwrap();
    let batches: Vec<_> = (0..N)
        .map(|i| {
            let w = Request {
                op: OpCode::Write,
                local: data.as_ptr() as u64 + (i * ONE) as u64,
                remote: dst + (i * ONE) as u64,
                len: ONE as u64,
            };
            // SAFETY: `data` is test-owned and outlives every batch (all are waited for).
            unsafe { initiator.submit(&seg, &[w]) }.unwrap()
        })
        .collect();
    let mut early = Vec::new();
    for (i, b) in batches.iter().enumerate() {
        b.wait().unwrap();
        let at = dst + (i * ONE) as u64;
        if device_bytes(at, ONE) != data[i * ONE..(i + 1) * ONE] {
            early.push(i);
        }
    }
    assert!(
        early.is_empty(),
        "writes reported done before they landed: {early:?}"
    );
    initiator.unregister_memory(data.as_ptr() as u64).unwrap();
    target.unregister_memory(dst).unwrap();
}

/// The same for reads into device memory: batches of one 1 MiB read each, submitted
/// back to back on one lane, their replies received one after another by one thread.
/// Each batch, once done, must find its own bytes in place.
#[test]
fn each_pipelined_read_into_device_memory_is_done_only_once_its_bytes_landed() {
    let (initiator, target) = one_lane_pair();
    const N: usize = 12;
    const ONE: usize = 1 << 20;
    let data = pattern(N * ONE, 33);
    target
        .register_memory(data.as_ptr() as u64, (N * ONE) as u64, "*")
        .unwrap();
    let seg = target.session_id().to_string();
    let dst = device_buffer(1, &vec![0u8; N * ONE]);
    initiator
        .register_memory(dst, (N * ONE) as u64, "*")
        .unwrap();
    let batches: Vec<_> = (0..N)
        .map(|i| {
            let r = Request {
                op: OpCode::Read,
                local: dst + (i * ONE) as u64,
                remote: data.as_ptr() as u64 + (i * ONE) as u64,
                len: ONE as u64,
            };
            // SAFETY: `dst` is test-owned and outlives every batch (all are waited for).
            unsafe { initiator.submit(&seg, &[r]) }.unwrap()
        })
        .collect();
    let mut early = Vec::new();
    for (i, b) in batches.iter().enumerate() {
        b.wait().unwrap();
        if device_bytes(dst + (i * ONE) as u64, ONE) != data[i * ONE..(i + 1) * ONE] {
            early.push(i);
        }
    }
    assert!(
        early.is_empty(),
        "reads reported done before they landed: {early:?}"
    );
    initiator.unregister_memory(dst).unwrap();
    target.unregister_memory(data.as_ptr() as u64).unwrap();
}

/// A peer that pipelines two small writes into host memory and a small write into device
/// memory, sends only part of the last one's payload, and waits for the first two statuses
/// before it sends the rest: statuses held back go out before the server waits for the
/// peer's bytes of a write into device memory, as before any wait.
#[test]
fn held_statuses_go_out_before_a_device_write_waits_for_its_payload() {
    use std::io::{Read, Write};
    use std::time::Duration;
    use transfer_engine::wire::tcp::{RequestHeader, Status, STATUS_LEN};
    install_fake(Vendor::Cuda);
    let mut config = transfer_engine::Config::from_env().unwrap();
    config.tcp_status_timeout = Duration::from_secs(5);
    let target = transfer_engine::TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", config).unwrap();
    let host = transfer_engine::HostBuffer::new(1 << 20);
    target.register_memory(host.addr(), 1 << 20, "*").unwrap();
    let dev_len = 64 << 10;
    let dev = device_buffer(0, &vec![0u8; dev_len]);
    target.register_memory(dev, dev_len as u64, "*").unwrap();
    let header = |addr: u64, size: u64| {
        RequestHeader {
            size,
            addr,
            opcode: OpCode::Write,
            v2: true,
        }
        .encode()
    };
    let payload = pattern(8192, 9);
    let mut first = Vec::new();
    for i in 0..2u64 {
        first.extend_from_slice(&header(host.addr() + i * 4096, 4096));
        first.extend_from_slice(&[i as u8 + 1; 4096]);
    }
    first.extend_from_slice(&header(dev, 8192));
    first.extend_from_slice(&payload[..4096]);
    let mut peer = std::net::TcpStream::connect(("127.0.0.1", target.data_port())).unwrap();
    peer.set_nodelay(true).unwrap();
    peer.write_all(&first).unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut two = [0u8; 2 * STATUS_LEN];
    peer.read_exact(&mut two).unwrap_or_else(|e| {
        panic!("the statuses of the two host writes did not come before the rest was sent: {e}")
    });
    for s in two.chunks_exact(STATUS_LEN) {
        let s: [u8; STATUS_LEN] = s.try_into().unwrap();
        assert!(matches!(Status::decode(&s), Ok(Status::Ok)), "{s:?}");
    }
    peer.write_all(&payload[4096..]).unwrap();
    let mut last = [0u8; STATUS_LEN];
    peer.read_exact(&mut last).unwrap();
    assert!(matches!(Status::decode(&last), Ok(Status::Ok)));
    assert!(device_bytes(dev, 8192) == payload, "wrong bytes landed");
    assert!(host.to_vec()[..8192] == [[1u8; 4096], [2u8; 4096]].concat());
}

/// Reads into device memory that the target rejects (addresses it never registered), two
/// at a time on one lane, then a read it accepts: the rejected ones are answered with an
/// error and leave nothing owed on the connection, so the lane goes on to the next batch
/// (it used to count them owed for ever, and wait for them before sending more).
#[test]
fn rejected_reads_into_device_memory_leave_the_lane_free() {
    let (initiator, target) = one_lane_pair();
    const ONE: usize = 1 << 20;
    let data = pattern(ONE, 55);
    target
        .register_memory(data.as_ptr() as u64, ONE as u64, "*")
        .unwrap();
    let seg = target.session_id().to_string();
    let dst = device_buffer(0, &vec![0u8; 2 * ONE]);
    initiator
        .register_memory(dst, (2 * ONE) as u64, "*")
        .unwrap();
    // Registered when the initiator first looks the target up, then unregistered: the
    // initiator's copy of the target's buffers still lists it, so the reads go out and
    // the target's data server rejects them.
    let unregistered = HostBuffer::new(2 * ONE);
    target
        .register_memory(unregistered.addr(), (2 * ONE) as u64, "*")
        .unwrap();
    let warm = Request {
        op: OpCode::Read,
        local: dst,
        remote: unregistered.addr(),
        len: 4096,
    };
    // SAFETY: `dst` is test-owned and outlives the call.
    unsafe { initiator.transfer_sync(&seg, &[warm]) }.unwrap();
    target.unregister_memory(unregistered.addr()).unwrap();
    for round in 0..3 {
        let rejected = requests(OpCode::Read, dst, unregistered.addr(), 2, ONE);
        // SAFETY: `dst` is test-owned and outlives the call.
        let result = unsafe { initiator.transfer_sync(&seg, &rejected) };
        assert!(
            result.is_err(),
            "round {round}: reads of memory the target never registered succeeded"
        );
    }
    // On a thread of its own, so that a read that never completes fails the test rather
    // than hanging it.
    let initiator = std::sync::Arc::new(initiator);
    let (tx, rx) = std::sync::mpsc::channel();
    let (engine, src) = (initiator.clone(), data.as_ptr() as u64);
    std::thread::spawn(move || {
        let r = Request {
            op: OpCode::Read,
            local: dst,
            remote: src,
            len: ONE as u64,
        };
        // SAFETY: `dst` and `data` are test-owned; the test waits for this call or fails.
        let _ = tx.send(unsafe { engine.transfer_sync(&seg, &[r]) });
    });
    let done = rx.recv_timeout(std::time::Duration::from_secs(20));
    assert!(
        matches!(done, Ok(Ok(_))),
        "a read after rejected ones did not complete within 20 s: {done:?}"
    );
    assert!(
        device_bytes(dst, ONE) == data,
        "the accepted read landed other bytes"
    );
}
