//! Registered memory regions: the only memory a peer may touch.
//!
//! Lookups take a read lock on a `BTreeMap` keyed by start address, so a
//! bounds check is one `range(..=addr).next_back()`. A region is pinned
//! ([`RegionGuard`]) while a transfer touches it; unregistering removes it
//! from the map first and then waits for the pins to drop, so memory is never
//! accessed after `unregister` returns.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::{RwLock, RwLockReadGuard};
use thiserror::Error;

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
    pins: RwLock<()>,
}

impl Region {
    fn end(&self) -> u64 {
        self.addr + self.len
    }
}

/// A region held for the duration of one access.
pub struct RegionGuard<'a> {
    region: &'a Region,
    _pin: RwLockReadGuard<'a, ()>,
}

impl RegionGuard<'_> {
    /// The pinned region.
    pub fn region(&self) -> &Region {
        self.region
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

    /// Registers `[addr, addr+len)`.
    pub fn register(&self, addr: u64, len: u64, location: &str) -> Result<(), MemoryError> {
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
        map.insert(
            addr,
            Arc::new(Region {
                addr,
                len,
                location: location.to_string(),
                device: crate::device::Vendor::parse_location(location),
                pins: RwLock::new(()),
            }),
        );
        Ok(())
    }

    /// Removes the region starting at `addr`, waiting for in-flight accesses.
    pub fn unregister(&self, addr: u64) -> Result<(), MemoryError> {
        let region = self
            .regions
            .write()
            .remove(&addr)
            .ok_or(MemoryError::NotRegistered(addr))?;
        drop(region.pins.write());
        Ok(())
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

    /// Pins `region` against unregistration; `None` if it was unregistered meanwhile.
    pub fn pin<'a>(&self, region: &'a Region) -> Option<RegionGuard<'a>> {
        let pin = region.pins.read();
        let still = self
            .regions
            .read()
            .get(&region.addr)
            .is_some_and(|r| std::ptr::eq(Arc::as_ptr(r), region));
        still.then_some(RegionGuard { region, _pin: pin })
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
            m.unregister(0x1000),
            Err(MemoryError::NotRegistered(0x1000))
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

    #[test]
    fn pin_fails_after_unregister() {
        let m = MemoryRegistry::new();
        m.register(0x1000, 0x10, "*").unwrap();
        let r = m.find(0x1000, 1).unwrap();
        assert!(m.pin(&r).is_some());
        m.unregister(0x1000).unwrap();
        assert!(m.pin(&r).is_none());
    }
}
