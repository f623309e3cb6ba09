//! Two engines in two processes over loopback TCP, bytes verified.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod common;

use std::time::{Duration, Instant};

use common::{engine, fnv, pattern, wait_for, Buf, Peer, GUARD, GUARD_FILL};
use transfer_engine::{OpCode, Request, TaskStatus, TransferError};

#[test]
fn data_moves_both_ways_with_bytes_verified() {
    let len = 8 << 20;
    let mut peer = Peer::spawn(len, 7);
    let e = engine();
    let local = Buf::new(len as usize);

    // Read the peer's original pattern: one large request (striped) and small ones.
    let reqs = [
        Request::new(OpCode::Read, local.addr(), peer.addr, 6 << 20),
        Request::new(
            OpCode::Read,
            local.addr() + (6 << 20),
            peer.addr + (6 << 20),
            1,
        ),
        Request::new(
            OpCode::Read,
            local.addr() + (6 << 20) + 1,
            peer.addr + (6 << 20) + 1,
            (2 << 20) - 1,
        ),
    ];
    // SAFETY: `local` outlives the synchronous call; nothing else touches it meanwhile.
    unsafe { e.transfer_sync(&peer.session, &reqs) }.unwrap();
    assert!(
        local.to_vec() == pattern(len as usize, 7),
        "read bytes differ"
    );

    // Write a new pattern and check the peer holds it.
    let data = pattern(len as usize, 99);
    local.write_at(0, &data).unwrap();
    // SAFETY: `local` outlives the synchronous call; nothing else touches it meanwhile.
    unsafe {
        e.transfer_sync(
            &peer.session,
            &[Request::new(OpCode::Write, local.addr(), peer.addr, len)],
        )
    }
    .unwrap();
    assert_eq!(peer.hash(peer.addr, len), fnv(&data));

    // And read it back into a cleared buffer.
    local.fill(0);
    // SAFETY: `local` outlives the synchronous call; nothing else touches it meanwhile.
    unsafe {
        e.transfer_sync(
            &peer.session,
            &[Request::new(OpCode::Read, local.addr(), peer.addr, len)],
        )
    }
    .unwrap();
    assert!(local.to_vec() == data);
    assert_eq!(
        peer.hash(peer.addr - GUARD, GUARD),
        fnv(&vec![GUARD_FILL; GUARD as usize])
    );
}

#[test]
fn unregistered_and_out_of_bounds_addresses_are_rejected_and_untouched() {
    let len = 1 << 20;
    let mut peer = Peer::spawn(len, 3);
    let e = engine();
    let local = Buf::new(2 << 20);
    let before = peer.hash(peer.addr - GUARD, len + 2 * GUARD);
    let reqs = [
        Request::new(OpCode::Write, local.addr(), peer.addr - GUARD, 4096), // unregistered guard zone
        Request::new(OpCode::Write, local.addr(), peer.addr + len - 10, 4096), // crosses the end
        Request::new(OpCode::Write, local.addr(), peer.addr - 1, 2),        // crosses the start
        Request::new(OpCode::Read, local.addr(), peer.addr + len, 1),       // just past the end
        Request::new(OpCode::Write, local.addr(), peer.addr, 0), // zero length: nothing to do
        Request::new(OpCode::Write, local.addr(), 0x10, 16),     // far away
    ];
    // SAFETY: `local` outlives the batch, which is waited for below.
    let batch = unsafe { e.submit(&peer.session, &reqs) }.unwrap();
    assert!(batch.wait_until(Instant::now() + Duration::from_secs(10)));
    for i in [0, 1, 2, 3, 5] {
        assert!(
            matches!(
                batch.task(i),
                Some(TaskStatus::Failed(TransferError::AddressRejected { .. }))
            ),
            "request {i}: {:?}",
            batch.task(i)
        );
    }
    assert_eq!(batch.task(4), Some(TaskStatus::Completed));
    assert_eq!(
        peer.hash(peer.addr - GUARD, len + 2 * GUARD),
        before,
        "peer memory changed"
    );
}

#[test]
fn server_rejects_unregistered_ranges_itself() {
    // A raw v2 client, bypassing our initiator's own descriptor check.
    use std::io::{Read, Write};
    use transfer_engine::wire::tcp::{RequestHeader, Status};
    let len = 1 << 16;
    let mut peer = Peer::spawn(len, 5);
    let before = peer.hash(peer.addr - GUARD, len + 2 * GUARD);
    let desc = transfer_engine::metadata::MetadataStore::fetch(
        &transfer_engine::metadata::P2pStore::new(Default::default()),
        &transfer_engine::wire::session::SegmentId::parse(&peer.session, 12001).unwrap(),
    )
    .unwrap();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", desc.tcp_data_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let bad = RequestHeader {
        size: 100,
        addr: peer.addr + len - 50,
        opcode: OpCode::Write,
        v2: true,
    };
    s.write_all(&bad.encode()).unwrap();
    s.write_all(&[0xEE; 100]).unwrap();
    let mut st = [0u8; 8];
    s.read_exact(&mut st).unwrap();
    assert_eq!(Status::decode(&st).unwrap(), Status::AddrRejected);
    // The connection stays usable: a valid read on it still works.
    let good = RequestHeader {
        size: 16,
        addr: peer.addr,
        opcode: OpCode::Read,
        v2: true,
    };
    s.write_all(&good.encode()).unwrap();
    s.read_exact(&mut st).unwrap();
    assert_eq!(Status::decode(&st).unwrap(), Status::Ok);
    let mut data = [0u8; 16];
    s.read_exact(&mut data).unwrap();
    assert_eq!(&data[..], &pattern(len as usize, 5)[..16]);
    assert_eq!(peer.hash(peer.addr - GUARD, len + 2 * GUARD), before);
}

#[test]
fn server_serves_upstream_style_clients() {
    // Upstream 0.3.12 clients: a new connection per request, payload in 64 KiB chunks.
    use std::io::{Read, Write};
    use transfer_engine::wire::tcp::{RequestHeader, Status};
    let len = 1 << 20;
    let mut peer = Peer::spawn(len, 8);
    let desc = transfer_engine::metadata::MetadataStore::fetch(
        &transfer_engine::metadata::P2pStore::new(Default::default()),
        &transfer_engine::wire::session::SegmentId::parse(&peer.session, 12001).unwrap(),
    )
    .unwrap();
    let data = pattern(len as usize, 77);
    for v2 in [true, false] {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", desc.tcp_data_port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let h = RequestHeader {
            size: len,
            addr: peer.addr,
            opcode: OpCode::Write,
            v2,
        };
        s.write_all(&h.encode()).unwrap();
        for chunk in data.chunks(64 << 10) {
            s.write_all(chunk).unwrap();
        }
        if v2 {
            let mut st = [0u8; 8];
            s.read_exact(&mut st).unwrap();
            assert_eq!(Status::decode(&st).unwrap(), Status::Ok);
        }
        drop(s);
        // A fresh connection reads it back.
        let mut s = std::net::TcpStream::connect(("127.0.0.1", desc.tcp_data_port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(
            &RequestHeader {
                opcode: OpCode::Read,
                ..h
            }
            .encode(),
        )
        .unwrap();
        if v2 {
            let mut st = [0u8; 8];
            s.read_exact(&mut st).unwrap();
            assert_eq!(Status::decode(&st).unwrap(), Status::Ok);
        }
        let mut back = vec![0u8; len as usize];
        s.read_exact(&mut back).unwrap();
        assert!(back == data, "v2={v2}");
    }
    assert_eq!(peer.hash(peer.addr, len), fnv(&data));
}

#[test]
fn a_peer_dying_mid_batch_fails_the_batch_quickly() {
    let len = 64 << 20;
    let mut peer = Peer::spawn(len, 1);
    let e = engine();
    let local = Buf::new(len as usize);
    let reqs: Vec<Request> = (0..4096)
        .map(|i| {
            let off = (i % 16) * (4 << 20);
            Request::new(OpCode::Write, local.addr() + off, peer.addr + off, 4 << 20)
        })
        .collect(); // 16 GiB in total: far more than moves before the kill
    let started = Instant::now();
    // SAFETY: `local` and the peer's region outlive the batch, which is waited for below.
    let batch = unsafe { e.submit(&peer.session, &reqs) }.unwrap();
    // Kill the peer once the batch is under way (a request acknowledged, the rest to come),
    // whatever the machine's speed: the peer's acknowledgement is the signal, not a delay.
    let under_way = wait_for(Duration::from_secs(60), || {
        (0..reqs.len()).any(|i| batch.task(i) == Some(TaskStatus::Completed))
    });
    assert!(under_way, "no request of the batch completed within 60 s");
    let pending = (0..reqs.len())
        .filter(|&i| batch.task(i) == Some(TaskStatus::Pending))
        .count();
    assert!(pending > 0, "the whole batch finished before the kill");
    peer.child.kill().unwrap();
    let result = batch.wait();
    let took = started.elapsed();
    match result {
        Err(TransferError::PeerLost { .. } | TransferError::PeerUnreachable { .. }) => {}
        other => panic!("expected a peer failure, got {other:?}"),
    }
    assert!(took < Duration::from_secs(15), "took {took:?}");
    // A later submit to the dead peer fails fast too.
    let t = Instant::now();
    // SAFETY: `local` outlives the synchronous call.
    assert!(unsafe { e.transfer_sync(&peer.session, &reqs[..1]) }.is_err());
    assert!(t.elapsed() < Duration::from_secs(10));
}

#[test]
fn sixteen_threads_share_one_peer() {
    let per_thread = 256 << 10;
    let len = 16 * per_thread;
    let mut peer = Peer::spawn(len, 11);
    let e = engine();
    let session = peer.session.clone();
    let (peer_addr, e_ref) = (peer.addr, &e);
    std::thread::scope(|s| {
        for t in 0..16u64 {
            let session = session.clone();
            s.spawn(move || {
                let buf = Buf::new(per_thread as usize);
                let remote = peer_addr + t * per_thread;
                for round in 0..20u64 {
                    let data = pattern(per_thread as usize, t * 1000 + round);
                    buf.write_at(0, &data).unwrap();
                    let chunk = per_thread / 8;
                    let writes: Vec<Request> = (0..8)
                        .map(|k| {
                            Request::new(
                                OpCode::Write,
                                buf.addr() + k * chunk,
                                remote + k * chunk,
                                chunk,
                            )
                        })
                        .collect();
                    // SAFETY: `buf` is this thread's own and outlives the synchronous call.
                    unsafe { e_ref.transfer_sync(&session, &writes) }.unwrap();
                    buf.fill(0);
                    let reads = as_reads(&writes);
                    // SAFETY: `buf` is this thread's own and outlives the synchronous call.
                    unsafe { e_ref.transfer_sync(&session, &reads) }.unwrap();
                    assert!(buf.to_vec() == data, "thread {t} round {round}");
                }
            });
        }
    });
    let _ = peer.hash(peer.addr, 1);
}

/// Written, then read back into cleared memory: the reads go out in groups over every
/// lane, each lane reading its group's replies itself while the rest is queued, so every
/// reply must land at its own request's place.
#[test]
fn a_batch_of_ten_thousand_requests_succeeds_both_ways() {
    let n = 10_000u64;
    let block = 4096;
    let len = n * block;
    let mut peer = Peer::spawn(len, 2);
    let e = engine();
    let local = Buf::new(len as usize);
    let data = pattern(len as usize, 42);
    local.write_at(0, &data).unwrap();
    let reqs: Vec<Request> = (0..n)
        .map(|i| {
            Request::new(
                OpCode::Write,
                local.addr() + i * block,
                peer.addr + i * block,
                block,
            )
        })
        .collect();
    // SAFETY: `local` outlives the batch, which is waited for below.
    let batch = unsafe { e.submit(&peer.session, &reqs) }.unwrap();
    batch.wait().unwrap();
    assert!((0..n as usize).all(|i| batch.task(i) == Some(TaskStatus::Completed)));
    assert_eq!(peer.hash(peer.addr, len), fnv(&data));
    local.fill(0);
    let reads = as_reads(&reqs);
    // SAFETY: `local` outlives the batch, which is waited for below.
    let batch = unsafe { e.submit(&peer.session, &reads) }.unwrap();
    batch.wait().unwrap();
    assert!(local.to_vec() == data, "the reads brought back other bytes");
}

#[test]
fn memory_registered_after_first_contact_is_found() {
    // The initiator caches a descriptor at first contact; a request for a
    // range it does not list must refresh the descriptor instead of failing.
    let e = engine();
    let target = engine();
    let local = Buf::new(4096);
    let mem = Buf::new(8192);
    // First contact while the target has no memory: caches an empty descriptor.
    // SAFETY: `local` outlives the synchronous call.
    unsafe {
        e.transfer_sync(
            target.session_id(),
            &[Request::new(OpCode::Read, local.addr(), 0x1000, 0)],
        )
    }
    .unwrap();
    assert!(e.segment_buffers(target.session_id()).unwrap().is_empty());
    target.register_memory(mem.addr(), 8192, "cpu:0").unwrap();
    // SAFETY: `local` outlives the synchronous call.
    unsafe {
        e.transfer_sync(
            target.session_id(),
            &[Request::new(OpCode::Read, local.addr(), mem.addr(), 4096)],
        )
    }
    .unwrap();
    assert_eq!(e.segment_buffers(target.session_id()).unwrap().len(), 1);
}

/// The same requests as reads: back from where `writes` put the bytes.
fn as_reads(writes: &[Request]) -> Vec<Request> {
    writes
        .iter()
        .map(|w| Request {
            op: OpCode::Read,
            ..*w
        })
        .collect()
}
