//! The real backend: [`Nic`] and [`QueuePair`] over the run-time loaded verbs
//! ([`crate::verbs`]). One context, protection domain and completion queue per HCA.
//!
//! The trait's methods are safe; this adapter meets the contracts of the verbs calls
//! beneath them. A memory region is registered over a [`Lease`] of a registered region
//! and keeps it until `ibv_dereg_mr` has returned, so the range stays lent memory while
//! the HCA may reach it; a work request is posted only when its local range lies inside
//! a live registration of its local key, checked under the lock that deregistration takes.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::backend::{
    BackendError, Completion, MrKeys, Nic, PortInfo, QueuePair, RdmaOp, RemoteQp, WcStatus,
    WorkRequest,
};
use super::RdmaParams;
use crate::device::dmabuf::DmaBuf;
use crate::error::FailedCompletion;
use crate::memory::Lease;
use crate::verbs::{
    access, Context, Cq, Mr, Mtu, Pd, Qp, QpCaps, RtrAttr, RtsAttr, SendWr, Verbs, WrOp,
};

/// An HCA to use, as topology discovery chose it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaSpec {
    /// Device name (`mlx5_0`).
    pub name: String,
    /// Port (`MC_IB_PORT`, 1).
    pub port: u8,
    /// GID index (`MC_GID_INDEX`, or the one discovery ranked first).
    pub gid_index: u8,
}

/// One HCA opened through verbs.
pub struct VerbsNic {
    name: String,
    port_num: u8,
    port: PortInfo,
    path_mtu: Mtu,
    max_wr: u32,
    pd: Arc<Pd>,
    cq: Arc<Cq>,
    /// The live registrations; the queue pairs check their requests against them.
    mrs: Registrations,
    next_mr: AtomicU64,
    // Destroyed last (field order): the context outlives its objects anyway (they hold
    // `Arc`s of it), this keeps it named.
    _ctx: Arc<Context>,
}

/// The live registrations of one HCA, by local key (unique among an HCA's live memory
/// regions).
type Registrations = Arc<Mutex<HashMap<u32, Registration>>>;

/// One live registration; dropping it deregisters the region, then gives its lease back.
struct Registration {
    /// The [`MrKeys::handle`] it was handed out under.
    handle: u64,
    /// Dropped first (field order): `ibv_dereg_mr` returns once the HCA no longer
    /// accesses the range.
    mr: Mr,
    /// Keeps the range lent memory until then.
    _lease: Lease,
}

impl std::fmt::Debug for VerbsNic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsNic")
            .field("name", &self.name)
            .finish()
    }
}

impl VerbsNic {
    /// Opens `hca`: its context, a protection domain and a completion queue of
    /// `params.max_cqe` entries; checks its port is active.
    pub fn open(verbs: &Arc<Verbs>, hca: &HcaSpec, params: &RdmaParams) -> Result<Self, String> {
        let what = |step: &str| {
            let name = hca.name.clone();
            let step = step.to_string();
            move |e: crate::verbs::VerbsError| format!("{name}: {step}: {e}")
        };
        let ctx = verbs.open(&hca.name).map_err(what("open"))?;
        let attr = ctx
            .query_port(hca.port)
            .map_err(what(&format!("port {}", hca.port)))?;
        if attr.state != crate::verbs::PortState::Active {
            return Err(format!(
                "{}: port {} is {:?}, not ACTIVE (MC_IB_PORT)",
                hca.name, hca.port, attr.state
            ));
        }
        let gid = ctx
            .query_gid(hca.port, u32::from(hca.gid_index))
            .map_err(what(&format!("GID index {} (MC_GID_INDEX)", hca.gid_index)))?;
        if gid == [0; 16] {
            return Err(format!(
                "{}: GID index {} of port {} is empty (MC_GID_INDEX)",
                hca.name, hca.gid_index, hca.port
            ));
        }
        let cap = Mtu::from_bytes(params.mtu).unwrap_or_default();
        let path_mtu = attr.active_mtu.map_or(cap, |m| m.min(cap));
        let pd = ctx.alloc_pd().map_err(what("protection domain"))?;
        let cqe = u32::try_from(params.max_cqe).unwrap_or(u32::MAX);
        let cq = ctx.create_cq(cqe).map_err(what("completion queue"))?;
        Ok(Self {
            name: hca.name.clone(),
            port_num: hca.port,
            port: PortInfo {
                lid: attr.lid,
                gid,
                gid_index: hca.gid_index,
                mtu: path_mtu.bytes(),
            },
            path_mtu,
            max_wr: u32::try_from(params.max_wr).unwrap_or(u32::MAX),
            pd,
            cq,
            mrs: Arc::new(Mutex::new(HashMap::new())),
            next_mr: AtomicU64::new(1),
            _ctx: ctx,
        })
    }
}

impl VerbsNic {
    /// Keeps `mr`, with the lease of its range, until its keys are deregistered.
    fn keep(&self, mr: Mr, lease: Lease) -> Result<MrKeys, BackendError> {
        let handle = self.next_mr.fetch_add(1, Ordering::Relaxed);
        let keys = MrKeys {
            lkey: mr.lkey(),
            rkey: mr.rkey(),
            handle,
        };
        let reg = Registration {
            handle,
            mr,
            _lease: lease,
        };
        let mut mrs = self.mrs.lock();
        if mrs.contains_key(&keys.lkey) {
            drop(mrs);
            // Deregistered again outside the lock: `ibv_dereg_mr` may wait for the HCA.
            drop(reg);
            return Err(BackendError(format!(
                "{}: the new memory region's local key {:#x} is a live one's",
                self.name, keys.lkey
            )));
        }
        mrs.insert(keys.lkey, reg);
        Ok(keys)
    }
}

/// Local write for our READs, remote read and write for peers.
const MR_ACCESS: u32 = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;

impl Nic for VerbsNic {
    fn name(&self) -> &str {
        &self.name
    }

    fn port(&self) -> PortInfo {
        self.port
    }

    fn register(&self, lease: Lease) -> Result<MrKeys, BackendError> {
        let len =
            usize::try_from(lease.len()).map_err(|_| BackendError("length too large".into()))?;
        // SAFETY: `reg_mr` asks for memory of this process that stays mapped until the `Mr`
        // is dropped, and that nothing relies on while peers may write it. The range is a
        // registered region under `lease`, which keeps it lent (mapped, never freed) for
        // as long as the lease lives (`memory::Lease`); `keep` stores the lease with the
        // `Mr`, and a `Registration` drops its `Mr` first. Its registrant lent it for peers
        // to read and write: no Rust reference covers registered memory.
        let mr = unsafe { self.pd.reg_mr(lease.addr(), len, MR_ACCESS) }
            .map_err(|e| BackendError(e.to_string()))?;
        self.keep(mr, lease)
    }

    fn register_dmabuf(&self, lease: Lease, buf: &DmaBuf) -> Result<MrKeys, BackendError> {
        if (buf.addr(), buf.len()) != (lease.addr(), lease.len()) {
            return Err(BackendError(format!(
                "the dma-buf was exported for {:#x}+{}, not for the region {:#x}+{}",
                buf.addr(),
                buf.len(),
                lease.addr(),
                lease.len()
            )));
        }
        let len =
            usize::try_from(lease.len()).map_err(|_| BackendError("length too large".into()))?;
        // SAFETY: `reg_dmabuf_mr` asks for a dma-buf that covers `offset..offset+len` and
        // stays exported until the `Mr` is dropped. Only `dmabuf::export` makes a `DmaBuf`:
        // the driver's dma-buf of the whole allocation holding the range it was exported
        // for, which lies at `offset()..offset()+len` in it; that range is the leased
        // region (checked above), registered at its own address as the iova. The fd is
        // open for the call (borrowed from `buf`); the memory region holds its own
        // reference to the dma-buf from then on, and the memory behind it stays allocated
        // while the lease lives, kept with the `Mr` as in `register`.
        let mr = unsafe {
            self.pd.reg_dmabuf_mr(
                buf.offset(),
                len,
                lease.addr(),
                buf.fd().as_raw_fd(),
                MR_ACCESS,
            )
        }
        .map_err(|e| BackendError(e.to_string()))?;
        self.keep(mr, lease)
    }

    fn deregister(&self, keys: MrKeys) {
        let reg = {
            let mut mrs = self.mrs.lock();
            match mrs.get(&keys.lkey) {
                Some(r) if r.handle == keys.handle => mrs.remove(&keys.lkey),
                _ => None,
            }
        };
        // Dropped outside the lock: `ibv_dereg_mr` may wait for the HCA. The lease goes
        // back after it.
        drop(reg);
    }

    fn create_qp(&self, max_wr: u32) -> Result<Arc<dyn QueuePair>, BackendError> {
        let depth = max_wr.min(self.max_wr.max(1));
        let caps = QpCaps {
            max_send_wr: depth,
            max_recv_wr: depth,
            ..QpCaps::default()
        };
        let qp = self
            .pd
            .create_rc_qp(&self.cq, &self.cq, caps)
            .map_err(|e| BackendError(e.to_string()))?;
        Ok(Arc::new(VerbsQp {
            qp,
            port: self.port_num,
            gid_index: self.port.gid_index,
            path_mtu: self.path_mtu,
            mrs: self.mrs.clone(),
        }))
    }

    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> Result<(), BackendError> {
        let mut wcs = [crate::verbs::Completion::default(); 64];
        let want = max.min(wcs.len());
        let Some(room) = wcs.get_mut(..want) else {
            return Ok(());
        };
        let n = self
            .cq
            .poll(room)
            .map_err(|e| BackendError(e.to_string()))?;
        for wc in room.iter().take(n) {
            use crate::verbs::WcStatus as S;
            let status = match wc.status {
                S::Success => WcStatus::Success,
                S::RemAccessErr => WcStatus::RemoteAccess,
                S::RetryExcErr => WcStatus::RetryExceeded,
                S::WrFlushErr => WcStatus::Flushed,
                other => WcStatus::Other(FailedCompletion {
                    status: other,
                    raw: wc.status_raw,
                    vendor_err: wc.vendor_err,
                }),
            };
            out.push(Completion {
                wr_id: wc.wr_id,
                status,
            });
        }
        Ok(())
    }
}

/// One RC queue pair over verbs.
struct VerbsQp {
    qp: Arc<Qp>,
    port: u8,
    gid_index: u8,
    path_mtu: Mtu,
    /// Its HCA's live registrations (of the protection domain the queue pair is in).
    mrs: Registrations,
}

impl QueuePair for VerbsQp {
    fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    fn connect(&self, remote: &RemoteQp) -> Result<(), BackendError> {
        let err = |e: crate::verbs::VerbsError| BackendError(e.to_string());
        self.qp
            .to_init(
                self.port,
                0,
                access::LOCAL_WRITE
                    | access::REMOTE_READ
                    | access::REMOTE_WRITE
                    | access::REMOTE_ATOMIC,
            )
            .map_err(err)?;
        self.qp
            .to_rtr(&RtrAttr {
                path_mtu: self.path_mtu,
                dest_qp_num: remote.qp_num,
                dgid: remote.gid,
                sgid_index: self.gid_index,
                dlid: remote.lid,
                port_num: self.port,
                ..RtrAttr::default()
            })
            .map_err(err)?;
        self.qp.to_rts(&RtsAttr::default()).map_err(err)
    }

    fn post(&self, wr: &WorkRequest) -> Result<(), BackendError> {
        let send = SendWr {
            wr_id: wr.wr_id,
            op: match wr.op {
                RdmaOp::Write => WrOp::Write,
                RdmaOp::Read => WrOp::Read,
            },
            local_addr: wr.local,
            len: wr.len,
            lkey: wr.lkey,
            remote_addr: wr.remote,
            rkey: wr.rkey,
            signaled: true,
        };
        // Held while the request is posted: its registration cannot go meanwhile.
        let mrs = self.mrs.lock();
        let inside = mrs.get(&wr.lkey).is_some_and(|r| {
            let (start, len) = (r.mr.addr(), r.mr.len() as u64);
            wr.local >= start
                && wr
                    .local
                    .checked_add(u64::from(wr.len))
                    .is_some_and(|end| end <= start.saturating_add(len))
        });
        if !inside {
            return Err(BackendError(format!(
                "ibv_post_send not called: {:#x}+{} is not inside a live registration of local key {:#x}",
                wr.local, wr.len, wr.lkey
            )));
        }
        // SAFETY: `Qp::post` asks that the local range lie in a region registered on this
        // queue pair's protection domain under `wr.lkey`, with local write access, and stay
        // valid while the HCA may touch it. Checked just above against this HCA's live
        // registrations (all in this PD, all with LOCAL_WRITE), under the lock that
        // deregistration takes. A registration keeps its region's lease until
        // `ibv_dereg_mr` has returned, which is once the HCA no longer accesses the range
        // (a request still outstanding then fails instead), so the range stays lent memory
        // for as long. Registered memory is shared with peers by its registrant's terms
        // (no Rust reference covers it): other accesses beside the request leave its
        // bytes unspecified, not undefined.
        unsafe { self.qp.post(&send) }.map_err(|e| BackendError(e.to_string()))
    }

    fn to_error(&self) {
        if let Err(e) = self.qp.to_error() {
            tracing::warn!(
                "moving queue pair {} to ERROR failed: {e}",
                self.qp.qp_num()
            );
        }
    }
}
