//! `transfer_engine_bench`: upstream-compatible flags, TCP or RDMA transport
//! (`--protocol=tcp|rdma|""`, `--device_name` the HCA list as `initialize` takes it).
//! Shared by the `transfer_engine_bench` binary and the wheel's console script.
//!
//! Both sides register their whole `--buffer_size` buffer (RDMA moves registered
//! memory only) and print `transport=...`: the protocol their segment descriptor
//! announces, so a run that fell back to TCP says so.
//!
//! Target: `--mode=target --metadata_server=P2PHANDSHAKE` prints
//! `segment_id=HOST:PORT` and serves until SIGINT/SIGTERM.
//! Initiator: `--segment_id=HOST:PORT --operation=write --block_size=4194304
//! --batch_size=64 --threads=2 --duration=10` prints GB/s, requests/s and the
//! batch latency percentiles; `--json` adds one machine-readable line.
//! `--segment_id=A,B,...` spreads the batches over several targets (each batch goes to
//! one). `--workload=serving` is vLLM's shape (10 threads, batches of 32 x 32 KiB writes),
//! `--workload=latency` one 4 KiB request at a time (its batch latency is the request's);
//! explicit `--block_size` / `--batch_size` / `--threads` override the preset.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use transfer_engine::wire::descriptor::SegmentDesc;
use transfer_engine::{
    Config, EngineError, HostBuffer, OpCode, Request, TransferEngine, TransportRequest,
};

mod cli;
mod summary;
mod workload;

use cli::{Flags, Mode, Operation};
use summary::{Latencies, Summary, Usage};
pub use workload::Workload;
use workload::{parse_segments, target_of, Shape};

/// Why a benchmark run stopped.
#[derive(Debug, thiserror::Error)]
enum BenchError {
    /// A flag's value cannot be used.
    #[error("{0}")]
    Usage(String),
    /// The environment's `MC_*` settings are invalid.
    #[error(transparent)]
    Config(#[from] transfer_engine::config::ConfigError),
    /// The engine refused a call.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A worker thread panicked.
    #[error("a benchmark thread panicked")]
    Panicked,
}

/// Runs the benchmark with `args` (the first is the program name); returns the exit status.
pub fn main_with_args(args: impl IntoIterator<Item = String>) -> i32 {
    let args: Vec<String> = args.into_iter().collect();
    let flags = match Flags::parse(&args) {
        Ok(Some(f)) => f,
        Ok(None) => {
            print!("{}", cli::HELP);
            return 0;
        }
        Err(e) => {
            eprintln!("transfer_engine_bench: {e}");
            return 2;
        }
    };
    match run(flags) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("transfer_engine_bench: {e}");
            1
        }
    }
}

fn run(flags: Flags) -> Result<(), BenchError> {
    transfer_engine::logging::init(transfer_engine::config::LogLevel::from_env_or(
        transfer_engine::config::LogLevel::Info,
    ));
    let config = Config::from_env()?;
    check_protocol(&flags.protocol)?;
    let shape = flags
        .workload
        .resolve(flags.block_size, flags.batch_size, flags.threads)
        .map_err(BenchError::Usage)?;
    if flags.buffer_size < shape.block_size {
        return Err(BenchError::Usage(
            "--buffer_size must be at least --block_size".into(),
        ));
    }
    let unit = unit_divisor(&flags.report_unit)?;
    let host = flags.local_server_name.clone().unwrap_or_else(hostname);
    if matches!(flags.mode, Mode::Target) {
        block_termination_signals();
    }
    let request = TransportRequest::new(&flags.protocol, &flags.device_name);
    let engine = TransferEngine::with_transports(&host, &flags.metadata_server, config, &request)?;
    let buffer = HostBuffer::try_new(flags.buffer_size as usize).ok_or_else(|| {
        BenchError::Usage(format!(
            "cannot allocate {} bytes for --buffer_size",
            flags.buffer_size
        ))
    })?;
    buffer.fill(0xCC);
    // Both sides register: RDMA moves registered memory only.
    engine.register_memory(buffer.addr(), flags.buffer_size, "cpu:0")?;
    match flags.mode {
        Mode::Target => {
            // `segment_id=` stays the first line: scripts wait for it.
            println!("segment_id={}", engine.session_id());
            print_transport(&engine);
            println!("buffer={:#x} size={}", buffer.addr(), flags.buffer_size);
            use std::io::Write;
            let _ = std::io::stdout().flush();
            wait_for_termination_signal();
            drop(engine);
            Ok(())
        }
        Mode::Initiator => {
            print_transport(&engine);
            initiate(&flags, shape, &engine, &buffer, unit)
        }
    }
}

/// One target of the run: its segment, and the remote buffer the batches address.
struct Target {
    segment: String,
    remote: u64,
    /// Bytes of the remote (and local) buffer that offsets wrap within.
    span: u64,
}

fn initiate(
    flags: &Flags,
    shape: Shape,
    engine: &TransferEngine,
    buffer: &HostBuffer,
    unit: (f64, &str),
) -> Result<(), BenchError> {
    let Shape {
        block_size,
        batch_size,
        threads,
    } = shape;
    let mut targets = Vec::new();
    for segment in parse_segments(&flags.segment_id).map_err(BenchError::Usage)? {
        let remote = engine
            .segment_buffers(&segment)?
            .into_iter()
            .max_by_key(|b| b.length)
            .ok_or_else(|| {
                BenchError::Usage(format!("the target {segment} registered no buffer"))
            })?;
        let span = flags.buffer_size.min(remote.length) / block_size * block_size;
        if span == 0 {
            return Err(BenchError::Usage(format!(
                "the buffer of {segment} is smaller than --block_size"
            )));
        }
        targets.push(Target {
            segment,
            remote: remote.addr,
            span,
        });
    }
    let op = match flags.operation() {
        Operation::Read => OpCode::Read,
        Operation::Write => OpCode::Write,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let usage_before = Usage::now();
    let started = Instant::now();
    let targets = &targets;
    let results: Vec<Result<(u64, Vec<Duration>), BenchError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|tid| {
                let stop = stop.clone();
                let local = buffer.addr();
                s.spawn(move || {
                    // Per target: this thread's batch, at the same offsets on both sides.
                    let batches: Vec<Vec<Request>> = targets
                        .iter()
                        .map(|t| {
                            (0..batch_size)
                                .map(|j| {
                                    let off = ((tid * batch_size + j) as u64 * block_size) % t.span;
                                    Request {
                                        op,
                                        local: local + off,
                                        remote: t.remote + off,
                                        len: block_size,
                                    }
                                })
                                .collect()
                        })
                        .collect();
                    let mut done = 0u64;
                    let mut latencies = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let k = target_of(tid, done, targets.len());
                        let (Some(target), Some(requests)) = (targets.get(k), batches.get(k))
                        else {
                            break;
                        };
                        let t = Instant::now();
                        // SAFETY: requests address our registered buffer, alive for the whole run.
                        unsafe { engine.transfer_sync(&target.segment, requests) }?;
                        latencies.push(t.elapsed());
                        done += 1;
                    }
                    Ok((done, latencies))
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(flags.duration));
        stop.store(true, Ordering::Relaxed);
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Err(BenchError::Panicked)))
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let usage = Usage::now().since(&usage_before);
    let mut batches = 0;
    let mut lat = Vec::new();
    for r in results {
        let (b, l) = r?;
        batches += b;
        lat.extend(l);
    }
    let latencies = Latencies::new(lat);
    let operation = format!("{:?}", flags.operation()).to_lowercase();
    let summary = Summary {
        workload: flags.workload.name(),
        operation: &operation,
        block_size,
        batch_size,
        threads,
        targets: targets.len(),
        elapsed_s: elapsed,
        batches,
        latencies: &latencies,
        usage,
    };
    let requests = summary.requests();
    let rate = summary.bytes() as f64 / elapsed / unit.0;
    println!(
        "Test completed: duration {elapsed:.2}, batch count {batches}, throughput {rate:.prec$} {}/s, {:.0} requests/s, batch latency p50 {:.1} us p99 {:.1} us",
        unit.1,
        requests as f64 / elapsed,
        latencies.quantile_us(0.5),
        latencies.quantile_us(0.99),
        prec = flags.report_precision
    );
    if flags.json {
        println!("{}", summary.json());
    }
    Ok(())
}

/// The protocols this benchmark runs: `tcp`, `rdma` and `""` (the engine picks). Others
/// (`nvlink`, ...) are refused before an engine starts.
fn check_protocol(protocol: &str) -> Result<(), BenchError> {
    if matches!(protocol, "tcp" | "rdma" | "") {
        return Ok(());
    }
    Err(BenchError::Usage(format!(
        "--protocol={protocol} is not served by this benchmark; use tcp, rdma or \"\" (automatic)"
    )))
}

/// The protocol our segment descriptor announces, as peers decode it (what they use
/// to reach us): `rdma` when the RDMA transport runs, `tcp` after a fallback.
fn print_transport(engine: &TransferEngine) {
    let encoded = engine.local_descriptor().encode();
    let protocol = match SegmentDesc::decode(&encoded) {
        Ok(desc) => desc.protocol.join(","),
        Err(e) => format!("unknown ({e})"),
    };
    println!("transport={protocol}");
}

fn unit_divisor(unit: &str) -> Result<(f64, &'static str), BenchError> {
    Ok(match unit {
        "GB" => (1e9, "GB"),
        "GiB" => (1073741824.0, "GiB"),
        "Gb" => (1.25e8, "Gb"),
        "MB" => (1e6, "MB"),
        "MiB" => (1048576.0, "MiB"),
        "Mb" => (1.25e5, "Mb"),
        "KB" => (1e3, "KB"),
        "KiB" => (1024.0, "KiB"),
        "Kb" => (125.0, "Kb"),
        other => {
            return Err(BenchError::Usage(format!(
                "--report_unit={other} is not one of GB GiB Gb MB MiB Mb KB KiB Kb"
            )))
        }
    })
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its length.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn termination_set() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a local value.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

/// Blocks SIGINT/SIGTERM in this thread and every thread it starts, so the
/// calling thread can wait for them with `sigwait`.
fn block_termination_signals() {
    let set = termination_set();
    // SAFETY: valid set; a null old-set pointer is allowed.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

fn wait_for_termination_signal() {
    let set = termination_set();
    let mut sig = 0;
    // SAFETY: valid set and output pointer.
    unsafe { libc::sigwait(&set, &mut sig) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_rdma_and_automatic_are_accepted_other_protocols_are_refused() {
        for ok in ["tcp", "rdma", ""] {
            assert!(check_protocol(ok).is_ok(), "{ok:?}");
        }
        for refused in ["nvlink", "RDMA", "efa"] {
            let err = check_protocol(refused).unwrap_err().to_string();
            assert!(err.contains(&format!("--protocol={refused} ")), "{err}");
            assert!(err.contains("tcp, rdma"), "{err}");
        }
    }

    #[test]
    fn workload_flags_parse_and_explicit_sizes_win() {
        let args = [
            "bench",
            "--workload=serving",
            "--segment_id=127.0.0.1:1,127.0.0.1:2",
            "--threads=3",
        ]
        .map(String::from);
        let f = Flags::parse(&args).unwrap().unwrap();
        assert_eq!(f.workload, Workload::Serving);
        let shape = f
            .workload
            .resolve(f.block_size, f.batch_size, f.threads)
            .unwrap();
        assert_eq!(
            (shape.block_size, shape.batch_size, shape.threads),
            (32768, 32, 3)
        );
        assert_eq!(parse_segments(&f.segment_id).unwrap().len(), 2);
        assert!(Flags::parse(&["bench", "--workload=bulk"].map(String::from)).is_err());
    }
}
