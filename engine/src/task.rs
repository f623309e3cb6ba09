//! Completion tracking for batches of requests, and the memory contract of a batch.
//!
//! A batch holds one [`TaskState`] per request; each request may travel as
//! several slices. Slices complete or fail from transport threads; waiters
//! sleep on a condition variable until the last task finishes.
//!
//! A transport thread [`enter`](BatchState::enter)s the batch before it touches
//! the caller's memory for a slice, naming the connection that carries it, and
//! leaves when it is done with that memory. [`cancel_and_drain`](BatchState::cancel_and_drain)
//! stops new entries, cuts the connections that carry the slices still entered and
//! waits until none is: after it returns, no engine thread touches the batch's
//! memory again, whatever the peer does.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::TransferError;
use crate::memory::Abort;
use crate::metrics::Recorder;

/// Ids of batches; 0 is never used, so it can mean "none".
static NEXT_BATCH_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Requests in a batch whose waiter looks for completion before sleeping, at most.
const LOOKING_BATCH: usize = 4;

/// Times a waiter checks for completion (yielding in between) before it sleeps.
fn waiter_looks() -> u32 {
    static LOOKS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *LOOKS.get_or_init(|| crate::config::waiter_looks_for_cpus(crate::config::available_cpus()))
}

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
    /// Unique in the process (never reused, unlike the batch's address).
    id: u64,
    unfinished: AtomicUsize,
    /// Every task finished: what waiters look at. Set after the counting of all but a
    /// sole last request (see `task_finished`).
    finished: AtomicBool,
    canceled: AtomicBool,
    /// Slices whose memory a transport thread may be touching now.
    entered: AtomicUsize,
    /// The connections that carried entered slices (cut on cancel).
    carriers: Mutex<Vec<Arc<dyn Abort>>>,
    lock: Mutex<()>,
    done: Condvar,
    submitted_at: Instant,
    deadline: Instant,
    /// Where finished requests are counted (set once, before any slice is posted).
    recorder: OnceLock<Recorder>,
    /// The submitting thread waits for the batch right after submitting it (a
    /// synchronous call): a transport may send on that thread before the wait.
    caller_waits: AtomicBool,
    /// The local NIC the caller named for this batch (`nic_hint`), where a transport
    /// chooses among several (set once, before any slice is posted).
    nic_hint: OnceLock<Box<str>>,
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
            id: NEXT_BATCH_ID.fetch_add(1, Ordering::Relaxed),
            unfinished: AtomicUsize::new(unfinished),
            finished: AtomicBool::new(unfinished == 0),
            canceled: AtomicBool::new(false),
            entered: AtomicUsize::new(0),
            carriers: Mutex::new(Vec::new()),
            lock: Mutex::new(()),
            done: Condvar::new(),
            submitted_at: now,
            deadline: now + budget,
            recorder: OnceLock::new(),
            caller_waits: AtomicBool::new(false),
            nic_hint: OnceLock::new(),
        })
    }

    /// Marks the batch as waited for by its submitter at once (before any slice is posted).
    pub fn set_caller_waits(&self) {
        self.caller_waits.store(true, Ordering::Relaxed);
    }

    /// See [`set_caller_waits`](Self::set_caller_waits).
    pub fn caller_waits(&self) -> bool {
        self.caller_waits.load(Ordering::Relaxed)
    }

    /// Pins the batch's slices to the local NIC `name`, where their transport has a choice
    /// of NICs (before any slice is posted; a second call is ignored).
    pub fn set_nic_hint(&self, name: &str) {
        let _ = self.nic_hint.set(name.into());
    }

    /// See [`set_nic_hint`](Self::set_nic_hint).
    pub fn nic_hint(&self) -> Option<&str> {
        self.nic_hint.get().map(|n| &**n)
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
        if task.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.task_finished(i, task);
        }
    }

    /// Counts batch metrics into `recorder` from now on; a second call is ignored.
    pub fn set_recorder(&self, recorder: Recorder) {
        let _ = self.recorder.set(recorder);
    }

    fn task_finished(&self, i: usize, task: &TaskState) {
        let Some(r) = self.recorder.get() else {
            if self.unfinished.fetch_sub(1, Ordering::AcqRel) == 1 {
                self.wake_waiters();
            }
            return;
        };
        let elapsed = self.submitted_at.elapsed();
        // Only finishing tasks lower the count, so at 1 this is the last one and no other
        // thread can finish the batch meanwhile. Its waiter is woken first and the counting
        // follows, off the request's path (a single small request's latency is where the
        // metrics showed, 4-7% on the 16-core host); snapshots wait for such trailing counts.
        if self.unfinished.load(Ordering::Acquire) == 1 {
            r.begin_trailing();
            self.unfinished.fetch_sub(1, Ordering::AcqRel);
            self.wake_waiters();
            r.request_done(i, task.error.get(), elapsed);
            r.batch_done(elapsed);
            r.end_trailing();
            return;
        }
        r.request_done(i, task.error.get(), elapsed);
        if self.unfinished.fetch_sub(1, Ordering::AcqRel) == 1 {
            r.batch_done(elapsed);
            self.wake_waiters();
        }
    }

    fn wake_waiters(&self) {
        self.finished.store(true, Ordering::Release);
        let _guard = self.lock.lock();
        self.done.notify_all();
    }

    /// Fails every remaining slice of task `i` at once (request never sent).
    pub fn task_failed(&self, i: usize, error: TransferError) {
        let Some(task) = self.tasks.get(i) else {
            return;
        };
        let _ = task.error.set(error);
        if task.remaining.swap(0, Ordering::AcqRel) > 0 {
            self.task_finished(i, task);
        }
    }

    /// Asks transports to skip slices of this batch not yet sent. Slices on the wire may
    /// still touch memory: use [`cancel_and_drain`](Self::cancel_and_drain) before the
    /// memory is given back.
    pub fn cancel(&self) {
        self.canceled.store(true, Ordering::SeqCst);
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_canceled(&self) -> bool {
        self.canceled.load(Ordering::SeqCst)
    }

    /// The batch's id, unique in the process (never 0).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Called by a transport thread before it touches the memory of a slice of this batch
    /// carried by `carrier`; false (and nothing may be touched) once the batch is canceled.
    /// Every `true` must be matched by one [`leave`](Self::leave). `carrier_known`: the
    /// carrier already entered this batch before (it is on the list to cut).
    pub fn enter(&self, carrier: &Arc<dyn Abort>, carrier_known: bool) -> bool {
        if !carrier_known {
            let mut carriers = self.carriers.lock();
            let known = carriers
                .iter()
                .any(|c| std::ptr::addr_eq(Arc::as_ptr(c), Arc::as_ptr(carrier)));
            if !known {
                carriers.push(carrier.clone());
            }
        }
        // Paired with `cancel_and_drain`: either it sees this entry, or we see its cancel.
        self.entered.fetch_add(1, Ordering::SeqCst);
        if self.canceled.load(Ordering::SeqCst) {
            self.leave();
            return false;
        }
        true
    }

    /// The transport thread is done with a slice's memory.
    pub fn leave(&self) {
        // Only a drain waits for `entered` to reach 0, and it cancels first: without a
        // cancel, nobody needs the wake-up (SeqCst pairs with `cancel_and_drain`).
        if self.entered.fetch_sub(1, Ordering::SeqCst) == 1 && self.is_canceled() {
            let _guard = self.lock.lock();
            self.done.notify_all();
        }
    }

    /// Cancels the batch and returns once no transport thread touches its memory: queued
    /// slices are skipped, and the connections carrying slices in flight are cut (they
    /// reconnect for later work) instead of waiting for the peer. A device copy over GPU
    /// IPC cannot be cut: its carrier's abort does nothing, and this waits until the copies
    /// already issued are done (bounded by copy time, not by a peer).
    pub fn cancel_and_drain(&self) {
        self.cancel();
        let mut cut = 0;
        while self.entered.load(Ordering::SeqCst) > 0 {
            let carriers: Vec<Arc<dyn Abort>> = self.carriers.lock().clone();
            if carriers.len() > cut {
                carriers.iter().for_each(|c| c.abort());
                cut = carriers.len();
            }
            let mut guard = self.lock.lock();
            if self.entered.load(Ordering::SeqCst) > 0 {
                self.done.wait_for(&mut guard, Duration::from_millis(20));
            }
        }
    }

    /// Whether every task has finished (completed or failed).
    pub fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
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
        // paying for a sleep and a wake-up. Not for a batch of many requests, which takes
        // hundreds of microseconds: there the yields only took CPU from the threads moving
        // it (2.6% of the 16-CPU host's samples in the serving workload, 4 peers).
        let looks = if self.tasks.len() <= LOOKING_BATCH {
            waiter_looks()
        } else {
            0
        };
        for _ in 0..looks {
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
    /// On timeout the batch is canceled and drained: when this returns, the batch's
    /// memory is no longer touched.
    pub fn wait(&self) -> Result<(), TransferError> {
        self.wait_deadline(self.deadline)
    }

    /// As [`wait`](Self::wait) with an explicit deadline.
    pub fn wait_deadline(&self, until: Instant) -> Result<(), TransferError> {
        if !self.wait_until(until) {
            self.cancel_and_drain();
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
        // Whether the waiter is spinning, asleep or not yet started when the slice
        // completes, it must return Ok well before the 10 s deadline.
        let b = BatchState::new(&[1], Duration::from_secs(10));
        let b2 = b.clone();
        let t = std::thread::spawn(move || (b2.wait(), Instant::now()));
        b.slice_done(0, Ok(()));
        let (result, at) = t.join().unwrap();
        assert_eq!(result, Ok(()));
        assert!(at < b.deadline());
    }

    #[derive(Debug)]
    struct Counter(AtomicUsize);
    impl Abort for Counter {
        fn abort(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn no_entry_after_cancel() {
        let b = BatchState::new(&[1], Duration::from_secs(10));
        let carrier: Arc<dyn Abort> = Arc::new(Counter(AtomicUsize::new(0)));
        b.cancel_and_drain();
        assert!(!b.enter(&carrier, false));
        b.cancel_and_drain(); // nothing entered: returns at once
    }

    #[test]
    fn drain_cuts_carriers_and_waits_for_the_slices_in_flight() {
        let b = BatchState::new(&[2], Duration::from_secs(10));
        let counter = Arc::new(Counter(AtomicUsize::new(0)));
        let carrier: Arc<dyn Abort> = counter.clone();
        assert!(b.enter(&carrier, false));
        assert!(b.enter(&carrier, true));
        let (tx, rx) = std::sync::mpsc::channel();
        let b2 = b.clone();
        let t = std::thread::spawn(move || {
            b2.cancel_and_drain();
            tx.send(()).unwrap();
        });
        while counter.0.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        b.leave();
        assert!(rx.try_recv().is_err(), "drained with a slice still entered");
        b.leave();
        rx.recv().unwrap();
        t.join().unwrap();
        assert!(b.is_canceled());
    }
}
