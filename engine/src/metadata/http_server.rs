//! The HTTP metadata server (the wheel's `mooncake_http_metadata_server`), on the bounded
//! server of [`crate::http_serve`].
//!
//! Upstream's routes and status codes: one route, `/metadata`; `GET`, `PUT`, `DELETE`
//! with `?key=<key>`; a missing or blank key is 400, `GET`/`DELETE` of a missing key 404,
//! success 200; any other path 404, any other method 405.
//!
//! What upstream's server lacks:
//! - **Stale entries.** Upstream refuses to overwrite an existing `rpc_meta` key, so the
//!   entry of an engine that crashed makes that name's next `initialize` fail until
//!   someone deletes it. Here a `PUT` over an existing `rpc_meta` entry probes the old
//!   owner's handshake port: if it does not answer, the entry is replaced; if it does,
//!   the `PUT` is refused with 400 as upstream. And entries of dead engines go away by
//!   themselves: every `liveness_interval` the server probes each `rpc_meta` entry, and
//!   after `liveness_misses` probes in a row unanswered it deletes that `rpc_meta` key
//!   and the `ram` key of the same segment. The engines need no heartbeat for this (an
//!   upstream engine is probed the same way); the server must be able to reach their
//!   handshake ports, or the sweep must be turned off (`--liveness-interval-sec 0`).
//! - **Bounds.** Bodies over `max_body_bytes` are 413 (refused as soon as the length
//!   passes it, nothing past it buffered); beyond `max_keys` keys a new key is 507; keys
//!   over [`MAX_KEY_BYTES`], with control characters or invalid UTF-8, and PUT bodies that
//!   are not JSON (an `rpc_meta` body that is not `{ip_or_host_name, rpc_port}`) are 400
//!   with the reason. Connections are capped at `max_connections` (past it, 503), and a
//!   client that sends nothing, trickles its head or sits idle is closed after
//!   [`crate::http_serve::HEAD_TIMEOUT`]; a request and its reply get
//!   [`crate::http_serve::REQUEST_TIMEOUT`] (see `http_serve` for the whole contract).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::{engine_alive, KeySpace, RpcMeta};
use crate::config::Config;
use crate::http_serve::{self, Limits, Method, Reply, Request, Server, PLAIN};

/// Longest key accepted.
pub const MAX_KEY_BYTES: usize = 4096;
/// The one route.
pub const ROUTE: &str = "/metadata";

/// Settings of the server.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Largest PUT body.
    pub max_body_bytes: usize,
    /// Most keys held.
    pub max_keys: usize,
    /// How often every `rpc_meta` entry's engine is probed; `None`: never.
    pub liveness_interval: Option<Duration>,
    /// Unanswered probes in a row after which an engine's entries are deleted.
    pub liveness_misses: u32,
    /// How long one probe may take.
    pub probe_timeout: Duration,
    /// Threads answering requests.
    pub workers: usize,
    /// Connections open at once; past it, 503.
    pub max_connections: usize,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            max_body_bytes: 16 << 20,
            max_keys: 100_000,
            liveness_interval: Some(Duration::from_secs(10)),
            liveness_misses: 3,
            probe_timeout: Duration::from_secs(2),
            workers: 4,
            max_connections: http_serve::MAX_CONNECTIONS,
        }
    }
}

struct State {
    map: Mutex<HashMap<String, Vec<u8>>>,
    opts: ServerOptions,
    config: Config,
    stop: AtomicBool,
    stop_lock: Mutex<()>,
    stop_cv: Condvar,
}

/// A running server; dropping it stops it.
pub struct HttpMetadataServer {
    http: Server,
    state: Arc<State>,
    sweeper: Option<JoinHandle<()>>,
}

impl HttpMetadataServer {
    /// Listens on `addr` (port 0: any free port) and starts serving.
    pub fn start(addr: SocketAddr, opts: ServerOptions) -> io::Result<Self> {
        let limits = Limits {
            max_connections: opts.max_connections,
            max_body_bytes: opts.max_body_bytes,
            workers: opts.workers,
            ..Limits::default()
        };
        let state = Arc::new(State {
            map: Mutex::new(HashMap::new()),
            opts,
            config: Config::default(),
            stop: AtomicBool::new(false),
            stop_lock: Mutex::new(()),
            stop_cv: Condvar::new(),
        });
        let serving = state.clone();
        let http = Server::start("md-http", addr, limits, move |req| handle(req, &serving))?;
        let sweeper = match state.opts.liveness_interval {
            Some(every) => {
                let state = state.clone();
                Some(
                    std::thread::Builder::new()
                        .name("md-liveness".into())
                        .spawn(move || sweep_loop(&state, every))?,
                )
            }
            None => None,
        };
        Ok(Self {
            http,
            state,
            sweeper,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.http.addr()
    }

    /// The URL engines use: `http://addr/metadata`.
    pub fn url(&self) -> String {
        format!("http://{}{ROUTE}", self.addr())
    }

    /// Number of keys held.
    pub fn len(&self) -> usize {
        self.state.map.lock().len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Serves until the process ends.
    pub fn wait(mut self) {
        self.http.wait();
    }
}

impl Drop for HttpMetadataServer {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        {
            let _g = self.state.stop_lock.lock();
            self.state.stop_cv.notify_all();
        }
        if let Some(t) = self.sweeper.take() {
            let _ = t.join();
        }
    }
}

/// A reply: status and text.
type Answer = (u16, Vec<u8>);

fn text(status: u16, msg: impl Into<String>) -> Answer {
    (status, msg.into().into_bytes())
}

fn handle(req: Request, state: &State) -> Reply {
    let get = req.method == Method::GET;
    let (status, body) = answer(req, state);
    let ctype = if status == 200 && get {
        "application/json"
    } else {
        PLAIN
    };
    Reply::new(status, ctype, body)
}

fn answer(req: Request, state: &State) -> Answer {
    if req.path != ROUTE {
        return text(
            404,
            format!("no route {:?}; the route is {ROUTE}", req.path),
        );
    }
    let key = match parse_key(&req.query) {
        Ok(k) => k,
        Err(why) => return text(400, why),
    };
    match req.method {
        Method::GET => match state.map.lock().get(&key) {
            Some(v) => (200, v.clone()),
            None => text(404, "metadata not found"),
        },
        Method::DELETE => match state.map.lock().remove(&key) {
            Some(_) => text(200, "metadata deleted"),
            None => text(404, "metadata not found"),
        },
        // The body is within `max_body_bytes`: the server refused it otherwise.
        Method::PUT => put(state, key, req.body),
        m => text(
            405,
            format!("method {m} not allowed; use GET, PUT or DELETE"),
        ),
    }
}

/// The single `key` parameter, checked.
fn parse_key(query: &str) -> Result<String, String> {
    let mut key = None;
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if k == "key" {
            if key.is_some() {
                return Err("more than one key parameter".into());
            }
            key = Some(v.into_owned());
        }
    }
    let key = key.ok_or("missing key parameter")?;
    if key.trim().is_empty() {
        return Err("blank key".into());
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(format!("key longer than {MAX_KEY_BYTES} bytes"));
    }
    if key.contains('\u{FFFD}') {
        return Err("key is not valid UTF-8".into());
    }
    if key.chars().any(char::is_control) {
        return Err("key contains control characters".into());
    }
    Ok(key)
}

fn put(state: &State, key: String, body: Vec<u8>) -> Answer {
    let Ok(json) = std::str::from_utf8(&body) else {
        return text(400, "body is not UTF-8 JSON");
    };
    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(json) {
        return text(400, format!("body is not JSON: {e}"));
    }
    if key.contains("rpc_meta") {
        let new = match RpcMeta::decode(json) {
            Ok(m) => m,
            Err(e) => return text(400, format!("rpc_meta body: {e}")),
        };
        let old = state.map.lock().get(&key).cloned();
        if let Some(old) = old {
            if old != body {
                let old_owner = std::str::from_utf8(&old)
                    .ok()
                    .and_then(|s| RpcMeta::decode(s).ok());
                if let Some(owner) = old_owner.filter(|o| o != &new) {
                    if engine_alive(&owner.host_port(), &state.config, state.opts.probe_timeout) {
                        return text(
                            400,
                            format!(
                                "Duplicate rpc_meta key not allowed: the engine at {} is alive",
                                owner.host_port().session_id()
                            ),
                        );
                    }
                    tracing::info!(
                        "metadata server: {key} replaced; its engine at {} does not answer",
                        owner.host_port().session_id()
                    );
                }
            }
        }
    }
    let mut map = state.map.lock();
    if !map.contains_key(&key) && map.len() >= state.opts.max_keys {
        return text(507, format!("the server holds {} keys already", map.len()));
    }
    map.insert(key, body);
    text(200, "metadata updated")
}

fn sweep_loop(state: &State, every: Duration) {
    let mut misses: HashMap<String, u32> = HashMap::new();
    loop {
        let until = Instant::now() + every;
        {
            let mut g = state.stop_lock.lock();
            while !state.stop.load(Ordering::SeqCst) && Instant::now() < until {
                state.stop_cv.wait_until(&mut g, until);
            }
        }
        if state.stop.load(Ordering::SeqCst) {
            return;
        }
        sweep(state, &mut misses);
    }
}

/// Probes every `rpc_meta` entry once; deletes the entries of engines that missed
/// `liveness_misses` probes in a row.
fn sweep(state: &State, misses: &mut HashMap<String, u32>) {
    let entries: Vec<(String, Vec<u8>)> = state
        .map
        .lock()
        .iter()
        .filter(|(k, _)| KeySpace::ram_key_of(k).is_some())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    misses.retain(|k, _| entries.iter().any(|(e, _)| e == k));
    for (key, value) in entries {
        if state.stop.load(Ordering::SeqCst) {
            return;
        }
        let Some(meta) = std::str::from_utf8(&value)
            .ok()
            .and_then(|s| RpcMeta::decode(s).ok())
        else {
            continue;
        };
        if engine_alive(&meta.host_port(), &state.config, state.opts.probe_timeout) {
            misses.remove(&key);
            continue;
        }
        let n = misses.entry(key.clone()).or_insert(0);
        *n += 1;
        if *n < state.opts.liveness_misses.max(1) {
            continue;
        }
        misses.remove(&key);
        let mut map = state.map.lock();
        // Only if nobody re-registered the name meanwhile.
        if map.get(&key) == Some(&value) {
            map.remove(&key);
            if let Some(ram) = KeySpace::ram_key_of(&key) {
                map.remove(&ram);
            }
            tracing::info!(
                "metadata server: {key} deleted with its descriptor: the engine at {} did not answer {} probes",
                meta.host_port().session_id(),
                state.opts.liveness_misses
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked() {
        assert_eq!(
            parse_key("key=mooncake%2Fram%2Fa").unwrap(),
            "mooncake/ram/a"
        );
        assert!(parse_key("").is_err());
        assert!(parse_key("key=").is_err());
        assert!(parse_key("key=%20").is_err());
        assert!(parse_key("key=a&key=b").is_err());
        assert!(parse_key("key=a%0Ab").is_err());
        assert!(parse_key("key=%FF").is_err());
        assert!(parse_key(&format!("key={}", "a".repeat(MAX_KEY_BYTES + 1))).is_err());
    }

    #[test]
    fn ram_key_of_rpc_meta() {
        assert_eq!(
            KeySpace::ram_key_of("mooncake/rpc_meta/h:1").as_deref(),
            Some("mooncake/ram/h:1")
        );
        assert_eq!(
            KeySpace::ram_key_of("mooncake/c1/rpc_meta/a/b").as_deref(),
            Some("mooncake/c1/ram/a/b")
        );
        assert_eq!(KeySpace::ram_key_of("mooncake/ram/x"), None);
        assert_eq!(KeySpace::ram_key_of("other/rpc_meta/x"), None);
    }
}
