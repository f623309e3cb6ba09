//! A page-aligned, zeroed heap buffer: memory to register and move, owned for as long as
//! transfers may touch it (the benchmark, tests, examples).
//!
//! Once registered, the engine (and through it, peers) writes and reads the buffer from
//! other threads at any time, so it never lends out `&[u8]` / `&mut [u8]`: its bytes are
//! copied in and out through a [`MemSpan`].

use std::alloc::Layout;

use crate::memory::span::{MemSpan, SpanTooShort};

/// Page size the buffer is aligned to.
const ALIGN: usize = 4096;

/// `len` zeroed bytes at a 4096-aligned address, freed on drop.
pub struct HostBuffer {
    ptr: *mut u8,
    len: usize,
    layout: Layout,
}

// SAFETY: a plain owned allocation; its bytes are only copied through raw pointers (no
// reference to them exists), which is as valid from any thread as from the allocating one.
unsafe impl Send for HostBuffer {}
// SAFETY: as above: shared `&HostBuffer`s only copy bytes through raw pointers, never form
// references to them, so concurrent use (including by the engine's threads) creates no
// aliasing references; concurrent copies see unspecified bytes, never undefined behaviour.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Allocates, or `None` when the allocator refuses (or `len` overflows a layout).
    pub fn try_new(len: usize) -> Option<Self> {
        // A zero-sized allocation is undefined behaviour; a 0-byte buffer still gets a page.
        let layout = Layout::from_size_align(len.max(1), ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        (!ptr.is_null()).then_some(Self { ptr, len, layout })
    }

    /// Allocates; on failure, the allocator's out-of-memory handler runs (as for `Vec`).
    pub fn new(len: usize) -> Self {
        Self::try_new(len).unwrap_or_else(|| {
            std::alloc::handle_alloc_error(
                Layout::from_size_align(len.max(1), ALIGN).unwrap_or(Layout::new::<u8>()),
            )
        })
    }

    /// Its address, as the engine takes addresses.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn span(&self) -> MemSpan {
        // SAFETY: an owned allocation of `len` bytes, alive while `self` is.
        unsafe { MemSpan::new(self.ptr as u64, self.len) }
    }

    /// A copy of its bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len];
        // Cannot fail: `out` has exactly `len` bytes.
        let _ = self.span().read_into(&mut out);
        out
    }

    /// Copies `src` into the buffer at `offset`; it must fit.
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<(), SpanTooShort> {
        self.tail(offset, src.len())?.write_from(src)
    }

    /// A copy of `len` bytes at `offset`; they must lie inside the buffer.
    pub fn read_at(&self, offset: usize, len: usize) -> Result<Vec<u8>, SpanTooShort> {
        let mut out = vec![0u8; len];
        self.tail(offset, len)?.read_into(&mut out)?;
        Ok(out)
    }

    fn tail(&self, offset: usize, need: usize) -> Result<MemSpan, SpanTooShort> {
        let have = self.len.saturating_sub(offset);
        if offset > self.len || need > have {
            return Err(SpanTooShort { need, have });
        }
        // SAFETY: [ptr+offset, ptr+len) is inside the owned allocation (checked above).
        Ok(unsafe { MemSpan::new(self.ptr as u64 + offset as u64, have) })
    }

    /// Sets every byte to `byte`.
    pub fn fill(&self, byte: u8) {
        self.span().fill(byte);
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `try_new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_page_aligned_zeroed_and_writable() {
        let b = HostBuffer::new(10_000);
        assert_eq!(b.addr() % ALIGN as u64, 0);
        assert_eq!(b.len(), 10_000);
        assert!(b.to_vec().iter().all(|&x| x == 0));
        b.fill(0xCC);
        assert!(b.to_vec().iter().all(|&x| x == 0xCC));
        b.write_at(1, &[1, 2, 3]).unwrap();
        assert_eq!(b.read_at(0, 5).unwrap(), [0xCC, 1, 2, 3, 0xCC]);
        assert!(b.write_at(0, &vec![0; 10_001]).is_err());
        assert!(b.write_at(9_999, &[1, 2]).is_err());
        assert!(b.read_at(10_001, 0).is_err());
        assert_eq!(b.read_at(10_000, 0).unwrap(), Vec::<u8>::new());
        let empty = HostBuffer::new(0);
        assert!(empty.is_empty() && empty.to_vec().is_empty());
        assert!(HostBuffer::try_new(usize::MAX).is_none());
    }
}
