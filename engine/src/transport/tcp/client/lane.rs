//! The lane thread: takes slices off the link's queue while it is within the link's share
//! of the lane budget, keeps its connection open, and sends what it took, alone or
//! gathered into a group (an even share of the batch among the lanes).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvError, TryRecvError};

use super::conn::{Conn, Handoff};
use super::in_flight::{owed_bytes, READ_BYTES_PER_LANE};
use super::retry::{connect, step_back_for, REFUSED_PAUSE, REFUSED_PAUSE_MAX};
use super::send::write_bytes;
use super::{LaneMsg, LinkShared};
use crate::transport::{Held, Slice};
use crate::wire::tcp::OpCode;

/// Requests sent together in one `sendmsg` at most (the queue permitting): fewer system
/// calls, segments and wake-ups of the peer per request when many small ones are queued.
const GROUP_REQUESTS: usize = 16;

/// Payload bytes of writes sent together at most: beyond this a request is large enough
/// to carry its own system call.
const GROUP_BYTES: u64 = 256 << 10;

/// Runs lane `index` of a link until the link stops: takes a slice off the queue, makes
/// sure the lane's connection is open, and sends the slice with what may join it.
pub(super) fn lane(shared: Arc<LinkShared>, rx: Receiver<LaneMsg>, index: usize) {
    let mut lane = Lane {
        shared,
        index,
        conn: None,
        broke: false,
        lone: false,
        group: Vec::new(),
        pause: REFUSED_PAUSE,
    };
    while let Some(slice) = lane.next_slice(&rx) {
        let Some(slice) = lane.admit(slice) else {
            continue;
        };
        let Some(slice) = lane.connected(slice) else {
            continue;
        };
        if lane.carry(slice, &rx) {
            break;
        }
    }
}

/// A lane thread's state between slices.
struct Lane {
    shared: Arc<LinkShared>,
    index: usize,
    conn: Option<Conn>,
    /// This lane's connection broke and has not been replaced yet.
    broke: bool,
    /// The last slice was a lone small request (its reply read here): the next may follow
    /// within microseconds, so look for it awake. Under load the queue is rarely empty and
    /// a spinning thread would only take a CPU from one with work.
    lone: bool,
    group: Vec<Held>,
    /// How long the lane steps back the next time the peer refuses its connection.
    pause: Duration,
}

impl Lane {
    /// Waits until the lane is within the link's share and its connection may take more,
    /// then for the next slice; `None` once the link stops.
    fn next_slice(&mut self, rx: &Receiver<LaneMsg>) -> Option<Slice> {
        let shared = &self.shared;
        if self.index >= shared.lanes.budget().share() {
            // About to park: its staging memory goes to the lanes within the share.
            crate::device::staging::give_back_thread_stagers();
        }
        shared
            .lanes
            .budget()
            .wait_for_share(self.index, &shared.stopping);
        if shared.stopping.load(Ordering::Acquire) {
            return None;
        }
        if let Some(c) = self.conn.as_ref() {
            c.pending.wait_below(READ_BYTES_PER_LANE, &c.replies.broken);
        }
        let spin = if self.lone {
            shared.spin
        } else {
            Duration::ZERO
        };
        let Ok(LaneMsg::Work(slice)) = next(rx, spin) else {
            return None;
        };
        self.lone = false;
        Some(slice)
    }

    /// The slice, unless it went back to the queue or was finished canceled.
    fn admit(&self, slice: Slice) -> Option<Slice> {
        // The share shrank while this lane waited for work (another link got busy): the
        // work goes back for a lane within the share, and this one parks.
        if self.index >= self.shared.lanes.budget().share() {
            self.shared.requeue(slice);
            return None;
        }
        if slice.batch.is_canceled() {
            self.shared.fail_canceled(slice);
            return None;
        }
        Some(slice)
    }

    /// Replaces a stale connection, or opens the first, before `slice` goes out; gives the
    /// slice back if it may, else it went back to the queue (the peer refused the old
    /// connection, and the lane stepped back) or failed (the peer is unreachable).
    fn connected(&mut self, slice: Slice) -> Option<Slice> {
        let shared = &self.shared;
        if self.conn.as_ref().is_some_and(Conn::is_stale) {
            let refused = self
                .conn
                .as_ref()
                .is_some_and(|c| c.replies.refused.load(Ordering::Acquire));
            // Dropped first: its receiver has sent its slices back by then.
            self.conn = None;
            self.broke = true;
            if refused {
                shared.requeue(slice);
                shared.shed_idle_callers();
                if step_back_for(shared, self.index, self.pause) {
                    self.pause = (self.pause * 2).min(REFUSED_PAUSE_MAX);
                }
                return None;
            }
        }
        if self
            .conn
            .as_ref()
            .is_some_and(|c| c.replies.answered.load(Ordering::Acquire))
        {
            self.pause = REFUSED_PAUSE;
        }
        if self.conn.is_none() {
            if let Some(why) = shared.recently_dead() {
                shared.fail(slice, shared.unreachable(why));
                return None;
            }
            match connect(shared, &mut self.broke, Handoff::Depth) {
                Ok(c) => self.conn = Some(c),
                Err(why) => {
                    shared.fail(slice, shared.unreachable(why));
                    return None;
                }
            }
        }
        Some(slice)
    }

    /// Takes `slice` on the lane's connection and sends it: device memory with the
    /// device writes queued behind it, host memory alone or in a group with the slices
    /// queued behind it. True if a stop was taken off the queue.
    fn carry(&mut self, slice: Slice, rx: &Receiver<LaneMsg>) -> bool {
        let shared = &self.shared;
        let Some(c) = self.conn.as_mut() else {
            return false;
        };
        let Some(held) = c.take(slice, shared) else {
            return false;
        };
        if held.slice().local_device.is_some() {
            self.lone = c.send_device_run(held, rx, shared, self.index);
            return false;
        }
        if rx.is_empty() {
            self.lone = c.send(held, shared, true, Ahead::default());
            return false;
        }
        let group = &mut self.group;
        group.push(held);
        let stop = c.gather(group, rx, shared);
        if group.len() == 1 {
            if let Some(held) = group.pop() {
                self.lone = c.send(held, shared, rx.is_empty(), Ahead::default());
            }
        } else {
            c.send_group_and_settle(group, shared);
        }
        stop
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
    if let Some(found) = look().or_else(|| crate::transport::tcp::spin::spin_for(spin, look)) {
        return found;
    }
    // Out of work: the staging memory this lane held goes to whichever thread needs it.
    crate::device::staging::give_back_thread_stagers();
    rx.recv()
}

impl Conn {
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
}

/// What a lane's send of a device-memory write copies ahead (see `send_device_run`).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Ahead {
    /// The slice's first chunk was copied out by the send before, as its `next`.
    pub(super) copied: bool,
    /// The slice sent next (address, length), taken already.
    pub(super) next: Option<(u64, usize)>,
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
}
