//! The handshake port: a small request/response server and its client.
//!
//! One TCP connection per request, as upstream: the client sends one frame,
//! the server replies with a frame of the same type, shuts down its write
//! side, waits briefly for the client's EOF and closes.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::EngineError;
use crate::net;
use crate::wire::handshake::{decode_body, decode_length, Frame, MessageType, LENGTH_PREFIX};
use crate::wire::session::HostPort;

/// What the server does with a request: return the reply JSON, or `None` to
/// close without replying.
pub type Handler = dyn Fn(MessageType, &str) -> Option<String> + Send + Sync;

/// Handshake requests handled at once; more wait in the backlog.
const MAX_CONCURRENT: usize = 64;
/// Server-side receive timeout per connection (upstream: 5 s).
const SERVER_RECV_TIMEOUT: Duration = Duration::from_secs(5);

/// A running handshake listener; stops when dropped.
pub struct HandshakeServer {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HandshakeServer {
    /// Serves `listener` (non-blocking) with `handler`.
    pub fn start(
        listener: TcpListener,
        max_len: u64,
        handler: Arc<Handler>,
    ) -> std::io::Result<Self> {
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("te-rpc-{port}"))
            .spawn(move || accept_loop(listener, max_len, handler, stop2))?;
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

fn accept_loop(listener: TcpListener, max_len: u64, handler: Arc<Handler>, stop: Arc<AtomicBool>) {
    let active = Arc::new(AtomicUsize::new(0));
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
        if active.load(Ordering::Acquire) >= MAX_CONCURRENT {
            tracing::warn!(
                "handshake from {peer} dropped: {MAX_CONCURRENT} requests already in progress"
            );
            continue;
        }
        active.fetch_add(1, Ordering::AcqRel);
        let handler = handler.clone();
        let active2 = active.clone();
        let spawned = std::thread::Builder::new()
            .name("te-rpc-conn".into())
            .spawn(move || {
                if let Err(e) = serve_one(stream, max_len, &*handler) {
                    tracing::warn!("handshake from {peer} failed: {e}");
                }
                active2.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            active.fetch_sub(1, Ordering::AcqRel);
            tracing::error!("cannot start a handshake thread: {e}");
        }
    }
}

fn serve_one(mut stream: TcpStream, max_len: u64, handler: &Handler) -> Result<(), String> {
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(SERVER_RECV_TIMEOUT))
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(SERVER_RECV_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let frame = read_frame(&mut stream, max_len)?;
    let json = frame.json().map_err(|e| e.to_string())?;
    let Some(reply) = handler(frame.kind, json) else {
        return Ok(());
    };
    stream
        .write_all(&Frame::new(frame.kind, &reply).encode())
        .map_err(|e| format!("cannot send reply: {e}"))?;
    let _ = stream.shutdown(Shutdown::Write);
    // Wait for the client's EOF so it reads the whole reply before we close.
    let mut sink = [0u8; 256];
    while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
    Ok(())
}

fn read_frame(stream: &mut TcpStream, max_len: u64) -> Result<Frame, String> {
    let mut prefix = [0u8; LENGTH_PREFIX];
    stream
        .read_exact(&mut prefix)
        .map_err(|e| format!("cannot read frame length: {e}"))?;
    let len = decode_length(&prefix, max_len).map_err(|e| e.to_string())?;
    let mut body = vec![0u8; len];
    stream
        .read_exact(&mut body)
        .map_err(|e| format!("cannot read {len}-byte frame: {e}"))?;
    decode_body(&body).map_err(|e| e.to_string())
}

/// Sends one request to `peer` (`host:port`) and returns the reply's JSON text.
pub fn request(
    peer: &HostPort,
    kind: MessageType,
    json: &str,
    cfg: &Config,
) -> Result<String, EngineError> {
    let name = peer.session_id();
    let fail = |reason: String| EngineError::Handshake {
        peer: name.clone(),
        reason,
    };
    let addrs = resolve(peer, cfg.use_ipv6).map_err(&fail)?;
    let mut last = String::from("no address");
    let mut stream = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, cfg.handshake_connect_timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = format!("connect to {addr}: {e}"),
        }
    }
    let mut stream = stream.ok_or_else(|| fail(last))?;
    let deadline = Instant::now() + Duration::from_secs(300);
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| fail(e.to_string()))?;
    stream
        .set_write_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| fail(e.to_string()))?;
    stream
        .write_all(&Frame::new(kind, json).encode())
        .map_err(|e| fail(format!("cannot send request: {e}")))?;
    let reply = read_frame(&mut stream, cfg.handshake_max_length).map_err(fail)?;
    let _ = stream.shutdown(Shutdown::Both);
    if Instant::now() > deadline {
        return Err(fail("reply took longer than 300 s".into()));
    }
    if reply.kind != kind {
        return Err(fail(format!(
            "replied with type {:?} to a {kind:?} request",
            reply.kind
        )));
    }
    reply
        .json()
        .map(str::to_string)
        .map_err(|e| fail(e.to_string()))
}

/// Resolves a host:port to socket addresses (IPv4 first unless `MC_USE_IPV6`).
pub fn resolve(hp: &HostPort, ipv6: bool) -> Result<Vec<SocketAddr>, String> {
    let host = hp.host.split('%').next().unwrap_or(&hp.host);
    let mut addrs: Vec<SocketAddr> = (host, hp.port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {:?}: {e}", hp.host))?
        .collect();
    if !ipv6 && addrs.iter().any(SocketAddr::is_ipv4) {
        addrs.retain(SocketAddr::is_ipv4);
    }
    if addrs.is_empty() {
        return Err(format!("{:?} resolves to no address", hp.host));
    }
    Ok(addrs)
}
