//! How many of its lanes each peer link may use, so that the engine's lane threads scale
//! with the host rather than with the number of peers.
//!
//! A lane is a sending and a receiving thread here and a serving thread on the peer. With
//! a fixed count per peer, ten threads writing to four peers ran 32 lanes (and 32 serving
//! threads) on the 16-core host and moved fewer bytes than 16 lanes did
//! (docs/benchmarks.md, issue 12). So the engine has one budget of lanes, shared evenly
//! by its links that have work: a lane whose index is past its link's share sleeps until
//! the share grows (a link closed or rested) or the link stops; it keeps its connection,
//! idle. A link counts from its first request on and rests once it has had no work for
//! [`REST_AFTER`]: links to peers that have gone quiet (or away, until they are evicted
//! after `MC_TCP_LINK_IDLE_SEC`) do not take lanes from those with work. Counting every
//! open link, a process that had talked to two peers before moved 4 MiB batches to a third
//! with 5 of its 8 lanes, at 0.81 of the speed of the first (tests/gpu/gpu_transfer.py on
//! the 16-core host). The rest comes within a tenth of a second: a decode process that
//! pulls one request's KV cache from one prefill peer, then the next from another, has
//! one link with work at a time. With a rest after a second (as first built), every peer
//! it had pulled from in the last second or two kept its share, and a burst to one of
//! four such peers ran on a quarter of the lanes (the H200 host moved 16-26 GB/s instead
//! of 28-35 in session 12's harness, which switched peers every second).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// How long a link without work keeps its place in the share. Short, so that work that
/// moves from peer to peer gets the whole budget; not nil, so that a caller's
/// back-to-back batches do not take its link in and out of the share (each rest wakes
/// every parked lane of the engine).
pub const REST_AFTER: Duration = Duration::from_millis(50);

/// Lanes of one engine, shared by its links to peers.
pub struct LaneBudget {
    /// Lanes over all links (`MC_TCP_LANE_BUDGET`).
    total: usize,
    /// The most a link may use (`MC_TCP_LANES_PER_PEER`): the lanes it starts.
    per_peer: usize,
    /// Links with work (see the module doc).
    links: AtomicUsize,
    /// Slices queued or in flight over all links.
    out: AtomicUsize,
    lock: Mutex<()>,
    changed: Condvar,
}

impl LaneBudget {
    /// A budget of `total` lanes, at most `per_peer` to one link; a lone link always gets
    /// `per_peer` (a budget under that is raised to it).
    pub fn new(total: usize, per_peer: usize) -> Arc<Self> {
        Arc::new(Self {
            total: total.max(per_peer),
            per_peer,
            links: AtomicUsize::new(0),
            out: AtomicUsize::new(0),
            lock: Mutex::new(()),
            changed: Condvar::new(),
        })
    }

    /// A new link's place in the budget, counted at once (a link opens for work).
    pub fn join(self: &Arc<Self>) -> Membership {
        self.count(1);
        Membership {
            budget: self.clone(),
            counted: AtomicBool::new(true),
        }
    }

    fn count(&self, delta: isize) {
        if delta > 0 {
            // The share can only shrink: no parked lane may run, none is woken.
            self.links.fetch_add(1, Ordering::AcqRel);
        } else {
            self.links.fetch_sub(1, Ordering::AcqRel);
            self.wake_all();
        }
    }

    /// `n` more slices of some link are queued or in flight.
    pub fn add_out(&self, n: usize) {
        self.out.fetch_add(n, Ordering::AcqRel);
    }

    /// `n` slices counted by [`add_out`](Self::add_out) are done.
    pub fn sub_out(&self, n: usize) {
        self.out.fetch_sub(n, Ordering::AcqRel);
    }

    /// The engine has a slice queued or in flight for every lane of the budget: more
    /// lanes would add hand-offs, not parallelism.
    pub fn all_busy(&self) -> bool {
        self.out.load(Ordering::Acquire) >= self.total
    }

    /// Lanes each link may use now.
    pub fn share(&self) -> usize {
        share_of(
            self.total,
            self.per_peer,
            self.links.load(Ordering::Acquire),
        )
    }

    /// Returns once lane `index` is within its link's share, or `stopping` is set (the
    /// link's shutdown sets it, then calls [`wake_all`](Self::wake_all)).
    pub fn wait_for_share(&self, index: usize, stopping: &AtomicBool) {
        if index < self.share() {
            return;
        }
        let mut guard = self.lock.lock();
        while index >= self.share() && !stopping.load(Ordering::Acquire) {
            // The timeout only guards against a missed notification.
            self.changed
                .wait_for(&mut guard, Duration::from_millis(200));
        }
    }

    /// Wakes every parked lane to look at its share again.
    pub fn wake_all(&self) {
        let _guard = self.lock.lock();
        self.changed.notify_all();
    }
}

/// One link's place in the budget.
pub struct Membership {
    budget: Arc<LaneBudget>,
    /// Whether the link counts in the share now.
    counted: AtomicBool,
}

impl Membership {
    /// The budget this link belongs to.
    pub fn budget(&self) -> &LaneBudget {
        &self.budget
    }

    /// The link has work: it counts in the share (one load when it does already).
    pub fn busy(&self) {
        if !self.counted.load(Ordering::Acquire)
            && self
                .counted
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.budget.count(1);
        }
    }

    /// The link has had no work for a while: it leaves the share to the others.
    pub fn rest(&self) {
        if self
            .counted
            .compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.budget.count(-1);
        }
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.rest();
    }
}

/// Lanes per link when `links` links share `total` lanes, each using at most `per_peer`:
/// an even share, but never under two lanes (one request's reply read while the next is
/// sent) unless `per_peer` itself is lower.
pub fn share_of(total: usize, per_peer: usize, links: usize) -> usize {
    let floor = per_peer.min(2);
    (total / links.max(1)).clamp(floor, per_peer.max(floor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_share_the_budget_evenly_within_their_bounds() {
        // A budget of 16 and 8 lanes per peer: one peer gets its 8 lanes; four peers 4 each;
        // many peers never under 2.
        assert_eq!(share_of(16, 8, 1), 8);
        assert_eq!(share_of(16, 8, 2), 8);
        assert_eq!(share_of(16, 8, 4), 4);
        assert_eq!(share_of(16, 8, 16), 2);
        // 2 CPUs: 2 lanes per peer whatever the number of peers, as before the budget.
        assert_eq!(share_of(2, 2, 1), 2);
        assert_eq!(share_of(2, 2, 4), 2);
        // One lane asked for per peer stays one.
        assert_eq!(share_of(16, 1, 4), 1);
        assert_eq!(share_of(0, 8, 0), 2);
        // Lanes asked for per peer beyond the budget: a lone link still gets them all.
        let budget = LaneBudget::new(2, 8);
        let _only = budget.join();
        assert_eq!(budget.share(), 8);
    }

    #[test]
    fn a_parked_lane_runs_again_once_a_link_closes_or_its_link_stops() {
        let budget = LaneBudget::new(8, 8);
        let a = budget.join();
        let b = budget.join();
        assert_eq!(budget.share(), 4);
        let stopping = Arc::new(AtomicBool::new(false));
        let parked = {
            let (budget, stopping) = (budget.clone(), stopping.clone());
            std::thread::spawn(move || budget.wait_for_share(6, &stopping))
        };
        std::thread::sleep(Duration::from_millis(20));
        assert!(!parked.is_finished(), "lane 6 of a 4-lane share must wait");
        drop(b);
        parked.join().ok();
        assert_eq!(a.budget().share(), 8);

        let _c = budget.join();
        let parked = {
            let (budget, stopping) = (budget.clone(), stopping.clone());
            std::thread::spawn(move || budget.wait_for_share(6, &stopping))
        };
        std::thread::sleep(Duration::from_millis(20));
        assert!(!parked.is_finished());
        stopping.store(true, Ordering::Release);
        budget.wake_all();
        parked.join().ok();
    }

    #[test]
    fn only_links_with_work_share_the_budget() {
        let budget = LaneBudget::new(16, 8);
        let (a, b, c) = (budget.join(), budget.join(), budget.join());
        assert_eq!(budget.share(), 5);
        a.rest();
        a.rest();
        c.rest();
        assert_eq!(budget.share(), 8, "only b has work");
        c.busy();
        c.busy();
        assert_eq!(budget.share(), 8);
        let stopping = AtomicBool::new(false);
        // A lane of b past a share of 5 runs again once a rests.
        a.busy();
        std::thread::scope(|s| {
            let parked = s.spawn(|| budget.wait_for_share(6, &stopping));
            std::thread::sleep(Duration::from_millis(20));
            assert!(!parked.is_finished(), "lane 6 of a 5-lane share must wait");
            a.rest();
            parked.join().ok();
        });
        drop(b);
        drop(a);
        assert_eq!(budget.share(), 8);
    }

    #[test]
    fn the_engine_is_all_busy_once_it_has_a_slice_out_per_lane_of_its_budget() {
        let budget = LaneBudget::new(4, 2);
        assert!(!budget.all_busy());
        budget.add_out(3);
        assert!(!budget.all_busy(), "3 slices out, 4 lanes");
        budget.add_out(1);
        assert!(budget.all_busy());
        budget.add_out(5);
        budget.sub_out(6);
        assert!(!budget.all_busy(), "3 slices out again");
        // A budget raised to one link's lanes counts against the raised total.
        let raised = LaneBudget::new(1, 8);
        raised.add_out(7);
        assert!(!raised.all_busy());
        raised.add_out(1);
        assert!(raised.all_busy());
    }
}
