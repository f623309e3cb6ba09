//! Writes into device memory that are still landing: the data server's copies of a
//! write's last chunk run on while the next write's first chunk comes off the socket,
//! instead of the connection's thread waiting for them before it reads on. On the 16-CPU
//! H200 host that wait was a tenth of the server threads' time (a copy queued behind the
//! other connections' copies; `docs/benchmarks.md`).
//!
//! What may not happen before the bytes land stays behind it: the status that tells the
//! peer the write is done goes out only once the copies have completed, and the region
//! stays pinned (so `unregister_memory` waits, and its memory is not freed under a copy).

use std::io::{self, Read};

use crate::device::staging_pool::{self, Lease};
use crate::memory::Pin;

/// A stager of the pool with copies that may still run, and the regions they write.
pub struct Landing {
    lease: Lease,
    /// Regions of the writes whose copies may still run.
    pins: Vec<Pin>,
}

impl Landing {
    /// A stager for `device`, out of the pool (waits while the staging budget is spent).
    pub fn start(device: u32) -> io::Result<Self> {
        Ok(Self {
            lease: staging_pool::checkout(device)?,
            pins: Vec::new(),
        })
    }

    /// The device the stager copies to.
    pub fn device(&self) -> u32 {
        self.lease.device()
    }

    /// Receives a write of `len` bytes to device memory at `addr` (inside `pin`'s region)
    /// from `src`. Its last copies may still run on return. The writes received before it
    /// have landed once `earlier_landed` runs, which happens before this one's bytes are
    /// all read: their statuses go out then.
    pub fn receive(
        &mut self,
        src: &mut impl Read,
        addr: u64,
        len: usize,
        pin: Pin,
        earlier_landed: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        let Self { lease, pins } = self;
        lease.stager()?.receive_into(src, addr, len, || {
            pins.clear();
            earlier_landed()
        })?;
        pins.push(pin);
        Ok(())
    }

    /// Waits until every write received has landed; then their regions are unpinned and
    /// the stager goes back to the pool.
    pub fn settle(mut self) -> io::Result<()> {
        self.lease.stager()?.settle()
    }
}

impl Drop for Landing {
    fn drop(&mut self) {
        // A connection that ends mid-write (cut, timeout, peer gone) still waits for its
        // copies before the pins go: memory that `unregister_memory` hands back to its
        // owner is never written after.
        if let Ok(s) = self.lease.stager() {
            let _ = s.settle();
        }
    }
}
