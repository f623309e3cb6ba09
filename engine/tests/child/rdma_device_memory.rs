//! Roles of `rdma_device_memory.rs`: engines with fake GPU memory over the soft NIC of the
//! parent's fabric, and their peer.

use std::io::Write;

use crate::common::{self, fnv, Buf, Peer};
use crate::fake_gpu;
use transfer_engine::device::Vendor;
use transfer_engine::{OpCode, Request};

/// The peer's role.
const PEER: &str = "rdma-device-peer";

const LEN: usize = 3 << 20;

/// The peer of these roles ([`PEER`]): an engine with `LEN` bytes of fake CUDA memory
/// holding `pattern(LEN, seed)`, registered as `<vendor>:0`; answers `hash` over device
/// memory.
pub fn peer() {
    let spec = std::env::var("TE_TEST_PEER").expect("TE_TEST_PEER=\"<len> <seed>\"");
    let seed: u64 = spec.split_whitespace().nth(1).unwrap().parse().unwrap();
    let gpu = install_vendor();
    let dev = fake_gpu::device_buffer(0, &fake_gpu::pattern(LEN, seed));
    let e = common::engine();
    e.register_memory(dev, LEN as u64, &gpu).unwrap();
    let mut out = std::io::stdout();
    writeln!(out, "PEER {} {dev} {LEN}", e.session_id()).unwrap();
    for line in std::io::stdin().lines() {
        let line = line.unwrap();
        let v: Vec<&str> = line.split_whitespace().collect();
        if v.first() == Some(&"hash") {
            let (a, n): (u64, usize) = (v[1].parse().unwrap(), v[2].parse().unwrap());
            writeln!(out, "HASH {}", fnv(&fake_gpu::device_bytes(a, n))).unwrap();
        }
    }
    std::process::exit(0);
}

/// Installs the fake runtime of `TE_FAKE_VENDOR` (`cuda` unless `musa`); returns the
/// location of its device 0.
fn install_vendor() -> String {
    let vendor = match std::env::var("TE_FAKE_VENDOR").as_deref() {
        Ok("musa") => Vendor::Musa,
        _ => Vendor::Cuda,
    };
    fake_gpu::install_fake(vendor);
    format!("{}:0", vendor.prefix())
}

/// Device copies the fake runtime made in this process (staging shows up here).
fn copies() -> u64 {
    let s = fake_gpu::stats();
    s[0] + s[1]
}

/// `rdma-device-memory`: a peer with device memory; local device and host memory;
/// verified bytes both ways for each. Prints `COPIES <n>`: device copies the transfers
/// made here.
pub fn device_memory_both_ways() {
    let gpu = install_vendor();
    transfer_engine::logging::init(transfer_engine::config::LogLevel::Info);
    let mut peer = Peer::spawn_as(PEER, LEN as u64, 7);
    let e = common::engine();
    let dev = fake_gpu::device_buffer(0, &vec![0u8; LEN]);
    e.register_memory(dev, LEN as u64, &gpu).unwrap();
    // A second device region: the staging warning is still logged once.
    let dev2 = fake_gpu::device_buffer(0, &[0u8; 4096]);
    e.register_memory(dev2, 4096, &gpu).unwrap();
    let host = Buf::new(LEN);
    e.register_memory(host.addr(), LEN as u64, "cpu:0").unwrap();

    let before = copies();
    // Device (ours) <- device (peer's), then back with a new pattern.
    let read = [Request::new(OpCode::Read, dev, peer.addr, LEN as u64)];
    // SAFETY: the buffers outlive the synchronous calls; nothing else touches them.
    unsafe { e.transfer_sync(&peer.session, &read) }.unwrap();
    let moved = copies() - before;
    assert!(
        fake_gpu::device_bytes(dev, LEN) == fake_gpu::pattern(LEN, 7),
        "read bytes differ"
    );
    let data = fake_gpu::pattern(LEN, 9);
    let dev_w = fake_gpu::device_buffer(0, &data);
    e.register_memory(dev_w, LEN as u64, &gpu).unwrap();
    let before = copies();
    let write = [Request::new(OpCode::Write, dev_w, peer.addr, LEN as u64)];
    // SAFETY: as above.
    unsafe { e.transfer_sync(&peer.session, &write) }.unwrap();
    let moved = moved + copies() - before;
    assert_eq!(peer.hash(peer.addr, LEN as u64), fnv(&data));

    // Host (ours) <-> device (peer's): only the peer's registration matters.
    let read = [Request::new(
        OpCode::Read,
        host.addr(),
        peer.addr,
        LEN as u64,
    )];
    // SAFETY: as above.
    unsafe { e.transfer_sync(&peer.session, &read) }.unwrap();
    assert!(host.to_vec() == data, "host read bytes differ");
    let data = fake_gpu::pattern(LEN, 11);
    host.write_at(0, &data).unwrap();
    let write = [Request::new(
        OpCode::Write,
        host.addr(),
        peer.addr,
        LEN as u64,
    )];
    // SAFETY: as above.
    unsafe { e.transfer_sync(&peer.session, &write) }.unwrap();
    assert_eq!(peer.hash(peer.addr, LEN as u64), fnv(&data));
    println!("COPIES {moved}");
}

/// `rdma-device-force-hca-register`: with `MC_FORCE_HCA`, device memory no HCA can
/// register is an error naming the module; host memory still registers.
pub fn force_hca_refuses_memory_it_cannot_register() {
    let gpu = install_vendor();
    let e = common::engine();
    let dev = fake_gpu::device_buffer(0, &[1u8; 8192]);
    let err = e.register_memory(dev, 8192, &gpu).unwrap_err().to_string();
    assert!(err.contains("nvidia-peermem"), "{err}");
    assert!(err.contains("MC_FORCE_HCA"), "{err}");
    // Host memory still registers.
    let host = Buf::new(8192);
    e.register_memory(host.addr(), 8192, "cpu:0").unwrap();
}

/// `rdma-device-force-hca-staged-peer`: a request to a peer's staged buffer fails
/// under `MC_FORCE_HCA` rather than going over TCP.
pub fn force_hca_fails_requests_to_a_peers_staged_buffer() {
    install_vendor();
    // The peer allows staging; this engine forces RDMA.
    std::env::remove_var("MC_FORCE_HCA");
    let peer = Peer::spawn_as(PEER, LEN as u64, 3);
    std::env::set_var("MC_FORCE_HCA", "1");
    let e = common::engine();
    let host = Buf::new(4096);
    e.register_memory(host.addr(), 4096, "cpu:0").unwrap();
    let reqs = [Request::new(OpCode::Write, host.addr(), peer.addr, 4096)];
    // SAFETY: `host` outlives the synchronous call; nothing else touches it meanwhile.
    let err = unsafe { e.transfer_sync(&peer.session, &reqs) }
        .unwrap_err()
        .to_string();
    assert!(err.contains("staged"), "{err}");
    assert!(err.contains("MC_FORCE_HCA=1 forbids"), "{err}");
}
