//! The benchmark's command line: upstream's gflags names (`--block_size=4096` or
//! `--block_size 4096`), parsed by the console scripts' shared
//! `mooncake-cli` layer.

use mooncake_cli::{boolean, switch, wants_help, Flags as Line, UsageError};

use crate::workload::Workload;

pub(crate) const HELP: &str = "\
Transfer engine throughput benchmark (TCP or RDMA)

Usage: transfer_engine_bench [OPTIONS]

Options:
      --mode <MODE>                  initiator or target [default: initiator]
      --operation <OP>               read or write [default: read, or the workload's]
      --protocol <PROTOCOL>          transport protocol: tcp, rdma, or \"\" (the engine picks);
                                     upstream defaults to rdma [default: tcp]
      --metadata_server <CONN>       metadata connection string [default: P2PHANDSHAKE]
      --local_server_name <HOST>     local server name (host; the port is chosen in P2P mode)
      --segment_id <ID[,ID...]>      target segment id (`host:rpc_port` printed by the target);
                                     several, comma-separated: each batch goes to one of them
                                     in turn [default: ]
      --device_name <HCAS>           RDMA device list (comma-separated HCA names; empty: all)
                                     [default: ]
      --auto_discovery [<BOOL>]      accepted for compatibility [default: false]
      --buffer_size <BYTES>          bytes of registered buffer [default: 1073741824]
      --batch_size <N>               requests per batch [default: 128, or the workload's]
      --block_size <BYTES>           bytes per request [default: 65536, or the workload's]
      --duration <SEC>               seconds to run [default: 10]
      --threads <N>                  submitting threads [default: 12, or the workload's]
      --workload <NAME>              preset request shape: custom (the defaults above), serving
                                     (10 threads, 32 x 32 KiB writes per batch, as vLLM's
                                     connector), latency (1 thread, one 4 KiB request per batch)
                                     [default: custom]
      --report_unit <UNIT>           GB, GiB, Gb, MB, MiB, Mb, KB, KiB, Kb [default: GB]
      --report_precision <DIGITS>    digits after the point [default: 2]
      --json                         also print one JSON line with the figures
  -h, --help                         Print help
";

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Mode {
    Initiator,
    Target,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Operation {
    Read,
    Write,
}

/// The benchmark's flags (see [`HELP`]).
#[derive(Debug)]
pub(crate) struct Flags {
    pub mode: Mode,
    /// `None` unless given: see [`operation`](Self::operation).
    pub operation: Option<Operation>,
    pub protocol: String,
    pub metadata_server: String,
    pub local_server_name: Option<String>,
    pub segment_id: String,
    pub device_name: String,
    #[allow(dead_code, reason = "accepted for compatibility with upstream's flags")]
    pub auto_discovery: bool,
    pub buffer_size: u64,
    pub batch_size: Option<usize>,
    pub block_size: Option<u64>,
    pub duration: f64,
    pub threads: Option<usize>,
    pub workload: Workload,
    pub report_unit: String,
    pub report_precision: usize,
    pub json: bool,
}

impl Flags {
    /// `--operation`, or the workload's: writes for `serving` (vLLM's connector writes the
    /// KV cache to the decode peer; one run of ours that left it out measured reads), reads
    /// otherwise (upstream's default).
    pub(crate) fn operation(&self) -> Operation {
        self.operation.unwrap_or(match self.workload {
            Workload::Serving => Operation::Write,
            Workload::Custom | Workload::Latency => Operation::Read,
        })
    }

    /// The flags of `args` (program name first); `None` when help was asked for.
    pub(crate) fn parse(args: &[String]) -> Result<Option<Self>, UsageError> {
        let mut f = Self {
            mode: Mode::Initiator,
            operation: None,
            protocol: "tcp".into(),
            metadata_server: "P2PHANDSHAKE".into(),
            local_server_name: None,
            segment_id: String::new(),
            device_name: String::new(),
            auto_discovery: false,
            buffer_size: 1 << 30,
            batch_size: None,
            block_size: None,
            duration: 10.0,
            threads: None,
            workload: Workload::Custom,
            report_unit: "GB".into(),
            report_precision: 2,
            json: false,
        };
        if wants_help(args) {
            return Ok(None);
        }
        let mut line = Line::new(args);
        while let Some((name, inline)) = line.next_flag()? {
            let l = &mut line;
            let n = name.as_str();
            match n {
                "mode" => {
                    f.mode = match l.value(n, inline)?.as_str() {
                        "initiator" => Mode::Initiator,
                        "target" => Mode::Target,
                        v => return Err(one_of(n, v, "initiator, target")),
                    }
                }
                "operation" => {
                    f.operation = Some(match l.value(n, inline)?.as_str() {
                        "read" => Operation::Read,
                        "write" => Operation::Write,
                        v => return Err(one_of(n, v, "read, write")),
                    })
                }
                "workload" => {
                    f.workload = match l.value(n, inline)?.as_str() {
                        "custom" => Workload::Custom,
                        "serving" => Workload::Serving,
                        "latency" => Workload::Latency,
                        v => return Err(one_of(n, v, "custom, serving, latency")),
                    }
                }
                "protocol" => f.protocol = l.value(n, inline)?,
                "metadata_server" => f.metadata_server = l.value(n, inline)?,
                "local_server_name" => f.local_server_name = Some(l.value(n, inline)?),
                "segment_id" => f.segment_id = l.value(n, inline)?,
                "device_name" => f.device_name = l.value(n, inline)?,
                "auto_discovery" => f.auto_discovery = boolean(n, inline.as_deref())?,
                "buffer_size" => f.buffer_size = l.parsed(n, inline, "a byte count")?,
                "batch_size" => f.batch_size = Some(l.parsed(n, inline, "a request count")?),
                "block_size" => f.block_size = Some(l.parsed(n, inline, "a byte count")?),
                "duration" => f.duration = l.parsed(n, inline, "seconds (e.g. 10 or 0.5)")?,
                "threads" => f.threads = Some(l.parsed(n, inline, "a thread count")?),
                "report_unit" => f.report_unit = l.value(n, inline)?,
                "report_precision" => f.report_precision = l.parsed(n, inline, "a digit count")?,
                "json" => {
                    switch(n, inline.as_deref())?;
                    f.json = true;
                }
                _ => return Err(UsageError::unknown(n)),
            }
        }
        Ok(Some(f))
    }
}

fn one_of(name: &str, value: &str, choices: &str) -> UsageError {
    UsageError::one_of(name, value, choices)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Option<Flags>, UsageError> {
        let mut v = vec!["bench".to_string()];
        v.extend(args.iter().map(|s| s.to_string()));
        Flags::parse(&v)
    }

    #[test]
    fn upstream_flag_forms_parse() {
        let f = parse(&[
            "--mode=target",
            "--operation",
            "write",
            "--protocol=",
            "--auto_discovery",
            "--buffer_size=4096",
            "--duration",
            "0.5",
            "--json",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (f.mode, f.operation(), f.protocol.as_str()),
            (Mode::Target, Operation::Write, "")
        );
        assert!(f.auto_discovery && f.json);
        assert_eq!((f.buffer_size, f.duration), (4096, 0.5));
        let d = parse(&[]).unwrap().unwrap();
        assert_eq!(
            (d.mode, d.operation(), d.protocol.as_str()),
            (Mode::Initiator, Operation::Read, "tcp")
        );
        assert_eq!(
            (d.buffer_size, d.report_precision, d.json),
            (1 << 30, 2, false)
        );
        assert!(parse(&["--help"]).unwrap().is_none());
        assert!(HELP.contains("--segment_id"));
    }

    #[test]
    fn the_serving_workload_writes_unless_told_to_read() {
        let op = |args: &[&str]| parse(args).unwrap().unwrap().operation();
        assert_eq!(op(&["--workload=serving"]), Operation::Write);
        assert_eq!(
            op(&["--workload=serving", "--operation=read"]),
            Operation::Read
        );
        assert_eq!(op(&["--workload=latency"]), Operation::Read);
        assert_eq!(op(&["--workload=custom"]), Operation::Read);
    }

    #[test]
    fn bad_flags_are_named() {
        for (args, says) in [
            (&["--no-such-flag"][..], "unknown flag --no-such-flag"),
            (&["--mode=both"][..], "expected one of initiator, target"),
            (
                &["--workload=bulk"][..],
                "expected one of custom, serving, latency",
            ),
            (
                &["--threads=many"][..],
                "--threads \"many\": expected a thread count",
            ),
            (&["--json=yes"][..], "--json takes no value"),
            (&["--block_size"][..], "--block_size needs a value"),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.0.contains(says), "{args:?}: {e}");
        }
    }
}
