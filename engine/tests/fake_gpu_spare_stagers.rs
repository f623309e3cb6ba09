//! Our own lanes and receivers hold pinned staging memory only while they move device
//! memory: one that runs out of work gives its stager back as a spare, which the next
//! thread that needs one takes (on any link), and spares nobody took for
//! `MC_TCP_LINK_IDLE_SEC` are freed, as are the data server's idle stagers. Counted with
//! the FAKE runtime (fake_gpu/fake_runtime.c), which counts pinned allocations; its own
//! test binary: the counts are per process.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]
mod fake_gpu;

use std::time::{Duration, Instant};

use fake_gpu::{device_buffer, device_bytes, install_fake, pattern, pinned, requests, stats};
use transfer_engine::device::staging::{CHUNK, STAGER_BYTES};
use transfer_engine::device::{spare_stagers, staging_pool, Vendor};
use transfer_engine::{Config, HostBuffer, OpCode, TransferEngine};

/// The fake's counters and the spares are process-wide: one test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

const LANES: usize = 4;

fn engine_with(lanes: usize, idle: Duration) -> TransferEngine {
    install_fake(Vendor::Cuda);
    let mut config = Config::from_env().unwrap();
    config.tcp_lanes_per_peer = lanes;
    config.tcp_lane_budget = lanes;
    config.tcp_link_idle_timeout = idle;
    TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", config).unwrap()
}

/// Writes `len` bytes out of device memory at `src` into `target`'s `dst`, then reads
/// them back into device memory at `back`, as batches of `CHUNK`-sized requests (every
/// lane and receiver of the link stages), and checks the bytes.
fn round_trip(initiator: &TransferEngine, target: &TransferEngine, src: u64, back: u64) {
    let len = 4 * LANES * CHUNK;
    let dst = HostBuffer::new(len);
    target.register_memory(dst.addr(), len as u64, "*").unwrap();
    let seg = target.session_id().to_string();
    let n = len / CHUNK;
    let writes = requests(OpCode::Write, src, dst.addr(), n, CHUNK);
    // SAFETY: both buffers are test-owned and outlive the batch (waited for).
    unsafe { initiator.submit(&seg, &writes) }
        .unwrap()
        .wait()
        .unwrap();
    let reads = requests(OpCode::Read, back, dst.addr(), n, CHUNK);
    // SAFETY: as above.
    unsafe { initiator.submit(&seg, &reads) }
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        device_bytes(back, len),
        device_bytes(src, len),
        "the bytes read back differ from those written"
    );
    target.unregister_memory(dst.addr()).unwrap();
}

/// Waits (up to 20 s) for `done`; false if it never came.
fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > Duration::from_secs(20) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Pinned allocations per stager (two chunks).
const ALLOCS_PER_STAGER: u64 = (STAGER_BYTES / CHUNK) as u64;

/// Stagers pinned now beyond the data servers': our lanes' and receivers', and spares.
fn ours_pinned() -> u64 {
    pinned()[0] / ALLOCS_PER_STAGER - staging_pool::live_stagers() as u64
}

/// Device memory moved to and from four peers in turn, through links of 4 lanes: the
/// lanes and receivers of each link take the stagers those of the link before gave back,
/// so pinned memory stays at one link's worth (4 lanes and 4 receivers), not four.
#[test]
fn links_used_in_turn_share_their_staging_memory() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let initiator = engine_with(LANES, Duration::from_secs(120));
    let targets: Vec<TransferEngine> = (0..4)
        .map(|_| engine_with(LANES, Duration::from_secs(120)))
        .collect();
    let len = 4 * LANES * CHUNK;
    let src = device_buffer(0, &pattern(len, 7));
    let back = device_buffer(0, &vec![0u8; len]);
    initiator.register_memory(src, len as u64, "*").unwrap();
    initiator.register_memory(back, len as u64, "*").unwrap();

    let allocs_before = stats()[2];
    for target in &targets {
        round_trip(&initiator, target, src, back);
        // The link's threads give their stagers back once out of work, just after the
        // batch completes.
        assert!(
            eventually(|| spare_stagers::count() >= 2),
            "no stager was given back after a round trip ({} spare)",
            spare_stagers::count()
        );
        // The others follow: every stager of ours (those pinned beyond the data servers')
        // is a spare before the next link begins.
        assert!(
            eventually(|| spare_stagers::count() as u64 == ours_pinned()),
            "{} spares of {} stagers of ours after a round trip",
            spare_stagers::count(),
            ours_pinned()
        );
    }
    let allocated = (stats()[2] - allocs_before) / ALLOCS_PER_STAGER;
    // One link at a time stages through at most its 4 lanes and 4 receivers.
    let one_link = 2 * LANES as u64;
    assert!(
        allocated <= one_link,
        "{allocated} stagers were allocated for four links used in turn; one link's worth \
         ({one_link}) should have been reused"
    );
    // (Less the data server's: the other test of this binary may leave some idle.)
    let alive = pinned()[0] / ALLOCS_PER_STAGER - staging_pool::live_stagers() as u64;
    assert!(
        alive <= one_link,
        "{alive} stagers stay pinned after four links went quiet (at most {one_link})"
    );
    // None of them is held by a thread: all are spares, for whichever link works next.
    assert_eq!(spare_stagers::count() as u64, alive);
}

/// A process that stops moving device memory frees its staging memory, on both sides:
/// the spares of its lanes and receivers, and the data server's idle stagers, once
/// unused for `MC_TCP_LINK_IDLE_SEC`.
#[test]
fn an_idle_process_frees_its_staging_memory() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let idle = Duration::from_secs(1);
    let initiator = engine_with(LANES, idle);
    // The target's memory is device memory too: its data server stages through the pool.
    let target = engine_with(LANES, idle);
    let len = 4 * LANES * CHUNK;
    let src = device_buffer(0, &pattern(len, 9));
    let dst = device_buffer(0, &vec![0u8; len]);
    initiator.register_memory(src, len as u64, "*").unwrap();
    target.register_memory(dst, len as u64, "*").unwrap();
    let seg = target.session_id().to_string();
    let writes = requests(OpCode::Write, src, dst, len / CHUNK, CHUNK);
    // SAFETY: both buffers are test-owned and outlive the batch (waited for).
    unsafe { initiator.submit(&seg, &writes) }
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(device_bytes(dst, len), device_bytes(src, len));
    assert!(
        pinned()[0] > 0 && staging_pool::live_stagers() > 0,
        "both sides staged: {:?} pinned allocations, {} server stagers",
        pinned(),
        staging_pool::live_stagers()
    );

    let freed = eventually(|| pinned()[0] == 0);
    assert!(
        freed,
        "{} pinned allocations still alive long after the engines went idle ({} spares, {} \
         server stagers)",
        pinned()[0],
        spare_stagers::count(),
        staging_pool::live_stagers()
    );
    assert_eq!(spare_stagers::count(), 0);
    assert_eq!(staging_pool::live_stagers(), 0);

    // And staging comes back when work does.
    let back = device_buffer(0, &vec![0u8; len]);
    initiator.register_memory(back, len as u64, "*").unwrap();
    let reads = requests(OpCode::Read, back, dst, len / CHUNK, CHUNK);
    // SAFETY: as above.
    unsafe { initiator.submit(&seg, &reads) }
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(device_bytes(back, len), device_bytes(src, len));
}

/// Dropping the engines frees their staging memory at once, without waiting for
/// `MC_TCP_LINK_IDLE_SEC`: lanes, receivers and data server threads give their stagers back
/// as they stop, and nobody is left to take them.
#[test]
fn dropped_engines_leave_no_staging_memory() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let idle = Duration::from_secs(120);
    let initiator = engine_with(LANES, idle);
    let target = engine_with(LANES, idle);
    let len = 4 * LANES * CHUNK;
    let src = device_buffer(0, &pattern(len, 11));
    let dst = device_buffer(0, &vec![0u8; len]);
    initiator.register_memory(src, len as u64, "*").unwrap();
    target.register_memory(dst, len as u64, "*").unwrap();
    let seg = target.session_id().to_string();
    for op in [OpCode::Write, OpCode::Read] {
        let reqs = requests(op, src, dst, len / CHUNK, CHUNK);
        // SAFETY: both buffers are test-owned and outlive the batch (waited for).
        unsafe { initiator.submit(&seg, &reqs) }
            .unwrap()
            .wait()
            .unwrap();
    }
    assert!(pinned()[0] > 0, "nothing was staged");
    drop(initiator);
    drop(target);
    // The data server's connection threads stop on their own after it closes them.
    let freed = eventually(|| pinned()[0] == 0);
    assert!(
        freed,
        "{} pinned allocations alive after both engines were dropped ({} spares, {} server \
         stagers)",
        pinned()[0],
        spare_stagers::count(),
        staging_pool::live_stagers()
    );
}
