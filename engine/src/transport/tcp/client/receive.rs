//! The receive path: the receiver thread of a connection, and reading one reply (the
//! status, and a read's data, into host memory or through staging into device memory)
//! and completing its slice, which the lanes and callers also do for replies they read
//! themselves.

use std::io;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvError, TryRecvError};

use super::conn::{Conn, Replies};
use super::in_flight::{owed, owed_bytes, InFlight};
use super::retry::refused_by_peer;
use super::LinkShared;
use crate::error::{LinkLoss, TransferError, Violation};
use crate::memory::SocketCut;
use crate::transport::tcp::cut_reader::CutStream;
use crate::transport::tcp::halfway::Halfway;
use crate::transport::tcp::read_ahead::ReadAhead;
use crate::transport::Held;
use crate::wire::tcp::{OpCode, Status, STATUS_LEN};

enum Reply {
    Done,
    Rejected,
}

enum ReplyError {
    Io(io::Error),
    Protocol(Violation),
}

pub(super) fn receive(
    replies: &Replies,
    rx: Receiver<Held>,
    pending: Arc<InFlight>,
    shared: Arc<LinkShared>,
) {
    let mut failure: Option<LinkLoss> = None;
    let mut landing = Landing {
        read: None,
        shared: &shared,
        pending: &pending,
    };
    // Never spins: it serves pipelined requests, where spinning took CPUs from threads
    // with work (15% of 64 KiB throughput on the 16-core host).
    loop {
        let held = match rx.try_recv() {
            Ok(held) => held,
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => {
                // No reply to read next: the caller may be waiting for this one.
                landing.settle();
                crate::device::staging::give_back_thread_stagers();
                match rx.recv() {
                    Ok(held) => held,
                    Err(RecvError) => break,
                }
            }
        };
        let into_device = (held.slice().op == OpCode::Read)
            .then_some(held.slice().local_device)
            .flatten()
            .filter(|_| failure.is_none());
        if landing.device().is_some_and(|d| Some(d) != into_device) {
            landing.settle();
        }
        let owed = owed(held.slice());
        if into_device.is_some() {
            // Its last copies are left running in `landing`; the read there before has
            // landed by the time this one's bytes are all read, and is completed then.
            failure = settle_with(replies, held, &shared, Duration::ZERO, Some(&mut landing));
            // Not counted as half out any more before it stops counting as out.
            pending.whole_in();
        } else {
            settle_next(replies, held, &shared, &mut failure);
        }
        // Its reply was read (a read into device memory: its bytes are off the socket, its
        // copies may still land), or it failed: the lane may ask for more, or read the next
        // reply itself.
        pending.done(owed);
    }
    landing.settle();
}

/// A read into device memory whose last copies may still be running (the receiver
/// thread's stager keeps them running while the next reply comes in): completed once they
/// have landed. Its bytes are no longer owed: they are off the socket.
struct Landing<'a> {
    read: Option<(Held, u32)>,
    shared: &'a LinkShared,
    /// Told when half of the next read's bytes are in.
    pending: &'a InFlight,
}

impl Landing<'_> {
    fn device(&self) -> Option<u32> {
        self.read.as_ref().map(|(_, d)| *d)
    }

    /// The read's copies have completed (or failed): it is done.
    fn landed(&mut self, result: io::Result<()>) {
        let Some((held, _)) = self.read.take() else {
            return;
        };
        match result {
            Ok(()) => self.shared.complete(held, Ok(())),
            Err(e) => self.shared.retry_or_fail(held, LinkLoss::Landing(e.into())),
        }
    }

    /// Waits for the read's copies, then completes it.
    pub(super) fn settle(&mut self) {
        if let Some(device) = self.device() {
            let settled = crate::device::staging::settle(device);
            self.landed(settled);
        }
    }
}

impl Conn {
    /// Reads the replies to `group`, in order, on this thread (nothing else owed on the
    /// connection); once one shows the connection broken, the rest are re-sent or failed.
    pub(super) fn settle_all(&self, group: &mut Vec<Held>, shared: &LinkShared) {
        let mut failure: Option<LinkLoss> = None;
        for held in group.drain(..) {
            settle_next(&self.replies, held, shared, &mut failure);
        }
    }
}

/// Settles the next of the slices in flight on a connection, in order: reads its reply,
/// or, once the connection has failed (`failure`, set here), re-sends it once elsewhere.
pub(super) fn settle_next(
    replies: &Replies,
    held: Held,
    shared: &LinkShared,
    failure: &mut Option<LinkLoss>,
) {
    match failure {
        Some(_) if replies.refused.load(Ordering::Acquire) => shared.step_back(held),
        Some(why) => shared.retry_or_fail(held, why.clone()),
        None => *failure = settle(replies, held, shared, Duration::ZERO),
    }
}

/// A reply came on the connection of `replies`.
fn answered(replies: &Replies) {
    // Read first: every reply passes here, and only the first need write.
    if !replies.answered.load(Ordering::Relaxed) {
        replies.answered.store(true, Ordering::Release);
    }
}

/// Reads the reply to `held` (looking for it awake for `spin` first) and completes it; on
/// a broken connection, marks it `broken`, shuts the socket down and returns why (later
/// slices in flight on it cannot succeed).
pub(super) fn settle(
    replies: &Replies,
    held: Held,
    shared: &LinkShared,
    spin: Duration,
) -> Option<LinkLoss> {
    settle_with(replies, held, shared, spin, None)
}

/// [`settle`], and with `landing`, a read into device memory goes there when done rather
/// than being completed.
fn settle_with(
    replies: &Replies,
    held: Held,
    shared: &LinkShared,
    spin: Duration,
    mut landing: Option<&mut Landing>,
) -> Option<LinkLoss> {
    let Replies {
        stream, cut, ahead, ..
    } = replies;
    let mut ahead = ahead.lock();
    // A lone small request's reply comes within microseconds: wait for it awake. An error
    // here shows again in the read below.
    if ahead.buffered() == 0 {
        crate::transport::tcp::spin::spin_for(spin, || {
            crate::net::wait_readable(stream, Duration::ZERO)
                .map_or(Some(()), |ready| ready.then_some(()))
        });
    }
    let reply = read_reply(
        stream,
        &held,
        shared.v2,
        cut,
        &mut ahead,
        landing.as_deref_mut(),
    );
    if reply.is_ok() {
        answered(replies);
    }
    match reply {
        Ok(Reply::Done) => {
            match (landing, held.slice().local_device) {
                (Some(l), Some(device)) => {
                    l.settle();
                    l.read = Some((held, device));
                }
                _ => shared.complete(held, Ok(())),
            }
            None
        }
        Ok(Reply::Rejected) => {
            let s = held.slice();
            let err = TransferError::AddressRejected {
                peer: shared.peer.to_string(),
                addr: s.remote,
                len: s.len,
            };
            shared.complete(held, Err(err));
            None
        }
        Err(ReplyError::Protocol(violation)) => {
            replies.mark_broken(shared);
            let _ = stream.shutdown(Shutdown::Both);
            let err = TransferError::Protocol {
                peer: shared.peer.to_string(),
                violation: violation.clone(),
            };
            shared.complete(held, Err(err));
            Some(LinkLoss::Violation(violation))
        }
        Err(ReplyError::Io(e)) => receive_failed(replies, held, shared, e),
    }
}

/// Reading the reply to `held` failed with `e`: the connection is broken; the slice goes
/// back to the queue (the peer refused the connection) or is re-sent once, or failed.
/// Returns why, for the slices in flight behind it.
fn receive_failed(
    replies: &Replies,
    held: Held,
    shared: &LinkShared,
    e: io::Error,
) -> Option<LinkLoss> {
    replies.mark_broken(shared);
    let _ = replies.stream.shutdown(Shutdown::Both);
    if refused_by_peer(replies, shared, &e) {
        shared.step_back(held);
        return Some(LinkLoss::Refused);
    }
    let kind = e.kind();
    let e = e.into();
    let why = match kind {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => LinkLoss::NoReply {
            within: shared.io_timeout,
            source: e,
        },
        _ if !replies.answered.load(Ordering::Acquire) => LinkLoss::ClosedBeforeReply(e),
        _ => LinkLoss::Receive(e),
    };
    shared.retry_or_fail(held, why.clone());
    Some(why)
}

/// Reads the reply to `held`. With `landing`, a read into device memory leaves its last
/// copies running, and the read in `landing` is completed once its own have landed.
fn read_reply(
    stream: &TcpStream,
    held: &Held,
    v2: bool,
    cut: &SocketCut,
    ahead: &mut ReadAhead,
    landing: Option<&mut Landing>,
) -> Result<Reply, ReplyError> {
    let own = CutStream { stream, cut };
    if v2 {
        let status = ahead
            .take::<STATUS_LEN>(&mut own.clone(), owed_bytes(held.slice()))
            .map_err(ReplyError::Io)?
            .ok_or_else(|| ReplyError::Io(io::ErrorKind::UnexpectedEof.into()))?;
        match Status::decode(&status).map_err(|e| ReplyError::Protocol(Violation::Status(e)))? {
            Status::Ok => {}
            Status::AddrRejected => return Ok(Reply::Rejected),
        }
    }
    let s = held.slice();
    if s.op == OpCode::Read {
        match (s.local_device, landing) {
            (Some(device), Some(earlier)) => crate::device::staging::receive_landing(
                device,
                &mut Halfway::new(ahead.reader(own), s.len as usize, {
                    let pending = earlier.pending;
                    move || pending.half_in()
                }),
                s.local,
                s.len as usize,
                || {
                    earlier.landed(Ok(()));
                    Ok(())
                },
            ),
            (Some(device), None) => crate::device::staging::receive_into(
                device,
                &mut ahead.reader(own),
                s.local,
                s.len as usize,
            ),
            (None, _) => ahead.recv_span(stream, cut, held.local_span(), None),
        }
        .map_err(ReplyError::Io)?;
    }
    Ok(Reply::Done)
}
