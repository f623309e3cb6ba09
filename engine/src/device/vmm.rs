//! Device memory of the driver's virtual-memory API (`cuMemCreate` + `cuMemMap`, as
//! PyTorch allocates with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`), shared
//! with another process: the legacy `IpcGetMemHandle` refuses it.
//!
//! Export: each physical allocation mapped under a range (an expandable segment maps one
//! allocation per chunk, back to back) is found with `MemGetAddressRange` and exported as
//! a POSIX file descriptor (`MemRetainAllocationHandle` + `MemExportToShareableHandle`,
//! handle type 1; PyTorch requests that type for expandable segments). Import: each
//! descriptor becomes a handle (`MemImportFromShareableHandle`), mapped back to back in
//! one reserved address range (`MemAddressReserve` + `MemMap`), readable and writable by
//! the importing device (`MemSetAccess`), so a copy may cross chunk boundaries as it does
//! in the exporter. [`VmmMapping`]'s drop unmaps it and frees the range; a successful
//! import becomes a [`PeerMapping`](super::peer_mapping::PeerMapping), which does so
//! when its last holder lets go.
//!
//! CUDA names from `libcuda.so.1`; MUSA the same calls with `cu` → `mu` (assumed from
//! upstream's MUSA VMM use; see docs/gpu.md).

use std::ffi::{c_int, c_ulonglong, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use libloading::Library;

use super::Vendor;

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
const HANDLE_TYPE_POSIX_FD: c_int = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_TYPE_DEVICE: c_int = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const ACCESS_READ_WRITE: c_int = 3;

type Status = c_int;
/// `CUmemGenericAllocationHandle`.
type Handle = c_ulonglong;

/// `CUmemAccessDesc`: `{ CUmemLocation { type, id }, flags }`.
#[repr(C)]
struct AccessDesc {
    location_type: c_int,
    location_id: c_int,
    flags: c_int,
}

/// The driver's virtual-memory calls.
pub(crate) struct VmmApi {
    retain: unsafe extern "C" fn(*mut Handle, *mut c_void) -> Status,
    release: unsafe extern "C" fn(Handle) -> Status,
    export: unsafe extern "C" fn(*mut c_void, Handle, c_int, c_ulonglong) -> Status,
    import: unsafe extern "C" fn(*mut Handle, *mut c_void, c_int) -> Status,
    reserve: unsafe extern "C" fn(*mut u64, usize, usize, u64, c_ulonglong) -> Status,
    free: unsafe extern "C" fn(u64, usize) -> Status,
    map: unsafe extern "C" fn(u64, usize, usize, Handle, c_ulonglong) -> Status,
    unmap: unsafe extern "C" fn(u64, usize) -> Status,
    set_access: unsafe extern "C" fn(u64, usize, *const AccessDesc, usize) -> Status,
    prefix: &'static str,
}

/// The function `name` of `lib`, typed `T` (a function pointer of the signature the vendor
/// documents for it); the error names the missing symbol.
pub(crate) fn sym<T: Copy>(lib: &Library, name: &str) -> Result<T, String> {
    // SAFETY: callers give each symbol the signature the vendor documents.
    unsafe {
        lib.get::<T>(name.as_bytes())
            .map(|s| *s)
            .map_err(|_| format!("symbol {name} is missing"))
    }
}

/// A failed driver call: its name and code.
fn check(prefix: &str, call: &str, rc: Status) -> Result<(), String> {
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("{prefix}{call} failed (driver error {rc})"))
    }
}

impl VmmApi {
    /// Resolves the calls in `lib` (the driver, or a runtime that exports them too);
    /// the error names the first missing symbol.
    pub(crate) fn resolve(lib: &Library, vendor: Vendor) -> Result<Self, String> {
        let prefix = match vendor {
            Vendor::Cuda => "cu",
            Vendor::Musa => "mu",
        };
        let name = |call: &str| format!("{prefix}{call}");
        Ok(Self {
            retain: sym(lib, &name("MemRetainAllocationHandle"))?,
            release: sym(lib, &name("MemRelease"))?,
            export: sym(lib, &name("MemExportToShareableHandle"))?,
            import: sym(lib, &name("MemImportFromShareableHandle"))?,
            reserve: sym(lib, &name("MemAddressReserve"))?,
            free: sym(lib, &name("MemAddressFree"))?,
            map: sym(lib, &name("MemMap"))?,
            unmap: sym(lib, &name("MemUnmap"))?,
            set_access: sym(lib, &name("MemSetAccess"))?,
            prefix,
        })
    }

    /// The physical allocation mapped at `ptr`, exported as a file descriptor. Fails for
    /// memory not from the virtual-memory API, and for allocations created without the
    /// POSIX descriptor handle type.
    pub(crate) fn export_fd(&self, ptr: u64) -> Result<OwnedFd, String> {
        let mut h: Handle = 0;
        // SAFETY: valid out-pointer; the driver only looks `ptr` up.
        check(self.prefix, "MemRetainAllocationHandle", unsafe {
            (self.retain)(&mut h, ptr as *mut c_void)
        })?;
        let mut fd: c_int = -1;
        // SAFETY: for handle type 1 the shareable handle is an `int`; `fd` is one.
        let exported = check(self.prefix, "MemExportToShareableHandle", unsafe {
            (self.export)((&mut fd as *mut c_int).cast(), h, HANDLE_TYPE_POSIX_FD, 0)
        });
        // SAFETY: releases the reference `retain` took; the allocation stays mapped.
        unsafe { (self.release)(h) };
        exported?;
        if fd < 0 {
            return Err(format!(
                "{}MemExportToShareableHandle gave no descriptor",
                self.prefix
            ));
        }
        // SAFETY: the driver created `fd` for us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Maps `chunks` (file descriptor, offset in the range, size), which cover
    /// `[0, span)` back to back, into one new address range readable and writable by
    /// `device` (the current device's context must be current). The descriptors may be
    /// closed afterwards.
    pub(super) fn import(
        &self,
        chunks: &[(OwnedFd, u64, u64)],
        span: u64,
        device: u32,
    ) -> Result<VmmMapping<'_>, String> {
        let span_usize = usize::try_from(span).map_err(|_| "span too large".to_string())?;
        let mut base = 0u64;
        // SAFETY: valid out-pointer; no fixed address asked for.
        check(self.prefix, "MemAddressReserve", unsafe {
            (self.reserve)(&mut base, span_usize, 0, 0, 0)
        })?;
        let mut m = VmmMapping {
            api: self,
            base,
            span: span_usize,
            mapped: Vec::with_capacity(chunks.len()),
        };
        for (fd, offset, size) in chunks {
            let size = usize::try_from(*size).map_err(|_| "chunk too large".to_string())?;
            let mut h: Handle = 0;
            // SAFETY: for handle type 1 the OS handle is the descriptor's value as a
            // pointer; the driver duplicates what it needs.
            check(self.prefix, "MemImportFromShareableHandle", unsafe {
                (self.import)(
                    &mut h,
                    fd.as_raw_fd() as isize as *mut c_void,
                    HANDLE_TYPE_POSIX_FD,
                )
            })?;
            let at = base + offset;
            // SAFETY: `[at, at+size)` lies in the range reserved above (offsets and
            // sizes were checked to cover `[0, span)` back to back).
            let mapped = check(self.prefix, "MemMap", unsafe {
                (self.map)(at, size, 0, h, 0)
            });
            // SAFETY: the mapping holds the allocation; our reference is not needed.
            unsafe { (self.release)(h) };
            mapped?;
            m.mapped.push((at, size));
        }
        let access = AccessDesc {
            location_type: LOCATION_TYPE_DEVICE,
            location_id: c_int::try_from(device).map_err(|_| "device out of range")?,
            flags: ACCESS_READ_WRITE,
        };
        // SAFETY: the whole range is mapped; one descriptor is passed.
        check(self.prefix, "MemSetAccess", unsafe {
            (self.set_access)(base, span_usize, &access, 1)
        })?;
        Ok(m)
    }
}

/// Another process's allocations mapped here back to back; unmapped on drop.
pub(crate) struct VmmMapping<'a> {
    api: &'a VmmApi,
    base: u64,
    span: usize,
    mapped: Vec<(u64, usize)>,
}

impl VmmMapping<'_> {
    /// Gives up ownership: the caller unmaps with [`VmmApi::unmap`] later.
    pub(super) fn into_parts(self) -> (u64, usize, Vec<(u64, usize)>) {
        let me = std::mem::ManuallyDrop::new(self);
        (me.base, me.span, me.mapped.clone())
    }
}

impl Drop for VmmMapping<'_> {
    fn drop(&mut self) {
        self.api.unmap(self.base, self.span, &self.mapped);
    }
}

impl VmmApi {
    /// Unmaps what [`import`](Self::import) mapped and frees its range (the device's
    /// context must be current). Failures are logged: nothing else can be done.
    pub(super) fn unmap(&self, base: u64, span: usize, mapped: &[(u64, usize)]) {
        for &(at, size) in mapped {
            // SAFETY: mapped by `import`; its mapping's last holder let go of it, so no
            // copy uses it any more (copies hold their mapping until their stream syncs).
            let rc = unsafe { (self.unmap)(at, size) };
            if let Err(e) = check(self.prefix, "MemUnmap", rc) {
                tracing::warn!("unmapping a peer's memory at {at:#x}+{size}: {e}");
            }
        }
        // SAFETY: reserved by `import`; nothing is mapped in it any more.
        let rc = unsafe { (self.free)(base, span) };
        if let Err(e) = check(self.prefix, "MemAddressFree", rc) {
            tracing::warn!("freeing the address range {base:#x}+{span}: {e}");
        }
    }
}
