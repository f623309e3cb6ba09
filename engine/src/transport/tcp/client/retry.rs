//! Connections that fail: (re)connecting and counting it, re-sending a slice once, and
//! stepping back when the peer's connection caps refuse a connection, which costs a slice
//! nothing.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::conn::{Conn, Handoff, Replies};
use super::{LaneMsg, LinkShared};
use crate::error::{LinkLoss, SharedIoError, TransferError, Unreachable};
use crate::transport::Held;

/// How long a failed connect keeps failing new slices without retrying.
pub(super) const DEAD_PEER_HOLD: Duration = Duration::from_millis(500);

/// How long a lane whose connection the peer refused stays out at first; doubled at each
/// refusal in a row, up to [`REFUSED_PAUSE_MAX`]. Meanwhile the link's other lanes carry
/// its work.
pub(super) const REFUSED_PAUSE: Duration = Duration::from_secs(1);

pub(super) const REFUSED_PAUSE_MAX: Duration = Duration::from_secs(30);

/// How long the link's last lane still in waits after the peer refused its connection.
const LAST_LANE_PAUSE: Duration = Duration::from_millis(100);

/// How long callers open no connection of their own after the peer refused one.
const CALLER_REFUSED_PAUSE: Duration = Duration::from_secs(5);

/// Opens a connection to the peer and counts it (a reconnect if `broke`, which it clears);
/// a failure is why, also kept as the link's recent death (new slices fail at once for
/// [`DEAD_PEER_HOLD`]).
pub(super) fn connect(
    shared: &Arc<LinkShared>,
    broke: &mut bool,
    handoff: Handoff,
) -> Result<Conn, Unreachable> {
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
            let why = Unreachable::Connect(e.into());
            tracing::warn!("peer {} unreachable: {why}", shared.peer);
            *shared.dead.lock() = Some((Instant::now(), why.clone()));
            Err(why)
        }
    }
}

/// Lane `index` stays out of the link's work for `pause` (or until the link stops): the
/// peer refused its connection, and the link's other lanes carry on. The last lane of the
/// link's share still in never stays out for long (its work would wait for it, with no
/// lane to take it): it waits [`LAST_LANE_PAUSE`] and tries again. True if it stepped back.
pub(super) fn step_back_for(shared: &LinkShared, index: usize, pause: Duration) -> bool {
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

/// The peer closed (or reset) a connection of ours before any reply came on it, while
/// other connections of the link are still open and whole: its data
/// server refused this one (it was at `MC_TCP_SERVER_MAX_CONNECTIONS[_PER_IP]`: it accepts
/// such a connection and closes it at once, having read nothing), rather than failing.
/// Called once the connection is marked broken (so it is not counted healthy itself).
/// Marks the connection refused.
pub(super) fn refused_by_peer(replies: &Replies, shared: &LinkShared, e: &io::Error) -> bool {
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

impl LinkShared {
    /// A caller connection is done for; if the peer refused it, callers open none for
    /// [`CALLER_REFUSED_PAUSE`] (each would be refused too, and its batch sent again).
    pub(super) fn drop_caller_conn(&self, c: Conn) {
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
    pub(super) fn shed_idle_callers(&self) {
        self.pause_callers();
        let idle = std::mem::take(&mut *self.callers.lock());
        let closed = idle.len();
        drop(idle);
        self.caller_conns.fetch_sub(closed, Ordering::AcqRel);
    }

    /// Sends a slice of a connection the peer refused (see [`refused_by_peer`]) back to the
    /// queue for the link's other lanes, without using up its one re-send: the peer never
    /// took the request.
    pub(super) fn step_back(&self, held: Held) {
        self.requeue(held.release());
    }

    /// `held`'s connection failed with `e`: its slice is re-sent (for free if the peer
    /// refused the connection), or failed.
    pub(super) fn resend_after(&self, replies: &Replies, held: Held, e: &SharedIoError) {
        if refused_by_peer(replies, self, e.get()) {
            self.step_back(held);
        } else {
            self.retry_or_fail(held, LinkLoss::Send(e.clone()));
        }
    }

    pub(super) fn retry_or_fail(&self, held: Held, reason: LinkLoss) {
        let mut slice = held.release();
        if slice.retries == 0 && !slice.batch.is_canceled() {
            slice.retries += 1;
            self.counters.retries.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("re-sending a slice to {} after: {reason}", self.peer);
            if let Err(e) = self.tx.send(LaneMsg::Work(slice)) {
                if let LaneMsg::Work(s) = e.into_inner() {
                    self.fail(s, self.lost(reason));
                }
            }
        } else {
            self.fail(slice, self.lost(reason));
        }
    }

    fn lost(&self, cause: LinkLoss) -> TransferError {
        TransferError::PeerLost {
            peer: self.peer.to_string(),
            cause,
        }
    }
}
