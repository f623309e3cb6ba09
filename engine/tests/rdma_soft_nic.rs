//! The RDMA transport over real verbs calls, served by the soft NIC (a SOFTWARE stand-in
//! for libibverbs.so.1, `engine/tests/soft_nic/`). The bytes move through the soft NIC's
//! `process_vm_writev` / `process_vm_readv` data path.
//!
//! Two set-ups: two transports in one child process (each with its own contexts on the
//! same soft HCAs) wired by an in-process connector that hands each endpoint request to
//! the other's `handle_connection`; and two processes, a target serving its descriptor
//! and endpoint requests on a real handshake listener, and an initiator started with
//! `RdmaTransport::start` (the engine's handshake client).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod soft_nic;

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use transfer_engine::memory::{MemoryRegistry, Region};
use transfer_engine::task::BatchState;
use transfer_engine::transport::rdma::backend::Nic;
use transfer_engine::transport::rdma::verbs_backend::{HcaSpec, VerbsNic};
use transfer_engine::transport::rdma::{Connector, RdmaParams, RdmaTransport, Topology};
use transfer_engine::transport::{Slice, Transport};
use transfer_engine::wire::descriptor::{BufferDesc, SegmentDesc};
use transfer_engine::wire::session::{HostPort, SegmentId};
use transfer_engine::{HostBuffer, OpCode, TransferError};

const CHILD: &str = "RDMA_SOFT_NIC_CHILD";
const TARGET: &str = "RDMA_SOFT_NIC_TARGET";

fn run_child(test: &str, hcas: &[&str], env: &[(&str, &str)]) -> String {
    let fabric = soft_nic::SoftFabric::new(hcas);
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1");
    fabric.apply_to(&mut cmd);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "child {test} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("CHILD OK"), "{stdout}");
    stdout
}

#[derive(Default)]
struct InProcess {
    peers: Mutex<HashMap<String, Weak<RdmaTransport>>>,
}

impl Connector for InProcess {
    fn exchange(&self, peer: &HostPort, json: &str) -> Result<String, String> {
        let t = self
            .peers
            .lock()
            .get(&peer.session_id())
            .and_then(Weak::upgrade);
        let t = t.ok_or_else(|| format!("no transport {}", peer.session_id()))?;
        t.handle_connection(json).ok_or_else(|| "no reply".into())
    }
}

struct Side {
    name: String,
    t: Arc<RdmaTransport>,
    memory: MemoryRegistry,
    buf: HostBuffer,
    _region: Arc<Region>,
}

const BUF: usize = 4 << 20;

fn side(net: &Arc<InProcess>, name: &str, hcas: &[String]) -> Side {
    let verbs = transfer_engine::verbs::Verbs::load().unwrap();
    let params = RdmaParams::default();
    let nics: Vec<Arc<dyn Nic>> = hcas
        .iter()
        .map(|h| {
            let spec = HcaSpec {
                name: h.clone(),
                port: 1,
                gid_index: gid_index(),
            };
            Arc::new(VerbsNic::open(&verbs, &spec, &params).unwrap()) as Arc<dyn Nic>
        })
        .collect();
    let topology: Topology = [("cpu:0".to_string(), [hcas.to_vec(), Vec::new()])].into();
    let t = Arc::new(RdmaTransport::with_nics(name, nics, topology, params, net.clone()).unwrap());
    net.peers.lock().insert(name.into(), Arc::downgrade(&t));
    let memory = MemoryRegistry::new();
    let buf = HostBuffer::new(BUF);
    let region = memory.register(buf.addr(), BUF as u64, "cpu:0").unwrap();
    t.on_register(&region).unwrap();
    Side {
        name: name.into(),
        t,
        memory,
        buf,
        _region: region,
    }
}

impl Side {
    fn desc(&self) -> SegmentDesc {
        let mut d = SegmentDesc {
            name: self.name.clone(),
            tcp_proto_version: 2,
            tcp_write_runs: false,
            buffers: vec![BufferDesc {
                name: self.name.clone(),
                addr: self.buf.addr(),
                length: BUF as u64,
                ..BufferDesc::default()
            }],
            ..SegmentDesc::default()
        };
        self.t.describe(&mut d);
        SegmentDesc::decode(&d.encode()).unwrap()
    }

    fn transfer(&self, peer: &Side, op: OpCode, off: u64, len: u64) -> Result<(), TransferError> {
        let id = SegmentId::parse(&peer.name, 12001).unwrap();
        let remote = peer.buf.addr() + off;
        self.post(&id, &peer.desc(), op, off, remote, len).wait()
    }

    /// Cuts one request into slices as the engine does, and posts them.
    fn post(
        &self,
        id: &SegmentId,
        desc: &SegmentDesc,
        op: OpCode,
        off: u64,
        remote: u64,
        len: u64,
    ) -> Arc<BatchState> {
        let stripe = self.t.slice_size();
        let batch = BatchState::new(&[len.div_ceil(stripe) as u32], Duration::from_secs(30));
        let region = self.memory.find(self.buf.addr() + off, len);
        let mut slices = Vec::new();
        let mut at = 0;
        while at < len {
            let n = stripe.min(len - at);
            slices.push(Slice {
                op,
                local: self.buf.addr() + off + at,
                remote: remote + at,
                len: n,
                local_device: None,
                local_region: region.clone(),
                batch: batch.clone(),
                task: 0,
                retries: 0,
            });
            at += n;
        }
        self.t.post(id, desc, slices).unwrap();
        batch
    }
}

/// GID index: the soft NIC's RoCE v2 entry (1), or `MC_TEST_RDMA_GID_INDEX` on a real HCA.
fn gid_index() -> u8 {
    std::env::var("MC_TEST_RDMA_GID_INDEX").map_or(1, |v| v.parse().unwrap())
}

/// The soft HCAs of the child's fabric.
fn soft_hcas() -> Vec<String> {
    let list = std::env::var("SOFTNIC_HCAS").unwrap();
    list.split(',').map(str::to_string).collect()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

/// Child: writes and reads verified bytes between two transports over `RDMA_HCAS` HCAs.
#[test]
fn child_moves_bytes() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    moves_bytes(&soft_hcas());
    println!("CHILD OK");
}

/// Two transports over `hcas` in this process: verified WRITE and READ.
fn moves_bytes(hcas: &[String]) {
    let net = Arc::new(InProcess::default());
    let a = side(&net, "127.0.0.1:2001", hcas);
    let b = side(&net, "127.0.0.1:2002", hcas);
    let len = 3 * 65536 + 1000;
    let data = pattern(len, 5);
    a.buf.write_at(0, &data).unwrap();
    a.transfer(&b, OpCode::Write, 0, len as u64).unwrap();
    assert_eq!(b.buf.read_at(0, len).unwrap(), data);
    let back = pattern(1 << 20, 77);
    b.buf.write_at(1 << 21, &back).unwrap();
    a.transfer(&b, OpCode::Read, 1 << 21, 1 << 20).unwrap();
    assert_eq!(a.buf.read_at(1 << 21, 1 << 20).unwrap(), back);
    // Nothing failed: endpoints set up (at least one), none rebuilt, nothing retried.
    let c = a.t.counters();
    assert!(c.connects >= 1, "{c:?}");
    assert_eq!((c.reconnects, c.retries), (0, 0), "{c:?}");
}

/// Needs real RDMA hardware (and the system's libibverbs, or `MC_IBVERBS_PATH`):
/// `MC_TEST_RDMA_HCA=mlx5_0[,mlx5_1] MC_TEST_RDMA_GID_INDEX=3 cargo test -p
/// transfer-engine --test rdma_soft_nic -- --ignored real_hca`. Two transports in this
/// process move verified bytes over the named HCAs (loopback through the port).
#[test]
#[ignore = "needs a real RDMA HCA: set MC_TEST_RDMA_HCA (and MC_TEST_RDMA_GID_INDEX)"]
fn real_hca_loopback_moves_bytes() {
    let list = std::env::var("MC_TEST_RDMA_HCA")
        .expect("set MC_TEST_RDMA_HCA to the HCA(s) to test, e.g. mlx5_0");
    let hcas: Vec<String> = list.split(',').map(str::to_string).collect();
    moves_bytes(&hcas);
}

/// Child: the expected failure named by `RDMA_EXPECT` happens, or the transfer succeeds
/// despite injected errors (`ok`).
#[test]
fn child_with_injected_errors() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let hcas = soft_hcas();
    let net = Arc::new(InProcess::default());
    let a = side(&net, "127.0.0.1:2001", &hcas[..1]);
    let b = side(&net, "127.0.0.1:2002", &hcas[1..]);
    let data = pattern(8 * 65536, 9);
    a.buf.write_at(0, &data).unwrap();
    let got = a.transfer(&b, OpCode::Write, 0, data.len() as u64);
    match std::env::var("RDMA_EXPECT").unwrap().as_str() {
        "ok" => {
            got.unwrap();
            assert_eq!(b.buf.read_at(0, data.len()).unwrap(), data);
            // The failed slice went out again, on queue pairs set up anew: the metrics
            // see a retry and a reconnect besides the first connect.
            let c = a.t.counters();
            assert!(c.retries >= 1, "{c:?}");
            assert!(c.reconnects >= 1, "{c:?}");
            assert!(c.connects > c.reconnects, "{c:?}");
        }
        "rejected" => {
            let err = got.unwrap_err();
            assert!(
                matches!(err, TransferError::AddressRejected { .. }),
                "{err}"
            );
        }
        other => panic!("unknown expectation {other}"),
    }
    println!("CHILD OK");
}

#[test]
fn moves_verified_bytes_over_1_2_and_4_soft_hcas() {
    for hcas in [
        &["soft_0"][..],
        &["soft_0", "soft_1"][..],
        &["soft_0", "soft_1", "soft_2", "soft_3"][..],
    ] {
        run_child("child_moves_bytes", hcas, &[]);
    }
}

#[test]
fn an_injected_retry_exceeded_is_retried_over_rebuilt_queue_pairs() {
    run_child(
        "child_with_injected_errors",
        &["soft_0", "soft_1"],
        &[("SOFTNIC_FAIL", "retry_exc@3"), ("RDMA_EXPECT", "ok")],
    );
}

#[test]
fn a_remote_access_error_on_every_path_fails_the_request() {
    run_child(
        "child_with_injected_errors",
        &["soft_0", "soft_1"],
        &[
            ("SOFTNIC_FAIL", "rem_access@hca:soft_0"),
            ("RDMA_EXPECT", "rejected"),
        ],
    );
}

/// Seed of the bytes the target starts with.
const TARGET_SEED: u8 = 42;

/// Target process: serves a 4 MiB buffer (filled with `pattern(.., TARGET_SEED)`) over
/// RDMA on every soft HCA, prints `READY <session>` and lives until killed.
#[test]
fn child_target() {
    if std::env::var_os(TARGET).is_none() {
        return;
    }
    use transfer_engine::metadata::handshake::HandshakeServer;
    use transfer_engine::wire::handshake::MessageType;

    let rpc = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    rpc.set_nonblocking(true).unwrap();
    let session = format!("127.0.0.1:{}", rpc.local_addr().unwrap().port());
    let hcas = soft_hcas();
    let t = Arc::new(start(&session, &hcas));
    let memory = MemoryRegistry::new();
    let buf = HostBuffer::new(BUF);
    buf.write_at(0, &pattern(BUF, TARGET_SEED)).unwrap();
    let region = memory.register(buf.addr(), BUF as u64, "cpu:0").unwrap();
    t.on_register(&region).unwrap();
    let me = Side {
        name: session.clone(),
        t: t.clone(),
        memory,
        buf,
        _region: region,
    };
    let desc = me.desc().encode();
    let _server = HandshakeServer::start(
        rpc,
        1 << 20,
        Arc::new(move |kind: MessageType, json: &str| match kind {
            MessageType::Metadata => Some(desc.clone()),
            MessageType::Connection => t.handle_connection(json),
            _ => None,
        }),
    )
    .unwrap();
    println!("READY {session}");
    // Lives until killed, or until the initiator goes away (its end of stdin closes).
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
}

fn start(session: &str, hcas: &[String]) -> RdmaTransport {
    let specs: Vec<HcaSpec> = hcas
        .iter()
        .map(|h| HcaSpec {
            name: h.clone(),
            port: 1,
            gid_index: gid_index(),
        })
        .collect();
    let topology: Topology = [("cpu:0".to_string(), [hcas.to_vec(), Vec::new()])].into();
    let config = transfer_engine::Config::default();
    RdmaTransport::start(session, &specs, topology, RdmaParams::default(), &config).unwrap()
}

/// A target process and what the initiator knows of it.
struct Target {
    child: std::process::Child,
    id: SegmentId,
    desc: SegmentDesc,
}

fn spawn_target() -> Target {
    use std::io::BufRead;
    use transfer_engine::wire::handshake::MessageType;

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_target", "--nocapture", "--test-threads=1"])
        .env(TARGET, "1")
        .env_remove(CHILD)
        .stdout(std::process::Stdio::piped())
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(out).lines();
    let session = loop {
        let line = lines.next().expect("target exited").unwrap();
        // The harness may print the test's name on the same line first.
        if let Some(at) = line.find("READY ") {
            break line[at + "READY ".len()..].trim().to_string();
        }
    };
    let id = SegmentId::parse(&session, 12001).unwrap();
    let config = transfer_engine::Config::default();
    let json = transfer_engine::metadata::handshake::request(
        id.rpc(),
        MessageType::Metadata,
        "{}",
        &config,
    )
    .unwrap();
    let desc = SegmentDesc::decode(&json).unwrap();
    Target { child, id, desc }
}

/// Posts one request of `len` bytes at `off` (both sides) to the target.
fn post_to(
    me: &Side,
    target: &Target,
    op: OpCode,
    off: u64,
    remote_off: u64,
    len: u64,
) -> Arc<BatchState> {
    let remote = target.desc.buffers[0].addr + remote_off;
    me.post(&target.id, &target.desc, op, off, remote, len)
}

fn initiator() -> Side {
    let hcas = soft_hcas();
    let t = Arc::new(start("127.0.0.1:1", &hcas));
    let memory = MemoryRegistry::new();
    let buf = HostBuffer::new(BUF);
    let region = memory.register(buf.addr(), BUF as u64, "cpu:0").unwrap();
    t.on_register(&region).unwrap();
    Side {
        name: "127.0.0.1:1".into(),
        t,
        memory,
        buf,
        _region: region,
    }
}

/// Initiator process: reads the target's bytes, writes new ones and reads them back.
#[test]
fn child_two_processes() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let mut target = spawn_target();
    let me = initiator();
    let mib = 1 << 20;
    post_to(&me, &target, OpCode::Read, 0, 0, mib)
        .wait()
        .unwrap();
    assert_eq!(
        me.buf.read_at(0, mib as usize).unwrap(),
        pattern(BUF, TARGET_SEED)[..mib as usize]
    );
    let mine = pattern(mib as usize + 777, 3);
    me.buf.write_at(mib as usize, &mine).unwrap();
    let len = mine.len() as u64;
    post_to(&me, &target, OpCode::Write, mib, 2 * mib, len)
        .wait()
        .unwrap();
    post_to(
        &me,
        &target,
        OpCode::Read,
        3 * mib - 4096,
        2 * mib,
        len - 4096,
    )
    .wait()
    .unwrap();
    assert_eq!(
        me.buf
            .read_at(3 * mib as usize - 4096, len as usize - 4096)
            .unwrap(),
        mine[..len as usize - 4096]
    );
    target.child.kill().unwrap();
    let _ = target.child.wait();
    println!("CHILD OK");
}

/// Initiator process: the target is killed while a batch is in flight; the batch ends
/// with an error (no hang), and a drain returns.
#[test]
fn child_peer_killed_mid_batch() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let mut target = spawn_target();
    let me = initiator();
    post_to(&me, &target, OpCode::Read, 0, 0, 4096)
        .wait()
        .unwrap();
    let batches: Vec<_> = (0..64)
        .map(|_| post_to(&me, &target, OpCode::Write, 0, 0, BUF as u64))
        .collect();
    target.child.kill().unwrap();
    let _ = target.child.wait();
    let failed = batches.iter().filter(|b| b.wait().is_err()).count();
    assert!(
        failed > 0,
        "every batch completed although the peer was killed"
    );
    for b in &batches {
        b.cancel_and_drain();
    }
    // Later requests fail at once with the reason.
    let err = post_to(&me, &target, OpCode::Read, 0, 0, 4096)
        .wait()
        .unwrap_err();
    println!("after the kill: {err}");
    println!("CHILD OK");
}

#[test]
fn two_processes_over_1_2_and_4_soft_hcas() {
    for hcas in [
        &["soft_0"][..],
        &["soft_0", "soft_1"][..],
        &["soft_0", "soft_1", "soft_2", "soft_3"][..],
    ] {
        run_child("child_two_processes", hcas, &[]);
    }
}

#[test]
fn a_peer_killed_mid_batch_fails_the_batch() {
    let out = run_child("child_peer_killed_mid_batch", &["soft_0", "soft_1"], &[]);
    let line = out.lines().find(|l| l.contains("after the kill"));
    println!("{}", line.unwrap_or_else(|| panic!("{out}")));
}
