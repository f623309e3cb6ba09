//! The master's RPC messages, versioned by [`PROTOCOL`](super::PROTOCOL). Ids of
//! clients and segments are 128-bit values carried as two `fixed64` halves.

use prost::Message;

/// A 128-bit id (client or segment).
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub struct Id {
    #[prost(fixed64, tag = "1")]
    pub hi: u64,
    #[prost(fixed64, tag = "2")]
    pub lo: u64,
}

impl Id {
    pub fn from_u128(v: u128) -> Self {
        Self {
            hi: (v >> 64) as u64,
            lo: v as u64,
        }
    }

    pub fn to_u128(self) -> u128 {
        (u128::from(self.hi) << 64) | u128::from(self.lo)
    }
}

/// The first call of every client: both sides' versions.
#[derive(Clone, PartialEq, Message)]
pub struct HelloRequest {
    #[prost(string, tag = "1")]
    pub client_version: String,
    #[prost(uint32, tag = "2")]
    pub protocol: u32,
    #[prost(message, optional, tag = "3")]
    pub client_id: Option<Id>,
}

#[derive(Clone, PartialEq, Message)]
pub struct HelloReply {
    #[prost(string, tag = "1")]
    pub master_version: String,
    #[prost(uint32, tag = "2")]
    pub protocol: u32,
    /// How long a silent client stays alive: clients ping at a fraction of it.
    #[prost(uint64, tag = "3")]
    pub client_ttl_ms: u64,
    /// How long a read's lease lasts.
    #[prost(uint64, tag = "4")]
    pub kv_lease_ttl_ms: u64,
}

#[derive(Clone, PartialEq, Message)]
pub struct ClientRequest {
    #[prost(message, optional, tag = "1")]
    pub client_id: Option<Id>,
}

#[derive(Clone, PartialEq, Message)]
pub struct PingReply {
    /// 0: known; `ILLEGAL_CLIENT`: the master does not know this client (mount again).
    #[prost(sint32, tag = "1")]
    pub code: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct Segment {
    #[prost(message, optional, tag = "1")]
    pub id: Option<Id>,
    /// The owner's transfer-engine segment name.
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(uint64, tag = "3")]
    pub base: u64,
    #[prost(uint64, tag = "4")]
    pub size: u64,
}

#[derive(Clone, PartialEq, Message)]
pub struct MountRequest {
    #[prost(message, optional, tag = "1")]
    pub client_id: Option<Id>,
    #[prost(message, optional, tag = "2")]
    pub segment: Option<Segment>,
}

#[derive(Clone, PartialEq, Message)]
pub struct UnmountRequest {
    #[prost(message, optional, tag = "1")]
    pub client_id: Option<Id>,
    #[prost(message, optional, tag = "2")]
    pub segment_id: Option<Id>,
}

#[derive(Clone, PartialEq, Message)]
pub struct CodeReply {
    #[prost(sint32, tag = "1")]
    pub code: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct KeysRequest {
    #[prost(message, optional, tag = "1")]
    pub client_id: Option<Id>,
    #[prost(string, repeated, tag = "2")]
    pub keys: Vec<String>,
}

/// One code per key: `batch_exist` answers 1 / 0 / a negative code.
#[derive(Clone, PartialEq, Message)]
pub struct CodesReply {
    #[prost(sint32, repeated, tag = "1")]
    pub codes: Vec<i32>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Replica {
    #[prost(string, tag = "1")]
    pub segment: String,
    #[prost(uint64, tag = "2")]
    pub addr: u64,
    #[prost(uint64, tag = "3")]
    pub len: u64,
}

#[derive(Clone, PartialEq, Message)]
pub struct ReplicasResult {
    #[prost(sint32, tag = "1")]
    pub code: i32,
    #[prost(message, repeated, tag = "2")]
    pub replicas: Vec<Replica>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ReplicasReply {
    #[prost(message, repeated, tag = "1")]
    pub results: Vec<ReplicasResult>,
}

#[derive(Clone, PartialEq, Message)]
pub struct PutConfig {
    #[prost(uint32, tag = "1")]
    pub replica_num: u32,
    #[prost(string, tag = "2")]
    pub preferred_segment: String,
    #[prost(bool, tag = "3")]
    pub with_soft_pin: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct PutItem {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(uint64, tag = "2")]
    pub len: u64,
}

#[derive(Clone, PartialEq, Message)]
pub struct PutStartRequest {
    #[prost(message, optional, tag = "1")]
    pub client_id: Option<Id>,
    #[prost(message, repeated, tag = "2")]
    pub items: Vec<PutItem>,
    #[prost(message, optional, tag = "3")]
    pub config: Option<PutConfig>,
}

#[derive(Clone, PartialEq, Message)]
pub struct RemoveRequest {
    #[prost(message, optional, tag = "1")]
    pub client_id: Option<Id>,
    #[prost(string, repeated, tag = "2")]
    pub keys: Vec<String>,
    #[prost(bool, tag = "3")]
    pub force: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct RegexRequest {
    #[prost(message, optional, tag = "1")]
    pub client_id: Option<Id>,
    #[prost(string, tag = "2")]
    pub pattern: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct CountReply {
    #[prost(sint32, tag = "1")]
    pub code: i32,
    #[prost(uint64, tag = "2")]
    pub count: u64,
}
