//! [`PendingCopies`] against a runtime that records its calls: when the ends are let go
//! of, what is refused, how runs merge and batches fall back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Weak};

use super::*;

/// A runtime call, as the fake saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    SetDevice(u32),
    Create(usize),
    Copy {
        dst: u64,
        src: u64,
        len: usize,
    },
    Batch(Vec<(u64, u64, usize)>),
    /// A stream synchronised, with the local ends alive and the holders of the watched
    /// mapping then.
    Sync {
        stream: usize,
        locals_alive: usize,
        mapping_holders: usize,
    },
    Destroy(usize),
}

/// Records every call; its batch call fails when asked to.
#[derive(Default)]
struct Fake {
    calls: Mutex<Vec<Call>>,
    streams: AtomicUsize,
    fail_batch: bool,
    alive: Arc<AtomicUsize>,
    watched: Mutex<Weak<PeerMapping>>,
}

impl Fake {
    fn log(&self, c: Call) {
        self.calls.lock().unwrap().push(c);
    }

    fn take(&self) -> Vec<Call> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }

    fn copies(calls: &[Call]) -> usize {
        calls
            .iter()
            .filter(|c| matches!(c, Call::Copy { .. } | Call::Batch(_)))
            .count()
    }
}

fn id(s: Stream) -> usize {
    s as usize
}

impl StreamCalls for Fake {
    fn set_device(&self, device: u32) -> Result<(), DeviceError> {
        self.log(Call::SetDevice(device));
        Ok(())
    }

    fn stream_create(&self) -> Result<Stream, DeviceError> {
        let n = self.streams.fetch_add(1, Ordering::Relaxed) + 1;
        self.log(Call::Create(n));
        Ok(std::ptr::without_provenance_mut(n))
    }

    fn stream_sync(&self, s: Stream) -> Result<(), DeviceError> {
        self.log(Call::Sync {
            stream: id(s),
            locals_alive: self.alive.load(Ordering::Relaxed),
            mapping_holders: self.watched.lock().unwrap().strong_count(),
        });
        Ok(())
    }

    fn stream_destroy(&self, s: Stream) {
        self.log(Call::Destroy(id(s)));
    }

    unsafe fn copy_async(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        _s: Stream,
    ) -> Result<(), DeviceError> {
        self.log(Call::Copy { dst, src, len });
        Ok(())
    }

    unsafe fn copy_batch_async(
        &self,
        copies: &[(u64, u64, usize)],
        _s: Stream,
    ) -> Result<(), DeviceError> {
        self.log(Call::Batch(copies.to_vec()));
        if self.fail_batch {
            return Err(DeviceError {
                call: "fakeMemcpyBatchAsync".into(),
                code: 1,
                message: "refused".into(),
            });
        }
        Ok(())
    }
}

/// A local end that counts itself alive while it lives.
#[derive(Debug)]
struct Local {
    range: LocalRange,
    alive: Arc<AtomicUsize>,
}

impl Local {
    fn new(fake: &Fake, device: u32, addr: u64, len: usize) -> Self {
        fake.alive.fetch_add(1, Ordering::Relaxed);
        Self {
            range: LocalRange { device, addr, len },
            alive: fake.alive.clone(),
        }
    }
}

impl LocalMemory for Local {
    fn local_range(&self) -> LocalRange {
        self.range
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        self.alive.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The peer's memory: 64 KiB mapped at 0x10_0000.
const PEER: u64 = 0x10_0000;

fn setup(fail_batch: bool) -> (Arc<Fake>, Arc<PeerMapping>) {
    let fake = Arc::new(Fake {
        fail_batch,
        ..Fake::default()
    });
    let mapping = PeerMapping::for_tests(PEER, 64 << 10);
    *fake.watched.lock().unwrap() = Arc::downgrade(&mapping);
    (fake, mapping)
}

#[test]
fn both_ends_are_held_until_synchronize_has_synchronised_the_stream() {
    let (fake, mapping) = setup(false);
    let mut copies = PendingCopies::new(fake.clone());
    let write = Local::new(&fake, 0, 0x1000, 256);
    let read = Local::new(&fake, 0, 0x9000, 128);
    let to = mapping.range(PEER, 256).unwrap();
    let from = mapping.range(PEER + 4096, 128).unwrap();
    assert!(copies.enqueue(write, to, Direction::ToPeer).is_ok());
    assert!(copies.enqueue(read, from, Direction::FromPeer).is_ok());
    assert_eq!(
        Arc::strong_count(&mapping),
        3,
        "each copy holds the mapping"
    );
    assert_eq!(fake.alive.load(Ordering::Relaxed), 2);
    let before = fake.take();
    assert_eq!(
        Fake::copies(&before),
        0,
        "nothing issued before synchronize"
    );

    let s = copies.synchronize(false);
    let calls = fake.take();
    assert_eq!(
        calls,
        vec![
            Call::Copy {
                dst: PEER,
                src: 0x1000,
                len: 256
            },
            Call::Copy {
                dst: 0x9000,
                src: PEER + 4096,
                len: 128
            },
            Call::Sync {
                stream: 1,
                locals_alive: 2,
                mapping_holders: 3
            },
        ],
        "both ends alive while the stream synchronised; the device already current"
    );
    assert_eq!(
        Arc::strong_count(&mapping),
        1,
        "the mapping let go of after"
    );
    assert!(s.batch_failed.is_none());
    assert_eq!(s.done.len(), 2);
    assert!(s.done.iter().all(|(_, r)| r.is_ok()));
    assert_eq!(
        fake.alive.load(Ordering::Relaxed),
        2,
        "the locals handed back"
    );
    drop(s);
    assert_eq!(fake.alive.load(Ordering::Relaxed), 0);

    // Another round on the same stream, then the stream goes with its owner.
    let l = Local::new(&fake, 0, 0x1000, 16);
    assert!(copies
        .enqueue(l, mapping.range(PEER, 16).unwrap(), Direction::ToPeer)
        .is_ok());
    let s = copies.synchronize(false);
    assert_eq!(s.done.len(), 1);
    drop(copies);
    let calls = fake.take();
    assert_eq!(calls.last(), Some(&Call::Destroy(1)), "{calls:?}");
    assert_eq!(
        calls
            .iter()
            .filter(|c| matches!(c, Call::Create(_)))
            .count(),
        0,
        "the stream is reused"
    );
}

#[test]
fn a_range_outside_the_mapping_or_of_another_length_is_refused_before_any_copy() {
    let (fake, mapping) = setup(false);
    let mut copies = PendingCopies::new(fake.clone());
    let outside = mapping.range(PEER + (64 << 10) - 8, 16);
    assert!(
        matches!(outside, Err(CopyError::OutsideMapping { .. })),
        "{:?}",
        outside.err()
    );
    let l = Local::new(&fake, 0, 0x1000, 32);
    let refused = copies
        .enqueue(l, mapping.range(PEER, 16).unwrap(), Direction::FromPeer)
        .err()
        .unwrap();
    assert_eq!(
        refused.why,
        CopyError::Lengths {
            local: 32,
            remote: 16
        }
    );
    assert_eq!(
        refused.local.range.addr, 0x1000,
        "the local end handed back"
    );
    assert_eq!(
        Arc::strong_count(&mapping),
        1,
        "a refused copy holds nothing"
    );
    let s = copies.synchronize(true);
    assert!(s.done.is_empty());
    assert_eq!(Fake::copies(&fake.take()), 0, "no copy issued");
}

#[test]
fn adjacent_copies_go_in_one_run_and_a_failed_batch_goes_one_by_one() {
    for fail_batch in [false, true] {
        let (fake, mapping) = setup(fail_batch);
        let mut copies = PendingCopies::new(fake.clone());
        // Three slices of one request, adjacent on both sides, then a scattered one.
        for (local, remote) in [
            (0x1000, 0),
            (0x1100, 0x100),
            (0x1200, 0x200),
            (0x8000, 0x800),
        ] {
            let l = Local::new(&fake, 0, local, 0x100);
            let r = mapping.range(PEER + remote, 0x100).unwrap();
            assert!(copies.enqueue(l, r, Direction::ToPeer).is_ok());
        }
        let _ = fake.take();
        let s = copies.synchronize(true);
        let calls = fake.take();
        let runs = vec![(PEER, 0x1000, 0x300), (PEER + 0x800, 0x8000, 0x100)];
        let mut want = vec![Call::Batch(runs.clone())];
        if fail_batch {
            want.push(Call::Sync {
                stream: 1,
                locals_alive: 4,
                mapping_holders: 5,
            });
            want.extend(
                runs.iter()
                    .map(|&(dst, src, len)| Call::Copy { dst, src, len }),
            );
        }
        want.push(Call::Sync {
            stream: 1,
            locals_alive: 4,
            mapping_holders: 5,
        });
        assert_eq!(calls, want, "batch call failing: {fail_batch}");
        assert_eq!(s.batch_failed.is_some(), fail_batch);
        assert_eq!(s.done.len(), 4);
        assert!(s.done.iter().all(|(_, r)| r.is_ok()));
    }
}

#[test]
fn each_device_has_its_stream_and_every_stream_is_issued_before_any_waits() {
    let (fake, mapping) = setup(false);
    let mut copies = PendingCopies::new(fake.clone());
    for (device, local) in [(0, 0x1000), (1, 0x2000), (0, 0x3000)] {
        let l = Local::new(&fake, device, local, 0x10);
        let r = mapping.range(PEER + local, 0x10).unwrap();
        assert!(copies.enqueue(l, r, Direction::ToPeer).is_ok());
    }
    let created = fake.take();
    assert_eq!(
        created,
        vec![
            Call::SetDevice(0),
            Call::Create(1),
            Call::SetDevice(1),
            Call::Create(2)
        ]
    );
    let s = copies.synchronize(false);
    let calls = fake.take();
    let kinds: Vec<&str> = calls
        .iter()
        .map(|c| match c {
            Call::SetDevice(_) => "set",
            Call::Copy { .. } => "copy",
            Call::Sync { .. } => "sync",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        ["set", "copy", "copy", "set", "copy", "set", "sync", "set", "sync"],
        "{calls:?}"
    );
    assert_eq!(s.done.len(), 3);
}
