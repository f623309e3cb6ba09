//! Engines discovering each other through our HTTP metadata server on loopback: register,
//! discover, transfer with verified bytes; cluster ids; an engine killed with SIGKILL (its
//! entries expire, its name initializes again at once); malformed requests get 4xx;
//! unreachable and garbage stores fail `initialize` with the reason.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod common;
mod meta_common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use common::{fnv, pattern, wait_for, Buf};
use meta_common::{engine_in, name, plain_names_move_bytes, read, spawn_child};
use transfer_engine::metadata::http_server::{HttpMetadataServer, ServerOptions};
use transfer_engine::metadata::{MetadataError, StoreFailure};
use transfer_engine::{Config, EngineError, Notify, OpCode, Request, TransferEngine};

fn server(opts: ServerOptions) -> HttpMetadataServer {
    HttpMetadataServer::start("127.0.0.1:0".parse().unwrap(), opts).unwrap()
}

fn no_sweep() -> ServerOptions {
    ServerOptions {
        liveness_interval: None,
        ..ServerOptions::default()
    }
}

/// Status and body of one request to the server.
fn http(method: &str, url: &str, body: Option<&[u8]>) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let res = match (method, body) {
        ("GET", _) => agent.get(url).call(),
        ("DELETE", _) => agent.delete(url).call(),
        ("PUT", Some(b)) => agent.put(url).send(b),
        ("POST", Some(b)) => agent.post(url).send(b),
        _ => panic!("unsupported {method}"),
    };
    let mut resp = res.unwrap();
    let status = resp.status().as_u16();
    (status, resp.body_mut().read_to_string().unwrap_or_default())
}

fn key_url(srv: &HttpMetadataServer, key: &str) -> String {
    let enc: String = form_urlencoded::byte_serialize(key.as_bytes()).collect();
    format!("{}?key={enc}", srv.url())
}

#[test]
fn engines_with_plain_names_move_bytes_through_the_http_store() {
    let srv = server(no_sweep());
    // What a peer reads: the address, never the name.
    plain_names_move_bytes(&srv.url(), |name, host| {
        let (st, meta) = http(
            "GET",
            &key_url(&srv, &format!("mooncake/rpc_meta/{name}")),
            None,
        );
        assert_eq!(st, 200, "{meta}");
        let meta: serde_json::Value = serde_json::from_str(&meta).unwrap();
        assert_eq!(meta["ip_or_host_name"], host, "{meta}");
        let (st, desc) = http("GET", &key_url(&srv, &format!("mooncake/ram/{name}")), None);
        assert_eq!(st, 200, "{desc}");
        let desc: serde_json::Value = serde_json::from_str(&desc).unwrap();
        assert_eq!(desc["tcp_data_host"], host, "{desc}");
        assert_eq!(desc["name"], name, "{desc}");
    });
}

#[test]
fn register_discover_transfer_over_http_store() {
    let srv = server(no_sweep());
    let (a_name, b_name) = (name(), name());
    let a = engine_in(&a_name, &srv.url(), "");
    let b = engine_in(&b_name, &srv.url(), "");
    assert_eq!(
        b.session_id(),
        b_name,
        "store mode: the name is the segment"
    );

    // B's memory, published on registration, read by A through the store.
    let len = 1 << 20;
    let b_buf = Buf::new(len);
    b_buf.write_at(0, &pattern(len, 1)).unwrap();
    b.register_memory(b_buf.addr(), len as u64, "cpu:0")
        .unwrap();
    let (st, body) = http(
        "GET",
        &key_url(&srv, &format!("mooncake/ram/{b_name}")),
        None,
    );
    assert_eq!(st, 200);
    assert!(body.contains(&b_buf.addr().to_string()), "{body}");
    assert_eq!(
        read(&a, &b_name, b_buf.addr(), len).unwrap(),
        pattern(len, 1)
    );

    // A writes, B holds the bytes.
    let a_buf = Buf::new(len);
    a_buf.write_at(0, &pattern(len, 2)).unwrap();
    let req = [Request::new(
        OpCode::Write,
        a_buf.addr(),
        b_buf.addr(),
        len as u64,
    )];
    // SAFETY: `a_buf` outlives the synchronous call.
    unsafe { a.transfer_sync(&b_name, &req) }.unwrap();
    assert_eq!(fnv(&b_buf.to_vec()), fnv(&pattern(len, 2)));

    meta_common::check_late_registration_and_unknown_segment(&a, &b, &b_name);

    // Unregistered memory is gone from the store and refused.
    b.unregister_memory(b_buf.addr()).unwrap();
    let (_, body) = http(
        "GET",
        &key_url(&srv, &format!("mooncake/ram/{b_name}")),
        None,
    );
    assert!(
        !body.contains(&format!("\"addr\":{}", b_buf.addr())),
        "{body}"
    );
    let err = read(&a, &b_name, b_buf.addr(), 64).unwrap_err();
    assert!(
        err.contains("not registered") || err.contains("reject"),
        "{err}"
    );

    // Notifications find B's handshake port through its rpc_meta entry.
    a.send_notify(
        &b_name,
        &Notify {
            name: a_name.clone(),
            notify_msg: "hello".into(),
        },
    )
    .unwrap();
    assert!(wait_for(Duration::from_secs(10), || b
        .take_notifies()
        .iter()
        .any(|n| n.notify_msg == "hello")));

    // Engines remove their entries when they go.
    drop(b);
    drop(a);
    assert!(srv.is_empty(), "{} keys left", srv.len());
}

#[test]
fn a_cluster_id_partitions_engines() {
    let srv = server(no_sweep());
    meta_common::check_cluster_partition(&srv.url(), |names| {
        let get = |key: String| http("GET", &key_url(&srv, &key), None).0;
        assert_eq!(get(format!("mooncake/one/rpc_meta/{}", names[0])), 200);
        assert_eq!(get(format!("mooncake/two/ram/{}", names[3])), 200);
        assert_eq!(
            get(format!("mooncake/ram/{}", names[3])),
            404,
            "keys carry the cluster id"
        );
    });
}

#[test]
fn a_killed_engines_name_initializes_again_at_once() {
    // No sweep: the stale entry is still there when the name comes back.
    let srv = server(no_sweep());
    let (a_name, b_name) = (name(), name());
    let a = engine_in(&a_name, &srv.url(), "");
    let (mut child, addr) = spawn_child(&srv.url(), &b_name, 5, &[]);
    assert_eq!(read(&a, &b_name, addr, 4096).unwrap(), pattern(4096, 5));

    // While the first owner lives, the name is refused.
    let err = TransferEngine::new(&b_name, &srv.url(), Config::default()).unwrap_err();
    assert!(err.to_string().contains("in use by a live engine"), "{err}");
    assert_eq!(err.fault(), transfer_engine::Fault::Caller, "{err}");
    match err {
        EngineError::Metadata(MetadataError::Store {
            cause: StoreFailure::NameInUse { name, at },
            ..
        }) => assert!(
            name == b_name && at.starts_with("127.0.0.1:"),
            "{name} {at}"
        ),
        other => panic!("expected NameInUse, got {other:?}"),
    }

    child.kill();
    let (st, _) = http(
        "GET",
        &key_url(&srv, &format!("mooncake/rpc_meta/{b_name}")),
        None,
    );
    assert_eq!(st, 200, "the dead engine's entry is still there");

    let started = Instant::now();
    let b = engine_in(&b_name, &srv.url(), "");
    assert!(started.elapsed() < Duration::from_secs(10));
    let buf = Buf::new(4096);
    buf.write_at(0, &pattern(4096, 6)).unwrap();
    b.register_memory(buf.addr(), 4096, "cpu:0").unwrap();
    // A, which talked to the dead instance, reaches the new one.
    assert_eq!(
        read(&a, &b_name, buf.addr(), 4096).unwrap(),
        pattern(4096, 6)
    );
}

#[test]
fn a_killed_engines_entries_expire() {
    let srv = server(ServerOptions {
        liveness_interval: Some(Duration::from_millis(100)),
        liveness_misses: 2,
        probe_timeout: Duration::from_millis(500),
        ..ServerOptions::default()
    });
    let live = engine_in(&name(), &srv.url(), "");
    let dead_name = name();
    let (mut child, _) = spawn_child(&srv.url(), &dead_name, 7, &[]);
    assert_eq!(srv.len(), 4);
    let rpc = key_url(&srv, &format!("mooncake/rpc_meta/{dead_name}"));
    let ram = key_url(&srv, &format!("mooncake/ram/{dead_name}"));
    child.kill();
    assert!(
        wait_for(Duration::from_secs(20), || http("GET", &rpc, None).0 == 404),
        "the dead engine's rpc_meta entry stays"
    );
    assert_eq!(http("GET", &ram, None).0, 404);
    // The live engine's entries stay.
    assert_eq!(srv.len(), 2);
    live.probe(live.session_id()).unwrap();
}

#[test]
fn malformed_requests_get_4xx() {
    let srv = server(ServerOptions {
        max_body_bytes: 1024,
        ..no_sweep()
    });
    let base = srv.url();
    let k = key_url(&srv, "mooncake/ram/x");
    assert_eq!(http("GET", &base, None).0, 400, "no key");
    assert_eq!(
        http("GET", &format!("{base}?key="), None).0,
        400,
        "blank key"
    );
    assert_eq!(http("GET", &format!("{base}?key=a&key=b"), None).0, 400);
    assert_eq!(http("GET", &format!("{base}?key=a%0Ab"), None).0, 400);
    assert_eq!(http("GET", &format!("{base}?key=%FF"), None).0, 400);
    assert_eq!(http("GET", &k, None).0, 404);
    assert_eq!(http("DELETE", &k, None).0, 404);
    assert_eq!(http("PUT", &k, Some(b"{not json")).0, 400);
    assert_eq!(http("PUT", &k, Some(&[0xff, 0xfe])).0, 400);
    assert_eq!(http("PUT", &k, Some(&vec![b' '; 2048])).0, 413);
    assert_eq!(http("POST", &k, Some(b"{}")).0, 405);
    let other = format!("http://{}/elsewhere?key=a", srv.addr());
    assert_eq!(http("GET", &other, None).0, 404);
    let rpc = key_url(&srv, "mooncake/rpc_meta/x");
    let (st, why) = http("PUT", &rpc, Some(br#"{"ip":"h"}"#));
    assert_eq!(st, 400, "{why}");
    assert!(why.contains("rpc_meta"), "{why}");
    // Well-formed: stored and returned as sent.
    assert_eq!(http("PUT", &k, Some(br#"{"a":1}"#)).0, 200);
    assert_eq!(http("GET", &k, None), (200, r#"{"a":1}"#.to_string()));
    assert_eq!(http("DELETE", &k, None).0, 200);
    // An HTTP request that is not even well-formed gets a 4xx, not a hang or a crash.
    let mut s = std::net::TcpStream::connect(srv.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GARBAGE\r\n\r\n").unwrap();
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 4"), "{reply:?}");
    // The server still serves.
    assert_eq!(http("GET", &k, None).0, 404);
}

/// A listener answering every connection with `reply`, until the test ends.
fn garbage_store(reply: &'static [u8]) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let mut buf = [0u8; 4096];
            let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
            let _ = s.read(&mut buf);
            let _ = s.write_all(reply);
        }
    });
    addr
}

#[test]
fn unreachable_and_garbage_stores_fail_initialize_with_the_reason() {
    let init = |url: &str| {
        TransferEngine::new(&name(), url, Config::default())
            .unwrap_err()
            .to_string()
    };
    // Nothing listens there.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("http://{closed}/metadata");
    let err = init(&url);
    assert!(err.contains(&url) && err.contains("PUT"), "{err}");
    match TransferEngine::new(&name(), &url, Config::default()).unwrap_err() {
        e @ EngineError::Metadata(MetadataError::Store {
            cause: StoreFailure::Request { method: "PUT", .. },
            ..
        }) => assert_eq!(e.fault(), transfer_engine::Fault::Host, "{e}"),
        other => panic!("expected a failed PUT, got {other:?}"),
    }

    // Answers 200 with a body that is not the value written.
    let addr =
        garbage_store(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello");
    let err = init(&format!("http://{addr}/metadata"));
    assert!(err.contains("garbage"), "{err}");

    // Not HTTP at all.
    let addr = garbage_store(b"\x00\x01 not http\r\n\r\n");
    let err = init(&format!("http://{addr}/metadata"));
    assert!(err.contains(&addr.to_string()), "{err}");

    // Accepts and never answers: initialize fails at the request timeout.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/metadata", silent.local_addr().unwrap());
    let started = Instant::now();
    let err = init(&url);
    assert!(started.elapsed() < Duration::from_secs(15), "{err}");
    assert!(err.contains(&url), "{err}");

    // Schemes this build does not speak.
    for (conn, why) in [
        ("https://127.0.0.1:1/metadata", "TLS"),
        ("redis://127.0.0.1:1", "unknown scheme"),
        ("127.0.0.1:2379", "no scheme"),
    ] {
        let err = init(conn);
        assert!(err.contains(why), "{conn}: {err}");
    }
}

#[test]
fn the_server_replaces_rpc_meta_only_of_engines_that_are_gone() {
    let srv = server(no_sweep());
    let live = engine_in(&name(), &srv.url(), "");
    let dead_port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let meta = |port: u16| format!(r#"{{"ip_or_host_name":"127.0.0.1","rpc_port":{port}}}"#);
    let k = key_url(&srv, "mooncake/rpc_meta/n");
    // Over an entry whose engine is alive: refused, as upstream.
    assert_eq!(
        http("PUT", &k, Some(meta(live.rpc_port()).as_bytes())).0,
        200
    );
    let (st, why) = http("PUT", &k, Some(meta(dead_port).as_bytes()));
    assert_eq!(st, 400, "{why}");
    assert!(why.contains("Duplicate rpc_meta key not allowed"), "{why}");
    // The same value again is no conflict.
    assert_eq!(
        http("PUT", &k, Some(meta(live.rpc_port()).as_bytes())).0,
        200
    );
    // Over an entry whose engine does not answer: replaced.
    assert_eq!(http("DELETE", &k, None).0, 200);
    assert_eq!(http("PUT", &k, Some(meta(dead_port).as_bytes())).0, 200);
    assert_eq!(
        http("PUT", &k, Some(meta(live.rpc_port()).as_bytes())).0,
        200
    );
    assert_eq!(http("GET", &k, None), (200, meta(live.rpc_port())));
}

#[test]
fn an_engine_leaving_spares_entries_another_engine_took_over() {
    let srv = server(no_sweep());
    let name_x = name();
    let x = engine_in(&name_x, &srv.url(), "");
    let y = engine_in(&name(), &srv.url(), "");
    // The name now points at Y (as after X was found dead and replaced).
    let k = key_url(&srv, &format!("mooncake/rpc_meta/{name_x}"));
    let y_meta = format!(
        r#"{{"ip_or_host_name":"127.0.0.1","rpc_port":{}}}"#,
        y.rpc_port()
    );
    assert_eq!(http("DELETE", &k, None).0, 200);
    assert_eq!(http("PUT", &k, Some(y_meta.as_bytes())).0, 200);
    drop(x);
    assert_eq!(
        http("GET", &k, None),
        (200, y_meta),
        "X deleted an entry not its own"
    );
}

#[test]
fn the_same_name_again_in_one_process() {
    let srv = server(no_sweep());
    meta_common::check_same_name_again_in_process(&srv.url());
}

#[test]
fn the_server_holds_at_most_max_keys() {
    let srv = server(ServerOptions {
        max_keys: 2,
        ..no_sweep()
    });
    let put = |key: &str| http("PUT", &key_url(&srv, key), Some(b"{}")).0;
    assert_eq!(put("k1"), 200);
    assert_eq!(put("k2"), 200);
    assert_eq!(put("k3"), 507, "a third key");
    assert_eq!(put("k1"), 200, "overwriting a held key");
    assert_eq!(http("DELETE", &key_url(&srv, "k2"), None).0, 200);
    assert_eq!(put("k3"), 200, "room again");
}

#[test]
fn a_descriptor_whose_data_host_does_not_resolve_fails_batches_with_the_name() {
    let srv = server(no_sweep());
    let (a_name, b_name, c_name) = (name(), name(), name());
    let a = engine_in(&a_name, &srv.url(), "");
    let b = engine_in(&b_name, &srv.url(), "");
    let buf = Buf::new(4096);
    b.register_memory(buf.addr(), 4096, "cpu:0").unwrap();
    // B's descriptor, published again under another name with a data host that never
    // resolves (`.invalid`, RFC 6761): what a store holds for a peer whose name is stale.
    let (st, body) = http(
        "GET",
        &key_url(&srv, &format!("mooncake/ram/{b_name}")),
        None,
    );
    assert_eq!(st, 200);
    let mut desc: serde_json::Value = serde_json::from_str(&body).unwrap();
    desc["tcp_data_host"] = "no-such-host.invalid".into();
    desc["name"] = c_name.clone().into();
    let c_key = key_url(&srv, &format!("mooncake/ram/{c_name}"));
    assert_eq!(
        http("PUT", &c_key, Some(desc.to_string().as_bytes())).0,
        200
    );
    for _ in 0..2 {
        // Asked again each time: a failed lookup is not kept.
        let err = read(&a, &c_name, buf.addr(), 64).unwrap_err();
        assert!(
            err.contains("cannot resolve its data address no-such-host.invalid:"),
            "{err}"
        );
    }
    assert_eq!(read(&a, &b_name, buf.addr(), 64).unwrap(), vec![0u8; 64]);
    assert_eq!(http("DELETE", &c_key, None).0, 200);
}
