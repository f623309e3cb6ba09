//! The RDMA transport over real verbs calls, served by the soft NIC (a SOFTWARE stand-in
//! for libibverbs.so.1, `engine/tests/soft_nic/`): two transports in one child process,
//! each with its own contexts on the same soft HCAs, wired by an in-process connector
//! that hands each endpoint request to the other's `handle_connection`. The bytes move
//! through the soft NIC's `process_vm_writev` / `process_vm_readv` data path.

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
                gid_index: 1,
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
            protocol: Vec::new(),
            tcp_data_port: 0,
            tcp_data_host: None,
            tcp_proto_version: 2,
            timestamp: String::new(),
            buffers: vec![BufferDesc {
                name: self.name.clone(),
                addr: self.buf.addr(),
                length: BUF as u64,
                rkey: Vec::new(),
                lkey: Vec::new(),
            }],
            devices: Vec::new(),
            priority_matrix: Default::default(),
        };
        self.t.describe(&mut d);
        SegmentDesc::decode(&d.encode()).unwrap()
    }

    fn transfer(&self, peer: &Side, op: OpCode, off: u64, len: u64) -> Result<(), TransferError> {
        let stripe = self.t.slice_size();
        let batch = BatchState::new(&[len.div_ceil(stripe) as u32], Duration::from_secs(20));
        let region = self.memory.find(self.buf.addr() + off, len);
        let mut slices = Vec::new();
        let mut at = 0;
        while at < len {
            let n = stripe.min(len - at);
            slices.push(Slice {
                op,
                local: self.buf.addr() + off + at,
                remote: peer.buf.addr() + off + at,
                len: n,
                local_device: None,
                local_region: region.clone(),
                batch: batch.clone(),
                task: 0,
                retries: 0,
            });
            at += n;
        }
        let id = SegmentId::parse(&peer.name, 12001).unwrap();
        self.t.post(&id, &peer.desc(), slices).unwrap();
        batch.wait()
    }
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
    let hcas = soft_hcas();
    let net = Arc::new(InProcess::default());
    let a = side(&net, "127.0.0.1:2001", &hcas);
    let b = side(&net, "127.0.0.1:2002", &hcas);
    let len = 3 * 65536 + 1000;
    let data = pattern(len, 5);
    a.buf.write_at(0, &data).unwrap();
    a.transfer(&b, OpCode::Write, 0, len as u64).unwrap();
    assert_eq!(b.buf.read_at(0, len).unwrap(), data);
    let back = pattern(1 << 20, 77);
    b.buf.write_at(1 << 21, &back).unwrap();
    a.transfer(&b, OpCode::Read, 1 << 21, 1 << 20).unwrap();
    assert_eq!(a.buf.read_at(1 << 21, 1 << 20).unwrap(), back);
    println!("CHILD OK");
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
