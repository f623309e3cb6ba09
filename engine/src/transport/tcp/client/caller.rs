//! Requests sent on the caller's own thread: a lone small request over the link's direct
//! connection ([`PeerLink::send_lone`]), and a synchronous batch to a busy link over one of
//! its caller connections ([`PeerLink::send_here`]), with their replies read there too
//! while they come in time.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::conn::{Conn, Handoff};
use super::in_flight::owed_bytes;
use super::receive::{settle, settle_next};
use super::retry::connect;
use super::send::header_of;
use super::{LinkShared, PeerLink};
use crate::error::{LinkLoss, Unreachable};
use crate::transport::tcp::budget::LaneBudget;
use crate::transport::{Held, Slice};
use crate::wire::tcp::{OpCode, Status, STATUS_LEN};

/// See [`PeerLink::send_lone`].
#[derive(Default)]
pub(super) struct Direct {
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

/// Bytes of a batch sent on its caller's thread at most: a larger one is carried faster
/// by the lanes' connections in parallel.
pub(super) const CALLER_BATCH_BYTES: u64 = 4 << 20;

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
pub(super) const CALLER_REPLY_WAIT: Duration = Duration::from_millis(50);

impl PeerLink {
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
        let small =
            slice.len <= crate::transport::tcp::spin::SMALL_REQUEST && slice.local_device.is_none();
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
}

/// Opens the link's direct connection (see [`PeerLink::send_lone`]), as a lane opens its
/// own; a peer that failed to connect within [`DEAD_PEER_HOLD`](super::retry::DEAD_PEER_HOLD) fails at once, as for a lane.
fn open_direct(shared: &Arc<LinkShared>, broke: &mut bool) -> Result<Conn, Unreachable> {
    if let Some(why) = shared.recently_dead() {
        return Err(why);
    }
    let c = connect(shared, broke, Handoff::Depth)?;
    // A request the socket does not take at once (a peer that stopped reading) breaks
    // the connection and goes to a lane, instead of holding up the caller.
    c.stream
        .set_write_timeout(Some(DIRECT_SEND_WAIT))
        .map_err(|e| Unreachable::SendTimeout(e.into()))?;
    Ok(c)
}

/// Whether a link with `busy` slices queued or in flight has work enough for a caller to
/// send its batch itself (see [`PeerLink::send_here`]).
fn has_work_enough(busy: usize, budget: &LaneBudget) -> bool {
    busy >= budget.share() || budget.all_busy()
}

impl Conn {
    /// Sends `held` (a small host-memory request, nothing owed on this connection) and
    /// reads its reply on this thread, or leaves the reply to the receiver if it is not
    /// there within [`DIRECT_REPLY_WAIT`].
    fn run(&mut self, held: Held, shared: &LinkShared) {
        let s = held.slice();
        if let Err(e) = self.send_host(&held, &header_of(s, shared.v2)) {
            self.send_failed(held, shared, e);
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
        let fd = &self.stream;
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
        if look().is_some() || crate::transport::tcp::spin::spin_for(shared.spin, look).is_some() {
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
        let mut failure: Option<LinkLoss> = None;
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
        let fd = &self.stream;
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
}
