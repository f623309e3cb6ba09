//! The master's `--metrics_port` routes over a real socket: status codes and content
//! types of `/health`, `/metrics` and the admin routes, a standby refusing to answer from
//! its empty state, non-`GET` methods refused. The server's bounds are
//! `transfer_engine::http_serve`'s, tested in `engine/tests/http_serve.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test")]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use mooncake_store::master::http::AdminServer;
use mooncake_store::master::service::{Role, Shared};
use mooncake_store::master::state::{Policy, State};

/// Status, head and body of one request (sent with `Connection: close`).
fn get(addr: SocketAddr, method: &str, target: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    let status = head[9..12].parse().unwrap();
    (status, head.to_ascii_lowercase(), body.to_string())
}

#[test]
fn the_routes_answer_in_their_shapes() {
    let shared = Shared::new(State::new(Policy::default()));
    let srv = AdminServer::start("127.0.0.1:0".parse().unwrap(), shared.clone()).unwrap();
    let addr = srv.addr();

    let (st, head, body) = get(addr, "GET", "/health");
    assert_eq!(st, 200, "{body}");
    assert!(
        head.contains("content-type: application/json; charset=utf-8"),
        "{head}"
    );
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["role"], "leader");
    assert_eq!(health["service_ready"], true);

    let (st, head, body) = get(addr, "GET", "/metrics");
    assert_eq!(st, 200);
    assert!(
        head.contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    assert!(body.contains("\nmaster_key_count 0\n"), "{body}");

    let (st, _, body) = get(addr, "GET", "/get_all_keys");
    assert_eq!((st, body.as_str()), (200, ""), "no key yet");
    let (st, _, body) = get(addr, "GET", "/query_key");
    assert_eq!(st, 400, "{body}");
    let (st, _, body) = get(addr, "GET", "/query_key?key=nothing%20here");
    assert_eq!(st, 404, "{body}");
    let (st, _, body) = get(addr, "GET", "/batch_query_keys?keys=a,b");
    assert_eq!(st, 200);
    let batch: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(batch["data"]["b"]["ok"], false, "{body}");
    let (st, _, body) = get(addr, "GET", "/elsewhere");
    assert_eq!(st, 404);
    assert!(body.starts_with("no route /elsewhere;"), "{body}");
    let (st, _, body) = get(addr, "POST", "/metrics");
    assert_eq!((st, body.as_str()), (405, "only GET is served\n"));

    // A standby answers for itself, not for the cluster.
    shared.set_role(Role::Standby { leader: None });
    let (st, _, body) = get(addr, "GET", "/get_all_segments");
    assert_eq!(st, 503, "{body}");
    assert_eq!(get(addr, "GET", "/health").0, 200);
}
