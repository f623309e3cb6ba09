//! Stagers our own lanes and receivers gave back while they wait for work.
//!
//! A lane or receiver thread stages device memory through a [`Stager`] of its own
//! ([`super::staging`]). Kept for the thread's life, those would grow with the threads:
//! every link starts its own lanes (up to a CPU's worth), each with a receiver, and a
//! decode process that pulls from eight prefill peers kept 8 links x 16 lanes x 2 x 4 MiB
//! = 1 GiB pinned while moving bytes over 16 lanes at a time. So a thread that runs out of
//! work gives its stagers back here, and a thread that needs one takes it from here
//! before allocating: pinned memory follows the threads moving device memory now, plus at
//! most [`configure`]'s spares, whatever the number of peers. Spares unused for a while
//! are freed ([`trim`]), and all of them once the last TCP transport is dropped: an idle
//! process holds none.

use std::sync::OnceLock;
use std::time::Duration;

use parking_lot::Mutex;

use super::idle_stagers::IdleStagers;
use super::staging::Stager;

struct Spares {
    kept: IdleStagers,
    max: usize,
}

fn spares() -> &'static Mutex<Spares> {
    static SPARES: OnceLock<Mutex<Spares>> = OnceLock::new();
    SPARES.get_or_init(|| {
        Mutex::new(Spares {
            kept: IdleStagers::default(),
            max: DEFAULT_MAX,
        })
    })
}

/// Until a TCP transport says otherwise: a lane and a receiver for each of 8 lanes.
const DEFAULT_MAX: usize = 16;

/// Keeps at most `max` spares (process-wide: the most recently started engine sets it);
/// frees those over it at once.
pub fn configure(max: usize) {
    let surplus = {
        let mut s = spares().lock();
        s.max = max;
        let over = s.kept.len().saturating_sub(max);
        s.kept.oldest(over)
    };
    // Freed outside the lock: freeing pinned memory synchronises the device.
    drop(surplus);
}

/// A spare stager for `device`, if one is kept.
pub(crate) fn take(device: u32) -> Option<Stager> {
    spares().lock().kept.take(device)
}

/// Keeps `stager` (settled, holding nothing copied ahead) for the next thread that needs
/// one on `device`; the oldest spare is freed if that makes one too many.
pub(crate) fn give_back(device: u32, stager: Stager) {
    if !super::staging_pool::in_use() {
        // The last TCP transport is gone: nobody will take it.
        return;
    }
    let surplus = {
        let mut s = spares().lock();
        s.kept.push(device, stager);
        let over = s.kept.len().saturating_sub(s.max);
        s.kept.oldest(over)
    };
    drop(surplus);
}

/// Frees the spares given back more than `idle` ago.
pub fn trim(idle: Duration) {
    let stale = spares().lock().kept.stale(idle);
    drop(stale);
}

/// Spare stagers kept now.
pub fn count() -> usize {
    spares().lock().kept.len()
}
