//! Engines named by host name rather than IP (`local_hostname = "localhost"`, as upstream's
//! tools default to the machine's name): every batch finds the peer's data port through
//! the name, resolved once per `resolved_hosts::TTL` (its unit tests count the lookups).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]
use transfer_engine::{Config, OpCode, Request, TransferEngine};

#[test]
fn batches_to_a_peer_named_by_host_name_land_and_read_back() {
    let a = TransferEngine::new("localhost", "P2PHANDSHAKE", Config::default()).unwrap();
    let b = TransferEngine::new("localhost", "P2PHANDSHAKE", Config::default()).unwrap();
    assert!(
        b.session_id().starts_with("localhost:"),
        "{}",
        b.session_id()
    );
    let len = 64 << 10;
    let remote = vec![0u8; 16 * len];
    b.register_memory(remote.as_ptr() as u64, remote.len() as u64, "cpu:0")
        .unwrap();
    let local: Vec<u8> = (0..16 * len).map(|i| (i * 13 % 251) as u8).collect();
    let back = vec![0u8; local.len()];
    a.register_memory(back.as_ptr() as u64, back.len() as u64, "cpu:0")
        .unwrap();
    // Many batches in a row, each looking the peer up again: all on the one name.
    for i in 0..16 {
        let off = (i * len) as u64;
        let w = Request {
            op: OpCode::Write,
            local: local.as_ptr() as u64 + off,
            remote: remote.as_ptr() as u64 + off,
            len: len as u64,
        };
        // SAFETY: both vectors outlive the synchronous call.
        unsafe { a.transfer_sync(b.session_id(), &[w]) }.unwrap();
    }
    assert!(remote == local);
    let r = Request {
        op: OpCode::Read,
        local: back.as_ptr() as u64,
        remote: remote.as_ptr() as u64,
        len: back.len() as u64,
    };
    // SAFETY: as above.
    unsafe { a.transfer_sync(b.session_id(), &[r]) }.unwrap();
    assert!(back == local);
}
