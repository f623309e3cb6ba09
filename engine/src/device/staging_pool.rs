//! Pinned staging for the data server, within a fixed process-wide budget.
//!
//! Every data-server thread that touches device memory needs a [`Stager`]
//! (4 MiB of pinned host memory and two streams). Kept per thread, any number
//! of peer connections pins any amount of host memory. Here the server checks
//! a stager out of one pool for the length of one request (or of a run of
//! pipelined writes into one device, while their copies land: see the TCP
//! server's `landing`) and gives it back after: at most
//! `MC_TCP_STAGING_BUDGET_MB` of stagers exist at once. When
//! every stager is busy, a request waits for one, up to the data path's I/O
//! timeout (`MC_TCP_STATUS_TIMEOUT_SEC`), then fails with an error saying
//! so, which closes the connection.
//!
//! The budget is per process (pinned memory is), and the most recently
//! started engine's configuration sets it. Our own outgoing lanes stage
//! through [`super::staging`]'s per-thread stagers, which are bounded by the
//! lanes this engine chose to open, not by what peers do; keeping them out of
//! this pool also means a process that both sends and serves cannot have its
//! lanes hold every stager its server needs.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::idle_stagers::IdleStagers;
use super::staging::{Stager, STAGER_BYTES};
use crate::config::Config;
use crate::log_throttle::LogThrottle;

struct Pool {
    state: Mutex<State>,
    freed: Condvar,
    /// Requests waiting for a stager now.
    waiting: AtomicUsize,
    exhausted_log: LogThrottle,
}

struct State {
    /// Stagers not checked out.
    idle: IdleStagers,
    /// Stagers in existence (idle or checked out).
    live: usize,
    /// The budget, in stagers.
    max: usize,
    /// How long a request waits for a free stager.
    wait: Duration,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let defaults = Config::default();
        Pool {
            state: Mutex::new(State {
                idle: IdleStagers::default(),
                live: 0,
                max: stagers_in(defaults.tcp_staging_budget),
                wait: defaults.tcp_status_timeout,
            }),
            freed: Condvar::new(),
            waiting: AtomicUsize::new(0),
            exhausted_log: LogThrottle::per_second(),
        }
    })
}

fn stagers_in(budget: usize) -> usize {
    (budget / STAGER_BYTES).max(1)
}

/// Sets the process-wide budget (`MC_TCP_STAGING_BUDGET_MB`) and the wait
/// for a free stager (`MC_TCP_STATUS_TIMEOUT_SEC`) from `config`.
pub fn configure(config: &Config) {
    let surplus = {
        let mut st = pool().state.lock();
        st.max = stagers_in(config.tcp_staging_budget);
        st.wait = config.tcp_status_timeout;
        // A smaller budget frees idle stagers at once, busy ones when returned.
        let over = st.live.saturating_sub(st.max);
        let surplus = st.idle.oldest(over);
        st.live -= surplus.len();
        surplus
    };
    // Freed outside the lock: freeing synchronises streams.
    drop(surplus);
}

/// TCP transports alive in the process: while none is, stagers given back are freed.
static USERS: AtomicUsize = AtomicUsize::new(0);

/// A TCP transport's hold on the process's staging memory: once the last is dropped, idle
/// stagers (the pool's and [`super::spare_stagers`]) are freed, and so are those given
/// back later (a connection thread of a stopped server may return its lease late).
pub(crate) struct StagingUser(());

/// Counts a TCP transport in until the returned hold is dropped.
pub(crate) fn user() -> StagingUser {
    USERS.fetch_add(1, Ordering::AcqRel);
    StagingUser(())
}

impl Drop for StagingUser {
    fn drop(&mut self) {
        if USERS.fetch_sub(1, Ordering::AcqRel) == 1 {
            trim(Duration::ZERO);
            super::spare_stagers::trim(Duration::ZERO);
        }
    }
}

/// Whether a TCP transport is alive to use staging memory kept idle.
pub(crate) fn in_use() -> bool {
    USERS.load(Ordering::Acquire) > 0
}

/// Frees the stagers no request checked out for `idle`: a server that went quiet keeps
/// no pinned memory.
pub fn trim(idle: Duration) {
    let stale = {
        let mut st = pool().state.lock();
        let stale = st.idle.stale(idle);
        st.live -= stale.len();
        stale
    };
    // Freed outside the lock: freeing synchronises streams.
    drop(stale);
}

/// Stagers in existence now (idle or checked out).
pub fn live_stagers() -> usize {
    pool().state.lock().live
}

/// A request is waiting for a stager: one held across several requests goes back first.
pub(crate) fn wanted() -> bool {
    pool().waiting.load(Ordering::SeqCst) > 0
}

/// A stager checked out of the pool; goes back on drop, its copies settled first.
pub(crate) struct Lease {
    stager: Option<Stager>,
    device: u32,
}

impl Lease {
    /// The device the stager copies to and from.
    pub(crate) fn device(&self) -> u32 {
        self.device
    }

    /// The stager, for as long as the lease is held.
    pub(crate) fn stager(&mut self) -> io::Result<&mut Stager> {
        self.stager
            .as_mut()
            .ok_or_else(|| io::Error::other("staging lease without a stager"))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(mut s) = self.stager.take() else {
            return;
        };
        // Whoever holds the lease settles what landing needs; this only keeps a stager
        // with copies still running out of the idle list.
        let _ = s.settle();
        let p = pool();
        let surplus = {
            let mut st = p.state.lock();
            if st.live > st.max || !in_use() {
                st.live -= 1;
                Some(s)
            } else {
                st.idle.push(self.device, s);
                None
            }
        };
        p.freed.notify_one();
        drop(surplus);
    }
}

/// A stager for `device`, out of the pool: waits while the budget is spent, up to the
/// data path's I/O timeout.
pub(crate) fn checkout(device: u32) -> io::Result<Lease> {
    let p = pool();
    let rt = super::runtime().map_err(io::Error::other)?;
    let mut st = p.state.lock();
    let deadline = Instant::now() + st.wait;
    loop {
        if let Some(s) = st.idle.take(device) {
            drop(st);
            rt.set_device(device).map_err(io::Error::other)?;
            return Ok(Lease {
                stager: Some(s),
                device,
            });
        }
        if st.live < st.max {
            st.live += 1;
            drop(st);
            return match Stager::new(rt.clone(), device) {
                Ok(s) => Ok(Lease {
                    stager: Some(s),
                    device,
                }),
                Err(e) => {
                    p.state.lock().live -= 1;
                    p.freed.notify_one();
                    Err(io::Error::other(e))
                }
            };
        }
        if !st.idle.is_empty() {
            // The budget is spent, partly on idle stagers of another device:
            // free one to make room for this device's.
            let spare = st.idle.oldest(1);
            st.live -= 1;
            drop(st);
            drop(spare);
            st = p.state.lock();
            continue;
        }
        let (max, wait) = (st.max, st.wait);
        if let Some(left_out) = p.exhausted_log.allow() {
            tracing::warn!(
                "all {max} staging buffers ({} MiB, MC_TCP_STAGING_BUDGET_MB) are busy; a request for device {device} waits up to {wait:?}; {left_out} such lines left out",
                (max * STAGER_BYTES) >> 20
            );
        }
        p.waiting.fetch_add(1, Ordering::SeqCst);
        let timed_out = p.freed.wait_until(&mut st, deadline).timed_out();
        p.waiting.fetch_sub(1, Ordering::SeqCst);
        if timed_out {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no staging buffer became free within {wait:?}: all {max} ({} MiB, MC_TCP_STAGING_BUDGET_MB) stayed busy",
                    (max * STAGER_BYTES) >> 20
                ),
            ));
        }
    }
}
