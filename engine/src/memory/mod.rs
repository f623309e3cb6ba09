//! Registered memory regions: the only memory a peer may touch.
//!
//! Lookups take a read lock on a `BTreeMap` keyed by start address, so a
//! bounds check is one `range(..=addr).next_back()`. A region is pinned
//! ([`Pin`]) while a transfer touches it, by a holder that can be aborted (a
//! connection), and leased ([`Lease`]) to a device that reaches it without our
//! threads (an HCA's memory registration). Unregistering removes the region from
//! the map, retires it so no new pin or lease is granted, aborts the holders of
//! the pins still out (their I/O stops at once, whatever the peer does) and waits
//! for those pins to drop, then has the transports give their leases back
//! (deregistering from their devices) and waits for that: memory is never
//! accessed after `unregister` returns, and no peer can hold the call up. No lock
//! is held while it waits.

// Peer input is parsed here: an index out of range must be an error, never a panic.
#![deny(clippy::indexing_slicing)]

pub mod host_buffer;
pub mod span;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock};
use thiserror::Error;

pub use span::{Abort, MemSpan, SocketCut};

/// Registration failures, with upstream's error codes.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MemoryError {
    /// Zero length, null address or a range that wraps.
    #[error("invalid region {addr:#x}+{len}: {why}")]
    InvalidArgument {
        /// Start address.
        addr: u64,
        /// Length.
        len: u64,
        /// What is wrong.
        why: &'static str,
    },
    /// The range overlaps a registered region.
    #[error("region {addr:#x}+{len} overlaps the registered region {other_addr:#x}+{other_len}")]
    Overlapped {
        /// Start address.
        addr: u64,
        /// Length.
        len: u64,
        /// Start of the region already registered.
        other_addr: u64,
        /// Its length.
        other_len: u64,
    },
    /// No region starts at this address.
    #[error("no region is registered at {0:#x}")]
    NotRegistered(u64),
}

impl MemoryError {
    /// Upstream's numeric code (`ERR_INVALID_ARGUMENT` -1,
    /// `ERR_ADDRESS_NOT_REGISTERED` -3, `ERR_ADDRESS_OVERLAPPED` -7).
    pub fn code(&self) -> i32 {
        match self {
            Self::InvalidArgument { .. } => -1,
            Self::NotRegistered(_) => -3,
            Self::Overlapped { .. } => -7,
        }
    }
}

/// One registered region.
#[derive(Debug)]
pub struct Region {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Location string (`cpu:0`, `cuda:1`, `*`).
    pub location: String,
    /// The GPU holding the region, for `musa:N` / `cuda:N` locations.
    pub device: Option<(crate::device::Vendor, u32)>,
    /// Set by `unregister`: no new pin is granted.
    retired: AtomicBool,
    /// Pins out, spread by holder: a connection pins and unpins the region for every
    /// request, and with one lock for all of them the connections of a busy host queued
    /// on it (a tenth of the 16-core host's CPU time, serving one peer over 10 connections).
    shards: [PinShard; PIN_SHARDS],
    /// Guards `unpinned`: `unregister` waits there for the last pins to drop.
    idle: Mutex<()>,
    unpinned: Condvar,
    /// Leases out; `unregister` waits on `returned` for the last to be given back.
    leases: Mutex<usize>,
    returned: Condvar,
}

/// Shards of a region's pins, a power of two.
const PIN_SHARDS: usize = 32;

/// Pins out by the holders that hash here (the holder's address): count and how to
/// abort it. Alone on its cache line, so that holders of different shards do not contend.
#[derive(Default)]
#[repr(align(64))]
struct PinShard(Mutex<Vec<Holding>>);

/// A holder's key (its address), its pins out, and how to abort it.
type Holding = (usize, usize, Arc<dyn Abort>);

impl std::fmt::Debug for PinShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PinShard({} holders)", self.0.lock().len())
    }
}

impl Region {
    fn new(addr: u64, len: u64, location: &str) -> Self {
        Self {
            addr,
            len,
            location: location.to_string(),
            device: crate::device::Vendor::parse_location(location),
            retired: AtomicBool::new(false),
            shards: std::array::from_fn(|_| PinShard::default()),
            idle: Mutex::new(()),
            unpinned: Condvar::new(),
            leases: Mutex::new(0),
            returned: Condvar::new(),
        }
    }

    fn end(&self) -> u64 {
        self.addr + self.len
    }

    /// Whether `[addr, addr+len)` lies inside the region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr && addr.checked_add(len).is_some_and(|end| end <= self.end())
    }

    /// Whether `unregister` has begun: the region grants no pin any more.
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::SeqCst)
    }

    #[allow(clippy::indexing_slicing, reason = "masked to the array's length")]
    fn shard(&self, key: usize) -> &PinShard {
        // Holders are heap addresses: the multiply spreads their middle bits to the top.
        let i = (key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58;
        &self.shards[i as usize & (PIN_SHARDS - 1)]
    }

    /// Pins the region for `holder`; `None` once it is being unregistered.
    pub fn pin(self: &Arc<Self>, holder: &Arc<dyn Abort>) -> Option<Pin> {
        let key = holder_key(holder);
        let mut holders = self.shard(key).0.lock();
        // Read under the shard's lock: `retire` sets the flag before it looks at the
        // shards, so a pin it does not see is one that saw the flag.
        if self.is_retired() {
            return None;
        }
        match holders.iter_mut().find(|(k, _, _)| *k == key) {
            Some((_, n, _)) => *n += 1,
            None => holders.push((key, 1, holder.clone())),
        }
        Some(Pin {
            region: self.clone(),
            key,
        })
    }

    /// Leases the region to a device that reaches it on its own (an HCA's memory
    /// registration, which peers' NICs use with no thread of ours involved); `None` once
    /// it is being unregistered. Unlike a pin, a lease is not cut: unregistering waits for
    /// it after the transports' release step, which gives it back.
    pub fn lease(self: &Arc<Self>) -> Option<Lease> {
        let mut leases = self.leases.lock();
        // Read under the lock that `wait_for_leases` counts under, as `pin` does.
        if self.is_retired() {
            return None;
        }
        *leases += 1;
        Some(Lease {
            region: self.clone(),
        })
    }

    /// Waits until every lease of the retired region is given back.
    fn wait_for_leases(&self) {
        let mut leases = self.leases.lock();
        let step = Duration::from_millis(100);
        let mut waited = Duration::ZERO;
        while *leases > 0 {
            self.returned.wait_for(&mut leases, step);
            waited += step;
            // A lease is given back when its device registration is undone, which the
            // transports do in their release step: one still out is a leak, and the
            // memory must not go back to the registrant while a device may reach it.
            if waited.as_millis() % 10_000 == 1_000 {
                tracing::warn!(
                    "unregister of {:#x}+{}: {} device registrations still hold the region {:?} after the transports' release step; waiting for them",
                    self.addr,
                    self.len,
                    *leases,
                    waited
                );
            }
        }
    }

    /// The holders of the pins out now.
    fn holders(&self) -> Vec<Arc<dyn Abort>> {
        self.shards
            .iter()
            .flat_map(|s| {
                s.0.lock()
                    .iter()
                    .map(|(_, _, h)| h.clone())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn unpinned_all(&self) -> bool {
        self.shards.iter().all(|s| s.0.lock().is_empty())
    }

    /// Retires the region, aborts the holders of its pins and waits until they are gone.
    fn retire(&self) {
        self.retired.store(true, Ordering::SeqCst);
        let mut waited = Duration::ZERO;
        loop {
            let holders = self.holders();
            if holders.is_empty() {
                break;
            }
            // Abort outside every lock: a holder's abort may take its own locks.
            holders.iter().for_each(|h| h.abort());
            drop(holders);
            let mut idle = self.idle.lock();
            if self.unpinned_all() {
                break;
            }
            let step = Duration::from_millis(100);
            self.unpinned.wait_for(&mut idle, step);
            drop(idle);
            waited += step;
            if waited == Duration::from_secs(1) {
                tracing::warn!(
                    "unregister of {:#x}+{}: {} accesses still ending 1 s after their connections were cut",
                    self.addr,
                    self.len,
                    self.holders().len()
                );
            }
        }
    }
}

fn holder_key(holder: &Arc<dyn Abort>) -> usize {
    Arc::as_ptr(holder) as *const () as usize
}

/// A region held for the duration of one access; dropping it lets `unregister` go on.
#[derive(Debug)]
pub struct Pin {
    region: Arc<Region>,
    key: usize,
}

impl Pin {
    /// The pinned region.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// A span over `[addr, addr+len)`, if it lies inside the pinned region.
    pub fn span(&self, addr: u64, len: u64) -> Option<MemSpan> {
        let len_usize = usize::try_from(len).ok()?;
        // SAFETY: the range is inside a registered region (the registrant vouched that it
        // is mapped memory) and the region cannot be unregistered while this pin lives;
        // the span is only used by the pin's holder, under the pin.
        self.region
            .contains(addr, len)
            .then(|| unsafe { MemSpan::new(addr, len_usize) })
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let region = &self.region;
        {
            let mut holders = region.shard(self.key).0.lock();
            if let Some(i) = holders.iter().position(|(k, _, _)| *k == self.key) {
                let gone = holders.get_mut(i).is_some_and(|h| {
                    h.1 -= 1;
                    h.1 == 0
                });
                if gone {
                    holders.swap_remove(i);
                }
            }
        }
        // After the shard's lock is let go: `retire` checks the shards under `idle`.
        if region.is_retired() {
            let _idle = region.idle.lock();
            region.unpinned.notify_all();
        }
    }
}

/// A registered region lent to a device that reaches it on its own, for as long as the
/// lease lives: an HCA's memory registration holds one from `ibv_reg_mr` until
/// `ibv_dereg_mr` has returned.
///
/// The registrant lends a region's memory from [`MemoryRegistry::register`] until
/// [`MemoryRegistry::unregister`] returns (the premise every access to registered memory
/// rests on, [`Pin::span`]'s included), and `unregister` does not return while a lease of
/// the region is out. So while a lease lives, `[addr, addr+len)` stays mapped memory that
/// nobody frees: that is what makes it sound to hand the range to a device. A lease that
/// is never dropped keeps `unregister` waiting (and warning), never the memory at risk.
#[derive(Debug)]
pub struct Lease {
    region: Arc<Region>,
}

impl Lease {
    /// Start address of the leased range.
    pub fn addr(&self) -> u64 {
        self.region.addr
    }

    /// Length of the leased range.
    pub fn len(&self) -> u64 {
        self.region.len
    }

    /// Whether the leased range is empty (never: regions have a length).
    pub fn is_empty(&self) -> bool {
        self.region.len == 0
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut leases = self.region.leases.lock();
        *leases = leases.saturating_sub(1);
        if *leases == 0 {
            self.region.returned.notify_all();
        }
    }
}

/// The set of registered regions.
#[derive(Debug, Default)]
pub struct MemoryRegistry {
    regions: RwLock<BTreeMap<u64, Arc<Region>>>,
}

impl MemoryRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `[addr, addr+len)` and returns the new region.
    pub fn register(
        &self,
        addr: u64,
        len: u64,
        location: &str,
    ) -> Result<Arc<Region>, MemoryError> {
        let invalid = |why| MemoryError::InvalidArgument { addr, len, why };
        if len == 0 {
            return Err(invalid("length is 0"));
        }
        if addr == 0 {
            return Err(invalid("address is null"));
        }
        let end = addr
            .checked_add(len)
            .ok_or_else(|| invalid("range wraps the address space"))?;
        let mut map = self.regions.write();
        let before = map.range(..end).next_back().map(|(_, r)| r);
        if let Some(r) = before.filter(|r| r.end() > addr) {
            return Err(MemoryError::Overlapped {
                addr,
                len,
                other_addr: r.addr,
                other_len: r.len,
            });
        }
        let region = Arc::new(Region::new(addr, len, location));
        map.insert(addr, region.clone());
        Ok(region)
    }

    /// Removes the region starting at `addr`; returns it once no access to it is in
    /// progress, cutting the connections that still hold it. Once those pins are gone,
    /// `release` runs (the transports undo what they prepared for the region, giving back
    /// their [`Lease`]s), and the call returns once every lease is back.
    pub fn unregister(
        &self,
        addr: u64,
        release: impl FnOnce(&Arc<Region>),
    ) -> Result<Arc<Region>, MemoryError> {
        let region = self
            .regions
            .write()
            .remove(&addr)
            .ok_or(MemoryError::NotRegistered(addr))?;
        region.retire();
        release(&region);
        region.wait_for_leases();
        Ok(region)
    }

    /// Unregisters every region, as [`unregister`](Self::unregister) does each (the engine
    /// shutting down; `release` runs once per region, after every region is retired), and
    /// returns them.
    pub fn unregister_all(&self, release: impl Fn(&Arc<Region>)) -> Vec<Arc<Region>> {
        let regions: Vec<Arc<Region>> = std::mem::take(&mut *self.regions.write())
            .into_values()
            .collect();
        for r in &regions {
            r.retire();
        }
        for r in &regions {
            release(r);
            r.wait_for_leases();
        }
        regions
    }

    /// The region holding all of `[addr, addr+len)`, if any.
    pub fn find(&self, addr: u64, len: u64) -> Option<Arc<Region>> {
        if len == 0 {
            return None;
        }
        let end = addr.checked_add(len)?;
        let map = self.regions.read();
        let (_, r) = map.range(..=addr).next_back()?;
        (end <= r.end()).then(|| r.clone())
    }

    /// Pins the region holding all of `[addr, addr+len)` for `holder`; `None` if no
    /// registered region holds it.
    pub fn pin(&self, addr: u64, len: u64, holder: &Arc<dyn Abort>) -> Option<Pin> {
        self.find(addr, len)?.pin(holder)
    }

    /// As [`pin`](Self::pin), trying `last` (the region this caller pinned last, kept
    /// here) first: a connection's requests mostly fall in one region, and the lookup
    /// takes the registry's lock, which every connection shares.
    pub fn pin_near(
        &self,
        addr: u64,
        len: u64,
        holder: &Arc<dyn Abort>,
        last: &mut Option<Arc<Region>>,
    ) -> Option<Pin> {
        if let Some(r) = last.as_ref().filter(|r| len > 0 && r.contains(addr, len)) {
            // A retired region may have been replaced at the same address: look it up.
            if let Some(pin) = r.pin(holder) {
                return Some(pin);
            }
        }
        let region = self.find(addr, len)?;
        let pin = region.pin(holder);
        *last = Some(region);
        pin
    }

    /// `(addr, len, location)` of every region, in address order.
    pub fn snapshot(&self) -> Vec<(u64, u64, String)> {
        self.regions
            .read()
            .values()
            .map(|r| (r.addr, r.len, r.location.clone()))
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, reason = "tests index known-good data")]
mod tests {
    use super::*;

    #[test]
    fn register_find_unregister() {
        let m = MemoryRegistry::new();
        m.register(0x1000, 0x1000, "cpu:0").unwrap();
        m.register(0x3000, 0x100, "cpu:0").unwrap();
        assert_eq!(m.find(0x1000, 0x1000).unwrap().addr, 0x1000);
        assert_eq!(m.find(0x1800, 0x10).unwrap().addr, 0x1000);
        assert!(m.find(0x1800, 0x801).is_none(), "crosses the end");
        assert!(m.find(0x0fff, 2).is_none(), "starts before");
        assert!(m.find(0x2000, 1).is_none(), "gap");
        assert!(m.find(0x1000, 0).is_none(), "zero length");
        assert!(m.find(u64::MAX, 2).is_none(), "wraps");
        m.unregister(0x1000, |_| {}).unwrap();
        assert!(m.find(0x1800, 1).is_none());
        assert_eq!(
            m.unregister(0x1000, |_| {}).err(),
            Some(MemoryError::NotRegistered(0x1000))
        );
        assert_eq!(m.snapshot(), vec![(0x3000, 0x100, "cpu:0".to_string())]);
    }

    #[test]
    fn overlap_and_zero_length_use_upstream_codes() {
        let m = MemoryRegistry::new();
        m.register(0x1000, 0x1000, "*").unwrap();
        for (a, l) in [(0x1000, 1), (0x0800, 0x900), (0x1fff, 5), (0x100, 0x10000)] {
            let e = m.register(a, l, "*").unwrap_err();
            assert_eq!(e.code(), -7, "{a:#x}+{l}");
        }
        m.register(0x2000, 1, "*").unwrap();
        m.register(0x0800, 0x800, "*").unwrap();
        assert_eq!(m.register(0x9000, 0, "*").unwrap_err().code(), -1);
        assert_eq!(m.register(u64::MAX, 2, "*").unwrap_err().code(), -1);
        assert_eq!(m.unregister(0x5, |_| {}).unwrap_err().code(), -3);
    }

    #[derive(Debug)]
    struct Flag(std::sync::atomic::AtomicUsize);
    impl Abort for Flag {
        fn abort(&self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn pin_fails_after_unregister() {
        let m = MemoryRegistry::new();
        m.register(0x1000, 0x10, "*").unwrap();
        let holder: Arc<dyn Abort> = Arc::new(Flag(Default::default()));
        let r = m.find(0x1000, 1).unwrap();
        drop(r.pin(&holder).unwrap());
        m.unregister(0x1000, |_| {}).unwrap();
        assert!(r.pin(&holder).is_none());
        assert!(m.pin(0x1000, 1, &holder).is_none());
    }

    #[test]
    fn pin_near_keeps_to_the_last_region_until_it_is_replaced() {
        let m = MemoryRegistry::new();
        m.register(0x1000, 0x100, "*").unwrap();
        m.register(0x2000, 0x100, "*").unwrap();
        let holder: Arc<dyn Abort> = Arc::new(Flag(Default::default()));
        let mut last = None;
        drop(m.pin_near(0x1010, 0x10, &holder, &mut last).unwrap());
        assert_eq!(last.as_ref().unwrap().addr, 0x1000);
        drop(m.pin_near(0x2000, 0x100, &holder, &mut last).unwrap());
        assert_eq!(
            last.as_ref().unwrap().addr,
            0x2000,
            "another region: looked up"
        );
        assert!(m.pin_near(0x2000, 0x101, &holder, &mut last).is_none());
        assert!(m.pin_near(0x2000, 0, &holder, &mut last).is_none());
        // Unregistered and registered again at the same address, shorter: the kept
        // region is retired, and the new one's bounds apply.
        m.unregister(0x2000, |_| {}).unwrap();
        assert!(m.pin_near(0x2000, 0x10, &holder, &mut last).is_none());
        let again = m.register(0x2000, 0x20, "*").unwrap();
        let pin = m.pin_near(0x2000, 0x10, &holder, &mut last).unwrap();
        assert!(Arc::ptr_eq(last.as_ref().unwrap(), &again));
        assert!(
            pin.span(0x2000, 0x21).is_none(),
            "the old region's length is gone"
        );
    }

    /// Holders on many threads pin and unpin while the region is unregistered: no pin is
    /// granted once `unregister` returned, and none is out then.
    #[test]
    fn no_pin_outlives_unregister_under_many_holders() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
        for _ in 0..20 {
            let m = Arc::new(MemoryRegistry::new());
            m.register(0x1000, 0x1000, "*").unwrap();
            let done = Arc::new(AtomicBool::new(false));
            let inside = Arc::new(AtomicUsize::new(0));
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    let (m, done, inside) = (m.clone(), done.clone(), inside.clone());
                    std::thread::spawn(move || {
                        let holder: Arc<dyn Abort> = Arc::new(Flag(Default::default()));
                        let mut last = None;
                        let mut late = 0;
                        loop {
                            let finished = done.load(SeqCst);
                            if let Some(pin) = m.pin_near(0x1100, 0x10, &holder, &mut last) {
                                inside.fetch_add(1, SeqCst);
                                late += usize::from(finished);
                                inside.fetch_sub(1, SeqCst);
                                drop(pin);
                            } else if finished {
                                return late;
                            }
                        }
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(2));
            m.unregister(0x1000, |_| {}).unwrap();
            assert_eq!(
                inside.load(SeqCst),
                0,
                "a pin out after unregister returned"
            );
            done.store(true, SeqCst);
            for t in threads {
                assert_eq!(
                    t.join().unwrap(),
                    0,
                    "a pin granted after unregister returned"
                );
            }
        }
    }

    /// A lease is refused once the region is retired, and `unregister` returns only once
    /// the release step gave back every lease (after the pins were gone).
    #[test]
    fn unregister_waits_for_the_leases_its_release_step_gives_back() {
        let m = Arc::new(MemoryRegistry::new());
        let r = m.register(0x1000, 0x100, "*").unwrap();
        let lease = r.lease().unwrap();
        assert_eq!((lease.addr(), lease.len()), (0x1000, 0x100));
        let kept = std::sync::Mutex::new(Some(lease));
        let region = m
            .unregister(0x1000, |region| {
                assert!(region.lease().is_none(), "leased while retired");
                drop(kept.lock().unwrap().take());
            })
            .unwrap();
        assert!(kept.lock().unwrap().is_none());
        assert!(region.lease().is_none());
        // A lease still out when the release step is done holds `unregister` up.
        let r = m.register(0x2000, 0x100, "*").unwrap();
        let late = r.lease().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let m2 = m.clone();
        let t = std::thread::spawn(move || {
            m2.unregister(0x2000, |_| {}).unwrap();
            tx.send(()).unwrap();
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(rx.try_recv().is_err(), "returned while leased");
        drop(late);
        rx.recv().unwrap();
        t.join().unwrap();
    }

    #[test]
    fn unregister_aborts_holders_and_waits_for_their_pins() {
        let m = MemoryRegistry::new();
        m.register(0x1000, 0x100, "*").unwrap();
        let flag = Arc::new(Flag(Default::default()));
        let holder: Arc<dyn Abort> = flag.clone();
        let pin = m.pin(0x1010, 0x10, &holder).unwrap();
        let second = m.pin(0x1020, 0x10, &holder).unwrap();
        assert!(pin.span(0x1010, 0xf0).is_some());
        assert!(pin.span(0x1010, 0xf1).is_none(), "past the region's end");
        let (tx, rx) = std::sync::mpsc::channel();
        let m = Arc::new(m);
        let m2 = m.clone();
        let t = std::thread::spawn(move || {
            m2.unregister(0x1000, |_| {}).unwrap();
            tx.send(()).unwrap();
        });
        // The holder is told to let go; unregister waits until it has.
        while flag.0.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        assert!(rx.try_recv().is_err(), "returned while pinned");
        drop(pin);
        assert!(rx.try_recv().is_err(), "returned while pinned once");
        drop(second);
        rx.recv().unwrap();
        t.join().unwrap();
        assert!(m.find(0x1010, 1).is_none());
    }
}
