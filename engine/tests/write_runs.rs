//! Runs of writes, headers first (`wire::tcp::RunHeader`, our framing only): the data
//! server driven by a raw-socket client, well-formed runs (in host memory, taken in at
//! once; with a write outside every buffer, served one by one) and hostile ones; and our
//! client against stand-in peers on raw sockets, which gets runs only from a descriptor
//! that says it takes them, as upstream's never does.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod raw_peer;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use transfer_engine::wire::tcp::{
    RequestHeader, RunHeader, Status, HEADER_LEN, RUN_MAX_BYTES, RUN_MAX_WRITES, RUN_OPCODE,
};
use transfer_engine::{Config, HostBuffer, OpCode, Request, TransferEngine};

use raw_peer::{header, pattern, status, target};

fn run_bytes(writes: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let bytes = writes.iter().map(|(_, b)| b.len() as u64).sum();
    let mut wire = RunHeader {
        writes: writes.len(),
        bytes,
    }
    .encode()
    .to_vec();
    for (addr, b) in writes {
        wire.extend_from_slice(&header(OpCode::Write, *addr, b.len()));
    }
    for (_, b) in writes {
        wire.extend_from_slice(b);
    }
    wire
}

fn landed(buf: &HostBuffer, off: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // SAFETY: the buffer is ours and no transfer into it runs now.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (buf.addr() + off as u64) as *const u8,
            out.as_mut_ptr(),
            len,
        )
    };
    out
}

/// A run in host memory (taken in at once), a run with a write outside every buffer
/// (served one by one: that one rejected, its payload drained), then a plain write and a
/// read on the same connection: every status in order, every byte where its header said.
#[test]
fn runs_land_every_write_and_are_answered_in_order() {
    let (_e, buf, data) = target();
    let base = buf.addr();
    let sizes = [1usize, 4096, 32 << 10, 100 << 10, 7, 300 << 10];
    let mut at = 0usize;
    let mut first = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        // Out of order in the buffer, and off cache lines.
        first.push((at, pattern(i, n)));
        at += n + 13;
    }
    first.reverse();
    let mut second: Vec<(usize, Vec<u8>)> = (0..5)
        .map(|i| (2_000_000 + i * 70_000, pattern(50 + i, 64 << 10)))
        .collect();
    let outside = (0x10u64, vec![0xEEu8; 5000]);
    let mut wire = run_bytes(
        &first
            .iter()
            .map(|(off, b)| (base + *off as u64, b.clone()))
            .collect::<Vec<_>>(),
    );
    let mut with_outside: Vec<(u64, Vec<u8>)> = second
        .iter()
        .map(|(off, b)| (base + *off as u64, b.clone()))
        .collect();
    with_outside.insert(2, outside);
    wire.extend_from_slice(&run_bytes(&with_outside));
    let plain = (3_500_000usize, pattern(99, 1000));
    wire.extend_from_slice(&header(OpCode::Write, base + plain.0 as u64, plain.1.len()));
    wire.extend_from_slice(&plain.1);
    wire.extend_from_slice(
        &RequestHeader {
            size: 1000,
            addr: base + plain.0 as u64,
            opcode: OpCode::Read,
            v2: true,
        }
        .encode(),
    );
    let mut s = TcpStream::connect(data).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&wire).unwrap();
    for i in 0..first.len() {
        assert_eq!(status(&mut s), Status::Ok, "first run, write {i}");
    }
    for i in 0..with_outside.len() {
        let expected = if i == 2 {
            Status::AddrRejected
        } else {
            Status::Ok
        };
        assert_eq!(status(&mut s), expected, "second run, write {i}");
    }
    assert_eq!(status(&mut s), Status::Ok, "the plain write");
    assert_eq!(status(&mut s), Status::Ok, "the read");
    let mut got = vec![0u8; 1000];
    s.read_exact(&mut got).unwrap();
    assert_eq!(got, plain.1);
    second.push(plain);
    for (off, bytes) in first.iter().chain(&second) {
        assert!(landed(&buf, *off, bytes.len()) == *bytes, "write at {off}");
    }
}

/// Runs a hostile peer may send: out of a run's bounds, at odds with their own headers, or
/// cut short. Each closes its connection with no status, writes nothing, and the server
/// goes on serving others.
#[test]
fn runs_out_of_bounds_or_at_odds_with_their_headers_close_the_connection() {
    let (_e, buf, data) = target();
    let base = buf.addr();
    let head = |writes: u64, bytes: u64| {
        let mut h = RunHeader { writes: 1, bytes }.encode();
        h[8..16].copy_from_slice(&writes.to_le_bytes());
        h.to_vec()
    };
    let payload = vec![0xABu8; 4096];
    let mut cases: Vec<(&str, Vec<u8>, bool)> = Vec::new();
    cases.push(("no writes", head(0, 0), false));
    cases.push((
        "too many writes",
        head(RUN_MAX_WRITES as u64 + 1, 4096),
        false,
    ));
    cases.push(("too many bytes", head(1, RUN_MAX_BYTES + 1), false));
    let mut sums_differ = head(2, 8192);
    sums_differ.extend_from_slice(&header(OpCode::Write, base, 4096));
    sums_differ.extend_from_slice(&header(OpCode::Write, base + 4096, 4095));
    sums_differ.extend_from_slice(&payload);
    sums_differ.extend_from_slice(&payload);
    cases.push(("sizes that do not add up", sums_differ, false));
    let mut with_read = head(2, 8192);
    with_read.extend_from_slice(&header(OpCode::Write, base, 4096));
    with_read.extend_from_slice(
        &RequestHeader {
            size: 4096,
            addr: base,
            opcode: OpCode::Read,
            v2: true,
        }
        .encode(),
    );
    with_read.extend_from_slice(&payload);
    cases.push(("a read inside", with_read, false));
    let mut v1_inside = head(1, 4096);
    v1_inside.extend_from_slice(
        &RequestHeader {
            size: 4096,
            addr: base,
            opcode: OpCode::Write,
            v2: false,
        }
        .encode(),
    );
    v1_inside.extend_from_slice(&payload);
    cases.push(("a v1 write inside", v1_inside, false));
    let mut cut_short = head(2, 8192);
    cut_short.extend_from_slice(&header(OpCode::Write, base, 4096));
    cases.push(("cut short in its headers", cut_short, true));
    let mut payload_short = head(2, 8192);
    payload_short.extend_from_slice(&header(OpCode::Write, base, 4096));
    payload_short.extend_from_slice(&header(OpCode::Write, base + 4096, 4096));
    payload_short.extend_from_slice(&payload[..100]);
    cases.push(("cut short in its payloads", payload_short, true));
    for (what, wire, half_close) in cases {
        let mut s = TcpStream::connect(data).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&wire).unwrap();
        if half_close {
            s.shutdown(Shutdown::Write).unwrap();
        }
        let mut got = Vec::new();
        // The server closes: end of stream (or a reset), and no status before it.
        let _ = s.read_to_end(&mut got);
        assert!(got.is_empty(), "{what}: the server answered {got:?}");
    }
    // Only "cut short in its payloads" got as far as its payloads: 100 bytes of the first.
    assert_eq!(
        landed(&buf, 100, 8092),
        vec![0u8; 8092],
        "bytes past what came"
    );
    // Still serving: a good run on a new connection.
    let good = vec![(base + 64, pattern(1, 5000)), (base + 9000, pattern(2, 3))];
    let mut s = TcpStream::connect(data).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&run_bytes(&good)).unwrap();
    assert_eq!(status(&mut s), Status::Ok);
    assert_eq!(status(&mut s), Status::Ok);
    assert_eq!(landed(&buf, 64, 5000), good[0].1);
    assert_eq!(landed(&buf, 9000, 3), good[1].1);
}

/// What a stand-in data port saw of one request or run: its opcode byte and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    opcode: u8,
    writes: usize,
}

/// A stand-in data port: takes requests and runs as our server frames them, answers every
/// write with `Ok`, and records what it saw.
fn stand_in_data_port() -> (u16, Arc<Mutex<Vec<Seen>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let log = log.clone();
            std::thread::spawn(move || {
                let mut h = [0u8; HEADER_LEN];
                while s.read_exact(&mut h).is_ok() {
                    let (writes, bytes) = match RunHeader::decode(&h) {
                        Some(run) => {
                            let run = run.unwrap();
                            let mut heads = vec![0u8; run.writes * HEADER_LEN];
                            s.read_exact(&mut heads).unwrap();
                            (run.writes, run.bytes)
                        }
                        None => {
                            let r = RequestHeader::decode(&h).unwrap();
                            assert_eq!(r.opcode, OpCode::Write);
                            (1, r.size)
                        }
                    };
                    log.lock().unwrap().push(Seen {
                        opcode: h[16],
                        writes,
                    });
                    let mut payload = vec![0u8; bytes as usize];
                    s.read_exact(&mut payload).unwrap();
                    for _ in 0..writes {
                        s.write_all(&Status::Ok.encode()).unwrap();
                    }
                }
            });
        }
    });
    (port, seen)
}

/// Our client sends batches of writes as runs only to a peer whose descriptor says it
/// takes them; to one that does not (every upstream), each write goes with its own header.
/// `MC_TCP_WRITE_RUNS=0` turns runs off.
#[test]
fn runs_go_only_to_peers_that_say_they_take_them() {
    let local = HostBuffer::new(1 << 20);
    for (says, config_on, runs_expected) in [
        (true, true, true),
        (false, true, false),
        (true, false, false),
    ] {
        let (port, seen) = stand_in_data_port();
        let (session, _rpc) = raw_peer::serve_descriptor_taking_runs(port, 0x1000_0000, says);
        let config = Config {
            tcp_lanes_per_peer: 1,
            tcp_write_runs: config_on,
            ..Config::default()
        };
        let e = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", config).unwrap();
        e.register_memory(local.addr(), 1 << 20, "cpu:0").unwrap();
        let reqs: Vec<Request> = (0..8u64)
            .map(|i| {
                Request::new(
                    OpCode::Write,
                    local.addr() + i * 4096,
                    0x1000_0000 + i * 8192,
                    4096,
                )
            })
            .collect();
        for _ in 0..4 {
            // SAFETY: `local` outlives the call, which waits for the batch.
            unsafe { e.transfer_sync(&session, &reqs) }.unwrap();
        }
        let seen = seen.lock().unwrap().clone();
        let writes: usize = seen.iter().map(|s| s.writes).sum();
        assert_eq!(writes, 32, "says {says}, on {config_on}: {seen:?}");
        let runs = seen.iter().filter(|s| s.opcode == RUN_OPCODE).count();
        if runs_expected {
            assert!(runs > 0, "no run to a peer that takes them: {seen:?}");
            assert!(seen.iter().all(|s| s.opcode == RUN_OPCODE || s.writes == 1));
        } else {
            assert_eq!(runs, 0, "says {says}, on {config_on}: {seen:?}");
        }
    }
}

/// Two engines of ours: the target says it takes runs, and batches of writes of every
/// size between them land byte for byte, as runs and not.
#[test]
fn batches_of_writes_between_engines_land_with_runs_on_and_off() {
    const REMOTE: usize = 8 << 20;
    let (t, tbuf, _) = {
        let e = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", Config::default()).unwrap();
        let buf = HostBuffer::new(REMOTE);
        e.register_memory(buf.addr(), REMOTE as u64, "cpu:0")
            .unwrap();
        (e, buf, ())
    };
    assert!(
        t.local_descriptor().tcp_write_runs,
        "our descriptor says we take runs"
    );
    let session = t.session_id().to_string();
    for on in [true, false] {
        let config = Config {
            tcp_write_runs: on,
            ..Config::default()
        };
        let e = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", config).unwrap();
        let local = HostBuffer::new(REMOTE);
        e.register_memory(local.addr(), REMOTE as u64, "cpu:0")
            .unwrap();
        for (round, (reqs, block)) in [
            (64usize, 4096usize),
            (32, 32 << 10),
            (16, 100_000),
            (3, 1 << 20),
        ]
        .into_iter()
        .enumerate()
        {
            let seed = round + if on { 10 } else { 20 };
            let bytes = pattern(seed, reqs * block);
            // SAFETY: `local` is ours and idle.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), local.addr() as *mut u8, bytes.len())
            };
            // Block i lands at block (i * 7) % reqs, plus an odd offset.
            let reqs_list: Vec<Request> = (0..reqs)
                .map(|i| {
                    Request::new(
                        OpCode::Write,
                        local.addr() + (i * block) as u64,
                        tbuf.addr() + 40 + ((i * 7 % reqs) * block) as u64,
                        block as u64,
                    )
                })
                .collect();
            // SAFETY: `local` outlives the call, which waits for the batch.
            unsafe { e.transfer_sync(&session, &reqs_list) }.unwrap();
            for i in 0..reqs {
                let at = 40 + (i * 7 % reqs) * block;
                assert!(
                    landed(&tbuf, at, block) == bytes[i * block..(i + 1) * block],
                    "runs {on}, {reqs} x {block}: block {i}"
                );
            }
        }
    }
}
