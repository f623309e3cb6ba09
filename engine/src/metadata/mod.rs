//! How a peer's segment descriptor is found.
//!
//! P2P handshake mode asks the peer itself over its handshake port. HTTP and
//! etcd stores will implement the same [`MetadataStore`] trait.

pub mod handshake;

use crate::config::Config;
use crate::error::EngineError;
use crate::wire::descriptor::SegmentDesc;
use crate::wire::handshake::MessageType;
use crate::wire::session::SegmentId;

/// Where segment descriptors are fetched from and published to.
pub trait MetadataStore: Send + Sync {
    /// The current descriptor of segment `id`.
    fn fetch(&self, id: &SegmentId) -> Result<SegmentDesc, EngineError>;
    /// Makes the local descriptor visible to peers.
    fn publish(&self, desc: &SegmentDesc) -> Result<(), EngineError>;
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
    fn fetch(&self, id: &SegmentId) -> Result<SegmentDesc, EngineError> {
        // The request carries the requester's descriptor upstream; servers ignore it.
        let reply = handshake::request(id.rpc(), MessageType::Metadata, "{}", &self.config)?;
        SegmentDesc::decode(&reply).map_err(|e| EngineError::Segment {
            segment: id.to_string(),
            reason: format!("peer sent an unusable descriptor: {e}"),
        })
    }

    fn publish(&self, _desc: &SegmentDesc) -> Result<(), EngineError> {
        Ok(())
    }
}
