//! Roles of `rdma_soft_nic.rs`: the RDMA transport over the soft NIC of the parent's
//! fabric, two transports in one process or a target and an initiator in two.

#![allow(dead_code, reason = "its parent test includes it for a part")]

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use transfer_engine::memory::{MemoryRegistry, Region};
use transfer_engine::task::BatchState;
use transfer_engine::transport::rdma::backend::Nic;
use transfer_engine::transport::rdma::verbs_backend::{HcaSpec, VerbsNic};
use transfer_engine::transport::rdma::{
    Connector, ExchangeError, RdmaParams, RdmaTransport, Topology,
};
use transfer_engine::transport::{Slice, Transport};
use transfer_engine::wire::descriptor::{BufferDesc, SegmentDesc};
use transfer_engine::wire::session::{HostPort, SegmentId};
use transfer_engine::{HostBuffer, OpCode, TransferError};

#[derive(Default)]
struct InProcess {
    peers: Mutex<HashMap<String, Weak<RdmaTransport>>>,
}

impl Connector for InProcess {
    fn exchange(&self, peer: &HostPort, json: &str) -> Result<String, ExchangeError> {
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

/// `rdma-soft-nic-moves-bytes`: verified bytes between two transports of this process
/// over the fabric's HCAs.
pub fn moves_bytes_child() {
    moves_bytes(&soft_hcas());
    println!("CHILD OK");
}

/// Two transports over `hcas` in this process: verified WRITE and READ.
pub fn moves_bytes(hcas: &[String]) {
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

/// `rdma-soft-nic-injected-errors`: the expected failure named by `RDMA_EXPECT` happens,
/// or the transfer succeeds despite injected errors (`ok`).
pub fn with_injected_errors() {
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

/// Seed of the bytes the target starts with.
const TARGET_SEED: u8 = 42;

/// `rdma-soft-nic-target`: serves a 4 MiB buffer (filled with `pattern(.., TARGET_SEED)`)
/// over RDMA on every soft HCA, prints `READY <session>` and lives until killed.
pub fn target() {
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

    let mut child = crate::common::child_command("rdma-soft-nic-target")
        .stdout(std::process::Stdio::piped())
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(out).lines();
    let session = loop {
        let line = lines.next().expect("target exited").unwrap();
        if let Some(session) = line.strip_prefix("READY ") {
            break session.trim().to_string();
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

/// `rdma-soft-nic-two-processes`: reads the target's bytes, writes new ones and reads
/// them back.
pub fn two_processes() {
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

/// `rdma-soft-nic-peer-killed`: the target is killed while a batch is in flight; the
/// batch ends with an error (no hang), and a drain returns.
pub fn peer_killed_mid_batch() {
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
