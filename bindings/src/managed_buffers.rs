//! Managed buffers: the allocator behind `allocate_managed_buffer` / `free_managed_buffer`.
//!
//! A buddy allocator over large registered chunks. Requests up to the largest block
//! (256 MiB, as upstream's largest slab class) are rounded up to a power of two of at
//! least 8 KiB (upstream's smallest class) and carved from chunks of `chunk_bytes`
//! (2 GiB by default, as upstream); a block splits on allocation and merges with its free
//! buddy when freed, so a freed region is whole again for the next large request.
//! Larger requests get a dedicated mapping, released when freed.
//!
//! Pure bookkeeping: memory comes from a [`ChunkSource`] (host memory registered with the
//! engine in production, synthetic addresses in the tests), so the allocator never touches
//! the bytes it hands out.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use thiserror::Error;

/// Smallest block: 8 KiB.
const MIN_SHIFT: u32 = 13;
/// Largest block: 256 MiB; larger requests are dedicated mappings.
const MAX_SHIFT: u32 = 28;
/// Chunk size upstream uses: 2 GiB.
pub const DEFAULT_CHUNK_BYTES: u64 = 2 << 30;
/// Dedicated mappings are rounded up to whole pages.
const PAGE: u64 = 4096;

/// Where chunks and dedicated buffers come from (and go back to).
pub trait ChunkSource {
    /// Why memory could not be had.
    type Error;
    /// Maps and registers `len` bytes; returns the address.
    fn acquire(&mut self, len: u64) -> Result<u64, Self::Error>;
    /// Unregisters and unmaps what [`acquire`](Self::acquire) returned.
    fn release(&mut self, addr: u64, len: u64);
}

/// A request the allocator cannot serve.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ManagedError<E> {
    /// Zero bytes asked for.
    #[error("cannot allocate 0 bytes")]
    ZeroLength,
    /// The size does not fit in the address space once rounded up.
    #[error("cannot allocate {0} bytes: too large")]
    TooLarge(u64),
    /// `free` of an address this allocator did not return (or already freed).
    #[error("{0:#x} is not a managed buffer (never allocated, or already freed)")]
    NotAllocated(u64),
    /// `free` with a length from another size class than the allocation's.
    #[error("managed buffer {addr:#x} was allocated with a length of up to {capacity} bytes; free_managed_buffer got {len}")]
    LengthMismatch {
        /// The buffer.
        addr: u64,
        /// Its capacity.
        capacity: u64,
        /// The length passed to free.
        len: u64,
    },
    /// The chunk source failed.
    #[error("{0}")]
    Source(E),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Used {
    /// A block of `MIN_BLOCK << order` bytes inside a chunk.
    Block { order: u32 },
    /// A dedicated mapping of this many bytes.
    Dedicated { len: u64 },
}

/// The allocator's state. Not thread-safe by itself: the owner wraps it in a lock.
#[derive(Debug)]
pub struct ManagedBuffers {
    chunk_bytes: u64,
    max_order: u32,
    /// Chunk base addresses.
    chunks: BTreeSet<u64>,
    /// Free block addresses, per order (index 0 = 8 KiB).
    free: Vec<BTreeSet<u64>>,
    used: HashMap<u64, Used>,
}

impl Default for ManagedBuffers {
    fn default() -> Self {
        Self::new(DEFAULT_CHUNK_BYTES)
    }
}

impl ManagedBuffers {
    /// An allocator whose chunks are `chunk_bytes` long (rounded up to a power of two of at
    /// least 8 KiB). The largest block is `min(256 MiB, chunk_bytes)`.
    pub fn new(chunk_bytes: u64) -> Self {
        let chunk_bytes = chunk_bytes.max(1 << MIN_SHIFT).next_power_of_two();
        let max_shift = chunk_bytes.trailing_zeros().min(MAX_SHIFT);
        let max_order = max_shift - MIN_SHIFT;
        Self {
            chunk_bytes,
            max_order,
            chunks: BTreeSet::new(),
            free: vec![BTreeSet::new(); max_order as usize + 1],
            used: HashMap::new(),
        }
    }

    /// The largest request served from chunks; larger ones get a dedicated mapping.
    pub fn max_block(&self) -> u64 {
        block_size(self.max_order)
    }

    /// Allocates at least `len` bytes.
    pub fn allocate<S: ChunkSource>(
        &mut self,
        len: u64,
        source: &mut S,
    ) -> Result<u64, ManagedError<S::Error>> {
        if len == 0 {
            return Err(ManagedError::ZeroLength);
        }
        if len > self.max_block() {
            let n = len
                .checked_next_multiple_of(PAGE)
                .ok_or(ManagedError::TooLarge(len))?;
            let addr = source.acquire(n).map_err(ManagedError::Source)?;
            self.used.insert(addr, Used::Dedicated { len: n });
            return Ok(addr);
        }
        let order = order_for(len);
        let mut from = (order..=self.max_order).find(|&o| !self.free[o as usize].is_empty());
        if from.is_none() {
            let base = source
                .acquire(self.chunk_bytes)
                .map_err(ManagedError::Source)?;
            self.chunks.insert(base);
            let top = self.max_block();
            let tops = (0..self.chunk_bytes / top).map(|i| base + i * top);
            self.free[self.max_order as usize].extend(tops);
            from = Some(self.max_order);
        }
        let mut o = from.unwrap_or(self.max_order);
        let addr = self.free[o as usize]
            .pop_first()
            .ok_or(ManagedError::TooLarge(len))?;
        while o > order {
            o -= 1;
            self.free[o as usize].insert(addr + block_size(o));
        }
        self.used.insert(addr, Used::Block { order });
        Ok(addr)
    }

    /// Frees a buffer [`allocate`](Self::allocate) returned; `len` must be the length it
    /// was allocated with (any length of the same size class is accepted).
    pub fn free<S: ChunkSource>(
        &mut self,
        addr: u64,
        len: u64,
        source: &mut S,
    ) -> Result<(), ManagedError<S::Error>> {
        let used = *self
            .used
            .get(&addr)
            .ok_or(ManagedError::NotAllocated(addr))?;
        match used {
            Used::Dedicated { len: n } => {
                if len <= self.max_block() || len.checked_next_multiple_of(PAGE) != Some(n) {
                    return Err(ManagedError::LengthMismatch {
                        addr,
                        capacity: n,
                        len,
                    });
                }
                self.used.remove(&addr);
                source.release(addr, n);
            }
            Used::Block { order } => {
                if len == 0 || len > self.max_block() || order_for(len) != order {
                    return Err(ManagedError::LengthMismatch {
                        addr,
                        capacity: block_size(order),
                        len,
                    });
                }
                self.used.remove(&addr);
                self.release_block(addr, order);
            }
        }
        Ok(())
    }

    /// Puts a block back, merging it with its free buddies.
    fn release_block(&mut self, mut addr: u64, mut order: u32) {
        let Some(&base) = self.chunks.range(..=addr).next_back() else {
            return;
        };
        while order < self.max_order {
            let buddy = base + ((addr - base) ^ block_size(order));
            if !self.free[order as usize].remove(&buddy) {
                break;
            }
            addr = addr.min(buddy);
            order += 1;
        }
        self.free[order as usize].insert(addr);
    }

    /// Capacity of the live buffer at `addr`, if any.
    pub fn capacity(&self, addr: u64) -> Option<u64> {
        self.used.get(&addr).map(|u| match *u {
            Used::Block { order } => block_size(order),
            Used::Dedicated { len } => len,
        })
    }

    /// Number of live buffers.
    pub fn live(&self) -> usize {
        self.used.len()
    }

    /// Number of chunks mapped so far.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Every mapping (chunks and dedicated buffers) as `(addr, len)`, emptying the
    /// allocator: the owner releases them when it shuts down.
    pub fn take_mappings(&mut self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = self.chunks.iter().map(|&b| (b, self.chunk_bytes)).collect();
        out.extend(self.used.iter().filter_map(|(&a, u)| match *u {
            Used::Dedicated { len } => Some((a, len)),
            Used::Block { .. } => None,
        }));
        self.chunks.clear();
        self.used.clear();
        self.free.iter_mut().for_each(BTreeSet::clear);
        out
    }

    /// Mappings as `(addr, len)`, sorted, without changing anything (for checks).
    pub fn mappings(&self) -> BTreeMap<u64, u64> {
        let mut out: BTreeMap<u64, u64> =
            self.chunks.iter().map(|&b| (b, self.chunk_bytes)).collect();
        for (&a, u) in &self.used {
            if let Used::Dedicated { len } = *u {
                out.insert(a, len);
            }
        }
        out
    }
}

fn block_size(order: u32) -> u64 {
    1u64 << (order + MIN_SHIFT)
}

/// The order of the smallest block that holds `len` (1 ..= 256 MiB) bytes.
fn order_for(len: u64) -> u32 {
    let shift = 64 - (len - 1).leading_zeros();
    shift.max(MIN_SHIFT) - MIN_SHIFT
}

#[cfg(test)]
mod tests;
