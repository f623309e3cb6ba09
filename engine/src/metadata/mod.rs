//! How a peer's segment descriptor is found.
//!
//! P2P handshake mode asks the peer itself over its handshake port. The HTTP store
//! (`http.rs`) keeps descriptors in an upstream-compatible HTTP metadata server, whose
//! Rust implementation is `http_server.rs`. Both sides share the key layout of
//! [`KeySpace`] and the `rpc_meta` value [`RpcMeta`].

// Peer input is parsed here: an index out of range must be an error, never a panic.
#![deny(clippy::indexing_slicing)]

pub mod etcd;
pub mod handshake;
pub mod http;
pub mod http_server;
pub mod store_failure;

use thiserror::Error;

use crate::config::Config;
use crate::wire::descriptor::SegmentDesc;
use crate::wire::handshake::MessageType;
use crate::wire::session::{HostPort, SegmentId};
use crate::wire::WireError;
pub use store_failure::StoreFailure;

/// Why a descriptor could not be fetched or published.
#[derive(Debug, Error)]
pub enum MetadataError {
    /// The segment's engine could not be asked (P2P handshake).
    #[error("handshake with {peer} failed: {source}")]
    Handshake {
        /// The engine's handshake address.
        peer: String,
        /// What went wrong in the exchange.
        #[source]
        source: handshake::HandshakeError,
    },
    /// The descriptor received cannot be used.
    #[error("segment {segment} sent an unusable descriptor: {source}")]
    BadDescriptor {
        /// Segment name.
        segment: String,
        /// Why it does not decode.
        #[source]
        source: WireError,
    },
    /// The metadata store failed or answered something unusable.
    #[error("metadata store {store}: {cause}")]
    Store {
        /// The store's address.
        store: String,
        /// What went wrong, with the key involved and what the store answered.
        #[source]
        cause: StoreFailure,
    },
    /// The store does not know the segment.
    #[error("segment {segment:?} is not registered in metadata store {store}")]
    UnknownSegment {
        /// Segment name.
        segment: String,
        /// The store's address.
        store: String,
    },
}

/// Keys of the metadata stores (upstream's layout): `mooncake/[<cluster id>/]rpc_meta/<name>`
/// holds an engine's [`RpcMeta`], `mooncake/[<cluster id>/]ram/<name>` its segment descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpace {
    prefix: String,
}

impl KeySpace {
    /// The keys of cluster `cluster_id` (`MC_METADATA_CLUSTER_ID`; empty: no cluster part).
    pub fn new(cluster_id: &str) -> Self {
        let prefix = if cluster_id.is_empty() {
            "mooncake/".to_string()
        } else {
            format!("mooncake/{cluster_id}/")
        };
        Self { prefix }
    }

    /// The `rpc_meta` key of segment `name`.
    pub fn rpc_meta(&self, name: &str) -> String {
        format!("{}rpc_meta/{name}", self.prefix)
    }

    /// The descriptor key of segment `name`.
    pub fn ram(&self, name: &str) -> String {
        format!("{}ram/{name}", self.prefix)
    }

    /// For an `rpc_meta` key of any cluster, the descriptor key of the same segment.
    pub fn ram_key_of(rpc_meta_key: &str) -> Option<String> {
        let rest = rpc_meta_key.strip_prefix("mooncake/")?;
        if let Some(name) = rest.strip_prefix("rpc_meta/") {
            return Some(format!("mooncake/ram/{name}"));
        }
        let (cluster, rest) = rest.split_once('/')?;
        let name = rest.strip_prefix("rpc_meta/")?;
        Some(format!("mooncake/{cluster}/ram/{name}"))
    }
}

/// Where an engine answers handshakes (the value of its `rpc_meta` key).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RpcMeta {
    /// Host name or IP address.
    pub ip_or_host_name: String,
    /// Handshake port.
    pub rpc_port: u16,
}

impl RpcMeta {
    /// Parses a stored value (compact JSON; etcd's trailing newline allowed).
    pub fn decode(json: &str) -> Result<Self, WireError> {
        let meta: Self =
            serde_json::from_str(json.trim_end()).map_err(|e| WireError::Json(e.to_string()))?;
        if meta.ip_or_host_name.is_empty() || meta.rpc_port == 0 {
            return Err(WireError::Invalid(format!(
                "rpc_meta {meta:?}: empty host or port 0"
            )));
        }
        Ok(meta)
    }

    /// Compact JSON, as upstream writes it.
    pub fn encode(&self) -> String {
        // A struct of a string and an integer always serialises.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The handshake address.
    pub fn host_port(&self) -> HostPort {
        HostPort {
            host: self.ip_or_host_name.clone(),
            port: self.rpc_port,
        }
    }
}

/// How long an old `rpc_meta` owner has to answer a probe before its entry is replaced.
const OWNER_PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Handshake addresses of the engines of this process that joined a store and have not
/// left it yet.
static LOCAL_ENGINES: parking_lot::Mutex<Vec<RpcMeta>> = parking_lot::Mutex::new(Vec::new());

/// Notes that an engine of this process joined a store at `rpc`.
pub fn local_engine_joined(rpc: &RpcMeta) {
    LOCAL_ENGINES.lock().push(rpc.clone());
}

/// Notes that the engine of this process at `rpc` left its store.
pub fn local_engine_left(rpc: &RpcMeta) {
    let mut all = LOCAL_ENGINES.lock();
    if let Some(i) = all.iter().position(|r| r == rpc) {
        all.swap_remove(i);
    }
}

/// Joining as `name` over an existing `rpc_meta` entry `old`: fine when it is ours, when it
/// is an engine of this process (initialize called again with the same name: the old engine
/// is being replaced, and leaves entries it no longer owns alone), or when its engine does
/// not answer a probe (it died); the caller then replaces the entry. An error naming the
/// live owner otherwise.
pub fn check_old_owner(
    store: &str,
    name: &str,
    old: &RpcMeta,
    ours: &RpcMeta,
    config: &Config,
) -> Result<(), MetadataError> {
    if old == ours {
        return Ok(());
    }
    let at = old.host_port().session_id();
    if LOCAL_ENGINES.lock().contains(old) {
        tracing::info!(
            "metadata store {store}: {name:?} taken over from the engine at {at} of this process"
        );
        return Ok(());
    }
    if engine_alive(&old.host_port(), config, OWNER_PROBE_TIMEOUT) {
        return Err(MetadataError::Store {
            store: store.to_string(),
            cause: StoreFailure::NameInUse {
                name: name.to_string(),
                at,
            },
        });
    }
    tracing::info!(
        "metadata store {store}: replacing the entry of {name:?} left by an engine at {at} that is gone"
    );
    Ok(())
}

/// Decodes the stored descriptor of `id`. Upstream engines before 0.3.13 do not say where
/// their data port is: it is on the host of their handshake address (`rpc_host`).
pub fn stored_desc(
    id: &SegmentId,
    body: &str,
    rpc_host: impl FnOnce() -> Option<HostPort>,
) -> Result<SegmentDesc, MetadataError> {
    let mut desc = SegmentDesc::decode(body).map_err(|source| MetadataError::BadDescriptor {
        segment: id.to_string(),
        source,
    })?;
    if desc.tcp_data_host.is_none() {
        desc.tcp_data_host = rpc_host().map(|a| a.host);
    }
    Ok(desc)
}

/// Whether an engine answers a probe at `addr` within `timeout`.
pub fn engine_alive(addr: &HostPort, config: &Config, timeout: std::time::Duration) -> bool {
    let mut cfg = config.clone();
    cfg.handshake_timeout = timeout;
    cfg.handshake_connect_timeout = timeout.min(cfg.handshake_connect_timeout);
    handshake::request(addr, MessageType::Probe, "{}", &cfg)
        .map(|reply| crate::wire::descriptor::probe_reply_ok(&reply))
        .unwrap_or(false)
}

/// Where segment descriptors are fetched from and published to.
pub trait MetadataStore: Send + Sync {
    /// The current descriptor of segment `id`.
    fn fetch(&self, id: &SegmentId) -> Result<SegmentDesc, MetadataError>;
    /// Makes the local descriptor visible to peers.
    fn publish(&self, desc: &SegmentDesc) -> Result<(), MetadataError>;
    /// Where segment `id`'s engine answers handshakes (notify, probe). P2P mode: the
    /// address in the name itself.
    fn rpc_address(&self, id: &SegmentId) -> Result<HostPort, MetadataError> {
        Ok(id.rpc().clone())
    }
    /// Announces this engine as segment `name`, answering handshakes at `rpc`. P2P mode:
    /// nothing to do.
    fn join(&self, _name: &str, _rpc: &RpcMeta) -> Result<(), MetadataError> {
        Ok(())
    }
    /// Removes this engine's entries (the engine is shutting down). Best effort.
    fn leave(&self) {}
}

/// P2P handshake mode: peers serve their own descriptors; publishing is a no-op.
pub struct P2pStore {
    config: Config,
}

impl P2pStore {
    /// A store using the handshake settings of `config`.
    pub fn new(config: Config) -> Self {
        Self { config }
    }
}

impl MetadataStore for P2pStore {
    fn fetch(&self, id: &SegmentId) -> Result<SegmentDesc, MetadataError> {
        // The request carries the requester's descriptor upstream; servers ignore it.
        let reply = handshake::request(id.rpc(), MessageType::Metadata, "{}", &self.config)?;
        SegmentDesc::decode(&reply).map_err(|source| MetadataError::BadDescriptor {
            segment: id.to_string(),
            source,
        })
    }

    fn publish(&self, _desc: &SegmentDesc) -> Result<(), MetadataError> {
        Ok(())
    }
}
