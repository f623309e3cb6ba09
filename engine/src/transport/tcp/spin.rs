//! Looking for work or bytes without sleeping, for a bounded time and by a bounded number
//! of threads at once.
//!
//! A thread that sleeps until a small request's next step pays a wake-up: tens of µs on a
//! many-core host, more in a virtual machine, most of a 4 KiB request's time. Spinning a
//! while first avoids it, but under load (many connections, more threads than CPUs) every
//! spinning thread takes a CPU that a thread with work needs: on the 16-core host, letting
//! every thread spin cost 15% of 64 KiB throughput and a third with four peers. So only a
//! few threads of the process spin at once; the rest sleep at once, as before.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Requests up to this size are small: their next step comes within microseconds, so
/// threads spin only around them. 4 KiB single requests are; the serving-shaped 32 KiB
/// batches and 64 KiB blocks are not (their time goes to moving bytes).
pub(super) const SMALL_REQUEST: u64 = 16 << 10;

/// Threads of this process spinning now.
static SPINNING: AtomicUsize = AtomicUsize::new(0);

/// How many threads of the process may spin at once: one per 8 CPUs, at least one.
fn slots() -> usize {
    static SLOTS: OnceLock<usize> = OnceLock::new();
    *SLOTS.get_or_init(|| (crate::config::available_cpus() / 8).max(1))
}

/// Calls `look` until it gives a value or `budget` has passed, without sleeping; `None`
/// at once when the budget is zero or as many threads as allowed spin already.
pub(super) fn spin_for<T>(budget: Duration, look: impl FnMut() -> Option<T>) -> Option<T> {
    spin_within(&SPINNING, slots(), budget, look)
}

/// [`spin_for`] with `spinning` counting the threads that spin and `slots` of them allowed.
fn spin_within<T>(
    spinning: &AtomicUsize,
    slots: usize,
    budget: Duration,
    mut look: impl FnMut() -> Option<T>,
) -> Option<T> {
    if budget.is_zero() {
        return None;
    }
    if spinning.fetch_add(1, Ordering::AcqRel) >= slots {
        spinning.fetch_sub(1, Ordering::AcqRel);
        return None;
    }
    let start = Instant::now();
    let found = loop {
        if let Some(v) = look() {
            break Some(v);
        }
        if start.elapsed() >= budget {
            break None;
        }
        std::hint::spin_loop();
    };
    spinning.fetch_sub(1, Ordering::AcqRel);
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_what_comes_within_the_budget_and_gives_up_after_it() {
        let spinning = AtomicUsize::new(0);
        let mut n = 0;
        let got = spin_within(&spinning, 1, Duration::from_secs(5), || {
            n += 1;
            (n == 3).then_some(n)
        });
        assert_eq!(got, Some(3));
        let start = Instant::now();
        let none = spin_within(&spinning, 1, Duration::from_millis(2), || None::<()>);
        assert_eq!(none, None);
        assert!(start.elapsed() >= Duration::from_millis(2));
        assert_eq!(spin_within(&spinning, 1, Duration::ZERO, || Some(1)), None);
        assert_eq!(spinning.load(Ordering::Acquire), 0);
    }

    #[test]
    fn no_more_threads_spin_than_there_are_slots() {
        let spinning = AtomicUsize::new(2);
        let mut looked = false;
        let got = spin_within(&spinning, 2, Duration::from_secs(5), || {
            looked = true;
            Some(())
        });
        assert_eq!((got, looked), (None, false));
        assert_eq!(spinning.load(Ordering::Acquire), 2);
    }
}
