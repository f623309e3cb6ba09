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
//! [`CALLER_REPLY_WAIT`](caller::CALLER_REPLY_WAIT).
//!
//! This file holds the link ([`PeerLink`]) and the state its threads share; `lane.rs` the
//! lane threads, `caller.rs` the sends on the caller's thread, `conn.rs` one connection,
//! `send.rs` and `receive.rs` its two directions, `in_flight.rs` what its peer still owes,
//! and `retry.rs` what happens when it fails.

mod caller;
mod conn;
mod in_flight;
mod lane;
mod receive;
mod retry;
mod send;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender};
use parking_lot::Mutex;

use super::budget::{LaneBudget, Membership};
use crate::config::Config;
use crate::error::{TransferError, Unreachable};
use crate::log_throttle::LogThrottle;
use crate::memory::{Abort, SocketCut};
use crate::transport::{Held, Slice};
use caller::Direct;
use conn::Conn;
use lane::lane;
use retry::DEAD_PEER_HOLD;

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

/// How a link frames its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Framing {
    /// v2 headers, each answered by a status (upstream 0.3.12+ and ours).
    pub v2: bool,
    /// Writes sent together go as a run, headers first ([`RunHeader`](crate::wire::tcp::RunHeader); ours only).
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
    dead: Mutex<Option<(Instant, Unreachable)>>,
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
    /// Connections of this link open and not known broken (see [`refused_by_peer`](retry::refused_by_peer)).
    healthy_conns: AtomicUsize,
    /// Lanes stepping back now (see [`step_back_for`](retry::step_back_for)).
    lanes_out: AtomicUsize,
    refusal_log: LogThrottle,
    /// Idle connections of no lane on which callers send their batches themselves (see
    /// [`PeerLink::send_here`]).
    callers: Mutex<Vec<Conn>>,
    /// Caller connections open, idle or in use: at most `MC_TCP_CALLER_CONNS`.
    caller_conns: AtomicUsize,
    /// Until when no caller connection is opened: the peer refused one (see
    /// [`refused_by_peer`](retry::refused_by_peer)); batches go to the lanes meanwhile.
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
    pub fn unreachable(&self) -> Option<Unreachable> {
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
    fn recently_dead(&self) -> Option<Unreachable> {
        let dead = self.dead.lock();
        dead.as_ref()
            .filter(|(at, _)| at.elapsed() < DEAD_PEER_HOLD)
            .map(|(_, why)| why.clone())
    }

    fn unreachable(&self, cause: Unreachable) -> TransferError {
        TransferError::PeerUnreachable {
            peer: self.peer.to_string(),
            cause,
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
}
