//! The scrape endpoint on `MC_METRICS_PORT`.
//!
//! Hand-written rather than on `tiny_http` (which the metadata server uses): tiny_http
//! 0.12 reads a request head without a size cap or a read timeout, on a thread per
//! connection with no cap on their number, and its accept loop ends for good on the first
//! accept error, so a listener timeout cannot bound it either. An endpoint in every engine
//! process must not let a scraper hold threads or memory, hence the one-connection-at-a-time
//! loop below with its short timeouts and head cap.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Longest request head read from a scraper.
const MAX_REQUEST_BYTES: usize = 8192;
/// How long one scrape may take to send its request or read the reply.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

/// Serves `GET /metrics` on one thread, one connection at a time (so its cost is
/// bounded whatever scrapers do: a slow one holds the endpoint for [`SCRAPE_TIMEOUT`]
/// at most); stopped and joined when dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl MetricsServer {
    /// Listens on `addr` and answers scrapes with `render()`.
    pub fn start(
        addr: SocketAddr,
        render: Box<dyn Fn() -> String + Send>,
    ) -> io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("te-metrics".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if flag.load(Ordering::Acquire) {
                        break;
                    }
                    if let Ok(conn) = conn {
                        if let Err(e) = answer(conn, &*render) {
                            tracing::debug!("metrics scrape failed: {e}");
                        }
                    }
                }
            })?;
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the blocked accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn answer(mut conn: TcpStream, render: &dyn Fn() -> String) -> io::Result<()> {
    conn.set_read_timeout(Some(SCRAPE_TIMEOUT))?;
    conn.set_write_timeout(Some(SCRAPE_TIMEOUT))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() >= MAX_REQUEST_BYTES {
            return reply(
                &mut conn,
                "431 Request Header Fields Too Large",
                "text/plain",
                "",
            );
        }
        let n = conn.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, path) = (parts.next(), parts.next());
    match (method, path) {
        (Some(b"GET"), Some(b"/metrics")) => reply(
            &mut conn,
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            &render(),
        ),
        (Some(b"GET"), _) => reply(&mut conn, "404 Not Found", "text/plain", "try /metrics\n"),
        _ => reply(
            &mut conn,
            "405 Method Not Allowed",
            "text/plain",
            "only GET /metrics\n",
        ),
    }
}

fn reply(conn: &mut TcpStream, status: &str, kind: &str, body: &str) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())?;
    conn.write_all(body.as_bytes())?;
    conn.flush()
}
