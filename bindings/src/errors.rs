//! Why a binding call failed, and the one bridge from failures to what Python sees.
//!
//! Upstream reports failures as return codes only (`-1`, batch id `0`, a negative
//! `ERR_*`). We keep those returns, and add what users lack: every failure is logged with
//! its reason, and the reason of the calling thread's last call is kept for
//! `TransferEngine.last_error()`. Wrong argument *types* never get here: argument
//! extraction raises `TypeError` before a call starts.

use std::cell::RefCell;

use thiserror::Error;
use transfer_engine::{EngineError, TransferError};

/// A failed binding call.
#[derive(Debug, Error)]
pub enum BindingError {
    /// A call that needs an engine, before `initialize` succeeded.
    #[error("the engine is not initialized: call initialize() first")]
    NotInitialized,
    /// The engine refused the call.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A request of a transfer failed or timed out.
    #[error("{what} to {target} failed: {source}")]
    Transfer {
        /// Which request: "transfer" or "request 3 of 8".
        what: String,
        /// The target segment.
        target: String,
        /// Why.
        #[source]
        source: TransferError,
    },
    /// A value the caller passed is unusable.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A batch id this engine does not know.
    #[error("unknown batch id {0}: never returned by this engine, or already freed by a completed status call")]
    UnknownBatch(u64),
    /// The managed-buffer allocator refused.
    #[error("managed buffer: {0}")]
    Managed(String),
    /// Ctrl-C while waiting; Python raises the `KeyboardInterrupt` itself.
    #[error("interrupted")]
    Interrupted,
}

impl BindingError {
    /// The return code upstream would give: its `ERR_*` where the engine has one, else -1.
    pub fn code(&self) -> i32 {
        match self {
            Self::Engine(e) => e.code(),
            Self::NotInitialized
            | Self::Transfer { .. }
            | Self::InvalidArgument(_)
            | Self::UnknownBatch(_)
            | Self::Managed(_)
            | Self::Interrupted => -1,
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// The reason the calling thread's last engine call failed; `None` if it succeeded.
pub fn last_error() -> Option<String> {
    LAST_ERROR.with(|e| e.borrow().clone())
}

/// Records the outcome of the call named `call` for [`last_error`], logging a failure.
pub fn settle<T>(call: &str, result: Result<T, BindingError>) -> Result<T, BindingError> {
    match &result {
        Ok(_) => LAST_ERROR.with(|e| e.borrow_mut().take()),
        Err(err) => {
            let reason = format!("{call}: {err}");
            tracing::error!("{reason}");
            LAST_ERROR.with(|e| e.borrow_mut().replace(reason))
        }
    };
    result
}

/// Upstream's status convention for transfers, probes and initialize: 0 or -1.
pub fn status(call: &str, result: Result<(), BindingError>) -> i32 {
    settle(call, result).map_or(-1, |()| 0)
}

/// Upstream's convention for (un)registration: 0, or the engine's `ERR_*` code
/// (-1 invalid, -3 not registered, -7 overlap).
pub fn status_code(call: &str, result: Result<(), BindingError>) -> i32 {
    settle(call, result).map_or_else(|e| e.code(), |()| 0)
}

/// A value, or `fallback` on failure (batch id 0, address 0, ...).
pub fn value_or<T>(call: &str, result: Result<T, BindingError>, fallback: T) -> T {
    settle(call, result).unwrap_or(fallback)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_error_is_per_thread_and_cleared_by_success() {
        assert_eq!(status("call", Err(BindingError::NotInitialized)), -1);
        let reason = last_error().unwrap();
        assert!(
            reason.starts_with("call: the engine is not initialized"),
            "{reason}"
        );
        std::thread::spawn(|| assert_eq!(last_error(), None))
            .join()
            .unwrap();
        assert_eq!(value_or("other", Ok(7), 0), 7);
        assert_eq!(last_error(), None);
    }

    #[test]
    fn engine_codes_pass_through() {
        let e = BindingError::Engine(EngineError::Memory(
            transfer_engine::memory::MemoryError::NotRegistered(8),
        ));
        assert_eq!(e.code(), -3);
        assert_eq!(BindingError::UnknownBatch(3).code(), -1);
        assert_eq!(status_code("register_memory", Err(e)), -3);
        let refused = EngineError::Handshake {
            peer: "127.0.0.1:1".into(),
            reason: "refused".into(),
        };
        assert_eq!(status("transfer_sync_write", Err(refused.into())), -1);
    }
}
