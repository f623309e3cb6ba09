//! Why one transfer request failed, said so the caller can act on it, and whose failure it
//! is. (Engine calls fail with [`EngineError`](crate::engine::error::EngineError).)

use std::time::Duration;

use thiserror::Error;

/// Whose failure it is: where the fix lies. Carried as data so that callers, the bindings'
/// `last_error_info()` and the doctor decide by it, never by a message's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// What the caller passed or configured: a bad argument or `MC_*` value, memory it did
    /// not register, a range outside the peer's buffers, a call after shutdown.
    Caller,
    /// The remote engine or the way to it: unreachable, gone, slow past the deadline,
    /// speaking another protocol, or unknown to the metadata store.
    Peer,
    /// This host's resources and drivers: ports, memlock, the verbs library, a GPU runtime,
    /// a device that refuses registration, the metadata store's reachability from here.
    Host,
}

impl Fault {
    /// The name `last_error_info()` reports (`caller`, `peer`, `host`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Caller => "caller",
            Self::Peer => "peer",
            Self::Host => "host",
        }
    }
}

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

impl TransferError {
    /// Whose failure this is.
    pub fn fault(&self) -> Fault {
        match self {
            Self::PeerUnreachable { .. }
            | Self::PeerGone { .. }
            | Self::Protocol { .. }
            | Self::Timeout(_) => Fault::Peer,
            Self::AddressRejected { .. } | Self::LocalNotRegistered { .. } | Self::Canceled(_) => {
                Fault::Caller
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_request_failure_names_whose_it_is() {
        let peer = || "10.0.0.2:1".to_string();
        let cases = [
            (
                TransferError::PeerUnreachable {
                    peer: peer(),
                    reason: "refused".into(),
                },
                Fault::Peer,
            ),
            (
                TransferError::PeerGone {
                    peer: peer(),
                    reason: "reset".into(),
                },
                Fault::Peer,
            ),
            (
                TransferError::Protocol {
                    peer: peer(),
                    reason: "bad status".into(),
                },
                Fault::Peer,
            ),
            (TransferError::Timeout(Duration::from_secs(1)), Fault::Peer),
            (
                TransferError::AddressRejected {
                    peer: peer(),
                    addr: 1,
                    len: 2,
                },
                Fault::Caller,
            ),
            (
                TransferError::LocalNotRegistered {
                    addr: 1,
                    len: 2,
                    protocol: "rdma",
                },
                Fault::Caller,
            ),
            (TransferError::Canceled("shutdown"), Fault::Caller),
        ];
        for (e, fault) in cases {
            assert_eq!(e.fault(), fault, "{e}");
        }
        assert_eq!(Fault::Host.as_str(), "host");
    }
}
