//! The TCP paths that only many-core hosts take by default, forced on here: lanes and data
//! servers that spin (`MC_TCP_SPIN_US`), lone requests whose reply the lane reads itself,
//! and reads spread over lanes by the bytes owed to each. Every byte is checked.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    reason = "integration test: a failed unwrap is a failed test"
)]

use std::time::Duration;

use transfer_engine::{Config, HostBuffer, OpCode, Request, TransferEngine};

fn spinning() -> Config {
    Config {
        tcp_spin: Duration::from_micros(200),
        tcp_lanes_per_peer: 8,
        ..Config::default()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A target with `len` bytes registered and an initiator, both with `config`: (target,
/// initiator, the target's buffer, a local buffer of `len`, the target's session).
fn pair(
    config: fn() -> Config,
    len: usize,
) -> (
    TransferEngine,
    TransferEngine,
    HostBuffer,
    HostBuffer,
    String,
) {
    let target = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", config()).unwrap();
    let initiator = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", config()).unwrap();
    let remote = HostBuffer::new(len);
    target
        .register_memory(remote.addr(), len as u64, "cpu:0")
        .unwrap();
    let local = HostBuffer::new(len);
    let peer = target.session_id().to_string();
    (target, initiator, remote, local, peer)
}

#[test]
fn lone_and_batched_requests_move_the_right_bytes_while_threads_spin() {
    let len = 8 << 20;
    let (_target, initiator, remote, local, peer) = pair(spinning, len);

    // Lone 4 KiB requests, one after another: the lane reads each reply itself.
    for round in 0..200u32 {
        let off = (round as usize * 4096 * 7) % (len - 4096);
        let bytes = pattern(4096, round as u8);
        local.write_at(off, &bytes).unwrap();
        let (here, there) = (local.addr() + off as u64, remote.addr() + off as u64);
        let w = Request::new(OpCode::Write, here, there, 4096);
        // SAFETY: both buffers outlive the call.
        unsafe { initiator.transfer_sync(&peer, &[w]) }.unwrap();
        local.write_at(off, &[0u8; 4096]).unwrap();
        let r = Request::new(OpCode::Read, here, there, 4096);
        // SAFETY: as above.
        unsafe { initiator.transfer_sync(&peer, &[r]) }.unwrap();
        assert_eq!(local.read_at(off, 4096).unwrap(), bytes, "round {round}");
        assert_eq!(remote.read_at(off, 4096).unwrap(), bytes, "round {round}");
    }

    // A batch of 64 reads of 64 KiB, then of 2 of 4 MiB: spread over lanes by bytes owed.
    for (block, count) in [(64usize << 10, 64usize), (4 << 20, 2)] {
        let expect = pattern(block * count, block as u8);
        remote.write_at(0, &expect).unwrap();
        local.write_at(0, &vec![0u8; block * count]).unwrap();
        let reqs: Vec<Request> = (0..count)
            .map(|i| {
                let off = (i * block) as u64;
                Request::new(
                    OpCode::Read,
                    local.addr() + off,
                    remote.addr() + off,
                    block as u64,
                )
            })
            .collect();
        // SAFETY: as above.
        unsafe { initiator.transfer_sync(&peer, &reqs) }.unwrap();
        assert!(
            local.read_at(0, block * count).unwrap() == expect,
            "{count} x {block}"
        );
    }
}

/// Lone small requests from several threads at once, next to batches to the same peer:
/// one caller at a time runs on the link's direct connection, the others go to the
/// lanes; every byte lands where it should.
#[test]
fn lone_requests_from_many_threads_beside_batches_move_the_right_bytes() {
    const THREADS: usize = 4;
    const SLOT: usize = 1 << 20;
    let (_target, initiator, remote, local, peer) = pair(Config::default, SLOT * (THREADS + 1));
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (initiator, peer, local, remote) = (&initiator, &peer, &local, &remote);
            s.spawn(move || {
                for round in 0..150usize {
                    let size = [1usize, 4096, 16 << 10, 100][round % 4];
                    let off = t * SLOT + (round * 4099) % (SLOT - size);
                    let bytes = pattern(size, (round + t) as u8);
                    local.write_at(off, &bytes).unwrap();
                    let (here, there) = (local.addr() + off as u64, remote.addr() + off as u64);
                    let w = Request::new(OpCode::Write, here, there, size as u64);
                    // SAFETY: both buffers outlive the call.
                    unsafe { initiator.transfer_sync(peer, &[w]) }.unwrap();
                    local.write_at(off, &vec![0u8; size]).unwrap();
                    let r = Request::new(OpCode::Read, here, there, size as u64);
                    // SAFETY: as above.
                    unsafe { initiator.transfer_sync(peer, &[r]) }.unwrap();
                    assert_eq!(
                        local.read_at(off, size).unwrap(),
                        bytes,
                        "thread {t} round {round}"
                    );
                }
            });
        }
        let (initiator, peer, local, remote) = (&initiator, &peer, &local, &remote);
        s.spawn(move || {
            let base = THREADS * SLOT;
            for round in 0..20u8 {
                let bytes = pattern(SLOT, round);
                local.write_at(base, &bytes).unwrap();
                let reqs: Vec<Request> = (0..16)
                    .map(|i| {
                        let off = (base + i * (SLOT / 16)) as u64;
                        Request::new(
                            OpCode::Write,
                            local.addr() + off,
                            remote.addr() + off,
                            (SLOT / 16) as u64,
                        )
                    })
                    .collect();
                // SAFETY: both buffers outlive the call.
                unsafe { initiator.transfer_sync(peer, &reqs) }.unwrap();
                assert_eq!(
                    remote.read_at(base, SLOT).unwrap(),
                    bytes,
                    "batch round {round}"
                );
            }
        });
    });
}

/// Only a caller that waits at once (a synchronous call) runs its lone request itself, on
/// the link's direct connection; an asynchronous submit returns at once and leaves it to
/// a lane. Seen in the connections each opens.
#[test]
fn only_synchronous_lone_requests_run_on_the_callers_thread() {
    let (_target, initiator, remote, local, peer) = pair(Config::default, 1 << 20);
    local.write_at(0, &pattern(4096, 3)).unwrap();
    let connects = || {
        let m = initiator.metrics();
        let tcp = m.transports.iter().find(|t| t.protocol == "tcp").unwrap();
        tcp.connections.connects
    };
    let w = Request::new(OpCode::Write, local.addr(), remote.addr(), 4096);
    // SAFETY: both buffers outlive the calls and the batch, which is waited for.
    unsafe { initiator.transfer_sync(&peer, &[w]) }.unwrap();
    assert_eq!(
        connects(),
        1,
        "the synchronous call opened the direct connection"
    );
    // SAFETY: as above.
    unsafe { initiator.transfer_sync(&peer, &[w]) }.unwrap();
    assert_eq!(connects(), 1, "and used it again");
    // SAFETY: as above.
    let batch = unsafe { initiator.submit(&peer, &[w]) }.unwrap();
    batch.wait().unwrap();
    assert_eq!(connects(), 2, "the asynchronous submit went to a lane");
    assert_eq!(remote.read_at(0, 4096).unwrap(), pattern(4096, 3));
}
