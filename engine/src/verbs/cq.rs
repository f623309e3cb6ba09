//! Completion queues and the completions polled from them.

use std::ffi::c_int;
use std::sync::Arc;

use super::context::Context;
use super::ffi;
use super::VerbsError;

/// A completion queue; destroyed when the last QP using it is gone.
pub struct Cq {
    ctx: Arc<Context>,
    pub(super) cq: *mut ffi::ibv_cq,
}

// SAFETY: an `ibv_cq` may be polled from any thread (providers lock the CQ
// in `poll_cq`); owned and destroyed once in `Drop`.
unsafe impl Send for Cq {}
// SAFETY: as above.
unsafe impl Sync for Cq {}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq")
            .field("device", &self.ctx.name())
            .finish()
    }
}

/// A work completion status (`enum ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`.
    #[default]
    Success,
    /// `IBV_WC_LOC_LEN_ERR`.
    LocLenErr,
    /// `IBV_WC_LOC_QP_OP_ERR`.
    LocQpOpErr,
    /// `IBV_WC_LOC_PROT_ERR`: the lkey does not cover the local buffer.
    LocProtErr,
    /// `IBV_WC_WR_FLUSH_ERR`: flushed because the QP is in the error state.
    WrFlushErr,
    /// `IBV_WC_BAD_RESP_ERR`.
    BadRespErr,
    /// `IBV_WC_LOC_ACCESS_ERR`.
    LocAccessErr,
    /// `IBV_WC_REM_INV_REQ_ERR`.
    RemInvReqErr,
    /// `IBV_WC_REM_ACCESS_ERR`: bad rkey, bounds or access rights at the peer.
    RemAccessErr,
    /// `IBV_WC_REM_OP_ERR`.
    RemOpErr,
    /// `IBV_WC_RETRY_EXC_ERR`: the peer did not answer (gone, or no path).
    RetryExcErr,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`.
    RnrRetryExcErr,
    /// `IBV_WC_REM_ABORT_ERR`.
    RemAbortErr,
    /// `IBV_WC_FATAL_ERR`.
    FatalErr,
    /// `IBV_WC_RESP_TIMEOUT_ERR`.
    RespTimeoutErr,
    /// `IBV_WC_GENERAL_ERR`.
    GeneralErr,
    /// Any other value (see the raw status).
    Other,
}

impl WcStatus {
    /// From `enum ibv_wc_status`.
    pub fn from_raw(raw: u32) -> Self {
        match raw {
            ffi::IBV_WC_SUCCESS => Self::Success,
            ffi::IBV_WC_LOC_LEN_ERR => Self::LocLenErr,
            ffi::IBV_WC_LOC_QP_OP_ERR => Self::LocQpOpErr,
            ffi::IBV_WC_LOC_PROT_ERR => Self::LocProtErr,
            ffi::IBV_WC_WR_FLUSH_ERR => Self::WrFlushErr,
            ffi::IBV_WC_BAD_RESP_ERR => Self::BadRespErr,
            ffi::IBV_WC_LOC_ACCESS_ERR => Self::LocAccessErr,
            ffi::IBV_WC_REM_INV_REQ_ERR => Self::RemInvReqErr,
            ffi::IBV_WC_REM_ACCESS_ERR => Self::RemAccessErr,
            ffi::IBV_WC_REM_OP_ERR => Self::RemOpErr,
            ffi::IBV_WC_RETRY_EXC_ERR => Self::RetryExcErr,
            ffi::IBV_WC_RNR_RETRY_EXC_ERR => Self::RnrRetryExcErr,
            ffi::IBV_WC_REM_ABORT_ERR => Self::RemAbortErr,
            ffi::IBV_WC_FATAL_ERR => Self::FatalErr,
            ffi::IBV_WC_RESP_TIMEOUT_ERR => Self::RespTimeoutErr,
            ffi::IBV_WC_GENERAL_ERR => Self::GeneralErr,
            _ => Self::Other,
        }
    }

    /// Whether the work request succeeded.
    pub fn is_success(self) -> bool {
        self == Self::Success
    }
}

impl std::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The texts rdma-core's ibv_wc_status_str gives.
        f.write_str(match self {
            Self::Success => "success",
            Self::LocLenErr => "local length error",
            Self::LocQpOpErr => "local QP operation error",
            Self::LocProtErr => "local protection error",
            Self::WrFlushErr => "Work Request Flushed Error",
            Self::BadRespErr => "bad response error",
            Self::LocAccessErr => "local access error",
            Self::RemInvReqErr => "remote invalid request error",
            Self::RemAccessErr => "remote access error",
            Self::RemOpErr => "remote operation error",
            Self::RetryExcErr => "transport retry counter exceeded",
            Self::RnrRetryExcErr => "RNR retry counter exceeded",
            Self::RemAbortErr => "operation aborted",
            Self::FatalErr => "fatal error",
            Self::RespTimeoutErr => "response timeout error",
            Self::GeneralErr => "general error",
            Self::Other => "unknown",
        })
    }
}

/// What completed (`enum ibv_wc_opcode`); valid only for successful completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WcOpcode {
    /// `IBV_WC_RDMA_WRITE`.
    #[default]
    RdmaWrite,
    /// `IBV_WC_RDMA_READ`.
    RdmaRead,
    /// `IBV_WC_SEND`.
    Send,
    /// `IBV_WC_RECV` and friends.
    Recv,
    /// Any other value.
    Other,
}

impl WcOpcode {
    /// From `enum ibv_wc_opcode`.
    pub fn from_raw(raw: u32) -> Self {
        match raw {
            ffi::IBV_WC_RDMA_WRITE => Self::RdmaWrite,
            ffi::IBV_WC_RDMA_READ => Self::RdmaRead,
            ffi::IBV_WC_SEND => Self::Send,
            r if r & ffi::IBV_WC_RECV != 0 => Self::Recv,
            _ => Self::Other,
        }
    }
}

/// One polled work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Completion {
    /// The `wr_id` the work request was posted with.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Status as the library gave it.
    pub status_raw: u32,
    /// What completed (meaningful only on success).
    pub opcode: WcOpcode,
    /// Bytes transferred (meaningful for reads and receives).
    pub byte_len: u32,
    /// Vendor error syndrome (meaningful on error).
    pub vendor_err: u32,
    /// The local QP the completion belongs to.
    pub qp_num: u32,
}

impl From<&ffi::ibv_wc> for Completion {
    fn from(wc: &ffi::ibv_wc) -> Self {
        Self {
            wr_id: wc.wr_id,
            status: WcStatus::from_raw(wc.status),
            status_raw: wc.status,
            opcode: WcOpcode::from_raw(wc.opcode),
            byte_len: wc.byte_len,
            vendor_err: wc.vendor_err,
            qp_num: wc.qp_num,
        }
    }
}

/// Completions read per `poll_cq` call.
const POLL_CHUNK: usize = 32;

impl Cq {
    pub(super) fn new(ctx: Arc<Context>, cq: *mut ffi::ibv_cq) -> Self {
        Self { ctx, cq }
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Fills `out` with ready completions and returns how many; 0 when none
    /// is ready. Never blocks.
    pub fn poll(&self, out: &mut [Completion]) -> Result<usize, VerbsError> {
        let mut wc = [ffi::ibv_wc::default(); POLL_CHUNK];
        let mut done = 0;
        while done < out.len() {
            let want = (out.len() - done).min(POLL_CHUNK);
            // SAFETY: `self.cq` is live; `want <= POLL_CHUNK` entries of `wc`
            // are writable; `poll_cq` is read through the CQ's own context's
            // ops table, as the header's inline `ibv_poll_cq` does.
            let n = unsafe {
                let ctx = (*self.cq).context;
                match (*ctx).ops.poll_cq {
                    Some(poll) => poll(self.cq, want as c_int, wc.as_mut_ptr()),
                    None => {
                        return Err(VerbsError::NotSupported {
                            verb: "ibv_poll_cq",
                            path: self.ctx.verbs.path().into(),
                        })
                    }
                }
            };
            if n < 0 {
                // Providers return a negative count on a CQ error, not an errno.
                return Err(VerbsError::from_errno("ibv_poll_cq"));
            }
            let n = (n as usize).min(want);
            for (o, w) in out[done..done + n].iter_mut().zip(&wc[..n]) {
                *o = Completion::from(w);
            }
            done += n;
            if n < want {
                break;
            }
        }
        Ok(done)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an Arc of it, so none is left.
        let rc = unsafe { (self.ctx.verbs.api.destroy_cq)(self.cq) };
        if rc != 0 {
            tracing::warn!("{}", VerbsError::from_rc("ibv_destroy_cq", rc));
        }
    }
}
