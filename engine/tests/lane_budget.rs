//! The engine's lanes are one budget shared by its links to peers that have work: with two
//! such peers and a budget of 4, a link uses 2 of its 4 lanes, so a batch of many requests
//! to one peer opens at most 2 connections to it; once the other link has rested (no work
//! for 50 ms), it may use all 4 (real engines, loopback).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

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
    // a's link rests 50 ms after its last work (the housekeeping looks every 25 ms): work
    // that moves from one peer to the next gets the whole budget soon after. Batch after
    // batch to b: each lane that takes a request opens its connection; four lanes are
    // allowed once a's link rested, two while it counted (then b's stay at 2 for good).
    let before = connects(&initiator);
    let mut batches = 0;
    let rested = common::wait_for(Duration::from_secs(10), || {
        batch_to(&initiator, &b, &b_mem, &local);
        batches += 1;
        connects(&initiator) - before >= 3
    });
    let opened = connects(&initiator) - before;
    assert!(
        rested && opened >= 3,
        "{opened} connections to b after {batches} batches: with a's link rested, b's may \
         use all 4 lanes"
    );
}

#[test]
fn two_peers_share_the_lane_budget() {
    let (initiator, local) = initiator_of_four_lanes(1);
    let (a, a_mem) = peer();
    let (b, b_mem) = peer();
    // One small write to b: its link exists, with one connection (the link's direct
    // connection, on which a lone small request runs on the caller's thread; no lane's).
    let req = Request::new(OpCode::Write, local.addr(), b_mem.addr(), 4096);
    // SAFETY: both buffers outlive the call.
    unsafe { initiator.transfer_sync(b.session_id(), &[req]) }.unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        // a has work all along: batch after batch, from another thread (stopped however
        // this scope ends, so that a failed assertion fails the test rather than hangs it).
        let _stop = StopOnDrop(&stop);
        let busy_a = s.spawn(|| {
            while !stop.load(Ordering::Acquire) {
                batch_to(&initiator, &a, &a_mem, &local);
            }
        });
        // a's lanes have connected (all 4 of them while b's link rested) once the count
        // has not moved for a while.
        let mut seen = connects(&initiator);
        let mut still = Instant::now();
        let waited = Instant::now();
        while still.elapsed() < Duration::from_millis(300) {
            assert!(
                waited.elapsed() < Duration::from_secs(30),
                "a's lanes never settled"
            );
            std::thread::sleep(Duration::from_millis(20));
            let now = connects(&initiator);
            if now != seen {
                (seen, still) = (now, Instant::now());
            }
        }
        batch_to(&initiator, &b, &b_mem, &local);
        let opened = connects(&initiator) - seen;
        stop.store(true, Ordering::Release);
        busy_a.join().unwrap();
        assert!(
            (1..=2).contains(&opened),
            "{opened} lane connections to b: a link of two with work sharing a budget of 4 \
             lanes must use at most 2"
        );
    });
}

struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}
