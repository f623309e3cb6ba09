//! The subset of etcd v3's `etcdserverpb` and `mvccpb` messages this client sends and
//! reads, with etcd's field numbers (`api/etcdserverpb/rpc.proto`, `api/mvccpb/kv.proto`).
//! Fields left out are ones we never set; prost skips unknown fields in answers.

use prost::Message;

#[derive(Clone, PartialEq, Message)]
pub struct ResponseHeader {
    #[prost(uint64, tag = "1")]
    pub cluster_id: u64,
    #[prost(uint64, tag = "2")]
    pub member_id: u64,
    #[prost(int64, tag = "3")]
    pub revision: i64,
    #[prost(uint64, tag = "4")]
    pub raft_term: u64,
}

#[derive(Clone, PartialEq, Message)]
pub struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(int64, tag = "2")]
    pub create_revision: i64,
    #[prost(int64, tag = "3")]
    pub mod_revision: i64,
    #[prost(int64, tag = "4")]
    pub version: i64,
    #[prost(bytes = "vec", tag = "5")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "6")]
    pub lease: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct RangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
pub struct RangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(message, repeated, tag = "2")]
    pub kvs: Vec<KeyValue>,
    #[prost(bool, tag = "3")]
    pub more: bool,
    #[prost(int64, tag = "4")]
    pub count: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub lease: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct PutResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

#[derive(Clone, PartialEq, Message)]
pub struct DeleteRangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
pub struct DeleteRangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub deleted: i64,
}

/// `Compare.CompareResult`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum CompareResult {
    Equal = 0,
    Greater = 1,
    Less = 2,
    NotEqual = 3,
}

/// `Compare.CompareTarget`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum CompareTarget {
    Version = 0,
    Create = 1,
    Mod = 2,
    Value = 3,
    Lease = 4,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum TargetUnion {
    #[prost(int64, tag = "4")]
    Version(i64),
    #[prost(int64, tag = "5")]
    CreateRevision(i64),
    #[prost(int64, tag = "6")]
    ModRevision(i64),
    #[prost(bytes, tag = "7")]
    Value(Vec<u8>),
    #[prost(int64, tag = "8")]
    Lease(i64),
}

#[derive(Clone, PartialEq, Message)]
pub struct Compare {
    #[prost(enumeration = "CompareResult", tag = "1")]
    pub result: i32,
    #[prost(enumeration = "CompareTarget", tag = "2")]
    pub target: i32,
    #[prost(bytes = "vec", tag = "3")]
    pub key: Vec<u8>,
    #[prost(oneof = "TargetUnion", tags = "4, 5, 6, 7, 8")]
    pub target_union: Option<TargetUnion>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Request {
    #[prost(message, tag = "1")]
    RequestRange(RangeRequest),
    #[prost(message, tag = "2")]
    RequestPut(PutRequest),
    #[prost(message, tag = "3")]
    RequestDeleteRange(DeleteRangeRequest),
}

#[derive(Clone, PartialEq, Message)]
pub struct RequestOp {
    #[prost(oneof = "Request", tags = "1, 2, 3")]
    pub request: Option<Request>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Response {
    #[prost(message, tag = "1")]
    ResponseRange(RangeResponse),
    #[prost(message, tag = "2")]
    ResponsePut(PutResponse),
    #[prost(message, tag = "3")]
    ResponseDeleteRange(DeleteRangeResponse),
}

#[derive(Clone, PartialEq, Message)]
pub struct ResponseOp {
    #[prost(oneof = "Response", tags = "1, 2, 3")]
    pub response: Option<Response>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TxnRequest {
    #[prost(message, repeated, tag = "1")]
    pub compare: Vec<Compare>,
    #[prost(message, repeated, tag = "2")]
    pub success: Vec<RequestOp>,
    #[prost(message, repeated, tag = "3")]
    pub failure: Vec<RequestOp>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TxnResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(bool, tag = "2")]
    pub succeeded: bool,
    #[prost(message, repeated, tag = "3")]
    pub responses: Vec<ResponseOp>,
}

#[derive(Clone, PartialEq, Message)]
pub struct LeaseGrantRequest {
    #[prost(int64, tag = "1")]
    pub ttl: i64,
    #[prost(int64, tag = "2")]
    pub id: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct LeaseGrantResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub id: i64,
    #[prost(int64, tag = "3")]
    pub ttl: i64,
    #[prost(string, tag = "4")]
    pub error: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct LeaseRevokeRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct LeaseRevokeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

#[derive(Clone, PartialEq, Message)]
pub struct LeaseKeepAliveRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct LeaseKeepAliveResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub id: i64,
    #[prost(int64, tag = "3")]
    pub ttl: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct WatchCreateRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub start_revision: i64,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum RequestUnion {
    #[prost(message, tag = "1")]
    CreateRequest(WatchCreateRequest),
}

#[derive(Clone, PartialEq, Message)]
pub struct WatchRequest {
    #[prost(oneof = "RequestUnion", tags = "1")]
    pub request_union: Option<RequestUnion>,
}

/// `mvccpb.Event.EventType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum EventType {
    Put = 0,
    Delete = 1,
}

#[derive(Clone, PartialEq, Message)]
pub struct Event {
    #[prost(enumeration = "EventType", tag = "1")]
    pub r#type: i32,
    #[prost(message, optional, tag = "2")]
    pub kv: Option<KeyValue>,
    #[prost(message, optional, tag = "3")]
    pub prev_kv: Option<KeyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct WatchResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub watch_id: i64,
    #[prost(bool, tag = "3")]
    pub created: bool,
    #[prost(bool, tag = "4")]
    pub canceled: bool,
    #[prost(int64, tag = "5")]
    pub compact_revision: i64,
    #[prost(string, tag = "6")]
    pub cancel_reason: String,
    #[prost(message, repeated, tag = "11")]
    pub events: Vec<Event>,
}
