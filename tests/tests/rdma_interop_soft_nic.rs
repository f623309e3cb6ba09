//! RDMA interop with upstream's published wheel, both ways, bytes verified, over the soft
//! NIC (engine/tests/soft_nic/: a SOFTWARE stand-in for libibverbs.so.1, not RDMA
//! hardware) with two HCAs:
//! - upstream's engine as initiator (`upstream_peer.py initiator`, protocol `rdma`) reads
//!   our target's pattern, writes its own (batched, reversed blocks, unaligned, whole
//!   range), and we check our buffer holds it;
//! - our engine as initiator reads an upstream target's pattern and writes another one
//!   back, which the upstream target checks.
//!
//! Upstream's topology discovery needs `/dev/infiniband/uverbsN` and
//! `/sys/class/infiniband`, so each case runs in a child process of this binary inside
//! `run-in-ns.sh`'s private mount namespace (`unshare -rm`), and starts the upstream
//! process from there. Upstream loads the soft NIC through `LD_LIBRARY_PATH`, ours through
//! `MC_IBVERBS_PATH`; with protocol `rdma` upstream installs no TCP transport, and ours runs
//! with `MC_FORCE_HCA=1`, so no byte can take TCP.
//!
//! Skipped, with the reason printed, when the upstream venv (`scripts/setup-upstream.sh`
//! or `UPSTREAM_PYTHON`) or unprivileged user namespaces are unavailable.
//!
//!   UPSTREAM_PYTHON=... cargo test -p e2e --test rdma_interop_soft_nic

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

#[path = "../../engine/tests/soft_nic/mod.rs"]
mod soft_nic;

use std::process::Command;
use std::time::Duration;

use e2e::{
    fill_pattern_at, find_upstream_python, first_mismatch, run_upstream_command,
    upstream_rdma_command, Buf, UpstreamTarget,
};
use soft_nic::SoftFabric;
use transfer_engine::wire::descriptor::SegmentDesc;
use transfer_engine::{Config, OpCode, Request, TransferEngine, TransportRequest};

const HCAS: [&str; 2] = ["soft_0", "soft_1"];
/// Several 64 KiB slices on each HCA, and a tail that is not a whole slice.
const SIZE: u64 = (6 << 20) + 4096 + 24;

fn is_child() -> bool {
    std::env::var_os("TE_INTEROP_CHILD").is_some()
}

/// Why this machine cannot run the interop cases, if it cannot.
fn skip_reason() -> Option<String> {
    if let Err(e) = find_upstream_python() {
        return Some(e);
    }
    match Command::new("unshare").args(["-rm", "true"]).output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "unprivileged user namespaces are unavailable (`unshare -rm true`: {}); \
             upstream needs run-in-ns.sh's private /dev/infiniband and /sys/class",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("`unshare` (util-linux) cannot run: {e}")),
    }
}

/// Runs `test` of this binary inside run-in-ns.sh's namespace on a fresh two-HCA fabric
/// and asserts it passed (or says why it is skipped).
fn run_in_namespace(test: &str) {
    if let Some(why) = skip_reason() {
        eprintln!("SKIPPED {test}: {why}");
        return;
    }
    let fabric = SoftFabric::new(&HCAS);
    let mut cmd = Command::new("timeout");
    cmd.args(["180", "unshare", "-rm"])
        .arg(soft_nic::source_dir().join("upstream/run-in-ns.sh"))
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env("TE_INTEROP_CHILD", "1")
        .env("MC_FORCE_HCA", "1")
        // For the upstream process; ours dlopens MC_IBVERBS_PATH and links no verbs.
        .env("LD_LIBRARY_PATH", soft_nic::library().parent().unwrap())
        .env_remove("MC_FORCE_TCP")
        .env_remove("MC_TE_FILTERS")
        .env_remove("MOONCAKE_RDMA_DEVICES");
    fabric.apply_to(&mut cmd);
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{test} failed ({}):\n{text}",
        out.status
    );
    assert!(text.contains("1 passed"), "{test} did not run:\n{text}");
}

/// Our engine on RDMA over both soft HCAs (fails rather than falling back: MC_FORCE_HCA).
fn our_engine() -> TransferEngine {
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
fn pieces(op: OpCode, local: u64, remote: u64) -> Vec<Request> {
    let cuts = [0, 4 << 20, (4 << 20) + 3, SIZE];
    cuts.windows(2)
        .map(|w| Request::new(op, local + w[0], remote + w[0], w[1] - w[0]))
        .collect()
}

#[test]
fn child_upstream_initiator_on_our_target() {
    if !is_child() {
        return;
    }
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

#[test]
fn upstream_initiator_reads_and_writes_our_rdma_target() {
    run_in_namespace("child_upstream_initiator_on_our_target");
}

#[test]
fn child_our_initiator_on_upstream_target() {
    if !is_child() {
        return;
    }
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

#[test]
fn our_initiator_reads_and_writes_an_upstream_rdma_target() {
    run_in_namespace("child_our_initiator_on_upstream_target");
}
