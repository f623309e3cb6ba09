//! RDMA verbs (rdma-core's libibverbs), loaded at run time with libloading
//! and never linked, so the engine starts and imports on hosts without
//! rdma-core; RDMA is then unavailable with the reason kept
//! ([`VerbsUnavailable`]).
//!
//! Struct layouts and constants are Rust definitions in [`ffi`] (checked
//! against the real headers by `engine/tests/verbs_layout.rs`). The
//! exported control-path verbs are resolved by [`loader`]; the verbs C
//! defines inline (`ibv_post_send`, `ibv_poll_cq`) go through the context's
//! `ops` table as the headers do.
//!
//! Ownership follows the verbs object tree: every object holds an `Arc` of
//! its parent ([`Mr`] → [`Pd`] → [`Context`] → [`Verbs`]; [`Qp`] → its
//! `Pd` and CQs; [`Cq`] → `Context`), so a parent is destroyed after its
//! children whatever order the caller drops them in, and the library stays
//! loaded while any object lives.
//!
//! Thread safety: libibverbs and its providers are thread-safe (rdma-core's
//! documented contract: every verb may be called from any thread; a
//! provider serialises posts to one QP and polls of one CQ with its own
//! locks). The wrappers are therefore `Send + Sync` and add no locking.
//! What callers must still do themselves is keep the memory behind posted
//! work requests and registered regions valid (the `unsafe` methods say
//! so).
//!
//! Typical use (setting up one RC connection; the peer does the same):
//! ```no_run
//! use transfer_engine::verbs::{Verbs, QpCaps, RtrAttr, RtsAttr, access};
//! let verbs = Verbs::load()?;
//! let dev = verbs.devices()?.remove(0);
//! let ctx = verbs.open(&dev.name)?;
//! let port = ctx.query_port(1)?;
//! let gid = ctx.query_gid(1, 1)?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(256)?;
//! let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default())?;
//! qp.to_init(1, 0, access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE)?;
//! # let (peer_qpn, peer_gid) = (0u32, [0u8; 16]);
//! qp.to_rtr(&RtrAttr { dest_qp_num: peer_qpn, dgid: peer_gid, sgid_index: 1,
//!     path_mtu: port.active_mtu.unwrap_or_default(), ..RtrAttr::default() })?;
//! qp.to_rts(&RtsAttr::default())?;
//! # let _ = gid;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod ffi;
pub mod loader;

mod context;
mod cq;
mod pd;
mod qp;

use std::ffi::{c_int, CStr};
use std::sync::{Arc, OnceLock};

use libloading::os::unix::Library;

pub use context::{Context, DeviceAttr, LinkLayer, Mtu, PortAttr, PortState};
pub use cq::{Completion, Cq, WcOpcode, WcStatus};
pub use pd::{Mr, Pd};
pub use qp::{BatchPostError, Qp, QpCaps, RtrAttr, RtsAttr, SendWr, WrOp};

/// Memory-region and QP access flags (`IBV_ACCESS_*`), to be or-ed.
pub mod access {
    /// `IBV_ACCESS_LOCAL_WRITE`.
    pub const LOCAL_WRITE: u32 = super::ffi::IBV_ACCESS_LOCAL_WRITE;
    /// `IBV_ACCESS_REMOTE_WRITE`.
    pub const REMOTE_WRITE: u32 = super::ffi::IBV_ACCESS_REMOTE_WRITE;
    /// `IBV_ACCESS_REMOTE_READ`.
    pub const REMOTE_READ: u32 = super::ffi::IBV_ACCESS_REMOTE_READ;
    /// `IBV_ACCESS_REMOTE_ATOMIC`.
    pub const REMOTE_ATOMIC: u32 = super::ffi::IBV_ACCESS_REMOTE_ATOMIC;
    /// `IBV_ACCESS_RELAXED_ORDERING` (optional: needs `ibv_reg_mr_iova2`,
    /// and a kernel that does not know it ignores it).
    pub const RELAXED_ORDERING: u32 = super::ffi::IBV_ACCESS_RELAXED_ORDERING;
}

/// Why RDMA cannot be used on this host: an ordinary value, kept and shown
/// by whoever falls back to TCP or fails `MC_FORCE_HCA=1`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerbsUnavailable {
    /// No candidate library could be opened.
    #[error(
        "RDMA unavailable: no verbs library could be loaded (tried {}); install rdma-core's \
         libibverbs1 or point MC_IBVERBS_PATH at libibverbs.so.1",
        format_tried(.tried)
    )]
    NotLoaded {
        /// Every candidate with why it failed (`dlerror` text).
        tried: Vec<(String, String)>,
    },
    /// The library opened but lacks a verb the engine needs.
    #[error("RDMA unavailable: {path} has no symbol {symbol} (not a usable libibverbs)")]
    MissingSymbol {
        /// The library opened.
        path: String,
        /// `name@VERSION`.
        symbol: String,
    },
    /// `ibv_get_device_list` failed with `ENOSYS`.
    #[error(
        "RDMA unavailable: the kernel has no RDMA support (no /sys/class/infiniband; \
         ibv_get_device_list in {path} failed with ENOSYS)"
    )]
    NoKernelSupport {
        /// The library opened.
        path: String,
    },
    /// `ibv_get_device_list` failed otherwise.
    #[error("RDMA unavailable: ibv_get_device_list in {path} failed: {message} (errno {errno})")]
    ListFailed {
        /// The library opened.
        path: String,
        /// `errno`.
        errno: i32,
        /// Its text.
        message: String,
    },
    /// The library lists no device.
    #[error("RDMA unavailable: no RDMA device ({path} lists none)")]
    NoDevice {
        /// The library opened.
        path: String,
    },
}

fn format_tried(tried: &[(String, String)]) -> String {
    tried
        .iter()
        .map(|(c, why)| format!("{c}: {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// A verb that failed, or RDMA that is not there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerbsError {
    /// RDMA cannot be used at all.
    #[error(transparent)]
    Unavailable(#[from] VerbsUnavailable),
    /// A verb returned an error.
    #[error("{verb} failed: {message} (errno {errno})")]
    Failed {
        /// The verb (`ibv_reg_mr`, `ibv_modify_qp(RTR)`, ...).
        verb: &'static str,
        /// The errno it reported.
        errno: i32,
        /// `strerror(errno)`.
        message: String,
    },
    /// No device has this name.
    #[error("no RDMA device named {name}; devices: {}", .available.join(", "))]
    NoSuchDevice {
        /// The name asked for.
        name: String,
        /// The devices that exist.
        available: Vec<String>,
    },
    /// An argument was refused before calling the library.
    #[error("{verb}: {what}")]
    Invalid {
        /// The verb.
        verb: &'static str,
        /// What was wrong.
        what: String,
    },
    /// The loaded library (or its provider) does not offer this verb.
    #[error("{verb} is not supported by {path}")]
    NotSupported {
        /// The verb.
        verb: &'static str,
        /// The library.
        path: String,
    },
}

impl VerbsError {
    /// The error for `verb` from an errno value.
    pub(crate) fn failed(verb: &'static str, errno: i32) -> Self {
        Self::Failed {
            verb,
            errno,
            message: std::io::Error::from_raw_os_error(errno).to_string(),
        }
    }

    /// The error for `verb` from the thread's `errno` (verbs returning NULL or -1).
    pub(crate) fn from_errno(verb: &'static str) -> Self {
        Self::failed(
            verb,
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        )
    }

    /// The error for `verb` from a nonzero return code: rdma-core returns
    /// the errno itself, except a few verbs that return -1 and set errno.
    pub(crate) fn from_rc(verb: &'static str, rc: c_int) -> Self {
        if rc > 0 {
            Self::failed(verb, rc)
        } else {
            Self::from_errno(verb)
        }
    }
}

/// An RDMA device as `ibv_get_device_list` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The kernel name (`mlx5_0`).
    pub name: String,
    /// Node GUID, host byte order.
    pub guid: u64,
    /// `IBV_NODE_*` ([`ffi::IBV_NODE_CA`] for an HCA, [`ffi::IBV_NODE_RNIC`] for iWARP).
    pub node_type: i32,
    /// `IBV_TRANSPORT_*` ([`ffi::IBV_TRANSPORT_IB`] for IB and RoCE).
    pub transport_type: i32,
}

/// The loaded verbs library.
pub struct Verbs {
    path: String,
    api: loader::Api,
    _lib: Library,
}

// SAFETY: `Verbs` holds function pointers into a library that stays loaded
// as long as the value; libibverbs' exported verbs are thread-safe.
unsafe impl Send for Verbs {}
// SAFETY: as above; no interior state on the Rust side.
unsafe impl Sync for Verbs {}

impl std::fmt::Debug for Verbs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verbs").field("path", &self.path).finish()
    }
}

impl Verbs {
    /// Loads the library `MC_IBVERBS_PATH` names, or the system's
    /// `libibverbs.so.1`. Each call opens it anew (`dlopen` counts
    /// references); [`shared`] keeps one per process.
    pub fn load() -> Result<Arc<Self>, VerbsUnavailable> {
        let env = |k: &str| std::env::var(k).ok();
        Self::load_from(&loader::candidates(&env))
    }

    /// Loads the first of `candidates` (names for the loader's search, or paths).
    pub fn load_from(candidates: &[String]) -> Result<Arc<Self>, VerbsUnavailable> {
        let (lib, path) = loader::open_first(candidates)
            .map_err(|tried| VerbsUnavailable::NotLoaded { tried })?;
        let (lib, api) = loader::resolve(lib);
        let api = api.map_err(|symbol| VerbsUnavailable::MissingSymbol {
            path: path.clone(),
            symbol,
        })?;
        Ok(Arc::new(Self {
            path,
            api,
            _lib: lib,
        }))
    }

    /// The library file (or name) that was opened.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Whether `ibv_reg_dmabuf_mr` (rdma-core v34+) is there.
    pub fn has_dmabuf(&self) -> bool {
        self.api.reg_dmabuf_mr.is_some()
    }

    /// The library's text for a completion status (`ibv_wc_status_str`),
    /// or this crate's name for it when the library lacks the function.
    pub fn wc_status_str(&self, raw: u32) -> String {
        if let Some(f) = self.api.wc_status_str {
            // SAFETY: returns a static string for any value ("unknown" when out of range).
            let p = unsafe { f(raw) };
            if !p.is_null() {
                // SAFETY: NUL-terminated static string.
                return unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
            }
        }
        WcStatus::from_raw(raw).to_string()
    }

    /// The RDMA devices. No kernel support and no device are
    /// [`VerbsError::Unavailable`] with the reason.
    pub fn devices(&self) -> Result<Vec<DeviceInfo>, VerbsError> {
        let list = self.device_list()?;
        Ok(list.iter().map(|&d| self.info(d)).collect())
    }

    /// Opens the device named `name`.
    pub fn open(self: &Arc<Self>, name: &str) -> Result<Arc<Context>, VerbsError> {
        let list = self.device_list()?;
        let Some(&dev) = list.iter().find(|&&d| self.device_name(d) == name) else {
            return Err(VerbsError::NoSuchDevice {
                name: name.into(),
                available: list.iter().map(|&d| self.device_name(d)).collect(),
            });
        };
        // SAFETY: `dev` is an entry of a live device list; rdma-core keeps
        // the device alive for the context after the list is freed.
        let ctx = unsafe { (self.api.open_device)(dev) };
        if ctx.is_null() {
            return Err(VerbsError::from_errno("ibv_open_device"));
        }
        Ok(Arc::new(Context::new(self.clone(), ctx, name.into())))
    }

    fn device_list(&self) -> Result<DeviceList<'_>, VerbsError> {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        let list = unsafe { (self.api.get_device_list)(&mut n) };
        if list.is_null() {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            let path = self.path.clone();
            return Err(if errno == libc::ENOSYS {
                VerbsUnavailable::NoKernelSupport { path }
            } else {
                VerbsUnavailable::ListFailed {
                    path,
                    errno,
                    message: std::io::Error::from_raw_os_error(errno).to_string(),
                }
            }
            .into());
        }
        let list = DeviceList {
            verbs: self,
            list,
            n: n.max(0) as usize,
        };
        if list.n == 0 {
            return Err(VerbsUnavailable::NoDevice {
                path: self.path.clone(),
            }
            .into());
        }
        Ok(list)
    }

    fn device_name(&self, dev: *mut ffi::ibv_device) -> String {
        // SAFETY: `dev` is an entry of a live device list; the name is a
        // NUL-terminated string inside it.
        unsafe {
            let p = (self.api.get_device_name)(dev);
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        }
    }

    fn info(&self, dev: *mut ffi::ibv_device) -> DeviceInfo {
        // SAFETY: `dev` is an entry of a live device list; `ibv_device`'s
        // layout is checked against the header.
        let (guid, node_type, transport_type) = unsafe {
            (
                u64::from_be((self.api.get_device_guid)(dev)),
                (*dev).node_type,
                (*dev).transport_type,
            )
        };
        DeviceInfo {
            name: self.device_name(dev),
            guid,
            node_type,
            transport_type,
        }
    }
}

/// A device list, freed on drop.
struct DeviceList<'a> {
    verbs: &'a Verbs,
    list: *mut *mut ffi::ibv_device,
    n: usize,
}

impl DeviceList<'_> {
    fn iter(&self) -> impl Iterator<Item = &*mut ffi::ibv_device> {
        // SAFETY: `ibv_get_device_list` returned `n` entries (plus a NULL).
        unsafe { std::slice::from_raw_parts(self.list, self.n) }.iter()
    }
}

impl Drop for DeviceList<'_> {
    fn drop(&mut self) {
        // SAFETY: the list came from `ibv_get_device_list` and is freed once.
        unsafe { (self.verbs.api.free_device_list)(self.list) };
    }
}

static SHARED: OnceLock<Result<Arc<Verbs>, VerbsUnavailable>> = OnceLock::new();

/// The process-wide verbs library, loaded on first use per `MC_IBVERBS_PATH`;
/// the outcome (library or reason) is kept for the life of the process.
pub fn shared() -> Result<Arc<Verbs>, VerbsUnavailable> {
    SHARED.get_or_init(Verbs::load).clone()
}
