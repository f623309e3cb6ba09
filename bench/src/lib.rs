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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{ArgAction, Parser, ValueEnum};

use transfer_engine::wire::descriptor::SegmentDesc;
use transfer_engine::{
    Config, EngineError, HostBuffer, OpCode, Request, TransferEngine, TransportRequest,
};

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

#[derive(Parser, Debug)]
#[command(
    name = "transfer_engine_bench",
    about = "Transfer engine throughput benchmark (TCP or RDMA)"
)]
struct Flags {
    /// initiator or target
    #[arg(long, value_enum, default_value = "initiator")]
    mode: Mode,
    /// read or write
    #[arg(long, value_enum, default_value = "read")]
    operation: Operation,
    /// transport protocol: tcp, rdma, or "" (the engine picks); upstream defaults to rdma
    #[arg(long, default_value = "tcp")]
    protocol: String,
    /// metadata connection string
    #[arg(long = "metadata_server", default_value = "P2PHANDSHAKE")]
    metadata_server: String,
    /// local server name (host; the port is chosen in P2P mode)
    #[arg(long = "local_server_name")]
    local_server_name: Option<String>,
    /// target segment id (`host:rpc_port` printed by the target)
    #[arg(long = "segment_id", default_value = "")]
    segment_id: String,
    /// RDMA device list (comma-separated HCA names; empty: all)
    #[arg(long = "device_name", default_value = "")]
    device_name: String,
    /// accepted for compatibility
    #[arg(long = "auto_discovery", action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    auto_discovery: bool,
    /// bytes of registered buffer
    #[arg(long = "buffer_size", default_value_t = 1 << 30)]
    buffer_size: u64,
    /// requests per batch
    #[arg(long = "batch_size", default_value_t = 128)]
    batch_size: usize,
    /// bytes per request
    #[arg(long = "block_size", default_value_t = 65536)]
    block_size: u64,
    /// seconds to run
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// submitting threads
    #[arg(long, default_value_t = 12)]
    threads: usize,
    /// GB, GiB, Gb, MB, MiB, Mb, KB, KiB, Kb
    #[arg(long = "report_unit", default_value = "GB")]
    report_unit: String,
    /// digits after the point
    #[arg(long = "report_precision", default_value_t = 2)]
    report_precision: usize,
    /// also print one JSON line with the figures
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Mode {
    Initiator,
    Target,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq)]
enum Operation {
    Read,
    Write,
}

/// Runs the benchmark with `args` (the first is the program name); returns the exit status.
pub fn main_with_args<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let flags = match Flags::try_parse_from(args) {
        Ok(f) => f,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
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
    let config = Config::from_env()?;
    transfer_engine::logging::init(config.log_level);
    check_protocol(&flags.protocol)?;
    if flags.block_size == 0 || flags.batch_size == 0 || flags.threads == 0 {
        return Err(BenchError::Usage(
            "--block_size, --batch_size and --threads must be positive".into(),
        ));
    }
    if flags.buffer_size < flags.block_size {
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
            initiate(&flags, &engine, &buffer, unit)
        }
    }
}

fn initiate(
    flags: &Flags,
    engine: &TransferEngine,
    buffer: &HostBuffer,
    unit: (f64, &str),
) -> Result<(), BenchError> {
    if flags.segment_id.is_empty() {
        return Err(BenchError::Usage(
            "--segment_id is required in initiator mode (the target prints it)".into(),
        ));
    }
    let remote = engine
        .segment_buffers(&flags.segment_id)?
        .into_iter()
        .max_by_key(|b| b.length)
        .ok_or_else(|| BenchError::Usage("the target registered no buffer".into()))?;
    let span = flags.buffer_size.min(remote.length) / flags.block_size * flags.block_size;
    if span == 0 {
        return Err(BenchError::Usage(
            "the target's buffer is smaller than --block_size".into(),
        ));
    }
    let op = match flags.operation {
        Operation::Read => OpCode::Read,
        Operation::Write => OpCode::Write,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let results: Vec<Result<(u64, Vec<Duration>), BenchError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..flags.threads)
            .map(|tid| {
                let stop = stop.clone();
                let (local, remote_base) = (buffer.addr(), remote.addr);
                s.spawn(move || {
                    let requests: Vec<Request> = (0..flags.batch_size)
                        .map(|j| {
                            let off =
                                ((tid * flags.batch_size + j) as u64 * flags.block_size) % span;
                            Request {
                                op,
                                local: local + off,
                                remote: remote_base + off,
                                len: flags.block_size,
                            }
                        })
                        .collect();
                    let mut batches = 0u64;
                    let mut latencies = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let t = Instant::now();
                        // SAFETY: requests address our registered buffer, alive for the whole run.
                        unsafe { engine.transfer_sync(&flags.segment_id, &requests) }?;
                        latencies.push(t.elapsed());
                        batches += 1;
                    }
                    Ok((batches, latencies))
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
    let mut batches = 0;
    let mut lat = Vec::new();
    for r in results {
        let (b, l) = r?;
        batches += b;
        lat.extend(l);
    }
    lat.sort();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 - 1.0) * p).round() as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    let requests = batches * flags.batch_size as u64;
    let bytes = requests * flags.block_size;
    let rate = bytes as f64 / elapsed / unit.0;
    println!(
        "Test completed: duration {elapsed:.2}, batch count {batches}, throughput {rate:.prec$} {}/s, {:.0} requests/s, batch latency p50 {:.1} us p99 {:.1} us",
        unit.1,
        requests as f64 / elapsed,
        pct(0.5),
        pct(0.99),
        prec = flags.report_precision
    );
    if flags.json {
        println!(
            "{}",
            serde_json::json!({
                "operation": format!("{:?}", flags.operation).to_lowercase(),
                "block_size": flags.block_size, "batch_size": flags.batch_size, "threads": flags.threads,
                "duration_s": elapsed, "batches": batches, "requests": requests, "bytes": bytes,
                "gb_per_s": bytes as f64 / elapsed / 1e9, "requests_per_s": requests as f64 / elapsed,
                "latency_p50_us": pct(0.5), "latency_p99_us": pct(0.99),
            })
        );
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
}
