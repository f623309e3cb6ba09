//! A thread that closes what went idle (connections to peers that left), once a second,
//! and, every [`REST_TICK`], lets peers without work give back their share of what the
//! engine's transports share out among peers (TCP's lane budget).

use std::sync::Weak;
use std::time::{Duration, Instant};

use crate::transport::REST_TICK;

use super::error::EngineError;
use super::Inner;

/// The housekeeping thread; stops when dropped.
pub(super) struct Housekeeping {
    stop: Option<crossbeam_channel::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Housekeeping {
    const EVICT_EVERY: Duration = Duration::from_secs(1);

    pub(super) fn start(inner: Weak<Inner>) -> Result<Self, EngineError> {
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        let thread = std::thread::Builder::new()
            .name("te-housekeeping".into())
            .spawn(move || {
                let mut evicted = Instant::now();
                while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(REST_TICK)
                {
                    let Some(inner) = inner.upgrade() else { return };
                    let evict = evicted.elapsed() >= Self::EVICT_EVERY;
                    if evict {
                        evicted = Instant::now();
                    }
                    for t in &inner.transports {
                        t.rest_idle();
                        if evict {
                            t.evict_idle();
                        }
                    }
                }
            })
            .map_err(|source| EngineError::Listen {
                what: "cannot start the housekeeping thread".into(),
                source,
            })?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Housekeeping {
    fn drop(&mut self) {
        // Closing the channel wakes the thread at once.
        self.stop = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
