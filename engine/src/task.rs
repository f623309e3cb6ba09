//! Completion tracking for batches of requests.
//!
//! A batch holds one [`TaskState`] per request; each request may travel as
//! several slices. Slices complete or fail from transport threads; waiters
//! sleep on a condition variable until the last task finishes.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::TransferError;

/// Times a waiter checks for completion (yielding in between) before it sleeps.
const SPIN_LOOKS: u32 = 64;

/// State of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskStatus {
    /// Still moving.
    Pending,
    /// All bytes moved and (v2) acknowledged.
    Completed,
    /// Failed, with the first reason seen.
    Failed(TransferError),
}

#[derive(Debug)]
struct TaskState {
    remaining: AtomicU32,
    error: OnceLock<TransferError>,
}

/// Shared state of a batch.
#[derive(Debug)]
pub struct BatchState {
    tasks: Box<[TaskState]>,
    unfinished: AtomicUsize,
    canceled: AtomicBool,
    lock: Mutex<()>,
    done: Condvar,
    submitted_at: Instant,
    deadline: Instant,
}

impl BatchState {
    /// A batch whose task `i` completes after `slices[i]` slices (0 = already complete).
    pub fn new(slices: &[u32], budget: Duration) -> Arc<Self> {
        let now = Instant::now();
        let unfinished = slices.iter().filter(|&&n| n > 0).count();
        Arc::new(Self {
            tasks: slices
                .iter()
                .map(|&n| TaskState {
                    remaining: AtomicU32::new(n),
                    error: OnceLock::new(),
                })
                .collect(),
            unfinished: AtomicUsize::new(unfinished),
            canceled: AtomicBool::new(false),
            lock: Mutex::new(()),
            done: Condvar::new(),
            submitted_at: now,
            deadline: now + budget,
        })
    }

    /// Number of requests.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether the batch has no requests.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// When the batch was submitted.
    pub fn submitted_at(&self) -> Instant {
        self.submitted_at
    }

    /// Upstream's deadline: `MC_TRANSFER_TIMEOUT` + 1 ns per byte from submission.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Records one finished slice of task `i`.
    pub fn slice_done(&self, i: usize, result: Result<(), TransferError>) {
        let Some(task) = self.tasks.get(i) else {
            return;
        };
        if let Err(e) = result {
            let _ = task.error.set(e);
        }
        if task.remaining.fetch_sub(1, Ordering::AcqRel) == 1
            && self.unfinished.fetch_sub(1, Ordering::AcqRel) == 1
        {
            let _guard = self.lock.lock();
            self.done.notify_all();
        }
    }

    /// Fails every remaining slice of task `i` at once (request never sent).
    pub fn task_failed(&self, i: usize, error: TransferError) {
        let Some(task) = self.tasks.get(i) else {
            return;
        };
        let _ = task.error.set(error);
        if task.remaining.swap(0, Ordering::AcqRel) > 0
            && self.unfinished.fetch_sub(1, Ordering::AcqRel) == 1
        {
            let _guard = self.lock.lock();
            self.done.notify_all();
        }
    }

    /// Asks transports to skip slices of this batch not yet sent.
    pub fn cancel(&self) {
        self.canceled.store(true, Ordering::Release);
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_canceled(&self) -> bool {
        self.canceled.load(Ordering::Acquire)
    }

    /// Whether every task has finished (completed or failed).
    pub fn is_finished(&self) -> bool {
        self.unfinished.load(Ordering::Acquire) == 0
    }

    /// Status of task `i`.
    pub fn task(&self, i: usize) -> Option<TaskStatus> {
        let t = self.tasks.get(i)?;
        Some(if t.remaining.load(Ordering::Acquire) > 0 {
            TaskStatus::Pending
        } else if let Some(e) = t.error.get() {
            TaskStatus::Failed(e.clone())
        } else {
            TaskStatus::Completed
        })
    }

    /// The first failure among finished tasks, in request order.
    pub fn first_error(&self) -> Option<(usize, TransferError)> {
        self.tasks.iter().enumerate().find_map(|(i, t)| {
            (t.remaining.load(Ordering::Acquire) == 0)
                .then(|| t.error.get().map(|e| (i, e.clone())))
                .flatten()
        })
    }

    /// Blocks until every task finished or `until` passes; true if finished.
    pub fn wait_until(&self, until: Instant) -> bool {
        // Small transfers finish within microseconds: look a few times before
        // paying for a sleep and a wake-up.
        for _ in 0..SPIN_LOOKS {
            if self.is_finished() {
                return true;
            }
            std::thread::yield_now();
        }
        let mut guard = self.lock.lock();
        while !self.is_finished() {
            if self.done.wait_until(&mut guard, until).timed_out() {
                return self.is_finished();
            }
        }
        true
    }

    /// Waits until the batch's own deadline; `Ok` only if every task completed.
    /// On timeout the batch is canceled so unsent slices are skipped.
    pub fn wait(&self) -> Result<(), TransferError> {
        self.wait_deadline(self.deadline)
    }

    /// As [`wait`](Self::wait) with an explicit deadline.
    pub fn wait_deadline(&self, until: Instant) -> Result<(), TransferError> {
        if !self.wait_until(until) {
            self.cancel();
            return Err(TransferError::Timeout(
                until.saturating_duration_since(self.submitted_at),
            ));
        }
        match self.first_error() {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completes_after_every_slice() {
        let b = BatchState::new(&[2, 1, 0], Duration::from_secs(1));
        assert_eq!(b.task(2), Some(TaskStatus::Completed));
        assert!(!b.is_finished());
        b.slice_done(0, Ok(()));
        b.slice_done(1, Ok(()));
        assert_eq!(b.task(0), Some(TaskStatus::Pending));
        b.slice_done(0, Ok(()));
        assert!(b.is_finished());
        assert_eq!(b.wait(), Ok(()));
    }

    #[test]
    fn failure_is_reported_with_its_reason() {
        let b = BatchState::new(&[1, 1], Duration::from_secs(1));
        b.slice_done(0, Ok(()));
        b.task_failed(1, TransferError::Canceled("test"));
        assert_eq!(b.wait(), Err(TransferError::Canceled("test")));
        assert!(matches!(b.task(1), Some(TaskStatus::Failed(_))));
        assert_eq!(b.task(0), Some(TaskStatus::Completed));
        assert_eq!(b.task(5), None);
    }

    #[test]
    fn wait_times_out_and_cancels() {
        let b = BatchState::new(&[1], Duration::from_millis(20));
        assert!(matches!(b.wait(), Err(TransferError::Timeout(_))));
        assert!(b.is_canceled());
    }

    #[test]
    fn waiter_wakes_from_another_thread() {
        let b = BatchState::new(&[1], Duration::from_secs(10));
        let b2 = b.clone();
        let t = std::thread::spawn(move || b2.wait());
        std::thread::sleep(Duration::from_millis(10));
        b.slice_done(0, Ok(()));
        assert_eq!(t.join().unwrap(), Ok(()));
    }
}
