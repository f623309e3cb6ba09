//! Why one transfer request failed, said so the caller can act on it, and whose failure it
//! is. (Engine calls fail with [`EngineError`](crate::engine::error::EngineError).)
//!
//! A failure is data: a [`TransferError`] variant for its kind, an enum naming the case
//! ([`Unreachable`], [`LinkLoss`], [`Violation`]) with the values seen, and the I/O or
//! lower-layer error as its `source()`. Messages are built from those; nothing decides by
//! them.

use std::sync::Arc;
use std::time::Duration;
use std::{fmt, io};

use thiserror::Error;

use crate::wire::WireError;

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

/// An I/O error that every reader of one failed request shares: a [`TransferError`] is
/// kept in its batch's state and cloned to each waiter. Two are equal when their kind and
/// OS error code are (what a reader can tell apart); `source()` is the `io::Error`.
#[derive(Debug, Clone)]
pub struct SharedIoError(Arc<io::Error>);

impl SharedIoError {
    /// The error's kind.
    pub fn kind(&self) -> io::ErrorKind {
        self.0.kind()
    }

    /// The OS error code, if the error came from the OS.
    pub fn raw_os_error(&self) -> Option<i32> {
        self.0.raw_os_error()
    }

    /// The error itself.
    pub fn get(&self) -> &io::Error {
        &self.0
    }
}

impl From<io::Error> for SharedIoError {
    fn from(e: io::Error) -> Self {
        Self(Arc::new(e))
    }
}

impl From<io::ErrorKind> for SharedIoError {
    fn from(kind: io::ErrorKind) -> Self {
        Self(Arc::new(kind.into()))
    }
}

impl PartialEq for SharedIoError {
    fn eq(&self, other: &Self) -> bool {
        self.kind() == other.kind() && self.raw_os_error() == other.raw_os_error()
    }
}

impl Eq for SharedIoError {}

impl fmt::Display for SharedIoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedIoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// The error of a layer above this one (a verbs call of the RDMA backend, an endpoint
/// handshake), kept whole as the source and shared like [`SharedIoError`]. It has no kind
/// to compare: it equals only itself and its clones.
#[derive(Debug, Clone)]
pub struct SharedSource(Arc<dyn std::error::Error + Send + Sync>);

impl SharedSource {
    /// Wraps `e`.
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Arc::new(e))
    }

    /// The error as its own type, if it is a `T`.
    pub fn downcast_ref<T: std::error::Error + 'static>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl From<Box<dyn std::error::Error + Send + Sync>> for SharedSource {
    fn from(e: Box<dyn std::error::Error + Send + Sync>) -> Self {
        Self(Arc::from(e))
    }
}

impl PartialEq for SharedSource {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedSource {}

impl fmt::Display for SharedSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedSource {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// Why one transfer request failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TransferError {
    /// No connection could be made to the peer, or its memory cannot be reached from here.
    #[error("peer {peer} is unreachable: {cause}")]
    PeerUnreachable {
        /// Peer address (segment, data address or NIC path).
        peer: String,
        /// Why.
        #[source]
        cause: Unreachable,
    },
    /// The connection broke while the request was in flight.
    #[error("connection to peer {peer} lost: {cause}")]
    PeerLost {
        /// Peer address.
        peer: String,
        /// How it broke.
        #[source]
        cause: LinkLoss,
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
    #[error("peer {peer} violated the protocol: {violation}")]
    Protocol {
        /// Peer address.
        peer: String,
        /// What was violated, with what was seen.
        #[source]
        violation: Violation,
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
            | Self::PeerLost { .. }
            | Self::Protocol { .. }
            | Self::Timeout(_) => Fault::Peer,
            Self::AddressRejected { .. } | Self::LocalNotRegistered { .. } | Self::Canceled(_) => {
                Fault::Caller
            }
        }
    }

    /// A device copy to or from `peer`'s memory over same-host GPU IPC failed with
    /// `source`: the runtime's [`DeviceError`](crate::device::DeviceError), or why the copy
    /// could not be issued.
    pub fn device_copy(peer: &str, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::PeerLost {
            peer: peer.to_string(),
            cause: LinkLoss::DeviceCopy(SharedSource::new(source)),
        }
    }

    /// The same failure, said to have come after `attempts` attempts over every path.
    pub fn after_attempts(self, attempts: usize) -> Self {
        match self {
            Self::PeerLost { peer, cause } => Self::PeerLost {
                peer,
                cause: LinkLoss::Exhausted {
                    last: Box::new(cause),
                    attempts,
                },
            },
            Self::PeerUnreachable { peer, cause } => Self::PeerUnreachable {
                peer,
                cause: Unreachable::Exhausted {
                    last: Box::new(cause),
                    attempts,
                },
            },
            other => other,
        }
    }
}

/// Why a peer cannot be reached for a request.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Unreachable {
    /// TCP: the connect to the peer's data port failed.
    #[error("connect failed: {0}")]
    Connect(#[source] SharedIoError),
    /// TCP: the new connection's send timeout could not be set.
    #[error("setting a send timeout failed: {0}")]
    SendTimeout(#[source] SharedIoError),
    /// Same-host GPU IPC: the request's local memory is host memory, which it does not move.
    #[error("{protocol} moves device memory only; this request's local memory is host memory (use protocol tcp for host memory)")]
    HostMemory {
        /// The IPC protocol.
        protocol: &'static str,
    },
    /// Same-host GPU IPC: the peer's buffer could not be opened or mapped here; the IPC
    /// transport's import steps say why in text.
    #[error("{protocol}: {reason}")]
    Import {
        /// The IPC protocol.
        protocol: &'static str,
        /// What the import step reported.
        reason: String,
    },
    /// Same-host GPU IPC: the peer's process has exited.
    #[error("its process has exited")]
    ProcessExited,
    /// RDMA: the peer's descriptor lists no RDMA device.
    #[error("the peer's descriptor lists no RDMA device")]
    NoRdmaDevice,
    /// RDMA: every endpoint this HCA may hold is busy.
    #[error("{max} endpoints busy on this HCA (MC_MAX_EP_PER_CTX); try again later")]
    EndpointsBusy {
        /// `MC_MAX_EP_PER_CTX`.
        max: usize,
    },
    /// RDMA: our local buffer is device memory no HCA registered (staged), and the peer
    /// has no TCP data port to stage it over.
    #[error("the local buffer at {addr:#x} is device memory no HCA could register (staged), and the peer offers no TCP data port to stage it over; load the peer-memory module (nvidia-peermem / mthreads-peermem)")]
    LocalStaged {
        /// The local region's address.
        addr: u64,
    },
    /// RDMA: the peer's buffer is staged at the peer, and TCP may not carry it.
    #[error("its buffer at {addr:#x} is staged (no HCA of the peer could register that device memory: load its peer-memory module), and {}", staged_peer_tail(*.force_hca))]
    PeerStaged {
        /// The remote address.
        addr: u64,
        /// Whether `MC_FORCE_HCA=1` is what forbids TCP (else the peer has no TCP port).
        force_hca: bool,
    },
    /// RDMA: a queue pair for the endpoint could not be created.
    #[error("cannot create a queue pair: {0}")]
    CreateQueuePair(#[source] SharedSource),
    /// RDMA: a queue pair could not be connected to the peer's.
    #[error("cannot connect a queue pair: {0}")]
    ConnectQueuePair(#[source] SharedSource),
    /// RDMA: the endpoint handshake got no reply.
    #[error("endpoint handshake failed: {0}")]
    EndpointHandshake(#[source] SharedSource),
    /// RDMA: the peer refused the endpoint, with its reply's message.
    #[error("the peer refused the endpoint: {reply}")]
    EndpointRefused {
        /// The peer's `reply_msg`.
        reply: String,
    },
    /// Every path was tried; the last attempt failed so.
    #[error("{last} (after {attempts} attempts over every path; MC_RETRY_CNT)")]
    Exhausted {
        /// Why the last attempt failed.
        #[source]
        last: Box<Unreachable>,
        /// Attempts made.
        attempts: usize,
    },
}

fn staged_peer_tail(force_hca: bool) -> &'static str {
    if force_hca {
        "MC_FORCE_HCA=1 forbids moving it over TCP"
    } else {
        "it offers no TCP data port"
    }
}

/// How the connection carrying a request broke.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LinkLoss {
    /// TCP: sending the request failed.
    #[error("send failed: {0}")]
    Send(#[source] SharedIoError),
    /// TCP: reading the reply failed.
    #[error("receive failed: {0}")]
    Receive(#[source] SharedIoError),
    /// TCP: the peer closed the connection before any reply came on it (what a data server
    /// at its connection cap does).
    #[error("receive failed: {0}; the peer closed the connection before any reply (a data server at its MC_TCP_SERVER_MAX_CONNECTIONS or _PER_IP does)")]
    ClosedBeforeReply(#[source] SharedIoError),
    /// TCP: no reply within the status timeout.
    #[error("no reply within {within:?} (MC_TCP_STATUS_TIMEOUT_SEC)")]
    NoReply {
        /// `MC_TCP_STATUS_TIMEOUT_SEC`.
        within: Duration,
        /// The read's error.
        #[source]
        source: SharedIoError,
    },
    /// TCP: the connection was found closed when the request was to be sent.
    #[error("connection closed")]
    Closed,
    /// TCP: the connection's receiver had stopped.
    #[error("receiver stopped")]
    ReceiverStopped,
    /// TCP: the peer refused the connection (its data server's connection cap).
    #[error("the peer refused the connection (its data server's connection cap)")]
    Refused,
    /// TCP: copying a read's bytes into device memory failed.
    #[error("copy into device memory failed: {0}")]
    Landing(#[source] SharedIoError),
    /// An earlier reply on the connection broke the protocol.
    #[error("{0}")]
    Violation(#[source] Violation),
    /// RDMA: posting the work request failed.
    #[error("posting failed: {0}")]
    Post(#[source] SharedSource),
    /// RDMA: no answer from the peer's port (`IBV_WC_RETRY_EXC_ERR`).
    #[error("no answer from the peer's port (retry exceeded)")]
    RetryExceeded,
    /// RDMA: the queue pair was in error before the request ran (`IBV_WC_WR_FLUSH_ERR`).
    #[error("the queue pair went to error before the request ran (flushed)")]
    Flushed,
    /// RDMA: the work request completed with another failure status.
    #[error("work request failed: {0}")]
    WorkRequest(FailedCompletion),
    /// RDMA: no path was left to try.
    #[error("no path left")]
    NoPathLeft,
    /// Same-host GPU IPC: the device copy failed (the source is the runtime's
    /// [`DeviceError`](crate::device::DeviceError), or why the copy could not be issued;
    /// shared: it is too large to carry inline in every request's error).
    #[error("device copy over IPC failed: {0}")]
    DeviceCopy(#[source] SharedSource),
    /// Every path was tried; the last attempt failed so.
    #[error("{last} (after {attempts} attempts over every path; MC_RETRY_CNT)")]
    Exhausted {
        /// How the last attempt failed.
        #[source]
        last: Box<LinkLoss>,
        /// Attempts made.
        attempts: usize,
    },
}

/// A work completion's failure status, as the HCA reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailedCompletion {
    /// The status.
    pub status: crate::verbs::WcStatus,
    /// Its raw `ibv_wc_status` value.
    pub raw: u32,
    /// The vendor's error code.
    pub vendor_err: u32,
}

impl fmt::Display for FailedCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (status {}, vendor error {:#x})",
            self.status, self.raw, self.vendor_err
        )
    }
}

/// What a peer sent that breaks the protocol, with what was seen.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Violation {
    /// TCP: a reply's status frame does not decode (the source has the bytes).
    #[error("{0}")]
    Status(#[source] WireError),
    /// RDMA: the endpoint handshake's reply does not decode.
    #[error("bad endpoint handshake reply: {0}")]
    EndpointReply(#[source] WireError),
    /// RDMA: the endpoint handshake's reply has a GID that does not parse.
    #[error("{0}")]
    EndpointGid(#[source] WireError),
    /// RDMA: the peer answered with another number of queue pairs than ours.
    #[error(
        "the peer answered with {theirs} queue pairs for our {ours} (MC_NUM_QP_PER_EP must match)"
    )]
    QueuePairCount {
        /// Ours.
        ours: usize,
        /// The peer's.
        theirs: usize,
    },
    /// RDMA: the peer's descriptor has no remote key for the chosen device of the buffer.
    #[error("its descriptor lacks a remote key for device {device}")]
    MissingRemoteKey {
        /// The peer's device index.
        device: usize,
    },
    /// RDMA: the request names a buffer the peer's descriptor does not have.
    #[error("buffer index {index} out of range")]
    BufferIndex {
        /// The buffer index.
        index: usize,
    },
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;
    use crate::device::DeviceError;

    fn peer() -> String {
        "10.0.0.2:1".to_string()
    }

    #[test]
    fn each_request_failure_names_whose_it_is() {
        let refused = || SharedIoError::from(io::ErrorKind::ConnectionRefused);
        let cases = [
            (
                TransferError::PeerUnreachable {
                    peer: peer(),
                    cause: Unreachable::Connect(refused()),
                },
                Fault::Peer,
            ),
            (
                TransferError::PeerLost {
                    peer: peer(),
                    cause: LinkLoss::Receive(io::ErrorKind::ConnectionReset.into()),
                },
                Fault::Peer,
            ),
            (
                TransferError::device_copy(
                    &peer(),
                    DeviceError {
                        call: "cuMemcpyDtoDAsync".into(),
                        code: 700,
                        message: "an illegal memory access was encountered".into(),
                    },
                ),
                Fault::Peer,
            ),
            (
                TransferError::Protocol {
                    peer: peer(),
                    violation: Violation::Status(WireError::UnknownStatus(9)),
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

    /// The I/O error of a failed connect, found by walking `source()` as any caller would.
    #[test]
    fn an_unreachable_peer_carries_the_connect_error_as_its_source() {
        let e = TransferError::PeerUnreachable {
            peer: peer(),
            cause: Unreachable::Connect(io::Error::from(io::ErrorKind::ConnectionRefused).into()),
        };
        let mut chain = Vec::new();
        let mut next: Option<&dyn std::error::Error> = Some(&e);
        while let Some(err) = next {
            chain.push(err);
            next = err.source();
        }
        let io = chain
            .iter()
            .find_map(|e| e.downcast_ref::<io::Error>())
            .expect("an io::Error in the chain");
        assert_eq!(io.kind(), io::ErrorKind::ConnectionRefused);
        assert!(matches!(
            chain.get(1).and_then(|e| e.downcast_ref::<Unreachable>()),
            Some(Unreachable::Connect(s)) if s.kind() == io::ErrorKind::ConnectionRefused
        ));
        assert_eq!(
            e.to_string(),
            format!(
                "peer 10.0.0.2:1 is unreachable: connect failed: {}",
                io::Error::from(io::ErrorKind::ConnectionRefused)
            )
        );
    }

    #[test]
    fn a_protocol_violation_names_the_case_and_the_bytes_seen() {
        let raw = 0x4d43_5456_0000_0009_u64;
        let e = TransferError::Protocol {
            peer: peer(),
            violation: Violation::Status(WireError::BadStatusMagic(raw)),
        };
        let TransferError::Protocol { violation, .. } = &e else {
            unreachable!()
        };
        assert_eq!(
            violation,
            &Violation::Status(WireError::BadStatusMagic(raw))
        );
        let wire = e
            .source()
            .and_then(|v| v.source())
            .and_then(|w| w.downcast_ref::<WireError>());
        assert_eq!(wire, Some(&WireError::BadStatusMagic(raw)));
        assert!(e.to_string().contains("0x4d43545600000009"), "{e}");
        let count = Violation::QueuePairCount { ours: 2, theirs: 1 };
        assert_eq!(
            count.to_string(),
            "the peer answered with 1 queue pairs for our 2 (MC_NUM_QP_PER_EP must match)"
        );
    }

    /// Readers of one failure compare equal; failures of another kind or OS code do not.
    #[test]
    fn shared_io_errors_compare_by_kind_and_os_code() {
        let a = SharedIoError::from(io::Error::from_raw_os_error(111));
        assert_eq!(a, a.clone());
        assert_eq!(a, SharedIoError::from(io::Error::from_raw_os_error(111)));
        assert_ne!(a, SharedIoError::from(io::Error::from_raw_os_error(104)));
        assert_ne!(
            SharedIoError::from(io::ErrorKind::TimedOut),
            SharedIoError::from(io::ErrorKind::WouldBlock)
        );
        let s = SharedSource::new(WireError::NotUtf8);
        assert_eq!(s, s.clone());
        assert_ne!(s, SharedSource::new(WireError::NotUtf8));
        assert_eq!(s.downcast_ref::<WireError>(), Some(&WireError::NotUtf8));
    }

    #[test]
    fn the_last_attempt_s_cause_is_kept_under_the_count() {
        let lost = TransferError::PeerLost {
            peer: peer(),
            cause: LinkLoss::RetryExceeded,
        }
        .after_attempts(4);
        let TransferError::PeerLost {
            cause: LinkLoss::Exhausted { last, attempts },
            ..
        } = &lost
        else {
            panic!("{lost:?}")
        };
        assert_eq!((**last).clone(), LinkLoss::RetryExceeded);
        assert_eq!(*attempts, 4);
        assert_eq!(
            lost.to_string(),
            "connection to peer 10.0.0.2:1 lost: no answer from the peer's port (retry exceeded) \
             (after 4 attempts over every path; MC_RETRY_CNT)"
        );
        let timeout = TransferError::Timeout(Duration::from_secs(1));
        assert_eq!(timeout.clone().after_attempts(2), timeout);
    }

    #[test]
    fn a_failed_device_copy_keeps_the_runtime_s_error() {
        let device = DeviceError {
            call: "cuMemcpyDtoDAsync".into(),
            code: 700,
            message: "an illegal memory access was encountered".into(),
        };
        let e = TransferError::device_copy("prefill-0", device.clone());
        let found = e
            .source()
            .and_then(|loss| loss.source())
            .and_then(|shared| shared.source())
            .and_then(|d| d.downcast_ref::<DeviceError>());
        assert_eq!(found, Some(&device));
        assert_eq!(
            e.to_string(),
            format!("connection to peer prefill-0 lost: device copy over IPC failed: {device}")
        );
    }
}
