//! The RPC listener's connections, capped: a peer that opens connections and sends
//! nothing holds at most [`MAX_CONNECTIONS`] of them, and the cap logs when it bites.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::rpc::coalesce::Coalesced;

/// Connections served at once (clients hold one each; the rest wait in the backlog).
pub const MAX_CONNECTIONS: usize = 4096;

/// A connection and its place under the cap.
pub struct Capped {
    stream: Coalesced<TcpStream>,
    _permit: OwnedSemaphorePermit,
}

impl Connected for Capped {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.get_ref().connect_info()
    }
}

impl AsyncRead for Capped {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Capped {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Accepts from `listener` under the cap, as a stream tonic serves.
pub fn capped(listener: TcpListener) -> ReceiverStream<io::Result<Capped>> {
    let (tx, rx) = mpsc::channel(64);
    let cap = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let permit = match Arc::clone(&cap).try_acquire_owned() {
                Ok(p) => p,
                Err(_) => {
                    tracing::warn!(
                        "master: {MAX_CONNECTIONS} RPC connections open; new ones wait until one closes"
                    );
                    match Arc::clone(&cap).acquire_owned().await {
                        Ok(p) => p,
                        Err(_) => return,
                    }
                }
            };
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of descriptors and the like: pause rather than spin.
                    tracing::warn!("master: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let conn = Capped {
                stream: Coalesced::new(stream),
                _permit: permit,
            };
            if tx.send(Ok(conn)).await.is_err() {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}
