//! `mooncake-doctor`: checks this host for the transfer engine and says, for each finding,
//! what it saw and what to do. The wheel's `mooncake-doctor` console script and
//! `python -m mooncake.doctor` call [`main_with_args`] with the facts only Python knows.
//!
//! Every check reuses the engine's own code (configuration, runtime loaders, topology,
//! transport selection), so the doctor says what `initialize` would do, not a guess.

pub mod decision;
pub mod gpu;
pub mod host;
pub mod peer;
pub mod probe;
pub mod python;
pub mod rdma;
pub mod report;
pub mod selftest;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use mooncake_cli::{switch, wants_help, Flags, UsageError};

pub use host::Inputs;
pub use report::{Check, Report, Status};

/// Runs every check `inp` asks for.
pub fn run(inp: &Inputs) -> Report {
    let started = Instant::now();
    let mut checks = Vec::new();
    if let Some(py) = &inp.python {
        checks.extend(python::checks(py));
    }
    let facts = probe::gather(inp);
    match &facts.config {
        Ok(_) => checks.push(Check::ok("config", "every MC_* variable parses")),
        Err(e) => checks.push(Check::fail(
            "config",
            e.clone(),
            "fix or unset the variable named: initialize fails with it",
        )),
    }
    checks.push(gpu::check(inp, &facts));
    checks.extend(rdma::checks(inp, &facts));
    checks.push(decision::check(inp, &facts));
    if let Ok(config) = &facts.config {
        if inp.selftest {
            checks.push(selftest::check(inp, config));
        }
        if let Some(p) = &inp.peer {
            checks.push(peer::check(inp, config, p));
        }
    }
    Report {
        checks,
        elapsed_ms: started.elapsed().as_millis(),
    }
}

const USAGE: &str = "usage: mooncake-doctor [--json] [--selftest] [--peer HOST:PORT] [--protocol P] [--device-name LIST]
                       [--timeout SECS] [--sysfs-root DIR] [--procfs-root DIR] [--dev-root DIR] [--no-color]

Checks this host for the Mooncake transfer engine: Python and the wheel's tags, the GPU runtime,
RDMA (verbs, /dev/infiniband, HCAs, ports, GIDs, MC_TE_FILTERS, peer-memory modules, memlock,
containers), and the transports initialize(protocol, device_name) would start, and why.
  --selftest         move bytes between two engines of this process on 127.0.0.1, verified
  --peer HOST:PORT   reach a running engine at its handshake port: probe, descriptor, data port
  --protocol P       the protocol argument of initialize (default \"\": automatic)
  --device-name L    the device_name argument of initialize (HCA list)
  --timeout SECS     bound of the selftest and the peer probe (default 3)
  --json             one JSON document instead of the table
  --sysfs-root, --procfs-root, --dev-root   stand for /sys, /proc, /dev (default MC_SYSFS_ROOT,
                     MC_PROCFS_ROOT, MC_DEV_ROOT, else the real ones)
Exit status: 0 all ok, 1 warnings, 2 failures (64: bad usage).";

/// Parsed command line.
#[derive(Debug, Default)]
struct Cli {
    json: bool,
    no_color: bool,
    inputs_sysfs: Option<PathBuf>,
    inputs_procfs: Option<PathBuf>,
    inputs_dev: Option<PathBuf>,
    selftest: bool,
    peer: Option<String>,
    protocol: Option<String>,
    device_name: Option<String>,
    timeout: Option<Duration>,
    python: Option<String>,
}

/// The command line of `args` (program name first); `None` when help was asked for. Flag
/// names take `_` for `-` (upstream's tools spell them with underscores).
fn parse(args: &[String]) -> Result<Option<Cli>, UsageError> {
    if wants_help(args) {
        return Ok(None);
    }
    let mut cli = Cli::default();
    let mut line = Flags::new(args);
    while let Some((raw, inline)) = line.next_flag()? {
        let name = raw.replace('_', "-");
        let n = name.as_str();
        let l = &mut line;
        match n {
            "json" | "no-color" | "no-colour" | "selftest" => {
                switch(n, inline.as_deref())?;
                match n {
                    "json" => cli.json = true,
                    "selftest" => cli.selftest = true,
                    _ => cli.no_color = true,
                }
            }
            "peer" => cli.peer = Some(l.value(n, inline)?),
            "protocol" => cli.protocol = Some(l.value(n, inline)?),
            "device-name" => cli.device_name = Some(l.value(n, inline)?),
            "sysfs-root" | "sys-root" => cli.inputs_sysfs = Some(l.value(n, inline)?.into()),
            "procfs-root" => cli.inputs_procfs = Some(l.value(n, inline)?.into()),
            "dev-root" => cli.inputs_dev = Some(l.value(n, inline)?.into()),
            "python-facts" => cli.python = Some(l.value(n, inline)?),
            "timeout" => {
                let v = l.value(n, inline)?;
                let secs: f64 = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s <= 60.0)
                    .ok_or_else(|| {
                        UsageError(format!(
                            "--timeout {v:?}: want seconds, more than 0 and at most 60"
                        ))
                    })?;
                cli.timeout = Some(Duration::from_secs_f64(secs));
            }
            _ => {
                return Err(UsageError(format!(
                    "unknown argument \"--{raw}\" (try --help)"
                )))
            }
        }
    }
    Ok(Some(cli))
}

/// Builds the run's inputs from the command line over `base` (the process's, or a test's).
fn inputs(cli: Cli, mut base: Inputs) -> Result<Inputs, String> {
    if let Some(p) = cli.inputs_sysfs {
        base.sysfs_root = p;
    }
    if let Some(p) = cli.inputs_procfs {
        base.procfs_root = p;
    }
    if let Some(p) = cli.inputs_dev {
        base.dev_root = p;
    }
    if let Some(p) = cli.protocol {
        base.protocol = p;
    }
    if let Some(d) = cli.device_name {
        base.device_name = d;
    }
    if let Some(t) = cli.timeout {
        base.budget = t;
    }
    base.selftest |= cli.selftest;
    if cli.peer.is_some() {
        base.peer = cli.peer;
    }
    if let Some(py) = cli.python {
        let v =
            serde_json::from_str(&py).map_err(|e| format!("--python-facts is not JSON: {e}"))?;
        base.python = Some(v);
    }
    Ok(base)
}

/// `mooncake-doctor ARGS`: prints the report and returns the exit status. `python_facts`
/// is the JSON described in [`python`] (also accepted as `--python-facts`).
pub fn main_with_args(args: &[String], python_facts: Option<&str>) -> i32 {
    main_over(args, python_facts, Inputs::from_process())
}

/// As [`main_with_args`] over `base` inputs; returns the exit status.
pub fn main_over(args: &[String], python_facts: Option<&str>, base: Inputs) -> i32 {
    let cli = match parse(args) {
        Ok(Some(c)) => c,
        Ok(None) => {
            println!("{USAGE}");
            return 0;
        }
        Err(e) => {
            eprintln!("mooncake-doctor: {e}\n{USAGE}");
            return 64;
        }
    };
    let (json, no_color) = (cli.json, cli.no_color);
    let mut inp = match inputs(cli, base) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("mooncake-doctor: {e}");
            return 64;
        }
    };
    if let (Some(py), None) = (python_facts, &inp.python) {
        match serde_json::from_str(py) {
            Ok(v) => inp.python = Some(v),
            Err(e) => eprintln!("mooncake-doctor: ignoring the Python facts: {e}"),
        }
    }
    let colour = !json && !no_color && use_colour(&inp);
    let report = run(&inp);
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_table(colour));
    }
    report.exit_code()
}

/// Colour only on a terminal, and never with `NO_COLOR` set or `TERM=dumb`.
fn use_colour(inp: &Inputs) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    let tty = unsafe { libc::isatty(1) } == 1;
    tty && inp.var("NO_COLOR").is_none_or(|v| v.is_empty())
        && inp.var("TERM").as_deref() != Some("dumb")
}
