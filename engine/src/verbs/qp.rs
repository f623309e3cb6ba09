//! Reliable-connected queue pairs: creation, the RESET → INIT → RTR → RTS
//! transitions with upstream Mooncake's attributes, and posting RDMA WRITE
//! and READ work requests.

use std::ffi::c_int;
use std::sync::Arc;

use super::context::Mtu;
use super::cq::Cq;
use super::ffi;
use super::pd::Pd;
use super::VerbsError;

/// Queue sizes asked for at creation; the provider may round them up
/// ([`Qp::caps`] has what it granted). Defaults are upstream's
/// (`MC_MAX_WR` 256, `MC_MAX_SGE` 4, `MC_MAX_INLINE` 64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Outstanding send-queue work requests.
    pub max_send_wr: u32,
    /// Outstanding receive-queue work requests.
    pub max_recv_wr: u32,
    /// SGEs per send work request.
    pub max_send_sge: u32,
    /// SGEs per receive work request.
    pub max_recv_sge: u32,
    /// Bytes a send may carry inline.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        Self {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        }
    }
}

/// INIT → RTR attributes. Defaults are upstream's (`hop_limit` 16,
/// `max_dest_rd_atomic` 16, `min_rnr_timer` 12, `is_global`, port 1,
/// MTU 4096); the peer's QP number and GID come from the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtrAttr {
    /// `min(active_mtu, MC_MTU)`.
    pub path_mtu: Mtu,
    /// The peer QP's number.
    pub dest_qp_num: u32,
    /// First PSN expected from the peer.
    pub rq_psn: u32,
    /// The peer's GID (network order).
    pub dgid: [u8; 16],
    /// Index of our GID used as source.
    pub sgid_index: u8,
    /// The peer's LID (0 on RoCE).
    pub dlid: u16,
    /// IP TTL / GRH hop limit.
    pub hop_limit: u8,
    /// GRH traffic class (`MC_IB_TC`).
    pub traffic_class: u8,
    /// Service level (`MC_IB_SL`).
    pub sl: u8,
    /// Whether a GRH is used (always on RoCE).
    pub is_global: bool,
    /// Our port.
    pub port_num: u8,
    /// RDMA READs the peer may have outstanding at us.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code.
    pub min_rnr_timer: u8,
}

impl Default for RtrAttr {
    fn default() -> Self {
        Self {
            path_mtu: Mtu::Mtu4096,
            dest_qp_num: 0,
            rq_psn: 0,
            dgid: [0; 16],
            sgid_index: 0,
            dlid: 0,
            hop_limit: 16,
            traffic_class: 0,
            sl: 0,
            is_global: true,
            port_num: 1,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
        }
    }
}

/// RTR → RTS attributes; defaults are upstream's (`timeout` 14,
/// `retry_cnt` 7, `rnr_retry` 7, `sq_psn` 0, `max_rd_atomic` 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsAttr {
    /// Local ACK timeout code (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Transport retries before `RetryExcErr`.
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// First PSN we send.
    pub sq_psn: u32,
    /// RDMA READs we may have outstanding.
    pub max_rd_atomic: u8,
}

impl Default for RtsAttr {
    fn default() -> Self {
        Self {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: 0,
            max_rd_atomic: 16,
        }
    }
}

/// The one-sided operation of a [`SendWr`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WrOp {
    /// RDMA WRITE: local → remote.
    Write,
    /// RDMA READ: remote → local.
    Read,
}

/// One RDMA WRITE or READ with one SGE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// WRITE or READ.
    pub op: WrOp,
    /// Local buffer (inside a region registered on this QP's PD).
    pub local_addr: u64,
    /// Bytes.
    pub len: u32,
    /// The local region's lkey.
    pub lkey: u32,
    /// Remote address.
    pub remote_addr: u64,
    /// The peer region's rkey.
    pub rkey: u32,
    /// Whether a successful completion is generated (errors always are).
    pub signaled: bool,
}

/// A batch post that stopped part-way.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{error} ({posted} work request(s) of the batch were posted)")]
pub struct BatchPostError {
    /// Work requests posted before the failure (their completions will come).
    pub posted: usize,
    /// Why the next one was refused.
    pub error: VerbsError,
}

/// Work requests chained per `post_send` call.
const POST_CHUNK: usize = 16;

/// A reliable-connected queue pair; destroyed on drop (before its CQs and PD).
pub struct Qp {
    pd: Arc<Pd>,
    _send_cq: Arc<Cq>,
    _recv_cq: Arc<Cq>,
    qp: *mut ffi::ibv_qp,
    qp_num: u32,
    caps: QpCaps,
}

// SAFETY: an `ibv_qp` may be modified and posted to from any thread
// (providers lock the send queue in `post_send`); owned, destroyed once.
unsafe impl Send for Qp {}
// SAFETY: as above.
unsafe impl Sync for Qp {}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp").field("qp_num", &self.qp_num).finish()
    }
}

impl Pd {
    /// Creates an RC queue pair on this PD (`sq_sig_all` off: only
    /// signaled work requests and errors complete).
    pub fn create_rc_qp(
        self: &Arc<Self>,
        send_cq: &Arc<Cq>,
        recv_cq: &Arc<Cq>,
        caps: QpCaps,
    ) -> Result<Arc<Qp>, VerbsError> {
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.cq,
            recv_cq: recv_cq.cq,
            srq: std::ptr::null_mut(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: caps.max_send_wr,
                max_recv_wr: caps.max_recv_wr,
                max_send_sge: caps.max_send_sge,
                max_recv_sge: caps.max_recv_sge,
                max_inline_data: caps.max_inline_data,
            },
            qp_type: ffi::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: live PD and CQs (of this PD's context, which the
        // provider checks); `init` is a valid in/out attribute block.
        let qp = unsafe { (self.ctx.verbs.api.create_qp)(self.pd, &mut init) };
        if qp.is_null() {
            return Err(VerbsError::from_errno("ibv_create_qp"));
        }
        // SAFETY: a non-null QP the library just returned; layout checked.
        let qp_num = unsafe { (*qp).qp_num };
        let c = init.cap;
        Ok(Arc::new(Qp {
            pd: self.clone(),
            _send_cq: send_cq.clone(),
            _recv_cq: recv_cq.clone(),
            qp,
            qp_num,
            caps: QpCaps {
                max_send_wr: c.max_send_wr,
                max_recv_wr: c.max_recv_wr,
                max_send_sge: c.max_send_sge,
                max_recv_sge: c.max_recv_sge,
                max_inline_data: c.max_inline_data,
            },
        }))
    }
}

impl Qp {
    /// The QP number peers address.
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// The sizes the provider granted.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    fn modify(
        &self,
        verb: &'static str,
        attr: &mut ffi::ibv_qp_attr,
        mask: c_int,
    ) -> Result<(), VerbsError> {
        // SAFETY: live QP; `attr` is a full attribute block.
        let rc = unsafe { (self.pd.ctx.verbs.api.modify_qp)(self.qp, attr, mask) };
        if rc != 0 {
            return Err(VerbsError::from_rc(verb, rc));
        }
        Ok(())
    }

    /// RESET → INIT on `port` with `pkey_index`, granting peers `access`
    /// ([`super::access`] flags).
    pub fn to_init(&self, port: u8, pkey_index: u16, access: u32) -> Result<(), VerbsError> {
        let mut a = ffi::ibv_qp_attr::zeroed();
        a.qp_state = ffi::IBV_QPS_INIT;
        a.port_num = port;
        a.pkey_index = pkey_index;
        a.qp_access_flags = access;
        self.modify(
            "ibv_modify_qp(INIT)",
            &mut a,
            ffi::IBV_QP_STATE
                | ffi::IBV_QP_PKEY_INDEX
                | ffi::IBV_QP_PORT
                | ffi::IBV_QP_ACCESS_FLAGS,
        )
    }

    /// INIT → RTR towards the peer QP `attr` names.
    pub fn to_rtr(&self, attr: &RtrAttr) -> Result<(), VerbsError> {
        let mut a = ffi::ibv_qp_attr::zeroed();
        a.qp_state = ffi::IBV_QPS_RTR;
        a.path_mtu = attr.path_mtu.raw();
        a.dest_qp_num = attr.dest_qp_num;
        a.rq_psn = attr.rq_psn;
        a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        a.min_rnr_timer = attr.min_rnr_timer;
        a.ah_attr.grh.dgid = ffi::ibv_gid { raw: attr.dgid };
        a.ah_attr.grh.sgid_index = attr.sgid_index;
        a.ah_attr.grh.hop_limit = attr.hop_limit;
        a.ah_attr.grh.traffic_class = attr.traffic_class;
        a.ah_attr.dlid = attr.dlid;
        a.ah_attr.sl = attr.sl;
        a.ah_attr.is_global = u8::from(attr.is_global);
        a.ah_attr.port_num = attr.port_num;
        self.modify(
            "ibv_modify_qp(RTR)",
            &mut a,
            ffi::IBV_QP_STATE
                | ffi::IBV_QP_AV
                | ffi::IBV_QP_PATH_MTU
                | ffi::IBV_QP_DEST_QPN
                | ffi::IBV_QP_RQ_PSN
                | ffi::IBV_QP_MAX_DEST_RD_ATOMIC
                | ffi::IBV_QP_MIN_RNR_TIMER,
        )
    }

    /// RTR → RTS.
    pub fn to_rts(&self, attr: &RtsAttr) -> Result<(), VerbsError> {
        let mut a = ffi::ibv_qp_attr::zeroed();
        a.qp_state = ffi::IBV_QPS_RTS;
        a.timeout = attr.timeout;
        a.retry_cnt = attr.retry_cnt;
        a.rnr_retry = attr.rnr_retry;
        a.sq_psn = attr.sq_psn;
        a.max_rd_atomic = attr.max_rd_atomic;
        self.modify(
            "ibv_modify_qp(RTS)",
            &mut a,
            ffi::IBV_QP_STATE
                | ffi::IBV_QP_TIMEOUT
                | ffi::IBV_QP_RETRY_CNT
                | ffi::IBV_QP_RNR_RETRY
                | ffi::IBV_QP_SQ_PSN
                | ffi::IBV_QP_MAX_QP_RD_ATOMIC,
        )
    }

    /// Any state → ERR: outstanding work requests complete with `WrFlushErr`.
    pub fn to_error(&self) -> Result<(), VerbsError> {
        let mut a = ffi::ibv_qp_attr::zeroed();
        a.qp_state = ffi::IBV_QPS_ERR;
        self.modify("ibv_modify_qp(ERR)", &mut a, ffi::IBV_QP_STATE)
    }

    /// Any state → RESET, so the QP can be connected again (after its
    /// completions have been polled).
    pub fn to_reset(&self) -> Result<(), VerbsError> {
        let mut a = ffi::ibv_qp_attr::zeroed();
        a.qp_state = ffi::IBV_QPS_RESET;
        self.modify("ibv_modify_qp(RESET)", &mut a, ffi::IBV_QP_STATE)
    }

    /// Posts one work request.
    ///
    /// # Safety
    /// `wr.local_addr..+wr.len` must lie in a region registered on this QP's PD under
    /// `wr.lkey` (with local write access for a READ), and stay valid and otherwise
    /// untouched until the work request's completion is polled (or the QP is flushed
    /// and destroyed).
    pub unsafe fn post(&self, wr: &SendWr) -> Result<(), VerbsError> {
        // SAFETY: forwarded from the caller.
        unsafe { self.post_batch(std::slice::from_ref(wr)) }.map_err(|e| e.error)
    }

    /// Posts `wrs` in order, chained through `next` (up to 16 per
    /// `post_send` call, so one doorbell serves many).
    ///
    /// # Safety
    /// As [`post`](Self::post) for every entry.
    pub unsafe fn post_batch(&self, wrs: &[SendWr]) -> Result<(), BatchPostError> {
        let mut posted = 0;
        for chunk in wrs.chunks(POST_CHUNK) {
            let mut sge = [ffi::ibv_sge::default(); POST_CHUNK];
            let mut raw = [ffi::ibv_send_wr::zeroed(); POST_CHUNK];
            let n = chunk.len();
            for (i, w) in chunk.iter().enumerate() {
                sge[i] = ffi::ibv_sge {
                    addr: w.local_addr,
                    length: w.len,
                    lkey: w.lkey,
                };
                let r = &mut raw[i];
                r.wr_id = w.wr_id;
                r.num_sge = 1;
                r.opcode = match w.op {
                    WrOp::Write => ffi::IBV_WR_RDMA_WRITE,
                    WrOp::Read => ffi::IBV_WR_RDMA_READ,
                };
                r.send_flags = if w.signaled {
                    ffi::IBV_SEND_SIGNALED
                } else {
                    0
                };
                r.wr.rdma = ffi::ibv_send_wr_rdma {
                    remote_addr: w.remote_addr,
                    rkey: w.rkey,
                };
            }
            // Pointers last, and only raw ones, so none is invalidated by a
            // later borrow of the arrays.
            let base = raw.as_mut_ptr();
            let sge_base = sge.as_mut_ptr();
            for i in 0..n {
                // SAFETY: i < n <= POST_CHUNK: inside both arrays.
                unsafe {
                    let w = base.add(i);
                    (*w).sg_list = sge_base.add(i);
                    (*w).next = if i + 1 < n {
                        base.add(i + 1)
                    } else {
                        std::ptr::null_mut()
                    };
                }
            }
            let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
            // SAFETY: live QP; the chain and its SGEs live until the call
            // returns (the provider copies them into its queue); the buffers
            // they name are the caller's (see # Safety). `post_send` is read
            // through the QP's own context's ops table, as the header's
            // inline `ibv_post_send` does.
            let rc = unsafe {
                let ctx = (*self.qp).context;
                match (*ctx).ops.post_send {
                    Some(post) => post(self.qp, base, &mut bad),
                    None => {
                        return Err(BatchPostError {
                            posted,
                            error: VerbsError::NotSupported {
                                verb: "ibv_post_send",
                                path: self.pd.ctx.verbs.path().into(),
                            },
                        })
                    }
                }
            };
            if rc != 0 {
                // `bad` points at the first refused entry of the chain.
                let ok_in_chunk = (0..n)
                    .find(|&i| std::ptr::eq(base.wrapping_add(i), bad))
                    .unwrap_or(0);
                return Err(BatchPostError {
                    posted: posted + ok_in_chunk,
                    error: VerbsError::from_rc("ibv_post_send", rc),
                });
            }
            posted += n;
        }
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: the QP is destroyed once; its PD and CQs (held by Arc
        // fields, dropped after this body) are still alive.
        let rc = unsafe { (self.pd.ctx.verbs.api.destroy_qp)(self.qp) };
        if rc != 0 {
            tracing::warn!("{}", VerbsError::from_rc("ibv_destroy_qp", rc));
        }
    }
}
