//! The project's one HTTP/1.1 server, bounded against hostile clients: the HTTP metadata
//! server, the engine's `MC_METRICS_PORT` endpoint and the master's `--metrics_port`
//! routes all serve through it, on `hyper`'s HTTP/1.1 state machine.
//!
//! The contract, whatever clients do (each number is a constant below or a [`Limits`]
//! field with that constant as its default):
//! - **Connections.** At most [`Limits::max_connections`] ([`MAX_CONNECTIONS`]) are open at
//!   once, counted from accept to close. One past the cap is answered
//!   `503 Service Unavailable` with `Retry-After` and closed, without a byte read from it:
//!   the client learns why it was turned away (a bare close reads like a crash or a network
//!   fault), and the answer costs one non-blocking write of a few bytes into the fresh
//!   socket's empty send buffer, with no task, buffer or thread behind it.
//! - **Time.** One deadline per phase, never per read (a byte a second does not extend it):
//!   a request's head must be complete within [`Limits::head_timeout`] ([`HEAD_TIMEOUT`]) of
//!   the accept, or of the end of the previous reply on a kept-alive connection (so an idle
//!   connection is closed after that same time: the idle timeout is the head timeout); once
//!   the head is in, its body, the handler and the reply get [`Limits::request_timeout`]
//!   ([`REQUEST_TIMEOUT`]) together. Past a deadline the connection is closed.
//! - **Size.** A head over [`MAX_HEAD_BYTES`] is answered `431` by hyper (its
//!   `max_buf_size`) and the connection closed. A body over [`Limits::max_body_bytes`] is
//!   answered `413` as soon as its `Content-Length`, or the bytes received, pass the cap:
//!   nothing past the cap is buffered. What the client still sends is then read and
//!   dropped for [`LINGER`] at most, so that it reads the 413 rather than a reset.
//! - **Threads.** One thread runs a current-thread tokio runtime that accepts, parses and
//!   times every connection; handlers run on its blocking pool, at most
//!   [`Limits::workers`] threads, so a slow handler holds a worker and no other connection.
//!   Dropping the [`Server`] closes the listener and every connection and joins every
//!   thread (a handler already running is let finish: a thread cannot be cut short).
//!
//! Memory is bounded by `max_connections × (MAX_HEAD_BYTES + max_body_bytes)` plus the
//! replies being written. Handlers stay synchronous functions from a [`Request`] (method,
//! path, query, body) to a [`Reply`] (status, content type, body).

#![deny(clippy::indexing_slicing)]

mod connection;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::oneshot;

use crate::conn_limit::{ConnLimiter, Refusal};
use crate::log_throttle::LogThrottle;

pub use hyper::Method;

/// Default cap on connections open at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Longest request head (request line and headers). hyper refuses a smaller
/// `max_buf_size` than 8 KiB.
pub const MAX_HEAD_BYTES: usize = 16 << 10;
const _: () = assert!(MAX_HEAD_BYTES >= 8 << 10, "hyper's max_buf_size floor");
/// Default cap on a request's body.
pub const MAX_BODY_BYTES: usize = 64 << 10;
/// Default time for a head to arrive, from the accept or the previous reply.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time for a body, its handler and its reply, from the end of the head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Default number of threads running handlers.
pub const WORKERS: usize = 2;
/// How long the rest of a refused body is read and dropped after the 413.
pub const LINGER: Duration = Duration::from_secs(1);
/// Connections the kernel queues before we accept them.
const BACKLOG: i32 = 1024;
/// Pause after a failed accept (out of descriptors), so the loop does not spin on it.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The plain-text content type.
pub const PLAIN: &str = "text/plain; charset=utf-8";

/// What one server allows a client.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections open at once; past it, 503.
    pub max_connections: usize,
    /// Largest request body; past it, 413.
    pub max_body_bytes: usize,
    /// Time for a head to arrive, from the accept or the previous reply.
    pub head_timeout: Duration,
    /// Time for the body, the handler and the reply, from the end of the head.
    pub request_timeout: Duration,
    /// Threads running handlers (at least one).
    pub workers: usize,
    /// Whether a connection may carry more than one request; when not, every reply says
    /// `Connection: close` and the connection ends after it.
    pub keep_alive: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: MAX_CONNECTIONS,
            max_body_bytes: MAX_BODY_BYTES,
            head_timeout: HEAD_TIMEOUT,
            request_timeout: REQUEST_TIMEOUT,
            workers: WORKERS,
            keep_alive: true,
        }
    }
}

/// A request, its body read whole (and within [`Limits::max_body_bytes`]).
#[derive(Debug)]
pub struct Request {
    /// `GET`, `PUT`, ...
    pub method: Method,
    /// The target's path, as sent (not percent-decoded).
    pub path: String,
    /// The target's query, without the `?` (empty when there is none).
    pub query: String,
    /// The body.
    pub body: Vec<u8>,
}

/// A reply: status, content type and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The `Content-Type`.
    pub content_type: &'static str,
    /// The body.
    pub body: Vec<u8>,
}

impl Reply {
    /// A reply of `status` with `body` of type `content_type`.
    pub fn new(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status,
            content_type,
            body: body.into(),
        }
    }
}

/// What answers requests: called on a worker thread, once per request.
type Handler = dyn Fn(Request) -> Reply + Send + Sync;

/// What the serving thread and its connections share.
struct Shared {
    name: String,
    limits: Limits,
    handler: Box<Handler>,
    slots: Arc<ConnLimiter>,
    peak: AtomicUsize,
    refused: LogThrottle,
    accept_failed: LogThrottle,
}

/// A running server; dropping it stops it and joins its threads.
pub struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("name", &self.shared.name)
            .field("addr", &self.addr)
            .finish()
    }
}

impl Server {
    /// Listens on `addr` (port 0: any free port) and answers every request with
    /// `handler`. `name` names its threads (Linux keeps 15 bytes of it) and its log lines.
    pub fn start(
        name: &str,
        addr: SocketAddr,
        limits: Limits,
        handler: impl Fn(Request) -> Reply + Send + Sync + 'static,
    ) -> io::Result<Server> {
        let listener = listen(addr)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .max_blocking_threads(limits.workers.max(1))
            .thread_name(name)
            .build()?;
        let shared = Arc::new(Shared {
            name: name.to_string(),
            slots: ConnLimiter::new(limits.max_connections, limits.max_connections),
            limits,
            handler: Box::new(handler),
            peak: AtomicUsize::new(0),
            refused: LogThrottle::per_second(),
            accept_failed: LogThrottle::per_second(),
        });
        let (stop, stopped) = oneshot::channel();
        let serving = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                runtime.block_on(accept_loop(listener, &serving, stopped));
                // Dropping the runtime drops every connection and joins the workers.
                drop(runtime);
            })?;
        Ok(Server {
            addr,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections open now.
    pub fn live_connections(&self) -> usize {
        self.shared.slots.active()
    }

    /// The most connections that were open at once since the start.
    pub fn peak_connections(&self) -> usize {
        self.shared.peak.load(Ordering::Relaxed)
    }

    /// Serves until the process ends (the server stops only when dropped).
    pub fn wait(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The listening socket, with `TCP_NODELAY`, which Linux copies to every accepted socket
/// (and [`connection`] sets again on each): hyper may write a reply's head and body
/// separately, and with Nagle's algorithm the body would wait for the client's delayed
/// ACK (40 ms a request).
fn listen(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    sock.set_reuse_address(true)?;
    sock.set_nodelay(true)?;
    sock.bind(&addr.into())?;
    sock.listen(BACKLOG)?;
    sock.set_nonblocking(true)?;
    Ok(sock.into())
}

async fn accept_loop(
    listener: std::net::TcpListener,
    shared: &Arc<Shared>,
    mut stop: oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("{}: cannot serve: {e}", shared.name);
            return;
        }
    };
    loop {
        // Stopped by a send or by the sender's drop alike.
        let next = std::future::poll_fn(|cx| {
            if Pin::new(&mut stop).poll(cx).is_ready() {
                return Poll::Ready(None);
            }
            listener.poll_accept(cx).map(Some)
        })
        .await;
        match next {
            None => return,
            Some(Ok((stream, peer))) => admit(stream, peer, shared),
            Some(Err(e)) => {
                if let Some(left_out) = shared.accept_failed.allow() {
                    tracing::warn!(
                        "{}: accept failed: {e} ({left_out} more since the last line)",
                        shared.name
                    );
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

/// Serves `stream` in a task of its own if a slot is free, else answers 503.
fn admit(stream: TcpStream, peer: SocketAddr, shared: &Arc<Shared>) {
    match shared.slots.try_acquire(peer.ip()) {
        Ok(slot) => {
            shared
                .peak
                .fetch_max(shared.slots.active(), Ordering::Relaxed);
            tokio::spawn(connection::serve(stream, slot, Arc::clone(shared)));
        }
        Err(why) => refuse(&stream, peer, why, shared),
    }
}

fn refuse(stream: &TcpStream, peer: SocketAddr, why: Refusal, shared: &Shared) {
    if let Some(left_out) = shared.refused.allow() {
        tracing::warn!(
            "{}: connection from {peer} answered 503: {why} (its max_connections; \
             {left_out} more since the last line)",
            shared.name
        );
    }
    let body = format!("{why}; retry later\n");
    let reply = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: {PLAIN}\r\nContent-Length: {}\r\n\
         Retry-After: 1\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // A fresh socket's send buffer is empty, so this takes it whole; if it does not, the
    // client is gone and the close below is all it gets.
    let _ = stream.try_write(reply.as_bytes());
}
