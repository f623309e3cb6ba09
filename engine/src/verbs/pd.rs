//! Protection domains and memory regions.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use super::context::Context;
use super::ffi;
use super::VerbsError;

/// A protection domain; deallocated when its last MR and QP are gone.
pub struct Pd {
    pub(super) ctx: Arc<Context>,
    pub(super) pd: *mut ffi::ibv_pd,
}

// SAFETY: an `ibv_pd` may be used from any thread; owned, freed once in `Drop`.
unsafe impl Send for Pd {}
// SAFETY: as above; its verbs are thread-safe.
unsafe impl Sync for Pd {}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pd")
            .field("device", &self.ctx.name())
            .finish()
    }
}

/// A registered memory region; deregistered on drop.
pub struct Mr {
    pd: Arc<Pd>,
    mr: *mut ffi::ibv_mr,
    addr: u64,
    len: usize,
    lkey: u32,
    rkey: u32,
}

// SAFETY: an `ibv_mr` may be used and deregistered from any thread; owned.
unsafe impl Send for Mr {}
// SAFETY: only immutable copies of its keys are read through `&Mr`.
unsafe impl Sync for Mr {}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("lkey", &self.lkey)
            .field("rkey", &self.rkey)
            .finish()
    }
}

impl Pd {
    pub(super) fn new(ctx: Arc<Context>, pd: *mut ffi::ibv_pd) -> Self {
        Self { ctx, pd }
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Registers `len` bytes at `addr` with `access` ([`super::access`]
    /// flags). Optional flags (relaxed ordering) go through
    /// `ibv_reg_mr_iova2` with iova = addr, as the C header's `ibv_reg_mr`
    /// macro does; a library without it refuses them.
    ///
    /// # Safety
    /// `addr..addr+len` must be memory of this process (host memory, or
    /// device memory the provider can pin through a peer-memory module)
    /// that stays mapped until the returned [`Mr`] is dropped, and nothing
    /// may rely on its contents while a peer holds the rkey with remote
    /// write access.
    pub unsafe fn reg_mr(
        self: &Arc<Self>,
        addr: u64,
        len: usize,
        access: u32,
    ) -> Result<Mr, VerbsError> {
        let api = &self.ctx.verbs.api;
        let mr = if access & ffi::IBV_ACCESS_OPTIONAL_RANGE == 0 {
            let access = c_int::try_from(access).map_err(|_| VerbsError::Invalid {
                verb: "ibv_reg_mr",
                what: format!("access flags {access:#x} out of range"),
            })?;
            // SAFETY: live PD; the range is the caller's (see # Safety).
            unsafe { (api.reg_mr)(self.pd, addr as *mut c_void, len, access) }
        } else {
            let Some(reg) = api.reg_mr_iova2 else {
                return Err(VerbsError::NotSupported {
                    verb: "ibv_reg_mr_iova2 (optional access flags)",
                    path: self.ctx.verbs.path().into(),
                });
            };
            // SAFETY: as above.
            unsafe { reg(self.pd, addr as *mut c_void, len, addr, access) }
        };
        if mr.is_null() {
            return Err(VerbsError::from_errno("ibv_reg_mr"));
        }
        Ok(self.wrap(mr, addr, len))
    }

    /// Registers `len` bytes at `offset` of the dma-buf `fd`, addressed by
    /// peers at `iova` (`ibv_reg_dmabuf_mr`, rdma-core v34+ and kernel 5.12+).
    ///
    /// # Safety
    /// `fd` must be a dma-buf file descriptor (from the GPU runtime) that
    /// covers `offset..offset+len` and stays exported until the [`Mr`] is dropped.
    pub unsafe fn reg_dmabuf_mr(
        self: &Arc<Self>,
        offset: u64,
        len: usize,
        iova: u64,
        fd: i32,
        access: u32,
    ) -> Result<Mr, VerbsError> {
        let Some(reg) = self.ctx.verbs.api.reg_dmabuf_mr else {
            return Err(VerbsError::NotSupported {
                verb: "ibv_reg_dmabuf_mr",
                path: self.ctx.verbs.path().into(),
            });
        };
        let access = c_int::try_from(access).map_err(|_| VerbsError::Invalid {
            verb: "ibv_reg_dmabuf_mr",
            what: format!("access flags {access:#x} out of range"),
        })?;
        // SAFETY: live PD; the fd and range are the caller's (see # Safety).
        let mr = unsafe { reg(self.pd, offset, len, iova, fd, access) };
        if mr.is_null() {
            return Err(VerbsError::from_errno("ibv_reg_dmabuf_mr"));
        }
        Ok(self.wrap(mr, iova, len))
    }

    fn wrap(self: &Arc<Self>, mr: *mut ffi::ibv_mr, addr: u64, len: usize) -> Mr {
        // SAFETY: a non-null MR the library just returned; layout checked.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Mr {
            pd: self.clone(),
            mr,
            addr,
            len,
            lkey,
            rkey,
        }
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: every MR and QP holds an Arc of this PD, so none is left.
        let rc = unsafe { (self.ctx.verbs.api.dealloc_pd)(self.pd) };
        if rc != 0 {
            tracing::warn!("{}", VerbsError::from_rc("ibv_dealloc_pd", rc));
        }
    }
}

impl Mr {
    /// The local key (for SGEs).
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The remote key (for peers).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Start address (the iova for a dma-buf region).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by `reg_mr`/`reg_dmabuf_mr`, deregistered once.
        let rc = unsafe { (self.pd.ctx.verbs.api.dereg_mr)(self.mr) };
        if rc != 0 {
            tracing::warn!("{}", VerbsError::from_rc("ibv_dereg_mr", rc));
        }
    }
}
