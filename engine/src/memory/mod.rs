//! Registered memory regions: the only memory a peer may touch.
//!
//! Lookups take a read lock on a `BTreeMap` keyed by start address, so a
//! bounds check is one `range(..=addr).next_back()`. A region is pinned
//! ([`Pin`]) while a transfer touches it, by a holder that can be aborted (a
//! connection). Unregistering removes the region from the map, retires it so
//! no new pin is granted, aborts the holders of the pins still out (their I/O
//! stops at once, whatever the peer does) and waits for those pins to drop:
//! memory is never accessed after `unregister` returns, and no peer can hold
//! the call up. No lock is held while it waits.

// Peer input is parsed here: an index out of range must be an error, never a panic.
#![deny(clippy::indexing_slicing)]

pub mod span;

use std::collections::BTreeMap;
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
    pins: Mutex<Pins>,
    unpinned: Condvar,
}

#[derive(Default)]
struct Pins {
    /// Set by `unregister`: no new pin is granted.
    retired: bool,
    /// Pins out, by holder (the holder's address): count and how to abort it.
    holders: Vec<(usize, usize, Arc<dyn Abort>)>,
}

impl std::fmt::Debug for Pins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pins")
            .field("retired", &self.retired)
            .field("holders", &self.holders.len())
            .finish()
    }
}

impl Region {
    fn end(&self) -> u64 {
        self.addr + self.len
    }

    /// Whether `[addr, addr+len)` lies inside the region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr && addr.checked_add(len).is_some_and(|end| end <= self.end())
    }

    /// Pins the region for `holder`; `None` once it is being unregistered.
    pub fn pin(self: &Arc<Self>, holder: &Arc<dyn Abort>) -> Option<Pin> {
        let key = holder_key(holder);
        let mut pins = self.pins.lock();
        if pins.retired {
            return None;
        }
        match pins.holders.iter_mut().find(|(k, _, _)| *k == key) {
            Some((_, n, _)) => *n += 1,
            None => pins.holders.push((key, 1, holder.clone())),
        }
        Some(Pin {
            region: self.clone(),
            key,
        })
    }

    /// Retires the region, aborts the holders of its pins and waits until they are gone.
    fn retire(&self) {
        let mut pins = self.pins.lock();
        pins.retired = true;
        let mut waited = Duration::ZERO;
        while !pins.holders.is_empty() {
            let holders: Vec<Arc<dyn Abort>> =
                pins.holders.iter().map(|(_, _, h)| h.clone()).collect();
            // Abort outside the lock: a holder's abort may take its own locks.
            drop(pins);
            holders.iter().for_each(|h| h.abort());
            pins = self.pins.lock();
            if pins.holders.is_empty() {
                break;
            }
            let step = Duration::from_millis(100);
            self.unpinned.wait_for(&mut pins, step);
            waited += step;
            if waited == Duration::from_secs(1) {
                tracing::warn!(
                    "unregister of {:#x}+{}: {} accesses still ending 1 s after their connections were cut",
                    self.addr,
                    self.len,
                    pins.holders.len()
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
        let mut pins = self.region.pins.lock();
        if let Some(holder) = pins.holders.iter_mut().find(|(k, _, _)| *k == self.key) {
            holder.1 -= 1;
        }
        pins.holders.retain(|(_, n, _)| *n > 0);
        if pins.holders.is_empty() {
            self.region.unpinned.notify_all();
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
        let region = Arc::new(Region {
            addr,
            len,
            location: location.to_string(),
            device: crate::device::Vendor::parse_location(location),
            pins: Mutex::new(Pins::default()),
            unpinned: Condvar::new(),
        });
        map.insert(addr, region.clone());
        Ok(region)
    }

    /// Removes the region starting at `addr`; returns it once no access to it is in
    /// progress, cutting the connections that still hold it.
    pub fn unregister(&self, addr: u64) -> Result<Arc<Region>, MemoryError> {
        let region = self
            .regions
            .write()
            .remove(&addr)
            .ok_or(MemoryError::NotRegistered(addr))?;
        region.retire();
        Ok(region)
    }

    /// Unregisters every region, as [`unregister`](Self::unregister) does each (the engine
    /// shutting down), and returns them.
    pub fn unregister_all(&self) -> Vec<Arc<Region>> {
        let regions: Vec<Arc<Region>> = std::mem::take(&mut *self.regions.write())
            .into_values()
            .collect();
        for r in &regions {
            r.retire();
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
        m.unregister(0x1000).unwrap();
        assert!(m.find(0x1800, 1).is_none());
        assert_eq!(
            m.unregister(0x1000).err(),
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
        assert_eq!(m.unregister(0x5).unwrap_err().code(), -3);
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
        m.unregister(0x1000).unwrap();
        assert!(r.pin(&holder).is_none());
        assert!(m.pin(0x1000, 1, &holder).is_none());
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
            m2.unregister(0x1000).unwrap();
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
