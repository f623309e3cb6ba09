//! `mooncake_master`'s command line, in the forms upstream's gflags binary accepts, so
//! that its launch scripts run unchanged: `--name=value`, `--name value`, one dash as
//! well as two, booleans as `--flag`, `--flag=true|false|1|0` and `--noflag`.
//!
//! Every flag upstream's master knows is in [`FLAGS`], in one of three roles: served
//! (this master does what it says), ignored (it only tunes upstream's own threads,
//! timeouts or logging: accepted, its value checked, nothing else), or refused (an
//! upstream feature this master lacks: accepted at its default value only, so that a
//! deployment relying on it learns at start rather than by losing data later).

use std::time::Duration;

use mooncake_cli::{Gflag, GflagsLine};

use super::state::Policy;

/// What `mooncake_master` was asked to run.
#[derive(Debug, Clone)]
pub struct MasterFlags {
    pub rpc_address: String,
    /// `--rpc_port`, else upstream's deprecated `--port`.
    pub rpc_port: u16,
    pub metrics_host: String,
    pub metrics_port: u16,
    pub enable_http_metadata_server: bool,
    pub http_metadata_server_host: String,
    pub http_metadata_server_port: u16,
    pub policy: Policy,
    pub enable_ha: bool,
    /// `host:port` each, scheme stripped.
    pub etcd_endpoints: Vec<String>,
    pub cluster_id: String,
    /// `None` when not given (or 0, upstream's "use the default").
    pub rpc_thread_num: Option<usize>,
}

impl Default for MasterFlags {
    fn default() -> Self {
        Self {
            rpc_address: "0.0.0.0".into(),
            rpc_port: DEFAULT_RPC_PORT,
            metrics_host: "0.0.0.0".into(),
            metrics_port: 9003,
            enable_http_metadata_server: false,
            http_metadata_server_host: "0.0.0.0".into(),
            http_metadata_server_port: 8080,
            policy: Policy::default(),
            enable_ha: false,
            etcd_endpoints: Vec::new(),
            cluster_id: "mooncake_cluster".into(),
            rpc_thread_num: None,
        }
    }
}

const DEFAULT_RPC_PORT: u16 = 50051;
/// etcd's client port, for an endpoint given without one.
const ETCD_PORT: u16 = 2379;

/// The outcome of a command line.
// Made once per process: boxing the flags would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Command {
    Run(MasterFlags),
    /// `--help`: the text to print.
    Help(String),
    Version,
}

/// A command line that cannot be run; each message names the flag and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    #[error("unknown flag --{0}; see --help")]
    Unknown(String),
    #[error(
        "unexpected argument {0:?}: mooncake_master takes flags only (`--name=value`); see --help"
    )]
    Positional(String),
    #[error("--{0} needs a value: `--{0}=VALUE` or `--{0} VALUE`")]
    MissingValue(String),
    #[error("--{flag}={value:?}: expected {expected}")]
    BadValue {
        flag: String,
        value: String,
        expected: &'static str,
    },
    #[error("--no{0}: --{0} is not a boolean flag; give it a value (`--{0}=VALUE`)")]
    NotBoolean(String),
    #[error("`--{flag}` is an upstream feature this master does not serve: {why}")]
    Unsupported { flag: String, why: &'static str },
    #[error("--enable_ha=true needs --etcd_endpoints=host:2379;host:2379 (the etcd cluster that elects the leader)")]
    HaWithoutEtcd,
    #[error("--enable_ha=true needs --rpc_address set to an address the clients can reach, not {0:?}: the leader publishes it in etcd and clients connect to it")]
    HaUnspecifiedAddress(String),
    #[error("--put_start_release_timeout_sec={release} must be larger than --put_start_discard_timeout_sec={discard}: a discarded put's space is released after its key, never before")]
    ReleaseBeforeDiscard { release: u64, discard: u64 },
}

/// Parses the command line (without the program name).
pub fn parse(args: &[String]) -> Result<Command, FlagError> {
    let mut p = Parser::default();
    let mut line = GflagsLine::new(args);
    while let Some(item) = line.next_item() {
        match item {
            Gflag::Positional(extra) => return Err(FlagError::Positional(extra)),
            Gflag::Flag { name, inline } => {
                if let Some(cmd) = p.one(&name, inline, &mut line)? {
                    return Ok(cmd);
                }
            }
        }
    }
    p.finish().map(Command::Run)
}

/// The text of `--help`.
pub fn help_text() -> String {
    let mut s = String::from(
        "mooncake_master: the Mooncake Store master (metadata, placement, leases, eviction, client liveness)\n\n\
         Usage: mooncake_master [--flag=value ...]   (also --flag value, -flag, --noflag for booleans)\n\n\
         Flags:\n",
    );
    for f in FLAGS {
        if let Use::Served(help) = f.role {
            s.push_str(&help_line(f, help));
        }
    }
    s.push_str("\nAccepted for upstream's launch scripts, without effect here:\n");
    for f in FLAGS {
        if let Use::Ignored(help) = f.role {
            s.push_str(&help_line(f, help));
        }
    }
    s.push_str(
        "\nEvery other flag of upstream's master is accepted at its default value only; any \
         other value is refused with the reason (an upstream feature this master does not \
         serve):\n ",
    );
    let mut col = 1;
    for f in FLAGS.iter().filter(|f| matches!(f.role, Use::Refused(_))) {
        if col + f.name.len() + 3 > 96 {
            s.push_str("\n ");
            col = 1;
        }
        s.push_str(" --");
        s.push_str(f.name);
        col += f.name.len() + 3;
    }
    s.push_str("\n\n  --help, -h    this text\n  --version, -v the version\n");
    s
}

fn help_line(f: &Flag, help: &str) -> String {
    let default = if f.default.is_empty() {
        "\"\"".to_string()
    } else {
        f.default.to_string()
    };
    format!("  --{:<34} {help} (default: {default})\n", f.name)
}

// ---- the flags ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Bool,
    Int,
    Float,
    Str,
    /// Milliseconds, or a number with `ms`, `s`, `m` or `h`.
    Millis,
}

#[derive(Debug, Clone, Copy)]
enum Use {
    /// Does what it says; the help text.
    Served(&'static str),
    /// Checked and dropped; the help text.
    Ignored(&'static str),
    /// Accepted at its default only; why not otherwise.
    Refused(&'static str),
}

#[derive(Debug)]
struct Flag {
    name: &'static str,
    ty: Ty,
    default: &'static str,
    role: Use,
}

const fn served(name: &'static str, ty: Ty, default: &'static str, help: &'static str) -> Flag {
    Flag {
        name,
        ty,
        default,
        role: Use::Served(help),
    }
}

const fn ignored(name: &'static str, ty: Ty, default: &'static str, help: &'static str) -> Flag {
    Flag {
        name,
        ty,
        default,
        role: Use::Ignored(help),
    }
}

const fn refused(name: &'static str, ty: Ty, default: &'static str, why: &'static str) -> Flag {
    Flag {
        name,
        ty,
        default,
        role: Use::Refused(why),
    }
}

const CXL: &str = "CXL memory segments; clients mount host memory instead";
const TIER: &str = "the SSD / file storage tier (offload, promotion, NVMe-oF); this master keeps objects in the clients' mounted memory only";
const EVENTS: &str = "the ZMQ KV-event publisher";
const SNAPSHOT: &str = "snapshots of the master's metadata; a restarted master starts empty and the clients mount their segments again";
const OPLOG: &str = "OpLog replication between masters; HA here is leader election through etcd (--enable_ha, --etcd_endpoints) and a new leader starts empty";
const HA_BACKEND: &str = "HA backends other than etcd; give --etcd_endpoints";
const TENANTS: &str = "multi-tenant namespaces and quotas";
const DYN_REPL: &str =
    "dynamic replication of hot keys; ask for replicas per put (ReplicateConfig.replica_num)";
const TASKS: &str = "the copy / move task manager";
const FLAG_SOURCES: &str =
    "reading flags from a file or the environment; pass them on the command line";
const LOG_FILES: &str =
    "log files and log mail; this master logs to stderr (RUST_LOG sets the level)";

/// Every flag upstream's `mooncake_master` (0.3.x) defines, with its default.
const FLAGS: &[Flag] = &[
    served("rpc_address", Ty::Str, "0.0.0.0", "address the client RPC binds to (one the clients can reach with --enable_ha)"),
    served("rpc_port", Ty::Int, "50051", "client RPC port"),
    served("port", Ty::Int, "50051", "deprecated alias of --rpc_port (--rpc_port wins)"),
    served("metrics_host", Ty::Str, "0.0.0.0", "address of the HTTP server: /metrics, /health, /get_all_segments, /query_key, /get_all_keys, /batch_query_keys"),
    served("metrics_port", Ty::Int, "9003", "port of that HTTP server"),
    served("enable_http_metadata_server", Ty::Bool, "false", "also serve the transfer engine's HTTP metadata store (clients use http://HOST:PORT/metadata)"),
    served("http_metadata_server_host", Ty::Str, "0.0.0.0", "address of the HTTP metadata store"),
    served("http_metadata_server_port", Ty::Int, "8080", "port of the HTTP metadata store"),
    served("eviction_high_watermark_ratio", Ty::Float, "0.9", "eviction starts above this fill ratio, in (0, 1]"),
    served("eviction_ratio", Ty::Float, "0.05", "share of the objects evicted per round, in [0, 1]"),
    served("default_kv_lease_ttl", Ty::Millis, "10000", "a read's lease (milliseconds, or with ms/s/m/h): a leased object is neither removed nor evicted"),
    served("default_kv_soft_pin_ttl", Ty::Millis, "1800000", "how long a soft pin lasts after the object's last use (milliseconds, or with ms/s/m/h)"),
    served("allow_evict_soft_pinned_objects", Ty::Bool, "true", "evict soft-pinned objects too, after every unpinned one"),
    served("client_ttl", Ty::Int, "10", "seconds without a heartbeat after which a client is dead: its segments are unmounted"),
    served("put_start_discard_timeout_sec", Ty::Int, "30", "seconds after which an unfinished put is discarded (its key free again)"),
    served("put_start_release_timeout_sec", Ty::Int, "600", "seconds after which an unfinished put's space is reused (larger than the discard timeout)"),
    served("enable_ha", Ty::Bool, "false", "run as one of several masters, the leader elected through etcd"),
    served("etcd_endpoints", Ty::Str, "", "etcd for --enable_ha: host:port, separated by ';' (or ',')"),
    served("cluster_id", Ty::Str, "mooncake_cluster", "the masters' cluster name in etcd"),
    served("rpc_thread_num", Ty::Int, "0", "RPC threads (0: 1, every call read, served and answered on one thread; more for masters of many busy clients)"),
    // Upstream's own threads, timeouts, allocators and logging.
    ignored("max_threads", Ty::Int, "16", "upstream's thread count (use --rpc_thread_num)"),
    ignored("rpc_enable_tcp_no_delay", Ty::Bool, "true", "upstream's TCP_NODELAY switch (always on here)"),
    ignored("rpc_conn_timeout_seconds", Ty::Int, "0", "upstream's connection timeout"),
    ignored("enable_metric_reporting", Ty::Bool, "true", "upstream's periodic metric log line (/metrics is always served)"),
    ignored("max_kv_soft_pin_ttl", Ty::Millis, "86400000", "upstream's cap on per-request soft pin TTLs (there are none here)"),
    ignored("use_mmap_arena_allocator", Ty::Bool, "false", "upstream's buffer allocator"),
    ignored("mmap_arena_pool_size", Ty::Int, "8589934592", "upstream's buffer allocator's pool"),
    ignored("logtostderr", Ty::Bool, "false", "glog: this master always logs to stderr"),
    ignored("alsologtostderr", Ty::Bool, "false", "glog: this master always logs to stderr"),
    ignored("colorlogtostderr", Ty::Bool, "false", "glog's colours"),
    ignored("stderrthreshold", Ty::Int, "2", "glog's stderr level (RUST_LOG sets the level here)"),
    ignored("minloglevel", Ty::Int, "0", "glog's level (RUST_LOG sets the level here)"),
    ignored("v", Ty::Int, "0", "glog's verbosity, as -v=N (RUST_LOG sets the level here)"),
    ignored("log_prefix", Ty::Bool, "true", "glog's line prefix"),
    ignored("logbuflevel", Ty::Int, "0", "glog's buffering"),
    ignored("logbufsecs", Ty::Int, "30", "glog's buffering"),
    // Refused unless at the default; accepted values that are the only ones we serve.
    refused("memory_allocator", Ty::Str, "offset", "the cachelib allocator; only `offset` exists here"),
    refused("allocation_strategy", Ty::Str, "random", "placement strategies other than `random`; here the preferred segment comes first, then the segments with the most free space"),
    refused("ha_backend_type", Ty::Str, "etcd", HA_BACKEND),
    refused("ha_backend_connstring", Ty::Str, "", HA_BACKEND),
    refused("enable_cxl", Ty::Bool, "false", CXL),
    refused("cxl_path", Ty::Str, "/dev/dax0.0", CXL),
    refused("cxl_size", Ty::Int, "8589934592", CXL),
    refused("enable_disk_eviction", Ty::Bool, "true", TIER),
    refused("enable_offload", Ty::Bool, "false", TIER),
    refused("offload_on_evict", Ty::Bool, "false", TIER),
    refused("offload_force_evict", Ty::Bool, "false", TIER),
    refused("offload_cap_ratio", Ty::Float, "0.5", TIER),
    refused("offloading_queue_limit", Ty::Int, "50000", TIER),
    refused("promotion_on_hit", Ty::Bool, "false", TIER),
    refused("promotion_admission_threshold", Ty::Int, "2", TIER),
    refused("promotion_max_per_heartbeat", Ty::Int, "1", TIER),
    refused("promotion_queue_limit", Ty::Int, "50000", TIER),
    refused("nof_eviction_high_watermark_ratio", Ty::Float, "0.9", TIER),
    refused("nof_eviction_ratio", Ty::Float, "0.05", TIER),
    refused("nof_heartbeat_failures_threshold", Ty::Int, "3", TIER),
    refused("nof_heartbeat_interval_sec", Ty::Int, "10", TIER),
    refused("nof_heartbeat_probe_timeout_ms", Ty::Int, "1000", TIER),
    refused("global_file_segment_size", Ty::Int, "9223372036854775807", TIER),
    refused("root_fs_dir", Ty::Str, "", TIER),
    refused("quota_bytes", Ty::Int, "0", TIER),
    refused("enable_kv_events", Ty::Bool, "false", EVENTS),
    refused("kv_events_bind_endpoint", Ty::Str, "", EVENTS),
    refused("kv_events_backend_id", Ty::Str, "", EVENTS),
    refused("kv_events_queue_capacity", Ty::Int, "65536", EVENTS),
    refused("kv_events_emit_legacy_compat", Ty::Bool, "true", EVENTS),
    refused("kv_events_emit_object_key", Ty::Bool, "true", EVENTS),
    refused("kv_events_additional_salt", Ty::Str, "", EVENTS),
    refused("kv_events_block_size", Ty::Int, "0", EVENTS),
    refused("kv_events_dp_rank", Ty::Int, "0", EVENTS),
    refused("kv_events_lora_name", Ty::Str, "", EVENTS),
    refused("kv_events_model_name", Ty::Str, "", EVENTS),
    refused("kv_events_tenant_id", Ty::Str, "default", EVENTS),
    refused("enable_snapshot", Ty::Bool, "false", SNAPSHOT),
    refused("enable_snapshot_restore", Ty::Bool, "false", SNAPSHOT),
    refused("snapshot_interval_seconds", Ty::Int, "600", SNAPSHOT),
    refused("snapshot_backup_dir", Ty::Str, "", SNAPSHOT),
    refused("snapshot_child_timeout_seconds", Ty::Int, "300", SNAPSHOT),
    refused("snapshot_retention_count", Ty::Int, "2", SNAPSHOT),
    refused("snapshot_object_store_type", Ty::Str, "", SNAPSHOT),
    refused("snapshot_payload_backend_type", Ty::Str, "", SNAPSHOT),
    refused("snapshot_payload_store_type", Ty::Str, "", SNAPSHOT),
    refused("snapshot_catalog_store_type", Ty::Str, "", SNAPSHOT),
    refused("snapshot_catalog_store_connstring", Ty::Str, "", SNAPSHOT),
    refused("snapshot_catalog_backend_type", Ty::Str, "", SNAPSHOT),
    refused("snapshot_catalog_backend_connstring", Ty::Str, "", SNAPSHOT),
    refused("enable_oplog", Ty::Bool, "false", OPLOG),
    refused("oplog_batch_max_entries", Ty::Int, "1024", OPLOG),
    refused("oplog_poll_interval_ms", Ty::Int, "1000", OPLOG),
    refused("batch_oplog_retry_timeout_sec", Ty::Int, "180", OPLOG),
    refused("enable_multi_tenants", Ty::Bool, "false", TENANTS),
    refused("tenant_quota_connector_type", Ty::Str, "file", TENANTS),
    refused("tenant_quota_connector_uri", Ty::Str, "", TENANTS),
    refused("dynamic_replication_mode", Ty::Str, "off", DYN_REPL),
    refused("dynamic_replication_admission_qps_threshold", Ty::Float, "0.8", DYN_REPL),
    refused("dynamic_replication_heat_window_seconds", Ty::Int, "10", DYN_REPL),
    refused("dynamic_replication_max_memory_replicas", Ty::Int, "2", DYN_REPL),
    refused("max_total_finished_tasks", Ty::Int, "10000", TASKS),
    refused("max_total_pending_tasks", Ty::Int, "10000", TASKS),
    refused("max_total_processing_tasks", Ty::Int, "10000", TASKS),
    refused("pending_task_timeout_sec", Ty::Int, "300", TASKS),
    refused("processing_task_timeout_sec", Ty::Int, "300", TASKS),
    refused("max_retry_attempts", Ty::Int, "10", TASKS),
    refused("enable_metadata_cleanup_on_timeout", Ty::Bool, "false", "removing a dead client's entries from the HTTP metadata store"),
    refused("rpc_interface", Ty::Str, "", "choosing the RPC address by network interface; give --rpc_address"),
    refused("pod_name", Ty::Str, "", "Kubernetes label routing"),
    refused("pod_namespace", Ty::Str, "", "Kubernetes label routing"),
    refused("config_path", Ty::Str, "", FLAG_SOURCES),
    refused("flagfile", Ty::Str, "", FLAG_SOURCES),
    refused("fromenv", Ty::Str, "", FLAG_SOURCES),
    refused("tryfromenv", Ty::Str, "", FLAG_SOURCES),
    refused("undefok", Ty::Str, "", "gflags' tolerance of unknown flags; remove them"),
    refused("tab_completion_word", Ty::Str, "", "gflags' shell completion"),
    refused("tab_completion_columns", Ty::Int, "80", "gflags' shell completion"),
    refused("log_dir", Ty::Str, "", LOG_FILES),
    refused("log_link", Ty::Str, "", LOG_FILES),
    refused("max_log_size", Ty::Int, "1800", LOG_FILES),
    refused("logfile_mode", Ty::Int, "436", LOG_FILES),
    refused("stop_logging_if_full_disk", Ty::Bool, "false", LOG_FILES),
    refused("drop_log_memory", Ty::Bool, "true", LOG_FILES),
    refused("alsologtoemail", Ty::Str, "", LOG_FILES),
    refused("logemaillevel", Ty::Int, "999", LOG_FILES),
    refused("logmailer", Ty::Str, "/bin/mail", LOG_FILES),
    refused("log_backtrace_at", Ty::Str, "", LOG_FILES),
    refused("symbolize_stacktrace", Ty::Bool, "true", LOG_FILES),
    refused("vmodule", Ty::Str, "", "glog's per-module verbosity; RUST_LOG=module=level does that here"),
];

/// gflags' help flags that take no value; `helpmatch` and `helpon` take one.
const HELP: &[&str] = &[
    "help",
    "h",
    "helpfull",
    "helpshort",
    "helppackage",
    "helpxml",
];

fn lookup(name: &str) -> Option<&'static Flag> {
    FLAGS.iter().find(|f| f.name == name)
}

// ---- parsing ----

#[derive(Default)]
struct Parser {
    flags: MasterFlags,
    rpc_port: Option<u16>,
    port: Option<u16>,
}

impl Parser {
    /// Handles one flag, reading its value from `rest` when it is not inline. `Some` for
    /// a command that ends parsing (help, version).
    fn one(
        &mut self,
        name: &str,
        inline: Option<String>,
        rest: &mut GflagsLine,
    ) -> Result<Option<Command>, FlagError> {
        if HELP.contains(&name) || name == "helpmatch" || name == "helpon" {
            return Ok(Some(Command::Help(help_text())));
        }
        // Upstream's `-v` is glog's verbosity and takes a number (`-v=2`, `-v 2`); without
        // one it is --version.
        let verbosity_next = rest.peek().is_some_and(|n| n.parse::<i64>().is_ok());
        if name == "version" || (name == "v" && inline.is_none() && !verbosity_next) {
            return Ok(Some(Command::Version));
        }
        let (flag, value) = match lookup(name) {
            Some(f) if f.ty == Ty::Bool => (f, inline.unwrap_or_else(|| "true".into())),
            Some(f) => (f, take_value(name, inline, rest)?),
            None => negated(name, inline)?,
        };
        self.set(flag, &value)?;
        Ok(None)
    }

    fn set(&mut self, flag: &Flag, value: &str) -> Result<(), FlagError> {
        match flag.role {
            Use::Served(_) => self.serve(flag.name, value),
            Use::Ignored(_) => check_type(flag, value),
            Use::Refused(why) => {
                if is_default(flag, value)? {
                    Ok(())
                } else {
                    Err(FlagError::Unsupported {
                        flag: flag.name.into(),
                        why,
                    })
                }
            }
        }
    }

    fn serve(&mut self, name: &str, v: &str) -> Result<(), FlagError> {
        let f = &mut self.flags;
        let p = &mut f.policy;
        match name {
            "rpc_address" => f.rpc_address = address(name, v)?,
            "rpc_port" => self.rpc_port = Some(port(name, v)?),
            "port" => self.port = Some(port(name, v)?),
            "metrics_host" => f.metrics_host = address(name, v)?,
            "metrics_port" => f.metrics_port = port(name, v)?,
            "enable_http_metadata_server" => f.enable_http_metadata_server = boolean(name, v)?,
            "http_metadata_server_host" => f.http_metadata_server_host = address(name, v)?,
            "http_metadata_server_port" => f.http_metadata_server_port = port(name, v)?,
            "eviction_high_watermark_ratio" => p.high_watermark = ratio(name, v, false)?,
            "eviction_ratio" => p.eviction_ratio = ratio(name, v, true)?,
            "default_kv_lease_ttl" => p.kv_lease_ttl = millis(name, v)?,
            "default_kv_soft_pin_ttl" => p.soft_pin_ttl = millis(name, v)?,
            "allow_evict_soft_pinned_objects" => p.allow_evict_soft_pinned = boolean(name, v)?,
            "client_ttl" => p.client_ttl = Duration::from_secs(seconds(name, v)?),
            "put_start_discard_timeout_sec" => {
                p.put_discard_timeout = Duration::from_secs(seconds(name, v)?)
            }
            "put_start_release_timeout_sec" => {
                p.put_release_timeout = Duration::from_secs(seconds(name, v)?)
            }
            "enable_ha" => f.enable_ha = boolean(name, v)?,
            "etcd_endpoints" => f.etcd_endpoints = etcd_endpoints(name, v)?,
            "cluster_id" => f.cluster_id = non_empty(name, v, "a cluster name")?,
            "rpc_thread_num" => f.rpc_thread_num = Some(count(name, v)?).filter(|&n| n > 0),
            _ => return Err(FlagError::Unknown(name.into())),
        }
        Ok(())
    }

    /// The cross-flag rules, once every flag is read.
    fn finish(self) -> Result<MasterFlags, FlagError> {
        let mut f = self.flags;
        f.rpc_port = match (self.rpc_port, self.port) {
            // Upstream: `--rpc_port=0` means "use --port".
            (Some(p), _) if p != 0 => p,
            (_, Some(p)) => p,
            _ => DEFAULT_RPC_PORT,
        };
        let (discard, release) = (f.policy.put_discard_timeout, f.policy.put_release_timeout);
        if release <= discard {
            return Err(FlagError::ReleaseBeforeDiscard {
                release: release.as_secs(),
                discard: discard.as_secs(),
            });
        }
        if f.enable_ha {
            if f.etcd_endpoints.is_empty() {
                return Err(FlagError::HaWithoutEtcd);
            }
            if is_unspecified(&f.rpc_address) {
                return Err(FlagError::HaUnspecifiedAddress(f.rpc_address));
            }
        }
        Ok(f)
    }
}

fn take_value(
    name: &str,
    inline: Option<String>,
    rest: &mut GflagsLine,
) -> Result<String, FlagError> {
    rest.value(inline)
        .ok_or_else(|| FlagError::MissingValue(name.into()))
}

/// `--noflag`: a boolean set to false.
fn negated(name: &str, inline: Option<String>) -> Result<(&'static Flag, String), FlagError> {
    let unknown = || FlagError::Unknown(name.into());
    let base = name.strip_prefix("no").ok_or_else(unknown)?;
    let flag = lookup(base).ok_or_else(unknown)?;
    if flag.ty != Ty::Bool {
        return Err(FlagError::NotBoolean(base.into()));
    }
    if inline.is_some() {
        // `--noflag=false` is no form gflags has.
        return Err(unknown());
    }
    Ok((flag, "false".into()))
}

/// Whether `value` equals the flag's default (as its type compares: `1` is `true`).
fn is_default(flag: &Flag, value: &str) -> Result<bool, FlagError> {
    check_type(flag, value)?;
    Ok(match flag.ty {
        Ty::Bool => boolean(flag.name, value)? == boolean(flag.name, flag.default)?,
        Ty::Int => value.trim().parse::<i128>().ok() == flag.default.parse::<i128>().ok(),
        Ty::Float => value.trim().parse::<f64>().ok() == flag.default.parse::<f64>().ok(),
        Ty::Millis => millis(flag.name, value)? == millis(flag.name, flag.default)?,
        Ty::Str => value == flag.default,
    })
}

fn check_type(flag: &Flag, value: &str) -> Result<(), FlagError> {
    let bad = |expected| bad(flag.name, value, expected);
    match flag.ty {
        Ty::Bool => boolean(flag.name, value).map(drop),
        Ty::Int => value
            .trim()
            .parse::<i128>()
            .map(drop)
            .map_err(|_| bad("an integer")),
        Ty::Float => value
            .trim()
            .parse::<f64>()
            .map(drop)
            .map_err(|_| bad("a number")),
        Ty::Millis => millis(flag.name, value).map(drop),
        Ty::Str => Ok(()),
    }
}

// ---- values ----

fn bad(flag: &str, value: &str, expected: &'static str) -> FlagError {
    FlagError::BadValue {
        flag: flag.into(),
        value: value.into(),
        expected,
    }
}

/// gflags' booleans.
fn boolean(flag: &str, v: &str) -> Result<bool, FlagError> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "y" | "t" => Ok(true),
        "false" | "0" | "no" | "n" | "f" => Ok(false),
        _ => Err(bad(flag, v, "true or false (or 1 / 0)")),
    }
}

fn port(flag: &str, v: &str) -> Result<u16, FlagError> {
    v.trim()
        .parse()
        .map_err(|_| bad(flag, v, "a port (0-65535)"))
}

fn count(flag: &str, v: &str) -> Result<usize, FlagError> {
    v.trim()
        .parse()
        .map_err(|_| bad(flag, v, "a whole number, 0 or more"))
}

fn seconds(flag: &str, v: &str) -> Result<u64, FlagError> {
    v.trim()
        .parse::<u64>()
        .ok()
        .filter(|&s| s > 0)
        .ok_or_else(|| bad(flag, v, "a whole number of seconds, at least 1"))
}

fn non_empty(flag: &str, v: &str, expected: &'static str) -> Result<String, FlagError> {
    if v.trim().is_empty() {
        Err(bad(flag, v, expected))
    } else {
        Ok(v.trim().to_string())
    }
}

fn address(flag: &str, v: &str) -> Result<String, FlagError> {
    non_empty(flag, v, "a host name or IP address")
}

fn is_unspecified(addr: &str) -> bool {
    let bare = addr.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_unspecified())
}

/// A ratio in [0, 1], or (0, 1] when `zero_ok` is false.
fn ratio(flag: &str, v: &str, zero_ok: bool) -> Result<f64, FlagError> {
    let expected = if zero_ok {
        "a ratio from 0 to 1"
    } else {
        "a ratio above 0, at most 1"
    };
    let r: f64 = v.trim().parse().map_err(|_| bad(flag, v, expected))?;
    let low_ok = if zero_ok { r >= 0.0 } else { r > 0.0 };
    if low_ok && r <= 1.0 {
        Ok(r)
    } else {
        Err(bad(flag, v, expected))
    }
}

/// Upstream's durations: raw milliseconds, or a whole number with `ms`, `s`, `m`, `h`.
fn millis(flag: &str, v: &str) -> Result<Duration, FlagError> {
    let err = || {
        bad(
            flag,
            v,
            "milliseconds, or a whole number with ms, s, m or h (500ms, 5s, 10m, 1h)",
        )
    };
    let s = v.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits.parse().map_err(|_| err())?;
    let per_unit: u64 = match unit {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(err()),
    };
    n.checked_mul(per_unit)
        .map(Duration::from_millis)
        .ok_or_else(err)
}

/// `h1:2379;h2:2379`, also with `,` and an `etcd://` or `http://` prefix per endpoint.
fn etcd_endpoints(flag: &str, v: &str) -> Result<Vec<String>, FlagError> {
    let list: Vec<String> = v
        .split([';', ','])
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| endpoint(flag, v, e))
        .collect::<Result<_, _>>()?;
    if list.is_empty() && !v.trim().is_empty() {
        return Err(bad(flag, v, "host:port endpoints separated by ';'"));
    }
    Ok(list)
}

fn endpoint(flag: &str, whole: &str, e: &str) -> Result<String, FlagError> {
    let e = e
        .strip_prefix("etcd://")
        .or_else(|| e.strip_prefix("http://"))
        .unwrap_or(e)
        .trim_end_matches('/');
    let err = || {
        bad(
            flag,
            whole,
            "host:port endpoints separated by ';' (IPv6 as [addr]:port)",
        )
    };
    if e.is_empty() || e.contains('/') || e.contains("://") {
        return Err(err());
    }
    let has_port = match split_port(e) {
        Some((host, port)) => {
            if host.is_empty() || port.is_some_and(|p| p.parse::<u16>().is_err()) {
                return Err(err());
            }
            port.is_some()
        }
        None => return Err(err()),
    };
    Ok(if has_port {
        e.to_string()
    } else {
        format!("{e}:{ETCD_PORT}")
    })
}

/// (host, port) of `host`, `host:port`, `[v6]` or `[v6]:port`; `None` for a bare IPv6
/// address, whose last group would read as a port.
fn split_port(e: &str) -> Option<(&str, Option<&str>)> {
    if e.starts_with('[') {
        let (host, after) = e.split_at(e.find(']')? + 1);
        return match after {
            "" => Some((host, None)),
            _ => Some((host, Some(after.strip_prefix(':')?))),
        };
    }
    match e.split_once(':') {
        None => Some((e, None)),
        Some((_, p)) if p.contains(':') => None,
        Some((h, p)) => Some((h, Some(p))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn run(a: &[&str]) -> MasterFlags {
        match parse(&args(a)) {
            Ok(Command::Run(f)) => f,
            other => panic!("{a:?}: {other:?}"),
        }
    }

    fn err(a: &[&str]) -> FlagError {
        match parse(&args(a)) {
            Err(e) => e,
            Ok(c) => panic!("{a:?} parsed: {c:?}"),
        }
    }

    #[test]
    fn no_flags_are_upstreams_defaults() {
        let f = run(&[]);
        assert_eq!(f.rpc_address, "0.0.0.0");
        assert_eq!(f.rpc_port, 50051);
        assert_eq!((f.metrics_host.as_str(), f.metrics_port), ("0.0.0.0", 9003));
        assert!(!f.enable_http_metadata_server);
        assert_eq!(f.http_metadata_server_host, "0.0.0.0");
        assert_eq!(f.http_metadata_server_port, 8080);
        assert!(!f.enable_ha);
        assert!(f.etcd_endpoints.is_empty());
        assert_eq!(f.cluster_id, "mooncake_cluster");
        assert_eq!(f.rpc_thread_num, None);
        let (p, d) = (f.policy, Policy::default());
        assert_eq!(
            (p.high_watermark, p.eviction_ratio),
            (d.high_watermark, d.eviction_ratio)
        );
        assert_eq!(
            (p.kv_lease_ttl, p.soft_pin_ttl),
            (d.kv_lease_ttl, d.soft_pin_ttl)
        );
        assert_eq!(p.client_ttl, d.client_ttl);
        assert_eq!(p.put_discard_timeout, d.put_discard_timeout);
        assert_eq!(p.put_release_timeout, d.put_release_timeout);
        assert!(p.allow_evict_soft_pinned);
    }

    #[test]
    fn every_value_form_is_accepted() {
        for form in [
            &["--rpc_port=6000"][..],
            &["--rpc_port", "6000"],
            &["-rpc_port=6000"],
            &["-rpc_port", "6000"],
        ] {
            assert_eq!(run(form).rpc_port, 6000, "{form:?}");
        }
    }

    #[test]
    fn every_boolean_form_is_accepted() {
        let on = |a: &[&str]| run(a).enable_http_metadata_server;
        assert!(on(&["--enable_http_metadata_server"]));
        assert!(on(&["-enable_http_metadata_server"]));
        for v in ["true", "1", "TRUE", "yes", "t", "y"] {
            assert!(on(&[&format!("--enable_http_metadata_server={v}")]), "{v}");
        }
        for v in ["false", "0", "False", "no", "f", "n"] {
            assert!(!on(&[&format!("--enable_http_metadata_server={v}")]), "{v}");
        }
        assert!(!on(&[
            "--enable_http_metadata_server",
            "--noenable_http_metadata_server"
        ]));
        assert!(
            !run(&["-noallow_evict_soft_pinned_objects"])
                .policy
                .allow_evict_soft_pinned
        );
        // A boolean never takes the next argument.
        let e = err(&["--enable_http_metadata_server", "true"]);
        assert_eq!(e, FlagError::Positional("true".into()));
        let e = err(&["--enable_ha=maybe"]);
        assert!(
            e.to_string()
                .contains("--enable_ha=\"maybe\": expected true or false"),
            "{e}"
        );
    }

    #[test]
    fn every_served_flag_lands_in_its_field() {
        let f = run(&[
            "--rpc_address=10.0.0.1",
            "--metrics_host",
            "::",
            "--metrics_port=9100",
            "--enable_http_metadata_server=1",
            "--http_metadata_server_host=127.0.0.1",
            "--http_metadata_server_port=8090",
            "--eviction_high_watermark_ratio=0.8",
            "--eviction_ratio=0.1",
            "--default_kv_lease_ttl=5s",
            "--default_kv_soft_pin_ttl=2m",
            "--allow_evict_soft_pinned_objects=false",
            "--client_ttl=20",
            "--put_start_discard_timeout_sec=40",
            "--put_start_release_timeout_sec=700",
            "--cluster_id=prod",
            "--rpc_thread_num=8",
        ]);
        assert_eq!(f.rpc_address, "10.0.0.1");
        assert_eq!((f.metrics_host.as_str(), f.metrics_port), ("::", 9100));
        assert!(f.enable_http_metadata_server);
        assert_eq!(f.http_metadata_server_host, "127.0.0.1");
        assert_eq!(f.http_metadata_server_port, 8090);
        let p = &f.policy;
        assert_eq!((p.high_watermark, p.eviction_ratio), (0.8, 0.1));
        assert_eq!(p.kv_lease_ttl, Duration::from_secs(5));
        assert_eq!(p.soft_pin_ttl, Duration::from_secs(120));
        assert!(!p.allow_evict_soft_pinned);
        assert_eq!(p.client_ttl, Duration::from_secs(20));
        assert_eq!(p.put_discard_timeout, Duration::from_secs(40));
        assert_eq!(p.put_release_timeout, Duration::from_secs(700));
        assert_eq!(f.cluster_id, "prod");
        assert_eq!(f.rpc_thread_num, Some(8));
        assert_eq!(run(&["--rpc_thread_num=0"]).rpc_thread_num, None);
    }

    #[test]
    fn port_is_the_deprecated_alias_of_rpc_port() {
        assert_eq!(run(&["--port=7000"]).rpc_port, 7000);
        assert_eq!(run(&["--port=7000", "--rpc_port=7001"]).rpc_port, 7001);
        assert_eq!(run(&["--rpc_port=7001", "--port", "7000"]).rpc_port, 7001);
        // Upstream's rpc_port=0: "use --port".
        assert_eq!(run(&["--rpc_port=0", "--port=7000"]).rpc_port, 7000);
        assert_eq!(run(&["--rpc_port=0"]).rpc_port, 50051);
        // The last of a repeated flag wins, as in gflags.
        assert_eq!(run(&["--rpc_port=1", "--rpc_port=2"]).rpc_port, 2);
    }

    #[test]
    fn durations_are_milliseconds_or_suffixed() {
        let ttl = |v: &str| {
            run(&[&format!("--default_kv_lease_ttl={v}")])
                .policy
                .kv_lease_ttl
        };
        assert_eq!(ttl("10000"), Duration::from_millis(10_000));
        assert_eq!(ttl("500ms"), Duration::from_millis(500));
        assert_eq!(ttl("5s"), Duration::from_secs(5));
        assert_eq!(ttl("3m"), Duration::from_secs(180));
        assert_eq!(ttl("1h"), Duration::from_secs(3600));
        assert_eq!(ttl("0"), Duration::ZERO);
        for bad in [
            "5x",
            "",
            "s",
            "1.5s",
            "-1",
            "5 s",
            "99999999999999999999",
            "18446744073709551615h",
        ] {
            let e = err(&[&format!("--default_kv_lease_ttl={bad}")]);
            assert!(
                e.to_string()
                    .contains("expected milliseconds, or a whole number with ms, s, m or h"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn ratios_are_range_checked() {
        assert_eq!(
            run(&["--eviction_high_watermark_ratio=1"])
                .policy
                .high_watermark,
            1.0
        );
        assert_eq!(run(&["--eviction_ratio=0"]).policy.eviction_ratio, 0.0);
        assert_eq!(run(&["--eviction_ratio=1.0"]).policy.eviction_ratio, 1.0);
        for v in ["0", "1.5", "-0.1", "nan", "x"] {
            let e = err(&[&format!("--eviction_high_watermark_ratio={v}")]);
            assert!(
                e.to_string().contains("a ratio above 0, at most 1"),
                "{v}: {e}"
            );
        }
        for v in ["1.01", "-1", "inf"] {
            let e = err(&[&format!("--eviction_ratio={v}")]);
            assert!(e.to_string().contains("a ratio from 0 to 1"), "{v}: {e}");
        }
    }

    #[test]
    fn numbers_are_checked() {
        let e = err(&["--rpc_port=70000"]);
        assert_eq!(
            e.to_string(),
            "--rpc_port=\"70000\": expected a port (0-65535)"
        );
        assert!(matches!(
            err(&["--metrics_port=x"]),
            FlagError::BadValue { .. }
        ));
        assert!(matches!(
            err(&["--http_metadata_server_port=-1"]),
            FlagError::BadValue { .. }
        ));
        for v in ["0", "-5", "1.5"] {
            let e = err(&[&format!("--client_ttl={v}")]);
            assert!(e.to_string().contains("at least 1"), "{e}");
        }
        assert!(matches!(
            err(&["--rpc_thread_num=-1"]),
            FlagError::BadValue { .. }
        ));
        assert!(matches!(
            err(&["--rpc_address="]),
            FlagError::BadValue { .. }
        ));
        assert!(matches!(
            err(&["--cluster_id= "]),
            FlagError::BadValue { .. }
        ));
    }

    #[test]
    fn release_must_come_after_discard() {
        let e = err(&["--put_start_release_timeout_sec=10"]);
        assert_eq!(
            e,
            FlagError::ReleaseBeforeDiscard {
                release: 10,
                discard: 30
            }
        );
        assert!(e.to_string().contains("--put_start_release_timeout_sec=10"));
        assert!(e.to_string().contains("--put_start_discard_timeout_sec=30"));
        let e = err(&["--put_start_discard_timeout_sec=600"]);
        assert!(matches!(e, FlagError::ReleaseBeforeDiscard { .. }));
        run(&[
            "--put_start_discard_timeout_sec=1",
            "--put_start_release_timeout_sec=2",
        ]);
    }

    #[test]
    fn etcd_endpoints_in_every_spelling() {
        let f = run(&[
            "--enable_ha",
            "--rpc_address=10.0.0.1",
            "--etcd_endpoints=etcd://h1:2379; http://h2:2380/ ,h3,[::1]:2379,[fe80::1]",
        ]);
        assert!(f.enable_ha);
        assert_eq!(
            f.etcd_endpoints,
            [
                "h1:2379",
                "h2:2380",
                "h3:2379",
                "[::1]:2379",
                "[fe80::1]:2379"
            ]
        );
        for bad in [
            ";",
            "h1:x",
            "::1",
            "https://h1:2379",
            "h1:2379/path",
            ":2379",
            "etcd://",
        ] {
            let e = err(&[&format!("--etcd_endpoints={bad}")]);
            assert!(e.to_string().contains("host:port endpoints"), "{bad}: {e}");
        }
        assert!(run(&["--etcd_endpoints="]).etcd_endpoints.is_empty());
    }

    #[test]
    fn ha_needs_etcd_and_a_reachable_address() {
        let e = err(&["--enable_ha=true"]);
        assert_eq!(e, FlagError::HaWithoutEtcd);
        assert!(
            e.to_string().contains("--enable_ha") && e.to_string().contains("--etcd_endpoints")
        );
        for addr in ["0.0.0.0", "::", "[::]"] {
            let a = format!("--rpc_address={addr}");
            let e = err(&["--enable_ha", "--etcd_endpoints=h:2379", &a]);
            assert!(matches!(e, FlagError::HaUnspecifiedAddress(_)), "{addr}");
        }
        let e = err(&["--enable_ha", "--etcd_endpoints=h:2379"]);
        assert!(e.to_string().contains("--enable_ha") && e.to_string().contains("--rpc_address"));
        // Off, neither matters.
        run(&["--enable_ha=false", "--etcd_endpoints=h:2379"]);
    }

    #[test]
    fn ignored_flags_are_accepted_but_checked() {
        run(&[
            "--max_threads=32",
            "--rpc_enable_tcp_no_delay=false",
            "--rpc_conn_timeout_seconds",
            "5",
            "--noenable_metric_reporting",
            "--memory_allocator=offset",
            "--allocation_strategy=random",
            "--ha_backend_type=etcd",
            "--max_kv_soft_pin_ttl=2h",
            "--logtostderr",
            "--minloglevel=1",
            "-v=2",
            "--v",
            "1",
            "--enable_cxl=false",
            "--enable_snapshot=0",
            "--snapshot_interval_seconds=600",
            "--kv_events_tenant_id=default",
            "--global_file_segment_size=9223372036854775807",
            "--nof_eviction_ratio=0.050",
        ]);
        assert!(matches!(
            err(&["--max_threads=many"]),
            FlagError::BadValue { .. }
        ));
        assert!(matches!(
            err(&["--logtostderr=perhaps"]),
            FlagError::BadValue { .. }
        ));
        assert!(matches!(
            err(&["--max_kv_soft_pin_ttl=1d"]),
            FlagError::BadValue { .. }
        ));
    }

    #[test]
    fn upstream_features_we_lack_are_refused_by_name() {
        for a in [
            "--enable_cxl",
            "--enable_snapshot=true",
            "--enable_offload",
            "--enable_oplog=1",
            "--ha_backend_type=redis",
            "--root_fs_dir=/mnt/3fs",
            "--config_path=/etc/master.yaml",
            "--flagfile=flags.txt",
            "--enable_multi_tenants",
            "--enable_kv_events",
            "--memory_allocator=cachelib",
            "--allocation_strategy=local_first",
            "--noenable_disk_eviction",
            "--snapshot_interval_seconds=60",
            "--log_dir=/tmp",
            "--rpc_interface=eth0",
        ] {
            let e = err(&[a]);
            let flag = a.trim_start_matches("--").split('=').next().unwrap();
            let flag = if flag == "noenable_disk_eviction" {
                "enable_disk_eviction"
            } else {
                flag
            };
            let text = e.to_string();
            assert!(
                text.starts_with(&format!(
                    "`--{flag}` is an upstream feature this master does not serve: "
                )),
                "{a}: {text}"
            );
        }
        assert!(matches!(
            err(&["--cxl_size=big"]),
            FlagError::BadValue { .. }
        ));
    }

    #[test]
    fn unknown_flags_and_arguments_are_named() {
        assert_eq!(
            err(&["--bogus=1"]).to_string(),
            "unknown flag --bogus; see --help"
        );
        assert_eq!(err(&["--bogus"]), FlagError::Unknown("bogus".into()));
        assert_eq!(err(&["--nobogus"]), FlagError::Unknown("nobogus".into()));
        assert_eq!(
            err(&["--noenable_ha=true"]),
            FlagError::Unknown("noenable_ha".into())
        );
        assert_eq!(err(&["stray"]), FlagError::Positional("stray".into()));
        assert_eq!(err(&["-"]), FlagError::Positional("-".into()));
        assert_eq!(err(&["--", "x"]), FlagError::Positional("x".into()));
        assert_eq!(run(&["--rpc_port=1", "--"]).rpc_port, 1);
        let e = err(&["--norpc_port"]);
        assert_eq!(
            e.to_string(),
            "--norpc_port: --rpc_port is not a boolean flag; give it a value (`--rpc_port=VALUE`)"
        );
        let e = err(&["--rpc_port"]);
        assert_eq!(
            e.to_string(),
            "--rpc_port needs a value: `--rpc_port=VALUE` or `--rpc_port VALUE`"
        );
        // A flag that starts with "no" is itself, not a negation.
        run(&["--nof_eviction_ratio=0.05"]);
    }

    #[test]
    fn help_and_version() {
        for h in ["--help", "-h", "--helpfull", "-help", "--helpshort"] {
            let Ok(Command::Help(text)) = parse(&args(&["--rpc_port=1", h])) else {
                panic!("{h}");
            };
            for f in FLAGS {
                assert!(
                    text.contains(&format!("--{}", f.name)),
                    "{h}: --{} missing",
                    f.name
                );
            }
            assert!(text.contains("--eviction_high_watermark_ratio"));
            assert!(text.contains("(default: 0.9)"));
            assert!(text.contains("(default: 50051)"));
        }
        // Help wins even over a later bad flag: it ends parsing.
        assert!(matches!(
            parse(&args(&["--help", "--bogus"])),
            Ok(Command::Help(_))
        ));
        for v in ["--version", "-v", "-version"] {
            assert!(matches!(parse(&args(&[v])), Ok(Command::Version)), "{v}");
        }
        let version_then = parse(&args(&["-v", "--rpc_port=1"]));
        assert!(matches!(version_then, Ok(Command::Version)));
    }

    #[test]
    fn the_table_has_no_duplicates_and_valid_defaults() {
        let mut seen = std::collections::HashSet::new();
        for f in FLAGS {
            assert!(seen.insert(f.name), "{} twice", f.name);
            assert!(is_default(f, f.default).unwrap(), "{}", f.name);
            assert!(!HELP.contains(&f.name));
        }
    }
}
