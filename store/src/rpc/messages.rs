//! The master's RPC messages, versioned by [`PROTOCOL`](super::PROTOCOL). Ids of
//! clients and segments are 128-bit values carried as two `fixed64` halves.

use prost::bytes::Bytes;
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

/// A batch of keys, packed: the keys' UTF-8 bytes back to back in `packed`, cut by `lens`.
/// One buffer and one packed array instead of a string per key: a batch of a thousand
/// keys costs a few allocations on either side, not a thousand.
#[derive(Clone, PartialEq, Message)]
pub struct KeysRequest {
    #[prost(message, optional, tag = "1")]
    pub client_id: Option<Id>,
    #[prost(bytes = "bytes", tag = "2")]
    pub packed: Bytes,
    #[prost(uint32, repeated, tag = "3")]
    pub lens: Vec<u32>,
}

impl KeysRequest {
    pub fn new<'a>(client_id: Option<Id>, keys: impl IntoIterator<Item = &'a str>) -> Self {
        let keys = keys.into_iter();
        let mut packed = Vec::new();
        let mut lens = Vec::with_capacity(keys.size_hint().0);
        for k in keys {
            packed.extend_from_slice(k.as_bytes());
            lens.push(u32::try_from(k.len()).unwrap_or(u32::MAX));
        }
        Self {
            client_id,
            packed: Bytes::from(packed),
            lens,
        }
    }

    /// How many keys the batch holds.
    pub fn len(&self) -> usize {
        self.lens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    /// The keys; an error (for the peer) when the lengths do not cut `packed` exactly or a
    /// key is not UTF-8.
    pub fn keys(&self) -> Result<Vec<&str>, String> {
        let mut out = Vec::with_capacity(self.lens.len());
        let mut rest: &[u8] = &self.packed;
        for (i, &len) in self.lens.iter().enumerate() {
            let len = len as usize;
            let Some((key, tail)) = rest.split_at_checked(len) else {
                return Err(format!(
                    "key {i} of {len} bytes runs past the {} bytes of packed keys",
                    self.packed.len()
                ));
            };
            out.push(std::str::from_utf8(key).map_err(|e| format!("key {i}: {e}"))?);
            rest = tail;
        }
        if !rest.is_empty() {
            return Err(format!(
                "{} bytes of packed keys are left after the last key",
                rest.len()
            ));
        }
        Ok(out)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_keys_come_back_as_sent() {
        let keys = ["a", "kv-page-17", "é-unicode", &"x".repeat(4096)];
        let req = KeysRequest::new(None, keys.iter().copied());
        let wire = KeysRequest::decode(req.encode_to_vec().as_slice()).unwrap();
        assert_eq!(wire.len(), 4);
        assert_eq!(wire.keys().unwrap(), keys);
        assert!(KeysRequest::new(None, []).keys().unwrap().is_empty());
    }

    #[test]
    fn lengths_that_do_not_cut_the_keys_exactly_are_refused() {
        let past = KeysRequest {
            client_id: None,
            packed: Bytes::from_static(b"abc"),
            lens: vec![2, 2],
        };
        let why = past.keys().unwrap_err();
        assert!(
            why.contains("key 1 of 2 bytes runs past the 3 bytes"),
            "{why}"
        );

        let left = KeysRequest {
            client_id: None,
            packed: Bytes::from_static(b"abcd"),
            lens: vec![1, 1],
        };
        let why = left.keys().unwrap_err();
        assert!(why.contains("2 bytes of packed keys are left"), "{why}");

        let huge = KeysRequest {
            client_id: None,
            packed: Bytes::from_static(b"ab"),
            lens: vec![u32::MAX],
        };
        assert!(huge.keys().is_err());
    }

    #[test]
    fn a_key_that_is_not_utf8_is_refused_by_its_index() {
        let req = KeysRequest {
            client_id: None,
            packed: Bytes::from_static(b"ok\xff\xfe"),
            lens: vec![2, 2],
        };
        let why = req.keys().unwrap_err();
        assert!(why.starts_with("key 1:"), "{why}");
    }
}
