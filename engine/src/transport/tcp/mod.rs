//! TCP v2 as upstream speaks it (and v1 for old peers).
//!
//! The server answers one request after another on each connection, so it
//! serves upstream clients (a connection per request) and ours (persistent,
//! pipelined connections, several per peer) alike.

pub mod client;
pub mod server;

/// One piece of a request, as a lane sends it.
#[derive(Debug)]
pub struct Slice {
    /// Read or write.
    pub op: crate::wire::tcp::OpCode,
    /// Local address (source of a write, destination of a read).
    pub local: u64,
    /// Remote address.
    pub remote: u64,
    /// Bytes.
    pub len: u64,
    /// The GPU holding the local range, if it is device memory.
    pub local_device: Option<u32>,
    /// The batch it belongs to.
    pub batch: std::sync::Arc<crate::task::BatchState>,
    /// Index of its request in the batch.
    pub task: usize,
    /// Times it was re-sent after a connection broke.
    pub retries: u8,
}

impl Slice {
    pub(crate) fn finish(self, result: Result<(), crate::error::TransferError>) {
        self.batch.slice_done(self.task, result);
    }
}
