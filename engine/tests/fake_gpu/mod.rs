//! Shared by the fake-GPU test binaries: builds the FAKE runtime library
//! (fake_runtime.c, host memory behind the CUDA/MUSA runtime API) and runs
//! the same device-memory scenarios against it for either vendor.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::Once;

use transfer_engine::device::{self, Vendor};
use transfer_engine::{Config, OpCode, Request, TransferEngine};

/// Cargo's scratch directory of the tests: named to test targets when they are built, and
/// to the test child binary (`tests/child/`) by its parent, as the variable.
fn scratch_dir() -> PathBuf {
    option_env!("CARGO_TARGET_TMPDIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("CARGO_TARGET_TMPDIR").map(PathBuf::from))
        .expect("CARGO_TARGET_TMPDIR: from Cargo in a test, from the parent test in its child")
}

/// Compiles the fake runtime for `vendor` under the target dir and points the engine at it.
pub fn install_fake(vendor: Vendor) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let (name, var) = match vendor {
            Vendor::Cuda => ("libcudart.so.12", "MC_CUDART_PATH"),
            Vendor::Musa => ("libmusart.so.5", "MC_MUSART_PATH"),
        };
        let dir = scratch_dir().join(format!("fake-{}", vendor.prefix()));
        std::fs::create_dir_all(&dir).unwrap();
        let lib = dir.join(name);
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fake_gpu/fake_runtime.c");
        // Built aside and renamed: test processes running at once never load a half-written
        // library.
        let part = dir.join(format!("{name}.{}", std::process::id()));
        let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(["-shared", "-fPIC", "-O1", "-pthread"])
            .arg(format!("-DPREFIX={}", vendor.prefix()))
            .arg("-o")
            .arg(&part)
            .arg(&src)
            .status()
            .expect("a C compiler (cc) is needed to build the fake GPU runtime");
        assert!(status.success(), "building the fake runtime failed");
        std::fs::rename(&part, &lib).unwrap();
        // SAFETY (edition 2021: set_var is safe): set before any engine thread starts.
        std::env::set_var(var, &lib);
        std::env::set_var("MC_GPU_RUNTIME", vendor.prefix());
    });
}

/// Calls the fake's test hook `name`, which fills `N` counters.
fn hook<const N: usize>(name: &[u8]) -> [u64; N] {
    let rt = device::runtime().unwrap();
    // SAFETY: the fake runtime built by this test; its initialisers have no side effects.
    let lib = unsafe { libloading::Library::new(rt.path()) }.unwrap();
    // SAFETY: the fake runtime exports this symbol with exactly this signature.
    let f: libloading::Symbol<unsafe extern "C" fn(*mut u64)> = unsafe { lib.get(name) }.unwrap();
    let mut out = [0u64; N];
    // SAFETY: `out` has room for the counters the function writes.
    unsafe { f(out.as_mut_ptr()) };
    out
}

/// (copies, async copies, pinned allocations) counted by the fake.
pub fn stats() -> [u64; 3] {
    hook(b"fake_gpu_stats")
}

/// Copies enqueued on some stream and not yet run (none runs before its stream is
/// synchronised).
pub fn queued() -> u64 {
    hook::<1>(b"fake_gpu_queued")[0]
}

/// Stream queries that found copies still queued ("not ready"), counted by the fake.
pub fn queries_not_ready() -> u64 {
    hook::<1>(b"fake_gpu_queries_not_ready")[0]
}

/// (`MemcpyBatchAsync` calls, copies made by them) counted by the fake.
pub fn batch_stats() -> [u64; 2] {
    hook(b"fake_gpu_batch_stats")
}

/// (pinned allocations alive now, most alive at once) counted by the fake.
pub fn pinned() -> [u64; 2] {
    hook(b"fake_gpu_pinned")
}

/// (chunks exported, mapped, unmapped, virtual-memory mappings alive) counted by the fake.
pub fn vmm_stats() -> [u64; 4] {
    hook(b"fake_gpu_vmm_stats")
}

/// Memory of the (fake) virtual-memory API on `device`: `n` allocations of `chunk` bytes
/// mapped back to back, as PyTorch's expandable segments; returns the first byte.
pub fn vmm_buffer(device: u32, chunk: usize, n: i32) -> u64 {
    let rt = device::runtime().unwrap();
    rt.set_device(device).unwrap();
    // SAFETY: the fake runtime built by this test; its initialisers have no side effects.
    let lib = unsafe { libloading::Library::new(rt.path()) }.unwrap();
    type Alloc = unsafe extern "C" fn(*mut *mut std::ffi::c_void, usize, i32) -> i32;
    // SAFETY: the fake exports this hook with exactly this signature.
    let f: libloading::Symbol<Alloc> = unsafe { lib.get(b"fake_gpu_vmm_malloc") }.unwrap();
    let mut p = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { f(&mut p, chunk, n) }, 0, "fake_gpu_vmm_malloc");
    p as u64
}

/// `n` requests of `op`, `each` bytes apiece, side by side from `local` and `remote`.
pub fn requests(op: OpCode, local: u64, remote: u64, n: usize, each: usize) -> Vec<Request> {
    (0..n)
        .map(|i| Request {
            op,
            local: local + (i * each) as u64,
            remote: remote + (i * each) as u64,
            len: each as u64,
        })
        .collect()
}

pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(131) + seed * 7 + (i >> 8) + (i >> 16)) as u8)
        .collect()
}

/// Device memory from the fake, filled with `data`.
pub fn device_buffer(device: u32, data: &[u8]) -> u64 {
    let rt = device::runtime().unwrap();
    rt.set_device(device).unwrap();
    let p = rt.malloc(data.len()).unwrap();
    // SAFETY: both ranges are live allocations of at least `len` bytes.
    unsafe { rt.copy(p as *mut u8, data.as_ptr(), data.len()) }.unwrap();
    p
}

/// The bytes of device memory, copied out through the runtime.
pub fn device_bytes(ptr: u64, len: usize) -> Vec<u8> {
    let rt = device::runtime().unwrap();
    let mut out = vec![0u8; len];
    // SAFETY: both ranges are live allocations of at least `len` bytes.
    unsafe { rt.copy(out.as_mut_ptr(), ptr as *const u8, len) }.unwrap();
    out
}

pub fn engine() -> TransferEngine {
    TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", Config::from_env().unwrap()).unwrap()
}

/// The loaded runtime is the fake of `vendor`, and locations are detected.
pub fn detects_locations(vendor: Vendor) {
    install_fake(vendor);
    let rt = device::runtime().expect("fake runtime loads");
    assert_eq!(rt.vendor(), vendor);
    assert_eq!(rt.device_count(), 2);
    let e = engine();
    let dev1 = device_buffer(1, &[1u8; 8192]);
    let host = vec![0u8; 8192];
    e.register_memory(dev1, 8192, "*").unwrap();
    e.register_memory(host.as_ptr() as u64, 8192, "*").unwrap();
    let regions = e.registered_regions();
    let loc = |a: u64| regions.iter().find(|r| r.0 == a).unwrap().2.clone();
    assert_eq!(loc(dev1), format!("{}:1", vendor.prefix()));
    assert!(
        loc(host.as_ptr() as u64).starts_with("cpu:"),
        "{}",
        loc(host.as_ptr() as u64)
    );
    // A host pointer claimed as device memory, and the wrong device, are refused.
    let other = vec![0u8; 4096];
    let err = e
        .register_memory(
            other.as_ptr() as u64,
            4096,
            &format!("{}:0", vendor.prefix()),
        )
        .unwrap_err();
    assert!(err.to_string().contains("host or unknown memory"), "{err}");
    let dev0 = device_buffer(0, &[0u8; 4096]);
    let err = e
        .register_memory(dev0, 4096, &format!("{}:1", vendor.prefix()))
        .unwrap_err();
    assert!(err.to_string().contains("on device 0"), "{err}");
    let topo: serde_json::Value = serde_json::from_str(&e.local_topology("").unwrap()).unwrap();
    assert!(
        topo.get(format!("{}:1", vendor.prefix())).is_some(),
        "{topo}"
    );
}

/// Device to device both ways through two engines, bytes verified; the fake
/// faults on any direct access, so success proves the staging path.
pub fn moves_device_memory_both_ways(vendor: Vendor) {
    install_fake(vendor);
    let len = (3 << 20) + 12345; // several staging chunks and a ragged tail
    let initiator = engine();
    let target = engine();
    let data = pattern(len, 5);
    let src = device_buffer(0, &data);
    let dst = device_buffer(1, &vec![0u8; len]);
    let back = device_buffer(0, &vec![0u8; len]);
    target.register_memory(dst, len as u64, "*").unwrap();
    initiator.register_memory(src, len as u64, "*").unwrap();
    let before = stats();
    let not_ready_before = queries_not_ready();
    let seg = target.session_id().to_string();
    let w = Request {
        op: OpCode::Write,
        local: src,
        remote: dst,
        len: len as u64,
    };
    // SAFETY: every local buffer of the request is test-owned and outlives the call.
    unsafe { initiator.transfer_sync(&seg, &[w]) }.unwrap();
    assert!(
        device_bytes(dst, len) == data,
        "device write landed wrong bytes"
    );
    // Read into unregistered device memory (detected by pointer attributes).
    let r = Request {
        op: OpCode::Read,
        local: back,
        remote: dst,
        len: len as u64,
    };
    // SAFETY: every local buffer of the request is test-owned and outlives the call.
    unsafe { initiator.transfer_sync(&seg, &[r]) }.unwrap();
    assert!(
        device_bytes(back, len) == data,
        "device read returned wrong bytes"
    );
    // Read into host memory.
    let mut host = vec![0u8; len];
    let r = Request {
        op: OpCode::Read,
        local: host.as_mut_ptr() as u64,
        remote: dst,
        len: len as u64,
    };
    // SAFETY: every local buffer of the request is test-owned and outlives the call.
    unsafe { initiator.transfer_sync(&seg, &[r]) }.unwrap();
    assert!(host == data);
    let after = stats();
    let chunks = len.div_ceil(transfer_engine::device::staging::CHUNK) as u64;
    assert!(
        after[1] - before[1] >= 5 * chunks,
        "expected staged async copies, got {:?} -> {:?}",
        before,
        after
    );
    // Three sends out of device memory (the write, and the target's replies to both reads),
    // each waiting for its copies by querying its stream (the vendor's `StreamQuery`).
    let not_ready = queries_not_ready() - not_ready_before;
    assert!(
        not_ready >= 3 * chunks,
        "{vendor:?}: sends out of device memory found their copies running at {not_ready} \
         stream queries, fewer than one a chunk"
    );
}
