//! One connection of a link ([`Conn`]): opening it with its receiver thread, whether it
//! is still good to use, and taking slices on it.

use std::io;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, unbounded, Sender};
use parking_lot::Mutex;

use super::in_flight::InFlight;
use super::receive::receive;
use super::LinkShared;
use crate::memory::{Abort, SocketCut};
use crate::transport::tcp::read_ahead::ReadAhead;
use crate::transport::{Held, Slice};

/// How many sent slices a connection's receiver may have queued before the sender waits.
#[derive(Clone, Copy)]
pub(super) enum Handoff {
    /// `MC_TCP_PIPELINE_DEPTH`: a lane then waits, the pipeline full.
    Depth,
    /// Any number: a caller's thread hands over its batch's slices and goes on to wait for
    /// the batch, where its deadline is kept; blocked here, behind a receiver waiting for a
    /// status that does not come, it was held for `MC_TCP_STATUS_TIMEOUT_SEC` instead.
    /// What a caller hands over is one batch of at most [`CALLER_BATCH_BYTES`](super::caller::CALLER_BATCH_BYTES).
    Unbounded,
}

pub(super) struct Conn {
    id: u64,
    shared: Arc<LinkShared>,
    pub(super) stream: TcpStream,
    pub(super) cut: Arc<SocketCut>,
    holder: Arc<dyn Abort>,
    /// The batch this connection last took a slice of (see `Slice::take`).
    last_batch: u64,
    pub(super) inflight: Option<Sender<Held>>,
    /// Slices handed to the receiver whose reply it has not read yet.
    pub(super) pending: Arc<InFlight>,
    pub(super) replies: Arc<Replies>,
    receiver: Option<JoinHandle<()>>,
}

/// The reading side of a connection, shared by its two readers of replies: the receiver
/// thread, and the lane for a lone request (only while nothing else is owed, so they
/// never read at once).
pub(super) struct Replies {
    pub(super) stream: TcpStream,
    pub(super) cut: Arc<SocketCut>,
    pub(super) broken: AtomicBool,
    pub(super) ahead: Mutex<ReadAhead>,
    /// A reply came on this connection.
    pub(super) answered: AtomicBool,
    /// The peer refused this connection (see [`refused_by_peer`](super::retry::refused_by_peer)).
    pub(super) refused: AtomicBool,
}

impl Replies {
    /// The connection is broken: counted out of the link's healthy ones once.
    pub(super) fn mark_broken(&self, shared: &LinkShared) {
        if !self.broken.swap(true, Ordering::AcqRel) {
            shared.healthy_conns.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Conn {
    pub(super) fn open(shared: &Arc<LinkShared>, handoff: Handoff) -> io::Result<Self> {
        let stream = TcpStream::connect_timeout(&shared.peer, shared.connect_timeout)?;
        stream.set_nodelay(true)?;
        crate::transport::tcp::same_host::tune(&stream, shared.same_host_cc.as_deref());
        stream.set_read_timeout(Some(shared.io_timeout))?;
        stream.set_write_timeout(Some(shared.io_timeout))?;
        let (tx, rx) = match handoff {
            Handoff::Depth => bounded(shared.depth),
            Handoff::Unbounded => unbounded(),
        };
        let pending = Arc::new(InFlight::default());
        let cut = Arc::new(SocketCut::new(stream.try_clone()?));
        let replies = Arc::new(Replies {
            stream: stream.try_clone()?,
            cut: cut.clone(),
            broken: AtomicBool::new(false),
            ahead: Mutex::new(ReadAhead::default()),
            answered: AtomicBool::new(false),
            refused: AtomicBool::new(false),
        });
        let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        shared.open.lock().push((id, cut.clone()));
        let (s, r, p) = (shared.clone(), replies.clone(), pending.clone());
        let receiver = std::thread::Builder::new()
            .name(format!("te-recv-{id}-{}", shared.peer.port()))
            .spawn(move || receive(&r, rx, p, s));
        let receiver = match receiver {
            Ok(r) => r,
            Err(e) => {
                shared.open.lock().retain(|(i, _)| *i != id);
                return Err(e);
            }
        };
        shared.healthy_conns.fetch_add(1, Ordering::AcqRel);
        Ok(Self {
            id,
            shared: shared.clone(),
            stream,
            holder: cut.clone(),
            last_batch: 0,
            cut,
            inflight: Some(tx),
            pending,
            replies,
            receiver: Some(receiver),
        })
    }

    pub(super) fn is_broken(&self) -> bool {
        self.replies.broken.load(Ordering::Acquire) || self.cut.is_cut()
    }

    /// Broken, or closed by the peer while idle (its idle timeout): to be replaced before
    /// use, rather than found out by a request, which would use up the request's one
    /// re-send (on another connection that may be just as stale).
    pub(super) fn is_stale(&self) -> bool {
        self.is_broken() || (self.pending.is_empty() && self.closed_by_peer())
    }

    /// The peer closed (or reset) this connection: it is readable with nothing to read.
    /// Only meaningful while no reply is owed.
    fn closed_by_peer(&self) -> bool {
        crate::net::closed_by_peer(&self.stream)
    }

    pub(super) fn break_off(&self) {
        self.replies.mark_broken(&self.shared);
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Takes `slice` for I/O on this connection; `None` if it was finished instead
    /// (canceled batch or unregistered buffer).
    pub(super) fn take(&mut self, slice: Slice, shared: &LinkShared) -> Option<Held> {
        let held = slice.take(&self.holder, &mut self.last_batch);
        if held.is_none() {
            shared.sub_busy(1);
        }
        held
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Closing the queue lets the receiver finish the replies in flight, then exit.
        self.inflight = None;
        if let Some(r) = self.receiver.take() {
            let _ = r.join();
        }
        self.replies.mark_broken(&self.shared);
        let _ = self.stream.shutdown(Shutdown::Both);
        self.shared.open.lock().retain(|(id, _)| *id != self.id);
    }
}
