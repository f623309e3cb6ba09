//! Why an engine call failed: the engine layer's error, wrapping the lower layers' errors
//! as sources.

use thiserror::Error;

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
    /// A caller-supplied value is unusable.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
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
    /// The peer's segment could not be opened.
    #[error("cannot open segment {segment:?}: {reason}")]
    Segment {
        /// Segment name.
        segment: String,
        /// Why.
        reason: String,
    },
    /// A handshake request failed.
    #[error("handshake with {peer} failed: {reason}")]
    Handshake {
        /// Peer RPC address.
        peer: String,
        /// Why.
        reason: String,
    },
    /// A GPU runtime is missing or refused a call.
    #[error("{0}")]
    Device(String),
    /// Something the caller asked for that this build does not do.
    #[error("not supported: {0}")]
    Unsupported(String),
    /// Peer bytes that could not be decoded.
    #[error("malformed message from peer: {0}")]
    Wire(#[from] WireError),
}

impl EngineError {
    /// Whose failure this is, from the variant and its source.
    pub fn fault(&self) -> Fault {
        use crate::metadata::MetadataError;
        use crate::transport::select::Refusal;
        use crate::transport::TransportError;
        match self {
            Self::Config(_) | Self::Memory(_) | Self::InvalidArgument(_) | Self::Unsupported(_) => {
                Fault::Caller
            }
            Self::Listen { .. } | Self::Device(_) => Fault::Host,
            Self::Metadata(MetadataError::Store { .. }) => Fault::Host,
            Self::Metadata(_) | Self::Segment { .. } | Self::Handshake { .. } | Self::Wire(_) => {
                Fault::Peer
            }
            Self::Transport(TransportError::Refused(r)) => match r {
                Refusal::ProtocolNotServed { .. }
                | Refusal::UnknownProtocol { .. }
                | Refusal::Topology { .. } => Fault::Caller,
                Refusal::RdmaRequired { .. } | Refusal::GpuUnavailable { .. } => Fault::Host,
            },
            Self::Transport(TransportError::Unusable { .. }) => Fault::Peer,
            Self::Transport(TransportError::Register { .. } | TransportError::Io { .. }) => {
                Fault::Host
            }
            Self::Transfer { source, .. } => source.fault(),
        }
    }

    /// Upstream's numeric error code for this failure.
    pub fn code(&self) -> i32 {
        match self {
            Self::Memory(m) => m.code(),
            Self::InvalidArgument(_) | Self::Config(_) | Self::Unsupported(_) => -1,
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
            Self::Device(_) => -6,
            Self::Handshake { .. } => -104,
            Self::Wire(_) => -103,
            Self::Segment { .. } => -200,
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
            (EngineError::InvalidArgument("len 0".into()), Fault::Caller),
            (EngineError::Unsupported("nic_hint".into()), Fault::Caller),
            (
                EngineError::Listen {
                    what: "cannot listen".into(),
                    source: io(),
                },
                Fault::Host,
            ),
            (EngineError::Device("no libcudart".into()), Fault::Host),
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
                    reason: "reset".into(),
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
}
