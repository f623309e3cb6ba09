//! Reads of host memory pipelined on one connection, answered in one `sendmsg`.
//!
//! A lane sends a group of read requests in one go, so the data server often has several
//! headers buffered when it takes the first. Answered one `sendmsg` each, every reply of a
//! 64 KiB read woke the peer's receiver on its own: on the 2-CPU VM the server's thread then
//! spent 43% of the time in the transmit path's wake-ups and 64 KiB reads moved 2.5-3.2 GB/s
//! against 4.8-5.0 for the same writes. Taken together (each status followed by its data, in
//! order), the replies of a run leave in one call.

use std::sync::Arc;

use super::read_ahead::ReadAhead;
use crate::memory::{Abort, MemoryRegistry, Pin, Region};
use crate::wire::tcp::{OpCode, RequestHeader, HEADER_LEN};

/// Requests answered in one call at most (the first included).
pub const RUN_REQUESTS: usize = 16;
/// Bytes of data answered in one call at most: a run adds requests while under this.
pub const RUN_BYTES: u64 = 1 << 20;

/// The next request, if it is buffered whole in `ahead` and reads registered memory: its
/// header and a pin on that memory. It stays in `ahead`.
pub fn buffered_read(
    ahead: &ReadAhead,
    memory: &MemoryRegistry,
    holder: &Arc<dyn Abort>,
    last: &mut Option<Arc<Region>>,
) -> Option<(RequestHeader, Pin)> {
    let h = RequestHeader::decode(&ahead.peek::<HEADER_LEN>()?).ok()?;
    if h.opcode != OpCode::Read {
        return None;
    }
    let pin = memory.pin_near(h.addr, h.size, holder, last)?;
    Some((h, pin))
}

/// The requests that follow one of `first` bytes, buffered whole in `ahead` already, that
/// read registered host memory, while the run stays within [`RUN_REQUESTS`] and
/// [`RUN_BYTES`]: each taken out of `ahead` with its pin. The first other request (a
/// write, device memory, a range not registered: the serving loop answers it as usual)
/// ends the run, as does a header not all here: this never waits for the peer.
pub fn more_host_reads(
    ahead: &mut ReadAhead,
    first: u64,
    memory: &MemoryRegistry,
    holder: &Arc<dyn Abort>,
    last: &mut Option<Arc<Region>>,
) -> Vec<(RequestHeader, Pin)> {
    let mut run = Vec::new();
    let mut bytes = first;
    while run.len() + 1 < RUN_REQUESTS && bytes < RUN_BYTES {
        let Some((h, pin)) = buffered_read(ahead, memory, holder, last) else {
            break;
        };
        if bytes.saturating_add(h.size) > RUN_BYTES
            || pin.region().device.is_some()
            || pin.span(h.addr, h.size).is_none()
        {
            break;
        }
        ahead.skip(HEADER_LEN);
        bytes += h.size;
        run.push((h, pin));
    }
    run
}
