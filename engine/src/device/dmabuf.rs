//! Device memory exported as a dma-buf, for `ibv_reg_dmabuf_mr`: the HCA reaches GPU
//! memory without a peer-memory kernel module.
//!
//! CUDA (upstream's path, `docs`: "CUDA GPU memory over RDMA"): `cuMemGetAddressRange_v2`
//! finds the allocation holding the pointer (PyTorch's caching allocator packs tensors
//! into one allocation, and only whole allocations can be exported), then
//! `cuMemGetHandleForAddressRange(&fd, base, size, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
//! 0)` exports it. MUSA: upstream registers MUSA memory only through the peer-memory
//! module; we also try `muMemGetAddressRange` / `muMemGetHandleForAddressRange` when the
//! MUSA driver exports them (same signatures with `cu` → `mu`).
//!
//! The driver calls need a context current on the calling thread; registration runs on
//! the application's thread, where the framework that allocated the tensor has one.

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

use libloading::Library;

use super::{Runtime, Vendor};

/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
const HANDLE_TYPE_DMA_BUF_FD: c_int = 1;

/// `cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr ptr)`.
type AddressRange = unsafe extern "C" fn(*mut u64, *mut usize, u64) -> c_int;
/// `cuMemGetHandleForAddressRange(void *handle, CUdeviceptr ptr, size_t size,
/// CUmemRangeHandleType type, unsigned long long flags)`.
type HandleForRange = unsafe extern "C" fn(*mut c_void, u64, usize, c_int, c_ulonglong) -> c_int;

/// A dma-buf covering a device range: `offset` is where the range starts in it.
///
/// Made only by [`export`], from the driver's answer: the file is a dma-buf of the whole
/// allocation holding `[addr, addr+len)`, which lies at `offset..offset+len` in it. That
/// is what `ibv_reg_dmabuf_mr` needs to be told (the RDMA backend registers exactly that
/// part of it).
#[derive(Debug)]
pub struct DmaBuf {
    /// The exported file; closing it after registration is fine (the MR holds the
    /// buffer).
    fd: OwnedFd,
    /// Offset of the asked-for pointer in the exported allocation.
    offset: u64,
    /// The device range it was exported for.
    addr: u64,
    len: u64,
}

impl DmaBuf {
    /// The exported file.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Where the asked-for range starts in the exported allocation.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Start of the device range it was exported for.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length of the device range it was exported for.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

struct Driver {
    range: AddressRange,
    handle: HandleForRange,
    path: String,
    _lib: Library,
}

fn names(vendor: Vendor) -> (&'static str, &'static str, &'static str) {
    match vendor {
        Vendor::Cuda => (
            "cuInit",
            "cuMemGetAddressRange_v2",
            "cuMemGetHandleForAddressRange",
        ),
        Vendor::Musa => (
            "muInit",
            "muMemGetAddressRange",
            "muMemGetHandleForAddressRange",
        ),
    }
}

fn load(rt: &Runtime) -> Result<Driver, String> {
    let (init, range, handle) = names(rt.vendor());
    let mut tried = super::ipc::driver_candidates(rt.vendor());
    // A runtime library that exports the driver calls too (the test fake) serves.
    tried.push(rt.path().to_string());
    for cand in &tried {
        // SAFETY: the vendor's driver (or runtime) library; loading runs its initialisers.
        let Ok(lib) = (unsafe { Library::new(cand) }) else {
            continue;
        };
        // SAFETY: each symbol gets the signature the vendor documents.
        let found = unsafe {
            (
                lib.get::<AddressRange>(range.as_bytes()).map(|s| *s),
                lib.get::<HandleForRange>(handle.as_bytes()).map(|s| *s),
                lib.get::<unsafe extern "C" fn(c_uint) -> c_int>(init.as_bytes())
                    .map(|s| *s),
            )
        };
        if let (Ok(range), Ok(handle)) = (found.0, found.1) {
            if let Ok(init) = found.2 {
                // SAFETY: documented initialiser, flags must be 0; idempotent.
                unsafe { init(0) };
            }
            return Ok(Driver {
                range,
                handle,
                path: cand.clone(),
                _lib: lib,
            });
        }
    }
    Err(format!(
        "no library exports {range} and {handle} (tried {tried:?})"
    ))
}

fn driver(rt: &Runtime) -> Result<&'static Driver, String> {
    static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();
    DRIVER
        .get_or_init(|| load(rt))
        .as_ref()
        .map_err(Clone::clone)
}

/// Exports the allocation holding `[ptr, ptr+len)` as a dma-buf; the error says which
/// call is missing or refused.
pub fn export(rt: &Runtime, ptr: u64, len: u64) -> Result<DmaBuf, String> {
    let d = driver(rt)?;
    let (_, range_name, handle_name) = names(rt.vendor());
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: valid out-pointers; the driver only reads its tables for `ptr`.
    let rc = unsafe { (d.range)(&mut base, &mut size, ptr) };
    if rc != 0 || base == 0 || size == 0 {
        return Err(format!(
            "{range_name} ({}) refused {ptr:#x} (driver error {rc})",
            d.path
        ));
    }
    let end = ptr.checked_add(len);
    if ptr < base || end.is_none_or(|e| e > base + size as u64) {
        return Err(format!(
            "{ptr:#x}+{len} is not inside one allocation ({base:#x}+{size})"
        ));
    }
    let mut fd: c_int = -1;
    // SAFETY: `fd` is the out-parameter the dma-buf handle type asks for; flags 0.
    let rc = unsafe {
        (d.handle)(
            (&mut fd as *mut c_int).cast(),
            base,
            size,
            HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    };
    if rc != 0 || fd < 0 {
        return Err(format!(
            "{handle_name} ({}) refused the allocation {base:#x}+{size} (driver error {rc})",
            d.path
        ));
    }
    // SAFETY: the driver handed us this new descriptor; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(DmaBuf {
        fd,
        offset: ptr - base,
        addr: ptr,
        len,
    })
}
