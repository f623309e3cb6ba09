//! The send path of a connection: headers and payloads out (one request, or a group in
//! one `sendmsg`, as a run of writes to a peer of ours), then the slice handed to the
//! receiver, whose reply it now awaits.

use std::io::{self, Write};
use std::time::Duration;

use super::conn::Conn;
use super::in_flight::owed;
use super::lane::Ahead;
use super::receive::settle;
use super::LinkShared;
use crate::device::staging::NextSend;
use crate::error::{LinkLoss, SharedIoError};
use crate::memory::MemSpan;
use crate::transport::tcp::cut_reader::CutStream;
use crate::transport::{Held, Slice};
use crate::wire::tcp::{
    OpCode, RequestHeader, RunHeader, HEADER_LEN, RUN_MAX_BYTES, RUN_MAX_WRITES,
};

impl Conn {
    /// Sends the requests of `group` in one go and hands them to the receiver.
    pub(super) fn send_group(&mut self, group: &mut Vec<Held>, shared: &LinkShared) {
        if self.write_group(group, shared) {
            for held in group.drain(..) {
                self.sent(held, shared);
            }
        }
    }

    /// Sends the requests of `group` in one go; on failure the connection is broken off
    /// and every slice of `group` re-sent once (or failed), and false is returned.
    pub(super) fn write_group(&mut self, group: &mut Vec<Held>, shared: &LinkShared) -> bool {
        let headers: Vec<[u8; HEADER_LEN]> = group
            .iter()
            .map(|h| header_of(h.slice(), shared.v2))
            .collect();
        let run = run_of(group, shared);
        let mut run_head = Vec::new();
        let pieces: Vec<(&[u8], Option<MemSpan>)> = match run {
            // Headers first: the peer knows where every payload goes before the first byte.
            Some(run) => {
                run_head.reserve((group.len() + 1) * HEADER_LEN);
                run_head.extend_from_slice(&run.encode());
                headers.iter().for_each(|h| run_head.extend_from_slice(h));
                std::iter::once((run_head.as_slice(), None))
                    .chain(group.iter().map(|h| (&[][..], Some(h.local_span()))))
                    .collect()
            }
            None => group
                .iter()
                .zip(&headers)
                .map(|(h, head)| {
                    let payload = (h.slice().op == OpCode::Write).then(|| h.local_span());
                    (head.as_slice(), payload)
                })
                .collect(),
        };
        if let Err(e) = MemSpan::send_pieces(&self.stream, &pieces, &self.cut) {
            tracing::debug!("send to {} failed: {e}", shared.peer);
            self.break_off();
            let e = SharedIoError::from(e);
            for held in group.drain(..) {
                shared.resend_after(&self.replies, held, &e);
            }
            return false;
        }
        true
    }

    /// Sends `held` (a device-memory write copying ahead as `ahead` says); true if it was a
    /// lone small request whose reply was read here.
    pub(super) fn send(
        &mut self,
        held: Held,
        shared: &LinkShared,
        queue_empty: bool,
        ahead: Ahead,
    ) -> bool {
        let s = held.slice();
        let header = header_of(s, shared.v2);
        let sent = match (s.op, s.local_device) {
            (OpCode::Write, Some(device)) => crate::device::staging::send_from(
                device,
                &mut CutStream {
                    stream: &self.stream,
                    cut: &self.cut,
                },
                &header,
                s.local,
                s.len as usize,
                ahead.copied,
                // The next slice is held (taken), so its memory stays registered.
                || {
                    ahead.next.map(|(addr, len)| NextSend {
                        addr,
                        len,
                        guard: (),
                    })
                },
            ),
            _ => self.send_host(&held, &header),
        };
        if let Err(e) = sent {
            self.send_failed(held, shared, e);
            return false;
        }
        // Nothing else queued and no reply outstanding on this connection (the receiver
        // has read every earlier one): this reply is the next on the socket, and reading it
        // here saves waking the receiver thread, a cross-core hand-off per request that
        // dominates small single requests on hosts with many cores.
        if queue_empty && self.pending.is_empty() && (shared.v2 || held.slice().op == OpCode::Read)
        {
            let small = held.slice().len <= crate::transport::tcp::spin::SMALL_REQUEST;
            let spin = if small { shared.spin } else { Duration::ZERO };
            let settled = settle(&self.replies, held, shared, spin);
            return small && settled.is_none();
        }
        self.sent(held, shared);
        false
    }

    /// Writes `header` and, for a write, its payload from host memory.
    pub(super) fn send_host(&self, held: &Held, header: &[u8]) -> io::Result<()> {
        match held.slice().op {
            OpCode::Write => held.local_span().send_to(&self.stream, header, &self.cut),
            OpCode::Read => CutStream {
                stream: &self.stream,
                cut: &self.cut,
            }
            .write_all(header),
        }
    }

    /// A send of `held` failed: the connection is done for; the slice is sent again once.
    pub(super) fn send_failed(&self, held: Held, shared: &LinkShared, e: io::Error) {
        tracing::debug!("send to {} failed: {e}", shared.peer);
        self.break_off();
        shared.resend_after(&self.replies, held, &e.into());
    }

    /// `held` is out: a v1 write is done (v1 acknowledges nothing), anything else is the
    /// receiver's from now on, slice and memory.
    pub(super) fn sent(&mut self, held: Held, shared: &LinkShared) {
        if !shared.v2 && held.slice().op == OpCode::Write {
            shared.complete(held, Ok(()));
            return;
        }
        let Some(inflight) = self.inflight.as_ref() else {
            shared.retry_or_fail(held, LinkLoss::Closed);
            return;
        };
        let owed = owed(held.slice());
        self.pending.add(owed);
        if let Err(e) = inflight.send(held) {
            self.pending.done(owed);
            self.break_off();
            shared.retry_or_fail(e.into_inner(), LinkLoss::ReceiverStopped);
        }
    }
}

/// The run a group of host-memory writes goes out as, to a peer that takes runs: two
/// writes at least, within a run's bounds.
fn run_of(group: &[Held], shared: &LinkShared) -> Option<RunHeader> {
    let writes = group.len();
    if !shared.write_runs || !(2..=RUN_MAX_WRITES).contains(&writes) {
        return None;
    }
    let mut bytes = 0u64;
    for h in group {
        let s = h.slice();
        if s.op != OpCode::Write || s.local_device.is_some() {
            return None;
        }
        bytes = bytes.checked_add(s.len)?;
    }
    (bytes <= RUN_MAX_BYTES).then_some(RunHeader { writes, bytes })
}

pub(super) fn header_of(s: &Slice, v2: bool) -> [u8; HEADER_LEN] {
    RequestHeader {
        size: s.len,
        addr: s.remote,
        opcode: s.op,
        v2,
    }
    .encode()
}

/// Payload bytes a slice's request carries: a write's data.
pub(super) fn write_bytes(slice: &Slice) -> u64 {
    match slice.op {
        OpCode::Write => slice.len,
        OpCode::Read => 0,
    }
}
