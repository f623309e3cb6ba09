//! Helpers shared by the end-to-end tests: the upstream wheel's python and the CLI peer
//! driven by it (`tests/interop/upstream_peer.py`), child processes with deadlines that
//! are killed on drop, page-aligned buffers, and the interop data pattern.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, Once, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod netns;

/// The longest any test waits on a child process (start-up, one command, one run).
pub const CHILD_DEADLINE: Duration = Duration::from_secs(60);

/// The repository root (the workspace that holds this crate).
pub fn repo_root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

/// `tests/interop/upstream_peer.py`.
pub fn peer_script() -> PathBuf {
    repo_root().join("tests/interop/upstream_peer.py")
}

/// The python of the venv that holds the upstream wheel: `$UPSTREAM_PYTHON`, else
/// `<repo>/.venv-upstream/bin/python`; `Err` says which path is missing and how to make it.
pub fn find_upstream_python() -> Result<PathBuf, String> {
    let (path, from) = match std::env::var_os("UPSTREAM_PYTHON") {
        Some(p) if !p.is_empty() => (PathBuf::from(p), "$UPSTREAM_PYTHON"),
        _ => (
            repo_root().join(".venv-upstream/bin/python"),
            "the default venv",
        ),
    };
    if !path.exists() {
        return Err(format!(
            "the upstream wheel's python is missing: {} (from {from}) does not exist.\n\
             Run `scripts/setup-upstream.sh` (it creates {}/.venv-upstream with \
             mooncake-transfer-engine-non-cuda and prints its python), or point \
             UPSTREAM_PYTHON at a python that can `from mooncake.engine import TransferEngine`.",
            path.display(),
            repo_root().display()
        ));
    }
    Ok(path)
}

/// [`find_upstream_python`], panicking (the test fails, it is not skipped) when it is
/// missing.
pub fn upstream_python() -> PathBuf {
    find_upstream_python().unwrap_or_else(|e| panic!("{e}"))
}

/// Installs our engine's log subscriber once: level from `MC_LOG_LEVEL` when set, else
/// warnings only (so `--nocapture` output stays readable).
pub fn init_logging() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let level = transfer_engine::config::LogLevel::from_env_or(
            transfer_engine::config::LogLevel::Warning,
        );
        transfer_engine::logging::init(level);
    });
}

// ---------------------------------------------------------------------------------------
// Data pattern (the same as upstream_peer.py's)
// ---------------------------------------------------------------------------------------

/// Byte `i` of `pattern(seed)`; `i` is the offset from the start of the buffer.
pub fn pattern_byte(i: u64, seed: u64) -> u8 {
    (i.wrapping_mul(131)
        .wrapping_add(seed.wrapping_mul(7))
        .wrapping_add(i >> 8)
        .wrapping_add(i >> 16)) as u8
}

/// Fills `dst` with `pattern(seed)[offset .. offset + dst.len()]`.
pub fn fill_pattern(dst: &mut [u8], seed: u64, offset: u64) {
    for (k, b) in dst.iter_mut().enumerate() {
        *b = pattern_byte(offset + k as u64, seed);
    }
}

/// The pattern offset of the first byte of `data` that differs from
/// `pattern(seed)[offset ..]`, or `None` when all match.
pub fn first_mismatch(data: &[u8], seed: u64, offset: u64) -> Option<u64> {
    data.iter()
        .enumerate()
        .find(|&(k, &b)| b != pattern_byte(offset + k as u64, seed))
        .map(|(k, _)| offset + k as u64)
}

/// A deterministic permutation of `0..n` (Fisher–Yates driven by an xorshift).
pub fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

// ---------------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------------

/// A page-aligned, zeroed heap buffer.
pub use transfer_engine::HostBuffer as Buf;

/// `fill_pattern` into `len` bytes of `buf` at `at` (the buffer lends no `&mut [u8]`).
/// Panics when the range is outside the buffer: a mistake in the calling test.
#[allow(
    clippy::expect_used,
    reason = "test support: a bad range is a bug in the test"
)]
pub fn fill_pattern_at(buf: &Buf, at: u64, len: u64, seed: u64, offset: u64) {
    let mut bytes = vec![0u8; len as usize];
    fill_pattern(&mut bytes, seed, offset);
    buf.write_at(at as usize, &bytes)
        .expect("pattern range inside the buffer");
}

// ---------------------------------------------------------------------------------------
// Child processes
// ---------------------------------------------------------------------------------------

/// A handle that the `Command` was told to pipe (`Stdio::piped()`): std hands it over
/// on spawn, once, and it is taken once, right after.
#[allow(
    clippy::expect_used,
    reason = "infallible: only called on handles configured as Stdio::piped(), just spawned"
)]
fn piped<T>(handle: Option<T>) -> T {
    handle.expect("a piped handle of a freshly spawned child")
}

/// The lines `r` delivers, read by a background thread until its end.
pub fn line_channel(r: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

/// A child process that is killed (and reaped) when dropped.
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    /// Waits for the exit until `deadline`; `None` (child killed) when it passes.
    pub fn wait_until(&mut self, deadline: Instant) -> Option<ExitStatus> {
        loop {
            match self.0.try_wait() {
                Ok(Some(st)) => return Some(st),
                Ok(None) if Instant::now() >= deadline => {
                    let _ = self.0.kill();
                    let _ = self.0.wait();
                    return None;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => panic!("waiting for child {}: {e}", self.0.id()),
            }
        }
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// Everything a pipe delivered, collected by a background thread.
#[derive(Clone, Default)]
pub struct Collected(Arc<Mutex<Vec<u8>>>);

impl Collected {
    fn spawn(mut r: impl Read + Send + 'static) -> (Self, JoinHandle<()>) {
        let c = Self::default();
        let c2 = c.clone();
        let h = std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            while let Ok(n) = r.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                c2.bytes().extend_from_slice(&chunk[..n]);
            }
        });
        (c, h)
    }
    /// The bytes so far; a reader that panicked leaves whole chunks, so they stay usable.
    fn bytes(&self) -> MutexGuard<'_, Vec<u8>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
    /// All of it, lossily decoded.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes()).into_owned()
    }
    /// Its last `n` lines.
    pub fn tail(&self, n: usize) -> String {
        let t = self.text();
        let lines: Vec<&str> = t.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// A command that runs `upstream_peer.py ARGS` with the upstream python, `MC_FORCE_TCP=1`,
/// from `/` (so nothing in the repository shadows the wheel's `mooncake` package).
pub fn upstream_command(args: &[String]) -> Command {
    let mut cmd = Command::new(upstream_python());
    cmd.arg(peer_script())
        .args(args)
        .env("MC_FORCE_TCP", "1")
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir("/");
    cmd
}

/// [`upstream_command`] for an upstream engine on RDMA: `--protocol rdma --device
/// DEVICES` after `args`, and no `MC_FORCE_TCP`.
pub fn upstream_rdma_command(args: &[String], devices: &str) -> Command {
    let mut args = args.to_vec();
    args.extend(["--protocol", "rdma", "--device", devices].map(String::from));
    let mut cmd = upstream_command(&args);
    cmd.env_remove("MC_FORCE_TCP");
    cmd
}

/// How a finished `upstream_peer.py` run ended.
#[derive(Debug)]
pub struct Finished {
    /// Exit status.
    pub status: ExitStatus,
    /// Its JSON lines.
    pub stdout: String,
    /// Its diagnostics and the engine's log.
    pub stderr: String,
    /// How long it ran.
    pub elapsed: Duration,
}

impl Finished {
    /// The last stdout line as JSON (panics with the output when there is none).
    pub fn last_json(&self) -> Value {
        let line = self
            .stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or_else(|| {
                panic!(
                    "upstream_peer.py printed no JSON ({}); stderr:\n{}",
                    self.status,
                    tail(&self.stderr, 40)
                )
            });
        serde_json::from_str(line).unwrap_or_else(|e| {
            panic!(
                "upstream_peer.py printed {line:?}, not JSON ({e}); stderr:\n{}",
                tail(&self.stderr, 40)
            )
        })
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs `upstream_peer.py ARGS` to completion; panics (after killing it) if it runs past
/// `limit`.
pub fn run_upstream(args: &[String], limit: Duration) -> Finished {
    run_upstream_command(upstream_command(args), limit)
}

/// [`run_upstream`] with a command made by [`upstream_command`] or
/// [`upstream_rdma_command`].
pub fn run_upstream_command(mut cmd: Command, limit: Duration) -> Finished {
    let args: Vec<String> = cmd
        .get_args()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let started = Instant::now();
    let mut child = KillOnDrop(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", upstream_python().display())),
    );
    let (out, out_h) = Collected::spawn(piped(child.0.stdout.take()));
    let (err, err_h) = Collected::spawn(piped(child.0.stderr.take()));
    let status = child.wait_until(started + limit);
    let _ = out_h.join();
    let _ = err_h.join();
    let Some(status) = status else {
        panic!(
            "upstream_peer.py {args:?} still running after {limit:?}: killed.\nstdout:\n{}\nstderr:\n{}",
            out.text(),
            err.tail(40)
        );
    };
    Finished {
        status,
        stdout: out.text(),
        stderr: err.text(),
        elapsed: started.elapsed(),
    }
}

/// An upstream engine in `target` mode: a registered buffer holding `pattern(seed)`,
/// answering `dump` / `check` / `ping` / `notifies` commands on its stdin.
pub struct UpstreamTarget {
    child: KillOnDrop,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Collected,
    /// Its session id, `127.0.0.1:RPC_PORT`.
    pub session_id: String,
    /// Address of its registered buffer (in its process).
    pub buffer: u64,
    /// Length of the buffer.
    pub size: u64,
}

impl UpstreamTarget {
    /// Starts a target with `size` bytes holding `pattern(seed)` and waits for its hello line.
    pub fn spawn(size: u64, seed: u64) -> Self {
        Self::spawn_command(upstream_command(&Self::args(size, seed)), size)
    }

    /// [`spawn`](Self::spawn) on RDMA over the HCAs `devices` ([`upstream_rdma_command`]).
    pub fn spawn_rdma(size: u64, seed: u64, devices: &str) -> Self {
        Self::spawn_command(
            upstream_rdma_command(&Self::args(size, seed), devices),
            size,
        )
    }

    fn args(size: u64, seed: u64) -> Vec<String> {
        let args = [
            "target",
            "--size",
            &size.to_string(),
            "--pattern-seed",
            &seed.to_string(),
        ];
        args.iter().map(|s| s.to_string()).collect()
    }

    fn spawn_command(mut cmd: Command, size: u64) -> Self {
        let mut child = KillOnDrop(
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", upstream_python().display())),
        );
        let stdin = child.0.stdin.take();
        let stdout = piped(child.0.stdout.take());
        let (stderr, _) = Collected::spawn(piped(child.0.stderr.take()));
        let lines = line_channel(stdout);
        let mut t = Self {
            child,
            stdin,
            lines,
            stderr,
            session_id: String::new(),
            buffer: 0,
            size: 0,
        };
        let hello = t.next_line("the target's hello line");
        let v: Value = serde_json::from_str(&hello).unwrap_or_else(|e| {
            panic!(
                "target hello {hello:?} is not JSON: {e}\n{}",
                t.stderr.tail(40)
            )
        });
        assert_eq!(
            v["ok"],
            Value::Bool(true),
            "target failed to start: {v}\n{}",
            t.stderr.tail(40)
        );
        match (
            v["session_id"].as_str(),
            v["buffer"].as_u64(),
            v["size"].as_u64(),
        ) {
            (Some(sid), Some(buffer), Some(got)) => {
                (t.session_id, t.buffer, t.size) = (sid.to_string(), buffer, got);
            }
            _ => panic!("target hello {v} lacks session_id, buffer or size"),
        }
        assert_eq!(t.size, size);
        t
    }

    fn next_line(&mut self, what: &str) -> String {
        match self.lines.recv_timeout(CHILD_DEADLINE) {
            Ok(l) => l,
            Err(RecvTimeoutError::Timeout) => {
                let _ = self.child.0.kill();
                panic!(
                    "no {what} from the upstream target within {CHILD_DEADLINE:?}; stderr:\n{}",
                    self.stderr.tail(40)
                )
            }
            Err(RecvTimeoutError::Disconnected) => {
                let st = self
                    .child
                    .wait_until(Instant::now() + Duration::from_secs(5));
                panic!(
                    "upstream target exited ({st:?}) before {what}; stderr:\n{}",
                    self.stderr.tail(40)
                )
            }
        }
    }

    /// Sends one command line and returns its one-line answer.
    pub fn command(&mut self, cmd: &str) -> String {
        let Some(stdin) = self.stdin.as_mut() else {
            panic!("cannot send {cmd:?}: the upstream target's stdin is closed (finished)");
        };
        writeln!(stdin, "{cmd}")
            .and_then(|_| stdin.flush())
            .unwrap_or_else(|e| {
                panic!(
                    "cannot send {cmd:?} to the upstream target: {e}; stderr:\n{}",
                    self.stderr.tail(40)
                )
            });
        self.next_line(&format!("answer to {cmd:?}"))
    }

    /// `check OFFSET LEN SEED`: "ok" or "mismatch at OFFSET".
    pub fn check(&mut self, offset: u64, len: u64, seed: u64) -> String {
        self.command(&format!("check {offset} {len} {seed}"))
    }

    /// `dump OFFSET LEN`: the sha256 hex digest of the range.
    pub fn dump(&mut self, offset: u64, len: u64) -> String {
        let d = self.command(&format!("dump {offset} {len}"));
        assert_eq!(d.len(), 64, "dump answered {d:?}");
        d
    }

    /// The notifications it received since the last call, as (name, msg).
    pub fn notifies(&mut self) -> Vec<(String, String)> {
        let line = self.command("notifies");
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("notifies answered {line:?}: {e}"));
        let parsed = v.as_array().and_then(|all| {
            all.iter()
                .map(|n| {
                    Some((
                        n["name"].as_str()?.to_string(),
                        n["msg"].as_str()?.to_string(),
                    ))
                })
                .collect::<Option<Vec<_>>>()
        });
        parsed.unwrap_or_else(|| panic!("notifies answered {line:?}: not a list of {{name, msg}}"))
    }

    /// The last lines of its stderr (the engine's log).
    pub fn stderr_tail(&self, n: usize) -> String {
        self.stderr.tail(n)
    }

    /// Closes its stdin and waits (bounded) for a clean exit 0. With `E2E_UPSTREAM_LOG`
    /// set, prints the target's whole stderr (the upstream engine's glog) afterwards.
    pub fn finish(mut self) {
        drop(self.stdin.take());
        let st = self
            .child
            .wait_until(Instant::now() + Duration::from_secs(10));
        if std::env::var_os("E2E_UPSTREAM_LOG").is_some() {
            eprintln!(
                "--- upstream target {} log ---\n{}\n--- end ---",
                self.session_id,
                self.stderr.text()
            );
        }
        assert!(
            st.is_some_and(|s| s.success()),
            "upstream target did not exit 0 after stdin closed: {st:?}; stderr:\n{}",
            self.stderr.tail(40)
        );
    }
}

impl Drop for UpstreamTarget {
    fn drop(&mut self) {
        // Closing stdin ends it; KillOnDrop kills it if it is still there.
        drop(self.stdin.take());
        if !std::thread::panicking() {
            let _ = self
                .child
                .wait_until(Instant::now() + Duration::from_secs(5));
        }
    }
}
