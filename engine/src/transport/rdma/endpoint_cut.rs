//! The carrier of an endpoint's slices ([`EndpointCut`]): what a cut of the memory
//! contract does to an RDMA endpoint.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::backend::QueuePair;
use crate::memory::Abort;

/// The carrier of an endpoint's slices: cutting it moves its queue pairs to ERROR, so the
/// HCA flushes every outstanding request and touches none of their memory again.
#[derive(Debug)]
pub(crate) struct EndpointCut {
    pub(super) qps: Vec<Arc<dyn QueuePair>>,
    broken: AtomicBool,
}

impl EndpointCut {
    /// A switch over freshly connected queue pairs.
    pub(crate) fn new(qps: Vec<Arc<dyn QueuePair>>) -> Self {
        Self {
            qps,
            broken: AtomicBool::new(false),
        }
    }
}

impl Abort for EndpointCut {
    fn abort(&self) {
        self.broken.store(true, Ordering::SeqCst);
        self.qps.iter().for_each(|q| q.to_error());
    }
}

impl EndpointCut {
    pub(super) fn is_broken(&self) -> bool {
        self.broken.load(Ordering::SeqCst)
    }
}
