//! The real backend: [`Nic`] and [`QueuePair`] over the run-time loaded verbs
//! ([`crate::verbs`]). One context, protection domain and completion queue per HCA.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::backend::{
    BackendError, Completion, MrKeys, Nic, PortInfo, QueuePair, RdmaOp, RemoteQp, WcStatus,
    WorkRequest,
};
use super::RdmaParams;
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
    /// Registrations by handle; dropping an [`Mr`] deregisters it.
    mrs: Mutex<HashMap<u64, Mr>>,
    next_mr: AtomicU64,
    // Destroyed last (field order): the context outlives its objects anyway (they hold
    // `Arc`s of it), this keeps it named.
    _ctx: Arc<Context>,
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
            mrs: Mutex::new(HashMap::new()),
            next_mr: AtomicU64::new(1),
            _ctx: ctx,
        })
    }
}

impl VerbsNic {
    /// Keeps `mr` until its keys are deregistered.
    fn keep(&self, mr: Mr) -> MrKeys {
        let handle = self.next_mr.fetch_add(1, Ordering::Relaxed);
        let keys = MrKeys {
            lkey: mr.lkey(),
            rkey: mr.rkey(),
            handle,
        };
        self.mrs.lock().insert(handle, mr);
        keys
    }
}

impl Nic for VerbsNic {
    fn name(&self) -> &str {
        &self.name
    }

    fn port(&self) -> PortInfo {
        self.port
    }

    unsafe fn register(&self, addr: u64, len: u64) -> Result<MrKeys, BackendError> {
        let len = usize::try_from(len).map_err(|_| BackendError("length too large".into()))?;
        // SAFETY: forwarded from the caller (the range stays mapped until `deregister`).
        let mr = unsafe {
            self.pd.reg_mr(
                addr,
                len,
                access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ,
            )
        }
        .map_err(|e| BackendError(e.to_string()))?;
        Ok(self.keep(mr))
    }

    unsafe fn register_dmabuf(
        &self,
        fd: i32,
        offset: u64,
        len: u64,
        iova: u64,
    ) -> Result<MrKeys, BackendError> {
        let len = usize::try_from(len).map_err(|_| BackendError("length too large".into()))?;
        // SAFETY: forwarded from the caller (the dma-buf covers the range and its memory
        // stays allocated until `deregister`).
        let mr = unsafe {
            self.pd.reg_dmabuf_mr(
                offset,
                len,
                iova,
                fd,
                access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ,
            )
        }
        .map_err(|e| BackendError(e.to_string()))?;
        Ok(self.keep(mr))
    }

    fn deregister(&self, keys: MrKeys) {
        // Dropped outside the lock: `ibv_dereg_mr` may wait for the HCA.
        let mr = self.mrs.lock().remove(&keys.handle);
        drop(mr);
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
                other => WcStatus::Other(format!(
                    "{other} (status {}, vendor error {:#x})",
                    wc.status_raw, wc.vendor_err
                )),
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

    unsafe fn post(&self, wr: &WorkRequest) -> Result<(), BackendError> {
        let wr = SendWr {
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
        // SAFETY: forwarded from the caller (the range stays registered and valid until
        // the completion is polled).
        unsafe { self.qp.post(&wr) }.map_err(|e| BackendError(e.to_string()))
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
