//! Data connections between two engines of one host take `MC_TCP_SAME_HOST_CC` (reno by
//! default below 8 CPUs, `config::same_host_cc_for_cpus`), on both ends, and keep the
//! system's congestion control when told `system` or when the kernel refuses the name.
//!
//! Both engines live in this process, so their sockets are among its descriptors: each
//! one joined to the target's data port is asked for its congestion control. The reno
//! case can only fail where the system's own default differs from reno (bbr on this
//! project's VMs, cubic on most distributions); it says so when it cannot.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod common;

use std::mem::ManuallyDrop;
use std::net::{TcpListener, TcpStream};
use std::os::fd::FromRawFd;

use common::pattern;
use socket2::SockRef;
use transfer_engine::{Config, HostBuffer, OpCode, Request, TransferEngine};

const LEN: usize = 4 << 20;

/// The congestion control of `stream`, as the kernel names it.
fn congestion_control(stream: &TcpStream) -> std::io::Result<String> {
    let name = SockRef::from(stream).tcp_congestion()?;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Ok(String::from_utf8_lossy(&name[..end]).into_owned())
}

/// The congestion control a new loopback connection gets from the system.
fn system_default() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    congestion_control(&c).unwrap()
}

/// The congestion control of every socket of this process joined to `port` on either
/// end: the initiator's connections and the ones the target accepted.
fn data_connections(port: u16) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: borrowed only for the queries below, never closed (ManuallyDrop); a
        // descriptor that is no TCP socket fails them and is skipped.
        let s = ManuallyDrop::new(unsafe { TcpStream::from_raw_fd(fd) });
        let (Ok(local), Ok(peer)) = (s.local_addr(), s.peer_addr()) else {
            continue;
        };
        if local.port() == port || peer.port() == port {
            if let Ok(cc) = congestion_control(&s) {
                found.push(cc);
            }
        }
    }
    found
}

/// A target and an initiator with `cc`, a batch of writes and reads between them (bytes
/// checked); the congestion control of their data connections.
fn connections_after_transfers(cc: Option<&str>) -> Vec<String> {
    let config = || Config {
        tcp_lanes_per_peer: 2,
        tcp_same_host_cc: cc.map(str::to_owned),
        ..Config::default()
    };
    let target = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", config()).unwrap();
    let initiator = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", config()).unwrap();
    let there = HostBuffer::new(LEN);
    target
        .register_memory(there.addr(), LEN as u64, "cpu:0")
        .unwrap();
    let here = HostBuffer::new(LEN);
    let back = HostBuffer::new(LEN);
    let data = pattern(LEN, 7);
    here.write_at(0, &data).unwrap();
    let block = (LEN / 8) as u64;
    let batch = |op, local: u64| -> Vec<Request> {
        (0..8)
            .map(|i| Request::new(op, local + i * block, there.addr() + i * block, block))
            .collect()
    };
    let session = target.session_id().to_string();
    // SAFETY: the buffers outlive the synchronous calls.
    unsafe { initiator.transfer_sync(&session, &batch(OpCode::Write, here.addr())) }.unwrap();
    // SAFETY: as above.
    unsafe { initiator.transfer_sync(&session, &batch(OpCode::Read, back.addr())) }.unwrap();
    assert!(
        back.read_at(0, LEN).unwrap() == data,
        "bytes read back differ"
    );
    let found = data_connections(target.data_port());
    drop(initiator);
    drop(target);
    found
}

#[test]
fn same_host_data_connections_take_reno_on_both_ends_when_told() {
    let found = connections_after_transfers(Some("reno"));
    // The lanes' connections, and the target's ends of them.
    assert!(found.len() >= 4, "data connections found: {found:?}");
    assert!(
        found.iter().all(|cc| cc == "reno"),
        "congestion controls of the data connections: {found:?}"
    );
    if system_default() == "reno" {
        eprintln!("the system's default is reno too: this run could not tell them apart");
    }
}

#[test]
fn system_leaves_the_systems_congestion_control() {
    let found = connections_after_transfers(None);
    let system = system_default();
    assert!(found.len() >= 4, "data connections found: {found:?}");
    assert!(
        found.iter().all(|cc| *cc == system),
        "the system's is {system}; the data connections had {found:?}"
    );
}

#[test]
fn a_name_the_kernel_refuses_keeps_the_systems_and_transfers_still_work() {
    let found = connections_after_transfers(Some("nosuchcc"));
    let system = system_default();
    assert!(found.len() >= 4, "data connections found: {found:?}");
    assert!(
        found.iter().all(|cc| *cc == system),
        "the system's is {system}; the data connections had {found:?}"
    );
}
