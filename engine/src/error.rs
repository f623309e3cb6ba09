//! Why one transfer request failed, said so the caller can act on it. (Engine calls
//! fail with [`EngineError`](crate::engine::error::EngineError).)

use std::time::Duration;

use thiserror::Error;

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
    /// The local range is not inside one registered buffer, and the transport (RDMA)
    /// moves only registered memory.
    #[error("local range {addr:#x}+{len} is not inside one registered buffer: {protocol} moves only registered memory (register it with register_memory first)")]
    LocalNotRegistered {
        /// Local address.
        addr: u64,
        /// Length.
        len: u64,
        /// The transport that needs it.
        protocol: &'static str,
    },
    /// The deadline passed before the request completed.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The engine shut down or the batch was abandoned before the request ran.
    #[error("canceled before it ran: {0}")]
    Canceled(&'static str),
}
