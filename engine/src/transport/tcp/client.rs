//! The initiator side: per peer, a few persistent connections ("lanes"), each
//! pipelining requests.
//!
//! A lane thread takes slices from the peer's queue, [takes](crate::transport::Slice::take)
//! each on its connection, writes header and payload, and only then hands the slice to
//! the connection's receiver thread, which reads the status frame (v2) and, for reads,
//! the data; when nothing else is queued or awaiting a reply on that connection, the lane
//! reads the reply itself (one thread hand-off fewer for lone small requests). So at any
//! moment one thread owns a slice and its memory, and a cut of the connection stops that
//! thread's I/O. The queue is unbounded: any batch size is
//! accepted and the lanes drain it at the speed of the network (backpressure, never
//! rejection). A slice whose connection breaks is re-sent once on a fresh connection;
//! a peer that refuses connections fails queued slices at once instead of once per
//! connect timeout.
//!
//! A request alone in its batch, small and in host memory, to a link with nothing queued
//! or in flight, runs on the caller's thread instead ([`PeerLink::send_lone`]), over one
//! more connection of the link that no lane uses: the caller takes the slice on it, sends
//! it, and reads the reply once the whole of it has arrived; past a few milliseconds the
//! reply is left to that connection's receiver thread, so the caller never waits for a
//! peer beyond its batch's deadline.
//!
//! A synchronous batch of several requests to a link whose lanes already have work, or
//! while the engine has work for all its lanes, goes out on the caller's thread as well
//! ([`PeerLink::send_here`]), over one of the link's caller connections
//! (`MC_TCP_CALLER_CONNS`), each held by one caller for its batch; the caller also reads
//! the replies (a write's statuses once all of them are there, a read's replies each once
//! it is whole), or leaves those not read to the connection's receiver after
//! [`CALLER_REPLY_WAIT`].

use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded, Receiver, RecvError, Sender, TryRecvError};
use parking_lot::{Condvar, Mutex};

use super::budget::{LaneBudget, Membership};
use super::cut_reader::CutStream;
use super::halfway::Halfway;
use super::read_ahead::ReadAhead;
use crate::config::Config;
use crate::device::staging::NextSend;
use crate::error::TransferError;
use crate::log_throttle::LogThrottle;
use crate::memory::{Abort, MemSpan, SocketCut};
use crate::transport::{Held, Slice};
use crate::wire::tcp::{
    OpCode, RequestHeader, RunHeader, Status, HEADER_LEN, RUN_MAX_BYTES, RUN_MAX_WRITES, STATUS_LEN,
};

/// How long a failed connect keeps failing new slices without retrying.
const DEAD_PEER_HOLD: Duration = Duration::from_millis(500);

/// Bytes of reads a lane may have asked for and not yet received (beyond two requests)
/// before it leaves the peer's queue to the other lanes. A read request is a header, sent
/// in an instant: without this bound the first lanes to wake took `MC_TCP_PIPELINE_DEPTH`
/// requests each and the rest of the lanes stayed idle (4 of 8 lanes carried a batch of
/// 64 reads on the 16-core host, which is why reads did not scale with lanes).
const READ_BYTES_PER_LANE: u64 = 512 << 10;

/// Requests a lane may have out before [`READ_BYTES_PER_LANE`] holds it back: two, or
/// [`DEVICE_READS_OUT`] while a read into device memory is among them.
const REQUESTS_OUT: usize = 2;

/// Requests out while a read into device memory is: one, and a second once half of that
/// one's bytes are in (see [`InFlight::half_in`]). Such reads are cut in stripes of
/// a staging chunk (2 MiB), so two out kept twice the bytes of host reads in flight on a
/// connection. On the 16-CPU H200 host (loopback, 4 MiB x 64, cases rotated in one process,
/// 6 rounds), one out moved GPU-to-GPU reads 1.02-1.22x of two out (0.96 of host reads at
/// the median, from 0.87), reads into our GPU from host memory 0.98-1.33x (0.98 of host
/// reads, from 0.84), while four out moved 0.91-0.99x and 0.87-0.95x, and host reads cut in
/// 2 MiB stripes 0.84-0.88x of 1 MiB ones: the less a connection holds in flight, the faster
/// on loopback (docs/benchmarks.md, issue 12, session 17). Between hosts it is not measured;
/// the lanes together still hold 2 MiB each, as host reads do. With one out, though, the
/// peer never found the next read waiting, and each read waited there for its first chunk's
/// copy out of the device (some 125 us of each ~1 ms read, session 21). Asking for the next
/// when half is in lets the peer copy it ahead while it sends the rest: with the peer's
/// sends in pieces, GPU-to-GPU reads moved 1.06-1.15x of one out (session 21).
const DEVICE_READS_OUT: usize = 1;

/// Connection counters of every link (and the data server) of one TCP transport.
pub use crate::metrics::ConnectionCounters as LinkCounters;

enum LaneMsg {
    Work(Slice),
    Stop,
}

/// Connections to one peer data port.
pub struct PeerLink {
    shared: Arc<LinkShared>,
    rx: Receiver<LaneMsg>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// The connection of no lane, on which a caller runs a lone small request itself.
    direct: Mutex<Direct>,
    caller_cap: usize,
}

/// See [`PeerLink::send_lone`].
#[derive(Default)]
struct Direct {
    conn: Option<Conn>,
    /// Its connection broke and has not been replaced yet (the next connect is a
    /// reconnect).
    broke: bool,
}

/// How long a caller running a lone request itself waits for the reply before it leaves
/// the reply to the connection's receiver thread and returns to wait as for any batch,
/// where deadlines and interrupts are seen. A peer answers such a request in
/// microseconds; one that takes longer is busy, and a hand-off then costs little.
const DIRECT_REPLY_WAIT: Duration = Duration::from_millis(5);

/// How long a caller's send of a lone request may block. A safeguard: up to 16 KiB on a
/// connection with nothing owed fits the socket's send buffer even when the peer stopped
/// reading (seen with a peer window of 2 KiB), so the send does not wait in practice.
const DIRECT_SEND_WAIT: Duration = Duration::from_millis(100);

/// How a link frames its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Framing {
    /// v2 headers, each answered by a status (upstream 0.3.12+ and ours).
    pub v2: bool,
    /// Writes sent together go as a run, headers first ([`RunHeader`]; ours only).
    pub write_runs: bool,
}

struct LinkShared {
    peer: SocketAddr,
    v2: bool,
    write_runs: bool,
    connect_timeout: Duration,
    io_timeout: Duration,
    depth: usize,
    /// How long a lane looks for a lone small request's reply, and then for the next
    /// request, before sleeping.
    spin: Duration,
    /// The congestion control of connections to a peer on this host (`MC_TCP_SAME_HOST_CC`).
    same_host_cc: Option<String>,
    tx: Sender<LaneMsg>,
    dead: Mutex<Option<(Instant, String)>>,
    /// Every open connection, so shutdown can unblock their threads.
    open: Mutex<Vec<(u64, Arc<SocketCut>)>>,
    next_conn: AtomicU64,
    /// Slices queued or in flight.
    busy: AtomicUsize,
    created: Instant,
    /// Milliseconds after `created` of the last `send`.
    last_used_ms: AtomicU64,
    counters: Arc<LinkCounters>,
    /// This link's place in the engine's lane budget: lanes past its share sleep.
    lanes: Membership,
    /// Set when the link stops, so that sleeping lanes exit too.
    stopping: AtomicBool,
    /// Connections of this link open and not known broken (see [`refused_by_peer`]).
    healthy_conns: AtomicUsize,
    /// Lanes stepping back now (see [`step_back_for`]).
    lanes_out: AtomicUsize,
    refusal_log: LogThrottle,
    /// Idle connections of no lane on which callers send their batches themselves (see
    /// [`PeerLink::send_here`]).
    callers: Mutex<Vec<Conn>>,
    /// Caller connections open, idle or in use: at most `MC_TCP_CALLER_CONNS`.
    caller_conns: AtomicUsize,
    /// Until when no caller connection is opened: the peer refused one (see
    /// [`refused_by_peer`]); batches go to the lanes meanwhile.
    callers_refused_until: Mutex<Option<Instant>>,
}

impl PeerLink {
    /// Starts `cfg.tcp_lanes_per_peer` lanes towards `peer`, of which those within the
    /// link's share of `budget` take work; connections open on first use.
    /// Connects, reconnects and re-sends are counted in `counters`.
    pub fn new(
        peer: SocketAddr,
        framing: Framing,
        cfg: &Config,
        counters: Arc<LinkCounters>,
        budget: &Arc<LaneBudget>,
    ) -> io::Result<Self> {
        let (tx, rx) = unbounded();
        let shared = Arc::new(LinkShared {
            peer,
            v2: framing.v2,
            write_runs: framing.write_runs,
            connect_timeout: cfg.handshake_connect_timeout,
            io_timeout: cfg.tcp_status_timeout,
            depth: cfg.tcp_pipeline_depth,
            spin: cfg.tcp_spin,
            same_host_cc: cfg.tcp_same_host_cc.clone(),
            tx,
            dead: Mutex::new(None),
            open: Mutex::new(Vec::new()),
            next_conn: AtomicU64::new(0),
            busy: AtomicUsize::new(0),
            created: Instant::now(),
            last_used_ms: AtomicU64::new(0),
            counters,
            lanes: budget.join(),
            stopping: AtomicBool::new(false),
            healthy_conns: AtomicUsize::new(0),
            lanes_out: AtomicUsize::new(0),
            refusal_log: LogThrottle::per_second(),
            callers: Mutex::new(Vec::new()),
            caller_conns: AtomicUsize::new(0),
            callers_refused_until: Mutex::new(None),
        });
        let mut threads = Vec::new();
        for i in 0..cfg.tcp_lanes_per_peer {
            let s = shared.clone();
            let r = rx.clone();
            let spawned = std::thread::Builder::new()
                // Index before port: `perf` and `top` keep 15 characters of a name.
                .name(format!("te-lane-{i}-{}", peer.port()))
                .spawn(move || lane(s, r, i));
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    stop(&shared, threads);
                    return Err(e);
                }
            }
        }
        Ok(Self {
            shared,
            rx,
            threads: Mutex::new(threads),
            direct: Mutex::new(Direct::default()),
            caller_cap: cfg.tcp_caller_conns,
        })
    }

    /// The peer's data address.
    pub fn peer(&self) -> SocketAddr {
        self.shared.peer
    }

    /// Queues a slice; it completes (or fails) on its batch.
    pub fn send(&self, slice: Slice) {
        self.note_work();
        if let Err(e) = self.shared.tx.send(LaneMsg::Work(slice)) {
            if let LaneMsg::Work(s) = e.into_inner() {
                self.shared.fail(
                    s,
                    TransferError::Canceled("connection to the peer is shutting down"),
                );
            }
        }
    }

    /// Sends a request that is alone in its batch: when it is small, in host memory, and
    /// the link is idle, on the calling thread, over a connection kept for this, and
    /// waits there briefly for the reply; else queued as [`send`](Self::send) does.
    ///
    /// A lone request handed to a lane costs two wake-ups more (the lane's, then the
    /// caller's), each a hop to another CPU: on the 2-core VM those hops made 4 KiB
    /// requests' p99 twice upstream's. The peer's reply wakes this thread through the
    /// socket instead, which the kernel keeps on the waker's CPU.
    pub fn send_lone(&self, slice: Slice) {
        if let Some(slice) = self.run_here(slice) {
            self.send(slice);
        }
    }

    /// Runs `slice` on this thread if it qualifies; gives it back if not.
    fn run_here(&self, slice: Slice) -> Option<Slice> {
        let shared = &self.shared;
        let small = slice.len <= super::spin::SMALL_REQUEST && slice.local_device.is_none();
        // A v1 write has no reply to wait for: a lane sends it as well.
        let answered = shared.v2 || slice.op == OpCode::Read;
        if !small
            || !answered
            || slice.batch.is_canceled()
            || shared.busy.load(Ordering::Acquire) != 0
            || shared.stopping.load(Ordering::Acquire)
        {
            return Some(slice);
        }
        let Some(mut direct) = self.direct.try_lock() else {
            return Some(slice);
        };
        let Direct { conn, broke } = &mut *direct;
        // A reply left to the receiver earlier is still owed: this one would follow it.
        if conn.as_ref().is_some_and(|c| !c.pending.is_empty()) {
            return Some(slice);
        }
        if conn.as_ref().is_some_and(Conn::is_stale) {
            *conn = None;
            *broke = true;
        }
        self.note_work();
        let c = match conn.take() {
            Some(c) => c,
            None => match open_direct(shared, broke) {
                Ok(c) => c,
                Err(why) => {
                    shared.fail(slice, shared.unreachable(why));
                    return None;
                }
            },
        };
        let c = conn.insert(c);
        if let Some(held) = c.take(slice, shared) {
            c.run(held, shared);
        }
        None
    }

    /// Sends a batch's `slices` (at least two, its caller waiting for it at once) on the
    /// calling thread, over a connection of no lane, when the lanes have work enough
    /// already; gives back what it did not take (to be queued as by [`send`](Self::send)).
    ///
    /// Under many callers the lanes are a hand-off per batch at least (the caller's
    /// slices wake a lane on another CPU, which copies them out); the caller copying them
    /// out itself saves the wake-up and the lane's sleep. A lone caller's batch still goes
    /// to the lanes, whose connections carry it in parallel.
    ///
    /// "Work enough" is the link's share of lanes in slices, or, for a link with less, a
    /// slice out over the whole engine for every lane of its budget: callers rotating over
    /// four peers found their link with little in flight for 11-12% of their batches on
    /// the 16-CPU host, and handing those to lanes then cost about 1.6 times the callers'
    /// CPU per byte; sent by their callers, the serving shape took 8-15% less CPU per
    /// request (docs/benchmarks.md, issue 12, sessions 18-19).
    pub fn send_here(&self, slices: Vec<Slice>) -> Vec<Slice> {
        let shared = &self.shared;
        if self.caller_cap == 0
            || shared.stopping.load(Ordering::Acquire)
            || !has_work_enough(shared.busy.load(Ordering::Acquire), shared.lanes.budget())
            || slices.iter().map(|s| s.len).sum::<u64>() > CALLER_BATCH_BYTES
            || slices.iter().any(|s| s.local_device.is_some())
        {
            return slices;
        }
        let Some(mut c) = self.caller_conn() else {
            return slices;
        };
        shared.add_busy(slices.len());
        self.note_use();
        let mut group = Vec::with_capacity(slices.len());
        for slice in slices {
            if slice.batch.is_canceled() {
                shared.fail_canceled(slice);
            } else if let Some(held) = c.take(slice, shared) {
                group.push(held);
            }
        }
        if let Some(first) = group.first() {
            let deadline = first.slice().batch.deadline();
            let now = Instant::now();
            let left = deadline.saturating_duration_since(now);
            c.cut.set_deadline(Some(left));
            // A `sendmsg` blocked on a peer that stopped reading returns by the deadline,
            // which the send then sees, or after `CALLER_SEND_STALL` without progress (the
            // socket's own timeout is the status timeout, 30 s by default).
            let step = left.clamp(Duration::from_millis(1), CALLER_SEND_STALL);
            if c.stream.set_write_timeout(Some(step)).is_err() {
                c.break_off();
            }
            // On a connection that owes nothing else the replies are this batch's alone,
            // and this thread can wait for them: writes answered by statuses, or reads
            // whose replies each fit the socket's low mark.
            let writes = shared.v2
                && group.len() <= CALLER_REPLIES
                && group.iter().all(|h| h.slice().op == OpCode::Write);
            let reads = group
                .iter()
                .all(|h| h.slice().op == OpCode::Read && h.slice().len <= CALLER_READ_REPLY);
            let until = deadline.min(now + CALLER_REPLY_WAIT);
            if !c.pending.is_empty() || !(writes || reads) {
                c.send_group(&mut group, shared);
            } else if c.write_group(&mut group, shared) {
                if writes {
                    c.settle_here(&mut group, shared, until);
                } else {
                    c.settle_reads_here(&mut group, shared, until);
                }
            }
            c.cut.set_deadline(None);
        }
        if c.is_broken() {
            shared.drop_caller_conn(c);
        } else {
            shared.callers.lock().push(c);
        }
        Vec::new()
    }

    /// An idle caller connection, or a new one within the cap; `None` if none is free.
    fn caller_conn(&self) -> Option<Conn> {
        let shared = &self.shared;
        loop {
            let Some(c) = shared.callers.lock().pop() else {
                break;
            };
            if !c.is_stale() {
                return Some(c);
            }
            shared.drop_caller_conn(c);
        }
        if shared
            .callers_refused_until
            .lock()
            .is_some_and(|until| Instant::now() < until)
        {
            return None;
        }
        let open = shared.caller_conns.fetch_add(1, Ordering::AcqRel);
        if open >= self.caller_cap || shared.recently_dead().is_some() {
            shared.caller_conns.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let mut broke = false;
        match connect(shared, &mut broke, Handoff::Unbounded) {
            Ok(c) => Some(c),
            Err(_) => {
                shared.caller_conns.fetch_sub(1, Ordering::AcqRel);
                None
            }
        }
    }

    fn note_work(&self) {
        self.shared.add_busy(1);
        self.note_use();
    }

    fn note_use(&self) {
        self.shared.lanes.busy();
        let now_ms = self.shared.created.elapsed().as_millis() as u64;
        self.shared.last_used_ms.store(now_ms, Ordering::Relaxed);
    }

    /// Why the last connect failed, if it failed recently.
    pub fn unreachable(&self) -> Option<String> {
        self.shared.recently_dead()
    }

    /// Leaves the lane budget to other links if this one has had no work for `idle`.
    pub fn rest_if_idle(&self, idle: Duration) {
        if self.idle_for(idle) {
            self.shared.lanes.rest();
        }
    }

    fn idle_for(&self, idle: Duration) -> bool {
        if self.shared.busy.load(Ordering::Acquire) > 0 {
            return false;
        }
        let idle_ms = (self.shared.created.elapsed().as_millis() as u64)
            .saturating_sub(self.shared.last_used_ms.load(Ordering::Relaxed));
        idle_ms >= idle.as_millis() as u64
    }

    /// Whether the link has no work and was unused for `idle`, or its peer is gone.
    pub fn evictable(&self, idle: Duration) -> bool {
        self.idle_for(idle)
            || (self.shared.busy.load(Ordering::Acquire) == 0 && self.shared.dead.lock().is_some())
    }
}

impl Drop for PeerLink {
    fn drop(&mut self) {
        let threads = std::mem::take(&mut *self.threads.lock());
        stop(&self.shared, threads);
        // After `stop` cut them: a receiver waiting for a reply returns at once.
        // The pool also breaks the cycle its connections (which hold `shared`) make.
        self.shared.callers.lock().clear();
        while let Ok(msg) = self.rx.try_recv() {
            if let LaneMsg::Work(s) = msg {
                self.shared
                    .fail(s, TransferError::Canceled("the engine shut down"));
            }
        }
    }
}

/// Cuts every connection (unblocking receivers waiting on replies that will never
/// come) and joins the lanes.
fn stop(shared: &LinkShared, threads: Vec<JoinHandle<()>>) {
    shared.stopping.store(true, Ordering::Release);
    shared.lanes.budget().wake_all();
    for (_, cut) in shared.open.lock().iter() {
        cut.abort();
    }
    for _ in 0..threads.len() {
        let _ = shared.tx.send(LaneMsg::Stop);
    }
    for t in threads {
        let _ = t.join();
    }
}

impl LinkShared {
    fn recently_dead(&self) -> Option<String> {
        let dead = self.dead.lock();
        dead.as_ref()
            .filter(|(at, _)| at.elapsed() < DEAD_PEER_HOLD)
            .map(|(_, why)| why.clone())
    }

    fn unreachable(&self, reason: String) -> TransferError {
        TransferError::PeerUnreachable {
            peer: self.peer.to_string(),
            reason,
        }
    }

    /// Puts a slice not taken back on the queue, for any lane.
    fn requeue(&self, slice: Slice) {
        if let Err(e) = self.tx.send(LaneMsg::Work(slice)) {
            if let LaneMsg::Work(s) = e.into_inner() {
                self.fail(s, TransferError::Canceled("the engine shut down"));
            }
        }
    }

    /// Completes a slice of a canceled batch, not taken.
    fn fail_canceled(&self, slice: Slice) {
        self.fail(
            slice,
            TransferError::Canceled("its batch was canceled (deadline or interrupt)"),
        );
    }

    /// `n` more of the link's slices are queued or in flight (and so of the engine's).
    fn add_busy(&self, n: usize) {
        self.busy.fetch_add(n, Ordering::AcqRel);
        self.lanes.budget().add_out(n);
    }

    /// `n` of the link's slices are done.
    fn sub_busy(&self, n: usize) {
        self.busy.fetch_sub(n, Ordering::AcqRel);
        self.lanes.budget().sub_out(n);
    }

    /// Completes a slice that was not taken.
    fn fail(&self, slice: Slice, error: TransferError) {
        slice.finish(Err(error));
        self.sub_busy(1);
    }

    /// Completes a taken slice.
    fn complete(&self, held: Held, result: Result<(), TransferError>) {
        held.finish(result);
        self.sub_busy(1);
    }

    /// A caller connection is done for; if the peer refused it, callers open none for
    /// [`CALLER_REFUSED_PAUSE`] (each would be refused too, and its batch sent again).
    fn drop_caller_conn(&self, c: Conn) {
        let replies = c.replies.clone();
        // Dropped first: its receiver has read (or given up on) every reply by then.
        drop(c);
        self.caller_conns.fetch_sub(1, Ordering::AcqRel);
        if replies.refused.load(Ordering::Acquire) {
            self.pause_callers();
        }
    }

    fn pause_callers(&self) {
        *self.callers_refused_until.lock() = Some(Instant::now() + CALLER_REFUSED_PAUSE);
    }

    /// The peer refused a lane's connection: idle caller connections give their places
    /// at the peer back (a capped peer's every place may be held by them, with the lanes'
    /// work waiting), and callers open none for a while.
    fn shed_idle_callers(&self) {
        self.pause_callers();
        let idle = std::mem::take(&mut *self.callers.lock());
        let closed = idle.len();
        drop(idle);
        self.caller_conns.fetch_sub(closed, Ordering::AcqRel);
    }

    /// Sends a slice of a connection the peer refused (see [`refused_by_peer`]) back to the
    /// queue for the link's other lanes, without using up its one re-send: the peer never
    /// took the request.
    fn step_back(&self, held: Held) {
        self.requeue(held.release());
    }

    /// `held`'s connection failed with `e`: its slice is re-sent (for free if the peer
    /// refused the connection), or failed.
    fn resend_after(&self, replies: &Replies, held: Held, e: &io::Error, reason: &str) {
        if refused_by_peer(replies, self, e) {
            self.step_back(held);
        } else {
            self.retry_or_fail(held, reason);
        }
    }

    fn retry_or_fail(&self, held: Held, reason: &str) {
        let mut slice = held.release();
        if slice.retries == 0 && !slice.batch.is_canceled() {
            slice.retries += 1;
            self.counters.retries.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("re-sending a slice to {} after: {reason}", self.peer);
            if let Err(e) = self.tx.send(LaneMsg::Work(slice)) {
                if let LaneMsg::Work(s) = e.into_inner() {
                    self.fail(s, self.gone(reason));
                }
            }
        } else {
            self.fail(slice, self.gone(reason));
        }
    }

    fn gone(&self, reason: &str) -> TransferError {
        TransferError::PeerGone {
            peer: self.peer.to_string(),
            reason: reason.to_string(),
        }
    }
}

fn lane(shared: Arc<LinkShared>, rx: Receiver<LaneMsg>, index: usize) {
    let mut conn: Option<Conn> = None;
    // This lane's connection broke and has not been replaced yet.
    let mut broke = false;
    // The last slice was a lone small request (its reply read here): the next may follow
    // within microseconds, so look for it awake. Under load the queue is rarely empty and
    // a spinning thread would only take a CPU from one with work.
    let mut lone = false;
    let mut group = Vec::new();
    let mut pause = REFUSED_PAUSE;
    loop {
        if index >= shared.lanes.budget().share() {
            // About to park: its staging memory goes to the lanes within the share.
            crate::device::staging::give_back_thread_stagers();
        }
        shared
            .lanes
            .budget()
            .wait_for_share(index, &shared.stopping);
        if shared.stopping.load(Ordering::Acquire) {
            break;
        }
        if let Some(c) = conn.as_ref() {
            c.pending.wait_below(READ_BYTES_PER_LANE, &c.replies.broken);
        }
        let spin = if lone { shared.spin } else { Duration::ZERO };
        let Ok(LaneMsg::Work(slice)) = next(&rx, spin) else {
            break;
        };
        lone = false;
        // The share shrank while this lane waited for work (another link got busy): the
        // work goes back for a lane within the share, and this one parks.
        if index >= shared.lanes.budget().share() {
            shared.requeue(slice);
            continue;
        }
        if slice.batch.is_canceled() {
            shared.fail_canceled(slice);
            continue;
        }
        if conn.as_ref().is_some_and(Conn::is_stale) {
            let refused = conn
                .as_ref()
                .is_some_and(|c| c.replies.refused.load(Ordering::Acquire));
            // Dropped first: its receiver has sent its slices back by then.
            conn = None;
            broke = true;
            if refused {
                shared.requeue(slice);
                shared.shed_idle_callers();
                if step_back_for(&shared, index, pause) {
                    pause = (pause * 2).min(REFUSED_PAUSE_MAX);
                }
                continue;
            }
        }
        if conn
            .as_ref()
            .is_some_and(|c| c.replies.answered.load(Ordering::Acquire))
        {
            pause = REFUSED_PAUSE;
        }
        if conn.is_none() {
            if let Some(why) = shared.recently_dead() {
                shared.fail(slice, shared.unreachable(why));
                continue;
            }
            match connect(&shared, &mut broke, Handoff::Depth) {
                Ok(c) => conn = Some(c),
                Err(why) => {
                    shared.fail(slice, shared.unreachable(why));
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let Some(held) = c.take(slice, &shared) else {
            continue;
        };
        if held.slice().local_device.is_some() {
            lone = c.send_device_run(held, &rx, &shared, index);
            continue;
        }
        if rx.is_empty() {
            lone = c.send(held, &shared, true, Ahead::default());
            continue;
        }
        group.push(held);
        let stop = c.gather(&mut group, &rx, &shared);
        if group.len() == 1 {
            if let Some(held) = group.pop() {
                lone = c.send(held, &shared, rx.is_empty(), Ahead::default());
            }
        } else {
            c.send_group_and_settle(&mut group, &shared);
        }
        if stop {
            break;
        }
    }
}

/// Lane `index` stays out of the link's work for `pause` (or until the link stops): the
/// peer refused its connection, and the link's other lanes carry on. The last lane of the
/// link's share still in never stays out for long (its work would wait for it, with no
/// lane to take it): it waits [`LAST_LANE_PAUSE`] and tries again. True if it stepped back.
fn step_back_for(shared: &LinkShared, index: usize, pause: Duration) -> bool {
    let out = shared.lanes_out.fetch_add(1, Ordering::AcqRel) + 1;
    let others_in = out < shared.lanes.budget().share();
    let pause = if others_in { pause } else { LAST_LANE_PAUSE };
    if let Some(left_out) = shared.refusal_log.allow() {
        tracing::warn!(
            "peer {} refused a data connection of lane {index} (its data server is at \
             MC_TCP_SERVER_MAX_CONNECTIONS or _PER_IP); the lane steps back for {pause:?} \
             and the other lanes carry its requests; {left_out} such lines left out",
            shared.peer
        );
    }
    let until = Instant::now() + pause;
    while !shared.stopping.load(Ordering::Acquire) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
    shared.lanes_out.fetch_sub(1, Ordering::AcqRel);
    others_in
}

/// Opens a connection to the peer and counts it (a reconnect if `broke`, which it clears);
/// a failure is why, also kept as the link's recent death (new slices fail at once for
/// [`DEAD_PEER_HOLD`]).
fn connect(shared: &Arc<LinkShared>, broke: &mut bool, handoff: Handoff) -> Result<Conn, String> {
    match Conn::open(shared, handoff) {
        Ok(c) => {
            *shared.dead.lock() = None;
            shared.counters.connects.fetch_add(1, Ordering::Relaxed);
            if std::mem::take(broke) {
                shared.counters.reconnects.fetch_add(1, Ordering::Relaxed);
            }
            Ok(c)
        }
        Err(e) => {
            let why = format!("connect failed: {e}");
            tracing::warn!("peer {} unreachable: {why}", shared.peer);
            *shared.dead.lock() = Some((Instant::now(), why.clone()));
            Err(why)
        }
    }
}

/// Opens the link's direct connection (see [`PeerLink::send_lone`]), as a lane opens its
/// own; a peer that failed to connect within [`DEAD_PEER_HOLD`] fails at once, as for a lane.
fn open_direct(shared: &Arc<LinkShared>, broke: &mut bool) -> Result<Conn, String> {
    if let Some(why) = shared.recently_dead() {
        return Err(why);
    }
    let c = connect(shared, broke, Handoff::Depth)?;
    // A request the socket does not take at once (a peer that stopped reading) breaks
    // the connection and goes to a lane, instead of holding up the caller.
    c.stream
        .set_write_timeout(Some(DIRECT_SEND_WAIT))
        .map_err(|e| format!("setting a send timeout failed: {e}"))?;
    Ok(c)
}

/// Why the slices of a connection the peer refused went back to the queue.
const REFUSED: &str = "the peer refused the connection (its data server's connection cap)";

/// How long a lane whose connection the peer refused stays out at first; doubled at each
/// refusal in a row, up to [`REFUSED_PAUSE_MAX`]. Meanwhile the link's other lanes carry
/// its work.
const REFUSED_PAUSE: Duration = Duration::from_secs(1);
const REFUSED_PAUSE_MAX: Duration = Duration::from_secs(30);

/// How long the link's last lane still in waits after the peer refused its connection.
const LAST_LANE_PAUSE: Duration = Duration::from_millis(100);

/// How long callers open no connection of their own after the peer refused one.
const CALLER_REFUSED_PAUSE: Duration = Duration::from_secs(5);

/// Bytes of a batch sent on its caller's thread at most: a larger one is carried faster
/// by the lanes' connections in parallel.
const CALLER_BATCH_BYTES: u64 = 4 << 20;

/// Statuses of a caller's batch that the caller waits for itself at most (they must fit
/// the socket's receive buffer).
const CALLER_REPLIES: usize = 1024;

/// The largest read whose reply a caller reads itself: the reply must fit under the
/// socket's low mark (the kernel caps it at half the largest receive buffer,
/// `net.ipv4.tcp_rmem`), so that waiting for it whole never ends early and reading it
/// then never blocks.
const CALLER_READ_REPLY: u64 = 256 << 10;

/// How long a caller's send may make no progress: then the connection is broken off, the
/// batch's slices go to the lanes (as a re-send), and the caller waits as for any batch,
/// where interrupts (Ctrl-C in Python) are seen. A peer that takes in nothing for this long
/// has stopped reading.
const CALLER_SEND_STALL: Duration = Duration::from_secs(1);

/// How long a caller waits for its batch's statuses itself before it leaves them to the
/// connection's receiver and waits as for any batch (where interrupts are seen).
const CALLER_REPLY_WAIT: Duration = Duration::from_millis(50);

/// Requests sent together in one `sendmsg` at most (the queue permitting): fewer system
/// calls, segments and wake-ups of the peer per request when many small ones are queued.
const GROUP_REQUESTS: usize = 16;
/// Payload bytes of writes sent together at most: beyond this a request is large enough
/// to carry its own system call.
const GROUP_BYTES: u64 = 256 << 10;

/// How many sent slices a connection's receiver may have queued before the sender waits.
#[derive(Clone, Copy)]
enum Handoff {
    /// `MC_TCP_PIPELINE_DEPTH`: a lane then waits, the pipeline full.
    Depth,
    /// Any number: a caller's thread hands over its batch's slices and goes on to wait for
    /// the batch, where its deadline is kept; blocked here, behind a receiver waiting for a
    /// status that does not come, it was held for `MC_TCP_STATUS_TIMEOUT_SEC` instead.
    /// What a caller hands over is one batch of at most [`CALLER_BATCH_BYTES`].
    Unbounded,
}

struct Conn {
    id: u64,
    shared: Arc<LinkShared>,
    stream: TcpStream,
    cut: Arc<SocketCut>,
    holder: Arc<dyn Abort>,
    /// The batch this connection last took a slice of (see `Slice::take`).
    last_batch: u64,
    inflight: Option<Sender<Held>>,
    /// Slices handed to the receiver whose reply it has not read yet.
    pending: Arc<InFlight>,
    replies: Arc<Replies>,
    receiver: Option<JoinHandle<()>>,
}

/// The reading side of a connection, shared by its two readers of replies: the receiver
/// thread, and the lane for a lone request (only while nothing else is owed, so they
/// never read at once).
struct Replies {
    stream: TcpStream,
    cut: Arc<SocketCut>,
    broken: AtomicBool,
    ahead: Mutex<ReadAhead>,
    /// A reply came on this connection.
    answered: AtomicBool,
    /// The peer refused this connection (see [`refused_by_peer`]).
    refused: AtomicBool,
}

impl Replies {
    /// The connection is broken: counted out of the link's healthy ones once.
    fn mark_broken(&self, shared: &LinkShared) {
        if !self.broken.swap(true, Ordering::AcqRel) {
            shared.healthy_conns.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Conn {
    fn open(shared: &Arc<LinkShared>, handoff: Handoff) -> io::Result<Self> {
        let stream = TcpStream::connect_timeout(&shared.peer, shared.connect_timeout)?;
        stream.set_nodelay(true)?;
        super::same_host::tune(&stream, shared.same_host_cc.as_deref());
        stream.set_read_timeout(Some(shared.io_timeout))?;
        stream.set_write_timeout(Some(shared.io_timeout))?;
        let (tx, rx) = match handoff {
            Handoff::Depth => bounded(shared.depth),
            Handoff::Unbounded => unbounded(),
        };
        let pending = Arc::new(InFlight::default());
        let cut = Arc::new(SocketCut::new(stream.try_clone()?));
        let replies = Arc::new(Replies {
            stream: stream.try_clone()?,
            cut: cut.clone(),
            broken: AtomicBool::new(false),
            ahead: Mutex::new(ReadAhead::default()),
            answered: AtomicBool::new(false),
            refused: AtomicBool::new(false),
        });
        let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        shared.open.lock().push((id, cut.clone()));
        let (s, r, p) = (shared.clone(), replies.clone(), pending.clone());
        let receiver = std::thread::Builder::new()
            .name(format!("te-recv-{id}-{}", shared.peer.port()))
            .spawn(move || receive(&r, rx, p, s));
        let receiver = match receiver {
            Ok(r) => r,
            Err(e) => {
                shared.open.lock().retain(|(i, _)| *i != id);
                return Err(e);
            }
        };
        shared.healthy_conns.fetch_add(1, Ordering::AcqRel);
        Ok(Self {
            id,
            shared: shared.clone(),
            stream,
            holder: cut.clone(),
            last_batch: 0,
            cut,
            inflight: Some(tx),
            pending,
            replies,
            receiver: Some(receiver),
        })
    }

    fn is_broken(&self) -> bool {
        self.replies.broken.load(Ordering::Acquire) || self.cut.is_cut()
    }

    /// Broken, or closed by the peer while idle (its idle timeout): to be replaced before
    /// use, rather than found out by a request, which would use up the request's one
    /// re-send (on another connection that may be just as stale).
    fn is_stale(&self) -> bool {
        self.is_broken() || (self.pending.is_empty() && self.closed_by_peer())
    }

    /// The peer closed (or reset) this connection: it is readable with nothing to read.
    /// Only meaningful while no reply is owed.
    fn closed_by_peer(&self) -> bool {
        crate::net::closed_by_peer(self.stream.as_raw_fd())
    }

    fn break_off(&self) {
        self.replies.mark_broken(&self.shared);
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Takes `slice` for I/O on this connection; `None` if it was finished instead
    /// (canceled batch or unregistered buffer).
    fn take(&mut self, slice: Slice, shared: &LinkShared) -> Option<Held> {
        let held = slice.take(&self.holder, &mut self.last_batch);
        if held.is_none() {
            shared.sub_busy(1);
        }
        held
    }

    /// Adds to `group` the host-memory slices queued behind its first, within
    /// [`GROUP_REQUESTS`], [`GROUP_BYTES`], the pipeline depth, this lane's share of
    /// reads owed and its share of the slices queued. A slice that cannot join (device
    /// memory) goes back to the queue for any lane; true if a stop was taken off the queue.
    fn gather(
        &mut self,
        group: &mut Vec<Held>,
        rx: &Receiver<LaneMsg>,
        shared: &LinkShared,
    ) -> bool {
        let cap = group_cap(
            shared.depth,
            rx.len() + group.len(),
            group.first().map_or(0, |h| h.slice().batch.len()),
            shared.lanes.budget().share(),
        );
        let mut bytes: u64 = group.iter().map(|h| write_bytes(h.slice())).sum();
        let mut owed = self.pending.bytes.load(Ordering::Acquire)
            + group.iter().map(|h| owed_bytes(h.slice())).sum::<u64>();
        while group.len() < cap && bytes < GROUP_BYTES && owed < READ_BYTES_PER_LANE {
            let slice = match rx.try_recv() {
                Ok(LaneMsg::Work(slice)) => slice,
                Ok(LaneMsg::Stop) => return true,
                Err(_) => break,
            };
            if slice.local_device.is_some() {
                shared.requeue(slice);
                break;
            }
            if slice.batch.is_canceled() {
                shared.fail_canceled(slice);
                continue;
            }
            if let Some(held) = self.take(slice, shared) {
                bytes += write_bytes(held.slice());
                owed += owed_bytes(held.slice());
                group.push(held);
            }
        }
        false
    }

    /// Sends `held` (device memory) and the device-memory writes queued right behind it,
    /// one after another, each one's first chunk copied out of the device while the one
    /// before is sent: otherwise each request's send starts with a wait for that copy.
    /// True if the last was a lone small request whose reply was read here.
    fn send_device_run(
        &mut self,
        mut held: Held,
        rx: &Receiver<LaneMsg>,
        shared: &LinkShared,
        index: usize,
    ) -> bool {
        let mut copied = false;
        loop {
            let next = self.next_device_write(&held, rx, shared, index);
            let ahead = Ahead {
                copied,
                next: next
                    .as_ref()
                    .map(|n| (n.slice().local, n.slice().len as usize)),
            };
            let lone = self.send(held, shared, rx.is_empty() && next.is_none(), ahead);
            let Some(next) = next else { return lone };
            if self.is_broken() {
                // Never sent: back to the queue, its one re-send kept.
                shared.step_back(next);
                return false;
            }
            held = next;
            copied = true;
        }
    }

    /// Takes the next queued slice if it is a write out of the same device as `held`'s
    /// (itself a write), for [`send_device_run`](Self::send_device_run); anything else
    /// taken off the queue goes back to it.
    fn next_device_write(
        &mut self,
        held: &Held,
        rx: &Receiver<LaneMsg>,
        shared: &LinkShared,
        index: usize,
    ) -> Option<Held> {
        let s = held.slice();
        if s.op != OpCode::Write
            || index >= shared.lanes.budget().share()
            || shared.stopping.load(Ordering::Acquire)
        {
            return None;
        }
        let slice = match rx.try_recv() {
            Ok(LaneMsg::Work(slice)) => slice,
            Ok(LaneMsg::Stop) => {
                // For whichever lane looks next; this one stops on its own later.
                let _ = shared.tx.send(LaneMsg::Stop);
                return None;
            }
            Err(_) => return None,
        };
        if slice.op != OpCode::Write || slice.local_device != s.local_device {
            shared.requeue(slice);
            return None;
        }
        if slice.batch.is_canceled() {
            shared.fail_canceled(slice);
            return None;
        }
        self.take(slice, shared)
    }

    /// Sends the requests of `group` in one go and hands them to the receiver.
    fn send_group(&mut self, group: &mut Vec<Held>, shared: &LinkShared) {
        if self.write_group(group, shared) {
            for held in group.drain(..) {
                self.sent(held, shared);
            }
        }
    }

    /// Sends the requests of `group` in one go; when they are all reads and nothing is owed
    /// on this connection, reads their replies on this thread, else hands them to the
    /// receiver.
    ///
    /// Handing a group of reads to the receiver woke a second thread per lane and group, on
    /// the path that carries the data. Reading the replies here moved 64 KiB x 64 reads
    /// 10-30% more on the 16-CPU host (`docs/benchmarks.md`, session 15), when only a lane
    /// that found nothing queued behind its group did so. Every lane does now, whatever is
    /// queued: the lanes still take the batch in even shares, and a lane's next group
    /// waits for its replies, as it would for the reads owed (`READ_BYTES_PER_LANE`). In
    /// one process against the same target, 64 KiB x 64 reads moved 1.25x at the median
    /// over 5 rounds (0.75-2.11) with 0.79-0.89 of the CPU per request on the 16-CPU host,
    /// and 1.2-1.6x with 0.6-0.75 of it on the 2-CPU VM, where larger batches of small reads
    /// gained 1.3-1.9x (session 20). Groups of writes still go to the receiver: with them read
    /// here as well, one of three runs of the serving shape (4 peers) on that host ended
    /// in a failed batch whose cause was not found (its log stayed there).
    fn send_group_and_settle(&mut self, group: &mut Vec<Held>, shared: &LinkShared) {
        let reads = group.iter().all(|h| h.slice().op == OpCode::Read);
        if !(reads && self.pending.is_empty()) {
            self.send_group(group, shared);
            return;
        }
        if self.write_group(group, shared) {
            self.settle_all(group, shared);
        }
    }

    /// Reads the replies to `group`, in order, on this thread (nothing else owed on the
    /// connection); once one shows the connection broken, the rest are re-sent or failed.
    fn settle_all(&self, group: &mut Vec<Held>, shared: &LinkShared) {
        let mut failure: Option<String> = None;
        for held in group.drain(..) {
            settle_next(&self.replies, held, shared, &mut failure);
        }
    }

    /// Reads the statuses answering `group` (writes just sent, nothing owed before them)
    /// on this thread once all of them have come, waiting until `until`; past it they
    /// are left to the receiver, and the caller waits as for any batch.
    fn settle_here(&mut self, group: &mut Vec<Held>, shared: &LinkShared, until: Instant) {
        if !self.replies_here_by(group.len() * STATUS_LEN, until) {
            for held in group.drain(..) {
                self.sent(held, shared);
            }
            return;
        }
        self.settle_all(group, shared);
    }

    /// Reads the replies to `group` (reads just sent, nothing owed before them) on this
    /// thread, each once the whole of it has come, until `until`; from the first one not
    /// whole by then, they are left to the receiver, and the caller waits as for any batch.
    ///
    /// Handed to the receiver, a batch of reads cost a second thread's wake-up and the
    /// caller's wake-up after it, on the path that carries the data: the serving shape as
    /// reads (10 threads, batches of 32 x 32 KiB) moved 6-8 GB/s from one peer on the
    /// 16-CPU host, batch p99 3.7-4.2 ms; read here, 27-30 GB/s and 0.79-0.88 ms
    /// (docs/benchmarks.md, issue 12, session 19).
    fn settle_reads_here(&mut self, group: &mut Vec<Held>, shared: &LinkShared, until: Instant) {
        let mut failure: Option<String> = None;
        let mut rest = std::mem::take(group).into_iter();
        while let Some(held) = rest.next() {
            let whole = usize::from(shared.v2) * STATUS_LEN + owed_bytes(held.slice()) as usize;
            if failure.is_none() && !self.replies_here_by(whole, until) {
                // In order: once one reply is the receiver's, so are the rest.
                self.sent(held, shared);
                rest.for_each(|h| self.sent(h, shared));
                return;
            }
            settle_next(&self.replies, held, shared, &mut failure);
        }
    }

    /// Waits (in `poll`, with the socket's low mark at what is missing) until `whole`
    /// bytes of replies are here or the connection ended, so that reading them cannot
    /// block; false if `until` came first. It does not spin: the statuses of a batch come
    /// after the peer has taken in all of it, hundreds of microseconds for the serving
    /// shape, and a spin of `MC_TCP_SPIN_US` (one `FIONREAD` after another) only burned
    /// that much CPU per batch.
    fn replies_here_by(&self, whole: usize, until: Instant) -> bool {
        let fd = self.stream.as_raw_fd();
        let need = whole.saturating_sub(self.replies.ahead.lock().buffered());
        // An error shows again when the replies are read.
        if need == 0 || crate::net::bytes_queued(fd).map_or(true, |n| n >= need) {
            return true;
        }
        if crate::net::set_read_low_mark(fd, need).is_err() {
            return false;
        }
        let left = until.saturating_duration_since(Instant::now());
        let ready = crate::net::wait_readable(&self.stream, left).unwrap_or(true);
        let reset = crate::net::set_read_low_mark(fd, 1);
        ready || reset.is_err()
    }

    /// Sends the requests of `group` in one go; on failure the connection is broken off
    /// and every slice of `group` re-sent once (or failed), and false is returned.
    fn write_group(&mut self, group: &mut Vec<Held>, shared: &LinkShared) -> bool {
        let headers: Vec<[u8; HEADER_LEN]> = group
            .iter()
            .map(|h| header_of(h.slice(), shared.v2))
            .collect();
        let run = run_of(group, shared);
        let mut run_head = Vec::new();
        let pieces: Vec<(&[u8], Option<MemSpan>)> = match run {
            // Headers first: the peer knows where every payload goes before the first byte.
            Some(run) => {
                run_head.reserve((group.len() + 1) * HEADER_LEN);
                run_head.extend_from_slice(&run.encode());
                headers.iter().for_each(|h| run_head.extend_from_slice(h));
                std::iter::once((run_head.as_slice(), None))
                    .chain(group.iter().map(|h| (&[][..], Some(h.local_span()))))
                    .collect()
            }
            None => group
                .iter()
                .zip(&headers)
                .map(|(h, head)| {
                    let payload = (h.slice().op == OpCode::Write).then(|| h.local_span());
                    (head.as_slice(), payload)
                })
                .collect(),
        };
        if let Err(e) = MemSpan::send_pieces(&self.stream, &pieces, &self.cut) {
            tracing::debug!("send to {} failed: {e}", shared.peer);
            self.break_off();
            for held in group.drain(..) {
                shared.resend_after(&self.replies, held, &e, &format!("send failed: {e}"));
            }
            return false;
        }
        true
    }

    /// Sends `held` (a device-memory write copying ahead as `ahead` says); true if it was a
    /// lone small request whose reply was read here.
    fn send(&mut self, held: Held, shared: &LinkShared, queue_empty: bool, ahead: Ahead) -> bool {
        let s = held.slice();
        let header = header_of(s, shared.v2);
        let sent = match (s.op, s.local_device) {
            (OpCode::Write, Some(device)) => crate::device::staging::send_from(
                device,
                &mut CutStream {
                    stream: &self.stream,
                    cut: &self.cut,
                },
                &header,
                s.local,
                s.len as usize,
                ahead.copied,
                // The next slice is held (taken), so its memory stays registered.
                || {
                    ahead.next.map(|(addr, len)| NextSend {
                        addr,
                        len,
                        guard: (),
                    })
                },
            ),
            _ => self.send_host(&held, &header),
        };
        if let Err(e) = sent {
            self.send_failed(held, shared, &e);
            return false;
        }
        // Nothing else queued and no reply outstanding on this connection (the receiver
        // has read every earlier one): this reply is the next on the socket, and reading it
        // here saves waking the receiver thread, a cross-core hand-off per request that
        // dominates small single requests on hosts with many cores.
        if queue_empty && self.pending.is_empty() && (shared.v2 || held.slice().op == OpCode::Read)
        {
            let small = held.slice().len <= super::spin::SMALL_REQUEST;
            let spin = if small { shared.spin } else { Duration::ZERO };
            let settled = settle(&self.replies, held, shared, spin);
            return small && settled.is_none();
        }
        self.sent(held, shared);
        false
    }

    /// Writes `header` and, for a write, its payload from host memory.
    fn send_host(&self, held: &Held, header: &[u8]) -> io::Result<()> {
        match held.slice().op {
            OpCode::Write => held.local_span().send_to(&self.stream, header, &self.cut),
            OpCode::Read => CutStream {
                stream: &self.stream,
                cut: &self.cut,
            }
            .write_all(header),
        }
    }

    /// A send of `held` failed: the connection is done for; the slice is sent again once.
    fn send_failed(&self, held: Held, shared: &LinkShared, e: &io::Error) {
        tracing::debug!("send to {} failed: {e}", shared.peer);
        self.break_off();
        shared.resend_after(&self.replies, held, e, &format!("send failed: {e}"));
    }

    /// Sends `held` (a small host-memory request, nothing owed on this connection) and
    /// reads its reply on this thread, or leaves the reply to the receiver if it is not
    /// there within [`DIRECT_REPLY_WAIT`].
    fn run(&mut self, held: Held, shared: &LinkShared) {
        let s = held.slice();
        if let Err(e) = self.send_host(&held, &header_of(s, shared.v2)) {
            self.send_failed(held, shared, &e);
            return;
        }
        let whole = usize::from(shared.v2) * STATUS_LEN + owed_bytes(s) as usize;
        if self.reply_here(whole, shared) {
            settle(&self.replies, held, shared, Duration::ZERO);
        } else {
            self.sent(held, shared);
        }
    }

    /// Waits up to [`DIRECT_REPLY_WAIT`] (spinning first, as a lane does) until the whole
    /// reply of `whole` bytes has arrived, or a status that ends it early (a rejection),
    /// or the connection failed: then reading it cannot block, so the caller's thread
    /// never waits past its batch's deadline. False if it did not come in time.
    fn reply_here(&self, whole: usize, shared: &LinkShared) -> bool {
        let fd = self.stream.as_raw_fd();
        let buffered = self.replies.ahead.lock().buffered();
        let complete = || -> io::Result<bool> {
            let queued = crate::net::bytes_queued(fd)?;
            if buffered + queued >= whole {
                return Ok(true);
            }
            if shared.v2 && buffered == 0 && queued >= STATUS_LEN {
                let mut status = [0u8; STATUS_LEN];
                self.stream.peek(&mut status)?;
                return Ok(!matches!(Status::decode(&status), Ok(Status::Ok)));
            }
            Ok(false)
        };
        // An error shows again when the reply is read.
        let look = || complete().unwrap_or(true).then_some(());
        if look().is_some() || super::spin::spin_for(shared.spin, look).is_some() {
            return true;
        }
        let end = Instant::now() + DIRECT_REPLY_WAIT;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            match crate::net::wait_readable(&self.stream, left) {
                Ok(false) => return false,
                Err(_) => return true,
                Ok(true) => {}
            }
            match crate::net::bytes_queued(fd) {
                // Readable with nothing queued: the peer closed; the read says so.
                Ok(0) | Err(_) => return true,
                Ok(_) if look().is_some() => return true,
                // Part of the reply: the rest follows within microseconds, or never.
                Ok(_) => std::thread::sleep(Duration::from_micros(20)),
            }
        }
    }

    /// `held` is out: a v1 write is done (v1 acknowledges nothing), anything else is the
    /// receiver's from now on, slice and memory.
    fn sent(&mut self, held: Held, shared: &LinkShared) {
        if !shared.v2 && held.slice().op == OpCode::Write {
            shared.complete(held, Ok(()));
            return;
        }
        let Some(inflight) = self.inflight.as_ref() else {
            shared.retry_or_fail(held, "connection closed");
            return;
        };
        let owed = owed(held.slice());
        self.pending.add(owed);
        if let Err(e) = inflight.send(held) {
            self.pending.done(owed);
            self.break_off();
            shared.retry_or_fail(e.into_inner(), "receiver stopped");
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Closing the queue lets the receiver finish the replies in flight, then exit.
        self.inflight = None;
        if let Some(r) = self.receiver.take() {
            let _ = r.join();
        }
        self.replies.mark_broken(&self.shared);
        let _ = self.stream.shutdown(Shutdown::Both);
        self.shared.open.lock().retain(|(id, _)| *id != self.id);
    }
}

/// What the receiver of a connection has still to read, and a way for the lane to wait
/// until that falls under its share.
#[derive(Default)]
struct InFlight {
    slices: AtomicUsize,
    /// Of those, reads into device memory.
    device_reads: AtomicUsize,
    /// Payload bytes of reads still to come.
    bytes: AtomicU64,
    /// Half of the read into device memory being received is in: it counts as out no more
    /// (see [`DEVICE_READS_OUT`]). One reply is received at a time, so one such read at most.
    past_half: AtomicBool,
    /// The lane waits in `wait_below` (so `done` must wake it).
    waiting: AtomicBool,
    lock: Mutex<()>,
    fell: Condvar,
}

impl InFlight {
    fn add(&self, owed: Owed) {
        self.slices.fetch_add(1, Ordering::SeqCst);
        if owed.device_read {
            self.device_reads.fetch_add(1, Ordering::SeqCst);
        }
        self.bytes.fetch_add(owed.bytes, Ordering::SeqCst);
    }

    fn done(&self, owed: Owed) {
        self.bytes.fetch_sub(owed.bytes, Ordering::SeqCst);
        if owed.device_read {
            self.device_reads.fetch_sub(1, Ordering::SeqCst);
        }
        self.slices.fetch_sub(1, Ordering::SeqCst);
        self.wake_lane();
    }

    /// SeqCst with `wait_below`: either the lane sees the smaller count, or this sees it
    /// waiting and wakes it.
    fn wake_lane(&self) {
        if self.waiting.load(Ordering::SeqCst) {
            let _guard = self.lock.lock();
            self.fell.notify_one();
        }
    }

    /// No reply outstanding: the next reply on the socket is the next request's.
    fn is_empty(&self) -> bool {
        self.slices.load(Ordering::SeqCst) == 0
    }

    fn over(&self, cap: u64) -> bool {
        let out = if self.device_reads.load(Ordering::SeqCst) > 0 {
            DEVICE_READS_OUT
        } else {
            REQUESTS_OUT
        };
        let past_half = usize::from(self.past_half.load(Ordering::SeqCst));
        let slices = self.slices.load(Ordering::SeqCst).saturating_sub(past_half);
        slices >= out && self.bytes.load(Ordering::SeqCst) >= cap
    }

    /// Half of the read into device memory being received is in: the lane may ask for the
    /// next.
    fn half_in(&self) {
        self.past_half.store(true, Ordering::SeqCst);
        self.wake_lane();
    }

    /// The read into device memory that was received is done with (whole or failed).
    fn whole_in(&self) {
        self.past_half.store(false, Ordering::SeqCst);
    }

    /// Waits while [`REQUESTS_OUT`] requests (or [`DEVICE_READS_OUT`]) and at least `cap`
    /// bytes of reads are owed, and the connection is not `broken`.
    fn wait_below(&self, cap: u64, broken: &AtomicBool) {
        if !self.over(cap) {
            return;
        }
        self.waiting.store(true, Ordering::SeqCst);
        let mut guard = self.lock.lock();
        while self.over(cap) && !broken.load(Ordering::Acquire) {
            // The timeout only guards against a receiver that stopped without a word.
            self.fell.wait_for(&mut guard, Duration::from_millis(10));
        }
        self.waiting.store(false, Ordering::SeqCst);
    }
}

/// What a lane's send of a device-memory write copies ahead (see `send_device_run`).
#[derive(Debug, Clone, Copy, Default)]
struct Ahead {
    /// The slice's first chunk was copied out by the send before, as its `next`.
    copied: bool,
    /// The slice sent next (address, length), taken already.
    next: Option<(u64, usize)>,
}

/// Requests one lane may gather into a group: [`GROUP_REQUESTS`] and the pipeline `depth`
/// at most, and no more than an even share among `lanes` of the larger of the slices
/// `waiting` (queued, and the group's) and the requests of the `batch` they start. Without
/// the share the first lanes to wake took a batch between them and the rest stayed idle (a
/// batch of 64 reads of 64 KiB went out on 8 of 16 lanes, 8 reads each up to
/// `READ_BYTES_PER_LANE`). The batch's size too, not the queue's length alone: the caller
/// may still be queueing the rest, and a share of the few queued so far would send them
/// one at a time.
fn group_cap(depth: usize, waiting: usize, batch: usize, lanes: usize) -> usize {
    let even = waiting.max(batch).div_ceil(lanes.max(1)).max(1);
    GROUP_REQUESTS.min(depth.max(1)).min(even)
}

/// The run a group of host-memory writes goes out as, to a peer that takes runs: two
/// writes at least, within a run's bounds.
fn run_of(group: &[Held], shared: &LinkShared) -> Option<RunHeader> {
    let writes = group.len();
    if !shared.write_runs || !(2..=RUN_MAX_WRITES).contains(&writes) {
        return None;
    }
    let mut bytes = 0u64;
    for h in group {
        let s = h.slice();
        if s.op != OpCode::Write || s.local_device.is_some() {
            return None;
        }
        bytes = bytes.checked_add(s.len)?;
    }
    (bytes <= RUN_MAX_BYTES).then_some(RunHeader { writes, bytes })
}

fn header_of(s: &Slice, v2: bool) -> [u8; HEADER_LEN] {
    RequestHeader {
        size: s.len,
        addr: s.remote,
        opcode: s.op,
        v2,
    }
    .encode()
}

/// Payload bytes a slice's request carries: a write's data.
fn write_bytes(slice: &Slice) -> u64 {
    match slice.op {
        OpCode::Write => slice.len,
        OpCode::Read => 0,
    }
}

/// What the peer owes for a slice once its request is sent.
#[derive(Debug, Clone, Copy)]
struct Owed {
    /// A read's data.
    bytes: u64,
    /// It is a read into device memory.
    device_read: bool,
}

fn owed(slice: &Slice) -> Owed {
    Owed {
        bytes: owed_bytes(slice),
        device_read: slice.op == OpCode::Read && slice.local_device.is_some(),
    }
}

/// Bytes the peer still owes for a slice once its request is sent: a read's data.
fn owed_bytes(slice: &Slice) -> u64 {
    match slice.op {
        OpCode::Read => slice.len,
        OpCode::Write => 0,
    }
}

enum Reply {
    Done,
    Rejected,
}

fn receive(replies: &Replies, rx: Receiver<Held>, pending: Arc<InFlight>, shared: Arc<LinkShared>) {
    let mut failure: Option<String> = None;
    let mut landing = Landing {
        read: None,
        shared: &shared,
        pending: &pending,
    };
    // Never spins: it serves pipelined requests, where spinning took CPUs from threads
    // with work (15% of 64 KiB throughput on the 16-core host).
    loop {
        let held = match rx.try_recv() {
            Ok(held) => held,
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => {
                // No reply to read next: the caller may be waiting for this one.
                landing.settle();
                crate::device::staging::give_back_thread_stagers();
                match rx.recv() {
                    Ok(held) => held,
                    Err(RecvError) => break,
                }
            }
        };
        let into_device = (held.slice().op == OpCode::Read)
            .then_some(held.slice().local_device)
            .flatten()
            .filter(|_| failure.is_none());
        if landing.device().is_some_and(|d| Some(d) != into_device) {
            landing.settle();
        }
        let owed = owed(held.slice());
        if into_device.is_some() {
            // Its last copies are left running in `landing`; the read there before has
            // landed by the time this one's bytes are all read, and is completed then.
            failure = settle_with(replies, held, &shared, Duration::ZERO, Some(&mut landing));
            // Not counted as half out any more before it stops counting as out.
            pending.whole_in();
        } else {
            settle_next(replies, held, &shared, &mut failure);
        }
        // Its reply was read (a read into device memory: its bytes are off the socket, its
        // copies may still land), or it failed: the lane may ask for more, or read the next
        // reply itself.
        pending.done(owed);
    }
    landing.settle();
}

/// A read into device memory whose last copies may still be running (the receiver
/// thread's stager keeps them running while the next reply comes in): completed once they
/// have landed. Its bytes are no longer owed: they are off the socket.
struct Landing<'a> {
    read: Option<(Held, u32)>,
    shared: &'a LinkShared,
    /// Told when half of the next read's bytes are in.
    pending: &'a InFlight,
}

impl Landing<'_> {
    fn device(&self) -> Option<u32> {
        self.read.as_ref().map(|(_, d)| *d)
    }

    /// The read's copies have completed (or failed): it is done.
    fn landed(&mut self, result: io::Result<()>) {
        let Some((held, _)) = self.read.take() else {
            return;
        };
        match result {
            Ok(()) => self.shared.complete(held, Ok(())),
            Err(e) => self
                .shared
                .retry_or_fail(held, &format!("copy into device memory failed: {e}")),
        }
    }

    /// Waits for the read's copies, then completes it.
    fn settle(&mut self) {
        if let Some(device) = self.device() {
            let settled = crate::device::staging::settle(device);
            self.landed(settled);
        }
    }
}

/// Settles the next of the slices in flight on a connection, in order: reads its reply,
/// or, once the connection has failed (`failure`, set here), re-sends it once elsewhere.
fn settle_next(replies: &Replies, held: Held, shared: &LinkShared, failure: &mut Option<String>) {
    match failure {
        Some(_) if replies.refused.load(Ordering::Acquire) => shared.step_back(held),
        Some(why) => shared.retry_or_fail(held, why),
        None => *failure = settle(replies, held, shared, Duration::ZERO),
    }
}

/// The peer closed (or reset) a connection of ours before any reply came on it, while
/// other connections of the link are still open and whole: its data
/// server refused this one (it was at `MC_TCP_SERVER_MAX_CONNECTIONS[_PER_IP]`: it accepts
/// such a connection and closes it at once, having read nothing), rather than failing.
/// Called once the connection is marked broken (so it is not counted healthy itself).
/// Marks the connection refused.
fn refused_by_peer(replies: &Replies, shared: &LinkShared, e: &io::Error) -> bool {
    let closed = matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    );
    let others_work = shared.healthy_conns.load(Ordering::Acquire) > 0;
    let refused = closed && !replies.answered.load(Ordering::Acquire) && others_work;
    if refused {
        replies.refused.store(true, Ordering::Release);
    }
    refused
}

/// A reply came on the connection of `replies`.
fn answered(replies: &Replies) {
    // Read first: every reply passes here, and only the first need write.
    if !replies.answered.load(Ordering::Relaxed) {
        replies.answered.store(true, Ordering::Release);
    }
}

/// Reads the reply to `held` (looking for it awake for `spin` first) and completes it; on
/// a broken connection, marks it `broken`, shuts the socket down and returns why (later
/// slices in flight on it cannot succeed).
fn settle(replies: &Replies, held: Held, shared: &LinkShared, spin: Duration) -> Option<String> {
    settle_with(replies, held, shared, spin, None)
}

/// [`settle`], and with `landing`, a read into device memory goes there when done rather
/// than being completed.
fn settle_with(
    replies: &Replies,
    held: Held,
    shared: &LinkShared,
    spin: Duration,
    mut landing: Option<&mut Landing>,
) -> Option<String> {
    let Replies {
        stream, cut, ahead, ..
    } = replies;
    let mut ahead = ahead.lock();
    // A lone small request's reply comes within microseconds: wait for it awake. An error
    // here shows again in the read below.
    if ahead.buffered() == 0 {
        super::spin::spin_for(spin, || {
            crate::net::wait_readable(stream, Duration::ZERO)
                .map_or(Some(()), |ready| ready.then_some(()))
        });
    }
    let reply = read_reply(
        stream,
        &held,
        shared.v2,
        cut,
        &mut ahead,
        landing.as_deref_mut(),
    );
    if reply.is_ok() {
        answered(replies);
    }
    match reply {
        Ok(Reply::Done) => {
            match (landing, held.slice().local_device) {
                (Some(l), Some(device)) => {
                    l.settle();
                    l.read = Some((held, device));
                }
                _ => shared.complete(held, Ok(())),
            }
            None
        }
        Ok(Reply::Rejected) => {
            let s = held.slice();
            let err = TransferError::AddressRejected {
                peer: shared.peer.to_string(),
                addr: s.remote,
                len: s.len,
            };
            shared.complete(held, Err(err));
            None
        }
        Err(ReplyError::Protocol(why)) => {
            replies.mark_broken(shared);
            let _ = stream.shutdown(Shutdown::Both);
            let err = TransferError::Protocol {
                peer: shared.peer.to_string(),
                reason: why.clone(),
            };
            shared.complete(held, Err(err));
            Some(why)
        }
        Err(ReplyError::Io(e)) => {
            replies.mark_broken(shared);
            let _ = stream.shutdown(Shutdown::Both);
            if refused_by_peer(replies, shared, &e) {
                shared.step_back(held);
                return Some(REFUSED.to_string());
            }
            let why = match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
                    "no reply within {:?} (MC_TCP_STATUS_TIMEOUT_SEC)",
                    shared.io_timeout
                ),
                _ if !replies.answered.load(Ordering::Acquire) => format!(
                    "receive failed: {e}; the peer closed the connection before any reply \
                     (a data server at its MC_TCP_SERVER_MAX_CONNECTIONS or _PER_IP does)"
                ),
                _ => format!("receive failed: {e}"),
            };
            shared.retry_or_fail(held, &why);
            Some(why)
        }
    }
}

/// The next message of `rx`, looked for without sleeping for up to `spin` first: work
/// that follows within microseconds is taken without a wake-up.
fn next<T>(rx: &Receiver<T>, spin: Duration) -> Result<T, RecvError> {
    let look = || match rx.try_recv() {
        Ok(msg) => Some(Ok(msg)),
        Err(TryRecvError::Disconnected) => Some(Err(RecvError)),
        Err(TryRecvError::Empty) => None,
    };
    if let Some(found) = look().or_else(|| super::spin::spin_for(spin, look)) {
        return found;
    }
    // Out of work: the staging memory this lane held goes to whichever thread needs it.
    crate::device::staging::give_back_thread_stagers();
    rx.recv()
}

enum ReplyError {
    Io(io::Error),
    Protocol(String),
}

/// Reads the reply to `held`. With `landing`, a read into device memory leaves its last
/// copies running, and the read in `landing` is completed once its own have landed.
fn read_reply(
    stream: &TcpStream,
    held: &Held,
    v2: bool,
    cut: &SocketCut,
    ahead: &mut ReadAhead,
    landing: Option<&mut Landing>,
) -> Result<Reply, ReplyError> {
    let own = CutStream { stream, cut };
    if v2 {
        let status = ahead
            .take::<STATUS_LEN>(&mut own.clone(), owed_bytes(held.slice()))
            .map_err(ReplyError::Io)?
            .ok_or_else(|| ReplyError::Io(io::ErrorKind::UnexpectedEof.into()))?;
        match Status::decode(&status).map_err(|e| ReplyError::Protocol(e.to_string()))? {
            Status::Ok => {}
            Status::AddrRejected => return Ok(Reply::Rejected),
        }
    }
    let s = held.slice();
    if s.op == OpCode::Read {
        match (s.local_device, landing) {
            (Some(device), Some(earlier)) => crate::device::staging::receive_landing(
                device,
                &mut Halfway::new(ahead.reader(own), s.len as usize, {
                    let pending = earlier.pending;
                    move || pending.half_in()
                }),
                s.local,
                s.len as usize,
                || {
                    earlier.landed(Ok(()));
                    Ok(())
                },
            ),
            (Some(device), None) => crate::device::staging::receive_into(
                device,
                &mut ahead.reader(own),
                s.local,
                s.len as usize,
            ),
            (None, _) => ahead.recv_span(stream, cut, held.local_span(), None),
        }
        .map_err(ReplyError::Io)?;
    }
    Ok(Reply::Done)
}

/// Whether a link with `busy` slices queued or in flight has work enough for a caller to
/// send its batch itself (see [`PeerLink::send_here`]).
fn has_work_enough(busy: usize, budget: &LaneBudget) -> bool {
    busy >= budget.share() || budget.all_busy()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lane_gathers_an_even_share_of_its_batch_within_the_group_caps() {
        // 64 requests over 16 lanes: 4 each, whether queued yet or not.
        assert_eq!(group_cap(16, 64, 64, 16), 4);
        assert_eq!(group_cap(16, 1, 64, 16), 4);
        assert_eq!(group_cap(16, 64, 1, 16), 4);
        // Over 2 lanes the share is 32: the group caps decide, as before the share.
        assert_eq!(group_cap(16, 64, 64, 2), GROUP_REQUESTS);
        assert_eq!(group_cap(4, 64, 64, 2), 4);
        // A lone request, a batch smaller than the lanes, no lanes: one at least.
        assert_eq!(group_cap(16, 1, 1, 16), 1);
        assert_eq!(group_cap(16, 3, 3, 16), 1);
        assert_eq!(group_cap(0, 0, 0, 0), 1);
        // Uneven: 10 over 4 lanes is 3 at most.
        assert_eq!(group_cap(16, 10, 10, 4), 3);
    }

    #[test]
    fn a_read_into_device_memory_half_in_lets_one_more_out_and_no_more() {
        let cap = READ_BYTES_PER_LANE;
        let stripe = Owed {
            bytes: crate::device::staging::CHUNK as u64,
            device_read: true,
        };
        let f = InFlight::default();
        assert!(!f.over(cap), "nothing out");
        f.add(stripe);
        assert!(
            f.over(cap),
            "one read into device memory out holds the lane"
        );
        f.half_in();
        assert!(!f.over(cap), "half of it in: the lane may ask for the next");
        f.add(stripe);
        assert!(f.over(cap), "the next is out: the lane waits again");
        // The first is whole: the second is now the one out.
        f.whole_in();
        f.done(stripe);
        assert!(f.over(cap), "the second read still holds the lane");
        f.half_in();
        assert!(!f.over(cap));
        f.whole_in();
        f.done(stripe);
        assert!(!f.over(cap), "nothing out");
        // Host reads: two out, as before.
        let host = Owed {
            bytes: cap,
            device_read: false,
        };
        f.add(host);
        assert!(!f.over(cap));
        f.add(host);
        assert!(f.over(cap));
    }
}
