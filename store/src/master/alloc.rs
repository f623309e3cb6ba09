//! Space inside one mounted segment: which byte ranges hold replicas and which are free.
//!
//! The master never touches the bytes; it only hands out addresses, so this is plain
//! bookkeeping over `[base, base + size)`. Free space is a list of ranges kept twice: by
//! address, to merge a freed range with its neighbours, and by length, to find the
//! smallest range that fits (best fit keeps large ranges whole for large objects). Every
//! operation is a few B-tree steps, O(log n) in the number of ranges.

use std::collections::{BTreeMap, BTreeSet};

/// Every allocation starts on, and is a multiple of, this many bytes: a cache line, so
/// that two replicas never share one and a DMA engine sees aligned buffers.
pub const ALIGN: u64 = 64;

/// The allocator of one segment. Addresses are absolute (inside `[base, base + size)`),
/// as clients read and write them directly.
#[derive(Debug, Clone)]
pub struct SegmentAllocator {
    base: u64,
    size: u64,
    /// Free ranges, start -> length.
    free_by_addr: BTreeMap<u64, u64>,
    /// The same ranges as (length, start), for best fit.
    free_by_len: BTreeSet<(u64, u64)>,
    /// Live allocations, start -> rounded length.
    allocated: BTreeMap<u64, u64>,
    used: u64,
    /// Bytes that alignment left usable: `used` plus the free ranges' total.
    usable: u64,
}

impl SegmentAllocator {
    /// An allocator with all of `[base, base + size)` free. A base that is not aligned
    /// loses its first bytes up to the next multiple of [`ALIGN`], and so does an
    /// unaligned end; a range that would overflow `u64` is cut at the end of the space.
    pub fn new(base: u64, size: u64) -> Self {
        let mut alloc = Self {
            base,
            size,
            free_by_addr: BTreeMap::new(),
            free_by_len: BTreeSet::new(),
            allocated: BTreeMap::new(),
            used: 0,
            usable: 0,
        };
        let end = base.saturating_add(size) / ALIGN * ALIGN;
        if let Some(start) = align_up(base) {
            if end > start {
                alloc.insert_free(start, end - start);
                alloc.usable = end - start;
            }
        }
        alloc
    }

    /// The segment's first byte.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The segment's size as mounted (alignment losses included).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes held by live allocations (each rounded up to [`ALIGN`]).
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Bytes in free ranges (the size less what is used and what alignment lost).
    pub fn free_bytes(&self) -> u64 {
        self.usable - self.used
    }

    /// The longest allocation that would succeed now.
    pub fn largest_free(&self) -> u64 {
        self.free_by_len.last().map_or(0, |&(len, _)| len)
    }

    /// Whether an allocation of `len` bytes would succeed now.
    pub fn fits(&self, len: u64) -> bool {
        round_len(len).is_some_and(|len| len <= self.largest_free())
    }

    /// Whether an allocation of `len` bytes would succeed in the empty segment: if not,
    /// freeing anything in it cannot help.
    pub fn could_fit(&self, len: u64) -> bool {
        round_len(len).is_some_and(|len| len <= self.usable)
    }

    /// How many live allocations there are.
    pub fn allocations(&self) -> usize {
        self.allocated.len()
    }

    /// The rounded length of the allocation starting at `addr`, if there is one.
    pub fn len_at(&self, addr: u64) -> Option<u64> {
        self.allocated.get(&addr).copied()
    }

    /// Reserves `len` bytes (rounded up to [`ALIGN`]) and returns their address, `None`
    /// when no free range is long enough or `len` is 0.
    pub fn allocate(&mut self, len: u64) -> Option<u64> {
        let len = round_len(len)?;
        let &(range_len, start) = self.free_by_len.range((len, 0)..).next()?;
        self.remove_free(start, range_len);
        if range_len > len {
            self.insert_free(start + len, range_len - len);
        }
        self.allocated.insert(start, len);
        self.used += len;
        Some(start)
    }

    /// Returns the allocation starting at `addr` to the free list, merged with free
    /// neighbours. `false` (and nothing changes) when no allocation starts there: a
    /// double free must not corrupt the free list.
    pub fn free(&mut self, addr: u64) -> bool {
        let Some(len) = self.allocated.remove(&addr) else {
            return false;
        };
        self.used -= len;
        let (mut start, mut len) = (addr, len);
        if let Some((&prev, &prev_len)) = self.free_by_addr.range(..start).next_back() {
            if prev + prev_len == start {
                self.remove_free(prev, prev_len);
                start = prev;
                len += prev_len;
            }
        }
        if let Some(&next_len) = self.free_by_addr.get(&(start + len)) {
            self.remove_free(start + len, next_len);
            len += next_len;
        }
        self.insert_free(start, len);
        true
    }

    /// The free ranges as (start, length), by address; for tests and diagnostics.
    pub fn free_ranges(&self) -> Vec<(u64, u64)> {
        self.free_by_addr.iter().map(|(&s, &l)| (s, l)).collect()
    }

    fn insert_free(&mut self, start: u64, len: u64) {
        self.free_by_addr.insert(start, len);
        self.free_by_len.insert((len, start));
    }

    fn remove_free(&mut self, start: u64, len: u64) {
        self.free_by_addr.remove(&start);
        self.free_by_len.remove(&(len, start));
    }
}

/// `len` rounded up to [`ALIGN`]; `None` for 0 or when rounding overflows.
fn round_len(len: u64) -> Option<u64> {
    if len == 0 {
        return None;
    }
    align_up(len)
}

fn align_up(v: u64) -> Option<u64> {
    Some(v.checked_add(ALIGN - 1)? / ALIGN * ALIGN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn allocates_aligned_and_rounds_up() {
        let mut a = SegmentAllocator::new(0x1000, 4096);
        let x = a.allocate(1).unwrap();
        let y = a.allocate(65).unwrap();
        assert_eq!(x % ALIGN, 0);
        assert_eq!(y % ALIGN, 0);
        assert_eq!(a.used(), 64 + 128);
        assert_eq!(a.allocations(), 2);
        assert_eq!(a.size(), 4096);
        assert_eq!(a.base(), 0x1000);
        assert_eq!(a.largest_free(), 4096 - 192);
        assert_eq!(a.allocate(0), None);
    }

    #[test]
    fn unaligned_base_and_end_lose_their_partial_lines() {
        let a = SegmentAllocator::new(10, 200);
        // [64, 192): the line holding byte 10 and the one holding byte 209 are partial.
        assert_eq!(a.free_ranges(), vec![(64, 128)]);
        assert!(a.could_fit(128) && !a.could_fit(129));
        assert_eq!(SegmentAllocator::new(0, 63).largest_free(), 0);
        let top = SegmentAllocator::new(u64::MAX - 100, 100);
        assert_eq!(top.largest_free(), 0);
    }

    #[test]
    fn exhausts_then_refuses() {
        let mut a = SegmentAllocator::new(0, 256);
        for _ in 0..4 {
            assert!(a.allocate(64).is_some());
        }
        assert_eq!(a.allocate(1), None);
        assert!(!a.fits(1));
        assert_eq!(a.largest_free(), 0);
        assert_eq!(a.allocate(u64::MAX), None);
    }

    #[test]
    fn best_fit_keeps_the_large_range_whole() {
        let mut a = SegmentAllocator::new(0, 64 * 10);
        let p: Vec<u64> = (0..10).map(|_| a.allocate(64).unwrap()).collect();
        // Holes: one line at p[1], three lines at p[4..7].
        assert!(a.free(p[1]));
        for &x in &p[4..7] {
            assert!(a.free(x));
        }
        assert_eq!(a.allocate(64), Some(p[1]));
        assert_eq!(a.largest_free(), 192);
    }

    #[test]
    fn free_merges_both_neighbours() {
        let mut a = SegmentAllocator::new(0, 64 * 3);
        let x = a.allocate(64).unwrap();
        let y = a.allocate(64).unwrap();
        let z = a.allocate(64).unwrap();
        assert!(a.free(x));
        assert!(a.free(z));
        assert_eq!(a.free_ranges().len(), 2);
        assert!(a.free(y));
        assert_eq!(a.free_ranges(), vec![(0, 192)]);
        assert_eq!(a.used(), 0);
    }

    #[test]
    fn double_and_unknown_frees_are_ignored() {
        let mut a = SegmentAllocator::new(0, 1024);
        let x = a.allocate(128).unwrap();
        assert!(!a.free(x + 64), "not the start of an allocation");
        assert!(a.free(x));
        assert!(!a.free(x));
        assert!(!a.free(99_999));
        assert_eq!(a.free_ranges(), vec![(0, 1024)]);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(u64),
        /// Frees the live allocation at this index modulo their count.
        Free(usize),
        /// An address that is no allocation's start.
        Bogus(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (1u64..3000).prop_map(Op::Alloc),
            2 => any::<usize>().prop_map(Op::Free),
            1 => any::<u64>().prop_map(Op::Bogus),
        ]
    }

    proptest! {
        #[test]
        fn random_sequences_keep_the_books(
            base in 0u64..1_000_000,
            size in 0u64..40_000,
            ops in proptest::collection::vec(op(), 0..200),
        ) {
            let mut a = SegmentAllocator::new(base, size);
            let initial = a.free_ranges();
            let mut live: BTreeMap<u64, u64> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Alloc(len) => {
                        if let Some(addr) = a.allocate(len) {
                            prop_assert_eq!(addr % ALIGN, 0);
                            prop_assert!(addr >= base && addr + len <= base + size);
                            live.insert(addr, round_len(len).unwrap());
                        } else {
                            prop_assert!(a.largest_free() < len);
                        }
                    }
                    Op::Free(i) if !live.is_empty() => {
                        let addr = *live.keys().nth(i % live.len()).unwrap();
                        live.remove(&addr);
                        prop_assert!(a.free(addr));
                    }
                    Op::Free(_) => {}
                    Op::Bogus(addr) => {
                        if !live.contains_key(&addr) {
                            prop_assert!(!a.free(addr));
                        }
                    }
                }
                let mut end = 0;
                for (&addr, &len) in &live {
                    prop_assert!(addr >= end, "overlap at {addr}");
                    end = addr + len;
                }
                prop_assert!(end <= base + size);
                prop_assert_eq!(a.used(), live.values().sum::<u64>());
                prop_assert_eq!(a.used() + a.free_bytes(), initial.iter().map(|r| r.1).sum::<u64>());
            }
            for addr in live.keys() {
                prop_assert!(a.free(*addr));
            }
            prop_assert_eq!(a.free_ranges(), initial);
            prop_assert_eq!(a.used(), 0);
        }
    }
}
