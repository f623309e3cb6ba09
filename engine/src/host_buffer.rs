//! A page-aligned, zeroed heap buffer: memory to register and move, owned for as long as
//! transfers may touch it (the benchmark, tests, examples).

use std::alloc::Layout;

/// Page size the buffer is aligned to.
const ALIGN: usize = 4096;

/// `len` zeroed bytes at a 4096-aligned address, freed on drop.
pub struct HostBuffer {
    ptr: *mut u8,
    len: usize,
    layout: Layout,
}

// SAFETY: a plain owned allocation; access from Rust goes through &self / &mut self, and the
// engine reaches it only by address while the owner keeps it alive.
unsafe impl Send for HostBuffer {}
// SAFETY: as above.
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

    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: owned allocation of at least `len` initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Its bytes, mutably.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
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
        let mut b = HostBuffer::new(10_000);
        assert_eq!(b.addr() % ALIGN as u64, 0);
        assert_eq!(b.len(), 10_000);
        assert!(b.bytes().iter().all(|&x| x == 0));
        b.bytes_mut().fill(0xCC);
        assert!(b.bytes().iter().all(|&x| x == 0xCC));
        let empty = HostBuffer::new(0);
        assert!(empty.is_empty() && empty.bytes().is_empty());
        assert!(HostBuffer::try_new(usize::MAX).is_none());
    }
}
