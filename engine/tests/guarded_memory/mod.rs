//! Caller memory that shows any access after a call returned: anonymous pages laid out as
//! guard | buffer | guard, whose buffer part is given back and mapped afresh (the
//! allocator reusing it) right after the call, and checked afterwards.

#![allow(dead_code)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    reason = "test support: a panic here is the calling test's failure report"
)]

/// Fill of the guard zones, which must never change.
pub const GUARD_FILL: u8 = 0x5A;
/// Fill of the buffer once given back and mapped again.
pub const REUSED_FILL: u8 = 0x11;

/// Anonymous memory laid out as guard | buffer | guard, all mapped.
pub struct Mapping {
    base: *mut u8,
    guard: usize,
    len: usize,
}

impl Mapping {
    /// A buffer of `len` bytes filled with `fill`, between guards of `guard` bytes.
    pub fn new(len: usize, guard: usize, fill: u8) -> Self {
        let total = len + 2 * guard;
        // SAFETY: a fresh private anonymous mapping.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let m = Self {
            base: base.cast(),
            guard,
            len,
        };
        // SAFETY: inside the mapping.
        unsafe {
            std::ptr::write_bytes(m.base, GUARD_FILL, guard);
            std::ptr::write_bytes(m.base.add(guard), fill, len);
            std::ptr::write_bytes(m.base.add(guard + len), GUARD_FILL, guard);
        }
        m
    }

    pub fn buffer(&self) -> u64 {
        self.base as u64 + self.guard as u64
    }

    /// Gives the buffer's pages back and maps fresh ones at the same address (the
    /// allocator reusing it), filled. One `mmap` over the old pages rather than `munmap`
    /// then `mmap`: between the two, a thread starting elsewhere in the process (the
    /// engine's and the peer's start threads per connection) may get its stack in the hole,
    /// which the second `mmap` would then overwrite.
    pub fn free_and_reuse(&self) {
        let at = self.buffer() as *mut libc::c_void;
        // SAFETY: MAP_FIXED replaces exactly the buffer part of our own mapping.
        let again = unsafe {
            libc::mmap(
                at,
                self.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        assert_eq!(again, at);
        // SAFETY: freshly mapped.
        unsafe { std::ptr::write_bytes(at.cast::<u8>(), REUSED_FILL, self.len) };
    }

    pub fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        // SAFETY: inside the mapping.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(off), out.as_mut_ptr(), len) };
        out
    }

    /// Nothing changed the reused pages or the guards.
    pub fn assert_untouched(&self) {
        let buf = self.bytes(self.guard, self.len);
        if let Some(i) = buf.iter().position(|&b| b != REUSED_FILL) {
            panic!(
                "byte {i} of the reused memory changed to {:#04x} after the call returned",
                buf[i]
            );
        }
        for (name, off) in [("before", 0), ("after", self.guard + self.len)] {
            let g = self.bytes(off, self.guard);
            assert!(
                g.iter().all(|&b| b == GUARD_FILL),
                "guard zone {name} the buffer changed"
            );
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping.
        unsafe { libc::munmap(self.base.cast(), self.len + 2 * self.guard) };
    }
}
