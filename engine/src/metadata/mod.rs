//! How a peer's segment descriptor is found.
//!
//! P2P handshake mode asks the peer itself over its handshake port. HTTP and
//! etcd stores will implement the same [`MetadataStore`] trait.

// Peer input is parsed here: an index out of range must be an error, never a panic.
#![deny(clippy::indexing_slicing)]

pub mod handshake;

use thiserror::Error;

use crate::config::Config;
use crate::wire::descriptor::SegmentDesc;
use crate::wire::handshake::MessageType;
use crate::wire::session::SegmentId;
use crate::wire::WireError;

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
}

/// Where segment descriptors are fetched from and published to.
pub trait MetadataStore: Send + Sync {
    /// The current descriptor of segment `id`.
    fn fetch(&self, id: &SegmentId) -> Result<SegmentDesc, MetadataError>;
    /// Makes the local descriptor visible to peers.
    fn publish(&self, desc: &SegmentDesc) -> Result<(), MetadataError>;
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
