//! Host memory for managed buffers: anonymous private mappings, page aligned.
//!
//! `MAP_NORESERVE`: a 2 GiB chunk costs address space, not memory, until its pages are
//! touched. Also the raw copies behind `write_bytes_to_buffer` / `read_bytes_from_buffer`,
//! through the engine's `MemSpan` (no reference is formed over caller memory).

use std::io;

use transfer_engine::memory::MemSpan;

/// Maps `len` bytes of zeroed, readable and writable memory.
pub fn map(len: u64) -> io::Result<u64> {
    let n = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a fresh anonymous mapping at an address the kernel chooses; no existing
    // memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            n,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p as u64)
}

/// Unmaps what [`map`] returned.
///
/// # Safety
/// `[addr, addr+len)` must be a mapping made by [`map`] that nothing uses any more.
pub unsafe fn unmap(addr: u64, len: u64) {
    // SAFETY: the caller guarantees the range is ours and unused.
    let rc = unsafe { libc::munmap(addr as *mut libc::c_void, len as usize) };
    if rc != 0 {
        tracing::warn!(
            "munmap({addr:#x}, {len}) failed: {}",
            io::Error::last_os_error()
        );
    }
}

/// Copies `src` to the host address `dest`.
///
/// # Safety
/// `[dest, dest+src.len())` must be writable host memory not accessed concurrently.
pub unsafe fn write(dest: u64, src: &[u8]) {
    // SAFETY: the caller guarantees the destination range for the call.
    let span = unsafe { MemSpan::new(dest, src.len()) };
    // Cannot fail: the span is exactly `src.len()` bytes.
    let _ = span.write_from(src);
}

/// Copies `dest.len()` bytes from the host address `src` into `dest`.
///
/// # Safety
/// `[src, src+dest.len())` must be readable host memory.
pub unsafe fn read(src: u64, dest: &mut [u8]) {
    // SAFETY: the caller guarantees the source range for the call.
    let span = unsafe { MemSpan::new(src, dest.len()) };
    // Cannot fail: the span is exactly `dest.len()` bytes.
    let _ = span.read_into(dest);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_write_read_unmap() {
        let a = map(1 << 20).unwrap();
        assert_eq!(a % 4096, 0);
        let mut back = [0u8; 5];
        // SAFETY: inside the fresh mapping.
        unsafe {
            write(a + 100, b"hello");
            read(a + 100, &mut back);
            unmap(a, 1 << 20);
        }
        assert_eq!(&back, b"hello");
    }
}
