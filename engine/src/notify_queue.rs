//! Notifications received from peers, held until the application takes them,
//! within a byte budget.
//!
//! Any peer may send notifications and nothing obliges the application to take
//! them, so an unbounded queue lets a peer grow this process at will (160
//! frames of 1 MiB: 160 MiB). The queue holds at most `MC_NOTIFY_QUEUE_BYTES`
//! of names and messages. A notification that does not fit is not stored: it
//! is refused (the sender's engine is told, through a reply other than
//! `"success"`, and reports the failure to its caller) and counted in
//! [`NotifyQueue::dropped`]. Taking the queued notifications frees their bytes.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::log_throttle::LogThrottle;
use crate::wire::descriptor::NotifyMsg;

/// The `notify_msg` of the reply to a notification that was refused.
pub const REFUSED_REPLY: &str =
    "refused: the receiver's notification queue is full (MC_NOTIFY_QUEUE_BYTES)";

/// Received notifications within a byte budget.
#[derive(Debug)]
pub struct NotifyQueue {
    max_bytes: usize,
    queued: Mutex<Queued>,
    dropped: AtomicU64,
    log: LogThrottle,
}

#[derive(Debug, Default)]
struct Queued {
    items: Vec<NotifyMsg>,
    bytes: usize,
}

/// The notification did not fit in the budget and was not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull;

/// What one notification costs the budget: its text and its bookkeeping.
fn cost(n: &NotifyMsg) -> usize {
    n.name.len() + n.notify_msg.len() + std::mem::size_of::<NotifyMsg>()
}

impl NotifyQueue {
    /// An empty queue holding at most `max_bytes`.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            queued: Mutex::new(Queued::default()),
            dropped: AtomicU64::new(0),
            log: LogThrottle::per_second(),
        }
    }

    /// Queues `n`, or refuses (and counts) it when it would exceed the budget.
    pub fn push(&self, n: NotifyMsg) -> Result<(), QueueFull> {
        let c = cost(&n);
        let mut q = self.queued.lock();
        if q.bytes.saturating_add(c) > self.max_bytes {
            let held = q.bytes;
            drop(q);
            let total = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if let Some(left_out) = self.log.allow() {
                tracing::warn!(
                    "notification of {c} bytes refused: {held} of {} bytes already queued (MC_NOTIFY_QUEUE_BYTES); {total} refused so far, {left_out} such lines left out",
                    self.max_bytes
                );
            }
            return Err(QueueFull);
        }
        q.bytes += c;
        q.items.push(n);
        Ok(())
    }

    /// Takes every queued notification, freeing the budget.
    pub fn take(&self) -> Vec<NotifyMsg> {
        let mut q = self.queued.lock();
        q.bytes = 0;
        std::mem::take(&mut q.items)
    }

    /// Notifications refused since the start.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Bytes held now, as counted against the budget.
    pub fn queued_bytes(&self) -> usize {
        self.queued.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(len: usize) -> NotifyMsg {
        NotifyMsg {
            name: "n".into(),
            notify_msg: "x".repeat(len),
        }
    }

    #[test]
    fn refuses_and_counts_beyond_the_budget_until_taken() {
        let q = NotifyQueue::new(10_000);
        q.push(msg(4000)).unwrap();
        q.push(msg(4000)).unwrap();
        assert_eq!(q.push(msg(4000)), Err(QueueFull));
        assert_eq!(q.dropped(), 1);
        assert!(q.queued_bytes() <= 10_000);
        // A small one still fits in what is left.
        q.push(msg(10)).unwrap();
        assert_eq!(q.take().len(), 3);
        assert_eq!(q.queued_bytes(), 0);
        q.push(msg(4000)).unwrap();
        assert_eq!(q.dropped(), 1);
    }
}
