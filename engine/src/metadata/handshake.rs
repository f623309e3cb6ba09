//! The handshake port: a small request/response server and its client.
//!
//! One TCP connection per request, as upstream: the client sends one frame,
//! the server replies with a frame of the same type, shuts down its write
//! side, waits briefly for the client's EOF and closes.

use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use thiserror::Error;

use super::MetadataError;
use crate::config::Config;
use crate::conn_limit::{ConnLimiter, ConnPermit};
use crate::deadline_io::{drain_until_eof_by, is_deadline, read_exact_by, write_all_by};
use crate::log_throttle::LogThrottle;
use crate::net;
use crate::wire::handshake::{decode_body, decode_length, Frame, MessageType, LENGTH_PREFIX};
use crate::wire::session::HostPort;
use crate::wire::WireError;

/// What the server does with a request: return the reply JSON, or `None` to
/// close without replying.
pub type Handler = dyn Fn(MessageType, &str) -> Option<String> + Send + Sync;

/// Why one handshake exchange (served or requested) failed.
#[derive(Debug, Error)]
pub enum HandshakeError {
    /// The host name does not resolve.
    #[error("cannot resolve {host:?}: {source}")]
    Resolve {
        /// The name.
        host: String,
        /// Resolver error.
        #[source]
        source: io::Error,
    },
    /// The host name resolves to no usable address.
    #[error("{host:?} resolves to no address")]
    NoAddress {
        /// The name.
        host: String,
    },
    /// No address of the peer accepted the connection.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// The last address tried.
        addr: SocketAddr,
        /// Connect error.
        #[source]
        source: io::Error,
    },
    /// The whole exchange did not complete within its deadline.
    #[error("{step} did not complete within the {limit:?} deadline of the whole exchange ({var})")]
    Deadline {
        /// What was in progress when time ran out.
        step: &'static str,
        /// The deadline.
        limit: Duration,
        /// The variable that sets it.
        var: &'static str,
    },
    /// A socket call failed.
    #[error("{step} failed: {source}")]
    Io {
        /// What was being done.
        step: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The frame could not be decoded.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The reply's type differs from the request's.
    #[error("replied with type {got:?} to a {sent:?} request")]
    WrongType {
        /// Request type.
        sent: MessageType,
        /// Reply type.
        got: MessageType,
    },
}

/// Limits of a handshake listener (see [`Config`] for the variables).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Largest frame accepted (`MC_HANDSHAKE_MAX_LENGTH`).
    pub max_len: u64,
    /// Whole-request deadline (`MC_HANDSHAKE_SERVER_TIMEOUT`).
    pub request_timeout: Duration,
    /// Connections served at once (`MC_HANDSHAKE_MAX_CONNECTIONS`).
    pub max_connections: usize,
    /// Of those, from one address (`MC_HANDSHAKE_MAX_CONNECTIONS_PER_IP`).
    pub max_connections_per_ip: usize,
}

impl ServerLimits {
    /// The limits `config` sets.
    pub fn from_config(config: &Config) -> Self {
        Self {
            max_len: config.handshake_max_length,
            request_timeout: config.handshake_server_timeout,
            max_connections: config.handshake_max_connections,
            max_connections_per_ip: config.handshake_max_connections_per_ip,
        }
    }
}

/// A running handshake listener; stops when dropped.
pub struct HandshakeServer {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HandshakeServer {
    /// Serves `listener` (non-blocking) with `handler`, frames up to
    /// `max_len` and the default limits otherwise.
    pub fn start(
        listener: TcpListener,
        max_len: u64,
        handler: Arc<Handler>,
    ) -> std::io::Result<Self> {
        let limits = ServerLimits {
            max_len,
            ..ServerLimits::from_config(&Config::default())
        };
        Self::start_with(listener, limits, handler)
    }

    /// Serves `listener` (non-blocking) with `handler` within `limits`.
    pub fn start_with(
        listener: TcpListener,
        limits: ServerLimits,
        handler: Arc<Handler>,
    ) -> std::io::Result<Self> {
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("te-rpc-{port}"))
            .spawn(move || accept_loop(listener, limits, handler, stop2))?;
        Ok(Self {
            port,
            stop,
            thread: Some(thread),
        })
    }

    /// The listening port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for HandshakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    limits: ServerLimits,
    handler: Arc<Handler>,
    stop: Arc<AtomicBool>,
) {
    let slots = ConnLimiter::new(limits.max_connections, limits.max_connections_per_ip);
    let refusals = LogThrottle::per_second();
    while !stop.load(Ordering::Acquire) {
        match net::wait_readable(&listener, Duration::from_millis(100)) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::error!("handshake listener poll failed: {e}");
                return;
            }
        }
        let (stream, peer) = match listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                tracing::warn!("handshake accept failed: {e}");
                continue;
            }
        };
        // Closed at once (dropped) when refused: waiting in the backlog would
        // let idle connections lock out every new engine.
        let permit = match slots.try_acquire(peer.ip()) {
            Ok(p) => p,
            Err(why) => {
                if let Some(left_out) = refusals.allow() {
                    tracing::warn!(
                        "handshake connection from {peer} closed: {why} (MC_HANDSHAKE_MAX_CONNECTIONS={}, MC_HANDSHAKE_MAX_CONNECTIONS_PER_IP={}); {left_out} such lines left out",
                        limits.max_connections,
                        limits.max_connections_per_ip
                    );
                }
                continue;
            }
        };
        let handler = handler.clone();
        let spawned = std::thread::Builder::new()
            .name("te-rpc-conn".into())
            .spawn(move || serve_permitted(stream, peer, limits, &*handler, permit));
        if let Err(e) = spawned {
            tracing::error!("cannot start a handshake thread: {e}");
        }
    }
}

/// Serves one connection; its slot is freed when `_permit` drops at the end.
fn serve_permitted(
    stream: TcpStream,
    peer: SocketAddr,
    limits: ServerLimits,
    handler: &Handler,
    _permit: ConnPermit,
) {
    // Peers choose how often this happens: one line a second for each kind.
    static DEADLINE_LOG: OnceLock<LogThrottle> = OnceLock::new();
    static FAILURE_LOG: OnceLock<LogThrottle> = OnceLock::new();
    let Err(e) = serve_one(stream, limits, handler) else {
        return;
    };
    let (log, what) = match e {
        HandshakeError::Deadline { .. } => (&DEADLINE_LOG, "closed"),
        _ => (&FAILURE_LOG, "failed"),
    };
    if let Some(left_out) = log.get_or_init(LogThrottle::per_second).allow() {
        tracing::warn!("handshake from {peer} {what}: {e}; {left_out} such lines left out");
    }
}

/// Maps a socket error of a deadline-bound exchange to a [`HandshakeError`].
fn io_error(
    step: &'static str,
    limit: Duration,
    var: &'static str,
) -> impl Fn(io::Error) -> HandshakeError {
    move |source| {
        if is_deadline(&source) {
            HandshakeError::Deadline { step, limit, var }
        } else {
            HandshakeError::Io { step, source }
        }
    }
}

fn serve_one(
    mut stream: TcpStream,
    limits: ServerLimits,
    handler: &Handler,
) -> Result<(), HandshakeError> {
    // One deadline for the whole request: a per-read timeout would let a peer
    // hold the slot forever by sending a byte just before each timeout.
    let deadline = Instant::now() + limits.request_timeout;
    let var = "MC_HANDSHAKE_SERVER_TIMEOUT";
    stream
        .set_nonblocking(false)
        .map_err(|source| HandshakeError::Io {
            step: "making the socket blocking",
            source,
        })?;
    let frame = read_frame(
        &mut stream,
        limits.max_len,
        deadline,
        limits.request_timeout,
        var,
    )?;
    let json = frame.json()?;
    let Some(reply) = handler(frame.kind, json) else {
        return Ok(());
    };
    write_all_by(
        &mut stream,
        &Frame::new(frame.kind, &reply).encode(),
        deadline,
    )
    .map_err(io_error("sending the reply", limits.request_timeout, var))?;
    let _ = stream.shutdown(Shutdown::Write);
    // Wait for the client's EOF so it reads the whole reply before we close.
    drain_until_eof_by(&mut stream, deadline);
    Ok(())
}

/// The step of reading a frame's length prefix.
const READ_LENGTH: &str = "reading the frame length";

fn read_frame(
    stream: &mut TcpStream,
    max_len: u64,
    deadline: Instant,
    limit: Duration,
    var: &'static str,
) -> Result<Frame, HandshakeError> {
    let mut prefix = [0u8; LENGTH_PREFIX];
    read_exact_by(stream, &mut prefix, deadline).map_err(io_error(READ_LENGTH, limit, var))?;
    let len = decode_length(&prefix, max_len)?;
    let mut body = vec![0u8; len];
    read_exact_by(stream, &mut body, deadline).map_err(io_error(
        "reading the frame body",
        limit,
        var,
    ))?;
    Ok(decode_body(&body)?)
}

/// Sends one request to `peer` (`host:port`) and returns the reply's JSON text.
///
/// `MC_HANDSHAKE_TIMEOUT` bounds the whole call: connecting (each attempt
/// also within `MC_HANDSHAKE_CONNECT_TIMEOUT`), sending and receiving. A peer
/// that accepts and never answers, or answers a byte at a time, fails the
/// call at that deadline.
pub fn request(
    peer: &HostPort,
    kind: MessageType,
    json: &str,
    cfg: &Config,
) -> Result<String, MetadataError> {
    exchange(peer, kind, json, cfg).map_err(|source| MetadataError::Handshake {
        peer: peer.session_id(),
        source,
    })
}

fn exchange(
    peer: &HostPort,
    kind: MessageType,
    json: &str,
    cfg: &Config,
) -> Result<String, HandshakeError> {
    let deadline = Instant::now() + cfg.handshake_timeout;
    let mut pause = Duration::from_millis(10);
    loop {
        match exchange_once(peer, kind, json, cfg, deadline) {
            Err(e) if refused_at_accept(&e) && retry_is_safe(kind) => {
                // The server closed before reading anything: its connection
                // slots were all taken. Try again, within the same deadline.
                let left = deadline.saturating_duration_since(Instant::now());
                if left <= pause {
                    return Err(e);
                }
                tracing::debug!(
                    "handshake with {} refused ({e}); retrying in {pause:?}",
                    peer.session_id()
                );
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            other => return other,
        }
    }
}

/// Whether the server closed the connection before replying anything, as
/// it does with a connection over its caps.
fn refused_at_accept(e: &HandshakeError) -> bool {
    matches!(
        e,
        HandshakeError::Io { step: READ_LENGTH, source }
            if matches!(
                source.kind(),
                io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
            )
    )
}

/// Requests that change nothing on the server (or change it idempotently: the IPC
/// control messages) may be sent twice; a notification may not (the server may have
/// queued it before closing).
fn retry_is_safe(kind: MessageType) -> bool {
    matches!(
        kind,
        MessageType::Metadata | MessageType::Probe | MessageType::IpcControl
    )
}

fn exchange_once(
    peer: &HostPort,
    kind: MessageType,
    json: &str,
    cfg: &Config,
    deadline: Instant,
) -> Result<String, HandshakeError> {
    let limit = cfg.handshake_timeout;
    let var = "MC_HANDSHAKE_TIMEOUT";
    let mut stream = connect_by(&resolve(peer, cfg.use_ipv6)?, cfg, deadline)?;
    write_all_by(&mut stream, &Frame::new(kind, json).encode(), deadline).map_err(io_error(
        "sending the request",
        limit,
        var,
    ))?;
    let reply = read_frame(&mut stream, cfg.handshake_max_length, deadline, limit, var)?;
    let _ = stream.shutdown(Shutdown::Both);
    if reply.kind != kind {
        return Err(HandshakeError::WrongType {
            sent: kind,
            got: reply.kind,
        });
    }
    Ok(reply.json()?.to_string())
}

/// Connects to the first of `addrs` that answers, each attempt within the
/// connect timeout and all of them before `deadline`.
fn connect_by(
    addrs: &[SocketAddr],
    cfg: &Config,
    deadline: Instant,
) -> Result<TcpStream, HandshakeError> {
    let mut last = None;
    for &addr in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match TcpStream::connect_timeout(&addr, left.min(cfg.handshake_connect_timeout)) {
            Ok(s) => return Ok(s),
            Err(source) => last = Some(HandshakeError::Connect { addr, source }),
        }
    }
    Err(last.unwrap_or(HandshakeError::Deadline {
        step: "connecting",
        limit: cfg.handshake_timeout,
        var: "MC_HANDSHAKE_TIMEOUT",
    }))
}

/// Resolves a host:port to socket addresses (IPv4 first unless `MC_USE_IPV6`).
pub fn resolve(hp: &HostPort, ipv6: bool) -> Result<Vec<SocketAddr>, HandshakeError> {
    crate::net::resolve(&hp.host, hp.port, ipv6).map_err(|source| HandshakeError::Resolve {
        host: hp.host.clone(),
        source,
    })
}
