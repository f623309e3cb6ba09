//! Asynchronous events of a device (`ibv_get_async_event`): a QP or CQ gone
//! into error, a port going down or up, a fatal device error. A transport
//! waits for them on one thread per context to pause rails and rebuild
//! queue pairs.

use std::time::Duration;

use super::context::Context;
use super::ffi;
use super::VerbsError;

/// What happened (`enum ibv_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncEventKind {
    /// `IBV_EVENT_CQ_ERR`: a CQ overran; its completions are no longer reliable.
    CqErr,
    /// `IBV_EVENT_QP_FATAL`.
    QpFatal,
    /// `IBV_EVENT_QP_REQ_ERR`.
    QpReqErr,
    /// `IBV_EVENT_QP_ACCESS_ERR`.
    QpAccessErr,
    /// `IBV_EVENT_COMM_EST`.
    CommEst,
    /// `IBV_EVENT_SQ_DRAINED`.
    SqDrained,
    /// `IBV_EVENT_PATH_MIG`.
    PathMig,
    /// `IBV_EVENT_PATH_MIG_ERR`.
    PathMigErr,
    /// `IBV_EVENT_DEVICE_FATAL`: the device must be closed and reopened.
    DeviceFatal,
    /// `IBV_EVENT_PORT_ACTIVE`.
    PortActive,
    /// `IBV_EVENT_PORT_ERR`: the port left the ACTIVE state.
    PortErr,
    /// `IBV_EVENT_LID_CHANGE`.
    LidChange,
    /// `IBV_EVENT_PKEY_CHANGE`.
    PkeyChange,
    /// `IBV_EVENT_SM_CHANGE`.
    SmChange,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`.
    QpLastWqeReached,
    /// `IBV_EVENT_CLIENT_REREGISTER`.
    ClientReregister,
    /// `IBV_EVENT_GID_CHANGE`.
    GidChange,
    /// SRQ and WQ events, or a value this crate does not name (see `raw`).
    Other,
}

impl AsyncEventKind {
    /// From `enum ibv_event_type`.
    pub fn from_raw(raw: u32) -> Self {
        match raw {
            ffi::IBV_EVENT_CQ_ERR => Self::CqErr,
            ffi::IBV_EVENT_QP_FATAL => Self::QpFatal,
            ffi::IBV_EVENT_QP_REQ_ERR => Self::QpReqErr,
            ffi::IBV_EVENT_QP_ACCESS_ERR => Self::QpAccessErr,
            ffi::IBV_EVENT_COMM_EST => Self::CommEst,
            ffi::IBV_EVENT_SQ_DRAINED => Self::SqDrained,
            ffi::IBV_EVENT_PATH_MIG => Self::PathMig,
            ffi::IBV_EVENT_PATH_MIG_ERR => Self::PathMigErr,
            ffi::IBV_EVENT_DEVICE_FATAL => Self::DeviceFatal,
            ffi::IBV_EVENT_PORT_ACTIVE => Self::PortActive,
            ffi::IBV_EVENT_PORT_ERR => Self::PortErr,
            ffi::IBV_EVENT_LID_CHANGE => Self::LidChange,
            ffi::IBV_EVENT_PKEY_CHANGE => Self::PkeyChange,
            ffi::IBV_EVENT_SM_CHANGE => Self::SmChange,
            ffi::IBV_EVENT_QP_LAST_WQE_REACHED => Self::QpLastWqeReached,
            ffi::IBV_EVENT_CLIENT_REREGISTER => Self::ClientReregister,
            ffi::IBV_EVENT_GID_CHANGE => Self::GidChange,
            _ => Self::Other,
        }
    }

    fn is_qp_event(self) -> bool {
        matches!(
            self,
            Self::QpFatal
                | Self::QpReqErr
                | Self::QpAccessErr
                | Self::CommEst
                | Self::SqDrained
                | Self::PathMig
                | Self::PathMigErr
                | Self::QpLastWqeReached
        )
    }

    fn is_port_event(self) -> bool {
        matches!(
            self,
            Self::PortActive
                | Self::PortErr
                | Self::LidChange
                | Self::PkeyChange
                | Self::SmChange
                | Self::ClientReregister
                | Self::GidChange
        )
    }
}

/// One asynchronous event, copied out and acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// What happened.
    pub kind: AsyncEventKind,
    /// `enum ibv_event_type` as the library gave it.
    pub raw: u32,
    /// The QP concerned, for QP events.
    pub qp_num: Option<u32>,
    /// The port concerned, for port events.
    pub port: Option<u8>,
}

impl Context {
    /// Waits up to `timeout` for the device's next asynchronous event;
    /// `Ok(None)` when none came. Callers on several threads are served one
    /// at a time (the wait is serialised per context).
    pub fn wait_async_event(&self, timeout: Duration) -> Result<Option<AsyncEvent>, VerbsError> {
        let api = &self.verbs.api;
        let (Some(get), Some(ack)) = (api.get_async_event, api.ack_async_event) else {
            return Err(VerbsError::NotSupported {
                verb: "ibv_get_async_event",
                path: self.verbs.path().into(),
            });
        };
        let _one_waiter = self.async_lock.lock();
        // SAFETY: live context; `async_fd` is set by `ibv_open_device` and never changes.
        let fd = unsafe { (*self.ctx).async_fd };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = VerbsError::from_errno("poll(async_fd)");
            return match e {
                VerbsError::Failed { errno, .. } if errno == libc::EINTR => Ok(None),
                e => Err(e),
            };
        }
        if n == 0 || pfd.revents & libc::POLLIN == 0 {
            return Ok(None);
        }
        // SAFETY: all-pointer/integer struct; zero is valid.
        let mut ev: ffi::ibv_async_event = unsafe { std::mem::zeroed() };
        // SAFETY: live context; `ev` is a valid out-pointer; the fd is
        // readable, so this does not block.
        let rc = unsafe { get(self.ctx, &mut ev) };
        if rc != 0 {
            return Err(VerbsError::from_rc("ibv_get_async_event", rc));
        }
        let kind = AsyncEventKind::from_raw(ev.event_type);
        // SAFETY: the union member read is the one rdma-core fills for this
        // event type; a QP event's QP is live until the event is acknowledged.
        let (qp_num, port) = unsafe {
            (
                (kind.is_qp_event() && !ev.element.qp.is_null()).then(|| (*ev.element.qp).qp_num),
                kind.is_port_event()
                    .then(|| u8::try_from(ev.element.port_num).unwrap_or(0)),
            )
        };
        // SAFETY: every event returned must be acknowledged once.
        unsafe { ack(&mut ev) };
        Ok(Some(AsyncEvent {
            kind,
            raw: ev.event_type,
            qp_num,
            port,
        }))
    }
}
