//! Why a transfer or an engine call failed, said so the caller can act on it.

use std::time::Duration;

use thiserror::Error;

use crate::memory::MemoryError;
use crate::wire::WireError;

/// Why one transfer request failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TransferError {
    /// No connection could be made to the peer's data port.
    #[error("peer {peer} is unreachable: {reason}")]
    PeerUnreachable {
        /// Peer address.
        peer: String,
        /// Connect error.
        reason: String,
    },
    /// The connection broke while the request was in flight.
    #[error("connection to peer {peer} lost: {reason}")]
    PeerGone {
        /// Peer address.
        peer: String,
        /// I/O error.
        reason: String,
    },
    /// The remote range is not inside one buffer the peer registered.
    #[error("peer {peer} rejected remote range {addr:#x}+{len}: not inside one registered buffer")]
    AddressRejected {
        /// Segment name or peer address.
        peer: String,
        /// Remote address.
        addr: u64,
        /// Length.
        len: u64,
    },
    /// The peer sent bytes that break the protocol.
    #[error("peer {peer} violated the protocol: {reason}")]
    Protocol {
        /// Peer address.
        peer: String,
        /// What was wrong.
        reason: String,
    },
    /// The deadline passed before the request completed.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The engine shut down or the batch was abandoned before the request ran.
    #[error("canceled before it ran: {0}")]
    Canceled(&'static str),
}

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
    /// Upstream's numeric error code for this failure.
    pub fn code(&self) -> i32 {
        match self {
            Self::Memory(m) => m.code(),
            Self::InvalidArgument(_) | Self::Config(_) | Self::Unsupported(_) => -1,
            Self::Listen { .. } => -102,
            Self::Transport(crate::transport::TransportError::Unusable { .. }) => -201,
            Self::Transport(crate::transport::TransportError::Io { .. }) => -102,
            Self::Transfer { .. } => -1,
            Self::Metadata(crate::metadata::MetadataError::Handshake { .. }) => -104,
            Self::Metadata(crate::metadata::MetadataError::BadDescriptor { .. }) => -200,
            Self::Device(_) => -6,
            Self::Handshake { .. } => -104,
            Self::Wire(_) => -103,
            Self::Segment { .. } => -200,
        }
    }
}
