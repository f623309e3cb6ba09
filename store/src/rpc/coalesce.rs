//! One write per message on the master's connections, both ways.
//!
//! A unary gRPC call is several HTTP/2 frames (request: HEADERS, DATA, an empty DATA
//! that ends the stream; reply: HEADERS, DATA, trailing HEADERS), and hyper's h2 flushes
//! each group as its task produces it. Over `TCP_NODELAY` every flush is a segment, and
//! every segment wakes the sleeping peer: a call then costs the peer two or three
//! wake-ups where one would do, and the store's small batches are bound by exactly that
//! fixed cost. [`Coalesced`] holds the written bytes and, the first time it is asked to
//! flush them, yields once to the runtime, so the tasks that are about to add the
//! message's other frames run first; the next flush writes them all with one call.
//! Nothing waits on a timer: the yield costs one pass of the scheduler.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Yields of one flush while the held bytes still grow: h2 needs a few passes of its
/// tasks (stream capacity, then the body) to produce a whole message.
const MAX_YIELDS: u32 = 4;

/// Held bytes past which a write drains them first, so a large message streams.
const MAX_HELD: usize = 256 << 10;

/// A stream whose writes reach the socket at flush time, gathered into one write.
#[derive(Debug)]
pub struct Coalesced<S> {
    io: S,
    held: Vec<u8>,
    /// Bytes of `held` already written.
    sent: usize,
    /// Yields of this flush so far, and how much was held at the last one.
    yields: u32,
    held_at_yield: usize,
}

impl<S> Coalesced<S> {
    pub fn new(io: S) -> Self {
        Self {
            io,
            held: Vec::new(),
            sent: 0,
            yields: 0,
            held_at_yield: 0,
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.io
    }
}

impl<S: AsyncWrite + Unpin> Coalesced<S> {
    /// Writes what is held; `Ready(Ok)` once all of it is on the socket.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.held.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.held[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.held.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Coalesced<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Coalesced<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.held.len() >= MAX_HELD {
            ready!(self.poll_drain(cx))?;
        }
        self.held.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let grew = self.held.len() > self.held_at_yield.max(self.sent);
        if grew && self.yields < MAX_YIELDS {
            // Let the frames that other tasks are producing for this message join it.
            self.yields += 1;
            self.held_at_yield = self.held.len();
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        ready!(self.poll_drain(cx))?;
        self.yields = 0;
        self.held_at_yield = 0;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Opens the client's connections to a master: `TCP_NODELAY`, writes [`Coalesced`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Connector;

impl tower_service::Service<http::Uri> for Connector {
    type Response = TokioIo<Coalesced<TcpStream>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        Box::pin(async move {
            let host = uri.host().unwrap_or_default().trim_matches(['[', ']']);
            let port = uri.port_u16().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("{uri} names no port"))
            })?;
            let stream = TcpStream::connect((host, port)).await?;
            stream.set_nodelay(true)?;
            Ok(TokioIo::new(Coalesced::new(stream)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Counts the writes that reach the inner stream.
    struct Counting {
        writes: usize,
        bytes: Vec<u8>,
    }

    impl AsyncWrite for Counting {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.writes += 1;
            self.bytes.extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn frames_written_before_a_flush_reach_the_socket_as_one_write() {
        let mut c = Coalesced::new(Counting {
            writes: 0,
            bytes: Vec::new(),
        });
        c.write_all(b"HEADERS").await.unwrap();
        c.write_all(b"DATA").await.unwrap();
        c.write_all(b"END").await.unwrap();
        assert_eq!(c.io.writes, 0, "nothing is written before a flush");
        c.flush().await.unwrap();
        assert_eq!(c.io.writes, 1);
        assert_eq!(c.io.bytes, b"HEADERSDATAEND");
        // A flush with nothing held writes nothing and does not yield.
        c.flush().await.unwrap();
        assert_eq!(c.io.writes, 1);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_large_message_streams_through_in_bounded_pieces() {
        let (a, mut b) = tokio::io::duplex(64 << 10);
        let payload: Vec<u8> = (0..3 * MAX_HELD).map(|i| (i % 251) as u8).collect();
        let sent = payload.clone();
        let writer = tokio::spawn(async move {
            let mut c = Coalesced::new(a);
            for piece in sent.chunks(16 << 10) {
                c.write_all(piece).await.unwrap();
                assert!(c.held.len() <= MAX_HELD + (16 << 10));
            }
            c.flush().await.unwrap();
            c.shutdown().await.unwrap();
        });
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(got, payload);
    }
}
