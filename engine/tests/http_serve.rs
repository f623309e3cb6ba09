//! The bounded HTTP server (`transfer_engine::http_serve`) against raw-socket clients on
//! loopback: silent, trickling and idle clients closed at their deadlines, idle
//! connections past the cap unable to lock a client out, heads and bodies over their caps
//! refused, the connection count held under its cap, and a dropped server gone with its
//! threads and its port.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use transfer_engine::http_serve::{Limits, Reply, Request, Server, MAX_HEAD_BYTES, PLAIN};

/// The head deadline of these servers.
const HEAD: Duration = Duration::from_millis(400);
/// The request deadline of these servers.
const REQUEST: Duration = Duration::from_secs(1);
/// How late a deadline may bite on a loaded machine before the test calls it missed.
const SLACK: Duration = Duration::from_millis(1500);

fn limits() -> Limits {
    Limits {
        max_connections: 4,
        max_body_bytes: 1024,
        head_timeout: HEAD,
        request_timeout: REQUEST,
        workers: 2,
        keep_alive: true,
    }
}

/// Says what it was asked, and the body's length.
fn echo(req: Request) -> Reply {
    if req.path == "/panic" {
        panic!("asked to");
    }
    let said = format!(
        "{} {}?{} {}",
        req.method,
        req.path,
        req.query,
        req.body.len()
    );
    Reply::new(200, PLAIN, said)
}

fn start(name: &str, limits: Limits) -> Server {
    Server::start(name, "127.0.0.1:0".parse().unwrap(), limits, echo).unwrap()
}

/// Reads until the server closes `s`, and when that was (from `since`); fails if a read
/// waits longer than `give_up`.
fn until_closed(s: &mut TcpStream, since: Instant, give_up: Duration) -> (String, Duration) {
    s.set_read_timeout(Some(give_up)).unwrap();
    let (mut out, mut buf) = (Vec::new(), [0u8; 4096]);
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                panic!(
                    "still open {:?} after it started; got {:?}",
                    since.elapsed(),
                    String::from_utf8_lossy(&out)
                )
            }
            // A reset is a close too.
            Err(_) => break,
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), since.elapsed())
}

/// One request on a fresh connection, and everything the server sent before it closed;
/// `None` when the connection was reset before anything came.
fn exchange(addr: SocketAddr, request: &[u8]) -> Option<String> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request).ok()?;
    let (out, _) = until_closed(&mut s, Instant::now(), Duration::from_secs(5));
    Some(out).filter(|o| !o.is_empty())
}

/// One reply read from a kept-alive connection: its head and its body.
fn read_reply(s: &mut TcpStream) -> (String, String) {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "closed inside a head");
        got.push(byte[0]);
    }
    let head = String::from_utf8(got).unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().unwrap())
        })
        .expect("a content-length");
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (head, String::from_utf8(body).unwrap())
}

/// Polls `f` until it holds or `within` passes.
fn wait_until(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

/// Sends `bytes` one per `interval` (the read timeout paces them, and each read looks
/// for the close) until the server closes `s`: when that was, and how many went out.
/// Fails if the server answers, or keeps `s` open past `deadline` and the slack.
fn trickle_until_closed(
    s: &mut TcpStream,
    bytes: &[u8],
    interval: Duration,
    deadline: Duration,
) -> (Duration, usize) {
    let started = Instant::now();
    s.set_read_timeout(Some(interval)).unwrap();
    for (sent, byte) in bytes.iter().enumerate() {
        assert!(
            started.elapsed() < deadline + SLACK,
            "still open after {sent} bytes"
        );
        if s.write_all(&[*byte]).is_err() {
            return (started.elapsed(), sent);
        }
        let mut buf = [0u8; 256];
        match s.read(&mut buf) {
            Ok(0) => return (started.elapsed(), sent + 1),
            Ok(n) => panic!("answered {:?}", String::from_utf8_lossy(&buf[..n])),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return (started.elapsed(), sent + 1),
        }
    }
    panic!(
        "all {} bytes went out and the server still reads",
        bytes.len()
    )
}

/// Threads of this process named `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

#[test]
fn a_silent_client_is_closed_at_the_head_deadline() {
    let srv = start("hs-silent", limits());
    let mut s = TcpStream::connect(srv.addr()).unwrap();
    let (out, closed_at) = until_closed(&mut s, Instant::now(), HEAD + SLACK);
    assert_eq!(out, "", "a client that asked nothing is told nothing");
    assert!(
        closed_at >= HEAD * 3 / 4,
        "closed at {closed_at:?}, before its deadline"
    );
    assert!(closed_at < HEAD + SLACK, "closed at {closed_at:?}");
}

#[test]
fn a_trickling_client_is_closed_at_the_head_deadline() {
    let srv = start("hs-trickle", limits());
    let mut s = TcpStream::connect(srv.addr()).unwrap();
    let head = format!("GET / HTTP/1.1\r\nX-Slow: {}", "a".repeat(4096));
    let (closed_at, sent) = trickle_until_closed(&mut s, head.as_bytes(), HEAD / 8, HEAD);
    assert!(
        closed_at >= HEAD * 3 / 4,
        "closed at {closed_at:?}, before its deadline"
    );
    assert!(
        sent >= 4,
        "only {sent} bytes went out: no trickle was tested"
    );
}

#[test]
fn idle_connections_past_the_cap_do_not_lock_a_client_out() {
    let srv = start("hs-lockout", limits());
    let cap = limits().max_connections;
    let mut idle: Vec<TcpStream> = (0..2 * cap)
        .map(|_| TcpStream::connect(srv.addr()).unwrap())
        .collect();
    assert!(wait_until(SLACK, || srv.live_connections() == cap));
    let started = Instant::now();
    let mut refused = 0;
    loop {
        match exchange(srv.addr(), b"GET /ok HTTP/1.1\r\nConnection: close\r\n\r\n") {
            Some(r) if r.starts_with("HTTP/1.1 200") => break,
            Some(r) if r.starts_with("HTTP/1.1 503") => refused += 1,
            None => refused += 1,
            Some(r) => panic!("{r}"),
        }
        assert!(
            started.elapsed() < HEAD + SLACK,
            "not served after {:?} ({refused} refusals)",
            started.elapsed()
        );
        // The pace of a client's retries.
        std::thread::sleep(Duration::from_millis(20));
    }
    // The idle connections past the cap were answered 503 at once; those under it were
    // closed at their deadline, having been told nothing.
    let replies: Vec<String> = idle
        .iter_mut()
        .map(|s| until_closed(s, Instant::now(), HEAD + SLACK).0)
        .collect();
    let busy = replies
        .iter()
        .filter(|r| r.starts_with("HTTP/1.1 503"))
        .count();
    assert_eq!(busy, cap, "{replies:?}");
    assert_eq!(replies.iter().filter(|r| r.is_empty()).count(), cap);
    assert!(srv.peak_connections() <= cap);
}

#[test]
fn a_connection_past_the_cap_is_answered_503_at_once() {
    let srv = start(
        "hs-busy",
        Limits {
            max_connections: 1,
            ..limits()
        },
    );
    let _held = TcpStream::connect(srv.addr()).unwrap();
    assert!(wait_until(SLACK, || srv.live_connections() == 1));
    let mut s = TcpStream::connect(srv.addr()).unwrap();
    let (out, closed_at) = until_closed(&mut s, Instant::now(), SLACK);
    assert!(
        out.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{out}"
    );
    assert!(out.contains("Retry-After: 1\r\n"), "{out}");
    assert!(
        out.ends_with("all 1 connection slots are taken; retry later\n"),
        "{out}"
    );
    assert!(closed_at < HEAD, "answered at {closed_at:?}: not at once");
}

#[test]
fn the_connection_count_never_exceeds_the_cap() {
    let srv = start("hs-count", limits());
    let cap = limits().max_connections;
    let (seen, stop) = (AtomicUsize::new(0), AtomicBool::new(false));
    std::thread::scope(|scope| {
        scope.spawn(|| {
            // Bounded too, so that a failed assertion below cannot leave it spinning.
            let until = Instant::now() + 4 * SLACK;
            while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                seen.fetch_max(srv.live_connections(), Ordering::Relaxed);
                std::thread::yield_now();
            }
        });
        let clients: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    (0..6)
                        .map(|_| TcpStream::connect(srv.addr()).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let held: Vec<TcpStream> = clients
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect();
        assert!(wait_until(SLACK, || srv.live_connections() == cap));
        // The clients leave: every slot comes back.
        drop(held);
        assert!(
            wait_until(HEAD + SLACK, || srv.live_connections() == 0),
            "{} connections left",
            srv.live_connections()
        );
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(srv.peak_connections(), cap, "24 clients, a cap of {cap}");
    assert!(seen.into_inner() <= cap);
}

#[test]
fn a_head_over_the_cap_gets_431() {
    let srv = start("hs-head", limits());
    let mut head = b"GET / HTTP/1.1\r\nX-Big: ".to_vec();
    head.resize(MAX_HEAD_BYTES, b'a');
    let mut s = TcpStream::connect(srv.addr()).unwrap();
    s.write_all(&head).unwrap();
    let (out, _) = until_closed(&mut s, Instant::now(), HEAD + SLACK);
    assert!(out.starts_with("HTTP/1.1 431 "), "{out:?}");
    // Under the cap, the same head is served.
    head.truncate(MAX_HEAD_BYTES - 100);
    head.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
    let out = exchange(srv.addr(), &head).unwrap();
    assert!(out.starts_with("HTTP/1.1 200 "), "{out}");
}

#[test]
fn a_body_over_the_cap_gets_413() {
    let srv = start("hs-body", limits());
    // Announced over the cap: refused before a byte of it is sent.
    let mut s = TcpStream::connect(srv.addr()).unwrap();
    s.write_all(b"PUT /k HTTP/1.1\r\nContent-Length: 1025\r\n\r\n")
        .unwrap();
    let (out, _) = until_closed(&mut s, Instant::now(), HEAD + SLACK);
    assert!(out.starts_with("HTTP/1.1 413 "), "{out}");
    assert!(out.ends_with("body larger than 1024 bytes"), "{out}");
    // Chunked, so no length is announced: refused once the bytes pass the cap; the
    // client still sending is read and dropped, and reads its 413.
    let mut s = TcpStream::connect(srv.addr()).unwrap();
    s.write_all(b"PUT /k HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        .unwrap();
    let chunk = format!("64\r\n{}\r\n", "b".repeat(100));
    for _ in 0..20 {
        s.write_all(chunk.as_bytes()).unwrap();
    }
    let (head, why) = read_reply(&mut s);
    assert!(head.starts_with("HTTP/1.1 413 "), "{head}");
    assert_eq!(why, "body larger than 1024 bytes");
    // Sent after the 413: dropped, not answered with a reset.
    for i in 0..50 {
        s.write_all(chunk.as_bytes())
            .unwrap_or_else(|e| panic!("write {i} after the 413: {e}"));
    }
    let (rest, _) = until_closed(&mut s, Instant::now(), HEAD + SLACK);
    assert_eq!(rest, "", "one reply, then the close");
    // At the cap, served.
    let mut at_cap =
        b"PUT /k HTTP/1.1\r\nContent-Length: 1024\r\nConnection: close\r\n\r\n".to_vec();
    at_cap.resize(at_cap.len() + 1024, b'c');
    let out = exchange(srv.addr(), &at_cap).unwrap();
    assert!(out.ends_with("PUT /k? 1024"), "{out}");
}

#[test]
fn a_request_whose_body_trickles_is_closed_at_the_request_deadline() {
    let srv = start("hs-slowbody", limits());
    let mut s = TcpStream::connect(srv.addr()).unwrap();
    s.write_all(b"PUT /k HTTP/1.1\r\nContent-Length: 1000\r\n\r\n")
        .unwrap();
    let (closed_at, _) = trickle_until_closed(&mut s, &[b'x'; 1000], REQUEST / 10, REQUEST);
    assert!(
        closed_at >= REQUEST * 3 / 4,
        "closed at {closed_at:?}, before its deadline"
    );
}

#[test]
fn a_kept_alive_connection_serves_again_then_closes_when_idle() {
    let srv = start("hs-keepalive", limits());
    let mut s = TcpStream::connect(srv.addr()).unwrap();
    for i in 0..3 {
        let req = format!("GET /n?i={i} HTTP/1.1\r\nHost: x\r\n\r\n");
        s.write_all(req.as_bytes()).unwrap();
        let (head, body) = read_reply(&mut s);
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
        assert!(
            head.contains("content-type: text/plain; charset=utf-8\r\n"),
            "{head}"
        );
        assert_eq!(body, format!("GET /n?i={i} 0"));
    }
    let (out, idle_for) = until_closed(&mut s, Instant::now(), HEAD + SLACK);
    assert_eq!(out, "");
    assert!(idle_for >= HEAD * 3 / 4, "closed after {idle_for:?} idle");
}

#[test]
fn without_keep_alive_every_reply_closes_its_connection() {
    let srv = start(
        "hs-close",
        Limits {
            keep_alive: false,
            ..limits()
        },
    );
    let mut s = TcpStream::connect(srv.addr()).unwrap();
    s.write_all(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let (out, closed_at) = until_closed(&mut s, Instant::now(), HEAD + SLACK);
    assert!(out.starts_with("HTTP/1.1 200 "), "{out}");
    assert!(out.contains("connection: close\r\n"), "{out}");
    assert!(
        closed_at < HEAD,
        "closed after {closed_at:?}, at the idle deadline"
    );
}

#[test]
fn a_handler_that_panics_is_a_500_and_the_server_goes_on() {
    let srv = start("hs-panic", limits());
    let out = exchange(
        srv.addr(),
        b"GET /panic HTTP/1.1\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    assert!(out.starts_with("HTTP/1.1 500 "), "{out}");
    let out = exchange(srv.addr(), b"GET /ok HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap();
    assert!(out.starts_with("HTTP/1.1 200 "), "{out}");
}

#[test]
fn dropping_the_server_joins_its_threads_and_frees_its_port() {
    let srv = start("hs-drop", limits());
    let addr = srv.addr();
    // A request starts a worker beside the serving thread.
    let out = exchange(addr, b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap();
    assert!(out.starts_with("HTTP/1.1 200 "), "{out}");
    let mut open = TcpStream::connect(addr).unwrap();
    assert!(wait_until(SLACK, || srv.live_connections() == 1));
    assert_eq!(
        threads_named("hs-drop"),
        2,
        "the serving thread and a worker"
    );

    let dropping = Instant::now();
    drop(srv);
    // A joined thread's task leaves /proc a moment after `pthread_join` returns: the
    // kernel wakes the joiner when the thread clears its tid, before it unhashes the task.
    assert!(
        wait_until(SLACK, || threads_named("hs-drop") == 0),
        "a thread outlived the server: {} left",
        threads_named("hs-drop")
    );
    // Its open connection was closed with it, not at its deadline.
    let (_, closed_at) = until_closed(&mut open, dropping, SLACK);
    assert!(closed_at < HEAD, "closed after {closed_at:?}");
    let refused = TcpStream::connect(addr).unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);
    TcpListener::bind(addr).expect("the port is free again");
}
