//! Session ids over IPv6 loopback: `[::1]:port`, bracketed as SGLang builds them.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]
use transfer_engine::{Config, OpCode, Request, TransferEngine};

#[test]
fn engines_talk_over_ipv6_loopback() {
    let config = Config {
        use_ipv6: true,
        ..Config::default()
    };
    let a = TransferEngine::new("::1", "P2PHANDSHAKE", config.clone()).unwrap();
    let b = TransferEngine::new("[::1]:9999", "P2PHANDSHAKE", config).unwrap();
    assert!(b.session_id().starts_with("[::1]:"), "{}", b.session_id());
    assert_ne!(
        b.session_id(),
        "[::1]:9999",
        "the port of local_hostname is ignored in P2P mode"
    );
    let remote = vec![0u8; 1 << 20];
    b.register_memory(remote.as_ptr() as u64, remote.len() as u64, "cpu:0")
        .unwrap();
    let local: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
    let w = Request {
        op: OpCode::Write,
        local: local.as_ptr() as u64,
        remote: remote.as_ptr() as u64,
        len: local.len() as u64,
    };
    // SAFETY: both vectors outlive the synchronous call.
    unsafe { a.transfer_sync(b.session_id(), &[w]) }.unwrap();
    assert!(remote == local);
    a.probe(b.session_id()).unwrap();
}
