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

#[test]
fn lanes_the_peer_refuses_step_back_and_every_request_still_succeeds() {
    let target = TransferEngine::new(
        "127.0.0.1",
        "P2PHANDSHAKE",
        Config {
            tcp_server_max_connections_per_ip: 3,
            ..Config::default()
        },
    )
    .unwrap();
    let initiator = TransferEngine::new(
        "127.0.0.1",
        "P2PHANDSHAKE",
        Config {
            tcp_lanes_per_peer: 8,
            tcp_lane_budget: 8,
            tcp_caller_conns: 0,
            ..Config::default()
        },
    )
    .unwrap();
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
