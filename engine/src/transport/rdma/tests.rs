//! The transport over the in-process FAKE fabric ([`super::fake`]): two transports in
//! this process, wired by a connector that calls the other's `handle_connection`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    reason = "tests: a failed unwrap is a failed test"
)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::backend::{Nic, WcStatus};
use super::fake::FakeFabric;
use super::*;
use crate::memory::host_buffer::HostBuffer;
use crate::memory::MemoryRegistry;
use crate::task::BatchState;
use crate::transport::Transport;
use crate::wire::descriptor::BufferDesc;
use crate::wire::session::HostPort;
use crate::wire::tcp::OpCode;

mod paths;

/// Connects transports of this process by name, counting handshakes.
#[derive(Default)]
struct Net {
    peers: Mutex<HashMap<String, Weak<RdmaTransport>>>,
    handshakes: AtomicUsize,
    /// How long a handshake takes (a slow peer).
    delay: Mutex<Duration>,
}

impl Connector for Net {
    fn exchange(&self, peer: &HostPort, json: &str) -> Result<String, ExchangeError> {
        self.handshakes.fetch_add(1, Ordering::SeqCst);
        let delay = *self.delay.lock();
        std::thread::sleep(delay);
        let t = self
            .peers
            .lock()
            .get(&peer.session_id())
            .and_then(Weak::upgrade)
            .ok_or_else(|| format!("connection refused by {}", peer.session_id()))?;
        t.handle_connection(json).ok_or_else(|| "no reply".into())
    }
}

/// One side: a transport, its memory and one registered buffer.
struct Side {
    name: String,
    t: Arc<RdmaTransport>,
    memory: MemoryRegistry,
    buf: HostBuffer,
    region: Arc<Region>,
}

const BUF: usize = 1 << 20;

impl Side {
    fn new(
        net: &Arc<Net>,
        fabric: &FakeFabric,
        name: &str,
        nics: &[&str],
        topology: Topology,
        params: RdmaParams,
    ) -> Self {
        let nics: Vec<Arc<dyn Nic>> = nics.iter().map(|n| fabric.nic(n) as Arc<dyn Nic>).collect();
        let t =
            Arc::new(RdmaTransport::with_nics(name, nics, topology, params, net.clone()).unwrap());
        net.peers
            .lock()
            .insert(name.to_string(), Arc::downgrade(&t));
        let memory = MemoryRegistry::new();
        let buf = HostBuffer::new(BUF);
        let region = memory.register(buf.addr(), BUF as u64, "cpu:0").unwrap();
        t.on_register(&region).unwrap();
        Self {
            name: name.to_string(),
            t,
            memory,
            buf,
            region,
        }
    }

    fn desc(&self) -> SegmentDesc {
        let mut d = SegmentDesc {
            name: self.name.clone(),
            // As the TCP transport describes itself.
            protocol: vec!["tcp".into()],
            tcp_data_port: 1,
            tcp_data_host: Some("127.0.0.1".into()),
            tcp_proto_version: 2,
            tcp_write_runs: false,
            timestamp: String::new(),
            buffers: self
                .memory
                .snapshot()
                .into_iter()
                .map(|(addr, length, _)| BufferDesc {
                    name: self.name.clone(),
                    addr,
                    length,
                    ..BufferDesc::default()
                })
                .collect(),
            ..SegmentDesc::default()
        };
        self.t.describe(&mut d);
        // What a peer sees: the encoded and decoded descriptor.
        SegmentDesc::decode(&d.encode()).unwrap()
    }

    fn id(&self) -> SegmentId {
        SegmentId::parse(&self.name, 12001).unwrap()
    }

    /// Cuts one request into slices as the engine does, and posts them to `peer`.
    fn transfer(&self, peer: &Side, op: OpCode, off: u64, len: u64) -> Arc<BatchState> {
        self.transfer_to(peer, &peer.desc(), op, off, off, len)
    }

    fn transfer_to(
        &self,
        peer: &Side,
        desc: &SegmentDesc,
        op: OpCode,
        local_off: u64,
        remote_off: u64,
        len: u64,
    ) -> Arc<BatchState> {
        let (batch, slices) = self.slices(peer, op, local_off, remote_off, len);
        self.t.post(&peer.id(), desc, slices).unwrap();
        batch
    }

    /// One request cut into slices as the engine does, in a batch of its own.
    fn slices(
        &self,
        peer: &Side,
        op: OpCode,
        local_off: u64,
        remote_off: u64,
        len: u64,
    ) -> (Arc<BatchState>, Vec<Slice>) {
        let stripe = self.t.slice_size();
        let batch = BatchState::new(&[len.div_ceil(stripe) as u32], Duration::from_secs(10));
        let region = self.memory.find(self.buf.addr() + local_off, len);
        let mut slices = Vec::new();
        let mut off = 0;
        while off < len {
            let n = stripe.min(len - off);
            slices.push(Slice {
                op,
                local: self.buf.addr() + local_off + off,
                remote: peer.buf.addr() + remote_off + off,
                len: n,
                local_device: None,
                local_region: region.clone(),
                batch: batch.clone(),
                task: 0,
                retries: 0,
            });
            off += n;
        }
        (batch, slices)
    }
}

fn topo(entries: &[(&str, &[&str], &[&str])]) -> Topology {
    let names = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
    entries
        .iter()
        .map(|(loc, p, a)| (loc.to_string(), [names(p), names(a)]))
        .collect()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Waits until `n` requests are in flight on the stalled `nic`, then a moment more, so
/// that a test sees any request beyond `n` that should not be there.
fn wait_in_flight(fabric: &FakeFabric, nic: &str, n: usize) -> usize {
    let t0 = Instant::now();
    while fabric.queued(nic) < n && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(20));
    fabric.queued(nic)
}

/// Two sides with one HCA each.
fn pair(params: RdmaParams) -> (FakeFabric, Arc<Net>, Side, Side) {
    let fabric = FakeFabric::new();
    let net = Arc::new(Net::default());
    let a = Side::new(
        &net,
        &fabric,
        "127.0.0.1:1001",
        &["a0"],
        Topology::new(),
        params.clone(),
    );
    let b = Side::new(
        &net,
        &fabric,
        "127.0.0.1:1002",
        &["b0"],
        Topology::new(),
        params,
    );
    (fabric, net, a, b)
}

#[test]
fn writes_and_reads_move_the_bytes() {
    let (fabric, net, a, b) = pair(RdmaParams::default());
    let data = pattern(300_000, 7);
    a.buf.write_at(0, &data).unwrap();
    a.transfer(&b, OpCode::Write, 0, data.len() as u64)
        .wait()
        .unwrap();
    assert_eq!(b.buf.read_at(0, data.len()).unwrap(), data);
    // 300000 = 4 x 65536 + 37856: five work requests (the tail is above the limit).
    assert_eq!(fabric.executed("a0"), 5);

    let back = pattern(100_000, 99);
    b.buf.write_at(500_000, &back).unwrap();
    a.transfer(&b, OpCode::Read, 500_000, back.len() as u64)
        .wait()
        .unwrap();
    assert_eq!(a.buf.read_at(500_000, back.len()).unwrap(), back);
    assert_eq!(
        net.handshakes.load(Ordering::SeqCst),
        1,
        "one endpoint, reused"
    );
}

#[test]
fn a_small_tail_rides_with_the_slice_before_it() {
    let (fabric, _net, a, b) = pair(RdmaParams::default());
    for (len, wrs) in [
        (65536 + 16384, 1),
        (65536 + 16385, 2),
        (3 * 65536 + 1, 3),
        (100, 1),
    ] {
        let before = fabric.executed("a0");
        let data = pattern(len as usize, len as u8);
        a.buf.write_at(4096, &data).unwrap();
        a.transfer(&b, OpCode::Write, 4096, len).wait().unwrap();
        assert_eq!(b.buf.read_at(4096, len as usize).unwrap(), data, "{len}");
        assert_eq!(fabric.executed("a0") - before, wrs, "{len}");
        assert_eq!(
            path::cut(len, 65536, 4).len() as u64,
            wrs,
            "upstream's cut agrees for {len}"
        );
    }
}

#[test]
fn slices_stay_inside_registered_buffers() {
    let (_fabric, _net, a, b) = pair(RdmaParams::default());
    // Past the end of the peer's buffer: rejected before any I/O.
    let err = a
        .transfer_to(&b, &b.desc(), OpCode::Write, 0, (BUF - 100) as u64, 200)
        .wait()
        .unwrap_err();
    assert!(
        matches!(err, TransferError::AddressRejected { .. }),
        "{err}"
    );
    // A local range that is not registered: a clear error, nothing sent.
    let batch = BatchState::new(&[1], Duration::from_secs(5));
    let outside = HostBuffer::new(4096);
    let slice = Slice {
        op: OpCode::Write,
        local: outside.addr(),
        remote: b.buf.addr(),
        len: 4096,
        local_device: None,
        local_region: None,
        batch: batch.clone(),
        task: 0,
        retries: 0,
    };
    a.t.post(&b.id(), &b.desc(), vec![slice]).unwrap();
    let err = batch.wait().unwrap_err();
    assert!(
        matches!(err, TransferError::LocalNotRegistered { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("register_memory"), "{err}");
}

#[test]
fn a_failed_slice_is_retried_on_another_path_over_rebuilt_queue_pairs() {
    let fabric = FakeFabric::new();
    let net = Arc::new(Net::default());
    let a = Side::new(
        &net,
        &fabric,
        "127.0.0.1:1001",
        &["a0", "a1"],
        topo(&[("cpu:0", &["a0"], &["a1"])]),
        RdmaParams::default(),
    );
    let b = Side::new(
        &net,
        &fabric,
        "127.0.0.1:1002",
        &["b0"],
        Topology::new(),
        RdmaParams::default(),
    );
    fabric.fail_next("a0", &[WcStatus::RetryExceeded]);
    let data = pattern(65536, 11);
    a.buf.write_at(0, &data).unwrap();
    a.transfer(&b, OpCode::Write, 0, 65536).wait().unwrap();
    assert_eq!(b.buf.read_at(0, 65536).unwrap(), data);
    // The retry took the other local HCA.
    assert_eq!((fabric.executed("a0"), fabric.executed("a1")), (0, 1));
    let shakes = net.handshakes.load(Ordering::SeqCst);
    assert_eq!(shakes, 2, "a0's endpoint and a1's");
    // a0's endpoint went to error: the next slice on a0 sets up new queue pairs.
    a.transfer(&b, OpCode::Write, 0, 65536).wait().unwrap();
    assert_eq!(fabric.executed("a0"), 1);
    assert_eq!(net.handshakes.load(Ordering::SeqCst), shakes + 1);
}

#[test]
fn a_request_fails_with_its_reason_when_every_path_fails() {
    let params = RdmaParams {
        retry_cnt: 3,
        ..RdmaParams::default()
    };
    let (fabric, _net, a, b) = pair(params);
    fabric.fail_nic("b0", true);
    let err = a.transfer(&b, OpCode::Write, 0, 4096).wait().unwrap_err();
    let text = err.to_string();
    assert!(text.contains("retry exceeded"), "{text}");
    assert!(text.contains("after 4 attempts"), "{text}");
    assert!(text.contains("127.0.0.1:1002@b0"), "{text}");
    fabric.fail_nic("b0", false);
    a.transfer(&b, OpCode::Write, 0, 4096).wait().unwrap();

    // The peer's key no longer valid (its memory deregistered): a remote access error.
    let desc = b.desc();
    b.t.on_unregister(&b.region);
    let err = a
        .transfer_to(&b, &desc, OpCode::Read, 0, 0, 4096)
        .wait()
        .unwrap_err();
    assert!(
        matches!(err, TransferError::AddressRejected { .. }),
        "{err}"
    );
}

/// Posts `slices` slices of 4 KiB on a stalled HCA: only `bound` may be in flight; the
/// rest wait and go out once the HCA moves again.
fn outstanding_requests_are_bounded(params: RdmaParams, slices: u64, bound: usize) {
    let params = RdmaParams {
        slice_size: 4096,
        ..params
    };
    let (fabric, _net, a, b) = pair(params);
    fabric.stall("a0", true);
    let batch = a.transfer(&b, OpCode::Write, 0, slices * 4096);
    assert_eq!(wait_in_flight(&fabric, "a0", bound), bound);
    fabric.stall("a0", false);
    batch.wait().unwrap();
    assert_eq!(fabric.executed("a0"), slices);
}

#[test]
fn posting_beyond_the_watermark_queues() {
    // MC_MAX_WR x MC_NUM_QP_PER_EP per endpoint.
    let params = RdmaParams {
        max_wr: 2,
        num_qp_per_ep: 1,
        ..RdmaParams::default()
    };
    outstanding_requests_are_bounded(params, 40, 2);
}

#[test]
fn requests_outstanding_on_one_hca_stay_within_its_completion_queue() {
    // MC_MAX_CQE_PER_CTX per HCA.
    let params = RdmaParams {
        max_cqe: 3,
        ..RdmaParams::default()
    };
    outstanding_requests_are_bounded(params, 10, 3);
}

#[test]
fn cancel_and_drain_returns_only_after_the_flush() {
    let (fabric, _net, a, b) = pair(RdmaParams::default());
    a.buf.fill(0xab);
    fabric.stall("a0", true);
    let batch = a.transfer(&b, OpCode::Write, 0, 8 * 65536);
    assert_eq!(wait_in_flight(&fabric, "a0", 8), 8, "all in flight");
    batch.cancel_and_drain();
    assert_eq!(fabric.queued("a0"), 0, "flushed before the drain returned");
    fabric.stall("a0", false);
    assert!(matches!(batch.wait(), Err(TransferError::Canceled(_))));
    assert!(b.buf.read_at(0, 8 * 65536).unwrap().iter().all(|&x| x == 0));
    // The endpoint is rebuilt for the next batch.
    a.transfer(&b, OpCode::Write, 0, 65536).wait().unwrap();
    assert_eq!(b.buf.read_at(0, 65536).unwrap(), vec![0xab; 65536]);
}

#[test]
fn a_slow_handshake_does_not_hold_up_a_drain() {
    let (fabric, net, a, b) = pair(RdmaParams::default());
    let c = Side::new(
        &net,
        &fabric,
        "127.0.0.1:1003",
        &["c0"],
        Topology::new(),
        RdmaParams::default(),
    );
    fabric.stall("a0", true);
    let to_b = a.transfer(&b, OpCode::Write, 0, 4 * 65536);
    assert_eq!(wait_in_flight(&fabric, "a0", 4), 4);
    // The endpoint to c takes 2 s to set up.
    *net.delay.lock() = Duration::from_secs(2);
    let handshakes = net.handshakes.load(Ordering::SeqCst);
    let to_c = a.transfer(&c, OpCode::Write, 0, 65536);
    // The drain comes while that handshake is under way.
    let t0 = Instant::now();
    while net.handshakes.load(Ordering::SeqCst) == handshakes {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the handshake to c never began"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let t0 = Instant::now();
    to_b.cancel_and_drain();
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert_eq!(fabric.queued("a0"), 0);
    fabric.stall("a0", false);
    to_c.wait().unwrap();
}

#[test]
fn unregister_waits_for_the_flush_and_deregisters() {
    let (fabric, _net, a, b) = pair(RdmaParams::default());
    fabric.stall("a0", true);
    let batch = a.transfer(&b, OpCode::Write, 0, 4 * 65536);
    assert_eq!(wait_in_flight(&fabric, "a0", 4), 4);
    let before = fabric.registrations();
    a.memory
        .unregister(a.buf.addr(), |region| {
            assert_eq!(fabric.queued("a0"), 0, "unregister cut the endpoint first");
            assert!(region.lease().is_none(), "leased while being unregistered");
            a.t.on_unregister(region);
        })
        .unwrap();
    assert_eq!(fabric.registrations(), before - 1);
    assert!(batch.wait().is_err());
}

/// The HCAs' memory regions lease the region: unregistering does not return before the
/// transport has deregistered it, so no NIC (ours or a peer's) reaches memory that went
/// back to its owner.
#[test]
fn unregister_returns_only_once_the_hcas_let_go_of_the_region() {
    let (fabric, _net, a, _b) = pair(RdmaParams::default());
    let before = fabric.registrations();
    let (memory, addr) = (&a.memory, a.buf.addr());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(move || {
            // A release step that does not deregister.
            memory.unregister(addr, |_| {}).unwrap();
            tx.send(()).unwrap();
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(rx.try_recv().is_err(), "returned while still registered");
        a.t.on_unregister(&a.region);
        rx.recv().unwrap();
    });
    assert_eq!(fabric.registrations(), before - 1);
}

#[test]
fn descriptor_has_upstreams_rdma_form() {
    let fabric = FakeFabric::new();
    let net = Arc::new(Net::default());
    let t = topo(&[("cpu:0", &["x0"], &["x1"])]);
    let a = Side::new(
        &net,
        &fabric,
        "127.0.0.1:1001",
        &["x0", "x1"],
        t.clone(),
        RdmaParams::default(),
    );
    let d = a.desc();
    assert_eq!(d.protocol, vec!["rdma"], "one string, as upstream reads it");
    assert!(d.speaks_rdma() && d.speaks_tcp(), "TCP fields kept");
    assert_eq!(d.devices.len(), 2);
    assert_eq!(d.devices[1].name, "x1");
    assert_eq!(
        d.devices[0].gid,
        format_gid(&fabric.nic("probe").port().gid).replace(":03", ":01")
    );
    assert_eq!(d.buffers[0].name, "cpu:0");
    assert_eq!(d.buffers[0].rkey.len(), 2);
    assert_ne!(d.buffers[0].rkey[0], d.buffers[0].rkey[1]);
    assert_eq!(d.priority_matrix, t);
    let peer = Peer::from_desc(&a.id(), &d).unwrap();
    assert_eq!(peer.buffer(a.buf.addr() + 10, 10), Some(0));
    let mut bad = d.clone();
    bad.devices[0].gid = "nope".into();
    let err = Peer::from_desc(&a.id(), &bad).unwrap_err();
    assert!(
        matches!(&err, crate::transport::causes::UnusableCause::BadGid { device, .. } if *device == d.devices[0].name),
        "{err:?}"
    );
    assert!(err.to_string().contains("GID"), "{err}");
}

#[test]
fn device_memory_that_cannot_be_registered_names_the_peer_memory_module() {
    let fabric = FakeFabric::new();
    let net = Arc::new(Net::default());
    let a = Side::new(
        &net,
        &fabric,
        "127.0.0.1:1001",
        &["m0"],
        Topology::new(),
        RdmaParams {
            force_hca: true,
            ..RdmaParams::default()
        },
    );
    fabric.fail_nic("m0", true);
    let buf = HostBuffer::new(4096);
    let region = a.memory.register(buf.addr(), 4096, "musa:0").unwrap();
    let err = a.t.on_register(&region).unwrap_err().to_string();
    assert!(err.contains("mthreads-peermem"), "{err}");
    assert!(err.contains("MC_FORCE_HCA"), "{err}");
}

#[test]
fn device_memory_no_hca_registers_is_staged_with_key_0_and_declined() {
    let (fabric, _net, a, b) = pair(RdmaParams::default());
    let host = a.desc();
    assert!(
        !a.t.declines(None, &host.buffers[0]),
        "host memory is RDMA's"
    );
    fabric.fail_nic("a0", true);
    let before = fabric.registrations();
    let buf = HostBuffer::new(4096);
    let region = a.memory.register(buf.addr(), 4096, "cuda:0").unwrap();
    // The fake backend has no dma-buf: the region is staged, not refused.
    a.t.on_register(&region).unwrap();
    assert_eq!(fabric.registrations(), before, "nothing registered");
    fabric.fail_nic("a0", false);
    let d = a.desc();
    let staged = d.buffers.iter().find(|b| b.addr == buf.addr()).unwrap();
    assert_eq!(staged.rkey, vec![0], "advertised to no NIC");
    assert!(
        a.t.declines(Some(&region), &host.buffers[0]),
        "ours: over TCP"
    );
    assert!(a.t.declines(None, staged), "the peer's: over TCP");

    // A staged slice that reaches RDMA anyway (a peer without TCP) fails with the reason.
    let batch = BatchState::new(&[1], Duration::from_secs(10));
    let slice = Slice {
        op: OpCode::Write,
        local: buf.addr(),
        remote: b.buf.addr(),
        len: 4096,
        local_device: Some(0),
        local_region: Some(region.clone()),
        batch: batch.clone(),
        task: 0,
        retries: 0,
    };
    a.t.post(&b.id(), &b.desc(), vec![slice]).unwrap();
    let err = batch.wait().unwrap_err().to_string();
    assert!(
        err.contains("staged") && err.contains("nvidia-peermem"),
        "{err}"
    );
    a.t.on_unregister(&region);
    assert_eq!(fabric.registrations(), before);
}

#[test]
fn hostile_connection_requests_are_refused_without_panic() {
    let (fabric, _net, a, _b) = pair(RdmaParams::default());
    let gid = format_gid(&fabric.nic("other").port().gid);
    let good = |qps: &str, nic: &str| {
        format!(
            r#"{{"local_nic_path":"10.0.0.9:1@z0","local_lid":0,"local_gid":"{gid}","peer_nic_path":"127.0.0.1:1001@{nic}","qp_num":{qps},"reply_msg":""}}"#
        )
    };
    let huge = format!("[{}]", vec!["7"; 10_000].join(","));
    for (bad, why) in [
        ("not json".to_string(), "malformed"),
        (r#"{"local_nic_path":5}"#.to_string(), "malformed"),
        (good("[1]", "a0"), "mismatch"),
        (good("[1,2,3]", "a0"), "mismatch"),
        (good(&huge, "a0"), "malformed"),
        (good("[1,2]", "mlx5_9"), "no HCA"),
        (good("\"12\"", "a0"), "malformed"),
        (good("[1,2]", "a0").replace(&gid, "zz"), "GID"),
        (
            good("[1,2]", "a0").replace("10.0.0.9:1@z0", "nopath"),
            "NIC path",
        ),
    ] {
        let reply = ConnectMsg::decode(&a.t.handle_connection(&bad).unwrap()).unwrap();
        assert!(
            reply.reply_msg.contains(why),
            "{bad:.80}: {}",
            reply.reply_msg
        );
        assert!(reply.qp_num.is_empty());
    }
    let reply = ConnectMsg::decode(&a.t.handle_connection(&good("[1,2]", "a0")).unwrap()).unwrap();
    assert_eq!(reply.reply_msg, "");
    assert_eq!(reply.qp_num.len(), 2);
    assert_eq!(reply.peer_nic_path, "10.0.0.9:1@z0");
    assert_eq!(reply.local_nic_path, "127.0.0.1:1001@a0");
}

#[test]
fn passive_endpoints_are_capped() {
    let params = RdmaParams {
        max_ep_per_ctx: 3,
        ..RdmaParams::default()
    };
    let (fabric, _net, a, _b) = pair(params);
    let gid = format_gid(&fabric.nic("other").port().gid);
    let before = fabric.live_qps();
    for i in 0..10 {
        let req = format!(
            r#"{{"local_nic_path":"10.0.0.9:{i}@z0","local_lid":0,"local_gid":"{gid}","peer_nic_path":"127.0.0.1:1001@a0","qp_num":[1,2],"reply_msg":""}}"#
        );
        let reply = ConnectMsg::decode(&a.t.handle_connection(&req).unwrap()).unwrap();
        assert_eq!(reply.reply_msg, "");
    }
    assert_eq!(fabric.live_qps() - before, 3 * 2);
}

/// The transport's own cost per slice, the fake's work included (its lock, queues and a
/// 64-byte copy): printed, and bounded loosely so that a tenfold regression fails. For the
/// figure: `cargo test --release -p transfer-engine --lib cost_per_slice -- --nocapture`.
#[test]
fn cost_per_slice_over_the_fake() {
    let params = RdmaParams {
        slice_size: 64,
        ..RdmaParams::default()
    };
    let (_fabric, _net, a, b) = pair(params);
    let slices = (BUF / 64) as u64;
    a.transfer(&b, OpCode::Write, 0, 4096).wait().unwrap();
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let t0 = Instant::now();
        a.transfer(&b, OpCode::Write, 0, slices * 64)
            .wait()
            .unwrap();
        best = best.min(t0.elapsed());
    }
    let per_slice = best / slices as u32;
    println!("RDMA transport over the fake: {per_slice:?} per slice ({slices} slices of 64 B, best of 5)");
    assert!(per_slice < Duration::from_micros(200), "{per_slice:?}");
}

#[test]
fn dropping_the_transport_flushes_what_is_in_flight_and_fails_the_rest() {
    let params = RdmaParams {
        max_wr: 2,
        num_qp_per_ep: 1,
        ..RdmaParams::default()
    };
    let (fabric, _net, a, b) = pair(params);
    fabric.stall("a0", true);
    let batch = a.transfer(&b, OpCode::Write, 0, 10 * 65536);
    assert_eq!(wait_in_flight(&fabric, "a0", 2), 2);
    let Side { t, .. } = a;
    drop(t);
    assert_eq!(fabric.queued("a0"), 0, "flushed before the drop returned");
    let err = batch.wait().unwrap_err();
    assert!(matches!(err, TransferError::Canceled(_)), "{err}");
}

#[test]
fn a_peer_that_refuses_handshakes_fails_every_slice_fast() {
    let (_fabric, net, a, b) = pair(RdmaParams::default());
    let desc = b.desc();
    net.peers.lock().clear();
    let t0 = Instant::now();
    let err = a
        .transfer_to(&b, &desc, OpCode::Write, 0, 0, 16 * 65536)
        .wait()
        .unwrap_err();
    assert!(
        matches!(err, TransferError::PeerUnreachable { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("connection refused"), "{err}");
    let shakes = net.handshakes.load(Ordering::SeqCst);
    assert!(
        shakes <= 2,
        "{shakes} handshakes for 16 slices to a refusing peer"
    );
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert!(a.t.unreachable(&b.id(), &desc).is_some());
}
