//! Why an engine call failed: the engine layer's error, wrapping the lower layers' errors
//! as sources.

use thiserror::Error;

use crate::device::{RuntimeUnavailable, Vendor};
use crate::error::{Fault, TransferError};
use crate::memory::MemoryError;
use crate::wire::WireError;

/// Errors of engine calls (as opposed to individual requests).
#[derive(Debug, Error)]
pub enum EngineError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Memory registration failed.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// The engine could not start listening (or start its threads).
    #[error("{what}: {source}")]
    Listen {
        /// What could not be set up.
        what: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A peer's descriptor could not be fetched (or ours published).
    #[error(transparent)]
    Metadata(#[from] crate::metadata::MetadataError),
    /// A transport could not start or take the work.
    #[error(transparent)]
    Transport(#[from] crate::transport::TransportError),
    /// A transfer failed (sync calls).
    #[error("transfer to {segment} failed: {source}")]
    Transfer {
        /// Segment name.
        segment: String,
        /// The first failing request's cause.
        #[source]
        source: TransferError,
    },
    /// The peer's segment could not be opened: no transport of ours speaks a protocol it
    /// serves.
    #[error("cannot open segment {segment:?}: the peer serves {peer_serves:?} and this engine speaks {ours:?}; start the peer with MC_FORCE_TCP=1")]
    NoCommonTransport {
        /// Segment name.
        segment: String,
        /// The protocols its descriptor lists.
        peer_serves: Vec<String>,
        /// Ours.
        ours: Vec<&'static str>,
    },
    /// A handshake request got an answer that refuses it.
    #[error("handshake with {peer} failed: {answer}")]
    Handshake {
        /// The segment asked.
        peer: String,
        /// What it answered.
        #[source]
        answer: HandshakeAnswer,
    },
    /// Memory said to be a GPU's cannot be registered as such.
    #[error("cannot register {location} memory at {addr:#x}: {cause}")]
    Device {
        /// The location the caller named (`cuda:0`).
        location: String,
        /// The memory's address.
        addr: u64,
        /// Why.
        #[source]
        cause: DeviceMismatch,
    },
    /// A metadata connection string this build does not take.
    #[error("not supported: metadata server {conn:?}: {problem}; use {}, http://host:port/metadata or etcd://host:port[,host:port...]", super::P2P_HANDSHAKE)]
    Unsupported {
        /// The connection string.
        conn: String,
        /// What is wrong with it.
        problem: ConnProblem,
    },
    /// Peer bytes that could not be decoded.
    #[error("malformed message from peer: {0}")]
    Wire(#[from] WireError),
    /// A call's `nic_hint` names no NIC this engine chooses among.
    #[error(transparent)]
    UnknownNic(#[from] crate::transport::UnknownNic),
}

/// A peer's answer that refuses a handshake request (its text is the peer's).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HandshakeAnswer {
    /// A notification's reply other than `success`.
    #[error("notify refused: {0:?}")]
    NotifyRefused(String),
    /// A probe's reply that is not a transfer engine's.
    #[error("unexpected probe reply {0:?}")]
    UnexpectedProbeReply(String),
}

/// Why memory said to be on a GPU cannot be registered as that GPU's.
#[derive(Debug, Clone, Error)]
pub enum DeviceMismatch {
    /// No GPU runtime is loaded.
    #[error(transparent)]
    NoRuntime(#[from] RuntimeUnavailable),
    /// The loaded runtime is another vendor's.
    #[error("the loaded GPU runtime is {loaded} ({path})")]
    OtherVendor {
        /// Its vendor.
        loaded: Vendor,
        /// Its library.
        path: String,
    },
    /// The memory is on another device than the location names.
    #[error("the pointer is on device {device}")]
    OtherDevice {
        /// The device it is on.
        device: u32,
    },
    /// The runtime does not know the address as device memory.
    #[error("{path} reports host or unknown memory at this address")]
    NotDeviceMemory {
        /// The runtime's library.
        path: String,
    },
}

impl DeviceMismatch {
    /// Whether the caller named the wrong location (rather than this host lacking the
    /// runtime the location needs).
    pub fn is_callers(&self) -> bool {
        matches!(
            self,
            Self::OtherDevice { .. } | Self::NotDeviceMemory { .. }
        )
    }
}

/// What is wrong with a metadata connection string.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConnProblem {
    /// `https://`: this build has no TLS.
    #[error("https is not supported (this build has no TLS)")]
    Https,
    /// A scheme other than `http` and `etcd`.
    #[error("unknown scheme {0:?}")]
    UnknownScheme(String),
    /// No `scheme://`.
    #[error("no scheme")]
    NoScheme,
}

impl EngineError {
    /// Whose failure this is, from the variant and its source.
    pub fn fault(&self) -> Fault {
        use crate::metadata::MetadataError;
        use crate::transport::TransportError;
        match self {
            Self::Config(_) | Self::Memory(_) | Self::Unsupported { .. } | Self::UnknownNic(_) => {
                Fault::Caller
            }
            Self::Device { cause, .. } if cause.is_callers() => Fault::Caller,
            Self::Listen { .. } | Self::Device { .. } => Fault::Host,
            Self::Metadata(MetadataError::Store { cause, .. }) => cause.fault(),
            Self::Metadata(_)
            | Self::NoCommonTransport { .. }
            | Self::Handshake { .. }
            | Self::Wire(_) => Fault::Peer,
            Self::Transport(TransportError::Refused(r)) => r.fault(),
            Self::Transport(TransportError::Unusable { cause, .. }) => cause.fault(),
            Self::Transport(TransportError::Register { cause, .. }) => cause.fault(),
            Self::Transport(TransportError::Io { .. }) => Fault::Host,
            Self::Transfer { source, .. } => source.fault(),
        }
    }

    /// Upstream's numeric error code for this failure.
    pub fn code(&self) -> i32 {
        match self {
            Self::Memory(m) => m.code(),
            Self::Config(_) | Self::Unsupported { .. } | Self::UnknownNic(_) => -1,
            Self::Listen { .. } => -102,
            Self::Transport(crate::transport::TransportError::Unusable { .. }) => -201,
            Self::Transport(crate::transport::TransportError::Io { .. }) => -102,
            Self::Transport(crate::transport::TransportError::Refused(_)) => -1,
            Self::Transport(crate::transport::TransportError::Register { .. }) => -1,
            Self::Transfer { .. } => -1,
            Self::Metadata(crate::metadata::MetadataError::Handshake { .. }) => -104,
            Self::Metadata(crate::metadata::MetadataError::BadDescriptor { .. }) => -200,
            Self::Metadata(crate::metadata::MetadataError::Store { .. }) => -200,
            Self::Metadata(crate::metadata::MetadataError::UnknownSegment { .. }) => -200,
            Self::Device { .. } => -6,
            Self::Handshake { .. } => -104,
            Self::Wire(_) => -103,
            Self::NoCommonTransport { .. } => -200,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::MetadataError;

    #[test]
    fn each_call_failure_names_whose_it_is() {
        let io = || std::io::Error::from(std::io::ErrorKind::AddrInUse);
        let cases = [
            (
                EngineError::Unsupported {
                    conn: "https://m".into(),
                    problem: ConnProblem::Https,
                },
                Fault::Caller,
            ),
            (
                EngineError::UnknownNic(crate::transport::UnknownNic {
                    name: "mlx5_9".into(),
                    protocol: "rdma",
                    nics: vec!["mlx5_0".into()],
                }),
                Fault::Caller,
            ),
            (
                EngineError::Listen {
                    what: "cannot listen".into(),
                    source: io(),
                },
                Fault::Host,
            ),
            (
                EngineError::Device {
                    location: "cuda:0".into(),
                    addr: 0x1000,
                    cause: RuntimeUnavailable::Disabled.into(),
                },
                Fault::Host,
            ),
            (
                EngineError::Device {
                    location: "cuda:0".into(),
                    addr: 0x1000,
                    cause: DeviceMismatch::OtherDevice { device: 1 },
                },
                Fault::Caller,
            ),
            (
                EngineError::Metadata(MetadataError::UnknownSegment {
                    segment: "prefill-0".into(),
                    store: "http://m".into(),
                }),
                Fault::Peer,
            ),
            (
                EngineError::Handshake {
                    peer: "10.0.0.2:1".into(),
                    answer: HandshakeAnswer::NotifyRefused("queue full".into()),
                },
                Fault::Peer,
            ),
            (
                EngineError::Transfer {
                    segment: "s".into(),
                    source: TransferError::Timeout(std::time::Duration::from_secs(1)),
                },
                Fault::Peer,
            ),
            (
                EngineError::Transfer {
                    segment: "s".into(),
                    source: TransferError::Canceled("shutdown"),
                },
                Fault::Caller,
            ),
        ];
        for (e, fault) in cases {
            assert_eq!(e.fault(), fault, "{e}");
        }
    }

    #[test]
    fn messages_are_built_from_the_fields() {
        let e = EngineError::Unsupported {
            conn: "https://m".into(),
            problem: ConnProblem::Https,
        };
        assert_eq!(
            e.to_string(),
            "not supported: metadata server \"https://m\": https is not supported (this build \
             has no TLS); use P2PHANDSHAKE, http://host:port/metadata or \
             etcd://host:port[,host:port...]"
        );
        let e = EngineError::NoCommonTransport {
            segment: "s".into(),
            peer_serves: vec!["rdma".into()],
            ours: vec!["tcp"],
        };
        assert_eq!(
            e.to_string(),
            "cannot open segment \"s\": the peer serves [\"rdma\"] and this engine speaks \
             [\"tcp\"]; start the peer with MC_FORCE_TCP=1"
        );
        let e = EngineError::Device {
            location: "cuda:0".into(),
            addr: 0x1000,
            cause: DeviceMismatch::OtherDevice { device: 1 },
        };
        assert_eq!(
            e.to_string(),
            "cannot register cuda:0 memory at 0x1000: the pointer is on device 1"
        );
        let e = EngineError::Handshake {
            peer: "p".into(),
            answer: HandshakeAnswer::UnexpectedProbeReply("HTTP/1.1".into()),
        };
        assert_eq!(
            e.to_string(),
            "handshake with p failed: unexpected probe reply \"HTTP/1.1\""
        );
    }
}
