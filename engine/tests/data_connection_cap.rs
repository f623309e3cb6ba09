//! 1,000 idle connections to the data port from one address do not get
//! 1,000 threads; a legitimate engine on another address still transfers.
//!
//! Its own test binary: it counts the data server's connection threads of
//! this process, which other tests' engines would add to.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod common;
mod raw_peer;

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::{engine, pattern, Buf};
use raw_peer::{connect_from, is_closed, wait_closed};
use transfer_engine::{Config, OpCode, Request, TransferEngine};

/// Threads of this process named as the data server names its connection threads.
fn data_connection_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|name| name.trim() == "te-tcp-conn")
        })
        .count()
}

#[test]
fn a_thousand_idle_data_connections_do_not_get_a_thousand_threads() {
    let per_ip = 16;
    let total = 40;
    let len = 4 << 20;
    let t = TransferEngine::new(
        "127.0.0.1",
        "P2PHANDSHAKE",
        Config {
            tcp_server_max_connections: total,
            tcp_server_max_connections_per_ip: per_ip,
            ..Config::default()
        },
    )
    .unwrap();
    let buf = Buf::new(len);
    buf.write_at(0, &pattern(len, 8)).unwrap();
    t.register_memory(buf.addr(), len as u64, "cpu:0").unwrap();
    let data = SocketAddr::from(([127, 0, 0, 1], t.data_port()));

    // 1,000 idle connections from 127.0.0.2, and 20 from each of 127.0.0.3
    // and 127.0.0.4: the per-address cap bites on each, the total cap on the last.
    let mut idle: Vec<TcpStream> = (0..1000).map(|_| connect_from("127.0.0.2", data)).collect();
    for src in ["127.0.0.3", "127.0.0.4"] {
        idle.extend((0..20).map(|_| connect_from(src, data)));
    }
    // The server accepts in order: once the last is closed it has decided on all.
    wait_closed(idle.last_mut().unwrap(), Duration::from_secs(60));
    let open = idle.iter().filter(|s| !is_closed(s)).count();
    assert!(open <= total, "{open} idle connections held open");
    let from_first = idle[..1000].iter().filter(|s| !is_closed(s)).count();
    assert!(
        from_first <= per_ip,
        "{from_first} held open from one address"
    );
    let threads = data_connection_threads();
    assert!(threads <= total, "{threads} connection threads");

    // Close the connections of two addresses and wait (polling, with a
    // generous limit) until their threads ended, which frees their slots.
    idle.truncate(1000);
    let waited = std::time::Instant::now();
    while data_connection_threads() > per_ip {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "closed connections kept their threads"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // A legitimate engine on 127.0.0.1 transfers both ways, bytes verified.
    let e = engine();
    let local = Buf::new(len);
    let r = Request::new(OpCode::Read, local.addr(), buf.addr(), len as u64);
    // SAFETY: every local buffer of the request is test-owned and outlives the call.
    unsafe { e.transfer_sync(t.session_id(), &[r]) }.unwrap();
    assert!(local.to_vec() == pattern(len, 8));
    local.write_at(0, &pattern(len, 9)).unwrap();
    let w = Request::new(OpCode::Write, local.addr(), buf.addr(), len as u64);
    // SAFETY: every local buffer of the request is test-owned and outlives the call.
    unsafe { e.transfer_sync(t.session_id(), &[w]) }.unwrap();
    assert!(buf.to_vec() == pattern(len, 9));
}
