//! Batches sent on their caller's thread (`PeerLink::send_here`): under several threads
//! issuing synchronous batches to the same peer at once, a batch whose link already has
//! work goes out over one of the link's caller connections instead of the lanes.
//!
//! Only concurrency takes that path, so every test here runs many callers at once: against
//! real engines on loopback (every byte checked, and the connections counted to show the
//! caller connections opened), and against stand-in peers on raw sockets (a real engine
//! never misbehaves on purpose) that never answer, stop reading, or answer with garbage.
//! There each call must fail within its deadline plus a margin, the caller's memory must
//! not be sent from after the call returned, and the engine must still move bytes after.
//! Caller connections are off by default below 8 CPUs (`MC_TCP_CALLER_CONNS`): every
//! engine here turns them on.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod common;
mod guarded_memory;
mod raw_peer;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::pattern;
use guarded_memory::Mapping;
use transfer_engine::metadata::handshake::HandshakeServer;
use transfer_engine::wire::tcp::{RequestHeader, Status, HEADER_LEN};
use transfer_engine::{
    Batch, Config, EngineError, HostBuffer, OpCode, Request, TransferEngine, TransferError,
};

/// Requests per batch, and bytes per request: a batch is 1 MiB, under the 4 MiB up to
/// which a batch may be sent on its caller's thread.
const REQS: usize = 32;
const BLOCK: usize = 32 << 10;
/// Bytes of one thread's region, locally and on each target.
const SLOT: usize = REQS * BLOCK;

/// Two lanes per peer: without caller connections a link opens at most 2 lane connections
/// and 1 direct one (for lone small requests, which these tests never send).
const LANES: usize = 2;
const WITHOUT_CALLERS: u64 = LANES as u64 + 1;
/// Caller connections per peer at most, set here: the default is none below 8 CPUs.
const CALLER_CONNS: usize = 2 * LANES;

fn two_lanes() -> Config {
    Config {
        tcp_lanes_per_peer: LANES,
        tcp_caller_conns: CALLER_CONNS,
        ..Config::default()
    }
}

/// Where request `i` of a batch lands in the remote slot: a permutation, so that a reply
/// or payload matched to the wrong request of the batch shows as wrong bytes.
/// (`reqs` a power of two: 7 is prime to it.)
fn spread(i: usize, reqs: usize) -> usize {
    i * 7 % reqs
}

/// A batch of `reqs` requests of `block` bytes: local block `i` to remote block
/// `spread(i)`.
fn batch(op: OpCode, local: u64, remote: u64, reqs: usize, block: usize) -> Vec<Request> {
    (0..reqs)
        .map(|i| {
            Request::new(
                op,
                local + (i * block) as u64,
                remote + (spread(i, reqs) * block) as u64,
                block as u64,
            )
        })
        .collect()
}

fn connects(e: &TransferEngine) -> (u64, u64) {
    let m = e.metrics();
    let tcp = m.transports.iter().find(|t| t.protocol == "tcp").unwrap();
    (tcp.connections.connects, tcp.connections.reconnects)
}

/// A real engine on loopback with a region of `len` bytes registered.
struct Target {
    _engine: TransferEngine,
    mem: HostBuffer,
    session: String,
}

impl Target {
    fn start(len: usize) -> Self {
        let engine = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", two_lanes()).unwrap();
        let mem = HostBuffer::new(len);
        engine
            .register_memory(mem.addr(), len as u64, "cpu:0")
            .unwrap();
        let session = engine.session_id().to_string();
        Self {
            _engine: engine,
            mem,
            session,
        }
    }
}

/// `threads` threads, each `rounds` times: a synchronous batch of writes of its slot
/// (data of its own and the round) to one of `targets` (rotating), a batch of reads of it
/// back into another buffer; both the read-back and the target's memory are compared.
fn many_callers(initiator: &TransferEngine, targets: &[Target], threads: usize, rounds: usize) {
    let out = HostBuffer::new(threads * SLOT);
    let back = HostBuffer::new(threads * SLOT);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (out, back) = (&out, &back);
            s.spawn(move || {
                // Each round's data is a different window of the thread's own pattern.
                let source = pattern(2 * SLOT, t as u64 + 1);
                let off = t * SLOT;
                for round in 0..rounds {
                    // Threads start on different targets, so each target has several
                    // callers at once.
                    let target = &targets[(t + round) % targets.len()];
                    let shift = (round * 4104) % SLOT;
                    let data = &source[shift..shift + SLOT];
                    out.write_at(off, data).unwrap();
                    let remote = target.mem.addr() + off as u64;
                    let writes = batch(OpCode::Write, out.addr() + off as u64, remote, REQS, BLOCK);
                    // SAFETY: both buffers outlive the call, which waits for the batch.
                    unsafe { initiator.transfer_sync(&target.session, &writes) }
                        .unwrap_or_else(|e| panic!("thread {t} round {round}: writes: {e}"));
                    let reads = batch(OpCode::Read, back.addr() + off as u64, remote, REQS, BLOCK);
                    // SAFETY: as above.
                    unsafe { initiator.transfer_sync(&target.session, &reads) }
                        .unwrap_or_else(|e| panic!("thread {t} round {round}: reads: {e}"));
                    assert!(
                        back.read_at(off, SLOT).unwrap() == data,
                        "thread {t} round {round}: the bytes read back differ"
                    );
                    let there = target.mem.read_at(off, SLOT).unwrap();
                    for i in 0..REQS {
                        let at = spread(i, REQS) * BLOCK;
                        assert!(
                            there[at..at + BLOCK] == data[i * BLOCK..(i + 1) * BLOCK],
                            "thread {t} round {round}: request {i} landed wrong on the target"
                        );
                    }
                }
            });
        }
    });
}

#[test]
fn many_callers_to_one_peer_move_every_byte_over_caller_connections() {
    const THREADS: usize = 12;
    let target = Target::start(THREADS * SLOT);
    let initiator = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", two_lanes()).unwrap();
    many_callers(&initiator, std::slice::from_ref(&target), THREADS, 100);
    let (opened, reopened) = connects(&initiator);
    eprintln!("one peer: {opened} connects, {reopened} reconnects");
    // More than the lanes and the direct connection could account for: callers sent
    // batches on connections of their own.
    assert!(
        opened > WITHOUT_CALLERS,
        "{opened} connections opened to one peer: no caller connection"
    );
    // Within the lanes and the caller connections' cap, none replaced.
    assert!(
        opened <= WITHOUT_CALLERS + CALLER_CONNS as u64,
        "{opened} connections opened"
    );
    assert_eq!(reopened, 0, "a connection broke on a healthy peer");
}

/// As a serving framework with several decode peers does: each thread rotates its
/// batches over four targets.
#[test]
fn many_callers_rotating_over_four_peers_move_every_byte_over_caller_connections() {
    const THREADS: usize = 12;
    const PEERS: usize = 4;
    let targets: Vec<Target> = (0..PEERS).map(|_| Target::start(THREADS * SLOT)).collect();
    let initiator = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", two_lanes()).unwrap();
    many_callers(&initiator, &targets, THREADS, 100);
    let (opened, reopened) = connects(&initiator);
    eprintln!("{PEERS} peers: {opened} connects, {reopened} reconnects");
    assert!(
        opened > PEERS as u64 * WITHOUT_CALLERS,
        "{opened} connections opened to {PEERS} peers: no caller connection"
    );
    assert_eq!(reopened, 0, "a connection broke on a healthy peer");
}

/// A batch to a link with nothing in flight goes to the lanes, unless the engine already
/// has a slice out for every lane of its budget: then its caller sends it itself. A peer
/// that never answers holds the engine's two lanes' worth of slices in flight while
/// batches go to a real target: they must go out over one caller connection (one
/// connect), where the link's two lanes would each open one; once the stalled batch has
/// failed, the target's batches go to its lanes again.
#[test]
fn a_batch_to_a_quiet_peer_goes_on_its_callers_thread_while_the_engine_has_work_for_every_lane() {
    const ROUNDS: usize = 10;
    const BIG: usize = 1 << 20;
    let Saturated {
        engine,
        peer,
        stalled,
        started,
        _held,
    } = Saturated::start();

    let target = Target::start(2 * BIG);
    let out = HostBuffer::new(2 * BIG);
    let before = connects(&engine).0;
    for round in 0..ROUNDS {
        let data = pattern(2 * BIG, round as u64 + 1);
        out.write_at(0, &data).unwrap();
        let reqs = batch(OpCode::Write, out.addr(), target.mem.addr(), 2, BIG);
        // SAFETY: `out` outlives the call, which waits for the batch.
        unsafe { engine.transfer_sync(&target.session, &reqs) }
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let there = target.mem.read_at(0, 2 * BIG).unwrap();
        assert!(
            there[..BIG] == data[..BIG] && there[BIG..] == data[BIG..],
            "round {round}"
        );
    }
    let busy_phase = connects(&engine).0 - before;
    assert!(
        !stalled.is_finished(),
        "the stalled batch ended within {:?}, before the batches it was to keep company",
        started.elapsed()
    );
    assert_eq!(
        busy_phase, 1,
        "{busy_phase} connections opened for batches to a quiet peer while the engine's lanes \
         all had work: one is a caller connection, two are the link's lanes"
    );

    match stalled.wait() {
        Err(TransferError::Timeout(_)) => {}
        other => panic!("the stalled batch: {other:?}"),
    }
    let before = connects(&engine).0;
    for round in 0..ROUNDS {
        let reqs = batch(OpCode::Write, out.addr(), target.mem.addr(), 2, BIG);
        // SAFETY: as above.
        unsafe { engine.transfer_sync(&target.session, &reqs) }
            .unwrap_or_else(|e| panic!("idle engine, round {round}: {e}"));
    }
    assert!(
        connects(&engine).0 > before,
        "with the engine idle, batches to a quiet peer must go to its lanes (no lane connected)"
    );
    drop(engine);
    peer.drain();
    assert_eq!(peer.foreign.load(Ordering::Relaxed), 0);
}

// ---- Stand-in peers -------------------------------------------------------------------

const PAGE: usize = 4096;
/// What the callers write; any other byte on the wire was read from memory after free.
const WRITE_FILL: u8 = 0x22;

/// How a [`HostilePeer`] answers the requests it reads.
#[derive(Clone, Copy, Debug)]
enum Answer {
    /// Reads every request and its payload, answers nothing.
    Never,
    /// Reads this many requests per connection, then nothing (until resumed), and
    /// answers nothing: the client's sends fill the socket and block.
    StopReadingAfter(usize),
    /// Answers every request with 8 bytes of 0xFF (no status magic).
    Garbage,
    /// Answers every request rightly (a read with [`READ_FILL`] bytes), pausing for
    /// `pause` after every `every` replies.
    Stagger { every: usize, pause: Duration },
}

/// What a [`Answer::Stagger`] peer answers reads with.
const READ_FILL: u8 = 0x3C;

/// A stand-in engine: a descriptor with one big buffer, and a data port served per
/// [`Answer`]. It counts what it read, and payload bytes other than [`WRITE_FILL`].
struct HostilePeer {
    session: String,
    remote: u64,
    requests: Arc<AtomicU64>,
    foreign: Arc<AtomicU64>,
    resume: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    _rpc: HandshakeServer,
}

impl HostilePeer {
    fn start(answer: Answer) -> Self {
        let data = TcpListener::bind("127.0.0.1:0").unwrap();
        let data_port = data.local_addr().unwrap().port();
        let requests = Arc::new(AtomicU64::new(0));
        let foreign = Arc::new(AtomicU64::new(0));
        let resume = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        {
            let (requests, foreign, resume, conns) = (
                requests.clone(),
                foreign.clone(),
                resume.clone(),
                conns.clone(),
            );
            std::thread::spawn(move || {
                for s in data.incoming().flatten() {
                    let (requests, foreign, resume) =
                        (requests.clone(), foreign.clone(), resume.clone());
                    let t = std::thread::spawn(move || {
                        serve(s, answer, &requests, &foreign, &resume);
                    });
                    conns.lock().unwrap().push(t);
                }
            });
        }
        let remote = 0x7f00_0000_0000;
        let (session, rpc) = raw_peer::serve_descriptor(data_port, remote);
        Self {
            session,
            remote,
            requests,
            foreign,
            resume,
            conns,
            _rpc: rpc,
        }
    }

    /// Lets every connection read on (what was sent before the calls returned, and what
    /// would have been sent after), to its end; returns once each has ended.
    fn drain(&self) {
        self.resume.store(true, Ordering::Release);
        let conns = std::mem::take(&mut *self.conns.lock().unwrap());
        for t in conns {
            t.join().unwrap();
        }
    }
}

/// An engine of two lanes in all (`MC_TCP_LANE_BUDGET`) with a batch of writes to a peer
/// that never answers: its four slices stay in flight (until the 5 s deadline), so the
/// engine has a slice out for every lane of its budget.
struct Saturated {
    engine: TransferEngine,
    peer: HostilePeer,
    stalled: Batch,
    /// When the stalled batch was submitted.
    started: Instant,
    /// The stalled batch's memory.
    _held: HostBuffer,
}

impl Saturated {
    const STALLED: usize = 4;

    fn start() -> Self {
        let stall = Duration::from_secs(5);
        let engine = TransferEngine::new(
            "127.0.0.1",
            "P2PHANDSHAKE",
            Config {
                tcp_lane_budget: LANES,
                transfer_timeout: stall,
                ..two_lanes()
            },
        )
        .unwrap();
        let peer = HostilePeer::start(Answer::Never);
        let held = HostBuffer::new(Self::STALLED * BLOCK);
        held.fill(WRITE_FILL);
        let writes = batch(
            OpCode::Write,
            held.addr(),
            peer.remote,
            Self::STALLED,
            BLOCK,
        );
        // SAFETY: `held` goes with the batch; each test ends the batch before dropping it.
        let stalled = unsafe { engine.submit(&peer.session, &writes) }.unwrap();
        let started = Instant::now();
        while peer.requests.load(Ordering::Relaxed) < Self::STALLED as u64 {
            assert!(
                started.elapsed() < stall,
                "the stalled peer never got its requests"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Self {
            engine,
            peer,
            stalled,
            started,
            _held: held,
        }
    }
}

fn serve(
    mut s: TcpStream,
    answer: Answer,
    requests: &AtomicU64,
    foreign: &AtomicU64,
    resume: &AtomicBool,
) {
    // Only a guard: the initiator's end (engine dropped) ends every connection.
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut header = [0u8; HEADER_LEN];
    let mut payload = vec![0u8; 64 << 10];
    let mut read = 0usize;
    loop {
        if let Answer::StopReadingAfter(n) = answer {
            if read == n {
                while !resume.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        if s.read_exact(&mut header).is_err() {
            return;
        }
        let h = RequestHeader::decode(&header).unwrap();
        read += 1;
        requests.fetch_add(1, Ordering::Relaxed);
        if h.opcode == OpCode::Write {
            let mut left = h.size as usize;
            while left > 0 {
                let n = left.min(payload.len());
                if s.read_exact(&mut payload[..n]).is_err() {
                    return;
                }
                let odd = payload[..n].iter().filter(|&&b| b != WRITE_FILL).count();
                foreign.fetch_add(odd as u64, Ordering::Relaxed);
                left -= n;
            }
        }
        match answer {
            Answer::Garbage if s.write_all(&[0xFF; 8]).is_err() => return,
            Answer::Stagger { every, pause } => {
                if !answer_rightly(&mut s, &h) {
                    return;
                }
                if read.is_multiple_of(every) {
                    std::thread::sleep(pause);
                }
            }
            _ => {}
        }
    }
}

/// A v2 status (if asked for) and, for a read, its bytes; false once the socket failed.
fn answer_rightly(s: &mut TcpStream, h: &RequestHeader) -> bool {
    if h.v2 && s.write_all(&Status::Ok.encode()).is_err() {
        return false;
    }
    h.opcode != OpCode::Read || s.write_all(&vec![READ_FILL; h.size as usize]).is_ok()
}

/// A stand-in peer's misbehaviour, and what the callers must see.
struct Case {
    answer: Answer,
    /// What the callers' batches ask for.
    op: OpCode,
    /// Batches per thread.
    rounds: usize,
    /// Requests per batch, and bytes per request.
    reqs: usize,
    block: usize,
    /// The initiator's `transfer_timeout`.
    timeout: Duration,
    /// Each call returns within this.
    limit: Duration,
    /// The errors a call may fail with.
    expected: fn(&TransferError) -> bool,
}

/// `threads` threads, each `case.rounds` synchronous batches (of `case.op`) to `peer`
/// with memory of its own, freed (and reused) the moment the call returns. Every call must fail
/// as `case` expects, within its limit; returns the longest call.
fn callers_against(
    engine: &TransferEngine,
    peer: &HostilePeer,
    case: &Case,
    threads: usize,
) -> Duration {
    let longest = Mutex::new(Duration::ZERO);
    let slot = case.reqs * case.block;
    std::thread::scope(|s| {
        for t in 0..threads {
            let longest = &longest;
            s.spawn(move || {
                // Started together, the threads would all find the link idle and queue
                // to the lanes, round after round (they fail together at the deadline);
                // one after another, each finds the batches before it still in flight.
                // Spaced starts, not a wait for an event: a caller's batch is in flight
                // only inside its blocking call, which tells nobody when it is.
                std::thread::sleep(Duration::from_millis(10) * t as u32);
                for round in 0..case.rounds {
                    let mem = Mapping::new(slot, PAGE, WRITE_FILL);
                    let remote = peer.remote + (t * slot) as u64;
                    let reqs = batch(case.op, mem.buffer(), remote, case.reqs, case.block);
                    let started = Instant::now();
                    // SAFETY: the mapping is valid for the call; what happens after is
                    // what is tested.
                    let result = unsafe { engine.transfer_sync(&peer.session, &reqs) };
                    let took = started.elapsed();
                    mem.free_and_reuse();
                    match &result {
                        Err(EngineError::Transfer { source, .. }) if (case.expected)(source) => {}
                        other => panic!("thread {t} round {round}: {other:?}"),
                    }
                    assert!(took < case.limit, "thread {t} round {round}: took {took:?}");
                    mem.assert_untouched();
                    let mut l = longest.lock().unwrap();
                    *l = (*l).max(took);
                }
            });
        }
    });
    longest.into_inner().unwrap()
}

/// The calls against a peer behaving as `case` says fail in time and without sending
/// from freed memory; then the same engine, still with many callers, moves every byte to
/// a real target.
fn hostile_peer_under_many_callers(case: &Case) {
    let peer = HostilePeer::start(case.answer);
    let engine = TransferEngine::new(
        "127.0.0.1",
        "P2PHANDSHAKE",
        Config {
            // Set directly: MC_TRANSFER_TIMEOUT would not go under upstream's 5 s.
            transfer_timeout: case.timeout,
            ..two_lanes()
        },
    )
    .unwrap();
    let longest = callers_against(&engine, &peer, case, 8);
    let (opened, reopened) = connects(&engine);
    // Lanes reconnect after their connections are cut; caller connections are always
    // counted as new ones: beyond the lanes' first ones, callers had connections.
    assert!(
        opened - reopened > LANES as u64,
        "{opened} connects, {reopened} reconnects: no caller connection was opened"
    );
    let target = Target::start(4 * SLOT);
    many_callers(&engine, std::slice::from_ref(&target), 4, 10);
    drop(engine);
    // Lets the stalled connections take what the engine had sent, and anything sent later.
    peer.drain();
    assert!(
        peer.requests.load(Ordering::Relaxed) > 0,
        "the peer got no request"
    );
    let foreign = peer.foreign.load(Ordering::Relaxed);
    assert_eq!(
        foreign, 0,
        "{foreign} bytes sent from memory freed after the call"
    );
    eprintln!(
        "{:?}: longest call {longest:?}; {opened} connects, {reopened} reconnects",
        case.answer
    );
}

fn timeout_or_gone(e: &TransferError) -> bool {
    matches!(
        e,
        TransferError::Timeout(_) | TransferError::PeerLost { .. }
    )
}

/// Batches of 16 requests, as many as a lane's receiver queue takes
/// (`MC_TCP_PIPELINE_DEPTH`).
#[test]
fn callers_to_a_peer_that_never_answers_fail_at_the_deadline() {
    never_answered_fails_at_the_deadline(OpCode::Write, 16);
}

/// Batches of 32 requests, twice what a lane's receiver queue takes. When the statuses do
/// not come within 50 ms the caller hands the slices to the connection's receiver, which
/// is blocked reading the first missing status. With a queue bounded as a lane's, the
/// caller blocked in that hand-off until the receiver's read timed out
/// (`MC_TCP_STATUS_TIMEOUT_SEC`, 30 s), past the batch's deadline, since the caller itself
/// is the one who cancels the batch (31 s, before caller connections' queues were unbounded).
#[test]
fn callers_with_more_requests_than_the_pipeline_to_a_peer_that_never_answers_fail_at_the_deadline()
{
    never_answered_fails_at_the_deadline(OpCode::Write, REQS);
}

/// Batches of `reqs` requests (`op`) to a peer that never answers fail at their deadline
/// (800 ms), within 5 s more.
fn never_answered_fails_at_the_deadline(op: OpCode, reqs: usize) {
    hostile_peer_under_many_callers(&Case {
        op,
        answer: Answer::Never,
        rounds: 2,
        reqs,
        block: BLOCK,
        timeout: Duration::from_millis(800),
        limit: Duration::from_millis(800) + Duration::from_secs(5),
        expected: timeout_or_gone,
    });
}

/// The callers' sends block in a full socket (4 MiB batches, the most a caller sends
/// itself, to a peer that reads nothing): the send must give up at the batch's deadline.
/// The connection's deadline is only looked at between `sendmsg` calls: one blocked
/// `sendmsg` waited out the socket's send timeout (`MC_TCP_STATUS_TIMEOUT_SEC`, 30 s; 31 s
/// here) until the caller's send timeout was set to what is left of the deadline.
#[test]
fn callers_to_a_peer_that_stops_reading_fail_at_the_deadline() {
    hostile_peer_under_many_callers(&Case {
        op: OpCode::Write,
        answer: Answer::StopReadingAfter(0),
        rounds: 2,
        reqs: 16,
        block: 256 << 10,
        timeout: Duration::from_millis(800),
        limit: Duration::from_millis(800) + Duration::from_secs(5),
        expected: timeout_or_gone,
    });
}

/// Garbage instead of a status is a broken protocol: the calls fail at once, long before
/// their deadline (20 s).
#[test]
fn callers_to_a_peer_answering_garbage_fail_at_once() {
    garbage_fails_at_once(OpCode::Write);
}

/// Batches of `op` to a peer that answers garbage fail at once (deadline 20 s).
fn garbage_fails_at_once(op: OpCode) {
    hostile_peer_under_many_callers(&Case {
        op,
        answer: Answer::Garbage,
        // Each call fails within milliseconds: many of them, for calls to overlap.
        rounds: 20,
        reqs: REQS,
        block: BLOCK,
        timeout: Duration::from_secs(20),
        limit: Duration::from_secs(5),
        expected: |e| {
            matches!(
                e,
                TransferError::Protocol { .. } | TransferError::PeerLost { .. }
            )
        },
    });
}

/// Reads from a peer that never answers: the caller waits for the first reply 50 ms at
/// most, then leaves the batch to the connection's receiver and fails at the deadline; the
/// receiver writes nothing into the caller's memory once the call has returned.
#[test]
fn callers_reading_from_a_peer_that_never_answers_fail_at_the_deadline() {
    never_answered_fails_at_the_deadline(OpCode::Read, REQS);
}

/// Garbage instead of a read's status, read by the caller itself: a broken protocol, the
/// calls fail at once.
#[test]
fn callers_reading_from_a_peer_answering_garbage_fail_at_once() {
    garbage_fails_at_once(OpCode::Read);
}

/// A caller reads the replies to its batch of reads itself as they come; from the first
/// one that has not come within its 50 ms, the rest go to the connection's receiver, in
/// order, and every byte still lands. A peer that never answers holds the engine's lanes'
/// worth of slices in flight, so that every batch goes out on its caller's thread (over
/// one caller connection). What this checks is the hand-off mid-batch, in order; that the
/// caller read the first replies itself shows in no count here, only in the benchmark
/// (docs/benchmarks.md, issue 12, session 19).
#[test]
fn a_callers_reads_whose_replies_pause_are_finished_by_the_receiver() {
    const REPLIES: usize = 16;
    let pause = Duration::from_millis(120);
    let Saturated {
        engine,
        peer: stalling,
        stalled,
        _held,
        ..
    } = Saturated::start();

    // Pauses after the 6th and 12th reply of the connection, and so on.
    let peer = HostilePeer::start(Answer::Stagger { every: 6, pause });
    let local = HostBuffer::new(REPLIES * BLOCK);
    let before = connects(&engine).0;
    for round in 0..3 {
        local.fill(0);
        let reads = batch(OpCode::Read, local.addr(), peer.remote, REPLIES, BLOCK);
        let started = Instant::now();
        // SAFETY: `local` outlives the call, which waits for the batch.
        unsafe { engine.transfer_sync(&peer.session, &reads) }
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let took = started.elapsed();
        let got = local.read_at(0, REPLIES * BLOCK).unwrap();
        let wrong = got.iter().filter(|&&b| b != READ_FILL).count();
        assert_eq!(
            wrong, 0,
            "round {round}: {wrong} bytes not what the peer sent"
        );
        assert!(
            took >= pause,
            "round {round} took {took:?}: the peer's pause was not waited out"
        );
    }
    let opened = connects(&engine).0 - before;
    assert!(
        !stalled.is_finished(),
        "the stalled batch ended too soon for this test"
    );
    assert_eq!(
        opened, 1,
        "{opened} connections for the reads: they did not go on their caller's thread"
    );
    stalled.cancel_and_drain();
    drop(engine);
    stalling.drain();
    peer.drain();
}

/// A caller's send that a peer stalls gives the caller back within about a second, long
/// before a far deadline (20 s): the caller then waits for its batch as any caller does,
/// where the bindings see interrupts (Ctrl-C) and can cancel it. Before the send's stall
/// was bounded, `submit_to_wait` itself blocked in `sendmsg` until the deadline.
#[test]
fn a_callers_send_stalled_by_the_peer_returns_the_caller_to_its_wait() {
    let peer = HostilePeer::start(Answer::StopReadingAfter(0));
    let engine = TransferEngine::new(
        "127.0.0.1",
        "P2PHANDSHAKE",
        Config {
            transfer_timeout: Duration::from_secs(20),
            ..two_lanes()
        },
    )
    .unwrap();
    let (reqs, block) = (16, 256 << 10);
    let longest = Mutex::new(Duration::ZERO);
    // Every batch stays in flight until all are submitted: the later callers find the
    // link busy.
    let submitted = std::sync::Barrier::new(8);
    let turn = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..8usize {
            let (engine, peer, longest, submitted, turn) =
                (&engine, &peer, &longest, &submitted, &turn);
            s.spawn(move || {
                // One after another, so that later callers find the link busy: each once
                // the callers before it have submitted.
                let waited = Instant::now();
                while turn.load(Ordering::Acquire) < t as u64 {
                    assert!(
                        waited.elapsed() < Duration::from_secs(30),
                        "caller {t}: the callers before it never submitted"
                    );
                    std::thread::sleep(Duration::from_millis(1));
                }
                let local = HostBuffer::new(reqs * block);
                local.fill(WRITE_FILL);
                let remote = peer.remote + (t * reqs * block) as u64;
                let writes = batch(OpCode::Write, local.addr(), remote, reqs, block);
                let started = Instant::now();
                // SAFETY: `local` outlives the batch, drained below before it is dropped.
                let batch = unsafe { engine.submit_to_wait(&peer.session, &writes) }.unwrap();
                let took = started.elapsed();
                turn.fetch_add(1, Ordering::Release);
                submitted.wait();
                batch.cancel_and_drain();
                let mut l = longest.lock().unwrap();
                *l = (*l).max(took);
            });
        }
    });
    let longest = longest.into_inner().unwrap();
    let (opened, reopened) = connects(&engine);
    assert!(
        opened - reopened > LANES as u64,
        "{opened} connects, {reopened} reconnects: no caller connection was opened"
    );
    assert!(
        longest < Duration::from_secs(5),
        "a submit held its caller {longest:?} (deadline 20 s)"
    );
    drop(engine);
    peer.drain();
}
