//! An open device (`ibv_context`) and what it reports about itself.

use std::ffi::{c_int, CStr};
use std::sync::Arc;

use super::cq::Cq;
use super::ffi;
use super::pd::Pd;
use super::{Verbs, VerbsError};

/// An open RDMA device; closed when the last object using it is dropped.
pub struct Context {
    pub(super) verbs: Arc<Verbs>,
    pub(super) ctx: *mut ffi::ibv_context,
    name: String,
}

// SAFETY: an `ibv_context` may be used from any thread (rdma-core's verbs
// are thread-safe); the pointer is owned and closed once, in `Drop`.
unsafe impl Send for Context {}
// SAFETY: as above; every method calls a thread-safe verb.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("name", &self.name).finish()
    }
}

/// What `ibv_query_device` reports that the engine uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Firmware version text.
    pub fw_ver: String,
    /// Node GUID, host byte order.
    pub node_guid: u64,
    /// Largest memory region, bytes.
    pub max_mr_size: u64,
    /// `vendor_id` (PCI vendor, 0x15b3 for Mellanox).
    pub vendor_id: u32,
    /// `vendor_part_id`.
    pub vendor_part_id: u32,
    /// Queue pairs.
    pub max_qp: i32,
    /// Work requests per queue.
    pub max_qp_wr: i32,
    /// Scatter/gather entries per work request.
    pub max_sge: i32,
    /// Completion queues.
    pub max_cq: i32,
    /// Entries per completion queue.
    pub max_cqe: i32,
    /// Memory regions.
    pub max_mr: i32,
    /// Protection domains.
    pub max_pd: i32,
    /// Outstanding RDMA READs a QP may target (responder).
    pub max_qp_rd_atom: i32,
    /// Outstanding RDMA READs a QP may issue (initiator).
    pub max_qp_init_rd_atom: i32,
    /// Physical ports.
    pub phys_port_cnt: u8,
}

/// A path MTU (`enum ibv_mtu`); ordered, so `min` picks the smaller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes (upstream's `MC_MTU` default).
    #[default]
    Mtu4096 = 5,
}

impl Mtu {
    /// From `enum ibv_mtu`; `None` for a value outside 1..=5.
    pub fn from_raw(raw: u32) -> Option<Self> {
        Some(match raw {
            1 => Self::Mtu256,
            2 => Self::Mtu512,
            3 => Self::Mtu1024,
            4 => Self::Mtu2048,
            5 => Self::Mtu4096,
            _ => return None,
        })
    }

    /// From a byte count (as `MC_MTU` gives it); `None` unless one of the five sizes.
    pub fn from_bytes(bytes: u32) -> Option<Self> {
        Some(match bytes {
            256 => Self::Mtu256,
            512 => Self::Mtu512,
            1024 => Self::Mtu1024,
            2048 => Self::Mtu2048,
            4096 => Self::Mtu4096,
            _ => return None,
        })
    }

    /// The `enum ibv_mtu` value.
    pub fn raw(self) -> u32 {
        self as u32
    }

    /// Bytes.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }
}

/// A port's logical state (`enum ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortState {
    /// `IBV_PORT_NOP`.
    Nop,
    /// `IBV_PORT_DOWN`.
    Down,
    /// `IBV_PORT_INIT`.
    Init,
    /// `IBV_PORT_ARMED`.
    Armed,
    /// `IBV_PORT_ACTIVE`: the only state that moves data.
    Active,
    /// `IBV_PORT_ACTIVE_DEFER`.
    ActiveDefer,
    /// A value this crate does not name.
    Other(u32),
}

impl PortState {
    /// From `enum ibv_port_state`.
    pub fn from_raw(raw: u32) -> Self {
        match raw {
            ffi::IBV_PORT_NOP => Self::Nop,
            ffi::IBV_PORT_DOWN => Self::Down,
            ffi::IBV_PORT_INIT => Self::Init,
            ffi::IBV_PORT_ARMED => Self::Armed,
            ffi::IBV_PORT_ACTIVE => Self::Active,
            ffi::IBV_PORT_ACTIVE_DEFER => Self::ActiveDefer,
            other => Self::Other(other),
        }
    }
}

/// A port's link layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// `IBV_LINK_LAYER_UNSPECIFIED` (old drivers; InfiniBand).
    Unspecified,
    /// `IBV_LINK_LAYER_INFINIBAND`.
    InfiniBand,
    /// `IBV_LINK_LAYER_ETHERNET` (RoCE).
    Ethernet,
    /// A value this crate does not name.
    Other(u8),
}

impl LinkLayer {
    /// From the `link_layer` byte.
    pub fn from_raw(raw: u8) -> Self {
        match raw {
            ffi::IBV_LINK_LAYER_UNSPECIFIED => Self::Unspecified,
            ffi::IBV_LINK_LAYER_INFINIBAND => Self::InfiniBand,
            ffi::IBV_LINK_LAYER_ETHERNET => Self::Ethernet,
            other => Self::Other(other),
        }
    }
}

/// What `ibv_query_port` reports that the engine uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// Logical state.
    pub state: PortState,
    /// Local identifier (0 on RoCE).
    pub lid: u16,
    /// Active MTU; `None` if the device reported a value outside `enum ibv_mtu`.
    pub active_mtu: Option<Mtu>,
    /// Largest MTU the port supports.
    pub max_mtu: Option<Mtu>,
    /// InfiniBand or Ethernet (RoCE).
    pub link_layer: LinkLayer,
    /// Entries in the GID table.
    pub gid_tbl_len: i32,
}

/// Room for `ibv_port_attr` and whatever a newer library appends, so a
/// library that writes more than v44's struct cannot overrun.
#[repr(C)]
struct PortAttrSpace {
    attr: ffi::ibv_port_attr,
    _room: [u8; 128],
}

impl Context {
    pub(super) fn new(verbs: Arc<Verbs>, ctx: *mut ffi::ibv_context, name: String) -> Self {
        Self { verbs, ctx, name }
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The loaded library.
    pub fn verbs(&self) -> &Arc<Verbs> {
        &self.verbs
    }

    /// The raw `ibv_context` (valid while `self` lives).
    pub fn as_raw(&self) -> *mut ffi::ibv_context {
        self.ctx
    }

    /// Device capabilities.
    pub fn query_device(&self) -> Result<DeviceAttr, VerbsError> {
        // SAFETY: all-integer struct; zero is valid.
        let mut a: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context; `a` is a valid out-pointer of the right layout.
        let rc = unsafe { (self.verbs.api.query_device)(self.ctx, &mut a) };
        if rc != 0 {
            return Err(VerbsError::from_rc("ibv_query_device", rc));
        }
        let fw = a.fw_ver.map(|c| c as u8);
        let fw_ver = CStr::from_bytes_until_nul(&fw)
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| String::from_utf8_lossy(&fw).into_owned());
        Ok(DeviceAttr {
            fw_ver,
            node_guid: u64::from_be(a.node_guid),
            max_mr_size: a.max_mr_size,
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
            max_qp: a.max_qp,
            max_qp_wr: a.max_qp_wr,
            max_sge: a.max_sge,
            max_cq: a.max_cq,
            max_cqe: a.max_cqe,
            max_mr: a.max_mr,
            max_pd: a.max_pd,
            max_qp_rd_atom: a.max_qp_rd_atom,
            max_qp_init_rd_atom: a.max_qp_init_rd_atom,
            phys_port_cnt: a.phys_port_cnt,
        })
    }

    /// Port `port` (1-based).
    pub fn query_port(&self, port: u8) -> Result<PortAttr, VerbsError> {
        // SAFETY: all-integer struct; zero is valid and is what the header's
        // inline wrapper passes to the exported symbol.
        let mut space: PortAttrSpace = unsafe { std::mem::zeroed() };
        // SAFETY: live context; `space` is larger than any `ibv_port_attr`.
        let rc = unsafe { (self.verbs.api.query_port)(self.ctx, port, &mut space.attr) };
        if rc != 0 {
            return Err(VerbsError::from_rc("ibv_query_port", rc));
        }
        let a = space.attr;
        Ok(PortAttr {
            state: PortState::from_raw(a.state),
            lid: a.lid,
            active_mtu: Mtu::from_raw(a.active_mtu),
            max_mtu: Mtu::from_raw(a.max_mtu),
            link_layer: LinkLayer::from_raw(a.link_layer),
            gid_tbl_len: a.gid_tbl_len,
        })
    }

    /// GID `index` of port `port`, as 16 bytes in network order.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<[u8; 16], VerbsError> {
        let index = c_int::try_from(index).map_err(|_| VerbsError::Invalid {
            verb: "ibv_query_gid",
            what: format!("GID index {index} is out of range"),
        })?;
        let mut gid = ffi::ibv_gid { raw: [0; 16] };
        // SAFETY: live context; `gid` is a valid out-pointer.
        let rc = unsafe { (self.verbs.api.query_gid)(self.ctx, port, index, &mut gid) };
        if rc != 0 {
            return Err(VerbsError::from_rc("ibv_query_gid", rc));
        }
        // SAFETY: every bit pattern of the union is a valid byte array.
        Ok(unsafe { gid.raw })
    }

    /// A new protection domain.
    pub fn alloc_pd(self: &Arc<Self>) -> Result<Arc<Pd>, VerbsError> {
        // SAFETY: live context.
        let pd = unsafe { (self.verbs.api.alloc_pd)(self.ctx) };
        if pd.is_null() {
            return Err(VerbsError::from_errno("ibv_alloc_pd"));
        }
        Ok(Arc::new(Pd::new(self.clone(), pd)))
    }

    /// A new completion queue of at least `cqe` entries (no completion
    /// channel: it is polled), on completion vector 0.
    pub fn create_cq(self: &Arc<Self>, cqe: u32) -> Result<Arc<Cq>, VerbsError> {
        let n = c_int::try_from(cqe).map_err(|_| VerbsError::Invalid {
            verb: "ibv_create_cq",
            what: format!("{cqe} entries is more than a CQ can hold"),
        })?;
        // SAFETY: live context; null cq_context and channel are allowed.
        let cq = unsafe {
            (self.verbs.api.create_cq)(self.ctx, n, std::ptr::null_mut(), std::ptr::null_mut(), 0)
        };
        if cq.is_null() {
            return Err(VerbsError::from_errno("ibv_create_cq"));
        }
        Ok(Arc::new(Cq::new(self.clone(), cq)))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every child holds an Arc of this context, so none is left;
        // the context is closed once.
        let rc = unsafe { (self.verbs.api.close_device)(self.ctx) };
        if rc != 0 {
            tracing::warn!(
                "ibv_close_device({}) failed: {}",
                self.name,
                VerbsError::from_rc("ibv_close_device", rc)
            );
        }
    }
}
