//! Upstream's `ErrorCode` integers, which the consumers compare (vLLM backs off on
//! [`Code::NoAvailableHandle`]); every store failure the Python API reports is one of these.

use std::fmt;

/// A store failure as upstream numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Code {
    /// `-1`: a failure of ours or of the host (the log and `last_error` say which).
    InternalError,
    /// `-10`: a buffer given by the caller is too small for the object.
    BufferOverflow,
    /// `-200`: no segment has room for the object, even after eviction.
    NoAvailableHandle,
    /// `-600`: an argument was out of range (empty or oversized key, zero size, ...).
    InvalidParams,
    /// `-601`: the master does not know this client (it restarted, or the client was
    /// declared dead); the client mounts its segments again.
    IllegalClient,
    /// `-700`: a put was ended or revoked by a client that did not start it, or twice.
    InvalidWrite,
    /// `-703`: the object's put has not been committed yet.
    ReplicaIsNotReady,
    /// `-704`: no such object (never put, removed, evicted, or its segments are gone).
    ObjectNotFound,
    /// `-705`: a put of a key that already exists.
    ObjectAlreadyExists,
    /// `-706`: the object is leased by a reader and cannot be removed now.
    ObjectHasLease,
    /// `-707`: the lease a read held ran out before the read finished.
    LeaseExpired,
    /// `-800`: the transfer engine failed to move the bytes.
    TransferFail,
    /// `-900`: the RPC to the master failed (unreachable, refused, not one of ours).
    RpcFail,
    /// `-901`: the RPC to the master did not answer in time.
    RpcTimeout,
    /// `-1010`: the call is not possible in the current state (closed client, standby master).
    UnavailableInCurrentStatus,
    /// `-1700`: over the tenant's quota.
    TenantQuotaExceeded,
}

impl Code {
    /// Every code, for tests and the metrics' label set.
    pub const ALL: [Code; 16] = [
        Code::InternalError,
        Code::BufferOverflow,
        Code::NoAvailableHandle,
        Code::InvalidParams,
        Code::IllegalClient,
        Code::InvalidWrite,
        Code::ReplicaIsNotReady,
        Code::ObjectNotFound,
        Code::ObjectAlreadyExists,
        Code::ObjectHasLease,
        Code::LeaseExpired,
        Code::TransferFail,
        Code::RpcFail,
        Code::RpcTimeout,
        Code::UnavailableInCurrentStatus,
        Code::TenantQuotaExceeded,
    ];

    /// Upstream's integer.
    pub const fn value(self) -> i32 {
        match self {
            Code::InternalError => -1,
            Code::BufferOverflow => -10,
            Code::NoAvailableHandle => -200,
            Code::InvalidParams => -600,
            Code::IllegalClient => -601,
            Code::InvalidWrite => -700,
            Code::ReplicaIsNotReady => -703,
            Code::ObjectNotFound => -704,
            Code::ObjectAlreadyExists => -705,
            Code::ObjectHasLease => -706,
            Code::LeaseExpired => -707,
            Code::TransferFail => -800,
            Code::RpcFail => -900,
            Code::RpcTimeout => -901,
            Code::UnavailableInCurrentStatus => -1010,
            Code::TenantQuotaExceeded => -1700,
        }
    }

    /// The code upstream's integer stands for; `None` for integers we never send.
    pub fn from_value(v: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.value() == v)
    }

    /// Upstream's name (`OBJECT_NOT_FOUND`), as its logs and metrics spell it.
    pub const fn name(self) -> &'static str {
        match self {
            Code::InternalError => "INTERNAL_ERROR",
            Code::BufferOverflow => "BUFFER_OVERFLOW",
            Code::NoAvailableHandle => "NO_AVAILABLE_HANDLE",
            Code::InvalidParams => "INVALID_PARAMS",
            Code::IllegalClient => "ILLEGAL_CLIENT",
            Code::InvalidWrite => "INVALID_WRITE",
            Code::ReplicaIsNotReady => "REPLICA_IS_NOT_READY",
            Code::ObjectNotFound => "OBJECT_NOT_FOUND",
            Code::ObjectAlreadyExists => "OBJECT_ALREADY_EXISTS",
            Code::ObjectHasLease => "OBJECT_HAS_LEASE",
            Code::LeaseExpired => "LEASE_EXPIRED",
            Code::TransferFail => "TRANSFER_FAIL",
            Code::RpcFail => "RPC_FAIL",
            Code::RpcTimeout => "RPC_TIMEOUT",
            Code::UnavailableInCurrentStatus => "UNAVAILABLE_IN_CURRENT_STATUS",
            Code::TenantQuotaExceeded => "TENANT_QUOTA_EXCEEDED",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.value())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_are_distinct() {
        let mut seen = std::collections::BTreeSet::new();
        for c in Code::ALL {
            assert!(seen.insert(c.value()), "{c} twice");
            assert_eq!(Code::from_value(c.value()), Some(c));
        }
        assert_eq!(Code::from_value(0), None);
        assert_eq!(Code::NoAvailableHandle.value(), -200);
        assert_eq!(Code::ObjectNotFound.value(), -704);
    }
}
