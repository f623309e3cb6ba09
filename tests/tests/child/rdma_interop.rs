//! Roles of `rdma_interop_soft_nic.rs` (`e2e-test-child`), run inside `run-in-ns.sh`'s
//! namespace on the parent's fabric: our engine over both soft HCAs against upstream's.

#![allow(dead_code, reason = "its parent test includes it for a part")]

use std::time::Duration;

use e2e::{
    fill_pattern_at, first_mismatch, run_upstream_command, upstream_rdma_command, Buf,
    UpstreamTarget,
};
use transfer_engine::wire::descriptor::SegmentDesc;
use transfer_engine::{Config, OpCode, Request, TransferEngine, TransportRequest};

/// The line `e2e-test-child` prints once a role has returned (the engine's
/// `tests/child/play.rs`).
pub const CHILD_DONE: &str = "e2e-test-child: done";

pub const HCAS: [&str; 2] = ["soft_0", "soft_1"];
/// Several 64 KiB slices on each HCA, and a tail that is not a whole slice.
pub const SIZE: u64 = (6 << 20) + 4096 + 24;

/// Our engine on RDMA over both soft HCAs (fails rather than falling back: MC_FORCE_HCA).
pub fn our_engine() -> TransferEngine {
    e2e::init_logging();
    let request = TransportRequest::new("rdma", &HCAS.join(","));
    let e = TransferEngine::with_transports(
        "127.0.0.1",
        "P2PHANDSHAKE",
        Config::from_env().unwrap(),
        &request,
    )
    .unwrap();
    let ours = SegmentDesc::decode(&e.local_descriptor().encode()).unwrap();
    assert_eq!(ours.protocol, ["rdma"], "{ours:?}");
    let names: Vec<&str> = ours.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, HCAS, "both soft HCAs in our descriptor");
    e
}

/// Requests covering `[0, SIZE)` of both buffers in uneven pieces (one spans many slices,
/// one is 3 bytes, one starts at an odd offset).
pub fn pieces(op: OpCode, local: u64, remote: u64) -> Vec<Request> {
    let cuts = [0, 4 << 20, (4 << 20) + 3, SIZE];
    cuts.windows(2)
        .map(|w| Request::new(op, local + w[0], remote + w[0], w[1] - w[0]))
        .collect()
}

/// `upstream-initiator`: upstream's initiator reads our target's pattern and writes its
/// own, which we check.
pub fn upstream_initiator_on_our_target() {
    let e = our_engine();
    let buf = Buf::new(SIZE as usize);
    fill_pattern_at(&buf, 0, SIZE, 3, 0);
    e.register_memory(buf.addr(), SIZE, "cpu:0").unwrap();
    let args: Vec<String> = [
        "initiator",
        "--peer",
        e.session_id(),
        "--peer-buffer",
        &buf.addr().to_string(),
        "--size",
        &SIZE.to_string(),
        "--seed",
        "8",
        "--expect-peer-seed",
        "3",
    ]
    .map(String::from)
    .to_vec();
    let run = run_upstream_command(
        upstream_rdma_command(&args, &HCAS.join(",")),
        Duration::from_secs(120),
    );
    let result = run.last_json();
    assert!(
        run.status.success() && result["ok"] == true,
        "upstream initiator failed ({}): {result}\n{}",
        run.status,
        run.stderr
    );
    // Upstream on RDMA for real: both HCAs found, only the RDMA transport installed.
    for line in ["Found 2 HCAs", "installTransport, type=rdma"] {
        assert!(
            run.stderr.contains(line),
            "missing {line:?}:\n{}",
            run.stderr
        );
    }
    assert!(
        !run.stderr.contains("installTransport, type=tcp"),
        "{}",
        run.stderr
    );
    // It read our pattern (--expect-peer-seed) and left its own, pattern(8), everywhere.
    assert_eq!(first_mismatch(&buf.to_vec(), 8, 0), None, "{result}");
    println!("upstream initiator on our target: {result}");
}

/// `our-initiator`: our initiator reads an upstream target's pattern and writes another,
/// which the upstream target checks.
pub fn our_initiator_on_upstream_target() {
    let mut target = UpstreamTarget::spawn_rdma(SIZE, 5, &HCAS.join(","));
    let e = our_engine();
    let local = Buf::new(SIZE as usize);
    e.register_memory(local.addr(), SIZE, "cpu:0").unwrap();

    let reads = pieces(OpCode::Read, local.addr(), target.buffer);
    // SAFETY: `local` outlives the synchronous call; nothing else touches it meanwhile.
    unsafe { e.transfer_sync(&target.session_id, &reads) }.unwrap();
    assert_eq!(
        first_mismatch(&local.to_vec(), 5, 0),
        None,
        "read bytes differ from the upstream target's pattern"
    );

    fill_pattern_at(&local, 0, SIZE, 12, 0);
    let writes = pieces(OpCode::Write, local.addr(), target.buffer);
    // SAFETY: as above.
    unsafe { e.transfer_sync(&target.session_id, &writes) }.unwrap();
    assert_eq!(target.check(0, SIZE, 12), "ok");
    drop(e);
    target.finish();
}
