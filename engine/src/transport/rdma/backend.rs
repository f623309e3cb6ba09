//! The narrow slice of verbs the RDMA transport uses, as traits: one [`Nic`] per HCA
//! (its protection domain, completion queue and port), and its RC [`QueuePair`]s.
//!
//! Two implementations: the real one over the run-time loaded verbs, and an in-process
//! fake ([`super::fake`]) for the unit tests of slicing, striping, retries and failover.

use std::sync::Arc;

use crate::device::dmabuf::DmaBuf;
pub use crate::error::FailedCompletion;
use crate::memory::Lease;
pub use crate::wire::rdma::Gid;

/// A verbs call that failed, with the call and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BackendError(pub String);

/// What a peer needs to address a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortInfo {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// The GID at the chosen index.
    pub gid: Gid,
    /// The chosen GID index.
    pub gid_index: u8,
    /// Active MTU in bytes.
    pub mtu: u32,
}

/// One memory registration on one HCA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrKeys {
    /// Key for local access (the SGE of our work requests).
    pub lkey: u32,
    /// Key peers use to reach the memory.
    pub rkey: u32,
    /// The backend's handle for [`Nic::deregister`].
    pub handle: u64,
}

/// The remote end of one RC queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteQp {
    /// Its number.
    pub qp_num: u32,
    /// Its port's LID.
    pub lid: u16,
    /// Its port's GID.
    pub gid: Gid,
}

/// RDMA operation of a work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdmaOp {
    /// Local to remote.
    Write,
    /// Remote to local.
    Read,
}

/// One signaled RDMA WRITE or READ with one SGE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkRequest {
    /// Returned in its completion.
    pub wr_id: u64,
    /// Write or read.
    pub op: RdmaOp,
    /// Local address.
    pub local: u64,
    /// Bytes.
    pub len: u32,
    /// Local key of the registration holding `[local, local+len)`.
    pub lkey: u32,
    /// Remote address.
    pub remote: u64,
    /// Remote key.
    pub rkey: u32,
}

/// How a work request ended (the `ibv_wc_status` values the transport tells apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcStatus {
    /// Done.
    Success,
    /// The peer refused the remote range or key (`IBV_WC_REM_ACCESS_ERR`).
    RemoteAccess,
    /// No answer from the peer's port after the retries (`IBV_WC_RETRY_EXC_ERR`).
    RetryExceeded,
    /// The queue pair was in error: the request never ran (`IBV_WC_WR_FLUSH_ERR`).
    Flushed,
    /// Any other failure status, as the HCA reported it.
    Other(FailedCompletion),
}

/// One completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
}

/// One HCA: a context, a protection domain, one completion queue, one port.
pub trait Nic: Send + Sync {
    /// HCA name (`mlx5_0`).
    fn name(&self) -> &str;

    /// The port and GID the transport uses.
    fn port(&self) -> PortInfo;

    /// Registers the leased region for local write and remote read and write. The
    /// backend keeps `lease` with the registration until
    /// [`deregister`](Self::deregister) has undone it: the HCA (ours for local keys, a
    /// peer's for the remote key) may access the range until then, and the lease is what
    /// keeps the range lent memory for as long.
    fn register(&self, lease: Lease) -> Result<MrKeys, BackendError>;

    /// Registers the leased region through `buf`, the dma-buf the GPU driver exported
    /// for it (device memory; `ibv_reg_dmabuf_mr`), addressed at the region's address by
    /// work requests and peers. `buf` must have been exported for exactly the leased
    /// range (an error otherwise); the lease is kept as by [`register`](Self::register).
    /// The default: not supported by this backend.
    fn register_dmabuf(&self, lease: Lease, buf: &DmaBuf) -> Result<MrKeys, BackendError> {
        let _ = (lease, buf);
        Err(BackendError("dma-buf registration is not supported".into()))
    }

    /// Deregisters; once this returns the HCA no longer accesses the range and peers'
    /// requests with its remote key fail with a remote access error.
    fn deregister(&self, keys: MrKeys);

    /// A new RC queue pair (RESET) on this HCA's completion queue, `max_wr` deep.
    fn create_qp(&self, max_wr: u32) -> Result<Arc<dyn QueuePair>, BackendError>;

    /// Moves up to `max` completions into `out`.
    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> Result<(), BackendError>;
}

/// One RC queue pair.
pub trait QueuePair: Send + Sync {
    /// Its number.
    fn qp_num(&self) -> u32;

    /// RESET → INIT → RTR → RTS towards `remote`.
    fn connect(&self, remote: &RemoteQp) -> Result<(), BackendError>;

    /// Posts one signaled work request.
    ///
    /// Whatever its fields, a request reaches only registered memory: one whose local
    /// range is not inside a live registration of `wr.lkey` on this queue pair's HCA fails
    /// (refused here, or with an error completion) without touching memory, and a peer's
    /// HCA checks the remote range against its remote key the same way. Registrations
    /// hold their region's [`Lease`] until deregistered, and deregistering stops the HCA
    /// first, so no request reaches memory that is not lent to it. (The transport still
    /// holds the slice until the completion is polled: that is the engine's memory
    /// contract, not this call's.)
    fn post(&self, wr: &WorkRequest) -> Result<(), BackendError>;

    /// Moves the queue pair to ERROR: every outstanding request completes as
    /// [`WcStatus::Flushed`] and none touches memory any more.
    fn to_error(&self);
}

impl std::fmt::Debug for dyn QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QueuePair({})", self.qp_num())
    }
}
