//! Hostile peers on raw sockets drive each bound of the engine past its
//! limit; then a legitimate engine still transfers, bytes verified.
//!
//! The attackers bind their sockets to other loopback addresses (127.0.0.2,
//! ...) so per-address caps bite on them while the legitimate engine
//! connects from 127.0.0.1. Waits are for events on the sockets (EOF from
//! the server), never sleeps; time bounds are generous upper bounds.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod common;
mod raw_peer;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{engine, pattern, Buf, Peer};
use raw_peer::{connect_from, dribble, is_closed, wait_closed};
use transfer_engine::metadata::handshake;
use transfer_engine::wire::handshake::MessageType;
use transfer_engine::wire::session::HostPort;
use transfer_engine::{Config, Notify, OpCode, Request, TransferEngine};

fn session_addr(session: &str) -> SocketAddr {
    session.parse().unwrap()
}

/// A target engine with `len` bytes of `pattern(len, seed)` registered.
fn target(config: Config, len: usize, seed: u64) -> (TransferEngine, Buf) {
    let e = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", config).unwrap();
    let buf = Buf::new(len);
    buf.write_at(0, &pattern(len, seed)).unwrap();
    e.register_memory(buf.addr(), len as u64, "cpu:0").unwrap();
    (e, buf)
}

/// A fresh engine on 127.0.0.1 reads `len` bytes at `remote` of `session`
/// and finds `expected`.
fn legit_read_verifies(session: &str, remote: u64, expected: &[u8]) {
    let e = engine();
    let local = Buf::new(expected.len());
    let r = Request::new(OpCode::Read, local.addr(), remote, expected.len() as u64);
    // SAFETY: every local buffer of the request is test-owned and outlives the call.
    unsafe { e.transfer_sync(session, &[r]) }.unwrap();
    assert!(
        local.to_vec() == expected,
        "legitimate read got wrong bytes"
    );
}

#[test]
fn handshake_slots_taken_by_one_address_do_not_lock_out_another() {
    // A peer process with the default bounds; 200 connections from one
    // address, each sending one byte of a frame and then nothing.
    let len = 1 << 20;
    let peer = Peer::spawn(len, 11);
    let rpc = session_addr(&peer.session);
    let mut attackers: Vec<TcpStream> = (0..200)
        .map(|_| {
            let mut s = connect_from("127.0.0.2", rpc);
            s.write_all(&[1]).unwrap();
            s
        })
        .collect();
    // The server accepts in order: once the last is closed, it has decided
    // on every one of them.
    wait_closed(attackers.last_mut().unwrap(), Duration::from_secs(60));
    let open = attackers.iter().filter(|s| !is_closed(s)).count();
    let per_ip = Config::default().handshake_max_connections_per_ip;
    assert!(
        open <= per_ip,
        "{open} connections from one address held open"
    );
    // A legitimate engine on another address still handshakes and transfers.
    legit_read_verifies(&peer.session, peer.addr, &pattern(len as usize, 11));
}

#[test]
fn a_dribbling_handshake_is_closed_at_the_whole_request_deadline() {
    let len = 64 << 10;
    let deadline = Duration::from_secs(1);
    let (t, _buf) = target(
        Config {
            handshake_server_timeout: deadline,
            ..Config::default()
        },
        len,
        3,
    );
    let rpc = session_addr(t.session_id());
    let started = Instant::now();
    let s = connect_from("127.0.0.2", rpc);
    // The attacker: a length prefix announcing 1000 bytes, then one byte
    // every 100 ms (each read returns well within any per-read timeout).
    let stop = Arc::new(AtomicBool::new(false));
    let dribbler = dribble(s.try_clone().unwrap(), 1000u64.to_le_bytes().to_vec(), stop);
    let mut reader = s;
    wait_closed(&mut reader, Duration::from_secs(30));
    let took = started.elapsed();
    assert!(
        took >= deadline,
        "closed after {took:?}, before the deadline"
    );
    drop(reader);
    dribbler.join().unwrap();
    legit_read_verifies(t.session_id(), _buf.addr(), &pattern(len, 3));
}

#[test]
fn the_handshake_client_gives_up_at_its_deadline() {
    // One server accepts and never answers; another answers a byte at a time.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let dribbling = TcpListener::bind("127.0.0.1:0").unwrap();
    let dribbling_addr = dribbling.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in silent.incoming().flatten() {
            held.push(s); // keep open, never answer
        }
    });
    std::thread::spawn(move || {
        if let Some(s) = dribbling.incoming().flatten().next() {
            let stop = Arc::new(AtomicBool::new(false));
            let _ = dribble(s, 1000u64.to_le_bytes().to_vec(), stop).join();
        }
    });
    let limit = Duration::from_secs(2);
    let cfg = Config {
        handshake_timeout: limit,
        ..Config::default()
    };
    for addr in [silent_addr, dribbling_addr] {
        let peer = HostPort {
            host: "127.0.0.1".into(),
            port: addr.port(),
        };
        let started = Instant::now();
        let err = handshake::request(&peer, MessageType::Probe, "{}", &cfg).unwrap_err();
        let took = started.elapsed();
        assert!(err.to_string().contains("MC_HANDSHAKE_TIMEOUT"), "{err}");
        assert!(
            took >= limit && took < Duration::from_secs(30),
            "took {took:?}"
        );
    }
    // The same bound through the engine's API, and the engine still works.
    let e = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", cfg).unwrap();
    let err = e
        .probe(&format!("127.0.0.1:{}", silent_addr.port()))
        .unwrap_err();
    assert!(err.to_string().contains("deadline"), "{err}");
    let len = 64 << 10;
    let (t, buf) = target(Config::default(), len, 4);
    let local = Buf::new(len);
    let r = Request::new(OpCode::Read, local.addr(), buf.addr(), len as u64);
    // SAFETY: every local buffer of the request is test-owned and outlives the call.
    unsafe { e.transfer_sync(t.session_id(), &[r]) }.unwrap();
    assert!(local.to_vec() == pattern(len, 4));
}

#[test]
fn a_notify_flood_beyond_the_byte_bound_is_refused_and_counted() {
    let len = 64 << 10;
    let (t, buf) = target(
        Config {
            notify_queue_bytes: 4 << 20,
            ..Config::default()
        },
        len,
        5,
    );
    let sender = engine();
    let big = |i: usize| Notify {
        name: format!("{i}"),
        notify_msg: "n".repeat(900 << 10),
    };
    let results: Vec<_> = (0..12)
        .map(|i| sender.send_notify(t.session_id(), &big(i)))
        .collect();
    let accepted = results.iter().filter(|r| r.is_ok()).count();
    // 4 x 900 KiB fit in 4 MiB, a fifth does not.
    assert_eq!(accepted, 4, "{results:?}");
    for r in &results[4..] {
        let err = r.as_ref().unwrap_err().to_string();
        assert!(err.contains("MC_NOTIFY_QUEUE_BYTES"), "{err}");
    }
    assert_eq!(t.dropped_notifies(), 8);
    // The excess was not kept; taking the queue frees the budget.
    let got = t.take_notifies();
    assert_eq!(got.len(), 4);
    assert!(got.iter().enumerate().all(|(i, n)| *n == big(i)));
    sender.send_notify(t.session_id(), &big(99)).unwrap();
    assert_eq!(t.take_notifies(), vec![big(99)]);
    legit_read_verifies(t.session_id(), buf.addr(), &pattern(len, 5));
}

#[test]
fn an_idle_data_connection_is_closed_at_the_idle_timeout() {
    let len = 64 << 10;
    let idle = Duration::from_secs(1);
    let (t, buf) = target(
        Config {
            tcp_server_idle_timeout: idle,
            ..Config::default()
        },
        len,
        6,
    );
    let data = SocketAddr::from(([127, 0, 0, 1], t.data_port()));
    let started = Instant::now();
    let mut s = connect_from("127.0.0.2", data);
    wait_closed(&mut s, Duration::from_secs(30));
    assert!(
        started.elapsed() >= idle,
        "closed after {:?}",
        started.elapsed()
    );
    // Our lanes idle too: after the server closed them, the next transfer
    // on the same engine reconnects and succeeds.
    let e = engine();
    let local = Buf::new(len);
    let r = Request::new(OpCode::Read, local.addr(), buf.addr(), len as u64);
    // SAFETY: every local buffer of the request is test-owned and outlives the call.
    unsafe { e.transfer_sync(t.session_id(), &[r]) }.unwrap();
    let mut probe = connect_from("127.0.0.2", data);
    wait_closed(&mut probe, Duration::from_secs(30));
    // SAFETY: every local buffer of the request is test-owned and outlives the call.
    unsafe { e.transfer_sync(t.session_id(), &[r]) }.unwrap();
    assert!(local.to_vec() == pattern(len, 6));
}

#[test]
fn a_full_handshake_server_frees_its_slots_at_the_deadline_and_our_client_retries() {
    let len = 64 << 10;
    let (t, buf) = target(
        Config {
            handshake_max_connections: 4,
            handshake_max_connections_per_ip: 2,
            handshake_server_timeout: Duration::from_secs(2),
            ..Config::default()
        },
        len,
        7,
    );
    let rpc = session_addr(t.session_id());
    // Two addresses take every slot, each with connections that send one
    // byte of a frame and then nothing.
    let mut holders: Vec<TcpStream> = ["127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"]
        .iter()
        .map(|src| {
            let mut s = connect_from(src, rpc);
            s.write_all(&[1]).unwrap();
            s
        })
        .collect();
    // A third address finds none free and is closed at once.
    let mut excess = connect_from("127.0.0.4", rpc);
    wait_closed(&mut excess, Duration::from_secs(60));
    // A legitimate engine's metadata request is refused while the slots are
    // held, retried, and served once the deadline frees them.
    legit_read_verifies(t.session_id(), buf.addr(), &pattern(len, 7));
    for s in &mut holders {
        wait_closed(s, Duration::from_secs(60));
    }
}
