//! The 8 engines of an 8-GPU serving host (one per GPU process, here threads of one
//! process), each with the defaults the engine picks on a 16-CPU host (16 lanes, 16 caller
//! connections), drive serving-shaped load at once into one peer running the defaults:
//! 10 caller threads per engine writing batches of 32 requests of 32 KiB, and one reading
//! 4 MiB batches. The peer's connection caps hold them all: no connection is refused or
//! opened again, no request is re-sent, each engine opens at most the connections its
//! settings allow, and every byte lands where it belongs.
//!
//! Its own test binary: the peer's caps count connections from 127.0.0.1, which other
//! tests' engines would add to.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod common;

use common::pattern;
use transfer_engine::config::{caller_conns_for_cpus, lane_budget_for_cpus, lanes_for_cpus};
use transfer_engine::{Config, HostBuffer, OpCode, Request, TransferEngine};

const ENGINES: usize = 8;
/// The host the engines' defaults are taken for.
const HOST_CPUS: usize = 16;
const CALLERS: usize = 10;
const REQUESTS: usize = 32;
const BLOCK: usize = 32 << 10;
/// Each caller's share of its engine's region: one batch.
const CALLER_BYTES: usize = REQUESTS * BLOCK;
/// Bytes each engine reads back per batch, in 1 MiB requests.
const READ_BYTES: usize = 4 << 20;
const ROUNDS: u64 = 6;

fn tcp(e: &TransferEngine) -> transfer_engine::metrics::TransportCounters {
    let m = e.metrics();
    m.transports
        .iter()
        .find(|t| t.protocol == "tcp")
        .unwrap()
        .connections
}

fn host_defaults() -> Config {
    Config {
        tcp_lanes_per_peer: lanes_for_cpus(HOST_CPUS),
        tcp_lane_budget: lane_budget_for_cpus(HOST_CPUS),
        tcp_caller_conns: caller_conns_for_cpus(HOST_CPUS),
        ..Config::default()
    }
}

#[test]
fn eight_engines_with_sixteen_cpu_defaults_share_one_peer_without_refusals() {
    let server = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", Config::default()).unwrap();
    let per_engine = CALLERS * CALLER_BYTES + READ_BYTES;
    let there = HostBuffer::new(ENGINES * per_engine);
    server
        .register_memory(there.addr(), there.len() as u64, "*")
        .unwrap();
    let seg = server.session_id().to_string();
    let config = host_defaults();
    // What an engine may open to one peer: its lanes, its caller connections, the one
    // lone requests use.
    let most = (config.tcp_lanes_per_peer + config.tcp_caller_conns + 1) as u64;
    assert!(
        ENGINES as u64 * most <= Config::default().tcp_server_max_connections_per_ip as u64,
        "the test's premise: the defaults fit {ENGINES} engines"
    );
    let engines: Vec<TransferEngine> = (0..ENGINES)
        .map(|_| TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", config.clone()).unwrap())
        .collect();
    // The read region of each engine holds known bytes, which the writes never touch.
    let read_seed = |e: usize| 1000 + e as u64;
    for e in 0..ENGINES {
        let at = e * per_engine + CALLERS * CALLER_BYTES;
        there
            .write_at(at, &pattern(READ_BYTES, read_seed(e)))
            .unwrap();
    }

    std::thread::scope(|s| {
        for (e, engine) in engines.iter().enumerate() {
            let base = there.addr() + (e * per_engine) as u64;
            let seg = &seg;
            for c in 0..CALLERS {
                s.spawn(move || {
                    let here = HostBuffer::new(CALLER_BYTES);
                    engine
                        .register_memory(here.addr(), CALLER_BYTES as u64, "*")
                        .unwrap();
                    let remote = base + (c * CALLER_BYTES) as u64;
                    for round in 0..ROUNDS {
                        here.write_at(0, &pattern(CALLER_BYTES, seed(e, c, round)))
                            .unwrap();
                        let reqs: Vec<Request> = (0..REQUESTS)
                            .map(|i| {
                                let at = (i * BLOCK) as u64;
                                Request::new(
                                    OpCode::Write,
                                    here.addr() + at,
                                    remote + at,
                                    BLOCK as u64,
                                )
                            })
                            .collect();
                        // SAFETY: `here` outlives the call, which waits for the batch.
                        unsafe { engine.transfer_sync(seg, &reqs) }.unwrap_or_else(|err| {
                            panic!("engine {e} caller {c} round {round}: {err}")
                        });
                    }
                    engine.unregister_memory(here.addr()).unwrap();
                });
            }
            s.spawn(move || {
                let here = HostBuffer::new(READ_BYTES);
                engine
                    .register_memory(here.addr(), READ_BYTES as u64, "*")
                    .unwrap();
                let remote = base + (CALLERS * CALLER_BYTES) as u64;
                let block = 1 << 20;
                for round in 0..ROUNDS {
                    here.write_at(0, &vec![0; READ_BYTES]).unwrap();
                    let reqs: Vec<Request> = (0..READ_BYTES / block)
                        .map(|i| {
                            let at = (i * block) as u64;
                            Request::new(OpCode::Read, here.addr() + at, remote + at, block as u64)
                        })
                        .collect();
                    // SAFETY: as above.
                    unsafe { engine.transfer_sync(seg, &reqs) }
                        .unwrap_or_else(|err| panic!("engine {e} reader round {round}: {err}"));
                    assert!(
                        here.to_vec() == pattern(READ_BYTES, read_seed(e)),
                        "engine {e} read wrong bytes in round {round}"
                    );
                }
                engine.unregister_memory(here.addr()).unwrap();
            });
        }
    });

    let landed = there.to_vec();
    for e in 0..ENGINES {
        for c in 0..CALLERS {
            let at = e * per_engine + c * CALLER_BYTES;
            assert!(
                landed[at..at + CALLER_BYTES] == pattern(CALLER_BYTES, seed(e, c, ROUNDS - 1)),
                "engine {e} caller {c}: the last round's bytes did not land"
            );
        }
    }
    for (e, engine) in engines.iter().enumerate() {
        let t = tcp(engine);
        assert!(
            t.reconnects == 0 && t.retries == 0,
            "engine {e}: connections opened again or requests re-sent (a refused \
             connection?): {t:?}"
        );
        assert!(
            t.connects <= most,
            "engine {e} opened {} connections to one peer, more than its {most}",
            t.connects
        );
    }
}

fn seed(engine: usize, caller: usize, round: u64) -> u64 {
    ((engine * CALLERS + caller) as u64) << 8 | round
}
