//! The scrape endpoint on `MC_METRICS_PORT`, on the bounded server of
//! [`crate::http_serve`]: an endpoint in every engine process must not let a scraper hold
//! threads or memory, so it takes few connections, short deadlines and no body to speak of.

use std::io;
use std::net::SocketAddr;

use crate::http_serve::{Limits, Method, Reply, Request, Server};

/// Scrapers served at once (Prometheus uses one; a few more for people with curl).
const MAX_SCRAPERS: usize = 4;
/// How long a scraper may take to send its request: it sends it at once.
const HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
/// How long rendering and sending the reply may take: Prometheus' default scrape timeout.
const SCRAPE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// A scrape has no body; this only lets a stray one be answered 405 rather than 413.
const MAX_BODY_BYTES: usize = 4096;
/// The exposition's content type (Prometheus text format 0.0.4).
const EXPOSITION: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The other replies' content type, as the endpoint always sent it.
const TEXT: &str = "text/plain";

/// Serves `GET /metrics` (bounded: [`MAX_SCRAPERS`] connections, one request each, a
/// slow scraper closed after [`HEAD_TIMEOUT`] or [`SCRAPE_TIMEOUT`]); stopped and joined
/// when dropped.
pub struct MetricsServer {
    http: Server,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer")
            .field("addr", &self.http.addr())
            .finish()
    }
}

impl MetricsServer {
    /// Listens on `addr` and answers scrapes with `render()`.
    pub fn start(
        addr: SocketAddr,
        render: Box<dyn Fn() -> String + Send + Sync>,
    ) -> io::Result<MetricsServer> {
        let limits = Limits {
            max_connections: MAX_SCRAPERS,
            max_body_bytes: MAX_BODY_BYTES,
            head_timeout: HEAD_TIMEOUT,
            request_timeout: SCRAPE_TIMEOUT,
            workers: 1,
            // As the endpoint always did: `Connection: close` on every reply.
            keep_alive: false,
        };
        let http = Server::start("te-metrics", addr, limits, move |req| {
            answer(&req, &*render)
        })?;
        Ok(MetricsServer { http })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.http.addr()
    }
}

fn answer(req: &Request, render: &dyn Fn() -> String) -> Reply {
    match (&req.method, req.path.as_str()) {
        (&Method::GET, "/metrics") => Reply::new(200, EXPOSITION, render()),
        (&Method::GET, _) => Reply::new(404, TEXT, "try /metrics\n"),
        _ => Reply::new(405, TEXT, "only GET /metrics\n"),
    }
}
