//! GPU memory over RDMA, without a GPU or an HCA: two engine processes, the FAKE CUDA or MUSA
//! runtime (`tests/fake_gpu/`: "device" memory is a memfd mapped PROT_NONE, reached only
//! through the runtime's copies) and the soft NIC (`tests/soft_nic/`: a SOFTWARE
//! stand-in for libibverbs.so.1). The soft NIC plays an HCA with the peer-memory module
//! (it reaches fake device memory through its own mapping of the memfd), one without it
//! (`SOFTNIC_REFUSE_MR=fake_gpu`: `ibv_reg_mr` fails with EFAULT), and one without
//! dma-buf support (`SOFTNIC_REFUSE_DMABUF=1`), so each step of the registration order
//! (`transport::rdma::register`) runs: peer memory, dma-buf, staged over TCP, and the
//! `MC_FORCE_HCA=1` error.
//!
//! Every engine runs in a child process (this test binary again): the verbs library, the
//! GPU runtime and the `MC_*` configuration are read once per process.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod common;
mod fake_gpu;
mod soft_nic;

use std::io::Write;

use common::{fnv, Buf, Peer};
use soft_nic::SoftFabric;
use transfer_engine::device::Vendor;
use transfer_engine::{OpCode, Request};

const LEN: usize = 3 << 20;

/// The peer process: an engine with `LEN` bytes of fake CUDA memory holding
/// `pattern(LEN, seed)`, registered as `<vendor>:0`; answers `hash` over device memory.
#[test]
fn peer_process() {
    let Ok(spec) = std::env::var("TE_TEST_PEER") else {
        return;
    };
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

/// Runs `test` of this binary in a child with `fabric`'s environment, protocol `rdma`,
/// the fake CUDA runtime and `env`; `MC_FORCE_HCA=1` when `force`. Returns its output,
/// asserting it passed.
fn run_child(test: &str, force: bool, env: &[(&str, &str)]) -> String {
    let fabric = SoftFabric::new(&["soft_0", "soft_1"]);
    let mut cmd = soft_nic::child_command(test, &fabric);
    cmd.env("MC_DISABLE_IPC", "1")
        .env("MC_LOG_LEVEL", "info")
        .env_remove("RUST_LOG")
        .env_remove("TE_TEST_PEER")
        .envs(env.iter().copied());
    if force {
        cmd.env("MC_FORCE_HCA", "1");
    }
    soft_nic::run_passing(cmd, test)
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

fn is_child() -> bool {
    std::env::var_os("TE_RDMA_CHILD").is_some()
}

/// Device copies the fake runtime made in this process (staging shows up here).
fn copies() -> u64 {
    let s = fake_gpu::stats();
    s[0] + s[1]
}

/// The child: a peer with device memory; local device and host memory; verified bytes
/// both ways for each. Prints `COPIES <n>`: device copies the transfers made here.
#[test]
fn child_device_memory_both_ways() {
    if !is_child() {
        return;
    }
    let gpu = install_vendor();
    transfer_engine::logging::init(transfer_engine::config::LogLevel::Info);
    let mut peer = Peer::spawn(LEN as u64, 7);
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

fn copies_in(text: &str) -> u64 {
    let line = text.lines().find_map(|l| l.split_once("COPIES ")).unwrap();
    line.1.trim().parse().unwrap()
}

#[test]
fn device_memory_registered_through_peer_memory_moves_over_rdma() {
    let text = run_child("child_device_memory_both_ways", true, &[]);
    // No device copy here: the NIC read and wrote device memory itself.
    assert_eq!(copies_in(&text), 0, "{text}");
    assert!(
        !text.contains("STAGED") && !text.contains("dma-buf"),
        "{text}"
    );
}

#[test]
fn device_memory_refused_by_ibv_reg_mr_is_registered_through_dma_buf() {
    let text = run_child(
        "child_device_memory_both_ways",
        true,
        &[("SOFTNIC_REFUSE_MR", "fake_gpu")],
    );
    assert_eq!(copies_in(&text), 0, "{text}");
    assert!(text.contains("registered through dma-buf"), "{text}");
    assert!(!text.contains("STAGED"), "{text}");
}

#[test]
fn device_memory_no_hca_can_register_is_staged_over_tcp_with_one_warning() {
    let text = run_child(
        "child_device_memory_both_ways",
        false,
        &[
            ("SOFTNIC_REFUSE_MR", "fake_gpu"),
            ("SOFTNIC_REFUSE_DMABUF", "1"),
        ],
    );
    // The bytes went through pinned staging buffers (device copies here).
    assert!(copies_in(&text) > 0, "{text}");
    assert_eq!(text.matches("device memory is STAGED").count(), 1, "{text}");
    assert!(text.contains("nvidia-peermem"), "{text}");
}

#[test]
fn child_force_hca_refuses_memory_it_cannot_register() {
    if !is_child() {
        return;
    }
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

#[test]
fn force_hca_makes_unregistrable_device_memory_an_error_naming_the_module() {
    run_child(
        "child_force_hca_refuses_memory_it_cannot_register",
        true,
        &[
            ("SOFTNIC_REFUSE_MR", "fake_gpu"),
            ("SOFTNIC_REFUSE_DMABUF", "1"),
        ],
    );
}

#[test]
fn musa_memory_refused_by_ibv_reg_mr_is_registered_through_the_musa_dma_buf_calls() {
    // Upstream has only the peer-memory path on MUSA; we try muMemGetHandleForAddressRange.
    let text = run_child(
        "child_device_memory_both_ways",
        true,
        &[
            ("TE_FAKE_VENDOR", "musa"),
            ("SOFTNIC_REFUSE_MR", "fake_gpu"),
        ],
    );
    assert_eq!(copies_in(&text), 0, "{text}");
    assert!(text.contains("musa memory at"), "{text}");
    assert!(text.contains("registered through dma-buf"), "{text}");
}

#[test]
fn musa_memory_no_hca_can_register_is_staged_naming_mthreads_peermem() {
    let text = run_child(
        "child_device_memory_both_ways",
        false,
        &[
            ("TE_FAKE_VENDOR", "musa"),
            ("SOFTNIC_REFUSE_MR", "fake_gpu"),
            ("SOFTNIC_REFUSE_DMABUF", "1"),
        ],
    );
    assert!(copies_in(&text) > 0, "{text}");
    assert_eq!(text.matches("device memory is STAGED").count(), 1, "{text}");
    assert!(text.contains("mthreads-peermem"), "{text}");
}

#[test]
fn child_force_hca_fails_requests_to_a_peers_staged_buffer() {
    if !is_child() {
        return;
    }
    install_vendor();
    // The peer allows staging; this engine forces RDMA.
    std::env::remove_var("MC_FORCE_HCA");
    let peer = Peer::spawn(LEN as u64, 3);
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

#[test]
fn force_hca_fails_requests_to_a_peers_staged_buffer_instead_of_using_tcp() {
    run_child(
        "child_force_hca_fails_requests_to_a_peers_staged_buffer",
        true,
        &[
            ("SOFTNIC_REFUSE_MR", "fake_gpu"),
            ("SOFTNIC_REFUSE_DMABUF", "1"),
        ],
    );
}
