//! The initiator side: per peer, a few persistent connections ("lanes"), each
//! pipelining requests.
//!
//! A lane thread takes slices from the peer's queue, writes header and
//! payload, and hands the slice to its connection's receiver thread, which
//! reads the status frame (v2) and, for reads, the data. The queue is
//! unbounded: any batch size is accepted and the lanes drain it at the
//! speed of the network (backpressure, never rejection). A slice whose
//! connection breaks is re-sent once on a fresh connection; a peer that
//! refuses connections fails queued slices at once instead of once per
//! connect timeout.

use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use parking_lot::Mutex;

use super::Slice;
use crate::config::Config;
use crate::error::TransferError;
use crate::net;
use crate::wire::tcp::{OpCode, RequestHeader, Status, STATUS_LEN};

/// How long a failed connect keeps failing new slices without retrying.
const DEAD_PEER_HOLD: Duration = Duration::from_millis(500);

enum LaneMsg {
    Work(Slice),
    Stop,
}

/// Connections to one peer data port.
pub struct PeerLink {
    shared: Arc<LinkShared>,
    rx: Receiver<LaneMsg>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

struct LinkShared {
    peer: SocketAddr,
    v2: bool,
    connect_timeout: Duration,
    io_timeout: Duration,
    depth: usize,
    tx: Sender<LaneMsg>,
    dead: Mutex<Option<(Instant, String)>>,
    /// Clones of every open connection, so shutdown can unblock their threads.
    open: Mutex<Vec<(u64, TcpStream)>>,
    next_conn: std::sync::atomic::AtomicU64,
}

impl PeerLink {
    /// Starts `cfg.tcp_lanes_per_peer` lanes towards `peer`; connections open on first use.
    pub fn new(peer: SocketAddr, v2: bool, cfg: &Config) -> io::Result<Self> {
        let (tx, rx) = unbounded();
        let shared = Arc::new(LinkShared {
            peer,
            v2,
            connect_timeout: cfg.handshake_connect_timeout,
            io_timeout: cfg.tcp_status_timeout,
            depth: cfg.tcp_pipeline_depth,
            tx,
            dead: Mutex::new(None),
            open: Mutex::new(Vec::new()),
            next_conn: std::sync::atomic::AtomicU64::new(0),
        });
        let mut threads = Vec::new();
        for i in 0..cfg.tcp_lanes_per_peer {
            let s = shared.clone();
            let r = rx.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("te-lane-{}-{i}", peer.port()))
                    .spawn(move || lane(s, r))?,
            );
        }
        Ok(Self {
            shared,
            rx,
            threads: Mutex::new(threads),
        })
    }

    /// Queues a slice; it completes (or fails) on its batch.
    pub fn send(&self, slice: Slice) {
        if let Err(e) = self.shared.tx.send(LaneMsg::Work(slice)) {
            if let LaneMsg::Work(s) = e.into_inner() {
                s.finish(Err(TransferError::Canceled(
                    "connection to the peer is shutting down",
                )));
            }
        }
    }

    /// Why the last connect failed, if it failed recently.
    pub fn unreachable(&self) -> Option<String> {
        self.shared.recently_dead()
    }
}

impl Drop for PeerLink {
    fn drop(&mut self) {
        let threads = std::mem::take(&mut *self.threads.lock());
        // Unblock receivers waiting on replies that will never come.
        for (_, s) in self.shared.open.lock().iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
        for _ in 0..threads.len() {
            let _ = self.shared.tx.send(LaneMsg::Stop);
        }
        for t in threads {
            let _ = t.join();
        }
        while let Ok(msg) = self.rx.try_recv() {
            if let LaneMsg::Work(s) = msg {
                s.finish(Err(TransferError::Canceled("the engine shut down")));
            }
        }
    }
}

impl LinkShared {
    fn recently_dead(&self) -> Option<String> {
        let dead = self.dead.lock();
        dead.as_ref()
            .filter(|(at, _)| at.elapsed() < DEAD_PEER_HOLD)
            .map(|(_, why)| why.clone())
    }

    fn unreachable(&self, reason: String) -> TransferError {
        TransferError::PeerUnreachable {
            peer: self.peer.to_string(),
            reason,
        }
    }

    fn retry_or_fail(&self, mut slice: Slice, reason: &str) {
        if slice.retries == 0 && !slice.batch.is_canceled() {
            slice.retries += 1;
            tracing::debug!("re-sending a slice to {} after: {reason}", self.peer);
            if let Err(e) = self.tx.send(LaneMsg::Work(slice)) {
                if let LaneMsg::Work(s) = e.into_inner() {
                    s.finish(Err(self.gone(reason)));
                }
            }
        } else {
            let err = self.gone(reason);
            slice.finish(Err(err));
        }
    }

    fn gone(&self, reason: &str) -> TransferError {
        TransferError::PeerGone {
            peer: self.peer.to_string(),
            reason: reason.to_string(),
        }
    }
}

fn lane(shared: Arc<LinkShared>, rx: Receiver<LaneMsg>) {
    let mut conn: Option<Conn> = None;
    while let Ok(LaneMsg::Work(slice)) = rx.recv() {
        if slice.batch.is_canceled() {
            slice.finish(Err(TransferError::Canceled(
                "its batch was abandoned after the deadline",
            )));
            continue;
        }
        if conn.as_ref().is_some_and(Conn::is_broken) {
            conn = None;
        }
        if conn.is_none() {
            if let Some(why) = shared.recently_dead() {
                slice.finish(Err(shared.unreachable(why)));
                continue;
            }
            match Conn::open(&shared) {
                Ok(c) => {
                    *shared.dead.lock() = None;
                    conn = Some(c);
                }
                Err(e) => {
                    let why = format!("connect failed: {e}");
                    tracing::warn!("peer {} unreachable: {why}", shared.peer);
                    *shared.dead.lock() = Some((Instant::now(), why.clone()));
                    slice.finish(Err(shared.unreachable(why)));
                    continue;
                }
            }
        }
        if let Some(c) = conn.as_mut() {
            c.send(slice, &shared);
        }
    }
}

struct Conn {
    id: u64,
    shared: Arc<LinkShared>,
    stream: TcpStream,
    inflight: Option<Sender<Slice>>,
    broken: Arc<AtomicBool>,
    receiver: Option<JoinHandle<()>>,
}

impl Conn {
    fn open(shared: &Arc<LinkShared>) -> io::Result<Self> {
        let stream = TcpStream::connect_timeout(&shared.peer, shared.connect_timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(shared.io_timeout))?;
        stream.set_write_timeout(Some(shared.io_timeout))?;
        let (tx, rx) = bounded(shared.depth);
        let broken = Arc::new(AtomicBool::new(false));
        let read_half = stream.try_clone()?;
        let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        shared.open.lock().push((id, stream.try_clone()?));
        let (s, b) = (shared.clone(), broken.clone());
        let receiver = std::thread::Builder::new()
            .name(format!("te-recv-{}", shared.peer.port()))
            .spawn(move || receive(read_half, rx, b, s))?;
        Ok(Self {
            id,
            shared: shared.clone(),
            stream,
            inflight: Some(tx),
            broken,
            receiver: Some(receiver),
        })
    }

    fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    fn break_off(&self) {
        self.broken.store(true, Ordering::Release);
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    fn send(&mut self, slice: Slice, shared: &LinkShared) {
        let header = RequestHeader {
            size: slice.len,
            addr: slice.remote,
            opcode: slice.op,
            v2: shared.v2,
        }
        .encode();
        let (op, local, len) = (slice.op, slice.local, slice.len as usize);
        let device = slice.local_device.filter(|_| op == OpCode::Write);
        // SAFETY: the submitter guarantees the local range stays valid until
        // the batch finishes (see `TransferEngine::submit`); device memory is
        // never touched directly but staged.
        let payload: &[u8] = match op {
            OpCode::Write if device.is_none() => unsafe {
                std::slice::from_raw_parts(local as *const u8, len)
            },
            _ => &[],
        };
        let send = |stream: &mut TcpStream| match device {
            Some(d) => crate::device::staging::send_from(d, stream, &header, local, len),
            None => net::write_two(stream, &header, payload),
        };
        if !shared.v2 && op == OpCode::Write {
            // v1 writes carry no acknowledgement: done once the bytes left.
            match send(&mut self.stream) {
                Ok(()) => slice.finish(Ok(())),
                Err(e) => {
                    self.break_off();
                    shared.retry_or_fail(slice, &format!("send failed: {e}"));
                }
            }
            return;
        }
        // Queue for the receiver before sending, so replies match the order.
        let Some(inflight) = self.inflight.as_ref() else {
            return shared.retry_or_fail(slice, "connection closed");
        };
        if let Err(e) = inflight.send(slice) {
            self.break_off();
            return shared.retry_or_fail(e.into_inner(), "receiver stopped");
        }
        if let Err(e) = send(&mut self.stream) {
            tracing::debug!("send to {} failed: {e}", shared.peer);
            self.break_off();
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Closing the queue lets the receiver finish the replies in flight, then exit.
        self.inflight = None;
        if let Some(r) = self.receiver.take() {
            let _ = r.join();
        }
        let _ = self.stream.shutdown(Shutdown::Both);
        self.shared.open.lock().retain(|(id, _)| *id != self.id);
    }
}

enum Reply {
    Done,
    Rejected,
}

fn receive(
    mut stream: TcpStream,
    rx: Receiver<Slice>,
    broken: Arc<AtomicBool>,
    shared: Arc<LinkShared>,
) {
    let mut failure: Option<String> = None;
    for slice in rx.iter() {
        if let Some(why) = &failure {
            shared.retry_or_fail(slice, why);
            continue;
        }
        match read_reply(&mut stream, &slice, shared.v2) {
            Ok(Reply::Done) => slice.finish(Ok(())),
            Ok(Reply::Rejected) => {
                let err = TransferError::AddressRejected {
                    peer: shared.peer.to_string(),
                    addr: slice.remote,
                    len: slice.len,
                };
                slice.finish(Err(err));
            }
            Err(ReplyError::Protocol(why)) => {
                broken.store(true, Ordering::Release);
                let _ = stream.shutdown(Shutdown::Both);
                let err = TransferError::Protocol {
                    peer: shared.peer.to_string(),
                    reason: why.clone(),
                };
                slice.finish(Err(err));
                failure = Some(why);
            }
            Err(ReplyError::Io(e)) => {
                broken.store(true, Ordering::Release);
                let _ = stream.shutdown(Shutdown::Both);
                let why = if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::TimedOut
                {
                    format!(
                        "no reply within {:?} (MC_TCP_STATUS_TIMEOUT_SEC)",
                        shared.io_timeout
                    )
                } else {
                    format!("receive failed: {e}")
                };
                shared.retry_or_fail(slice, &why);
                failure = Some(why);
            }
        }
    }
}

enum ReplyError {
    Io(io::Error),
    Protocol(String),
}

fn read_reply(stream: &mut TcpStream, slice: &Slice, v2: bool) -> Result<Reply, ReplyError> {
    if v2 {
        let mut status = [0u8; STATUS_LEN];
        stream.read_exact(&mut status).map_err(ReplyError::Io)?;
        match Status::decode(&status).map_err(|e| ReplyError::Protocol(e.to_string()))? {
            Status::Ok => {}
            Status::AddrRejected => return Ok(Reply::Rejected),
        }
    }
    if slice.op == OpCode::Read {
        if let Some(device) = slice.local_device {
            return crate::device::staging::receive_into(
                device,
                stream,
                slice.local,
                slice.len as usize,
            )
            .map(|()| Reply::Done)
            .map_err(ReplyError::Io);
        }
        // SAFETY: the submitter guarantees the local range is valid and
        // writable until the batch finishes (see `TransferEngine::submit`).
        let dst =
            unsafe { std::slice::from_raw_parts_mut(slice.local as *mut u8, slice.len as usize) };
        stream.read_exact(dst).map_err(ReplyError::Io)?;
    }
    Ok(Reply::Done)
}
