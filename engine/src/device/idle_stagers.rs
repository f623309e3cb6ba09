//! Stagers nobody uses now, with their device and since when: the data server's pool
//! ([`super::staging_pool`]) and our lanes' spares ([`super::spare_stagers`]) keep theirs
//! here. The most recently kept is taken first (its buffers are warmest), and the oldest go
//! first when some must be freed.

use std::time::{Duration, Instant};

use super::staging::Stager;

#[derive(Default)]
pub(super) struct IdleStagers(Vec<Idle>);

struct Idle {
    device: u32,
    stager: Stager,
    since: Instant,
}

impl IdleStagers {
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Keeps `stager`, idle from now.
    pub(super) fn push(&mut self, device: u32, stager: Stager) {
        self.0.push(Idle {
            device,
            stager,
            since: Instant::now(),
        });
    }

    /// The most recently kept stager of `device`, if any.
    pub(super) fn take(&mut self, device: u32) -> Option<Stager> {
        let i = self.0.iter().rposition(|k| k.device == device)?;
        Some(self.0.remove(i).stager)
    }

    /// Takes out the `n` oldest (fewer if fewer are kept), to be freed outside the caller's
    /// lock (freeing pinned memory synchronises the device).
    pub(super) fn oldest(&mut self, n: usize) -> Vec<Stager> {
        let n = n.min(self.0.len());
        self.0.drain(..n).map(|k| k.stager).collect()
    }

    /// Takes out those kept for `idle` or longer (all of them for zero), to be freed as
    /// [`oldest`](Self::oldest)'s.
    pub(super) fn stale(&mut self, idle: Duration) -> Vec<Stager> {
        // Kept in order: the stale ones lead.
        let n = self
            .0
            .iter()
            .position(|k| k.since.elapsed() < idle)
            .unwrap_or(self.0.len());
        self.oldest(n)
    }
}
