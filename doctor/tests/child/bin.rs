//! `doctor-test-peer`: the engine process that `doctor.rs`'s `--peer` tests probe. Prints
//! its session id, serves until its stdin closes. A binary, not a test of `doctor.rs`:
//! `cargo test` lists and runs tests only, and a child entry point among them would pass
//! having done nothing. Built for this crate's tests only (the `test-child` feature).

#![allow(
    clippy::unwrap_used,
    reason = "test support: a panic is the parent test's failure"
)]

use std::io::Write;

fn main() {
    let e = transfer_engine::TransferEngine::new(
        "127.0.0.1",
        transfer_engine::P2P_HANDSHAKE,
        transfer_engine::Config::default(),
    )
    .unwrap();
    let buf = transfer_engine::HostBuffer::new(1 << 20);
    e.register_memory(buf.addr(), 1 << 20, "cpu:0").unwrap();
    let mut out = std::io::stdout();
    writeln!(out, "SESSION {}", e.session_id()).unwrap();
    out.flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}
