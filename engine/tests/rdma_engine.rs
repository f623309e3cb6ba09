//! Two engines in two processes, started as `initialize(..., "rdma", ...)` starts them,
//! moving verified bytes over the RDMA transport. The verbs library is the soft NIC (a
//! SOFTWARE stand-in for libibverbs.so.1, `tests/soft_nic/`): discovery reads its
//! synthetic sysfs tree, the engine loads it through `MC_IBVERBS_PATH`, and the bytes
//! move through its `process_vm_writev` / `process_vm_readv` data path.
//!
//! Every engine here runs in a child process (this test binary again) because the verbs
//! library and the `MC_*` configuration are read once per process.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod common;
mod soft_nic;

use common::{engine, fnv, pattern, Buf, Peer};
use soft_nic::SoftFabric;
use transfer_engine::{OpCode, Request, TransferError};

#[test]
fn peer_process() {
    common::peer_main();
}

/// Runs `test` of this binary in a child process with `fabric`'s environment, protocol
/// `rdma` and `env`; returns its combined output, asserting it passed.
fn run_child(test: &str, fabric: &SoftFabric, env: &[(&str, &str)]) -> String {
    let mut cmd = soft_nic::child_command(test, fabric);
    cmd.env("MC_FORCE_HCA", "1").envs(env.iter().copied());
    soft_nic::run_passing(cmd, test)
}

fn is_child() -> bool {
    std::env::var_os("TE_RDMA_CHILD").is_some()
}

#[test]
fn child_moves_bytes_both_ways() {
    if !is_child() {
        return;
    }
    let len = 6 << 20;
    let mut peer = Peer::spawn(len, 11);
    let e = engine();
    // Peers read one protocol: ours says `rdma` (and keeps its TCP port for our peers).
    let ours =
        transfer_engine::wire::descriptor::SegmentDesc::decode(&e.local_descriptor().encode())
            .unwrap();
    assert_eq!(ours.protocol, ["rdma"], "{ours:?}");
    let hcas: Vec<String> = std::env::var("SOFTNIC_HCAS")
        .unwrap()
        .split(',')
        .map(String::from)
        .collect();
    let names: Vec<&str> = ours.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, hcas, "every soft HCA is used");

    // RDMA moves registered memory only (as upstream): the local side registers too.
    let local = Buf::new(len as usize);
    e.register_memory(local.addr(), len, "cpu:0").unwrap();
    // Read the peer's pattern: one large request (sliced and striped) and odd sizes.
    let reqs = [
        Request::new(OpCode::Read, local.addr(), peer.addr, 4 << 20),
        Request::new(
            OpCode::Read,
            local.addr() + (4 << 20),
            peer.addr + (4 << 20),
            3,
        ),
        Request::new(
            OpCode::Read,
            local.addr() + (4 << 20) + 3,
            peer.addr + (4 << 20) + 3,
            (2 << 20) - 3,
        ),
    ];
    // SAFETY: `local` outlives the synchronous call; nothing else touches it meanwhile.
    unsafe { e.transfer_sync(&peer.session, &reqs) }.unwrap();
    assert!(
        local.to_vec() == pattern(len as usize, 11),
        "read bytes differ"
    );

    let data = pattern(len as usize, 42);
    local.write_at(0, &data).unwrap();
    let write = [Request::new(OpCode::Write, local.addr(), peer.addr, len)];
    // SAFETY: as above.
    unsafe { e.transfer_sync(&peer.session, &write) }.unwrap();
    assert_eq!(peer.hash(peer.addr, len), fnv(&data));
}

#[test]
fn engines_move_verified_bytes_over_1_2_and_4_soft_hcas() {
    for n in [1, 2, 4] {
        let names: Vec<String> = (0..n).map(|i| format!("soft_{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let fabric = SoftFabric::new(&refs);
        run_child("child_moves_bytes_both_ways", &fabric, &[]);
    }
}

#[test]
fn child_rdma_failure_is_the_rdma_path() {
    if !is_child() {
        return;
    }
    let len = 1 << 20;
    let peer = Peer::spawn(len, 5);
    let e = engine();
    let local = Buf::new(len as usize);
    e.register_memory(local.addr(), len, "cpu:0").unwrap();
    let reqs = [Request::new(OpCode::Write, local.addr(), peer.addr, len)];
    // SAFETY: `local` outlives the synchronous call; nothing else touches it meanwhile.
    let err = unsafe { e.transfer_sync(&peer.session, &reqs) }.unwrap_err();
    let text = err.to_string();
    // The soft NIC fails every WR posted on its only HCA with a remote access error:
    // had the bytes gone over TCP, the write would have succeeded.
    assert!(
        matches!(
            err,
            transfer_engine::EngineError::Transfer {
                source: TransferError::AddressRejected { .. },
                ..
            }
        ),
        "{text}"
    );
}

#[test]
fn an_injected_remote_access_error_fails_the_request_so_the_bytes_went_over_rdma() {
    let fabric = SoftFabric::new(&["soft_0"]);
    run_child(
        "child_rdma_failure_is_the_rdma_path",
        &fabric,
        &[("SOFTNIC_FAIL", "rem_access@hca:soft_0")],
    );
}

#[test]
fn child_force_hca_without_rdma_fails_with_the_reason() {
    if !is_child() {
        return;
    }
    let config = transfer_engine::Config::from_env().unwrap();
    let request = transfer_engine::TransportRequest::new("rdma", "");
    let err = transfer_engine::TransferEngine::with_transports(
        "127.0.0.1",
        "P2PHANDSHAKE",
        config,
        &request,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("MC_FORCE_HCA"), "{err}");
    assert!(
        err.contains("soft_9"),
        "the filter's missing HCA is named: {err}"
    );
}

#[test]
fn force_hca_with_a_filter_naming_a_missing_hca_fails_initialize() {
    let fabric = SoftFabric::new(&["soft_0"]);
    run_child(
        "child_force_hca_without_rdma_fails_with_the_reason",
        &fabric,
        &[("MC_TE_FILTERS", "soft_9")],
    );
}
