//! Why a binding call failed, and the one bridge from failures to what Python sees.
//!
//! Upstream reports failures as return codes only (`-1`, batch id `0`, a negative
//! `ERR_*`). We keep those returns, and add what users lack: every failure is logged with
//! its reason, and the reason of the calling thread's last call is kept for
//! `TransferEngine.last_error()`. Wrong argument *types* never get here: argument
//! extraction raises `TypeError` before a call starts.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

use thiserror::Error;
use transfer_engine::transport::select::Refusal;
use transfer_engine::{EngineError, Fault, TransferError};

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

/// The typed cause of a failed call, as `TransferEngine.last_error_info()` returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorInfo {
    /// What kind of failure (`rdma_unavailable`, `peer_unreachable`, ...): see [`Cause`].
    pub kind: &'static str,
    /// Whose failure it is: `caller`, `peer` or `host` (see [`Fault`]).
    pub fault: &'static str,
    /// The full reason, `call: why` (what `last_error()` returns).
    pub message: String,
    /// The binding call that failed.
    pub call: String,
    /// The peer (segment or address) involved, if any.
    pub peer: Option<String>,
    /// The `MC_*` variable or `mooncake-doctor` check that helps.
    pub hint: Option<String>,
    /// The return code the call gave.
    pub code: i32,
}

/// The typed part of a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// One of: `not_initialized`, `invalid_argument`, `config`, `memory`, `listen`,
    /// `protocol_not_served`, `rdma_unavailable`, `gpu_unavailable`,
    /// `protocol_mismatch`, `peer_unreachable`, `peer_lost`, `address_rejected`,
    /// `peer_protocol_error`, `metadata`, `timeout`, `canceled`, `unsupported`,
    /// `interrupted`, `io`.
    pub kind: &'static str,
    /// The peer involved.
    pub peer: Option<String>,
    /// What helps.
    pub hint: Option<String>,
}

fn cause(kind: &'static str, peer: Option<&str>, hint: Option<String>) -> Cause {
    Cause {
        kind,
        peer: peer.map(str::to_string),
        hint,
    }
}

fn peer_hint(peer: &str) -> String {
    format!("mooncake-doctor --peer {peer} checks that the peer answers; MC_HANDSHAKE_TIMEOUT bounds the handshake")
}

impl BindingError {
    /// Whose failure this is: the engine's own judgement for its errors, the caller's for
    /// misuse of the bindings.
    pub fn fault(&self) -> Fault {
        match self {
            Self::NotInitialized
            | Self::InvalidArgument(_)
            | Self::UnknownBatch(_)
            | Self::Interrupted => Fault::Caller,
            Self::Managed(_) => Fault::Host,
            Self::Transfer { source, .. } => source.fault(),
            Self::Engine(e) => e.fault(),
        }
    }

    /// The typed cause: kind, peer and hint.
    pub fn cause(&self) -> Cause {
        match self {
            Self::NotInitialized => cause(
                "not_initialized",
                None,
                Some("call initialize() first; if it returned -1, last_error_info() of that call says why".into()),
            ),
            Self::InvalidArgument(_) | Self::UnknownBatch(_) => cause("invalid_argument", None, None),
            Self::Managed(_) => cause("memory", None, None),
            Self::Interrupted => cause("interrupted", None, None),
            Self::Transfer { target, source, .. } => transfer_cause(target, source),
            Self::Engine(e) => engine_cause(e),
        }
    }

    /// The typed cause of this failure of `call`, with its message and return code.
    pub fn info(&self, call: &str) -> ErrorInfo {
        let c = self.cause();
        ErrorInfo {
            kind: c.kind,
            fault: self.fault().as_str(),
            message: format!("{call}: {self}"),
            call: call.to_string(),
            peer: c.peer,
            hint: c.hint,
            code: self.code(),
        }
    }
}

fn transfer_cause(target: &str, e: &TransferError) -> Cause {
    match e {
        TransferError::PeerUnreachable { peer, .. } => cause(
            "peer_unreachable",
            Some(peer),
            Some(format!("{}; the peer's data port must be reachable from here (MC_TCP_BIND_ADDRESS on the peer)", peer_hint(target))),
        ),
        TransferError::PeerLost { peer, .. } => cause(
            "peer_lost",
            Some(peer),
            Some(peer_hint(target)),
        ),
        TransferError::AddressRejected { peer, .. } => cause(
            "address_rejected",
            Some(peer),
            Some("the remote range must lie inside one buffer the peer registered: compare with get_first_buffer_address / the peer's register_memory calls".into()),
        ),
        TransferError::Protocol { peer, .. } => cause(
            "peer_protocol_error",
            Some(peer),
            Some("the peer speaks another protocol version: MC_TCP_PROTO=1 forces v1 framing; mooncake-doctor --peer shows what it serves".into()),
        ),
        TransferError::Timeout(_) => cause(
            "timeout",
            Some(target),
            Some(format!("MC_TRANSFER_TIMEOUT (seconds) bounds a transfer; {}", peer_hint(target))),
        ),
        TransferError::Canceled(_) => cause("canceled", Some(target), None),
        TransferError::LocalNotRegistered { protocol, .. } => cause(
            "local_not_registered",
            Some(target),
            Some(format!("{protocol} moves registered memory only: register the local buffer with register_memory first (MC_FORCE_TCP=1 moves unregistered memory over TCP)")),
        ),
    }
}

fn engine_cause(e: &EngineError) -> Cause {
    use transfer_engine::metadata::handshake::HandshakeError;
    use transfer_engine::metadata::MetadataError;
    use transfer_engine::transport::TransportError;
    match e {
        EngineError::Config(c) => cause(
            "config",
            None,
            Some(format!("{} has a value the engine cannot use; mooncake-doctor checks every MC_* variable", c.var)),
        ),
        EngineError::Memory(_) => cause("memory", None, None),
        EngineError::Listen { .. } => cause(
            "listen",
            None,
            Some("MC_MIN_RPC_PORT / MC_MAX_RPC_PORT give the port range; MC_TCP_BIND_ADDRESS the address".into()),
        ),
        EngineError::Metadata(MetadataError::Handshake { peer, source }) => {
            let kind = match source {
                HandshakeError::Deadline { .. } => "timeout",
                HandshakeError::Wire(_) | HandshakeError::WrongType { .. } => {
                    "peer_protocol_error"
                }
                HandshakeError::Resolve { .. }
                | HandshakeError::NoAddress { .. }
                | HandshakeError::Connect { .. }
                | HandshakeError::Io { .. } => "peer_unreachable",
            };
            cause(kind, Some(peer), Some(peer_hint(peer)))
        }
        EngineError::Metadata(MetadataError::BadDescriptor { segment, .. }) => cause(
            "peer_protocol_error",
            Some(segment),
            Some(peer_hint(segment)),
        ),
        EngineError::Metadata(MetadataError::UnknownSegment { segment, .. }) => cause(
            "peer_unreachable",
            Some(segment),
            Some("the segment has not joined this metadata store: check the peer's metadata_server argument and MC_METADATA_CLUSTER_ID".into()),
        ),
        EngineError::Metadata(MetadataError::Store { store, cause: c }) => {
            cause("metadata", None, Some(store_hint(store, c)))
        }
        EngineError::Transport(TransportError::Refused(r)) => refused_cause(r),
        EngineError::Transport(TransportError::Unusable { segment, protocol, .. }) => cause(
            "protocol_mismatch",
            Some(segment),
            Some(format!("the peer serves no {protocol} endpoint this engine can use: mooncake-doctor --peer HOST:PORT shows what it serves")),
        ),
        EngineError::Transport(TransportError::Io { .. }) => cause("io", None, None),
        EngineError::Transport(TransportError::Register { protocol, .. }) => cause(
            "memory",
            None,
            Some(format!("the {protocol} transport could not register this memory with its devices: mooncake-doctor (rdma.peermem) checks the peer-memory module device memory needs")),
        ),
        EngineError::Transfer { segment, source } => transfer_cause(segment, source),
        EngineError::NoCommonTransport { segment, .. } => cause("peer_unreachable", Some(segment), Some(peer_hint(segment))),
        EngineError::Handshake { peer, .. } => cause("peer_unreachable", Some(peer), Some(peer_hint(peer))),
        EngineError::Device { cause: c, .. } if c.is_callers() => cause(
            "invalid_argument",
            None,
            Some("the location must name the device the memory is on (\"*\" finds it)".into()),
        ),
        EngineError::Device { .. } => cause(
            "gpu_unavailable",
            None,
            Some("MC_GPU_RUNTIME picks the runtime, MC_MUSART_PATH / MC_CUDART_PATH its file; mooncake-doctor (gpu.runtime) lists what was tried".into()),
        ),
        EngineError::Unsupported { .. } => cause("unsupported", None, None),
        EngineError::UnknownNic(_) => cause("invalid_argument", None, None),
        EngineError::Wire(_) => cause("peer_protocol_error", None, None),
    }
}

/// What helps with a failure of the metadata store `store`, by its case.
fn store_hint(store: &str, c: &transfer_engine::metadata::StoreFailure) -> String {
    use transfer_engine::metadata::StoreFailure as F;
    match c {
        F::NotHttp | F::NoHost | F::QueryOrFragment | F::BadUrl(_) | F::Endpoints(_) => {
            "initialize's metadata_server must be P2PHANDSHAKE, http://host:port/metadata or etcd://host:port[,host:port...]".into()
        }
        F::NameInUse { .. } | F::TakenOver { .. } => {
            "another live engine holds this segment name in the store: give this engine another local_server_name (or stop the other)".into()
        }
        _ => format!("the metadata store {store} must be reachable; mooncake_http_metadata_server serves one"),
    }
}

/// Why `initialize` refused its transports: the engine's [`Refusal`] names the kind and
/// carries the hint.
fn refused_cause(r: &Refusal) -> Cause {
    let kind = match r {
        Refusal::ProtocolNotServed { .. } | Refusal::UnknownProtocol { .. } => {
            "protocol_not_served"
        }
        Refusal::RdmaRequired { .. } => "rdma_unavailable",
        Refusal::GpuUnavailable { .. } => "gpu_unavailable",
        Refusal::Topology { .. } => "config",
    };
    cause(kind, None, Some(r.hint().to_string()))
}

thread_local! {
    static LAST_ERROR: RefCell<Option<ErrorInfo>> = const { RefCell::new(None) };
}

static FIRST_FAILURE: AtomicBool = AtomicBool::new(false);

/// The reason the calling thread's last engine call failed; `None` if it succeeded.
pub fn last_error() -> Option<String> {
    LAST_ERROR.with(|e| e.borrow().as_ref().map(|i| i.message.clone()))
}

/// The typed cause of the calling thread's last failed call; `None` if it succeeded.
pub fn last_error_info() -> Option<ErrorInfo> {
    LAST_ERROR.with(|e| e.borrow().clone())
}

/// Records the outcome of the call named `call` for [`last_error`], logging a failure.
/// The first failure of the process also says where to look next.
pub fn settle<T>(call: &str, result: Result<T, BindingError>) -> Result<T, BindingError> {
    match &result {
        Ok(_) => LAST_ERROR.with(|e| e.borrow_mut().take()),
        Err(err) => {
            let info = err.info(call);
            tracing::error!("{}", info.message);
            if !FIRST_FAILURE.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "first failure of this process ({}): run `mooncake-doctor` (or `python -m mooncake.doctor`) to check this host; TransferEngine.last_error_info() gives the cause",
                    info.kind
                );
            }
            LAST_ERROR.with(|e| e.borrow_mut().replace(info))
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
    fn causes_are_typed() {
        let refused = |r: Refusal| {
            BindingError::Engine(EngineError::Transport(
                transfer_engine::transport::TransportError::Refused(r),
            ))
        };
        assert_eq!(
            status(
                "initialize",
                Err(refused(Refusal::ProtocolNotServed {
                    protocol: "efa".into(),
                    what: "AWS",
                }))
            ),
            -1
        );
        let info = last_error_info().unwrap();
        assert_eq!(info.kind, "protocol_not_served");
        assert_eq!(info.fault, "caller");
        assert_eq!(info.call, "initialize");
        assert_eq!(Some(info.message), last_error());
        use transfer_engine::transport::select::{
            GpuBlocker, RdmaBlocker, RdmaMissing, RdmaProblem,
        };
        let missing = RdmaMissing {
            problems: vec![RdmaProblem::NoHca {
                root: "/sys".into(),
            }],
            hca_present: false,
        };
        let unreadable = transfer_engine::topology::json::TopoFileError::Read {
            path: "/etc/topo.json".into(),
            source: std::io::ErrorKind::NotFound.into(),
        };
        for (r, kind, hint) in [
            (
                Refusal::UnknownProtocol {
                    protocol: "rmda".into(),
                },
                "protocol_not_served",
                "nvlink_intra",
            ),
            (
                Refusal::RdmaRequired {
                    cause: RdmaBlocker::Missing(missing),
                },
                "rdma_unavailable",
                "MC_FORCE_HCA",
            ),
            (
                Refusal::GpuUnavailable {
                    protocol: "musa".into(),
                    cause: GpuBlocker::NoRuntime(
                        transfer_engine::device::RuntimeUnavailable::Disabled,
                    ),
                },
                "gpu_unavailable",
                "MC_GPU_RUNTIME",
            ),
            (
                Refusal::Topology { cause: unreadable },
                "config",
                "MC_CUSTOM_TOPO_JSON",
            ),
        ] {
            let e = refused(r);
            let fault = if kind == "protocol_not_served" || kind == "config" {
                "caller"
            } else {
                "host"
            };
            assert_eq!(e.info("initialize").fault, fault, "{kind}");
            let c = e.cause();
            assert_eq!(c.kind, kind);
            assert!(c.hint.unwrap().contains(hint), "{kind}");
        }
        let t = BindingError::Transfer {
            what: "transfer".into(),
            target: "127.0.0.1:1".into(),
            source: TransferError::PeerUnreachable {
                peer: "127.0.0.1:2".into(),
                cause: transfer_engine::error::Unreachable::Connect(
                    std::io::ErrorKind::ConnectionRefused.into(),
                ),
            },
        };
        let c = t.cause();
        assert_eq!(
            (c.kind, c.peer.as_deref()),
            ("peer_unreachable", Some("127.0.0.1:2"))
        );
        assert!(c
            .hint
            .unwrap()
            .contains("mooncake-doctor --peer 127.0.0.1:1"));
        let timeout = BindingError::Transfer {
            what: "transfer".into(),
            target: "h:1".into(),
            source: TransferError::Timeout(std::time::Duration::from_secs(5)),
        };
        assert!(timeout
            .cause()
            .hint
            .unwrap()
            .contains("MC_TRANSFER_TIMEOUT"));
    }

    #[test]
    fn handshake_failures_are_told_apart_by_variant() {
        use transfer_engine::metadata::handshake::HandshakeError;
        use transfer_engine::metadata::MetadataError;
        let kind = |source: HandshakeError| {
            BindingError::Engine(EngineError::Metadata(MetadataError::Handshake {
                peer: "h:1".into(),
                source,
            }))
            .cause()
            .kind
        };
        let deadline = HandshakeError::Deadline {
            step: "reading the reply",
            limit: std::time::Duration::from_secs(1),
            var: "MC_HANDSHAKE_TIMEOUT",
        };
        assert_eq!(kind(deadline), "timeout");
        let refused = HandshakeError::Connect {
            addr: "127.0.0.1:1".parse().unwrap(),
            source: std::io::ErrorKind::ConnectionRefused.into(),
        };
        assert_eq!(kind(refused), "peer_unreachable");
    }

    /// Memory on another device than its location says is the caller's; a missing runtime
    /// is the host's: told apart by the cause, not the message.
    #[test]
    fn device_mismatches_are_told_apart_by_cause() {
        use transfer_engine::device::RuntimeUnavailable;
        use transfer_engine::engine::error::DeviceMismatch;
        let device = |cause: DeviceMismatch| {
            BindingError::Engine(EngineError::Device {
                location: "cuda:0".into(),
                addr: 0x1000,
                cause,
            })
            .info("register_memory")
        };
        let wrong = device(DeviceMismatch::OtherDevice { device: 1 });
        assert_eq!((wrong.kind, wrong.fault), ("invalid_argument", "caller"));
        let missing = device(RuntimeUnavailable::Disabled.into());
        assert_eq!((missing.kind, missing.fault), ("gpu_unavailable", "host"));
        assert_eq!(missing.code, -6);
    }

    /// A nic_hint naming no HCA of this engine is the caller's argument, code -1.
    #[test]
    fn an_unknown_nic_hint_is_an_invalid_argument() {
        let e = BindingError::Engine(EngineError::UnknownNic(
            transfer_engine::transport::UnknownNic {
                name: "mlx5_9".into(),
                protocol: "rdma",
                nics: vec!["mlx5_0".into()],
            },
        ))
        .info("transfer_sync_write");
        assert_eq!(
            (e.kind, e.fault, e.code),
            ("invalid_argument", "caller", -1)
        );
    }

    /// A store's failure says whose it is by its case: a name held by a live engine is
    /// the caller's to change, an unreachable store the host's.
    #[test]
    fn store_failures_are_told_apart_by_case() {
        use transfer_engine::metadata::{MetadataError, StoreFailure};
        let store = |cause: StoreFailure| {
            BindingError::Engine(EngineError::Metadata(MetadataError::Store {
                store: "http://m:8080/metadata".into(),
                cause,
            }))
            .info("initialize")
        };
        let taken = store(StoreFailure::NameInUse {
            name: "prefill-0".into(),
            at: "10.0.0.2:15000".into(),
        });
        assert_eq!((taken.kind, taken.fault), ("metadata", "caller"));
        assert!(taken.hint.unwrap().contains("local_server_name"));
        let closed = store(StoreFailure::Closed);
        assert_eq!((closed.kind, closed.fault), ("metadata", "host"));
        assert!(closed.hint.unwrap().contains("must be reachable"));
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
            answer: transfer_engine::engine::error::HandshakeAnswer::NotifyRefused("full".into()),
        };
        assert_eq!(status("transfer_sync_write", Err(refused.into())), -1);
    }
}
