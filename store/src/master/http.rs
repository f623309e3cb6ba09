//! The master's HTTP port (`--metrics_port`): Prometheus `/metrics` and upstream's admin
//! routes, in upstream's response shapes (`/health`, `/get_all_segments`,
//! `/get_all_keys`, `/query_key?key=K`, `/batch_query_keys?keys=a,b`).

use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::{json, Value};
use transfer_engine::http_serve::{self, Limits, Method, Request, Server};

use super::service::{Role, Shared};
use super::state::ObjectView;
use crate::codes::Code;

/// Threads answering HTTP requests: scrapes and admin queries are rare and short.
const WORKERS: usize = 2;

/// Connections open at once: a scraper, health checks and an operator or two.
const MAX_CONNECTIONS: usize = 32;

/// Every route is a `GET`; this only lets a stray body be answered 405 rather than 413.
const MAX_BODY_BYTES: usize = 4096;

/// Most keys one `/batch_query_keys` answers for.
const MAX_QUERY_KEYS: usize = 4096;

/// The running HTTP server (bounded as `http_serve` says); stops when dropped.
pub struct AdminServer {
    http: Server,
}

impl AdminServer {
    /// Serves `shared` on `addr`.
    pub fn start(addr: SocketAddr, shared: Arc<Shared>) -> io::Result<Self> {
        let limits = Limits {
            max_connections: MAX_CONNECTIONS,
            max_body_bytes: MAX_BODY_BYTES,
            workers: WORKERS,
            ..Limits::default()
        };
        let http = Server::start("master-http", addr, limits, move |req| {
            answer(&req, &shared)
        })?;
        Ok(Self { http })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.http.addr()
    }
}

struct Reply {
    status: u16,
    content_type: &'static str,
    body: String,
}

const TEXT: &str = "text/plain; version=0.0.4";
const JSON: &str = "application/json; charset=utf-8";

fn answer(req: &Request, shared: &Shared) -> http_serve::Reply {
    let reply = if req.method != Method::GET {
        Reply {
            status: 405,
            content_type: TEXT,
            body: "only GET is served\n".into(),
        }
    } else {
        route(&req.path, &req.query, shared)
    };
    http_serve::Reply::new(reply.status, reply.content_type, reply.body)
}

fn param<'a>(query: &'a str, name: &str) -> Option<std::borrow::Cow<'a, str>> {
    form_pairs(query).find(|(k, _)| k == name).map(|(_, v)| v)
}

fn form_pairs(
    query: &str,
) -> impl Iterator<Item = (std::borrow::Cow<'_, str>, std::borrow::Cow<'_, str>)> {
    query.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k), percent_decode(v))
    })
}

fn percent_decode(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.contains(['%', '+']) {
        return s.into();
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            _ => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned().into()
}

/// `/health`: the process answers (200) and says whether it serves the cluster.
fn health(shared: &Shared) -> Reply {
    let ready = shared.serving().is_ok();
    let (role, ha_state, leader) = match shared.role() {
        Role::Alone => ("leader", "serving", None),
        Role::Standby { leader } => ("standby", "standby", leader),
        Role::Leader { address, .. } => (
            if ready { "leader" } else { "standby" },
            if ready { "serving" } else { "lost_lead" },
            Some(address),
        ),
    };
    json_reply(
        200,
        json!({"status": "ok", "role": role, "ha_state": ha_state, "service_ready": ready,
               "leader_address": leader, "view_version": null}),
    )
}

fn route(path: &str, query: &str, shared: &Shared) -> Reply {
    match path {
        "/health" => return health(shared),
        "/metrics" => {
            return Reply {
                status: 200,
                content_type: TEXT,
                body: metrics_text(shared),
            }
        }
        _ => {}
    }
    // A standby's state is empty and not the cluster's: say so rather than answer from it.
    if let Err(why) = shared.serving() {
        return error_reply(503, Code::UnavailableInCurrentStatus, &why);
    }
    match path {
        "/get_all_segments" => {
            let names: Vec<String> = shared
                .state
                .lock()
                .segments()
                .into_iter()
                .map(|s| s.name)
                .collect();
            lines(names)
        }
        "/get_all_keys" => lines(shared.state.lock().keys()),
        "/query_key" => match param(query, "key") {
            None => error_reply(400, Code::InvalidParams, "the query names no key (?key=K)"),
            Some(key) => match committed(shared, &key) {
                Some(obj) => json_reply(200, json!({"success": true, "data": replicas_json(&obj)})),
                None => error_reply(404, Code::ObjectNotFound, Code::ObjectNotFound.name()),
            },
        },
        "/batch_query_keys" => batch_query(query, shared),
        _ => Reply {
            status: 404,
            content_type: TEXT,
            body: format!(
                "no route {path}; served: /metrics /health /get_all_segments /get_all_keys /query_key?key=K /batch_query_keys?keys=a,b\n"
            ),
        },
    }
}

fn committed(shared: &Shared, key: &str) -> Option<ObjectView> {
    shared.state.lock().query(key).filter(|o| o.committed)
}

fn batch_query(query: &str, shared: &Shared) -> Reply {
    let Some(keys) = param(query, "keys") else {
        return error_reply(
            400,
            Code::InvalidParams,
            "the query names no keys (?keys=a,b)",
        );
    };
    let keys: Vec<&str> = keys.split(',').filter(|k| !k.is_empty()).collect();
    if keys.len() > MAX_QUERY_KEYS {
        return error_reply(
            400,
            Code::InvalidParams,
            &format!("{} keys: at most {MAX_QUERY_KEYS} per query", keys.len()),
        );
    }
    let mut data = serde_json::Map::new();
    for key in keys {
        let entry = match committed(shared, key) {
            Some(obj) => json!({"ok": true, "error": null, "values": replicas_json(&obj),
                                "disk_values": null, "local_disk_values": null, "nof_values": null}),
            None => json!({"ok": false, "error": Code::ObjectNotFound.name(), "values": null,
                           "disk_values": null, "local_disk_values": null, "nof_values": null}),
        };
        data.insert(key.to_string(), entry);
    }
    json_reply(200, json!({"success": true, "data": data}))
}

fn replicas_json(obj: &ObjectView) -> Value {
    obj.replicas
        .iter()
        .map(|r| {
            json!({"size_": r.len, "buffer_address_": r.addr, "protocol_": "tcp",
                   "transport_endpoint_": r.segment})
        })
        .collect()
}

fn lines(items: Vec<String>) -> Reply {
    let mut body = String::new();
    for item in items {
        body.push_str(&item);
        body.push('\n');
    }
    Reply {
        status: 200,
        content_type: TEXT,
        body,
    }
}

fn json_reply(status: u16, v: Value) -> Reply {
    Reply {
        status,
        content_type: JSON,
        body: v.to_string(),
    }
}

fn error_reply(status: u16, code: Code, message: &str) -> Reply {
    json_reply(
        status,
        json!({"success": false, "error_code": code.value(), "error_message": message}),
    )
}

/// The Prometheus text: gauges of the state, counters of the calls, errors by code.
pub fn metrics_text(shared: &Shared) -> String {
    let stats = shared.state.lock().stats();
    let calls = &shared.calls;
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    };
    metric(
        "master_serving",
        "gauge",
        "1 while this master answers for the cluster (the leader, or a master without HA)",
        u64::from(shared.serving().is_ok()),
    );
    metric(
        "master_key_count",
        "gauge",
        "Committed objects",
        stats.objects,
    );
    metric(
        "master_pending_puts",
        "gauge",
        "Puts started and not yet committed",
        stats.pending_puts,
    );
    metric(
        "master_object_bytes",
        "gauge",
        "Bytes of committed objects (one replica each)",
        stats.object_bytes,
    );
    metric(
        "master_allocated_bytes",
        "gauge",
        "Bytes allocated in segments (replicas, unfinished puts, space waiting for release)",
        stats.used,
    );
    metric(
        "master_total_capacity_bytes",
        "gauge",
        "Bytes of all mounted segments",
        stats.capacity,
    );
    metric(
        "master_segment_count",
        "gauge",
        "Mounted segments",
        stats.segments,
    );
    metric(
        "master_client_count",
        "gauge",
        "Clients alive",
        stats.clients,
    );
    metric(
        "master_put_start_requests_total",
        "counter",
        "Objects whose put was started",
        calls.puts.load(Ordering::Relaxed),
    );
    metric(
        "master_put_start_failures_total",
        "counter",
        "Objects whose put start failed",
        calls.puts_failed.load(Ordering::Relaxed),
    );
    metric(
        "master_get_replica_list_requests_total",
        "counter",
        "Objects asked for",
        calls.gets.load(Ordering::Relaxed),
    );
    metric(
        "master_get_replica_list_failures_total",
        "counter",
        "Objects asked for and not served",
        calls.gets_failed.load(Ordering::Relaxed),
    );
    metric(
        "master_exist_key_requests_total",
        "counter",
        "Keys asked about",
        calls.exists.load(Ordering::Relaxed),
    );
    metric(
        "master_remove_requests_total",
        "counter",
        "Keys asked to be removed",
        calls.removes.load(Ordering::Relaxed),
    );
    metric(
        "master_eviction_total",
        "counter",
        "Objects evicted",
        stats.evicted_total,
    );
    metric(
        "master_discarded_puts_total",
        "counter",
        "Unfinished puts discarded after put_start_discard_timeout_sec",
        stats.discarded_puts_total,
    );
    metric(
        "master_dead_clients_total",
        "counter",
        "Clients declared dead after client_ttl",
        stats.dead_clients_total,
    );
    let _ = writeln!(
        out,
        "# HELP master_errors_total Calls answered with an error, by upstream's code\n# TYPE master_errors_total counter"
    );
    for (code, n) in calls.errors() {
        let _ = writeln!(
            out,
            "master_errors_total{{code=\"{}\",name=\"{}\"}} {n}",
            code.value(),
            code.name()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_are_decoded() {
        assert_eq!(param("key=a%2Fb&x=1", "key").as_deref(), Some("a/b"));
        assert_eq!(param("keys=a,b", "keys").as_deref(), Some("a,b"));
        assert_eq!(param("x=1", "key"), None);
        assert_eq!(percent_decode("a+b%zz"), "a b%zz");
        assert_eq!(percent_decode("%"), "%");
    }
}
