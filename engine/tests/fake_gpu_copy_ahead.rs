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
mod common;
mod fake_gpu;
mod raw_peer;
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

/// A raw peer's v2 read request of `size` bytes at `addr`.
fn read_header(addr: u64, size: u64) -> [u8; transfer_engine::wire::tcp::HEADER_LEN] {
    transfer_engine::wire::tcp::RequestHeader {
        size,
        addr,
        opcode: OpCode::Read,
        v2: true,
    }
    .encode()
}

/// The next status on a raw peer's connection.
fn read_status(peer: &mut std::net::TcpStream) -> transfer_engine::wire::tcp::Status {
    use std::io::Read;
    let mut s = [0u8; transfer_engine::wire::tcp::STATUS_LEN];
    peer.read_exact(&mut s).unwrap();
    transfer_engine::wire::tcp::Status::decode(&s).unwrap()
}

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
    let copied = stats()[1];
    // SAFETY: `src` is test-owned and outlives the batch (waited for below).
    let batch = unsafe { initiator.submit(&seg, &writes) }.unwrap();
    // The target goes while most of the 64 are queued: once the lane has copied out its
    // first chunk and, ahead, the next request's.
    common::wait_until(
        std::time::Duration::from_secs(10),
        "two chunks copied out of the device",
        || stats()[1] - copied >= 2,
    );
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
    use transfer_engine::wire::tcp::Status;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    install_fake(Vendor::Cuda);
    let target = engine();
    let len = CHUNK;
    let data = pattern(len, 46);
    let dev = device_buffer(0, &data);
    target.register_memory(dev, len as u64, "*").unwrap();
    let half = (len / 2) as u64;
    let mut asks = Vec::new();
    asks.extend_from_slice(&read_header(dev, half));
    asks.extend_from_slice(&read_header(dev + half, len as u64));
    asks.extend_from_slice(&read_header(dev, 4096));
    let before = stats();
    let mut peer = std::net::TcpStream::connect(("127.0.0.1", target.data_port())).unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    peer.write_all(&asks).unwrap();
    assert!(matches!(read_status(&mut peer), Status::Ok));
    let mut first = vec![0u8; half as usize];
    peer.read_exact(&mut first).unwrap();
    assert!(
        first == data[..half as usize],
        "the first read sent other bytes"
    );
    assert!(
        matches!(read_status(&mut peer), Status::AddrRejected),
        "a read past the registered region was not rejected"
    );
    assert!(matches!(read_status(&mut peer), Status::Ok));
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

/// Reads of CHUNK each from a raw target into our device memory, on one lane: the lane has
/// one out, asks for the next once half of the one being received is in (so that a target
/// can copy the next one's first chunk out of its device while it sends the rest), and
/// never has more out than that. The bytes land whole.
#[test]
fn a_lane_asks_for_the_next_read_into_device_memory_when_half_the_last_is_in() {
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::mpsc;
    use std::time::Duration;
    use transfer_engine::wire::tcp::{RequestHeader, Status, HEADER_LEN};
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let initiator = one_lane_initiator();
    let data = TcpListener::bind("127.0.0.1:0").unwrap();
    let remote = 0x7f00_0000_0000u64;
    let (session, _rpc) = raw_peer::serve_descriptor(data.local_addr().unwrap().port(), remote);
    let (events_tx, events) = mpsc::channel::<String>();
    let (go_tx, go) = mpsc::channel::<usize>();
    let bytes_of = move |addr: u64| pattern(CHUNK, (addr - remote) / CHUNK as u64 + 50);
    // The target: reports each request header as it comes; sends what the test says.
    let server = std::thread::spawn(move || {
        let (mut s, _) = data.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut owed: Vec<u8> = Vec::new();
        let mut header = [0u8; HEADER_LEN];
        let mut got = 0;
        loop {
            // Headers as they come, without waiting.
            match s.read(&mut header[got..]) {
                Ok(0) => return,
                Ok(n) => got += n,
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => return,
            }
            if got == HEADER_LEN {
                got = 0;
                let h = RequestHeader::decode(&header).unwrap();
                assert_eq!(h.size, CHUNK as u64);
                owed.extend_from_slice(&Status::Ok.encode());
                owed.extend_from_slice(&bytes_of(h.addr));
                events_tx
                    .send(format!("request {:#x}", h.addr - remote))
                    .unwrap();
            }
            // Bytes to send, as the test says.
            if let Ok(n) = go.try_recv() {
                if n == usize::MAX {
                    return;
                }
                let n = n.min(owed.len());
                s.write_all(&owed[..n]).unwrap();
                owed.drain(..n);
            }
        }
    });
    let back = device_buffer(0, &vec![0u8; 3 * CHUNK]);
    initiator
        .register_memory(back, 3 * CHUNK as u64, "*")
        .unwrap();
    let reads = requests(OpCode::Read, back, remote, 3, CHUNK);
    // SAFETY: `back` is test-owned and outlives the batch (waited for below).
    let batch = unsafe { initiator.submit(&session, &reads) }.unwrap();
    let status = transfer_engine::wire::tcp::STATUS_LEN;
    let next = |within: u64| events.recv_timeout(Duration::from_millis(within)).ok();
    assert_eq!(next(10_000).as_deref(), Some("request 0x0"));
    assert_eq!(
        next(300),
        None,
        "a second read went out with none of the first in"
    );
    // One byte short of half of the first.
    go_tx.send(status + CHUNK / 2 - 1).unwrap();
    assert_eq!(
        next(300),
        None,
        "a second read went out before half of the first was in"
    );
    go_tx.send(1).unwrap();
    assert_eq!(
        next(10_000).as_deref(),
        Some("request 0x200000"),
        "half of the first read is in, and the lane did not ask for the next"
    );
    assert_eq!(
        next(300),
        None,
        "a third read went out with one out and one half in"
    );
    // The rest of the first: the second is the one out now, none of it in.
    go_tx.send(CHUNK - CHUNK / 2).unwrap();
    assert_eq!(
        next(300),
        None,
        "a third read went out with one out and none of it in"
    );
    go_tx.send(status + CHUNK / 2).unwrap();
    assert_eq!(next(10_000).as_deref(), Some("request 0x400000"));
    go_tx.send(usize::MAX - 1).unwrap();
    batch.wait().unwrap();
    go_tx.send(usize::MAX).unwrap();
    server.join().unwrap();
    let mut want = Vec::new();
    for k in 0..3u64 {
        want.extend_from_slice(&bytes_of(remote + k * CHUNK as u64));
    }
    assert!(
        device_bytes(back, 3 * CHUNK) == want,
        "the reads brought other bytes back"
    );
}

/// A raw peer asks for a read of the target's device memory, and for the next one only
/// once the target is partway through sending the first (the peer reads slowly: a small
/// segment size and receive buffer keep the target's socket full). The target still
/// copies the next one's first chunk out of its device while it sends the rest of the
/// first, and both come back whole.
#[test]
fn a_read_asked_for_while_the_one_before_is_sent_is_copied_out_ahead() {
    use std::io::{Read, Write};
    use std::time::Duration;
    use transfer_engine::wire::tcp::Status;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    install_fake(Vendor::Cuda);
    let target = engine();
    let len = 2 * CHUNK;
    let data = pattern(len, 47);
    let dev = device_buffer(0, &data);
    target.register_memory(dev, len as u64, "*").unwrap();
    let read = |addr: u64| read_header(addr, CHUNK as u64);
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    // Before connecting: the target then sends in small segments into a small window, and
    // its send buffer (sized from the segment) fills within the first piece of its chunk.
    sock.set_mss(1000).unwrap();
    sock.set_recv_buffer_size(16 << 10).unwrap();
    let to: std::net::SocketAddr = ([127, 0, 0, 1], target.data_port()).into();
    sock.connect(&to.into()).unwrap();
    let mut peer: std::net::TcpStream = sock.into();
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let before = copy_ahead_counts();
    peer.write_all(&read(dev)).unwrap();
    assert!(matches!(read_status(&mut peer), Status::Ok));
    let mut first = vec![0u8; CHUNK];
    peer.read_exact(&mut first[..4096]).unwrap();
    // The target is partway into the first reply, and stays there until the peer reads
    // on. This pause only lets time pass: the next request comes while the target is
    // stuck in its send, long after it began.
    std::thread::sleep(Duration::from_millis(200));
    peer.write_all(&read(dev + CHUNK as u64)).unwrap();
    // On loopback the header is in the target's socket once `write_all` returns: the
    // target finds it before its next piece, which only our reading lets it send.
    peer.read_exact(&mut first[4096..]).unwrap();
    assert!(first == data[..CHUNK], "the first read sent other bytes");
    assert!(matches!(read_status(&mut peer), Status::Ok));
    let mut second = vec![0u8; CHUNK];
    peer.read_exact(&mut second).unwrap();
    assert!(second == data[CHUNK..], "the second read sent other bytes");
    let after = copy_ahead_counts();
    assert_eq!(after[0] - before[0], 2, "sends out of device memory");
    assert_eq!(
        after[1] - before[1],
        1,
        "the second read, asked for while the first was sent, was not copied out ahead"
    );
}
