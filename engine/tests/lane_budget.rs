//! The engine's lanes are one budget shared by its links to peers that have work: with two
//! such peers and a budget of 4, a link uses 2 of its 4 lanes, so a batch of many requests
//! to one peer opens at most 2 connections to it; once the other link has rested (no work
//! for a second), it may use all 4 (real engines, loopback).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

use std::time::Duration;

use transfer_engine::{Config, HostBuffer, OpCode, Request, TransferEngine};

const BLOCK: usize = 64 << 10;
const BATCH: usize = 64;

fn peer() -> (TransferEngine, HostBuffer) {
    let e = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", Config::default()).unwrap();
    let mem = HostBuffer::new(BLOCK * BATCH);
    e.register_memory(mem.addr(), (BLOCK * BATCH) as u64, "cpu:0")
        .unwrap();
    (e, mem)
}

fn connects(e: &TransferEngine) -> u64 {
    let m = e.metrics();
    let tcp = m.transports.iter().find(|t| t.protocol == "tcp").unwrap();
    tcp.connections.connects
}

/// An engine with 4 lanes per peer and a budget of 4, and a local buffer of `BATCH` blocks
/// filled from `seed`.
fn initiator_of_four_lanes(seed: u8) -> (TransferEngine, HostBuffer) {
    let initiator = TransferEngine::new(
        "127.0.0.1",
        "P2PHANDSHAKE",
        Config {
            tcp_lanes_per_peer: 4,
            tcp_lane_budget: 4,
            ..Config::default()
        },
    )
    .unwrap();
    let local = HostBuffer::new(BLOCK * BATCH);
    for i in 0..BATCH {
        local.write_at(i * BLOCK, &[i as u8 + seed; BLOCK]).unwrap();
    }
    (initiator, local)
}

fn batch_to(
    initiator: &TransferEngine,
    peer: &TransferEngine,
    mem: &HostBuffer,
    local: &HostBuffer,
) {
    let reqs: Vec<Request> = (0..BATCH)
        .map(|i| {
            Request::new(
                OpCode::Write,
                local.addr() + (i * BLOCK) as u64,
                mem.addr() + (i * BLOCK) as u64,
                BLOCK as u64,
            )
        })
        .collect();
    // SAFETY: both buffers outlive the call.
    unsafe { initiator.transfer_sync(peer.session_id(), &reqs) }.unwrap();
    assert_eq!(mem.to_vec(), local.to_vec());
}

#[test]
fn a_link_without_work_leaves_the_lane_budget_to_the_others() {
    let (initiator, local) = initiator_of_four_lanes(7);
    let (a, a_mem) = peer();
    let (b, b_mem) = peer();
    batch_to(&initiator, &a, &a_mem, &local);
    // a's link rests after a second without work (the housekeeping looks every second).
    std::thread::sleep(Duration::from_millis(2500));
    let before = connects(&initiator);
    // Several batches: each lane that takes a request opens its connection; four lanes
    // are allowed now, two were while a's link counted.
    for _ in 0..8 {
        batch_to(&initiator, &b, &b_mem, &local);
    }
    let opened = connects(&initiator) - before;
    assert!(
        opened >= 3,
        "{opened} connections to b: with a's link rested, b's may use all 4 lanes"
    );
}

#[test]
fn two_peers_share_the_lane_budget() {
    let (initiator, local) = initiator_of_four_lanes(1);
    let (a, a_mem) = peer();
    let (b, b_mem) = peer();
    // One small write to each: both links exist, one connection each (the link's direct
    // connection, on which a lone small request runs on the caller's thread; no lane's).
    for (p, mem) in [(&a, &a_mem), (&b, &b_mem)] {
        let req = Request::new(OpCode::Write, local.addr(), mem.addr(), 4096);
        // SAFETY: both buffers outlive the call.
        unsafe { initiator.transfer_sync(p.session_id(), &[req]) }.unwrap();
    }
    assert_eq!(connects(&initiator), 2);

    let reqs: Vec<Request> = (0..BATCH)
        .map(|i| {
            Request::new(
                OpCode::Write,
                local.addr() + (i * BLOCK) as u64,
                b_mem.addr() + (i * BLOCK) as u64,
                BLOCK as u64,
            )
        })
        .collect();
    // SAFETY: both buffers outlive the call.
    unsafe { initiator.transfer_sync(b.session_id(), &reqs) }.unwrap();
    assert_eq!(b_mem.to_vec(), local.to_vec());
    let opened = connects(&initiator) - 2;
    assert!(
        (1..=2).contains(&opened),
        "{opened} lane connections: a link of two sharing a budget of 4 lanes must use at most 2"
    );
}
