//! Batch ids: the integers Python holds for submitted batches, and the waits on them with
//! upstream's semantics (`get_batch_transfer_status`, `transfer_check_status`).
//!
//! Ids start at 1 and are never reused; 0 is upstream's failure value. A batch leaves the
//! table when a status call sees it finished (completed or failed), as upstream frees it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use transfer_engine::{Batch, TransferError};

use crate::errors::BindingError;

/// How often a long wait looks up from the batch to check for Ctrl-C.
const INTERRUPT_POLL: Duration = Duration::from_millis(100);

/// What `transfer_check_status` sees.
#[derive(Debug)]
pub enum Poll {
    /// Every request completed; the id is freed. Upstream: 1.
    Completed,
    /// Still moving. Upstream: 0.
    Pending,
    /// A request failed; the id is freed. Upstream: -1.
    Failed(BindingError),
    /// The deadline passed; unsent parts are canceled and the id stays until the batch
    /// drains (then it reads as failed). Upstream: -2.
    TimedOut,
}

impl Poll {
    /// Upstream's return value.
    pub fn code(&self) -> i32 {
        match self {
            Self::Completed => 1,
            Self::Pending => 0,
            Self::Failed(_) => -1,
            Self::TimedOut => -2,
        }
    }
}

#[derive(Debug)]
struct Entry {
    batch: Batch,
    target: String,
}

/// Submitted batches by id.
#[derive(Debug)]
pub struct BatchTable {
    next_id: AtomicU64,
    entries: Mutex<HashMap<u64, Entry>>,
}

impl Default for BatchTable {
    fn default() -> Self {
        Self {
            next_id: AtomicU64::new(1),
            entries: Mutex::new(HashMap::new()),
        }
    }
}

impl BatchTable {
    /// Stores a batch submitted to `target`; returns its id (never 0).
    pub fn insert(&self, batch: Batch, target: &str) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let entry = Entry {
            batch,
            target: target.to_string(),
        };
        self.entries.lock().insert(id, entry);
        id
    }

    /// Number of ids held.
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    /// Whether no id is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Cancels every batch held, drains them (their memory is no longer touched when this
    /// returns) and forgets them (the engine object is going away).
    pub fn cancel_all(&self) {
        let held: Vec<Entry> = self.entries.lock().drain().map(|(_, e)| e).collect();
        for e in held {
            e.batch.cancel_and_drain();
        }
    }

    /// One look at batch `id` at time `now`. It does not wait for the peer; once the
    /// deadline has passed, it drains the batch (cutting its connections) before it
    /// reports the timeout, so the caller may free the memory at once.
    pub fn poll(&self, id: u64, now: Instant) -> Result<Poll, BindingError> {
        let batch = {
            let mut entries = self.entries.lock();
            let entry = entries.get(&id).ok_or(BindingError::UnknownBatch(id))?;
            if entry.batch.is_finished() {
                let result = outcome(&entry.batch, &entry.target);
                entries.remove(&id);
                return Ok(match result {
                    Ok(()) => Poll::Completed,
                    Err(e) => Poll::Failed(e),
                });
            }
            if now < entry.batch.deadline() {
                return Ok(Poll::Pending);
            }
            entry.batch.clone()
        };
        // Outside the table's lock: other threads keep polling their batches meanwhile.
        batch.cancel_and_drain();
        Ok(Poll::TimedOut)
    }

    /// Waits for every batch in `ids`, each until its own deadline; frees them all.
    /// The first failure, timeout or unknown id ends the wait and cancels the rest.
    pub fn wait_all(
        &self,
        ids: &[u64],
        interrupted: &dyn Fn() -> bool,
    ) -> Result<(), BindingError> {
        let mut picked = Vec::with_capacity(ids.len());
        let mut unknown = None;
        {
            let mut entries = self.entries.lock();
            for &id in ids {
                match entries.remove(&id) {
                    Some(e) => picked.push(e),
                    None => unknown = unknown.or(Some(id)),
                }
            }
        }
        let result = match unknown {
            Some(id) => Err(BindingError::UnknownBatch(id)),
            None => picked
                .iter()
                .try_for_each(|e| wait(&e.batch, &e.target, interrupted)),
        };
        if result.is_err() {
            picked.iter().for_each(|e| e.batch.cancel_and_drain());
        }
        result
    }
}

/// Waits for `batch` (submitted to `target`) until its deadline. On a timeout or
/// interrupt the batch is canceled and drained: parts not yet sent are skipped, and the
/// connections carrying parts in flight are cut, so the memory is free on return.
pub fn wait(
    batch: &Batch,
    target: &str,
    interrupted: &dyn Fn() -> bool,
) -> Result<(), BindingError> {
    let deadline = batch.deadline();
    loop {
        let step = deadline.min(Instant::now() + INTERRUPT_POLL);
        if batch.wait_until(step) {
            return outcome(batch, target);
        }
        if Instant::now() >= deadline {
            batch.cancel_and_drain();
            return Err(BindingError::Transfer {
                what: describe(batch.len(), None),
                target: target.to_string(),
                source: TransferError::Timeout(
                    deadline.saturating_duration_since(batch.submitted_at()),
                ),
            });
        }
        if interrupted() {
            batch.cancel_and_drain();
            return Err(BindingError::Interrupted);
        }
    }
}

/// The result of a finished batch: its first failure, if any.
fn outcome(batch: &Batch, target: &str) -> Result<(), BindingError> {
    match batch.first_error() {
        None => Ok(()),
        Some((i, source)) => Err(BindingError::Transfer {
            what: describe(batch.len(), Some(i)),
            target: target.to_string(),
            source,
        }),
    }
}

fn describe(n: usize, failed: Option<usize>) -> String {
    match (n, failed) {
        (1, _) => "transfer".to_string(),
        (n, Some(i)) => format!("request {i} of a batch of {n}"),
        (n, None) => format!("batch of {n} requests"),
    }
}

#[cfg(test)]
mod tests {
    use transfer_engine::task::BatchState;

    use super::*;

    fn never() -> bool {
        false
    }

    #[test]
    fn ids_start_at_one_and_poll_frees_finished_batches() {
        let t = BatchTable::default();
        let b = BatchState::new(&[1], Duration::from_secs(10));
        let id = t.insert(b.clone(), "peer:1");
        assert_eq!(id, 1);
        assert_eq!(t.poll(id, Instant::now()).unwrap().code(), 0);
        b.slice_done(0, Ok(()));
        assert_eq!(t.poll(id, Instant::now()).unwrap().code(), 1);
        assert!(matches!(
            t.poll(id, Instant::now()),
            Err(BindingError::UnknownBatch(1))
        ));
    }

    #[test]
    fn poll_reports_failure_with_reason_and_timeout() {
        let t = BatchTable::default();
        let failed = BatchState::new(&[1, 1], Duration::from_secs(10));
        failed.task_failed(1, TransferError::Canceled("test"));
        failed.slice_done(0, Ok(()));
        let id = t.insert(failed, "peer:1");
        match t.poll(id, Instant::now()).unwrap() {
            Poll::Failed(e) => assert!(e.to_string().contains("request 1 of a batch of 2"), "{e}"),
            other => panic!("{other:?}"),
        }
        let slow = BatchState::new(&[1], Duration::from_millis(1));
        let id = t.insert(slow.clone(), "peer:1");
        let later = Instant::now() + Duration::from_millis(5);
        assert_eq!(t.poll(id, later).unwrap().code(), -2);
        assert!(slow.is_canceled());
        assert_eq!(
            t.poll(id, later).unwrap().code(),
            -2,
            "a timed-out batch keeps its id"
        );
    }

    #[test]
    fn wait_all_frees_every_id_and_reports_the_first_failure() {
        let t = BatchTable::default();
        let ok = BatchState::new(&[0], Duration::from_secs(10));
        let bad = BatchState::new(&[1], Duration::from_secs(10));
        bad.task_failed(0, TransferError::Canceled("test"));
        let ids = [t.insert(ok, "a:1"), t.insert(bad, "b:1")];
        assert!(matches!(
            t.wait_all(&ids, &never),
            Err(BindingError::Transfer { .. })
        ));
        assert!(t.is_empty());
        assert!(matches!(
            t.wait_all(&[99], &never),
            Err(BindingError::UnknownBatch(99))
        ));
    }

    #[test]
    fn wait_times_out_and_cancels() {
        let b = BatchState::new(&[1], Duration::from_millis(30));
        let e = wait(&b, "peer:1", &never).unwrap_err();
        assert!(e.to_string().contains("timed out"), "{e}");
        assert!(b.is_canceled());
    }

    #[test]
    fn wait_stops_on_interrupt() {
        let b = BatchState::new(&[1], Duration::from_secs(30));
        let t0 = Instant::now();
        assert!(matches!(
            wait(&b, "peer:1", &|| true),
            Err(BindingError::Interrupted)
        ));
        assert!(t0.elapsed() < Duration::from_secs(1));
        assert!(b.is_canceled());
    }
}
