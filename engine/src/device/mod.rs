//! GPU runtimes (MUSA and CUDA), loaded at run time with libloading and never
//! linked, so the engine starts on any host and uses device memory where a
//! runtime and devices exist.
//!
//! Both vendors expose the same runtime API under different prefixes
//! (`musaMemcpyAsync` / `cudaMemcpyAsync`, same signatures and enum values),
//! so one [`Runtime`] type serves both. Which vendor is used is chosen by
//! `MC_GPU_RUNTIME` (`auto`, the default: MUSA first, then CUDA, preferring
//! one that reports devices; `musa`; `cuda`; `none`).

pub(crate) mod batch;
pub mod dmabuf;
mod idle_stagers;
pub mod ipc;
pub mod loader;
pub(crate) mod peer_copies;
pub(crate) mod peer_mapping;
pub mod spare_stagers;
pub mod staging;
pub mod staging_pool;
pub(crate) mod vmm;

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::{Arc, OnceLock};

use libloading::Library;

pub use loader::LoadError;

/// A GPU vendor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Vendor {
    /// Moore Threads (`libmusart`, `musa*`).
    Musa,
    /// NVIDIA (`libcudart`, `cuda*`).
    Cuda,
}

impl Vendor {
    /// Symbol prefix and location prefix (`musa`, `cuda`).
    pub fn prefix(self) -> &'static str {
        match self {
            Self::Musa => "musa",
            Self::Cuda => "cuda",
        }
    }

    /// Parses a location such as `cuda:1` into its vendor and device.
    pub fn parse_location(location: &str) -> Option<(Self, u32)> {
        let (v, n) = location.split_once(':')?;
        let vendor = match v {
            "musa" => Self::Musa,
            "cuda" => Self::Cuda,
            _ => return None,
        };
        Some((vendor, n.parse().ok()?))
    }
}

impl std::fmt::Display for Vendor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Musa => "MUSA",
            Self::Cuda => "CUDA",
        })
    }
}

/// `cudaMemcpyDefault` / `musaMemcpyDefault`: direction inferred from the pointers (UVA).
pub const MEMCPY_DEFAULT: c_int = 4;
/// `cudaMemoryTypeDevice` / `musaMemoryTypeDevice`.
const MEMORY_TYPE_DEVICE: c_int = 2;
/// `cudaStreamNonBlocking`.
const STREAM_NON_BLOCKING: c_uint = 1;
/// Bytes handed to `PointerGetAttributes`: CUDA 12 writes 24, CUDA 13 writes
/// 88; a later runtime may write more. Only `type` (offset 0) and `device`
/// (offset 4) are read.
const POINTER_ATTRIBUTES_SPACE: usize = 256;

/// `cudaErrorNotReady` / `musaErrorNotReady`: a stream query found work still running. (A
/// runtime that numbers it otherwise, as CUDA before 10 did, is waited for by
/// synchronising instead.)
const ERROR_NOT_READY: Status = 600;

type Status = c_int;
pub(crate) type Stream = *mut c_void;

struct Api {
    get_device_count: unsafe extern "C" fn(*mut c_int) -> Status,
    set_device: unsafe extern "C" fn(c_int) -> Status,
    pointer_get_attributes: unsafe extern "C" fn(*mut c_void, *const c_void) -> Status,
    memcpy: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> Status,
    memcpy_async: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, Stream) -> Status,
    stream_create_with_flags: unsafe extern "C" fn(*mut Stream, c_uint) -> Status,
    stream_synchronize: unsafe extern "C" fn(Stream) -> Status,
    stream_destroy: unsafe extern "C" fn(Stream) -> Status,
    host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> Status,
    free_host: unsafe extern "C" fn(*mut c_void) -> Status,
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> Status,
    free: unsafe extern "C" fn(*mut c_void) -> Status,
    get_error_string: unsafe extern "C" fn(Status) -> *const c_char,
    get_last_error: unsafe extern "C" fn() -> Status,
    /// Optional: a runtime without it gives GPUs without PCI placement.
    device_get_pci_bus_id: Option<unsafe extern "C" fn(*mut c_char, c_int, c_int) -> Status>,
    /// Optional: without it every wait for a stream synchronises it.
    stream_query: Option<unsafe extern "C" fn(Stream) -> Status>,
}

/// A loaded runtime library.
pub struct Runtime {
    vendor: Vendor,
    path: String,
    devices: u32,
    api: Api,
    /// `cudaMemcpyBatchAsync` in this runtime's signature, or why it is not used.
    batch: Result<batch::BatchCopy, String>,
    _lib: Library,
}

/// A runtime call that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {message} (error {code})")]
pub struct DeviceError {
    /// The runtime function.
    pub call: String,
    /// The runtime's error code.
    pub code: i32,
    /// The runtime's error string.
    pub message: String,
}

impl Runtime {
    /// Opens the first loadable candidate for `vendor` and resolves every symbol.
    pub fn load(vendor: Vendor, candidates: &[String]) -> Result<Self, LoadError> {
        let (lib, path) = loader::open_first(vendor, candidates)?;
        let api = resolve(&lib, vendor.prefix()).map_err(|MissingSymbol(missing)| LoadError {
            vendor,
            tried: vec![(
                path.clone(),
                format!("loaded, but symbol {missing} is missing"),
            )],
        })?;
        let batch = batch::BatchCopy::resolve(&lib, vendor);
        let mut n: c_int = 0;
        // SAFETY: resolved with the runtime's signature; `n` is a valid out-pointer.
        let rc = unsafe { (api.get_device_count)(&mut n) };
        if rc != 0 {
            // No driver or no device: the runtime is usable only for host memory.
            // SAFETY: clears the sticky error, no arguments.
            unsafe { (api.get_last_error)() };
            n = 0;
        }
        Ok(Self {
            vendor,
            path,
            devices: n.max(0) as u32,
            api,
            batch,
            _lib: lib,
        })
    }

    /// The vendor.
    pub fn vendor(&self) -> Vendor {
        self.vendor
    }

    /// The library file that was opened.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Devices visible to this process.
    pub fn device_count(&self) -> u32 {
        self.devices
    }

    fn check(&self, call: &str, rc: Status) -> Result<(), DeviceError> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: the runtime returns a static string or null.
        let message = unsafe {
            let p = (self.api.get_error_string)(rc);
            if p.is_null() {
                "unknown error".to_string()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        // SAFETY: clears the sticky error so later calls are not poisoned.
        unsafe { (self.api.get_last_error)() };
        Err(DeviceError {
            call: format!("{}{call}", self.vendor.prefix()),
            code: rc,
            message,
        })
    }

    /// The device holding `ptr`, or `None` for host (or unknown) memory.
    pub fn device_of(&self, ptr: u64) -> Option<u32> {
        if self.devices == 0 {
            return None;
        }
        #[repr(C, align(16))]
        struct Space([u8; POINTER_ATTRIBUTES_SPACE]);
        let mut attrs = Space([0; POINTER_ATTRIBUTES_SPACE]);
        // SAFETY: `attrs` is larger than any known attributes struct and aligned.
        let rc = unsafe {
            (self.api.pointer_get_attributes)(attrs.0.as_mut_ptr().cast(), ptr as *const c_void)
        };
        if rc != 0 {
            // SAFETY: clears the sticky error of a failed query.
            unsafe { (self.api.get_last_error)() };
            return None;
        }
        let kind = c_int::from_ne_bytes([attrs.0[0], attrs.0[1], attrs.0[2], attrs.0[3]]);
        let device = c_int::from_ne_bytes([attrs.0[4], attrs.0[5], attrs.0[6], attrs.0[7]]);
        (kind == MEMORY_TYPE_DEVICE && device >= 0).then_some(device as u32)
    }

    /// Makes `device` current on the calling thread.
    pub fn set_device(&self, device: u32) -> Result<(), DeviceError> {
        // SAFETY: plain integer argument.
        self.check("SetDevice", unsafe {
            (self.api.set_device)(device as c_int)
        })
    }

    /// Synchronous copy (direction from the pointers).
    ///
    /// # Safety
    /// Both ranges must be valid for `len` bytes.
    pub unsafe fn copy(&self, dst: *mut u8, src: *const u8, len: usize) -> Result<(), DeviceError> {
        // SAFETY: forwarded from the caller.
        self.check("Memcpy", unsafe {
            (self.api.memcpy)(dst.cast(), src.cast(), len, MEMCPY_DEFAULT)
        })
    }

    /// Allocates device memory on the current device (used by tests and the allocator).
    pub fn malloc(&self, len: usize) -> Result<u64, DeviceError> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.check("Malloc", unsafe { (self.api.malloc)(&mut p, len) })?;
        Ok(p as u64)
    }

    /// Frees memory from [`malloc`](Self::malloc).
    pub fn free(&self, ptr: u64) -> Result<(), DeviceError> {
        // SAFETY: the caller passes a pointer from `malloc`.
        self.check("Free", unsafe { (self.api.free)(ptr as *mut c_void) })
    }

    /// Waits until all work queued on a caller's stream (`cudaStream_t` as an integer;
    /// 0 is the legacy default stream) has finished: the `*_on_cuda` calls order their
    /// transfer after it this way.
    ///
    /// # Safety
    /// `stream` must be 0 or a live stream of this runtime: the runtime dereferences it.
    pub unsafe fn synchronize_stream(&self, stream: u64) -> Result<(), DeviceError> {
        // SAFETY: forwarded from the caller.
        self.check("StreamSynchronize", unsafe {
            (self.api.stream_synchronize)(stream as Stream)
        })
    }
}

// Stream and pinned-buffer primitives for the staging path.
impl Runtime {
    /// The PCI address of `device` (`0000:18:00.0`, lower-cased as upstream does), or
    /// `None` when the runtime lacks `DeviceGetPCIBusId` or refuses the call.
    pub fn pci_bus_id(&self, device: u32) -> Option<String> {
        let f = self.api.device_get_pci_bus_id?;
        let mut buf = [0 as c_char; 64];
        // SAFETY: `buf` has room for the 64 bytes announced; the runtime writes a
        // NUL-terminated string of at most that length.
        let rc = unsafe { f(buf.as_mut_ptr(), buf.len() as c_int, device as c_int) };
        if rc != 0 {
            // SAFETY: clears the sticky error, no arguments.
            unsafe { (self.api.get_last_error)() };
            return None;
        }
        buf[buf.len() - 1] = 0;
        // SAFETY: NUL-terminated above at the latest.
        let id = unsafe { CStr::from_ptr(buf.as_ptr()) };
        Some(id.to_string_lossy().trim().to_ascii_lowercase())
    }

    pub(crate) fn stream_create(&self) -> Result<Stream, DeviceError> {
        let mut s: Stream = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.check("StreamCreateWithFlags", unsafe {
            (self.api.stream_create_with_flags)(&mut s, STREAM_NON_BLOCKING)
        })?;
        Ok(s)
    }

    pub(crate) fn stream_sync(&self, s: Stream) -> Result<(), DeviceError> {
        // SAFETY: `s` came from `stream_create`.
        self.check("StreamSynchronize", unsafe {
            (self.api.stream_synchronize)(s)
        })
    }

    /// Waits for the work queued on `s` so far, giving the CPU to other threads between
    /// queries. [`stream_sync`](Self::stream_sync) spins in the runtime while a copy runs
    /// (on a host with more CPUs than GPU contexts); a data server's threads that wait so
    /// for their copies out of the GPU kept CPUs from the threads moving bytes.
    pub(crate) fn stream_sync_yielding(&self, s: Stream) -> Result<(), DeviceError> {
        let Some(query) = self.api.stream_query else {
            return self.stream_sync(s);
        };
        loop {
            // SAFETY: `s` came from `stream_create`.
            match unsafe { query(s) } {
                0 => return Ok(()),
                ERROR_NOT_READY => std::thread::yield_now(),
                // A failure (or a "not ready" numbered otherwise): synchronising reports it.
                _ => return self.stream_sync(s),
            }
        }
    }

    pub(crate) fn stream_destroy(&self, s: Stream) {
        // SAFETY: `s` came from `stream_create` and is not used afterwards.
        unsafe { (self.api.stream_destroy)(s) };
    }

    pub(crate) fn host_alloc(&self, len: usize) -> Result<*mut u8, DeviceError> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; flags 0 = default pinned allocation.
        self.check("HostAlloc", unsafe {
            (self.api.host_alloc)(&mut p, len, 0)
        })?;
        Ok(p.cast())
    }

    pub(crate) fn free_host(&self, p: *mut u8) {
        // SAFETY: `p` came from `host_alloc` and is not used afterwards.
        unsafe { (self.api.free_host)(p.cast()) };
    }

    /// # Safety
    /// Both ranges valid for `len` bytes until the stream is synchronised.
    pub(crate) unsafe fn copy_async(
        &self,
        dst: *mut u8,
        src: *const u8,
        len: usize,
        s: Stream,
    ) -> Result<(), DeviceError> {
        // SAFETY: forwarded from the caller.
        self.check("MemcpyAsync", unsafe {
            (self.api.memcpy_async)(dst.cast(), src.cast(), len, MEMCPY_DEFAULT, s)
        })
    }

    /// The call that enqueues many copies at once (its name and signature), or why this
    /// runtime has none: then each copy is one [`copy_async`](Self::copy_async).
    pub fn batch_copy(&self) -> Result<&'static str, &str> {
        self.batch
            .as_ref()
            .map(batch::BatchCopy::describe)
            .map_err(String::as_str)
    }

    /// Enqueues `dsts[i] <- srcs[i]` for `sizes[i]` bytes on `s` in one runtime call;
    /// an error when the runtime has no batch call ([`batch_copy`](Self::batch_copy)).
    ///
    /// # Safety
    /// As [`copy_async`](Self::copy_async) for every copy; the slices have one length.
    /// Overlapping copies of one batch land in no given order.
    pub(crate) unsafe fn copy_batch_async(
        &self,
        dsts: &[*mut c_void],
        srcs: &[*const c_void],
        sizes: &[usize],
        s: Stream,
    ) -> Result<(), DeviceError> {
        let call = match &self.batch {
            Ok(call) => call,
            Err(why) => {
                return Err(DeviceError {
                    call: format!("{}MemcpyBatchAsync", self.vendor.prefix()),
                    code: -1,
                    message: why.clone(),
                })
            }
        };
        // SAFETY: forwarded from the caller.
        self.check("MemcpyBatchAsync", unsafe {
            call.call(dsts, srcs, sizes, s)
        })
    }
}

/// The name of a runtime function the library does not export.
struct MissingSymbol(String);

fn resolve(lib: &Library, prefix: &str) -> Result<Api, MissingSymbol> {
    fn sym<T: Copy>(lib: &Library, name: &str) -> Result<T, MissingSymbol> {
        // SAFETY: each symbol is given the signature the vendor documents.
        unsafe {
            lib.get::<T>(name.as_bytes())
                .map(|s| *s)
                .map_err(|_| MissingSymbol(name.to_string()))
        }
    }
    let n = |s: &str| format!("{prefix}{s}");
    Ok(Api {
        get_device_count: sym(lib, &n("GetDeviceCount"))?,
        set_device: sym(lib, &n("SetDevice"))?,
        pointer_get_attributes: sym(lib, &n("PointerGetAttributes"))?,
        memcpy: sym(lib, &n("Memcpy"))?,
        memcpy_async: sym(lib, &n("MemcpyAsync"))?,
        stream_create_with_flags: sym(lib, &n("StreamCreateWithFlags"))?,
        stream_synchronize: sym(lib, &n("StreamSynchronize"))?,
        stream_destroy: sym(lib, &n("StreamDestroy"))?,
        host_alloc: sym(lib, &n("HostAlloc"))?,
        free_host: sym(lib, &n("FreeHost"))?,
        malloc: sym(lib, &n("Malloc"))?,
        free: sym(lib, &n("Free"))?,
        get_error_string: sym(lib, &n("GetErrorString"))?,
        get_last_error: sym(lib, &n("GetLastError"))?,
        device_get_pci_bus_id: sym(lib, &n("DeviceGetPCIBusId")).ok(),
        stream_query: sym(lib, &n("StreamQuery")).ok(),
    })
}

/// Which runtime(s) `MC_GPU_RUNTIME` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// MUSA, then CUDA; one with devices wins.
    Auto,
    /// Only this vendor.
    Only(Vendor),
    /// No GPU runtime: all memory is host memory.
    None,
}

impl Choice {
    /// Parses `MC_GPU_RUNTIME`.
    pub fn parse(v: Option<&str>) -> Result<Self, crate::config::ConfigError> {
        Ok(match v.map(|s| s.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") | Some("auto") => Self::Auto,
            Some("musa") => Self::Only(Vendor::Musa),
            Some("cuda") => Self::Only(Vendor::Cuda),
            Some("none") | Some("off") => Self::None,
            Some(_) => {
                return Err(crate::config::ConfigError {
                    var: "MC_GPU_RUNTIME",
                    value: v.unwrap_or_default().to_string(),
                    expected: "auto, musa, cuda or none".into(),
                })
            }
        })
    }
}

/// Loads the runtime `choice` asks for; the error lists everything tried.
pub fn load(choice: Choice) -> Result<Runtime, Vec<LoadError>> {
    load_with(choice, &|k: &str| std::env::var(k).ok())
}

/// As [`load`], reading variables through `env` (the doctor passes its own).
pub fn load_with(
    choice: Choice,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Runtime, Vec<LoadError>> {
    let sp = loader::site_packages();
    let vendors: &[Vendor] = match choice {
        Choice::None => return Err(Vec::new()),
        Choice::Only(Vendor::Musa) => &[Vendor::Musa],
        Choice::Only(Vendor::Cuda) => &[Vendor::Cuda],
        Choice::Auto => &[Vendor::Musa, Vendor::Cuda],
    };
    let mut errors = Vec::new();
    let mut deviceless = None;
    for &v in vendors {
        match Runtime::load(v, &loader::candidates(v, env, &sp)) {
            Ok(rt) if rt.device_count() > 0 => return Ok(rt),
            Ok(rt) => {
                deviceless.get_or_insert(rt);
            }
            Err(e) => errors.push(e),
        }
    }
    deviceless.ok_or(errors)
}

/// Why no GPU runtime is available.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RuntimeUnavailable {
    /// `MC_GPU_RUNTIME` has a value that is not understood.
    #[error(transparent)]
    BadChoice(#[from] crate::config::ConfigError),
    /// `MC_GPU_RUNTIME=none`.
    #[error("GPU runtimes are disabled (MC_GPU_RUNTIME=none)")]
    Disabled,
    /// No candidate library loaded; each says what was tried and why it failed.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join(". "))]
    NotLoaded(Vec<LoadError>),
}

static RUNTIME: OnceLock<Result<Arc<Runtime>, RuntimeUnavailable>> = OnceLock::new();

/// The process-wide runtime, loaded on first use per `MC_GPU_RUNTIME`.
/// The error says which libraries were tried.
pub fn runtime() -> Result<Arc<Runtime>, RuntimeUnavailable> {
    RUNTIME
        .get_or_init(|| {
            let choice = Choice::parse(std::env::var("MC_GPU_RUNTIME").ok().as_deref())?;
            match load(choice) {
                Ok(rt) => {
                    tracing::info!(
                        "{} runtime loaded from {} ({} device(s))",
                        rt.vendor(),
                        rt.path(),
                        rt.device_count()
                    );
                    Ok(Arc::new(rt))
                }
                Err(errors) if errors.is_empty() => Err(RuntimeUnavailable::Disabled),
                Err(errors) => Err(RuntimeUnavailable::NotLoaded(errors)),
            }
        })
        .clone()
}

/// The device a pointer lives on, if a runtime is loaded and says so.
pub fn device_of(ptr: u64) -> Option<(Vendor, u32)> {
    let rt = runtime().ok()?;
    rt.device_of(ptr).map(|d| (rt.vendor(), d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse() {
        assert_eq!(Vendor::parse_location("cuda:3"), Some((Vendor::Cuda, 3)));
        assert_eq!(Vendor::parse_location("musa:0"), Some((Vendor::Musa, 0)));
        assert_eq!(Vendor::parse_location("cpu:0"), None);
        assert_eq!(Vendor::parse_location("cuda:x"), None);
    }

    #[test]
    fn choice_parses_and_rejects_unknown_values() {
        assert_eq!(Choice::parse(None).unwrap(), Choice::Auto);
        assert_eq!(
            Choice::parse(Some("CUDA")).unwrap(),
            Choice::Only(Vendor::Cuda)
        );
        assert_eq!(Choice::parse(Some("none")).unwrap(), Choice::None);
        assert_eq!(
            Choice::parse(Some("rocm")).unwrap_err().var,
            "MC_GPU_RUNTIME"
        );
    }
}
