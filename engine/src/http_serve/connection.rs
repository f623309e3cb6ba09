//! One accepted connection: hyper's HTTP/1.1 state machine under the phase deadlines of
//! [`super`], bodies read up to their cap, handlers run on the blocking pool.

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, CONNECTION, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::StatusCode;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::{Reply, Request, Shared, LINGER, MAX_HEAD_BYTES, PLAIN};
use crate::conn_limit::ConnPermit;

/// Serves one connection until the client closes it, a deadline passes, or the server
/// stops; `_slot` is its place under the connection cap, given back when this ends.
pub(super) async fn serve(stream: TcpStream, _slot: ConnPermit, shared: Arc<Shared>) {
    // See `listen`: Linux copies it from the listener; other systems may not.
    let _ = stream.set_nodelay(true);
    let clock = Arc::new(Clock::new(Instant::now() + shared.limits.head_timeout));
    let service = {
        let (shared, clock) = (Arc::clone(&shared), Arc::clone(&clock));
        service_fn(move |req| {
            let (shared, clock) = (Arc::clone(&shared), Arc::clone(&clock));
            async move { Ok::<_, Infallible>(respond(req, &shared, &clock).await) }
        })
    };
    let socket = Socket {
        stream,
        clock: Arc::clone(&clock),
        linger: None,
    };
    // No hyper timer: the clock times every phase, the head's included.
    let conn = http1::Builder::new()
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(shared.limits.keep_alive)
        .serve_connection(TokioIo::new(socket), service);
    match until_deadline(conn, &clock).await {
        Some(Ok(())) => {}
        Some(Err(e)) => tracing::debug!("{}: connection ended: {e}", shared.name),
        None => tracing::debug!("{}: connection closed at its deadline", shared.name),
    }
}

/// When a connection's current phase must end, and whether its close lingers.
struct Clock {
    deadline: Mutex<Instant>,
    linger: AtomicBool,
}

impl Clock {
    fn new(deadline: Instant) -> Self {
        Self {
            deadline: Mutex::new(deadline),
            linger: AtomicBool::new(false),
        }
    }

    fn deadline(&self) -> Instant {
        *self.deadline.lock()
    }

    fn set(&self, deadline: Instant) {
        *self.deadline.lock() = deadline;
    }
}

/// Runs `conn` until it ends (`Some`) or the clock's deadline passes (`None`; `conn` is
/// dropped, closing the socket). The deadline moves only while `conn` is polled (the
/// service and the reply body move it), so checking it after each poll sees every move.
async fn until_deadline<F: Future>(conn: F, clock: &Clock) -> Option<F::Output> {
    let mut conn = pin!(conn);
    let mut sleep = pin!(tokio::time::sleep_until(clock.deadline().into()));
    poll_fn(|cx| {
        if let Poll::Ready(out) = conn.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        let deadline = tokio::time::Instant::from_std(clock.deadline());
        if sleep.deadline() != deadline {
            sleep.as_mut().reset(deadline);
        }
        sleep.as_mut().poll(cx).map(|()| None)
    })
    .await
}

async fn respond(
    req: hyper::Request<Incoming>,
    shared: &Arc<Shared>,
    clock: &Arc<Clock>,
) -> hyper::Response<ReplyBody> {
    let limits = &shared.limits;
    clock.set(Instant::now() + limits.request_timeout);
    let (head, body) = req.into_parts();
    let (reply, close) = match read_body(body, limits.max_body_bytes).await {
        Ok(body) => {
            let req = Request {
                method: head.method,
                path: head.uri.path().to_string(),
                query: head.uri.query().unwrap_or_default().to_string(),
                body,
            };
            (run(req, shared).await, !limits.keep_alive)
        }
        Err(BodyError::TooLarge) => {
            clock.linger.store(true, Ordering::Relaxed);
            let why = format!("body larger than {} bytes", limits.max_body_bytes);
            (Reply::new(413, PLAIN, why), true)
        }
        Err(BodyError::Read(e)) => (
            Reply::new(400, PLAIN, format!("reading the body: {e}")),
            true,
        ),
    };
    response(reply, close, clock, limits.head_timeout)
}

enum BodyError {
    TooLarge,
    Read(hyper::Error),
}

/// The whole body, refused as soon as its length (announced or received) passes `max`.
async fn read_body(mut body: Incoming, max: usize) -> Result<Vec<u8>, BodyError> {
    if body.size_hint().lower() > u64::try_from(max).unwrap_or(u64::MAX) {
        return Err(BodyError::TooLarge);
    }
    // Grown as bytes arrive, never to an announced length that may not come.
    let mut out = Vec::new();
    while let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let Ok(data) = frame.map_err(BodyError::Read)?.into_data() else {
            continue; // trailers
        };
        if data.len() > max.saturating_sub(out.len()) {
            return Err(BodyError::TooLarge);
        }
        out.extend_from_slice(&data);
    }
    Ok(out)
}

/// The handler's reply, from a worker thread; a handler that panics is a 500.
async fn run(req: Request, shared: &Arc<Shared>) -> Reply {
    let on_worker = Arc::clone(shared);
    match tokio::task::spawn_blocking(move || (on_worker.handler)(req)).await {
        Ok(reply) => reply,
        Err(e) => {
            tracing::error!("{}: a handler failed: {e}", shared.name);
            Reply::new(500, PLAIN, "the handler failed; see the server's log")
        }
    }
}

fn response(
    reply: Reply,
    close: bool,
    clock: &Arc<Clock>,
    head_timeout: Duration,
) -> hyper::Response<ReplyBody> {
    let body = ReplyBody {
        data: Some(Bytes::from(reply.body)).filter(|b| !b.is_empty()),
        _idle: IdleWhenSent {
            clock: Arc::clone(clock),
            head_timeout,
        },
    };
    let mut resp = hyper::Response::new(body);
    *resp.status_mut() = StatusCode::from_u16(reply.status).unwrap_or_else(|_| {
        tracing::error!("a handler replied with status {}", reply.status);
        StatusCode::INTERNAL_SERVER_ERROR
    });
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(reply.content_type));
    if close {
        headers.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// A reply's body: one frame.
struct ReplyBody {
    data: Option<Bytes>,
    _idle: IdleWhenSent,
}

impl Body for ReplyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.get_mut().data.take().map(|d| Ok(Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

/// Starts the wait for the next head when hyper is done with a reply's body (the rest of
/// the reply may still be flushing: that, too, must end within the head timeout).
struct IdleWhenSent {
    clock: Arc<Clock>,
    head_timeout: Duration,
}

impl Drop for IdleWhenSent {
    fn drop(&mut self) {
        self.clock.set(Instant::now() + self.head_timeout);
    }
}

/// The accepted socket; its shutdown lingers after a refused body.
struct Socket {
    stream: TcpStream,
    clock: Arc<Clock>,
    linger: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    /// hyper shuts down after its last reply is flushed. After a 413 the client may
    /// still be sending the body we refused; closing with its bytes unread would reset
    /// the connection, and the reset can destroy the 413 before the client reads it. So:
    /// our FIN first, then read and drop what comes until the client's FIN or [`LINGER`].
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.clock.linger.load(Ordering::Relaxed) {
            return Pin::new(&mut this.stream).poll_shutdown(cx);
        }
        if this.linger.is_none() {
            let _ = std::task::ready!(Pin::new(&mut this.stream).poll_shutdown(cx));
        }
        let linger = this
            .linger
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(LINGER)));
        let mut scrap = [0u8; 2048];
        loop {
            // The clock is read here too, not only through the timer's wake-up: a client
            // that floods keeps this loop busy.
            if linger.as_mut().poll(cx).is_ready()
                || tokio::time::Instant::now() >= linger.deadline()
            {
                return Poll::Ready(Ok(()));
            }
            let mut buf = ReadBuf::new(&mut scrap);
            match Pin::new(&mut this.stream).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if !buf.filled().is_empty() => continue,
                Poll::Ready(_) => return Poll::Ready(Ok(())),
                // tokio's budget makes a flooded read pending too, with a wake-up.
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
