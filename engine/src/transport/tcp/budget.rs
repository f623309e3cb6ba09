//! How many of its lanes each peer link may use, so that the engine's lane threads scale
//! with the host rather than with the number of peers.
//!
//! A lane is a sending and a receiving thread here and a serving thread on the peer. With
//! a fixed count per peer, ten threads writing to four peers ran 32 lanes (and 32 serving
//! threads) on the 16-core host and moved fewer bytes than 16 lanes did
//! (docs/benchmarks.md, issue 12). So the engine has one budget of lanes, shared evenly
//! by its open links: a lane whose index is past its link's share sleeps until the share
//! grows (a link closed) or the link stops; it keeps its connection, idle.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// Lanes of one engine, shared by its links to peers.
pub struct LaneBudget {
    /// Lanes over all links (`MC_TCP_LANE_BUDGET`).
    total: usize,
    /// The most a link may use (`MC_TCP_LANES_PER_PEER`): the lanes it starts.
    per_peer: usize,
    /// Open links.
    links: AtomicUsize,
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
            lock: Mutex::new(()),
            changed: Condvar::new(),
        })
    }

    /// Counts a new link until the returned membership is dropped.
    pub fn join(self: &Arc<Self>) -> Membership {
        self.links.fetch_add(1, Ordering::AcqRel);
        self.wake_all();
        Membership(self.clone())
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

/// One open link's place in the budget.
pub struct Membership(Arc<LaneBudget>);

impl Membership {
    /// The budget this link belongs to.
    pub fn budget(&self) -> &LaneBudget {
        &self.0
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.0.links.fetch_sub(1, Ordering::AcqRel);
        self.0.wake_all();
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
        // 16 CPUs: one peer gets its 8 lanes; four peers 4 each; many peers never under 2.
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
}
