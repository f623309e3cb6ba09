//! The runtime's IPC calls (`{prefix}IpcGetMemHandle` / `IpcOpenMemHandle` /
//! `IpcCloseMemHandle`) and the driver's `MemGetAddressRange`, loaded at run time
//! beside the rest of the runtime: a runtime without them still serves staging, it
//! only cannot share device memory with another process.
//!
//! An IPC handle names a whole allocation, and frameworks' caching allocators hand out
//! tensors inside larger allocations: [`IpcRuntime::allocation_range`] asks the driver
//! (`cuMemGetAddressRange_v2` in `libcuda.so.1`, `muMemGetAddressRange` in `libmusa.so`)
//! where the allocation holding a pointer starts, so the offset can be advertised.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use libloading::Library;

use super::vmm::{sym, VmmApi};
use super::{DeviceError, Runtime, Vendor};

/// Bytes of `cudaIpcMemHandle_t` / `musaIpcMemHandle_t` (`CUDA_IPC_HANDLE_SIZE`).
pub const IPC_HANDLE_BYTES: usize = 64;
/// `cudaIpcMemLazyEnablePeerAccess` / `musaIpcMemLazyEnablePeerAccess`.
const LAZY_ENABLE_PEER_ACCESS: c_uint = 1;

/// An opaque runtime IPC handle, passed by value as the runtime's 64-byte struct.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcHandle(pub [u8; IPC_HANDLE_BYTES]);

impl std::fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IpcHandle({})", self.to_hex())
    }
}

impl IpcHandle {
    /// Upstream's `shm_name` encoding (`serializeBinaryData`): upper-case hex, two
    /// digits per byte, in memory order.
    pub fn to_hex(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
        let mut s = String::with_capacity(IPC_HANDLE_BYTES * 2);
        for b in self.0 {
            s.push(char::from(DIGITS[usize::from(b >> 4)]));
            s.push(char::from(DIGITS[usize::from(b & 15)]));
        }
        s
    }

    /// Parses a `shm_name` (hex, either case); `None` unless it is exactly one handle.
    pub fn from_hex(text: &str) -> Option<Self> {
        let bytes = text.as_bytes();
        if bytes.len() != IPC_HANDLE_BYTES * 2 {
            return None;
        }
        let digit = |c: u8| char::from(c).to_digit(16).map(|d| d as u8);
        let mut out = [0u8; IPC_HANDLE_BYTES];
        for (o, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
            let [hi, lo] = pair else { return None };
            *o = (digit(*hi)? << 4) | digit(*lo)?;
        }
        Some(Self(out))
    }
}

type Status = c_int;

struct IpcApi {
    get_device: unsafe extern "C" fn(*mut c_int) -> Status,
    get_mem_handle: unsafe extern "C" fn(*mut IpcHandle, *mut c_void) -> Status,
    open_mem_handle: unsafe extern "C" fn(*mut *mut c_void, IpcHandle, c_uint) -> Status,
    close_mem_handle: unsafe extern "C" fn(*mut c_void) -> Status,
}

/// `cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr ptr)`.
type AddressRange = unsafe extern "C" fn(*mut u64, *mut usize, u64) -> Status;

/// The IPC part of a loaded runtime.
pub struct IpcRuntime {
    rt: Arc<Runtime>,
    api: IpcApi,
    range: Option<(AddressRange, String)>,
    /// The virtual-memory calls, or why they are missing.
    vmm: Result<VmmApi, String>,
    /// Peer mappings opened and closed ([`PeerMapping`](super::peer_mapping::PeerMapping)).
    pub(super) peer_opens: AtomicU64,
    pub(super) peer_closes: AtomicU64,
    _lib: Library,
    _driver: Option<Library>,
}

/// Libraries that may export the driver's address-range call, in the order tried.
pub(crate) fn driver_candidates(vendor: Vendor) -> Vec<String> {
    match vendor {
        Vendor::Cuda => vec!["libcuda.so.1".into()],
        Vendor::Musa => {
            let mut v = vec!["libmusa.so".to_string(), "libmusa.so.1".to_string()];
            if let Ok(home) = std::env::var("MUSA_HOME") {
                v.push(format!("{home}/lib/libmusa.so"));
            }
            v.push("/usr/local/musa/lib/libmusa.so".into());
            v
        }
    }
}

fn driver_names(vendor: Vendor) -> (&'static str, &'static str) {
    match vendor {
        Vendor::Cuda => ("cuInit", "cuMemGetAddressRange_v2"),
        Vendor::Musa => ("muInit", "muMemGetAddressRange"),
    }
}

impl IpcRuntime {
    /// Resolves the IPC calls of `rt`'s library and the driver's address-range call.
    /// The error names the missing symbol.
    pub fn load(rt: Arc<Runtime>) -> Result<Self, String> {
        // SAFETY: the library is already loaded by `rt`; this only takes another reference.
        let lib = unsafe { Library::new(rt.path()) }
            .map_err(|e| format!("cannot reopen {}: {e}", rt.path()))?;
        let prefix = rt.vendor().prefix();
        let api = IpcApi {
            get_device: sym(&lib, &format!("{prefix}GetDevice"))?,
            get_mem_handle: sym(&lib, &format!("{prefix}IpcGetMemHandle"))?,
            open_mem_handle: sym(&lib, &format!("{prefix}IpcOpenMemHandle"))?,
            close_mem_handle: sym(&lib, &format!("{prefix}IpcCloseMemHandle"))?,
        };
        let (init_name, range_name) = driver_names(rt.vendor());
        let mut driver = None;
        let mut range = None;
        for cand in driver_candidates(rt.vendor()) {
            // SAFETY: the vendor's driver library; loading runs its initialisers.
            let Ok(d) = (unsafe { Library::new(&cand) }) else {
                continue;
            };
            if let (Ok(init), Ok(f)) = (
                sym::<unsafe extern "C" fn(c_uint) -> Status>(&d, init_name),
                sym::<AddressRange>(&d, range_name),
            ) {
                // SAFETY: documented initialiser, flags must be 0; idempotent.
                unsafe { init(0) };
                range = Some((f, cand));
                driver = Some(d);
                break;
            }
        }
        if range.is_none() {
            // A runtime library that exports the driver call too (the test fake) serves.
            if let Ok(f) = sym::<AddressRange>(&lib, range_name) {
                range = Some((f, rt.path().to_string()));
            }
        }
        let vmm = match &driver {
            Some(d) => VmmApi::resolve(d, rt.vendor()),
            None => VmmApi::resolve(&lib, rt.vendor()),
        };
        Ok(Self {
            rt,
            api,
            range,
            vmm,
            peer_opens: AtomicU64::new(0),
            peer_closes: AtomicU64::new(0),
            _lib: lib,
            _driver: driver,
        })
    }

    /// The runtime.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.rt
    }

    /// The library that answers [`allocation_range`](Self::allocation_range), if any.
    pub fn driver_path(&self) -> Option<&str> {
        self.range.as_ref().map(|(_, p)| p.as_str())
    }

    /// The device current on the calling thread.
    pub fn current_device(&self) -> Result<u32, DeviceError> {
        let mut d: c_int = 0;
        // SAFETY: valid out-pointer.
        let rc = unsafe { (self.api.get_device)(&mut d) };
        self.rt.check("GetDevice", rc)?;
        Ok(d.max(0) as u32)
    }

    /// Runs `f` with `device` current, then makes the caller's device current again
    /// (these calls run on the application's threads, whose current device it owns).
    pub fn on_device<T>(
        &self,
        device: u32,
        f: impl FnOnce() -> Result<T, DeviceError>,
    ) -> Result<T, DeviceError> {
        let before = self.current_device()?;
        if before != device {
            self.rt.set_device(device)?;
        }
        let out = f();
        if before != device {
            self.rt.set_device(before)?;
        }
        out
    }

    /// Base and size of the allocation holding `ptr`; an error when the driver call is
    /// not available or refuses the pointer.
    pub fn allocation_range(&self, ptr: u64) -> Result<(u64, u64), String> {
        let Some((f, path)) = &self.range else {
            return Err(format!(
                "no driver library with {} was found (tried {:?})",
                driver_names(self.rt.vendor()).1,
                driver_candidates(self.rt.vendor())
            ));
        };
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: valid out-pointers; the driver only reads its tables for `ptr`.
        let rc = unsafe { f(&mut base, &mut size, ptr) };
        if rc != 0 || base == 0 || size == 0 {
            return Err(format!(
                "{} ({path}) refused {ptr:#x} (driver error {rc})",
                driver_names(self.rt.vendor()).1
            ));
        }
        Ok((base, size as u64))
    }

    /// The physical allocations of the virtual-memory API mapped under `[addr, addr+len)`,
    /// as (base, size), back to back from the one holding `addr`; at most `max` of them.
    pub fn vmm_chunks(&self, addr: u64, len: u64, max: usize) -> Result<Vec<(u64, u64)>, String> {
        let end = addr.checked_add(len).ok_or("the range wraps around")?;
        let mut chunks: Vec<(u64, u64)> = Vec::new();
        let mut at = addr;
        while at < end {
            if chunks.len() == max {
                return Err(format!(
                    "the region spans more than {max} allocations; register it in pieces"
                ));
            }
            let (base, size) = self.allocation_range(at)?;
            let next = base
                .checked_add(size)
                .ok_or("the driver's range wraps around")?;
            if let Some(&(b, s)) = chunks.last() {
                if b + s != base {
                    return Err(format!(
                        "the allocations under the region are not back to back ({b:#x}+{s}, then {base:#x})"
                    ));
                }
            }
            if base > at || next <= at {
                return Err(format!(
                    "the driver places {at:#x} in {base:#x}+{size}, which does not hold it"
                ));
            }
            chunks.push((base, size));
            at = next;
        }
        Ok(chunks)
    }

    /// The virtual-memory calls, or why this runtime's driver lacks them.
    pub(crate) fn vmm(&self) -> Result<&VmmApi, String> {
        self.vmm.as_ref().map_err(Clone::clone)
    }

    /// The IPC handle of the allocation holding `ptr`.
    pub fn get_handle(&self, ptr: u64) -> Result<IpcHandle, DeviceError> {
        let mut h = IpcHandle([0; IPC_HANDLE_BYTES]);
        // SAFETY: valid out-pointer of the runtime's handle size.
        self.rt.check("IpcGetMemHandle", unsafe {
            (self.api.get_mem_handle)(&mut h, ptr as *mut c_void)
        })?;
        Ok(h)
    }

    /// Maps another process's allocation on the current device; returns its base here.
    /// Only a [`PeerMapping`](super::peer_mapping::PeerMapping) opens, so that only its
    /// drop closes.
    pub(super) fn open(&self, handle: IpcHandle) -> Result<u64, DeviceError> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the handle is passed by value as the runtime expects.
        self.rt.check("IpcOpenMemHandle", unsafe {
            (self.api.open_mem_handle)(&mut p, handle, LAZY_ENABLE_PEER_ACCESS)
        })?;
        Ok(p as u64)
    }

    /// Unmaps a base returned by [`open`](Self::open).
    pub(super) fn close(&self, base: u64) -> Result<(), DeviceError> {
        // SAFETY: `base` came from `open`, and its mapping's last holder let go of it, so
        // no copy uses it any more (copies hold their mapping until their stream syncs).
        self.rt.check("IpcCloseMemHandle", unsafe {
            (self.api.close_mem_handle)(base as *mut c_void)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shm_name_is_upper_case_hex_of_the_64_bytes() {
        let mut b = [0u8; IPC_HANDLE_BYTES];
        b[0] = 0xAB;
        b[1] = 0x01;
        b[63] = 0xF0;
        let h = IpcHandle(b);
        let s = h.to_hex();
        assert_eq!(s.len(), 128);
        assert!(s.starts_with("AB01"), "{s}");
        assert!(s.ends_with("F0"), "{s}");
        assert_eq!(IpcHandle::from_hex(&s), Some(h));
        assert_eq!(IpcHandle::from_hex(&s.to_lowercase()), Some(h));
        assert_eq!(IpcHandle::from_hex(&s[2..]), None);
        assert_eq!(IpcHandle::from_hex(&format!("{}G0", &s[2..])), None);
        assert_eq!(IpcHandle::from_hex("é"), None);
    }
}
