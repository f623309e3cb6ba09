//! Same-host GPU IPC between processes under the FAKE GPU runtime (fake_gpu/fake_runtime.c:
//! "device" memory is a memfd another process maps through the fake IPC handle). The peer
//! is `te-test-child ipc-peer` (`tests/child/`) with `TE_IPC_PEER` set; it registers
//! device memory inside larger allocations (as PyTorch's caching allocator hands out
//! tensors), host memory, and answers `hash`, `unregister` and `exit` on stdin.

#![allow(dead_code)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test support: a panic here is the calling test's failure report"
)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use transfer_engine::device::{self, Vendor};
use transfer_engine::{Config, OpCode, Request, TransferEngine};

use crate::fake_gpu::{device_buffer, device_bytes, install_fake, pattern};

/// Engines read the IPC variables when they start: tests that set them hold this.
pub static ENV: Mutex<()> = Mutex::new(());

/// Offset of the peer's first device region inside its allocation.
pub const OFFSET: u64 = 64 << 10;
/// Bytes of each peer region.
pub const LEN: u64 = (3 << 20) + 12345;
/// Bytes of each allocation under the peer's virtual-memory region `v`.
pub const VMM_CHUNK: u64 = 1 << 20;
/// Offset of `v` in its first allocation.
pub const VMM_OFFSET: u64 = 4096;

pub fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The peer process and the addresses of its regions: `a` and `b` share one
/// allocation (`a` at [`OFFSET`]), `c` is a second allocation, `host` is host memory,
/// `v` memory of the virtual-memory API ([`VMM_CHUNK`] allocations back to back, `v` at
/// [`VMM_OFFSET`] in them, crossing three chunk boundaries).
pub struct IpcPeer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub session: String,
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub host: u64,
    pub v: u64,
}

impl IpcPeer {
    /// Starts a peer whose regions hold `pattern(LEN, seed + i)`; `env` is set for it only.
    #[allow(clippy::zombie_processes)] // waited for in `Drop`
    pub fn spawn(seed: u64, env: &[(&str, &str)]) -> Self {
        let mut cmd = crate::common::child_command("ipc-peer");
        cmd.env("TE_IPC_PEER", seed.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        // Under ENV: a child copies this process's environment when it starts, and
        // `engine_with` sets variables (`MC_DISABLE_IPC=1`, ...) for a moment under it.
        let mut child = {
            let _g = ENV.lock().unwrap_or_else(|p| p.into_inner());
            cmd.spawn().expect("peer process starts")
        };
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                stdout.read_line(&mut line).unwrap() > 0,
                "peer exited before it was ready"
            );
            if let Some(rest) = line.split_once("IPCPEER ").map(|(_, r)| r) {
                let v: Vec<&str> = rest.split_whitespace().collect();
                return Self {
                    child,
                    stdin,
                    stdout,
                    session: v[0].to_string(),
                    a: v[1].parse().unwrap(),
                    b: v[2].parse().unwrap(),
                    c: v[3].parse().unwrap(),
                    host: v[4].parse().unwrap(),
                    v: v[5].parse().unwrap(),
                };
            }
        }
    }

    fn ask(&mut self, cmd: &str, answer: &str) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        let mut line = String::new();
        loop {
            line.clear();
            assert!(self.stdout.read_line(&mut line).unwrap() > 0, "peer died");
            if let Some(h) = line.split_once(answer).map(|(_, r)| r) {
                return h.trim().to_string();
            }
        }
    }

    /// FNV of the peer's bytes at `addr` (device or host).
    pub fn hash(&mut self, addr: u64, len: u64) -> u64 {
        self.ask(&format!("hash {addr} {len}"), "HASH ")
            .parse()
            .unwrap()
    }

    /// Unregisters the peer's region at `addr`.
    pub fn unregister(&mut self, addr: u64) {
        self.ask(&format!("unregister {addr}"), "UNREGISTERED");
    }

    /// Reads `len` bytes of `segment` at `remote` into the peer's region `c`: `Ok` or the error.
    pub fn pull(&mut self, segment: &str, remote: u64, len: u64) -> Result<(), String> {
        let r = self.ask(&format!("pull {segment} {remote} {len}"), "PULLED ");
        match r.strip_prefix("ok") {
            Some(_) => Ok(()),
            None => Err(r),
        }
    }

    /// Sends the peer process `signal` (`STOP`, `CONT`).
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{signal}");
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for IpcPeer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The peer process (role `ipc-peer`): `TE_IPC_PEER=<seed>`.
pub fn peer_main() {
    let seed = std::env::var("TE_IPC_PEER").expect("TE_IPC_PEER=<seed>");
    let seed: u64 = seed.parse().unwrap();
    // The parent set MC_GPU_RUNTIME and the fake's path; building it again here would
    // rewrite a library the parent has mapped.
    let rt = device::runtime().unwrap();
    let e = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", Config::from_env().unwrap()).unwrap();
    rt.set_device(0).unwrap();
    // One allocation holding two regions (a caching allocator's block), and another.
    let big = rt.malloc((OFFSET + 2 * LEN + 8192) as usize).unwrap();
    let a = big + OFFSET;
    let b = a + LEN + 4096;
    let c = device_buffer(0, &pattern(LEN as usize, seed + 2));
    let fill = |addr: u64, data: &[u8]| {
        // SAFETY: inside the allocation above.
        unsafe { rt.copy(addr as *mut u8, data.as_ptr(), data.len()) }.unwrap();
    };
    fill(a, &pattern(LEN as usize, seed));
    fill(b, &pattern(LEN as usize, seed + 1));
    let host = transfer_engine::HostBuffer::new(LEN as usize);
    host.write_at(0, &pattern(LEN as usize, seed + 3)).unwrap();
    let v = crate::fake_gpu::vmm_buffer(0, VMM_CHUNK as usize, 4) + VMM_OFFSET;
    fill(v, &pattern(LEN as usize, seed + 4));
    for addr in [a, b, c, v] {
        e.register_memory(addr, LEN, "*").unwrap();
    }
    e.register_memory(host.addr(), LEN, "cpu:0").unwrap();
    let mut out = std::io::stdout();
    writeln!(
        out,
        "IPCPEER {} {a} {b} {c} {} {v}",
        e.session_id(),
        host.addr()
    )
    .unwrap();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let v: Vec<&str> = line.split_whitespace().collect();
        match v.first().copied() {
            Some("hash") => {
                let (addr, len): (u64, u64) = (v[1].parse().unwrap(), v[2].parse().unwrap());
                let bytes = if addr == host.addr() {
                    host.read_at(0, len as usize).unwrap()
                } else {
                    device_bytes(addr, len as usize)
                };
                writeln!(out, "HASH {}", fnv(&bytes)).unwrap();
            }
            Some("unregister") => {
                e.unregister_memory(v[1].parse().unwrap()).unwrap();
                writeln!(out, "UNREGISTERED").unwrap();
            }
            Some("pull") => {
                let (remote, len): (u64, u64) = (v[2].parse().unwrap(), v[3].parse().unwrap());
                // SAFETY: `c` is registered, LEN bytes long, and outlives the call.
                let r = unsafe {
                    e.transfer_sync(v[1], &[Request::new(OpCode::Read, c, remote, len.min(LEN))])
                };
                match r {
                    Ok(()) => writeln!(out, "PULLED ok").unwrap(),
                    Err(err) => writeln!(out, "PULLED {err}").unwrap(),
                }
            }
            _ => break,
        }
    }
    std::process::exit(0);
}

fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// The test functions of one vendor's binary: every scenario.
#[macro_export]
macro_rules! ipc_tests {
    ($vendor:expr) => {
        #[test]
        fn device_to_device_goes_over_ipc_with_one_open_per_allocation() {
            ipc_support::device_to_device_goes_over_ipc($vendor);
        }

        #[test]
        fn host_memory_and_mixes_use_tcp() {
            ipc_support::host_memory_and_mixes_use_tcp($vendor);
        }

        #[test]
        fn disabled_or_other_host_use_tcp() {
            ipc_support::disabled_or_other_host_use_tcp($vendor);
        }

        #[test]
        fn a_peer_advertising_the_ipc_protocol_serves_device_memory_only() {
            ipc_support::peer_advertising_the_ipc_protocol($vendor);
        }

        #[test]
        fn unregister_revokes_peer_mappings_before_it_returns() {
            ipc_support::unregister_revokes_peer_mappings($vendor);
        }

        #[test]
        fn revocation_is_bounded_by_unresponsive_and_dead_importers() {
            ipc_support::revocation_is_bounded($vendor);
        }

        #[test]
        fn a_stopped_importer_holds_unregister_for_the_timeout_only() {
            ipc_support::stopped_importer($vendor);
        }

        #[test]
        fn concurrent_first_requests_open_a_handle_once() {
            ipc_support::concurrent_first_use($vendor);
        }

        #[test]
        fn adjacent_requests_share_device_copies() {
            ipc_support::adjacent_requests_share_copies($vendor);
        }

        #[test]
        fn alternating_adjacent_blocks_land_over_several_copy_threads() {
            ipc_support::alternating_adjacent_blocks($vendor);
        }

        #[test]
        fn scattered_requests_go_in_one_batch_call_per_group() {
            ipc_support::scattered_requests_go_in_batches($vendor, "CUDA 13 signature");
        }

        #[test]
        fn hostile_ipc_control_messages_are_refused() {
            ipc_support::hostile_control_messages($vendor);
        }

        #[test]
        fn virtual_memory_regions_go_over_ipc_and_are_revoked() {
            ipc_support::virtual_memory_regions($vendor);
        }

        #[test]
        fn mappings_close_on_unregister_and_peer_exit() {
            ipc_support::mappings_close_on_unregister_and_peer_exit($vendor);
        }
    };
}

/// An engine started with `env` set (under [`ENV`]).
pub fn engine_with(env: &[(&str, &str)]) -> TransferEngine {
    let _g = ENV.lock().unwrap_or_else(|p| p.into_inner());
    for (k, v) in env {
        // SAFETY (edition 2021: set_var is safe): engines start under ENV only.
        std::env::set_var(k, v);
    }
    let e = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", Config::from_env().unwrap()).unwrap();
    for (k, _) in env {
        std::env::remove_var(k);
    }
    e
}

/// The IPC transport's decision line, if the engine runs one.
pub fn ipc_decision(e: &TransferEngine) -> Option<String> {
    e.transport_decisions()
        .into_iter()
        .find(|(p, _)| *p == "nvlink_intra" || *p == "musa")
        .map(|(_, line)| line)
}

/// (opened, closed, open now) from the IPC transport's decision line.
pub fn ipc_counts(e: &TransferEngine) -> (u64, u64, u64) {
    let line = ipc_decision(e).expect("the IPC transport runs");
    let num = |suffix: &str| -> u64 {
        let i = line
            .find(suffix)
            .unwrap_or_else(|| panic!("{suffix:?} in {line}"));
        line[..i].rsplit(' ').next().unwrap().parse().unwrap()
    };
    (
        num(" peer handle(s) opened"),
        num(" closed"),
        num(" open now"),
    )
}

/// What the IPC transport reports to the metrics.
pub fn ipc_metrics(e: &TransferEngine) -> transfer_engine::metrics::TransportCounters {
    e.metrics()
        .transports
        .into_iter()
        .find(|t| t.protocol == "nvlink_intra" || t.protocol == "musa")
        .expect("the IPC transport has metrics")
        .connections
}

pub fn sync(e: &TransferEngine, seg: &str, reqs: &[Request]) {
    // SAFETY: every local buffer of the requests is test-owned and outlives the call.
    unsafe { e.transfer_sync(seg, reqs) }.unwrap();
}

/// Device to device both ways with a same-host peer: bytes verified, one handle opened
/// for the two regions sharing an allocation over many requests, the descriptor fields.
pub fn device_to_device_goes_over_ipc(vendor: Vendor) {
    install_fake(vendor);
    let mut peer = IpcPeer::spawn(11, &[]);
    let e = engine_with(&[]);
    let (seg, len) = (peer.session.clone(), LEN as usize);
    // Descriptor: shm_name (upstream hex of 64 bytes), our offset, location, host id.
    let bufs = e.segment_buffers(&seg).unwrap();
    let a = bufs.iter().find(|b| b.addr == peer.a).unwrap();
    let shm = a.shm_name.clone().expect("device buffers carry shm_name");
    assert_eq!(shm.len(), 128);
    assert!(
        shm.chars()
            .all(|c| c.is_ascii_digit() || ('A'..='F').contains(&c)),
        "{shm}"
    );
    assert_eq!(a.shm_offset, Some(OFFSET));
    assert_eq!(a.name, format!("{}:0", vendor.prefix()));
    let b = bufs.iter().find(|x| x.addr == peer.b).unwrap();
    assert_eq!(
        b.shm_name.as_deref(),
        Some(shm.as_str()),
        "one allocation, one handle"
    );
    assert_eq!(b.shm_offset, Some(OFFSET + LEN + 4096));
    let host = bufs.iter().find(|x| x.addr == peer.host).unwrap();
    assert_eq!(host.shm_name, None);

    // Read a and b into local device memory (registered and not).
    let local = device_buffer(1, &vec![0u8; 2 * len]);
    e.register_memory(local, 2 * LEN, "*").unwrap();
    sync(
        &e,
        &seg,
        &[
            Request::new(OpCode::Read, local, peer.a, LEN),
            Request::new(OpCode::Read, local + LEN, peer.b, LEN),
        ],
    );
    assert!(
        device_bytes(local, len) == pattern(len, 11),
        "read of a differs"
    );
    assert!(
        device_bytes(local + LEN, len) == pattern(len, 12),
        "read of b differs"
    );
    let loose = device_buffer(0, &vec![0u8; len]);
    sync(&e, &seg, &[Request::new(OpCode::Read, loose, peer.c, LEN)]);
    assert!(
        device_bytes(loose, len) == pattern(len, 13),
        "read of c differs"
    );
    assert_eq!(ipc_counts(&e).0, 2, "one handle per peer allocation");

    // Writes, many small requests: no new opens.
    let data = pattern(len, 99);
    let src = device_buffer(1, &data);
    let chunk = 64 << 10;
    let mut reqs = Vec::new();
    let mut off = 0;
    while off < LEN {
        let n = chunk.min(LEN - off);
        reqs.push(Request::new(OpCode::Write, src + off, peer.a + off, n));
        off += n;
    }
    for _ in 0..5 {
        sync(&e, &seg, &reqs);
    }
    assert_eq!(peer.hash(peer.a, LEN), fnv(&data), "written bytes differ");
    assert_eq!(
        peer.hash(peer.b, LEN),
        fnv(&pattern(len, 12)),
        "neighbour changed"
    );
    let (opened, closed, open) = ipc_counts(&e);
    assert_eq!(
        (opened, closed, open),
        (2, 0, 2),
        "handles cached over many requests"
    );
    let c = ipc_metrics(&e);
    assert_eq!((c.connects, c.reconnects, c.retries), (2, 0, 0), "{c:?}");
}

/// Host memory on either side keeps the TCP path, and works.
pub fn host_memory_and_mixes_use_tcp(vendor: Vendor) {
    install_fake(vendor);
    let mut peer = IpcPeer::spawn(21, &[]);
    let e = engine_with(&[]);
    let (seg, len) = (peer.session.clone(), LEN as usize);
    // Device here -> host there, and back.
    let data = pattern(len, 5);
    let src = device_buffer(0, &data);
    sync(
        &e,
        &seg,
        &[Request::new(OpCode::Write, src, peer.host, LEN)],
    );
    assert_eq!(peer.hash(peer.host, LEN), fnv(&data));
    let back = device_buffer(1, &vec![0u8; len]);
    sync(
        &e,
        &seg,
        &[Request::new(OpCode::Read, back, peer.host, LEN)],
    );
    assert!(device_bytes(back, len) == data);
    // Host here <-> device there.
    let mut host = vec![0u8; len];
    sync(
        &e,
        &seg,
        &[Request::new(
            OpCode::Read,
            host.as_mut_ptr() as u64,
            peer.c,
            LEN,
        )],
    );
    assert!(host == pattern(len, 23));
    let hdata = pattern(len, 6);
    sync(
        &e,
        &seg,
        &[Request::new(
            OpCode::Write,
            hdata.as_ptr() as u64,
            peer.a,
            LEN,
        )],
    );
    assert_eq!(peer.hash(peer.a, LEN), fnv(&hdata));
    assert_eq!(ipc_counts(&e).0, 0, "no IPC handle opened for host memory");
}

/// `MC_DISABLE_IPC=1` or `MC_FORCE_TCP=1` here, or a peer on another host: TCP, bytes
/// verified.
pub fn disabled_or_other_host_use_tcp(vendor: Vendor) {
    install_fake(vendor);
    let len = LEN as usize;
    for (peer_env, our_env) in [
        (vec![], vec![("MC_DISABLE_IPC", "1")]),
        (vec![], vec![("MC_FORCE_TCP", "1")]),
        (vec![("MC_HOST_ID", "another-host")], vec![]),
    ] {
        let mut peer = IpcPeer::spawn(31, &peer_env);
        let e = engine_with(&our_env);
        let seg = peer.session.clone();
        let data = pattern(len, 7);
        let src = device_buffer(0, &data);
        sync(&e, &seg, &[Request::new(OpCode::Write, src, peer.a, LEN)]);
        assert_eq!(
            peer.hash(peer.a, LEN),
            fnv(&data),
            "{peer_env:?} {our_env:?}"
        );
        let back = device_buffer(1, &vec![0u8; len]);
        sync(&e, &seg, &[Request::new(OpCode::Read, back, peer.c, LEN)]);
        assert!(device_bytes(back, len) == pattern(len, 33));
        if our_env.contains(&("MC_FORCE_TCP", "1")) {
            assert!(
                ipc_decision(&e).is_none(),
                "MC_FORCE_TCP=1: an IPC transport was started"
            );
        } else {
            assert_eq!(
                ipc_counts(&e).0,
                0,
                "{peer_env:?} {our_env:?}: no handle opened"
            );
        }
    }
}

/// Mappings close when the peer's descriptor drops the buffer and when the peer exits.
pub fn mappings_close_on_unregister_and_peer_exit(vendor: Vendor) {
    install_fake(vendor);
    let mut peer = IpcPeer::spawn(41, &[]);
    let e = engine_with(&[]);
    let (seg, len) = (peer.session.clone(), LEN as usize);
    let dst = device_buffer(0, &vec![0u8; 2 * len]);
    sync(
        &e,
        &seg,
        &[
            Request::new(OpCode::Read, dst, peer.a, LEN),
            Request::new(OpCode::Read, dst + LEN, peer.c, LEN),
        ],
    );
    assert_eq!(ipc_counts(&e), (2, 0, 2));
    peer.unregister(peer.c);
    // The next look at the peer's descriptor (after a refresh) closes c's mapping.
    e.forget_segment(&seg);
    sync(&e, &seg, &[Request::new(OpCode::Read, dst, peer.a, LEN)]);
    assert!(device_bytes(dst, len) == pattern(len, 41));
    assert_eq!(ipc_counts(&e), (2, 1, 1), "c's mapping closed, a's kept");
    // A request to the unregistered buffer fails without I/O.
    // SAFETY: `dst` outlives the call.
    let err = unsafe { e.transfer_sync(&seg, &[Request::new(OpCode::Read, dst, peer.c, LEN)]) };
    assert!(err.is_err());
    peer.kill();
    // Housekeeping notices the exit within a second or so; the counters settle once the
    // mapping is dropped (after it left the cache).
    let closed = wait_for(Duration::from_secs(10), || ipc_counts(&e) == (2, 2, 0));
    assert!(
        closed,
        "mappings of an exited peer stay open: {:?}",
        ipc_counts(&e)
    );
}

/// A peer started with upstream's switch (`MC_INTRANODE_NVLINK` / `MC_FORCE_MUSA`) advertises
/// the IPC protocol: device memory moves over IPC, host memory fails with the reason.
pub fn peer_advertising_the_ipc_protocol(vendor: Vendor) {
    install_fake(vendor);
    let (var, protocol) = match vendor {
        Vendor::Cuda => ("MC_INTRANODE_NVLINK", "nvlink_intra"),
        Vendor::Musa => ("MC_FORCE_MUSA", "musa"),
    };
    let peer = IpcPeer::spawn(51, &[(var, "1")]);
    let e = engine_with(&[]);
    let (seg, len) = (peer.session.clone(), LEN as usize);
    let dst = device_buffer(1, &vec![0u8; len]);
    sync(&e, &seg, &[Request::new(OpCode::Read, dst, peer.a, LEN)]);
    assert!(device_bytes(dst, len) == pattern(len, 51));
    assert_eq!(ipc_counts(&e).0, 1);
    let mut host = vec![0u8; len];
    // SAFETY: `host` outlives the call.
    let err = unsafe {
        e.transfer_sync(
            &seg,
            &[Request::new(
                OpCode::Read,
                host.as_mut_ptr() as u64,
                peer.a,
                LEN,
            )],
        )
    }
    .unwrap_err()
    .to_string();
    assert!(
        err.contains(protocol) && err.contains("host memory"),
        "{err}"
    );
}

/// Sends one handshake frame of the IPC control type (16) to `addr` and returns the reply.
pub fn control_message(addr: &str, json: &str) -> String {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut frame = ((json.len() + 2) as u64).to_le_bytes().to_vec();
    frame.push(16);
    frame.extend_from_slice(json.as_bytes());
    frame.push(b'\n');
    s.write_all(&frame).unwrap();
    let mut len = [0u8; 8];
    s.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; u64::from_le_bytes(len) as usize];
    s.read_exact(&mut body).unwrap();
    assert_eq!(body[0], 16, "reply of the request's type");
    String::from_utf8(body[1..].to_vec())
        .unwrap()
        .trim()
        .to_string()
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap()
        .trim()
        .to_string()
}

/// A stand-in importer that never answers: it accepts, reads one frame, keeps the
/// connection open and reports the frame's type byte and JSON.
fn silent_importer() -> (String, std::sync::mpsc::Receiver<(u8, String)>) {
    use std::io::Read;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        while let Ok((mut s, _)) = l.accept() {
            let mut len = [0u8; 8];
            if s.read_exact(&mut len).is_ok() {
                let mut body = vec![0u8; u64::from_le_bytes(len).min(1 << 20) as usize];
                if s.read_exact(&mut body).is_ok() && !body.is_empty() {
                    let text = String::from_utf8_lossy(&body[1..]).to_string();
                    let _ = tx.send((body[0], text));
                }
            }
            held.push(s);
        }
    });
    (addr, rx)
}

/// The memory contract across processes: the peer (exporter) unregisters a region this
/// engine (importer) writes into over IPC; `unregister` returns only after our mapping is
/// closed, our next write to it fails with `AddressRejected` without touching it, and
/// the rest of the allocation is reached over a newly opened handle.
pub fn unregister_revokes_peer_mappings(vendor: Vendor) {
    install_fake(vendor);
    let mut peer = IpcPeer::spawn(61, &[]);
    let e = engine_with(&[]);
    let (seg, len) = (peer.session.clone(), LEN as usize);
    let first = pattern(len, 7);
    let src = device_buffer(0, &first);
    sync(&e, &seg, &[Request::new(OpCode::Write, src, peer.a, LEN)]);
    assert_eq!(peer.hash(peer.a, LEN), fnv(&first));
    assert_eq!(ipc_counts(&e), (1, 0, 1));
    peer.unregister(peer.a);
    // Closed before the peer's unregister returned (it answered after it).
    assert_eq!(
        ipc_counts(&e),
        (1, 1, 0),
        "our mapping closed by the revocation"
    );
    // Our cached descriptor was dropped: the next write is refused without I/O.
    let second = pattern(len, 8);
    let src2 = device_buffer(0, &second);
    // SAFETY: `src2` outlives the call.
    let err = unsafe { e.transfer_sync(&seg, &[Request::new(OpCode::Write, src2, peer.a, LEN)]) }
        .unwrap_err()
        .to_string();
    assert!(err.contains("rejected remote range"), "{err}");
    assert_eq!(
        peer.hash(peer.a, LEN),
        fnv(&first),
        "unregistered memory modified after unregister returned"
    );
    // b shares a's allocation and is still registered: reached over a new mapping.
    sync(&e, &seg, &[Request::new(OpCode::Write, src2, peer.b, LEN)]);
    assert_eq!(peer.hash(peer.b, LEN), fnv(&second));
    assert_eq!(ipc_counts(&e), (2, 1, 1), "the allocation opened again");
    let c = ipc_metrics(&e);
    assert_eq!((c.connects, c.reconnects, c.retries), (2, 1, 0), "{c:?}");
    assert_eq!(peer.hash(peer.a, LEN), fnv(&first), "a untouched");
    // Again, with the unregistration racing a stream of writes: whatever happens to the
    // writes, nothing lands in b once unregister has returned.
    let stop = std::sync::atomic::AtomicBool::new(false);
    // Two sources written in turn, so that a late write would change the bytes.
    let sources = [
        device_buffer(0, &pattern(len, 9)),
        device_buffer(0, &pattern(len, 10)),
    ];
    let b = peer.b;
    let written = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let src = sources[i % 2];
                i += 1;
                // SAFETY: `sources` outlive the scope.
                let _ =
                    unsafe { e.transfer_sync(&seg, &[Request::new(OpCode::Write, src, b, LEN)]) };
                written.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        // Unregistered while writes go on: once two went through.
        assert!(
            wait_for(Duration::from_secs(10), || written
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 2),
            "the writes to b never got going"
        );
        peer.unregister(peer.b);
        let after = peer.hash(peer.b, LEN);
        // Lets the writer go on for a while: a write landing after unregister returned
        // would change the bytes within it.
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            peer.hash(peer.b, LEN),
            after,
            "b modified after unregister returned"
        );
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
}

/// An importer that never answers holds `unregister` for `MC_IPC_REVOKE_TIMEOUT` only;
/// one whose process is gone is not waited for.
pub fn revocation_is_bounded(vendor: Vendor) {
    install_fake(vendor);
    let mut peer = IpcPeer::spawn(71, &[("MC_IPC_REVOKE_TIMEOUT", "2")]);
    let e = engine_with(&[]);
    let bufs = e.segment_buffers(&peer.session).unwrap();
    let shm = |addr: u64| {
        bufs.iter()
            .find(|b| b.addr == addr)
            .unwrap()
            .shm_name
            .clone()
            .unwrap()
    };
    let opened = |handle: String, importer: &str, pid: u32| {
        serde_json::json!({
            "op": "opened", "shm_name": handle, "importer": importer,
            "pid": pid, "host_id": boot_id(),
        })
        .to_string()
    };
    // A dead importer of c: not waited for (it would hold the call for the timeout).
    let (silent, frames) = silent_importer();
    let mut child = Command::new("true").spawn().unwrap();
    child.wait().unwrap();
    let reply = control_message(&peer.session, &opened(shm(peer.c), &silent, child.id()));
    assert!(reply.contains(r#""ok":true"#), "{reply}");
    let t = Instant::now();
    peer.unregister(peer.c);
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "a dead importer held unregister for {:?}",
        t.elapsed()
    );
    assert!(
        frames.try_recv().is_err(),
        "no release sent to a dead importer"
    );
    // A live importer (this process) that never answers: the call returns at the timeout.
    let reply = control_message(
        &peer.session,
        &opened(shm(peer.a), &silent, std::process::id()),
    );
    assert!(reply.contains(r#""ok":true"#), "{reply}");
    let t = Instant::now();
    peer.unregister(peer.a);
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(1800) && took < Duration::from_secs(6),
        "unregister took {took:?} with a silent importer and MC_IPC_REVOKE_TIMEOUT=2"
    );
    let (kind, text) = frames.recv_timeout(Duration::from_secs(1)).unwrap();
    assert_eq!(kind, 16);
    assert!(
        text.contains(r#""op":"release""#) && text.contains(&shm(peer.a)),
        "{text}"
    );
    // The revoked handle is no longer accepted.
    let reply = control_message(
        &peer.session,
        &opened(shm(peer.c), &silent, std::process::id()),
    );
    assert!(reply.contains(r#""ok":false"#), "{reply}");
}

/// Malformed or lying control messages are refused with a reason; the engine keeps serving.
pub fn hostile_control_messages(vendor: Vendor) {
    install_fake(vendor);
    let mut peer = IpcPeer::spawn(81, &[]);
    let e = engine_with(&[]);
    let handle = e
        .segment_buffers(&peer.session)
        .unwrap()
        .into_iter()
        .find(|b| b.addr == peer.a)
        .unwrap()
        .shm_name
        .unwrap();
    let me = std::process::id();
    for bad in [
        String::from("not json"),
        String::from("{}"),
        String::from(r#"{"op":"opened"}"#),
        String::from(r#"{"op":"explode","shm_name":"00"}"#),
        serde_json::json!({"op":"opened","shm_name":handle,"importer":"x".repeat(1000),"pid":me,"host_id":boot_id()}).to_string(),
        serde_json::json!({"op":"opened","shm_name":handle,"importer":"127.0.0.1:1","pid":me,"host_id":"another-host"}).to_string(),
        serde_json::json!({"op":"opened","shm_name":"AB".repeat(64),"importer":"127.0.0.1:1","pid":me,"host_id":boot_id()}).to_string(),
        serde_json::json!({"op":"opened","shm_name":handle,"importer":"127.0.0.1:1","pid":-5,"host_id":boot_id()}).to_string(),
        serde_json::json!({"op":"release","shm_name":"zz","exporter":"a","revoked_at":"t"}).to_string(),
    ] {
        let reply = control_message(&peer.session, &bad);
        assert!(
            reply.contains(r#""ok":false"#) && reply.contains("error"),
            "{bad:.200} -> {reply}"
        );
    }
    // A release for a handle we never opened, sent to our engine: acknowledged, no effect.
    let reply = control_message(
        e.session_id(),
        &serde_json::json!({"op":"release","shm_name":handle,"exporter":"nobody:1","revoked_at":"2026-01-01 00:00:00.000000"}).to_string(),
    );
    assert!(reply.contains(r#""ok":true"#), "{reply}");
    // Still serving: a read over IPC, bytes verified.
    let dst = device_buffer(0, &vec![0u8; LEN as usize]);
    sync(
        &e,
        &peer.session,
        &[Request::new(OpCode::Read, dst, peer.a, LEN)],
    );
    assert!(device_bytes(dst, LEN as usize) == pattern(LEN as usize, 81));
    assert_eq!(peer.hash(peer.b, LEN), fnv(&pattern(LEN as usize, 82)));
}

/// A real importer process, stopped (SIGSTOP) while it holds a mapping of our memory:
/// our `unregister_memory` returns after `MC_IPC_REVOKE_TIMEOUT`; once it runs again it
/// handles the release late, and its next read of the range is refused.
pub fn stopped_importer(vendor: Vendor) {
    install_fake(vendor);
    let e = engine_with(&[("MC_IPC_REVOKE_TIMEOUT", "1")]);
    let mut peer = IpcPeer::spawn(93, &[]);
    let mine = device_buffer(0, &pattern(LEN as usize, 91));
    e.register_memory(mine, LEN, "*").unwrap();
    peer.pull(e.session_id(), mine, LEN).unwrap();
    assert_eq!(peer.hash(peer.c, LEN), fnv(&pattern(LEN as usize, 91)));
    peer.signal("STOP");
    let t = Instant::now();
    e.unregister_memory(mine).unwrap();
    let took = t.elapsed();
    peer.signal("CONT");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "unregister took {took:?} with a stopped importer and MC_IPC_REVOKE_TIMEOUT=1"
    );
    let refused = wait_for(Duration::from_secs(10), || {
        peer.pull(e.session_id(), mine, LEN)
            .is_err_and(|err| err.contains("rejected remote range"))
    });
    assert!(refused, "the importer still reads unregistered memory");
}

/// Eight threads' first requests to one allocation at once: one open (and one
/// announcement), every read over IPC with its bytes.
pub fn concurrent_first_use(vendor: Vendor) {
    install_fake(vendor);
    let peer = IpcPeer::spawn(95, &[]);
    let e = engine_with(&[]);
    let len = LEN as usize;
    let dsts: Vec<u64> = (0..8).map(|_| device_buffer(0, &vec![0u8; len])).collect();
    let barrier = std::sync::Barrier::new(dsts.len());
    std::thread::scope(|s| {
        for &dst in &dsts {
            let (e, barrier, seg, a) = (&e, &barrier, &peer.session, peer.a);
            s.spawn(move || {
                barrier.wait();
                sync(e, seg, &[Request::new(OpCode::Read, dst, a, LEN)]);
            });
        }
    });
    for &dst in &dsts {
        assert!(device_bytes(dst, len) == pattern(len, 95));
    }
    assert_eq!(
        ipc_counts(&e),
        (1, 0, 1),
        "one open for concurrent first uses"
    );
}

/// Requests whose ranges follow each other on both sides go in one device copy per copy
/// thread; scattered ones in one copy each. Bytes verified both ways. (The fake's copy
/// counter is process-wide: other tests only add to it, so the bounds allow for them.)
pub fn adjacent_requests_share_copies(vendor: Vendor) {
    install_fake(vendor);
    let mut peer = IpcPeer::spawn(97, &[]);
    let e = engine_with(&[]);
    let (seg, len) = (peer.session.clone(), LEN as usize);
    let block = 64u64 << 10;
    let n = 48u64;
    let data = pattern(len, 98);
    let src = device_buffer(0, &data);
    // Warm the mapping.
    sync(&e, &seg, &[Request::new(OpCode::Write, src, peer.a, block)]);
    let adjacent: Vec<Request> = (0..n)
        .map(|i| Request::new(OpCode::Write, src + i * block, peer.a + i * block, block))
        .collect();
    let before = crate::fake_gpu::stats()[1];
    sync(&e, &seg, &adjacent);
    let together = crate::fake_gpu::stats()[1] - before;
    assert_eq!(
        peer.hash(peer.a, n * block),
        fnv(&data[..(n * block) as usize])
    );
    // Reversed on the remote side: nothing follows anything.
    let reversed: Vec<Request> = (0..n)
        .map(|i| {
            Request::new(
                OpCode::Read,
                src + i * block,
                peer.b + (n - 1 - i) * block,
                block,
            )
        })
        .collect();
    let before = crate::fake_gpu::stats()[1];
    sync(&e, &seg, &reversed);
    let apart = crate::fake_gpu::stats()[1] - before;
    let b = pattern(len, 97 + 1); // the peer's b
    let got = device_bytes(src, (n * block) as usize);
    for i in 0..n as usize {
        let j = n as usize - 1 - i;
        let bs = block as usize;
        assert!(
            got[i * bs..(i + 1) * bs] == b[j * bs..(j + 1) * bs],
            "block {i}"
        );
    }
    assert!(together < 16, "{together} copies for {n} adjacent requests");
    assert!(apart >= n, "{apart} copies for {n} scattered requests");
}

/// A batch large enough to be handed to the copy threads in several groups while it is
/// still being cut, whose requests alternate adjacent (pairs that follow each other on
/// both sides, merged into one copy) and scattered (pairs placed in reverse order on the
/// peer): every byte lands, both ways. Prints the submit time per request (what the
/// caller waits before it gets the batch; no assertion on it: the fake runtime's copies
/// are host `memcpy`s).
pub fn alternating_adjacent_blocks(vendor: Vendor) {
    install_fake(vendor);
    let mut peer = IpcPeer::spawn(131, &[("MC_IPC_COPY_THREADS", "3")]);
    let e = engine_with(&[("MC_IPC_COPY_THREADS", "3")]);
    let (seg, len) = (peer.session.clone(), LEN as usize);
    let block = 8u64 << 10;
    let n = 384u64; // 3 MiB: several groups of the submit path's flush
    let data = pattern(len, 132);
    let src = device_buffer(0, &data);
    // Request i goes to pair slot (pairs - 1 - i/2), its half i%2: requests 2k and
    // 2k+1 follow each other; 2k+1 and 2k+2 do not.
    let pairs = n / 2;
    let remote_of = |i: u64| ((pairs - 1 - i / 2) * 2 + i % 2) * block;
    sync(&e, &seg, &[Request::new(OpCode::Write, src, peer.a, block)]);
    let writes: Vec<Request> = (0..n)
        .map(|i| Request::new(OpCode::Write, src + i * block, peer.a + remote_of(i), block))
        .collect();
    // Best of five: the machine running the tests is shared.
    let (mut submitted, mut done) = (Duration::MAX, Duration::MAX);
    for _ in 0..5 {
        let started = Instant::now();
        // SAFETY: `src` is test-owned and outlives the batch, waited on below.
        let batch = unsafe { e.submit(&seg, &writes) }.unwrap();
        submitted = submitted.min(started.elapsed());
        batch.wait().unwrap();
        done = done.min(started.elapsed());
    }
    eprintln!(
        "ipc submit ({vendor:?}): {n} requests of {block} bytes, alternating adjacent/scattered, \
         submitted in {submitted:?} ({:.2} us/request), done in {done:?} (best of 5)",
        submitted.as_secs_f64() * 1e6 / n as f64
    );
    let bs = block as usize;
    let mut expected = vec![0u8; (n * block) as usize];
    for i in 0..n {
        let at = remote_of(i) as usize;
        let from = i as usize * bs;
        expected[at..at + bs].copy_from_slice(&data[from..from + bs]);
    }
    assert_eq!(peer.hash(peer.a, n * block), fnv(&expected), "writes");
    // Reads: the peer's `b` back into our buffer, through the same layout.
    let reads: Vec<Request> = (0..n)
        .map(|i| Request::new(OpCode::Read, src + i * block, peer.b + remote_of(i), block))
        .collect();
    sync(&e, &seg, &reads);
    let b = pattern(len, 131 + 1); // the peer's b
    let got = device_bytes(src, (n * block) as usize);
    for i in 0..n {
        let at = remote_of(i) as usize;
        let from = i as usize * bs;
        assert!(got[from..from + bs] == b[at..at + bs], "read block {i}");
    }
}

/// The IPC transport's line for the topology dump.
pub fn ipc_line(e: &TransferEngine) -> String {
    e.transport_decisions()
        .into_iter()
        .find(|(p, _)| *p == "nvlink_intra" || *p == "musa")
        .expect("the IPC transport runs")
        .1
}

/// Scattered requests (placed in reverse order on the peer: no two follow each other) go
/// to the device in one batch call per copy thread's group where the runtime has one (the
/// fake's `cudaMemcpyBatchAsync`, read in the signature of the version it reports through
/// `FAKE_CUDART_VERSION`: `signature` names it), one `MemcpyAsync` each otherwise (MUSA,
/// or `MC_IPC_BATCH_COPY=0`); the transport's line says which; bytes verified both ways.
/// (The fake's counters are process-wide: other tests only add to them.)
pub fn scattered_requests_go_in_batches(vendor: Vendor, signature: &str) {
    install_fake(vendor);
    let mut peer = IpcPeer::spawn(151, &[]);
    let (seg, len) = (peer.session.clone(), LEN as usize);
    let block = 32u64 << 10;
    let n = 40u64;
    let data = pattern(len, 152);
    let src = device_buffer(0, &data);
    let remote = |i: u64| (n - 1 - i) * block;
    let mut expected = vec![0u8; (n * block) as usize];
    for i in 0..n {
        let (at, from) = (remote(i) as usize, (i * block) as usize);
        expected[at..at + block as usize].copy_from_slice(&data[from..from + block as usize]);
    }
    let b = pattern(len, 151 + 1); // the peer's b
    for (batch, env) in [(true, vec![]), (false, vec![("MC_IPC_BATCH_COPY", "0")])] {
        let e = engine_with(&env);
        let batch = batch && vendor == Vendor::Cuda;
        let line = ipc_line(&e);
        if batch {
            let want =
                format!("scattered slices go in one cudaMemcpyBatchAsync ({signature}) per group");
            assert!(line.contains(&want), "{line}");
        } else {
            assert!(line.contains("scattered slices go one by one ("), "{line}");
        }
        // Warm the mapping.
        sync(&e, &seg, &[Request::new(OpCode::Write, src, peer.c, block)]);
        let writes: Vec<Request> = (0..n)
            .map(|i| Request::new(OpCode::Write, src + i * block, peer.a + remote(i), block))
            .collect();
        let before = crate::fake_gpu::batch_stats();
        sync(&e, &seg, &writes);
        let after = crate::fake_gpu::batch_stats();
        assert_eq!(
            peer.hash(peer.a, n * block),
            fnv(&expected),
            "writes, batch {batch}"
        );
        if batch {
            assert!(
                after[0] > before[0],
                "no batch call: {before:?} -> {after:?}"
            );
            assert!(
                after[1] - before[1] >= n,
                "{before:?} -> {after:?} for {n} copies"
            );
        }
        let reads: Vec<Request> = (0..n)
            .map(|i| Request::new(OpCode::Read, src + i * block, peer.b + remote(i), block))
            .collect();
        sync(&e, &seg, &reads);
        let got = device_bytes(src, (n * block) as usize);
        for i in 0..n as usize {
            let (bs, at) = (block as usize, remote(i as u64) as usize);
            assert!(
                got[i * bs..(i + 1) * bs] == b[at..at + bs],
                "read block {i}, batch {batch}"
            );
        }
        // Back to the pattern for the next round.
        let rt = device::runtime().unwrap();
        // SAFETY: `src` is a fake device buffer of `len` bytes.
        unsafe { rt.copy(src as *mut u8, data.as_ptr(), len) }.unwrap();
    }
    if vendor == Vendor::Musa {
        assert_eq!(crate::fake_gpu::batch_stats()[0], 0, "MUSA never batches");
    }
}

/// Memory of the virtual-memory API (PyTorch's expandable segments): the descriptor
/// advertises `ipc_vmm` (no `shm_name`, which upstream peers would try to open), the
/// allocations under the region are handed over the descriptor socket and mapped back to
/// back once, reads and writes crossing their boundaries land, and the peer's
/// `unregister_memory` unmaps every piece before it returns.
pub fn virtual_memory_regions(vendor: Vendor) {
    install_fake(vendor);
    let mut peer = IpcPeer::spawn(101, &[]);
    let e = engine_with(&[]);
    let (seg, len) = (peer.session.clone(), LEN as usize);
    let bufs = e.segment_buffers(&seg).unwrap();
    let v = bufs.iter().find(|b| b.addr == peer.v).unwrap();
    assert_eq!(v.shm_name, None, "no legacy handle for virtual memory");
    let key = v
        .ipc_vmm
        .clone()
        .expect("virtual-memory buffers carry ipc_vmm");
    assert_eq!(key.len(), 128);
    assert_eq!(v.shm_offset, Some(VMM_OFFSET));
    assert_eq!(v.name, format!("{}:0", vendor.prefix()));
    let before = crate::fake_gpu::vmm_stats();

    // One read of the whole region, then writes of 64 KiB blocks (some crossing chunks).
    let local = device_buffer(1, &vec![0u8; len]);
    e.register_memory(local, LEN, "*").unwrap();
    sync(&e, &seg, &[Request::new(OpCode::Read, local, peer.v, LEN)]);
    assert!(
        device_bytes(local, len) == pattern(len, 105),
        "read of v differs"
    );
    let data = pattern(len, 7);
    let src = device_buffer(0, &data);
    let block = 64u64 << 10;
    let reqs: Vec<Request> = (0..LEN.div_ceil(block))
        .map(|i| {
            let off = i * block;
            Request::new(OpCode::Write, src + off, peer.v + off, block.min(LEN - off))
        })
        .collect();
    sync(&e, &seg, &reqs);
    assert_eq!(peer.hash(peer.v, LEN), fnv(&data), "written bytes differ");
    let (opened, _, open) = ipc_counts(&e);
    assert_eq!((opened, open), (1, 1), "one mapping for the region");
    let after = crate::fake_gpu::vmm_stats();
    assert_eq!(
        after[1] - before[1],
        4,
        "four chunks mapped: {before:?} -> {after:?}"
    );
    assert_eq!(after[3], 4, "four chunks mapped now");

    // Revocation: unmapped (every piece) before the peer's unregister returns.
    peer.unregister(peer.v);
    let gone = crate::fake_gpu::vmm_stats();
    assert_eq!(
        gone[3], 0,
        "pieces still mapped after unregister returned: {gone:?}"
    );
    assert_eq!(gone[2] - before[2], 4);
    assert_eq!(ipc_counts(&e).2, 0);
    let second = device_buffer(0, &pattern(len, 8));
    // SAFETY: `second` outlives the call.
    let err = unsafe { e.transfer_sync(&seg, &[Request::new(OpCode::Write, second, peer.v, LEN)]) }
        .unwrap_err()
        .to_string();
    assert!(err.contains("rejected remote range"), "{err}");
    assert_eq!(
        peer.hash(peer.v, LEN),
        fnv(&data),
        "v changed after unregister"
    );
    // The key is no longer served.
    let refused = control_message(
        &seg,
        &serde_json::json!({
            "op": "opened", "shm_name": key, "importer": "127.0.0.1:1",
            "pid": std::process::id(), "host_id": boot_id(),
        })
        .to_string(),
    );
    assert!(refused.contains(r#""ok":false"#), "{refused}");
}
