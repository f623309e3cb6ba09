//! The data-port server: checks every range against registered memory, pins the
//! region for the access (so `unregister` can cut this connection and know when the
//! memory is free), then moves bytes straight between the socket and that memory.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::cut_reader::CutStream;
use super::landing::Landing;
use super::read_ahead::ReadAhead;
use super::read_run::{buffered_read, more_host_reads};
use crate::config::Config;
use crate::conn_limit::ConnLimiter;
use crate::device::staging::NextSend;
use crate::device::staging_pool::{self, Lease};
use crate::log_throttle::LogThrottle;
use crate::memory::{Abort, MemSpan, MemoryRegistry, Pin, SocketCut};
use crate::metrics::ConnectionCounters as LinkCounters;
use crate::net;
use crate::wire::tcp::{OpCode, RequestHeader, RunHeader, Status, HEADER_LEN, STATUS_LEN};

/// A running data-port listener; stops (and closes its connections) on drop.
pub struct TcpServer {
    port: u16,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    memory: Arc<MemoryRegistry>,
    io_timeout: Duration,
    stop: AtomicBool,
    conns: Mutex<HashMap<u64, Arc<SocketCut>>>,
    next_id: AtomicU64,
    /// Caps connections (and so threads) in total and per peer address.
    slots: Arc<ConnLimiter>,
    /// A connection without a request for this long is closed.
    idle_timeout: Duration,
    /// How long a connection's thread looks for the next request before it sleeps.
    spin: Duration,
    /// The congestion control of connections from this host (`MC_TCP_SAME_HOST_CC`).
    same_host_cc: Option<String>,
    refusal_log: LogThrottle,
    idle_log: LogThrottle,
    /// Bytes served are counted here (the transport's counters).
    counters: Arc<LinkCounters>,
}

impl TcpServer {
    /// Serves `listener` (non-blocking) within the limits of `config`:
    /// `MC_TCP_STATUS_TIMEOUT_SEC` bounds every stalled read or write,
    /// `MC_TCP_SERVER_MAX_CONNECTIONS[_PER_IP]` the connections served at
    /// once, `MC_TCP_SERVER_IDLE_TIMEOUT` how long one may wait for a request. Bytes
    /// served are counted into `counters`.
    pub fn start(
        listener: TcpListener,
        memory: Arc<MemoryRegistry>,
        config: &Config,
        counters: Arc<LinkCounters>,
    ) -> io::Result<Self> {
        let io_timeout = config.tcp_status_timeout;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            memory,
            io_timeout,
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            slots: ConnLimiter::new(
                config.tcp_server_max_connections,
                config.tcp_server_max_connections_per_ip,
            ),
            idle_timeout: config.tcp_server_idle_timeout,
            spin: config.tcp_spin,
            same_host_cc: config.tcp_same_host_cc.clone(),
            refusal_log: LogThrottle::per_second(),
            idle_log: LogThrottle::per_second(),
            counters,
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("te-tcp-{port}"))
            .spawn(move || accept_loop(listener, s))?;
        Ok(Self {
            port,
            shared,
            thread: Some(thread),
        })
    }

    /// The listening port (advertised as `tcp_data_port`).
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for (_, c) in self.shared.conns.lock().drain() {
            c.abort();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::Acquire) {
        match net::wait_readable(&listener, Duration::from_millis(100)) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::error!("data listener poll failed: {e}");
                return;
            }
        }
        let (stream, peer) = match listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                tracing::warn!("data accept failed: {e}");
                continue;
            }
        };
        // Refused connections are closed at once (dropped): a thread each
        // for any number of idle connections is what the cap prevents.
        let permit = match shared.slots.try_acquire(peer.ip()) {
            Ok(p) => p,
            Err(why) => {
                if let Some(left_out) = shared.refusal_log.allow() {
                    tracing::warn!(
                        "data connection from {peer} closed: {why} (MC_TCP_SERVER_MAX_CONNECTIONS / MC_TCP_SERVER_MAX_CONNECTIONS_PER_IP); {left_out} such lines left out"
                    );
                }
                continue;
            }
        };
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let cut = match stream.try_clone() {
            Ok(c) => Arc::new(SocketCut::new(c)),
            Err(e) => {
                tracing::warn!("cannot track connection from {peer}: {e}");
                continue;
            }
        };
        shared.conns.lock().insert(id, cut.clone());
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("te-tcp-conn".into())
            .spawn(move || {
                let _permit = permit;
                if let Err(e) = serve(stream, peer, &cut, &s) {
                    if !s.stop.load(Ordering::Acquire) {
                        tracing::debug!("data connection from {peer} ended: {e}");
                    }
                }
                s.conns.lock().remove(&id);
            });
        if let Err(e) = spawned {
            tracing::error!("cannot start a data connection thread: {e}");
            shared.conns.lock().remove(&id);
        }
    }
}

// size: the data server's per-connection loop; its read-ahead, held statuses, landing
// write and pinned region live across requests, so its steps share that state. Not cut
// into steps yet.
fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    cut: &Arc<SocketCut>,
    shared: &Shared,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    super::same_host::tune(&stream, shared.same_host_cc.as_deref());
    stream.set_read_timeout(Some(shared.io_timeout))?;
    stream.set_write_timeout(Some(shared.io_timeout))?;
    let holder: Arc<dyn Abort> = cut.clone();
    let mut own = CutStream {
        stream: &stream,
        cut,
    };
    let mut ahead = ReadAhead::default();
    let mut statuses = HeldStatuses::default();
    let mut scratch = Vec::new();
    // The region of the last request, looked at first for the next.
    let mut last = None;
    // The last request was small: a client issuing small requests one after another sends
    // the next within microseconds. After large ones the time goes to moving bytes, and a
    // spinning thread would only take a CPU from one that moves them.
    let mut small = false;
    // Writes into device memory still landing; their statuses are held meanwhile.
    let mut landing: Option<Landing> = None;
    // The stager of the last read out of device memory, holding the first chunk of the
    // request after it (a read out of the same device, here already then).
    let mut kept: Option<Lease> = None;
    // Headers of a run of writes whose payloads come next, in order (see `RunHeader`), when
    // the run is not taken in at once: each is then served as if it had come alone.
    let mut queued: VecDeque<RequestHeader> = VecDeque::new();
    loop {
        let h = match queued.pop_front() {
            Some(h) => h,
            None => {
                // The peer sent nothing more yet: it may wait for the statuses of what it sent.
                if landing.is_some() && !request_waiting(&stream, &ahead) {
                    land(&mut landing, &mut statuses, &mut own)?;
                }
                if !wait_for_request(&stream, peer, cut, shared, &ahead, small)? {
                    return Ok(());
                }
                // The header, once its first byte is here, within the I/O timeout.
                cut.set_deadline(Some(shared.io_timeout));
                let Some(header) = ahead.take::<HEADER_LEN>(&mut own, 0)? else {
                    return Ok(());
                };
                match RunHeader::decode(&header) {
                    None => RequestHeader::decode(&header).map_err(invalid)?,
                    Some(run) => {
                        let run = run.map_err(invalid)?;
                        // The run, headers and payloads, within the I/O timeout plus 1 ns per byte.
                        cut.set_deadline(Some(shared.io_timeout + Duration::from_nanos(run.bytes)));
                        let mut writes = Vec::with_capacity(run.writes);
                        for _ in 0..run.writes {
                            let Some(b) = ahead.take::<HEADER_LEN>(&mut own, 0)? else {
                                return Err(io::ErrorKind::UnexpectedEof.into());
                            };
                            writes.push(RequestHeader::decode(&b).map_err(invalid)?);
                        }
                        run.check(&writes).map_err(invalid)?;
                        // Statuses go out in order: those of writes still landing first.
                        land(&mut landing, &mut statuses, &mut own)?;
                        drop(kept.take());
                        let at = RunAt {
                            stream: &stream,
                            cut,
                            shared,
                            holder: &holder,
                        };
                        if run_in_host_memory(
                            at,
                            &writes,
                            &mut ahead,
                            &mut statuses,
                            &mut own,
                            &mut last,
                        )? {
                            small = false;
                            continue;
                        }
                        queued.extend(writes);
                        let Some(h) = queued.pop_front() else {
                            continue;
                        };
                        h
                    }
                }
            }
        };
        // Back to the pool unless this request is a read out of its device (below).
        let kept_stager = kept.take();
        small = h.size <= super::spin::SMALL_REQUEST;
        // The whole request (payload in, status and data out) within the I/O timeout plus
        // 1 ns per byte, as upstream bounds a transfer: a peer that sends a byte at a time
        // holds this connection, its thread and any staging for that long at most.
        cut.set_deadline(Some(shared.io_timeout + Duration::from_nanos(h.size)));
        let pin = shared.memory.pin_near(h.addr, h.size, &holder, &mut last);
        let device = pin.as_ref().and_then(|p| p.region().device).map(|(_, d)| d);
        // Only another write into the same device's memory goes on while earlier ones
        // land: everything else may send statuses, or read what they write. And only while
        // no other connection waits for a stager: the one held here goes back between
        // requests then, as it did before writes could land late.
        let joins = h.opcode == OpCode::Write
            && device.is_some()
            && landing.as_ref().map(Landing::device) == device
            && !staging_pool::wanted();
        if !joins {
            land(&mut landing, &mut statuses, &mut own)?;
        }
        let Some(pin) = pin else {
            tracing::warn!(
                "rejected {:?} of {:#x}+{} from {peer}: not inside one registered buffer",
                h.opcode,
                h.addr,
                h.size
            );
            if !h.v2 {
                // v1 has no way to say no: close, as upstream does.
                return Ok(());
            }
            // Said at once, before the payload is drained: a peer may wait for it.
            statuses.head(&Status::AddrRejected.encode());
            statuses.flush(&mut own)?;
            if h.opcode == OpCode::Write {
                discard(&mut ahead.reader(own), h.size, &mut scratch)?;
            }
            continue;
        };
        let ok = Status::Ok.encode();
        let status: &[u8] = if h.v2 { &ok } else { &[] };
        if let Some(device) = device {
            // Device memory: staged through pinned host buffers.
            match h.opcode {
                OpCode::Write => {
                    let into = match landing.as_mut() {
                        Some(l) => l,
                        None => {
                            // Statuses held back go out before this waits for the peer's
                            // bytes: a peer may wait for them before it sends more.
                            statuses.flush(&mut own)?;
                            landing.insert(Landing::start(device)?)
                        }
                    };
                    let (held, mut to_peer) = (&mut statuses, own);
                    into.receive(&mut ahead.reader(own), h.addr, h.size as usize, pin, || {
                        held.flush(&mut to_peer)
                    })?;
                    // Sent once this write has landed (see `land`).
                    statuses.hold(status);
                }
                OpCode::Read => {
                    let (mut lease, copied) = match kept_stager {
                        Some(lease) if lease.device() == device => (lease, true),
                        _ => (staging_pool::checkout(device)?, false),
                    };
                    let head = statuses.head(status);
                    let memory = &shared.memory;
                    let next = || next_read_of(device, &stream, &mut ahead, memory, &holder);
                    let stager = lease.stager()?;
                    stager.send_from(&mut own, head, h.addr, h.size as usize, copied, next)?;
                    statuses.sent();
                    // Kept for the next request, unless another connection waits for one.
                    if stager.holds_copied() && !staging_pool::wanted() {
                        kept = Some(lease);
                    }
                }
            }
            count_served(&shared.counters, h.opcode, h.size);
            continue;
        }
        let span = pin.span(h.addr, h.size).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "range outside its pinned region",
            )
        })?;
        match h.opcode {
            OpCode::Write => {
                receive_flushing_held(&mut ahead, &stream, cut, &[span], &mut statuses, &own)?;
                statuses.answer(&mut own, status, &ahead)?;
            }
            OpCode::Read => {
                let run = more_host_reads(&mut ahead, h.size, &shared.memory, &holder, &mut last);
                if run.is_empty() {
                    span.send_to(&stream, statuses.head(status), cut)?;
                } else {
                    let bytes: u64 = h.size + run.iter().map(|(r, _)| r.size).sum::<u64>();
                    cut.set_deadline(Some(shared.io_timeout + Duration::from_nanos(bytes)));
                    let mut pieces = vec![(statuses.head(status), Some(span))];
                    for (r, pin) in &run {
                        let status: &[u8] = if r.v2 { &ok } else { &[] };
                        pieces.push((status, pin.span(r.addr, r.size)));
                    }
                    MemSpan::send_pieces(&stream, &pieces, cut)?;
                    for (r, _) in &run {
                        count_served(&shared.counters, OpCode::Read, r.size);
                    }
                    small = run
                        .last()
                        .is_some_and(|(r, _)| r.size <= super::spin::SMALL_REQUEST);
                }
                statuses.sent();
            }
        }
        count_served(&shared.counters, h.opcode, h.size);
    }
}

fn invalid(e: crate::wire::WireError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Fills `spans` from the peer's bytes. Statuses held back go out before this waits for
/// more of them: a peer may wait for those before it sends more.
fn receive_flushing_held(
    ahead: &mut ReadAhead,
    stream: &TcpStream,
    cut: &SocketCut,
    spans: &[MemSpan],
    statuses: &mut HeldStatuses,
    own: &CutStream,
) -> io::Result<()> {
    let held = !statuses.is_empty();
    let mut send_held = || statuses.flush(&mut own.clone());
    let before_wait = held.then_some(&mut send_held as &mut dyn FnMut() -> io::Result<()>);
    ahead.recv_spans(stream, cut, spans, before_wait)
}

/// Where a run of writes is taken in: its connection and what the server shares.
#[derive(Clone, Copy)]
struct RunAt<'a> {
    stream: &'a TcpStream,
    cut: &'a SocketCut,
    shared: &'a Shared,
    holder: &'a Arc<dyn Abort>,
}

/// Takes in a run's payloads when every write lands in registered host memory: all of
/// them by the same few system calls, then their statuses together. False, having read
/// nothing, when one does not (device memory, or outside every region): the writes are
/// then served one by one, as they would be if sent alone.
fn run_in_host_memory(
    at: RunAt,
    writes: &[RequestHeader],
    ahead: &mut ReadAhead,
    statuses: &mut HeldStatuses,
    own: &mut CutStream,
    last: &mut Option<Arc<crate::memory::Region>>,
) -> io::Result<bool> {
    let mut pins = Vec::with_capacity(writes.len());
    let mut spans = Vec::with_capacity(writes.len());
    for h in writes {
        let Some(pin) = at.shared.memory.pin_near(h.addr, h.size, at.holder, last) else {
            return Ok(false);
        };
        let span = match pin.span(h.addr, h.size) {
            Some(span) if pin.region().device.is_none() => span,
            _ => return Ok(false),
        };
        pins.push(pin);
        spans.push(span);
    }
    receive_flushing_held(ahead, at.stream, at.cut, &spans, statuses, own)?;
    drop(pins);
    let ok = Status::Ok.encode();
    let Some((final_write, before)) = writes.split_last() else {
        return Ok(true);
    };
    for h in before {
        statuses.hold(&ok);
        count_served(&at.shared.counters, OpCode::Write, h.size);
    }
    count_served(&at.shared.counters, OpCode::Write, final_write.size);
    statuses.answer(own, &ok, ahead)?;
    Ok(true)
}

/// The next request, if it is here already and reads registered memory of `device`:
/// what a read out of device memory copies ahead while its last chunk is sent. Its pin
/// keeps the memory registered until that copy has landed.
fn next_read_of(
    device: u32,
    stream: &TcpStream,
    ahead: &mut ReadAhead,
    memory: &MemoryRegistry,
    holder: &Arc<dyn Abort>,
) -> Option<NextSend<Pin>> {
    ahead.fill_without_wait::<HEADER_LEN>(stream);
    let (h, pin) = buffered_read(ahead, memory, holder, &mut None)?;
    (pin.region().device.map(|(_, d)| d) == Some(device)).then_some(NextSend {
        addr: h.addr,
        len: usize::try_from(h.size).ok()?,
        guard: pin,
    })
}

/// Waits for the next request's first byte: false once the server stops, the connection
/// is cut or it stayed idle past `MC_TCP_SERVER_IDLE_TIMEOUT`. A pipelined request whose
/// start came in with the last one's bytes is there already; after a small request the
/// next is looked for awake for a moment first.
fn wait_for_request(
    stream: &TcpStream,
    peer: SocketAddr,
    cut: &SocketCut,
    shared: &Shared,
    ahead: &ReadAhead,
    small: bool,
) -> io::Result<bool> {
    cut.set_deadline(None);
    if ahead.buffered() > 0 {
        return Ok(true);
    }
    let idle_since = Instant::now();
    let spin = if small { shared.spin } else { Duration::ZERO };
    let early = super::spin::spin_for(spin, || {
        net::wait_readable(stream, Duration::ZERO).map_or(Some(()), |ready| ready.then_some(()))
    });
    if early.is_some() {
        return Ok(true);
    }
    loop {
        if shared.stop.load(Ordering::Acquire) || cut.is_cut() {
            return Ok(false);
        }
        if net::wait_readable(stream, Duration::from_millis(200))? {
            return Ok(true);
        }
        if idle_since.elapsed() >= shared.idle_timeout {
            if let Some(left_out) = shared.idle_log.allow() {
                tracing::warn!(
                    "data connection from {peer} closed: no request for {:?} (MC_TCP_SERVER_IDLE_TIMEOUT); {left_out} such lines left out",
                    shared.idle_timeout
                );
            }
            return Ok(false);
        }
    }
}

/// True when the peer's next request is here, whole or in part.
fn request_waiting(stream: &TcpStream, ahead: &ReadAhead) -> bool {
    ahead.buffered() > 0 || net::bytes_queued(stream).is_ok_and(|n| n > 0)
}

/// Waits until the writes of `landing` have landed, then sends the statuses held for
/// them (and any held before them).
fn land(
    landing: &mut Option<Landing>,
    statuses: &mut HeldStatuses,
    own: &mut CutStream,
) -> io::Result<()> {
    let Some(l) = landing.take() else {
        return Ok(());
    };
    l.settle()?;
    statuses.flush(own)
}

/// Statuses held back at most.
const HELD_STATUSES: usize = 16;
/// A status is held back only while the request after it, already here, is at most this
/// large: its own status follows soon after.
const HOLD_FOR_BYTES: u64 = 256 << 10;

/// Statuses of pipelined requests, held back while the next request is already here, so
/// that several leave in one `send` (and wake the peer's receiver once).
#[derive(Default)]
struct HeldStatuses {
    bytes: Vec<u8>,
}

impl HeldStatuses {
    /// Answers a request with `status` (empty for v1): held back while the next request is
    /// buffered whole and small, else sent with those held before it.
    fn answer(&mut self, own: &mut CutStream, status: &[u8], ahead: &ReadAhead) -> io::Result<()> {
        self.bytes.extend_from_slice(status);
        let next_small = ahead
            .peek::<HEADER_LEN>()
            .and_then(|h| RequestHeader::decode(&h).ok())
            .is_some_and(|h| h.size <= HOLD_FOR_BYTES);
        if next_small && self.bytes.len() < HELD_STATUSES * STATUS_LEN {
            return Ok(());
        }
        self.flush(own)
    }

    fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Holds `status` back until the next flush.
    fn hold(&mut self, status: &[u8]) {
        self.bytes.extend_from_slice(status);
    }

    fn flush(&mut self, own: &mut CutStream) -> io::Result<()> {
        if !self.bytes.is_empty() {
            own.write_all(&self.bytes)?;
            self.bytes.clear();
        }
        Ok(())
    }

    /// The statuses held, then `status`: the head of a reply that carries data. Cleared
    /// by the next [`answer`](Self::answer) or [`sent`](Self::sent).
    fn head(&mut self, status: &[u8]) -> &[u8] {
        self.bytes.extend_from_slice(status);
        &self.bytes
    }

    /// The head was sent.
    fn sent(&mut self) {
        self.bytes.clear();
    }
}

fn count_served(counters: &LinkCounters, op: OpCode, len: u64) {
    let counter = match op {
        OpCode::Write => &counters.served_bytes_written,
        OpCode::Read => &counters.served_bytes_read,
    };
    LinkCounters::add(counter, len);
}

/// Reads and drops the payload of a rejected write so the connection stays in step.
fn discard(stream: &mut impl Read, mut left: u64, scratch: &mut Vec<u8>) -> io::Result<()> {
    scratch.resize(64 << 10, 0);
    while left > 0 {
        let n = left.min(scratch.len() as u64) as usize;
        let chunk = scratch.get_mut(..n).unwrap_or_default();
        let got = stream.read(chunk)?;
        if got == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        left -= got as u64;
    }
    Ok(())
}
