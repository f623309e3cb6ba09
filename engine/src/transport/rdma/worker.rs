//! One thread per HCA: it owns the HCA's endpoints, posts work requests and polls the
//! completion queue, so endpoints and slices in flight need no lock.
//!
//! A slice is posted only when its endpoint has fewer than `MC_MAX_WR` ×
//! `MC_NUM_QP_PER_EP` requests outstanding; the rest wait in the endpoint's queue and go
//! out as completions free room (backpressure, never rejection).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};

use super::backend::{Completion, QueuePair, RdmaOp, WcStatus, WorkRequest};
use super::endpoint_cut::EndpointCut;
use super::{setup, Peer, Shared, PROTOCOL};
use crate::error::{LinkLoss, SharedSource, TransferError, Unreachable, Violation};
use crate::memory::Abort;
use crate::metrics::ConnectionCounters;
use crate::transport::{Held, Slice};
use crate::wire::tcp::OpCode;

/// A message to a worker.
pub(crate) enum Msg {
    /// A slice to send.
    Work(Work),
    /// The setup thread finished the endpoint at `path`.
    Ready {
        /// The peer NIC path.
        path: String,
        /// Its cut-off switch (and queue pairs), or why there is none.
        result: Result<Arc<EndpointCut>, TransferError>,
    },
    /// Shut down: fail what is queued, wait for what is in flight.
    Stop,
}

/// A slice on its way, with where it goes.
pub(crate) struct Work {
    pub(crate) slice: Slice,
    pub(crate) route: Route,
}

/// Everything about a slice on its way but the slice itself (which is taken while it is
/// in flight): the slices merged into it, its peer and its attempts.
pub(crate) struct Route {
    /// Slices whose bytes the slice carries (a small tail; completed with it).
    pub(crate) extra: Vec<Slice>,
    pub(crate) peer: Arc<Peer>,
    /// Index of the peer buffer holding the remote range.
    pub(crate) buffer: usize,
    /// The slice's turn, for round-robin striping.
    pub(crate) rr: usize,
    /// Attempts made so far.
    pub(crate) attempt: usize,
    /// The peer device of the current attempt.
    pub(crate) remote_dev: usize,
    pub(crate) last_error: Option<TransferError>,
}

impl Work {
    pub(crate) fn new(slice: Slice, peer: Arc<Peer>, buffer: usize, rr: usize) -> Self {
        let route = Route {
            extra: Vec::new(),
            peer,
            buffer,
            rr,
            attempt: 0,
            remote_dev: 0,
            last_error: None,
        };
        Self { slice, route }
    }

    /// Whether `next` is the small tail of this slice's request (upstream merges it).
    pub(crate) fn absorbs(&self, next: &Slice, buffer: usize, limit: u64) -> bool {
        let s = &self.slice;
        let same_region = match (&s.local_region, &next.local_region) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        next.len <= limit
            && buffer == self.route.buffer
            && same_region
            && Arc::ptr_eq(&s.batch, &next.batch)
            && s.task == next.task
            && s.op == next.op
            && s.local.checked_add(s.len) == Some(next.local)
            && s.remote.checked_add(s.len) == Some(next.remote)
            && u32::try_from(s.len + next.len).is_ok()
    }

    /// Fails the slice and the slices merged into it.
    pub(crate) fn fail(self, err: TransferError) {
        for e in self.route.extra {
            e.finish(Err(err.clone()));
        }
        self.slice.finish(Err(err));
    }
}

struct Endpoint {
    path: String,
    cut: Arc<EndpointCut>,
    carrier: Arc<dyn Abort>,
    outstanding: usize,
    queue: VecDeque<Work>,
    next_qp: usize,
    /// The batch this endpoint last took a slice of (see `Slice::take`).
    last_batch: u64,
}

/// A posted slice, until its completion.
struct InFlight {
    held: Held,
    route: Route,
    ep: u64,
}

pub(crate) struct Worker {
    shared: Arc<Shared>,
    idx: usize,
    eps: HashMap<u64, Endpoint>,
    by_path: HashMap<String, u64>,
    next_ep: u64,
    slots: Vec<Option<(u32, InFlight)>>,
    free: Vec<usize>,
    generation: u32,
    inflight: usize,
    /// Work waiting for room on the HCA (its completion queue is full).
    waiting: VecDeque<Work>,
    /// Endpoints whose queues stopped for lack of room on the HCA.
    starved: VecDeque<u64>,
    /// Work waiting for the endpoint being set up at its path.
    connecting: HashMap<String, Vec<Work>>,
    setup_tx: Option<Sender<setup::Request>>,
    setup_thread: Option<JoinHandle<()>>,
    /// Shutting down: no new work, no new endpoint.
    stopping: bool,
    /// Recently failed endpoint setups, by path.
    failed_setups: HashMap<String, (Instant, TransferError)>,
    /// Paths whose endpoint broke and was retired: the next setup there is a reconnect.
    broken_paths: HashSet<String>,
    wcs: Vec<Completion>,
}

/// How long a failed endpoint setup fails new work on its path without a handshake.
const FAILED_SETUP_HOLD: Duration = Duration::from_millis(500);
/// Most failed setups remembered.
const MAX_FAILED_SETUPS: usize = 4096;

/// Completions taken per poll.
const POLL_BATCH: usize = 64;
/// Messages taken between polls.
const MSG_BATCH: usize = 64;

impl Worker {
    pub(crate) fn new(shared: Arc<Shared>, idx: usize) -> Self {
        let (setup_tx, setup_thread) = match setup::spawn(&shared, idx) {
            Ok((tx, t)) => (Some(tx), Some(t)),
            Err(e) => {
                tracing::warn!("no RDMA setup thread ({e}); endpoints are set up inline");
                (None, None)
            }
        };
        Self {
            shared,
            idx,
            eps: HashMap::new(),
            by_path: HashMap::new(),
            next_ep: 1,
            slots: Vec::new(),
            free: Vec::new(),
            generation: 0,
            inflight: 0,
            waiting: VecDeque::new(),
            starved: VecDeque::new(),
            connecting: HashMap::new(),
            setup_tx,
            setup_thread,
            stopping: false,
            failed_setups: HashMap::new(),
            broken_paths: HashSet::new(),
            wcs: Vec::with_capacity(POLL_BATCH),
        }
    }

    fn cap(&self) -> usize {
        (self.shared.params.max_wr * self.shared.params.num_qp_per_ep).max(1)
    }

    /// Whether the HCA's completion queue has room for one more request.
    fn nic_has_room(&self) -> bool {
        self.inflight < self.shared.params.max_cqe.max(1)
    }

    /// Moves work that waited for room on the HCA.
    fn feed(&mut self) {
        while self.nic_has_room() {
            if let Some(ep) = self.starved.pop_front() {
                self.pump(ep);
            } else if let Some(w) = self.waiting.pop_front() {
                self.handle(w);
            } else {
                return;
            }
        }
    }

    pub(crate) fn run(mut self, rx: Receiver<Msg>) {
        let mut idle = 0u32;
        loop {
            let mut busy = false;
            for _ in 0..MSG_BATCH {
                match rx.try_recv() {
                    Ok(Msg::Work(w)) => {
                        busy = true;
                        self.handle(w);
                    }
                    Ok(Msg::Ready { path, result }) => {
                        busy = true;
                        self.ready(path, result);
                    }
                    Ok(Msg::Stop) | Err(TryRecvError::Disconnected) => {
                        return self.shutdown(&rx);
                    }
                    Err(TryRecvError::Empty) => break,
                }
            }
            busy |= self.poll();
            self.feed();
            if busy {
                idle = 0;
                continue;
            }
            if self.inflight == 0 {
                match rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(Msg::Work(w)) => self.handle(w),
                    Ok(Msg::Ready { path, result }) => self.ready(path, result),
                    Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => {
                        return self.shutdown(&rx);
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                }
            } else {
                // Requests are in flight: poll again soon, without burning a core for
                // long on a slow peer.
                idle = idle.saturating_add(1);
                if idle < 256 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        }
    }

    /// Polls the completion queue once; whether anything completed.
    fn poll(&mut self) -> bool {
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        if let Some(nic) = self.shared.nics.get(self.idx) {
            if let Err(e) = nic.poll(&mut wcs, POLL_BATCH) {
                tracing::warn!("polling {} failed: {e}", nic.name());
            }
        }
        let any = !wcs.is_empty();
        for c in wcs.drain(..) {
            self.complete(c);
        }
        self.wcs = wcs;
        any
    }

    fn shutdown(mut self, rx: &Receiver<Msg>) {
        for w in self.waiting.drain(..) {
            w.fail(TransferError::Canceled("the engine shut down"));
        }
        for (_, waiting) in self.connecting.drain() {
            for w in waiting {
                w.fail(TransferError::Canceled("the engine shut down"));
            }
        }
        self.stopping = true;
        for ep in self.eps.values_mut() {
            ep.cut.abort();
            for w in ep.queue.drain(..) {
                w.fail(TransferError::Canceled("the engine shut down"));
            }
        }
        // The setup thread ends after the handshake it may be in.
        self.setup_tx = None;
        if let Some(t) = self.setup_thread.take() {
            let _ = t.join();
        }
        while let Ok(msg) = rx.try_recv() {
            if let Msg::Work(w) = msg {
                w.fail(TransferError::Canceled("the engine shut down"));
            }
        }
        // The HCA flushes every request of a queue pair in ERROR; their memory is free
        // only once those completions are polled.
        let started = Instant::now();
        let mut warned = Duration::ZERO;
        while self.inflight > 0 {
            if !self.poll() {
                std::thread::sleep(Duration::from_micros(100));
            }
            let waited = started.elapsed();
            if waited >= warned + Duration::from_secs(5) {
                warned = waited;
                tracing::warn!(
                    "RDMA shutdown: {} requests still not flushed after {waited:?}",
                    self.inflight
                );
            }
            // Retries the completions asked for have nowhere to go now.
            while let Ok(msg) = rx.try_recv() {
                if let Msg::Work(w) = msg {
                    w.fail(TransferError::Canceled("the engine shut down"));
                }
            }
        }
    }

    fn handle(&mut self, work: Work) {
        if self.stopping {
            return work.fail(TransferError::Canceled("the engine shut down"));
        }
        if work.slice.batch.is_canceled() {
            return work.fail(TransferError::Canceled(
                "its batch was canceled (deadline, interrupt or shutdown)",
            ));
        }
        if !self.nic_has_room() {
            self.waiting.push_back(work);
            return;
        }
        let path = work.route.peer.nic_path(work.route.remote_dev);
        if let Some(waiting) = self.connecting.get_mut(&path) {
            waiting.push(work);
            return;
        }
        let Some(ep) = self.live_endpoint(&path) else {
            return self.start_setup(path, work);
        };
        let cap = self.cap();
        let Some(endpoint) = self.eps.get_mut(&ep) else {
            return work.fail(TransferError::Canceled("endpoint vanished"));
        };
        if endpoint.outstanding >= cap || !endpoint.queue.is_empty() {
            endpoint.queue.push_back(work);
            return;
        }
        self.post(ep, work);
    }

    /// The live endpoint at `path`, if there is one; a broken one is retired (its queued
    /// work goes to the next path) so that a new one is set up.
    fn live_endpoint(&mut self, path: &str) -> Option<u64> {
        let id = *self.by_path.get(path)?;
        match self.eps.get_mut(&id) {
            Some(ep) if !ep.cut.is_broken() => return Some(id),
            Some(ep) => {
                let queued: Vec<Work> = ep.queue.drain(..).collect();
                self.retire_broken(path);
                self.reap(id);
                for w in queued {
                    self.shared.dispatch(w);
                }
            }
            None => {
                self.by_path.remove(path);
            }
        }
        None
    }

    /// The endpoint at `path` broke and leaves: the next one set up there counts as a
    /// reconnect.
    fn retire_broken(&mut self, path: &str) {
        self.by_path.remove(path);
        if self.broken_paths.len() < MAX_FAILED_SETUPS {
            self.broken_paths.insert(path.to_string());
        }
    }

    /// Starts setting up the endpoint at `path` for `work`: on the setup thread, so that
    /// this one keeps polling (a drain never waits on a peer's handshake).
    fn start_setup(&mut self, path: String, work: Work) {
        // A path whose setup just failed fails its work at once (the retry takes the
        // next path) instead of a handshake per slice to a peer that is gone.
        if let Some((at, err)) = self.failed_setups.get(&path) {
            if at.elapsed() < FAILED_SETUP_HOLD {
                let err = err.clone();
                return self.retry(work, err);
            }
        }
        if let Err(e) = self.make_room() {
            return self.retry(work, e);
        }
        let peer = work.route.peer.clone();
        self.connecting.insert(path.clone(), vec![work]);
        let req = setup::Request {
            peer,
            path: path.clone(),
        };
        let sent = match &self.setup_tx {
            Some(tx) => tx.send(req).map_err(|e| e.into_inner()),
            None => Err(req),
        };
        if let Err(req) = sent {
            // No setup thread: set up here.
            let result = setup::endpoint(&self.shared, self.idx, &req.peer, &req.path);
            self.ready(path, result);
        }
    }

    /// An endpoint setup ended: the work waiting for it goes on.
    fn ready(&mut self, path: String, result: Result<Arc<EndpointCut>, TransferError>) {
        let waiting = self.connecting.remove(&path).unwrap_or_default();
        match result {
            Ok(cut) => {
                let id = self.next_ep;
                self.next_ep += 1;
                let carrier: Arc<dyn Abort> = cut.clone();
                self.eps.insert(
                    id,
                    Endpoint {
                        path: path.clone(),
                        cut,
                        carrier,
                        outstanding: 0,
                        queue: VecDeque::new(),
                        next_qp: 0,
                        last_batch: 0,
                    },
                );
                let counters = &self.shared.counters;
                ConnectionCounters::add(&counters.connects, 1);
                if self.broken_paths.remove(&path) {
                    ConnectionCounters::add(&counters.reconnects, 1);
                }
                self.by_path.insert(path, id);
                for w in waiting {
                    self.handle(w);
                }
            }
            Err(e) => {
                if self.failed_setups.len() >= MAX_FAILED_SETUPS {
                    self.failed_setups
                        .retain(|_, (at, _)| at.elapsed() < FAILED_SETUP_HOLD);
                }
                if self.failed_setups.len() < MAX_FAILED_SETUPS {
                    self.failed_setups.insert(path, (Instant::now(), e.clone()));
                }
                for w in waiting {
                    self.retry(w, e.clone());
                }
            }
        }
    }

    /// Keeps the endpoints under `MC_MAX_EP_PER_CTX` by closing idle ones.
    fn make_room(&mut self) -> Result<(), TransferError> {
        let max = self.shared.params.max_ep_per_ctx.max(1);
        let count = self.eps.len() + self.connecting.len();
        if count < max {
            return Ok(());
        }
        let idle: Vec<u64> = self
            .eps
            .iter()
            .filter(|(_, e)| e.outstanding == 0 && e.queue.is_empty())
            .map(|(id, _)| *id)
            .take(count + 1 - max)
            .collect();
        for id in idle {
            if let Some(ep) = self.eps.remove(&id) {
                self.by_path.remove(&ep.path);
                ep.cut.abort();
            }
        }
        if self.eps.len() + self.connecting.len() >= max {
            return Err(TransferError::PeerUnreachable {
                peer: "(any)".into(),
                cause: Unreachable::EndpointsBusy { max },
            });
        }
        Ok(())
    }

    fn post(&mut self, ep_id: u64, work: Work) {
        let (lkey, rkey, len) = match self.keys_of(&work) {
            Ok(keys) => keys,
            Err(e) => return work.fail(e),
        };
        let Some(ep) = self.eps.get_mut(&ep_id) else {
            return work.fail(TransferError::Canceled("endpoint vanished"));
        };
        let Work { slice, route } = work;
        let Some(held) = slice.take(&ep.carrier, &mut ep.last_batch) else {
            // Finished by `take` (canceled batch or local buffer unregistered).
            for e in route.extra {
                e.finish(Err(TransferError::Canceled(
                    "its batch was canceled or its local buffer unregistered",
                )));
            }
            return;
        };
        let last_error = route.last_error.clone();
        let inflight = InFlight {
            held,
            route,
            ep: ep_id,
        };
        let Some(qp) = ep.next_qp() else {
            let work = inflight.into_work(last_error);
            return work.fail(TransferError::Canceled("endpoint without queue pairs"));
        };
        let s = inflight.held.slice();
        let wr = WorkRequest {
            wr_id: 0,
            op: match s.op {
                OpCode::Write => RdmaOp::Write,
                OpCode::Read => RdmaOp::Read,
            },
            local: s.local,
            len,
            lkey,
            remote: s.remote,
            rkey,
        };
        let wr_id = self.insert(inflight);
        let wr = WorkRequest { wr_id, ..wr };
        // The slice stays held (its batch entered, its local region pinned) with this
        // endpoint as carrier until its completion is polled, so a drain or an unregister
        // cuts the endpoint and waits for the flush before the memory goes back.
        match qp.post(&wr) {
            Ok(()) => {
                if let Some(ep) = self.eps.get_mut(&ep_id) {
                    ep.outstanding += 1;
                }
            }
            Err(e) => {
                // Never queued: the HCA does not touch the memory.
                if let Some(ep) = self.eps.get(&ep_id) {
                    ep.cut.abort();
                }
                if let Some(f) = self.remove(wr_id) {
                    let work = f.into_work(None);
                    let err = TransferError::PeerLost {
                        peer: work.route.peer.nic_path(work.route.remote_dev),
                        cause: LinkLoss::Post(SharedSource::new(e)),
                    };
                    self.retry(work, err);
                }
            }
        }
    }

    /// The local key of `work`'s region on this HCA, the remote key of its peer buffer
    /// on the chosen remote device, and its length as a work request carries it.
    fn keys_of(&self, work: &Work) -> Result<(u32, u32, u32), TransferError> {
        let lkey = work
            .slice
            .local_region
            .as_ref()
            .and_then(|r| self.shared.lkey(r, self.idx));
        let rkey = work
            .route
            .peer
            .buffers
            .get(work.route.buffer)
            .and_then(|b| b.rkeys.get(work.route.remote_dev))
            .copied();
        match (lkey, rkey, u32::try_from(work.slice.len)) {
            (Some(l), Some(r), Ok(n)) => Ok((l, r, n)),
            (None, _, _) => Err(TransferError::LocalNotRegistered {
                addr: work.slice.local,
                len: work.slice.len,
                protocol: PROTOCOL,
            }),
            _ => Err(TransferError::Protocol {
                peer: work.route.peer.segment.clone(),
                violation: Violation::MissingRemoteKey {
                    device: work.route.remote_dev,
                },
            }),
        }
    }

    fn insert(&mut self, f: InFlight) -> u64 {
        self.generation = self.generation.wrapping_add(1);
        let gen = self.generation;
        self.inflight += 1;
        let idx = match self.free.pop() {
            Some(i) => {
                if let Some(slot) = self.slots.get_mut(i) {
                    *slot = Some((gen, f));
                }
                i
            }
            None => {
                self.slots.push(Some((gen, f)));
                self.slots.len() - 1
            }
        };
        (u64::from(gen) << 32) | idx as u64
    }

    fn remove(&mut self, wr_id: u64) -> Option<InFlight> {
        let idx = (wr_id & 0xffff_ffff) as usize;
        let gen = (wr_id >> 32) as u32;
        let slot = self.slots.get_mut(idx)?;
        match slot {
            Some((g, _)) if *g == gen => {}
            _ => return None,
        }
        let (_, f) = slot.take()?;
        self.free.push(idx);
        self.inflight -= 1;
        Some(f)
    }

    fn complete(&mut self, c: Completion) {
        let Some(f) = self.remove(c.wr_id) else {
            tracing::warn!("completion for an unknown work request {:#x}", c.wr_id);
            return;
        };
        let ep_id = f.ep;
        if let Some(ep) = self.eps.get_mut(&ep_id) {
            ep.outstanding = ep.outstanding.saturating_sub(1);
        }
        let loss = match c.status {
            WcStatus::Success => None,
            WcStatus::RemoteAccess => Some(None),
            WcStatus::RetryExceeded => Some(Some(LinkLoss::RetryExceeded)),
            WcStatus::Flushed => Some(Some(LinkLoss::Flushed)),
            WcStatus::Other(failed) => Some(Some(LinkLoss::WorkRequest(failed))),
        };
        if let Some(loss) = loss {
            let s = f.held.slice();
            let path = f.route.peer.nic_path(f.route.remote_dev);
            let err = match loss {
                None => TransferError::AddressRejected {
                    peer: path.clone(),
                    addr: s.remote,
                    len: s.len,
                },
                Some(cause) => TransferError::PeerLost {
                    peer: path.clone(),
                    cause,
                },
            };
            if c.status != WcStatus::Flushed {
                tracing::debug!("RDMA slice over {path} failed: {err}");
            }
            // A queue pair with an error completion is in ERROR: flush the rest of the
            // endpoint and build a new one for later slices.
            if let Some(ep) = self.eps.get(&ep_id) {
                ep.cut.abort();
            }
            let work = f.into_work(Some(err.clone()));
            if work.slice.batch.is_canceled() {
                work.fail(TransferError::Canceled(
                    "its batch was canceled (deadline, interrupt or shutdown)",
                ));
            } else {
                self.retry(work, err);
            }
        } else {
            for e in f.route.extra {
                e.finish(Ok(()));
            }
            f.held.finish(Ok(()));
        }
        self.pump(ep_id);
    }

    /// Posts queued work as room frees up; drops a broken endpoint once it is idle.
    fn pump(&mut self, ep_id: u64) {
        let cap = self.cap();
        let max_cqe = self.shared.params.max_cqe.max(1);
        loop {
            let full = self.inflight >= max_cqe;
            let Some(ep) = self.eps.get_mut(&ep_id) else {
                return;
            };
            if ep.cut.is_broken() {
                let queued: Vec<Work> = ep.queue.drain(..).collect();
                if self.by_path.get(&ep.path) == Some(&ep_id) {
                    let path = ep.path.clone();
                    self.retire_broken(&path);
                }
                self.reap(ep_id);
                for w in queued {
                    self.handle(w);
                }
                return;
            }
            if ep.outstanding >= cap {
                return;
            }
            if full {
                if !ep.queue.is_empty() && !self.starved.contains(&ep_id) {
                    self.starved.push_back(ep_id);
                }
                return;
            }
            let Some(w) = ep.queue.pop_front() else {
                return;
            };
            if w.slice.batch.is_canceled() {
                w.fail(TransferError::Canceled(
                    "its batch was canceled (deadline, interrupt or shutdown)",
                ));
                continue;
            }
            self.post(ep_id, w);
        }
    }

    /// Drops a retired endpoint once no request of it is outstanding.
    fn reap(&mut self, ep_id: u64) {
        let idle = self
            .eps
            .get(&ep_id)
            .is_some_and(|e| e.outstanding == 0 && e.queue.is_empty());
        let live = self
            .eps
            .get(&ep_id)
            .is_some_and(|e| self.by_path.get(&e.path) == Some(&ep_id));
        if idle && !live {
            self.eps.remove(&ep_id);
        }
    }

    fn retry(&self, mut work: Work, err: TransferError) {
        if self.stopping {
            return work.fail(TransferError::Canceled("the engine shut down"));
        }
        work.route.attempt += 1;
        work.route.last_error = Some(err);
        if work.route.attempt <= self.shared.params.retry_cnt {
            // It goes out again, over the next HCA pair (an exhausted one fails instead).
            ConnectionCounters::add(&self.shared.counters.retries, 1);
        }
        self.shared.dispatch(work);
    }
}

impl Endpoint {
    /// The queue pairs take turns.
    fn next_qp(&mut self) -> Option<Arc<dyn QueuePair>> {
        let i = self.next_qp % self.cut.qps.len().max(1);
        self.next_qp = self.next_qp.wrapping_add(1);
        self.cut.qps.get(i).cloned()
    }
}

impl InFlight {
    fn into_work(self, last_error: Option<TransferError>) -> Work {
        let mut route = self.route;
        route.last_error = last_error;
        Work {
            slice: self.held.release(),
            route,
        }
    }
}
