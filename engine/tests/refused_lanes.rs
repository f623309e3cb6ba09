//! A peer that refuses some of our data connections (its data server is at
//! `MC_TCP_SERVER_MAX_CONNECTIONS_PER_IP`, here 3, against our 8 lanes): it accepts and
//! closes them at once. Lanes whose connection is refused that way, while others of the
//! link work, step back: their requests go to the working lanes without using up their
//! one re-send, and the lane stops. Every request succeeds, bytes verified.
//!
//! Its own test binary: the peer's cap counts connections from 127.0.0.1, which other
//! tests' engines would add to.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod common;

use common::pattern;
use transfer_engine::{Config, HostBuffer, OpCode, Request, TransferEngine};

/// A target whose data server takes 3 connections from one address, and an initiator
/// with `lanes` lanes and `callers` caller connections to it at most.
fn capped_pair(lanes: usize, callers: usize) -> (TransferEngine, TransferEngine) {
    let engine = |config| TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", config).unwrap();
    let target = engine(Config {
        tcp_server_max_connections_per_ip: 3,
        ..Config::default()
    });
    let initiator = engine(Config {
        tcp_lanes_per_peer: lanes,
        tcp_lane_budget: lanes,
        tcp_caller_conns: callers,
        ..Config::default()
    });
    (target, initiator)
}

#[test]
fn lanes_the_peer_refuses_step_back_and_every_request_still_succeeds() {
    let (target, initiator) = capped_pair(8, 0);
    let len = 4 << 20;
    let there = HostBuffer::new(len);
    target
        .register_memory(there.addr(), len as u64, "*")
        .unwrap();
    let here = HostBuffer::new(len);
    initiator
        .register_memory(here.addr(), len as u64, "*")
        .unwrap();
    let seg = target.session_id().to_string();
    let block = 64 << 10;
    let batch = |op: OpCode| -> Vec<Request> {
        (0..len / block)
            .map(|i| {
                let at = (i * block) as u64;
                Request::new(op, here.addr() + at, there.addr() + at, block as u64)
            })
            .collect()
    };
    for round in 0..6u64 {
        let data = pattern(len, round + 1);
        here.write_at(0, &data).unwrap();
        // SAFETY: `here` is test-owned and outlives the call.
        unsafe { initiator.transfer_sync(&seg, &batch(OpCode::Write)) }
            .unwrap_or_else(|e| panic!("round {round}: writes failed: {e}"));
        assert!(there.to_vec() == data, "round {round}: wrong bytes written");
        here.write_at(0, &vec![0u8; len]).unwrap();
        // SAFETY: as above.
        unsafe { initiator.transfer_sync(&seg, &batch(OpCode::Read)) }
            .unwrap_or_else(|e| panic!("round {round}: reads failed: {e}"));
        assert!(here.to_vec() == data, "round {round}: wrong bytes read");
    }
}

/// Callers that send their batches on connections of their own (as under many callers)
/// against the same peer: a refused caller connection sends its batch to the lanes for
/// free, and callers then open none for a while instead of one per batch, each refused.
#[test]
fn callers_stop_opening_connections_a_peer_refuses() {
    let (target, initiator) = capped_pair(2, 8);
    let (callers, block) = (6, 64 << 10);
    let len = callers * 8 * block;
    let there = HostBuffer::new(len);
    target
        .register_memory(there.addr(), len as u64, "*")
        .unwrap();
    let here = HostBuffer::new(len);
    here.write_at(0, &pattern(len, 5)).unwrap();
    initiator
        .register_memory(here.addr(), len as u64, "*")
        .unwrap();
    let seg = target.session_id().to_string();
    let batches = 60;
    std::thread::scope(|s| {
        for c in 0..callers {
            let (initiator, seg, here, there) = (&initiator, &seg, &here, &there);
            s.spawn(move || {
                for b in 0..batches {
                    let reqs: Vec<Request> = (0..8)
                        .map(|i| {
                            let at = ((c * 8 + i) * block) as u64;
                            Request::new(
                                OpCode::Write,
                                here.addr() + at,
                                there.addr() + at,
                                block as u64,
                            )
                        })
                        .collect();
                    // SAFETY: `here` is test-owned and outlives the scope.
                    unsafe { initiator.transfer_sync(seg, &reqs) }
                        .unwrap_or_else(|e| panic!("caller {c}, batch {b}: {e}"));
                }
            });
        }
    });
    assert!(there.to_vec() == here.to_vec(), "wrong bytes written");
    let m = initiator.metrics();
    let tcp = m.transports.iter().find(|t| t.protocol == "tcp").unwrap();
    let opened = tcp.connections.connects;
    // 2 lanes, the direct connection, and a few caller connections before the first
    // refusal; without the pause, one refused caller connection per batch at least.
    assert!(
        opened < 40,
        "{opened} connections opened for {} batches",
        callers * batches
    );
}
