//! Writes out of device memory queued back to back on one lane: each one's first staging
//! chunk is copied out of the device while the one before is sent. The FAKE runtime
//! (fake_gpu/fake_runtime.c) makes copies only when their stream is synchronised, and
//! here slowly: a chunk sent before its copy ran, or another request's chunk sent in its
//! place, shows in the target's bytes; a copy still queued after a call returns would
//! read the caller's memory after the caller got it back.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]
mod fake_gpu;
use fake_gpu::{
    device_buffer, device_bytes, engine, install_fake, pattern, queued, requests, stats,
};
use transfer_engine::device::staging::{copy_ahead_counts, CHUNK};
use transfer_engine::device::Vendor;
use transfer_engine::{HostBuffer, OpCode, Request, TransferEngine};

/// Requests below a chunk, of whole chunks and with ragged tails.
const SIZES: [usize; 9] = [
    2 * CHUNK + 17,
    1,
    CHUNK,
    4096,
    CHUNK - 1,
    3 * CHUNK,
    777,
    CHUNK + 1,
    65536,
];

/// The fake's copy counters and queues are process-wide: one test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The slow-copy fake and an initiator with one lane (and no caller connections), so
/// that every request queues on one connection, uncut.
fn one_lane_initiator() -> TransferEngine {
    install_fake(Vendor::Cuda);
    // SAFETY (edition 2021: set_var is safe): read by the fake at each synchronisation,
    // before any engine thread of this binary starts.
    std::env::set_var("FAKE_COPY_DELAY_US", "300");
    let mut config = transfer_engine::Config::from_env().unwrap();
    config.tcp_lanes_per_peer = 1;
    config.tcp_caller_conns = 0;
    // Requests go whole, not cut in stripes: each is one request on the wire.
    config.tcp_stripe_size = 64 << 20;
    TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", config).unwrap()
}

/// Writes of many sizes (below a chunk, whole chunks, ragged tails) out of device memory,
/// with a write out of host memory and a read into device memory between them, in
/// batches submitted back to back. Every byte lands where it belongs, and no chunk is
/// copied out of the device twice: a chunk copied ahead is the one sent.
#[test]
fn back_to_back_device_writes_send_their_own_bytes_each_chunk_copied_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let initiator = one_lane_initiator();
    let target = engine();
    let sizes = SIZES;
    let total: usize = sizes.iter().sum();
    let data = pattern(total, 41);
    let src = device_buffer(0, &data);
    initiator.register_memory(src, total as u64, "*").unwrap();
    let dst = HostBuffer::new(total);
    target
        .register_memory(dst.addr(), total as u64, "*")
        .unwrap();
    // A read into device memory, and a write out of host memory, between the writes.
    let read_len = CHUNK + 3;
    let read_into = device_buffer(0, &vec![0u8; read_len]);
    initiator
        .register_memory(read_into, read_len as u64, "*")
        .unwrap();
    let host_src = pattern(4096, 42);
    initiator
        .register_memory(host_src.as_ptr() as u64, 4096, "*")
        .unwrap();
    let host_dst = HostBuffer::new(4096);
    target.register_memory(host_dst.addr(), 4096, "*").unwrap();
    let seg = target.session_id().to_string();

    let mut writes = Vec::new();
    let mut at = 0;
    for &len in &sizes {
        writes.push(Request {
            op: OpCode::Write,
            local: src + at as u64,
            remote: dst.addr() + at as u64,
            len: len as u64,
        });
        at += len;
    }
    let (first, rest) = writes.split_at(4);
    let mut batch_one = first.to_vec();
    batch_one.insert(
        2,
        Request {
            op: OpCode::Read,
            local: read_into,
            remote: dst.addr(),
            len: read_len as u64,
        },
    );
    let mut batch_two = rest.to_vec();
    batch_two.insert(
        1,
        Request {
            op: OpCode::Write,
            local: host_src.as_ptr() as u64,
            remote: host_dst.addr(),
            len: 4096,
        },
    );
    // The read may come before or after the writes into the bytes it reads: it is
    // checked against the bytes it found, below.
    let before = stats();
    // SAFETY: every local buffer is test-owned and outlives both batches (both waited for).
    let one = unsafe { initiator.submit(&seg, &batch_one) }.unwrap();
    // SAFETY: as above.
    let two = unsafe { initiator.submit(&seg, &batch_two) }.unwrap();
    one.wait().unwrap();
    two.wait().unwrap();
    let after = stats();

    let landed = dst.to_vec();
    let wrong = landed.iter().zip(&data).position(|(a, b)| a != b);
    assert_eq!(
        wrong, None,
        "byte {wrong:?} of the device writes landed wrong"
    );
    assert_eq!(host_dst.to_vec(), host_src, "the host write landed wrong");
    let read = device_bytes(read_into, read_len);
    assert!(
        read.iter().all(|&b| b == 0) || read == data[..read_len],
        "the read into device memory returned neither the bytes before nor after the writes"
    );
    let chunks: usize =
        sizes.iter().map(|l| l.div_ceil(CHUNK)).sum::<usize>() + read_len.div_ceil(CHUNK);
    assert_eq!(
        (after[1] - before[1]) as usize,
        chunks,
        "async copies: one per staging chunk of the device writes and of the read"
    );
    assert_eq!(
        queued(),
        0,
        "copies still queued after both batches were done"
    );
}

/// Many device writes on one lane to a target that goes away partway: the batch fails,
/// and once the call has returned no copy out of the caller's device memory is still
/// queued (a first chunk copied ahead for a request never sent included).
#[test]
fn no_copy_out_of_device_memory_outlives_a_failed_batch() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let initiator = one_lane_initiator();
    let target = engine();
    const N: usize = 64;
    let len = N * CHUNK;
    let src = device_buffer(0, &pattern(len, 43));
    initiator.register_memory(src, len as u64, "*").unwrap();
    let dst = HostBuffer::new(len);
    target.register_memory(dst.addr(), len as u64, "*").unwrap();
    let seg = target.session_id().to_string();
    let writes = requests(OpCode::Write, src, dst.addr(), N, CHUNK);
    // SAFETY: `src` is test-owned and outlives the batch (waited for below).
    let batch = unsafe { initiator.submit(&seg, &writes) }.unwrap();
    // 64 chunks at 0.3 ms a copy and more: the target goes while most are queued.
    std::thread::sleep(std::time::Duration::from_millis(5));
    drop(target);
    let result = batch.wait();
    assert!(
        result.is_err(),
        "a batch whose target went away partway reported success"
    );
    assert_eq!(
        queued(),
        0,
        "a copy out of the caller's device memory is still queued after the call returned"
    );
}

/// The target's side: reads of its device memory, pipelined on one connection, of many
/// sizes, with a read of its host memory among them. While the data server sends one, it
/// copies the first chunk of the next (already here) out of the device. Every byte comes
/// back from where it was asked for, and no chunk is copied out twice.
#[test]
fn back_to_back_reads_out_of_device_memory_send_their_own_bytes_each_chunk_copied_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let initiator = one_lane_initiator();
    let target = engine();
    let sizes = SIZES;
    let total: usize = sizes.iter().sum();
    let data = pattern(total, 44);
    let src = device_buffer(1, &data);
    target.register_memory(src, total as u64, "*").unwrap();
    let host_data = pattern(4096, 45);
    target
        .register_memory(host_data.as_ptr() as u64, 4096, "*")
        .unwrap();
    let back = HostBuffer::new(total + 4096);
    initiator
        .register_memory(back.addr(), (total + 4096) as u64, "*")
        .unwrap();
    let seg = target.session_id().to_string();
    let mut reads = Vec::new();
    let mut at = 0;
    for &len in &sizes {
        reads.push(Request {
            op: OpCode::Read,
            local: back.addr() + at as u64,
            remote: src + at as u64,
            len: len as u64,
        });
        at += len;
    }
    reads.insert(
        3,
        Request {
            op: OpCode::Read,
            local: back.addr() + total as u64,
            remote: host_data.as_ptr() as u64,
            len: 4096,
        },
    );
    let (first, rest) = reads.split_at(5);
    let before = stats();
    // SAFETY: `back` is test-owned and outlives both batches (both waited for).
    let one = unsafe { initiator.submit(&seg, first) }.unwrap();
    // SAFETY: as above.
    let two = unsafe { initiator.submit(&seg, rest) }.unwrap();
    one.wait().unwrap();
    two.wait().unwrap();
    let after = stats();
    let got = back.to_vec();
    let wrong = got[..total].iter().zip(&data).position(|(a, b)| a != b);
    assert_eq!(
        wrong, None,
        "byte {wrong:?} of the device reads came back wrong"
    );
    assert_eq!(
        &got[total..],
        &host_data[..],
        "the host read came back wrong"
    );
    let chunks: usize = sizes.iter().map(|l| l.div_ceil(CHUNK)).sum();
    assert_eq!(
        (after[1] - before[1]) as usize,
        chunks,
        "async copies: one per staging chunk of the device reads"
    );
    assert_eq!(
        queued(),
        0,
        "copies still queued after both batches were done"
    );
}

/// A raw peer pipelines three reads of the target's device memory: a valid one, one that
/// runs past the end of the registered region, and a valid one. The server copies ahead
/// only what it may read: the second is rejected and never copied (a copy of it would read
/// past the region), so the device sees one copy for each valid read and no more.
#[test]
fn a_raw_peer_cannot_make_the_server_copy_ahead_outside_registered_device_memory() {
    use std::io::{Read, Write};
    use std::time::Duration;
    use transfer_engine::wire::tcp::{RequestHeader, Status, STATUS_LEN};
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    install_fake(Vendor::Cuda);
    let target = engine();
    let len = CHUNK;
    let data = pattern(len, 46);
    let dev = device_buffer(0, &data);
    target.register_memory(dev, len as u64, "*").unwrap();
    let read = |addr: u64, size: u64| {
        RequestHeader {
            size,
            addr,
            opcode: OpCode::Read,
            v2: true,
        }
        .encode()
    };
    let half = (len / 2) as u64;
    let mut asks = Vec::new();
    asks.extend_from_slice(&read(dev, half));
    asks.extend_from_slice(&read(dev + half, len as u64));
    asks.extend_from_slice(&read(dev, 4096));
    let before = stats();
    let mut peer = std::net::TcpStream::connect(("127.0.0.1", target.data_port())).unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    peer.write_all(&asks).unwrap();
    let status = |peer: &mut std::net::TcpStream| {
        let mut s = [0u8; STATUS_LEN];
        peer.read_exact(&mut s).unwrap();
        Status::decode(&s).unwrap()
    };
    assert!(matches!(status(&mut peer), Status::Ok));
    let mut first = vec![0u8; half as usize];
    peer.read_exact(&mut first).unwrap();
    assert!(
        first == data[..half as usize],
        "the first read sent other bytes"
    );
    assert!(
        matches!(status(&mut peer), Status::AddrRejected),
        "a read past the registered region was not rejected"
    );
    assert!(matches!(status(&mut peer), Status::Ok));
    let mut third = vec![0u8; 4096];
    peer.read_exact(&mut third).unwrap();
    assert!(third == data[..4096], "the third read sent other bytes");
    let after = stats();
    assert_eq!(
        after[1] - before[1],
        2,
        "async copies: one for each valid read, none for the rejected one"
    );
}

/// Batches of reads from the target's device memory into ours, one staging chunk each: a
/// lane keeps one read into device memory out at a time (two when it reads into host
/// memory), asking for the next once the last is off its socket. So while the target's
/// data server sends one, the next has not come, and none is copied out of the device
/// ahead; with two out, 38-49% of them were (session 14). The bytes still come back whole.
#[test]
fn a_lane_keeps_one_read_into_device_memory_out_at_a_time() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    install_fake(Vendor::Cuda);
    // SAFETY (edition 2021: set_var is safe): as in `one_lane_initiator`, which other
    // tests of this binary may run first.
    std::env::set_var("FAKE_COPY_DELAY_US", "300");
    let mut config = transfer_engine::Config::from_env().unwrap();
    config.tcp_lanes_per_peer = 2;
    config.tcp_lane_budget = 2;
    let initiator = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", config).unwrap();
    let target = engine();
    const N: usize = 64;
    const BATCHES: u64 = 3;
    let len = N * CHUNK;
    let data = pattern(len, 46);
    let src = device_buffer(0, &data);
    target.register_memory(src, len as u64, "*").unwrap();
    let back = device_buffer(0, &vec![0u8; len]);
    initiator.register_memory(back, len as u64, "*").unwrap();
    let seg = target.session_id().to_string();
    let reads = requests(OpCode::Read, back, src, N, CHUNK);
    let before = copy_ahead_counts();
    for _ in 0..BATCHES {
        // SAFETY: `back` is test-owned and outlives the batch (waited for).
        unsafe { initiator.submit(&seg, &reads) }
            .unwrap()
            .wait()
            .unwrap();
    }
    let after = copy_ahead_counts();
    assert!(
        device_bytes(back, len) == data,
        "the reads brought other bytes back"
    );
    let (sends, ahead) = (after[0] - before[0], after[1] - before[1]);
    assert_eq!(sends, BATCHES * N as u64, "sends out of device memory");
    assert_eq!(
        ahead, 0,
        "{ahead} of {sends} reads found the next read's request already there: a lane had more than one out"
    );
}
