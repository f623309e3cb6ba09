//! A peer that accepts connections but never answers: transfers must fail
//! with a timeout at upstream's deadline (MC_TRANSFER_TIMEOUT + 1 ns/byte),
//! not hang. (The 4 KiB write is a lone small request, which runs on the caller's
//! thread: the caller must leave the missing reply to the receiver and wait as for any
//! batch, or it would wait out the data path's own 30 s timeout.) The peer is a stand-in written here (a real engine never stalls
//! on purpose): a handshake server that hands out a descriptor, and a data
//! port that accepts and then reads nothing.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod raw_peer;

use std::io::ErrorKind;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use transfer_engine::error::Unreachable;
use transfer_engine::{Config, EngineError, OpCode, Request, TransferEngine, TransferError};

#[test]
fn a_stalled_peer_times_out_at_the_upstream_deadline() {
    let data = TcpListener::bind("127.0.0.1:0").unwrap();
    let data_port = data.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in data.incoming().flatten() {
            held.push(s); // keep open, never read
        }
    });
    let (session, _server) = raw_peer::serve_descriptor(data_port, 0x10000);

    let config = Config {
        transfer_timeout: Duration::from_secs(5),
        ..Config::default()
    };
    let engine = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", config).unwrap();
    let local = vec![7u8; 4096];
    let reqs = [Request {
        op: OpCode::Write,
        local: local.as_ptr() as u64,
        remote: 0x10000,
        len: 4096,
    }];
    let started = Instant::now();
    // SAFETY: every local buffer of the request is test-owned and outlives the call.
    let result = unsafe { engine.transfer_sync(&session, &reqs) };
    let took = started.elapsed();
    assert!(
        matches!(
            result,
            Err(EngineError::Transfer {
                source: TransferError::Timeout(_),
                ..
            })
        ),
        "{result:?}"
    );
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(9),
        "took {took:?}"
    );
}

/// A lone small request (run on the caller's thread) to a peer whose data port refuses
/// connections fails with the connect's reason, and so does the next one (from the link's
/// recent death, without connecting again).
#[test]
fn a_lone_small_request_to_a_refusing_data_port_fails_as_unreachable() {
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let data_port = closed.local_addr().unwrap().port();
    drop(closed);
    let (session, _server) = raw_peer::serve_descriptor(data_port, 0x10000);
    let engine = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", Config::default()).unwrap();
    let local = vec![7u8; 4096];
    let req = lone_write(&local);
    for round in 0..2 {
        // SAFETY: every local buffer of the request is test-owned and outlives the call.
        let result = unsafe { engine.transfer_sync(&session, &[req]) };
        match result {
            Err(EngineError::Transfer {
                source:
                    TransferError::PeerUnreachable {
                        cause: Unreachable::Connect(io),
                        ..
                    },
                ..
            }) => assert_eq!(
                io.kind(),
                ErrorKind::ConnectionRefused,
                "round {round}: {io}"
            ),
            other => panic!("round {round}: expected PeerUnreachable, got {other:?}"),
        }
    }
    let tcp = engine.metrics();
    let tcp = tcp.transports.iter().find(|t| t.protocol == "tcp").unwrap();
    assert_eq!(tcp.connections.connects, 0);
}

/// A data port that answers a request with eight bytes of garbage instead of a status
/// frame: the request fails as a protocol violation that names the case (a status frame
/// without the `MCTV` magic) and carries the bytes it saw, at once rather than at the
/// deadline.
#[test]
fn a_garbage_status_fails_as_a_violation_naming_the_bytes_seen() {
    use std::io::{Read, Write};
    use transfer_engine::error::Violation;
    use transfer_engine::wire::WireError;

    let data = TcpListener::bind("127.0.0.1:0").unwrap();
    let data_port = data.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in data.incoming().flatten() {
            let mut header = [0u8; transfer_engine::wire::tcp::HEADER_LEN];
            if s.read_exact(&mut header).is_ok() {
                let _ = s.write_all(&[0xAB; 8]);
            }
            // Kept open: the client must fail on the bytes, not on a closed socket.
            std::thread::spawn(move || {
                let mut sink = [0u8; 4096];
                while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
            });
        }
    });
    let (session, _server) = raw_peer::serve_descriptor(data_port, 0x10000);
    let engine = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", Config::default()).unwrap();
    let local = vec![7u8; 4096];
    let req = lone_write(&local);
    let t0 = Instant::now();
    // SAFETY: the local buffer of the request is test-owned and outlives the call.
    let result = unsafe { engine.transfer_sync(&session, &[req]) };
    match result {
        Err(EngineError::Transfer {
            source: TransferError::Protocol { violation, .. },
            ..
        }) => assert_eq!(
            violation,
            Violation::Status(WireError::BadStatusMagic(0xABAB_ABAB_ABAB_ABAB))
        ),
        other => panic!("expected a protocol violation, got {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
}

/// A 4 KiB write of `local` to the stand-in's buffer: a lone small request.
fn lone_write(local: &[u8]) -> Request {
    Request {
        op: OpCode::Write,
        local: local.as_ptr() as u64,
        remote: 0x10000,
        len: local.len() as u64,
    }
}
