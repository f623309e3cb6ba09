//! Interop with the REAL published upstream wheel (`mooncake-transfer-engine-non-cuda`),
//! over TCP with the P2P handshake, in both directions.
//!
//! The upstream side is `tests/interop/upstream_peer.py` run with the venv that
//! `scripts/setup-upstream.sh` creates (or `$UPSTREAM_PYTHON`); our side is the engine,
//! in this test process. A missing venv fails the tests, with the command to run.
//!
//!   scripts/setup-upstream.sh && cargo test -p e2e --test upstream_interop -- --nocapture
//!
//! `E2E_UPSTREAM_LOG=1` prints each upstream target's log (glog) when it stops;
//! `MC_LOG_LEVEL=debug` raises our engine's log level (default here: warnings).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is the test's failure report \
              (clippy.toml's allow-*-in-tests covers #[test] functions, not their helpers)"
)]

use std::time::{Duration, Instant};

use e2e::{
    fill_pattern_at, first_mismatch, init_logging, run_upstream, shuffled, Buf, UpstreamTarget,
    CHILD_DEADLINE,
};
use transfer_engine::{
    Config, EngineError, Notify, OpCode, Request, TaskStatus, TransferEngine, TransferError,
};

/// Buffer size of most tests: more than one 4 MiB stripe of ours, and not a multiple of
/// the page size, so the last bytes of a registered buffer are exercised.
const N: u64 = (6 << 20) + 4097;

fn engine(config: Config) -> TransferEngine {
    init_logging();
    TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", config).expect("our engine starts")
}

fn assert_pattern(data: &[u8], seed: u64, offset: u64, what: &str) {
    if let Some(bad) = first_mismatch(data, seed, offset) {
        panic!("{what}: differs from pattern({seed}) at offset {bad}");
    }
}

/// Blocks of an odd size (so requests start at odd addresses on both sides) covering
/// `[0, n)`: (offset, len) of each, the last one shorter.
fn blocks(n: u64, block: u64) -> Vec<(u64, u64)> {
    (0..n.div_ceil(block))
        .map(|j| (j * block, block.min(n - j * block)))
        .collect()
}

/// Our initiator against an upstream target, with `config`: read, batch write (shuffled
/// blocks of `block` bytes, an odd size), batch read (reversed blocks), single large write
/// and read, each verified on the side that did not move the bytes.
fn write_read_round_trip(config: Config, block: u64, seeds: [u64; 3]) {
    let config_v1 = config.tcp_proto == Some(1);
    let [original, batch_seed, single_seed] = seeds;
    // v1 writes are not acknowledged: a completed write means the bytes left, not that
    // they landed, so the target's check may have to wait for them (bounded).
    let landed = |t: &mut UpstreamTarget, seed: u64, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let answer = t.check(0, N, seed);
            if answer == "ok" {
                return;
            }
            if config_v1 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            panic!(
                "{what}: upstream's check answered {answer:?}\n{}",
                t.stderr_tail(30)
            );
        }
    };
    let started = Instant::now();
    let mut t = UpstreamTarget::spawn(N, original);
    let e = engine(config);
    let local = Buf::new(N as usize);
    let (sid, rb) = (t.session_id.clone(), t.buffer);
    eprintln!(
        "upstream target {sid}, buffer {rb:#x}+{N}, up after {:?}",
        started.elapsed()
    );

    // Upstream's descriptor, as we parsed it.
    let bufs = e
        .segment_buffers(&sid)
        .expect("upstream descriptor fetched and parsed");
    assert!(
        bufs.iter().any(|b| b.addr == rb && b.length == N),
        "upstream descriptor lacks buffer {rb:#x}+{N}: {bufs:?}"
    );

    // 1. One read of the whole buffer.
    // SAFETY: `local` outlives the synchronous call; nothing else touches it meanwhile.
    unsafe { e.transfer_sync(&sid, &[Request::new(OpCode::Read, local.addr(), rb, N)]) }
        .unwrap_or_else(|err| {
            panic!(
                "read of upstream buffer failed: {err}\n{}",
                t.stderr_tail(30)
            )
        });
    assert_pattern(&local.to_vec(), original, 0, "upstream buffer as read");

    // 2. A batch of many writes, local block j -> remote block perm[j] (odd block size).
    let bl = blocks(N, block);
    let full = bl.len() - 1; // the short tail block maps to itself
    let perm: Vec<usize> = shuffled(full, batch_seed)
        .into_iter()
        .chain([full])
        .collect();
    let la = local.addr();
    for (j, &(off, len)) in bl.iter().enumerate() {
        let (roff, rlen) = bl[perm[j]];
        assert_eq!(len, rlen);
        fill_pattern_at(&local, off, len, batch_seed, roff);
    }
    let reqs: Vec<Request> = bl
        .iter()
        .enumerate()
        .map(|(j, &(off, len))| Request::new(OpCode::Write, la + off, rb + bl[perm[j]].0, len))
        .collect();
    let t0 = Instant::now();
    // SAFETY: `local` outlives the synchronous call; nothing else touches it meanwhile.
    unsafe { e.transfer_sync(&sid, &reqs) }.unwrap_or_else(|err| {
        panic!(
            "batch write of {} requests failed: {err}\n{}",
            reqs.len(),
            t.stderr_tail(30)
        )
    });
    eprintln!("batch write: {} requests in {:?}", reqs.len(), t0.elapsed());
    landed(
        &mut t,
        batch_seed,
        "upstream buffer after the shuffled batch write",
    );

    // 3. A batch of reads, remote block j -> local block (K-1-j), into a cleared buffer.
    local.fill(0);
    let k = bl.len();
    let mut reqs = Vec::with_capacity(k);
    let mut loff = 0;
    let mut local_map = Vec::with_capacity(k); // (local offset, remote offset, len)
    for j in (0..k).rev() {
        let (roff, len) = bl[j];
        reqs.push(Request::new(OpCode::Read, la + loff, rb + roff, len));
        local_map.push((loff, roff, len));
        loff += len;
    }
    // SAFETY: `local` outlives the synchronous call; nothing else touches it meanwhile.
    unsafe { e.transfer_sync(&sid, &reqs) }
        .unwrap_or_else(|err| panic!("batch read failed: {err}\n{}", t.stderr_tail(30)));
    for &(lo, ro, len) in &local_map {
        assert_pattern(
            &local.read_at(lo as usize, len as usize).unwrap(),
            batch_seed,
            ro,
            "reversed batch read",
        );
    }

    // 4. One large write (striped by us) and one large read into a cleared buffer.
    fill_pattern_at(&local, 0, local.len() as u64, single_seed, 0);
    // SAFETY: `local` outlives the synchronous call; nothing else touches it meanwhile.
    unsafe { e.transfer_sync(&sid, &[Request::new(OpCode::Write, la, rb, N)]) }
        .unwrap_or_else(|err| panic!("single write failed: {err}\n{}", t.stderr_tail(30)));
    landed(
        &mut t,
        single_seed,
        "upstream buffer after the single write",
    );
    local.fill(0);
    // SAFETY: `local` outlives the synchronous call; nothing else touches it meanwhile.
    unsafe { e.transfer_sync(&sid, &[Request::new(OpCode::Read, la, rb, N)]) }
        .unwrap_or_else(|err| panic!("single read failed: {err}\n{}", t.stderr_tail(30)));
    assert_pattern(&local.to_vec(), single_seed, 0, "single read-back");

    drop(e);
    t.finish();
    eprintln!("round trip done in {:?}", started.elapsed());
}

#[test]
fn our_initiator_reads_and_writes_upstream_target() {
    // 1021-byte blocks: a batch of 6166 requests (upstream's own client fails at 4096).
    write_read_round_trip(Config::default(), 1021, [11, 23, 37]);
}

#[test]
fn our_initiator_with_v1_framing_reads_and_writes_upstream_target() {
    write_read_round_trip(
        Config {
            tcp_proto: Some(1),
            ..Config::default()
        },
        3001,
        [12, 24, 38],
    );
}

/// Many threads issuing synchronous batches at once, as vLLM's connector does: once the
/// link is busy, our callers send their batches themselves, whole, on caller connections
/// (on from 8 CPUs by default; forced on here), and read upstream's replies (statuses, data)
/// themselves.
/// Each thread writes its own part of upstream's buffer in batches of 32 x 32 KiB (a
/// global pattern, checked by upstream), then reads it back in batches (checked here).
#[test]
fn many_callers_write_and_read_upstream_target_on_caller_connections() {
    const THREADS: u64 = 8;
    const REQS: u64 = 32;
    const BLOCK: u64 = 32 << 10;
    const ROUNDS: u64 = 12;
    let part = REQS * BLOCK;
    let size = THREADS * part;
    let seed = 71;
    let mut t = UpstreamTarget::spawn(size, 5);
    let e = engine(Config {
        tcp_lanes_per_peer: 2,
        tcp_caller_conns: 4,
        ..Config::default()
    });
    let (sid, rb) = (t.session_id.clone(), t.buffer);
    std::thread::scope(|scope| {
        for th in 0..THREADS {
            let (e, sid) = (&e, &sid);
            scope.spawn(move || {
                let base = th * part;
                let local = Buf::new(part as usize);
                let back = Buf::new(part as usize);
                fill_pattern_at(&local, 0, part, seed, base);
                // Requests in a shuffled order, so that statuses matched to the wrong
                // request would show.
                let order = shuffled(REQS as usize, seed + th);
                let batch = |op: OpCode, buf: &Buf| -> Vec<Request> {
                    order
                        .iter()
                        .map(|&j| {
                            let off = j as u64 * BLOCK;
                            Request::new(op, buf.addr() + off, rb + base + off, BLOCK)
                        })
                        .collect()
                };
                for round in 0..ROUNDS {
                    let (w, r) = (batch(OpCode::Write, &local), batch(OpCode::Read, &back));
                    // SAFETY: both buffers outlive the synchronous calls.
                    unsafe { e.transfer_sync(sid, &w) }
                        .unwrap_or_else(|err| panic!("thread {th} round {round} write: {err}"));
                    back.fill(0);
                    // SAFETY: as above.
                    unsafe { e.transfer_sync(sid, &r) }
                        .unwrap_or_else(|err| panic!("thread {th} round {round} read: {err}"));
                    assert_pattern(&back.to_vec(), seed, base, "read back by a caller");
                }
            });
        }
    });
    let answer = t.check(0, size, seed);
    assert_eq!(
        answer,
        "ok",
        "upstream's buffer after the callers' writes\n{}",
        t.stderr_tail(30)
    );
    let m = e.metrics();
    let tcp = m.transports.iter().find(|t| t.protocol == "tcp").unwrap();
    // Lanes (2) and the direct connection (1) are 3 at most: more were caller connections
    // (with none, 2 opened).
    assert!(
        tcp.connections.connects > 3,
        "{} connections: the callers never sent themselves",
        tcp.connections.connects
    );
    assert_eq!(
        tcp.connections.reconnects, 0,
        "a connection to upstream broke"
    );
    drop(e);
    t.finish();
}

#[test]
fn requests_past_upstream_buffer_are_rejected_and_leave_it_unchanged() {
    let size: u64 = 1 << 20;
    let seed = 5;
    let mut t = UpstreamTarget::spawn(size, seed);
    let e = engine(Config::default());
    let local = Buf::new(1 << 16);
    let (sid, rb, la) = (t.session_id.clone(), t.buffer, local.addr());
    local.fill(0xEE);
    let before = t.dump(0, size);

    let rejected = [
        (
            "write crossing the end",
            Request::new(OpCode::Write, la, rb + size - 32, 64),
        ),
        (
            "read crossing the end",
            Request::new(OpCode::Read, la, rb + size - 32, 64),
        ),
        (
            "write just past the end",
            Request::new(OpCode::Write, la, rb + size, 1),
        ),
        (
            "write crossing the start",
            Request::new(OpCode::Write, la, rb - 16, 32),
        ),
        (
            "write far away",
            Request::new(OpCode::Write, la, 0x1000, 4096),
        ),
    ];
    for (what, r) in rejected {
        let t0 = Instant::now();
        // SAFETY: `local` outlives the synchronous call; nothing else touches it meanwhile.
        let res = unsafe { e.transfer_sync(&sid, &[r]) };
        assert!(
            matches!(
                res,
                Err(EngineError::Transfer {
                    source: TransferError::AddressRejected { .. },
                    ..
                })
            ),
            "{what}: expected AddressRejected, got {res:?}"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{what}: rejection took {:?}",
            t0.elapsed()
        );
    }
    assert_eq!(
        &local.to_vec(),
        &[0xEE; 1 << 16][..],
        "a rejected read touched local memory"
    );

    // A batch mixing good and bad requests: the good ones complete (writing the bytes the
    // target already holds), the bad one fails alone.
    let good = 8192u64;
    fill_pattern_at(&local, 0, good, seed, size - good);
    let reqs = [
        Request::new(OpCode::Write, la, rb + size - good, good),
        Request::new(OpCode::Write, la, rb + size - good / 2, good),
        Request::new(OpCode::Read, la + good, rb, 4096),
    ];
    // SAFETY: `local` outlives the batch, which is waited for below.
    let batch = unsafe { e.submit(&sid, &reqs) }.expect("submit");
    assert!(
        batch.wait_until(Instant::now() + CHILD_DEADLINE),
        "mixed batch did not finish"
    );
    assert_eq!(batch.task(0), Some(TaskStatus::Completed));
    assert!(
        matches!(
            batch.task(1),
            Some(TaskStatus::Failed(TransferError::AddressRejected { .. }))
        ),
        "request 1: {:?}",
        batch.task(1)
    );
    assert_eq!(batch.task(2), Some(TaskStatus::Completed));
    assert_pattern(
        &local.read_at(good as usize, 4096).unwrap(),
        seed,
        0,
        "read in the mixed batch",
    );

    assert_eq!(t.dump(0, size), before, "upstream buffer changed");
    assert_eq!(t.check(0, size, seed), "ok");
    assert_eq!(t.command("ping"), "pong", "upstream target still serving");
    drop(e);
    t.finish();
}

#[test]
fn our_probe_and_notify_reach_upstream_target() {
    let mut t = UpstreamTarget::spawn(4096, 1);
    let e = engine(Config::default());
    let sid = t.session_id.clone();
    e.probe(&sid)
        .unwrap_or_else(|err| panic!("probe of upstream failed: {err}\n{}", t.stderr_tail(30)));
    assert!(
        e.probe("127.0.0.1:1").is_err(),
        "probe of a closed port succeeded"
    );

    let msgs = [
        ("our-engine", "kv-ready:42"),
        ("second", "{\"json\": [1, 2]} and ünïcode"),
    ];
    for (name, msg) in msgs {
        let n = Notify {
            name: name.into(),
            notify_msg: msg.into(),
        };
        e.send_notify(&sid, &n).unwrap_or_else(|err| {
            panic!("notify to upstream failed: {err}\n{}", t.stderr_tail(30))
        });
    }
    let got = t.notifies();
    let want: Vec<(String, String)> = msgs
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(got, want, "what upstream's get_notifies() returned");
    assert_eq!(t.notifies(), vec![], "get_notifies() drains");
    drop(e);
    t.finish();
}

/// Bytes on each side of our target's registered region, not registered.
const GUARD: u64 = 64 << 10;
/// Fill of the guard zones, which upstream must never change.
const GUARD_FILL: u8 = 0x5A;

/// Our engine as a target: a page-aligned region of `size` bytes holding
/// `pattern(seed)`, registered, between two unregistered guard zones.
struct OurTarget {
    engine: TransferEngine,
    mem: Buf,
    size: u64,
}

impl OurTarget {
    fn new(size: u64, seed: u64) -> Self {
        let engine = engine(Config::default());
        let mem = Buf::new((size + 2 * GUARD) as usize);
        mem.fill(GUARD_FILL);
        fill_pattern_at(&mem, GUARD, size, seed, 0);
        engine
            .register_memory(mem.addr() + GUARD, size, "cpu:0")
            .expect("register");
        Self { engine, mem, size }
    }
    fn addr(&self) -> u64 {
        self.mem.addr() + GUARD
    }
    fn region(&self) -> Vec<u8> {
        self.mem
            .read_at(GUARD as usize, self.size as usize)
            .expect("region inside the buffer")
    }
    fn assert_guards_intact(&self) {
        let b = self.mem.to_vec();
        let (head, tail) = (&b[..GUARD as usize], &b[(GUARD + self.size) as usize..]);
        for (name, zone) in [("before", head), ("after", tail)] {
            if let Some(i) = zone.iter().position(|&x| x != GUARD_FILL) {
                panic!(
                    "unregistered memory {name} our region changed at byte {i} of the guard zone"
                );
            }
        }
    }
}

fn s(v: impl ToString) -> String {
    v.to_string()
}

#[test]
fn upstream_initiator_reads_and_writes_our_target() {
    let (p, seed) = (19u64, 29u64);
    let t = OurTarget::new(N, p);
    let e = &t.engine;
    let args = [
        s("initiator"),
        s("--peer"),
        s(e.session_id()),
        s("--peer-buffer"),
        s(t.addr()),
        s("--size"),
        s(N),
        s("--seed"),
        s(seed),
        s("--blocks"),
        s(64),
        s("--expect-peer-seed"),
        s(p),
        s("--check-reject"),
    ];
    let run = run_upstream(&args, CHILD_DEADLINE);
    eprintln!(
        "upstream initiator ({:?}): {}",
        run.elapsed,
        run.stdout.trim()
    );
    let v = run.last_json();
    assert!(
        run.status.success() && v["ok"] == true,
        "upstream initiator failed ({}): {v}\nstderr:\n{}",
        run.status,
        run.stderr
            .lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(v["peer_original_matches_seed"], p);
    for k in ["write_past_end", "read_past_end", "write_unknown_peer"] {
        assert_ne!(v["reject"][k]["rc"], 0, "{k}: {v}");
    }
    assert_pattern(
        &t.region(),
        seed,
        0,
        "our buffer after the upstream initiator",
    );
    t.assert_guards_intact();
}

#[test]
fn upstream_probe_and_notify_reach_our_target() {
    let size = 1u64 << 16;
    let t = OurTarget::new(size, 0);
    let e = &t.engine;
    let args = [
        s("notify"),
        s("--peer"),
        s(e.session_id()),
        s("--peer-buffer"),
        s(t.addr()),
        s("--size"),
        s(size),
        s("--seed"),
        s(41),
        s("--name"),
        s("upstream-peer"),
        s("--msg"),
    ];
    let notify = |msg: &str| {
        let mut args = args.to_vec();
        args.push(s(msg));
        run_upstream(&args, CHILD_DEADLINE)
    };
    let run = notify("kv-ready:7");
    eprintln!("upstream notify ({:?}): {}", run.elapsed, run.stdout.trim());
    let v = run.last_json();
    assert!(
        run.status.success() && v["ok"] == true,
        "upstream probe/notify failed ({}): {v}\nstderr:\n{}",
        run.status,
        run.stderr
    );
    assert_eq!(v["probe_rc"], 0);
    assert_eq!(v["first_buffer_address"], t.addr());
    assert_pattern(
        &t.region(),
        41,
        0,
        "our buffer after upstream's write-with-notify",
    );
    t.assert_guards_intact();

    // Upstream sends the notification after the transfer; it may land just after its exit.
    let from_upstream = |msg: &str| Notify {
        name: "upstream-peer".into(),
        notify_msg: msg.into(),
    };
    let got = notifies_until(e, &from_upstream("kv-ready:7"));
    assert_eq!(
        got,
        vec![from_upstream("kv-ready:7")],
        "notifications we received"
    );
    // Exactly one: a second run's notification, sent after the first run exited, arrives
    // after anything the first run sent, so nothing may come before it.
    let run = notify("kv-ready:end");
    assert!(run.status.success(), "second notify run: {}", run.stderr);
    let got = notifies_until(e, &from_upstream("kv-ready:end"));
    assert_eq!(
        got,
        vec![from_upstream("kv-ready:end")],
        "exactly one notification per run"
    );
}

/// Takes `e`'s notifications until `last` is among them (bounded by `CHILD_DEADLINE`).
fn notifies_until(e: &TransferEngine, last: &Notify) -> Vec<Notify> {
    let deadline = Instant::now() + CHILD_DEADLINE;
    let mut got = Vec::new();
    while !got.contains(last) {
        assert!(
            Instant::now() < deadline,
            "no {last:?} within {CHILD_DEADLINE:?}; got {got:?}"
        );
        got.extend(e.take_notifies());
        std::thread::sleep(Duration::from_millis(10));
    }
    got
}
