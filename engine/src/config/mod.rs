//! Every `MC_*` variable the engine reads, parsed once into a typed [`Config`].
//!
//! A value that does not parse is an error naming the variable, the value and
//! what is accepted; nothing falls back silently. Deprecated aliases are
//! accepted with a warning.
//!
//! `Config` and its errors are here, with the variables that belong to no section; each
//! section's variables are read in a file of their own (`handshake.rs`, `tcp.rs`,
//! `bounds.rs`, `rdma.rs`, `ipc.rs`), through the helpers of `env.rs`; `cpu_defaults.rs`
//! holds the defaults that follow the CPUs, and `compat.rs` upstream's deprecated and
//! no-effect variables.

mod bounds;
mod compat;
mod cpu_defaults;
mod env;
mod handshake;
mod ipc;
mod rdma;
mod tcp;
#[cfg(test)]
mod tests;

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

pub use compat::hca_filter;
pub use cpu_defaults::{
    available_cpus, caller_conns_for_cpus, lane_budget_for_cpus, lanes_for_cpus,
    same_host_cc_for_cpus, spin_for_cpus, waiter_looks_for_cpus,
};
pub use ipc::{IpcConfig, DEFAULT_IPC_SLICE_SIZE};

use cpu_defaults::default_lanes;
use env::{is_false_word, warn_once, Env};

/// A variable whose value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{var}={value:?} is invalid: {expected}")]
pub struct ConfigError {
    /// The variable's name.
    pub var: &'static str,
    /// The value found.
    pub value: String,
    /// What would be accepted.
    pub expected: String,
}

/// Log verbosity (`MC_LOG_LEVEL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// Everything.
    Trace,
    /// Debug and above.
    Debug,
    /// Info and above (upstream default).
    Info,
    /// Warnings and errors.
    Warning,
    /// Errors only.
    Error,
}

impl LogLevel {
    /// The `tracing` filter directive for this level.
    pub fn directive(self) -> &'static str {
        match self {
            Self::Trace => "trace",
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Warning => "warn",
            Self::Error => "error",
        }
    }
}

/// The HCA allow-list from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaFilter {
    /// The variable it came from (`MC_TE_FILTERS` or the legacy `MOONCAKE_RDMA_DEVICES`).
    pub var: &'static str,
    /// HCA names (trimmed, blanks dropped); empty: every HCA.
    pub names: Vec<String>,
}

/// Typed engine configuration. `Config::default()` is upstream's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `MC_FORCE_TCP`: install only the TCP transport (presence check, as upstream).
    pub force_tcp: bool,
    /// `MC_TRANSFER_TIMEOUT`: base timeout of sync and batch transfers (min 5 s).
    pub transfer_timeout: Duration,
    /// `MC_MIN_RPC_PORT`: lowest port for the RPC and data listeners.
    pub min_rpc_port: u16,
    /// `MC_MAX_RPC_PORT`: highest port for the RPC and data listeners.
    pub max_rpc_port: u16,
    /// `MC_HANDSHAKE_PORT`: port assumed when a server name has none.
    pub handshake_port: u16,
    /// `MC_HANDSHAKE_LISTEN_BACKLOG`.
    pub handshake_listen_backlog: i32,
    /// `MC_HANDSHAKE_CONNECT_TIMEOUT` (seconds).
    pub handshake_connect_timeout: Duration,
    /// `MC_HANDSHAKE_MAX_LENGTH`: largest handshake frame accepted (1 B – 128 MiB).
    pub handshake_max_length: u64,
    /// `MC_TCP_SLICE_SIZE`: upstream's chunk size; ours is the socket I/O granularity.
    pub tcp_slice_size: usize,
    /// `MC_TCP_PROTO`: `Some(1)` forces v1 framing towards every peer.
    pub tcp_proto: Option<u32>,
    /// `MC_TCP_STATUS_TIMEOUT_SEC`: deadline for a status frame or any stalled socket I/O.
    pub tcp_status_timeout: Duration,
    /// `MC_TCP_LANES_PER_PEER` (alias `MC_TCP_MAX_CONNECTIONS_PER_PEER`): parallel
    /// persistent connections to each peer, 1–16; default from the CPUs this process may
    /// run on ([`lanes_for_cpus`]).
    pub tcp_lanes_per_peer: usize,
    /// `MC_TCP_LANE_BUDGET` (ours): lanes over all peers, shared evenly by the open links
    /// (never under 2 per link), 1–1024; default from the CPUs ([`lane_budget_for_cpus`]).
    pub tcp_lane_budget: usize,
    /// `MC_TCP_STRIPE_SIZE` (ours): requests larger than this are split into
    /// stripes that travel on different lanes. 1 MiB: the lanes of a batch of 4 MiB
    /// requests then finish within a stripe of each other, where whole requests left
    /// lanes idle at the batch's end (on the 16-CPU host, 4 MiB batches moved 18-21%
    /// more over 8 lanes and 3-8% more over 12; on 2 CPUs the same, within the noise).
    pub tcp_stripe_size: u64,
    /// `MC_TCP_PIPELINE_DEPTH` (ours): requests in flight per lane before the
    /// sender waits for replies.
    pub tcp_pipeline_depth: usize,
    /// `MC_TCP_SPIN_US` (ours): how long a TCP thread looks for the next step of a lone small
    /// request before it sleeps (0 to 1000 µs); default from the CPUs ([`spin_for_cpus`]).
    pub tcp_spin: Duration,
    /// `MC_TCP_CALLER_CONNS` (ours): connections per peer on which callers of synchronous
    /// batches send them, and read their statuses, themselves while the lanes are busy;
    /// 0 to 64, 0 leaves every batch to the lanes; default from the CPUs
    /// ([`caller_conns_for_cpus`]).
    pub tcp_caller_conns: usize,
    /// `MC_TCP_WRITE_RUNS` (ours, default on): writes sent together to a peer of ours go
    /// as one run, headers first, which its server takes in with fewer system calls; off
    /// sends each with its own header, as to upstream's servers (which always get that).
    pub tcp_write_runs: bool,
    /// `MC_TCP_SAME_HOST_CC` (ours): the congestion control of data connections between two
    /// addresses of this host (`None`: the system's, `system`); default from the CPUs
    /// ([`same_host_cc_for_cpus`]).
    pub tcp_same_host_cc: Option<String>,
    /// `MC_TCP_LINK_IDLE_SEC` (ours): connections and lane threads to a peer are closed
    /// after this long without work (or once the peer is gone); reopened on next use.
    pub tcp_link_idle_timeout: Duration,
    /// `MC_METRICS_PORT`: serve Prometheus metrics on this port (`None`: no endpoint).
    pub metrics_port: Option<u16>,
    /// `MC_METRICS_BIND_ADDRESS`: address of the metrics endpoint (default: the engine's
    /// listen address).
    pub metrics_bind_address: Option<IpAddr>,
    /// `MC_TCP_BIND_ADDRESS`: address the listeners bind to and advertise.
    pub tcp_bind_address: Option<IpAddr>,
    /// `MC_USE_IPV6`.
    pub use_ipv6: bool,
    /// `MC_LOG_LEVEL`.
    pub log_level: LogLevel,
    /// `MC_METADATA_CLUSTER_ID`: metadata store keys are `mooncake/<id>/...` (empty: `mooncake/...`).
    pub metadata_cluster_id: String,
    /// `MC_METADATA_LEASE_TTL_SEC` (ours, 2–3600): the etcd lease of this engine's keys;
    /// an engine that stops renewing it (it died) loses its keys this long after.
    pub metadata_lease_ttl: Duration,
    /// `MC_HANDSHAKE_SERVER_TIMEOUT` (ours, seconds): a handshake request must
    /// arrive whole, and its reply leave, within this; then the connection is closed.
    pub handshake_server_timeout: Duration,
    /// `MC_HANDSHAKE_MAX_CONNECTIONS` (ours): handshake connections served at once.
    pub handshake_max_connections: usize,
    /// `MC_HANDSHAKE_MAX_CONNECTIONS_PER_IP` (ours): of those, from one address.
    pub handshake_max_connections_per_ip: usize,
    /// `MC_HANDSHAKE_TIMEOUT` (ours, seconds): bounds a whole handshake call
    /// made by this engine (connect, send, reply).
    pub handshake_timeout: Duration,
    /// `MC_NOTIFY_QUEUE_BYTES` (ours): bytes of received notifications held
    /// until `take_notifies`; more are refused and counted.
    pub notify_queue_bytes: usize,
    /// `MC_TCP_SERVER_MAX_CONNECTIONS` (ours): data connections served at once.
    pub tcp_server_max_connections: usize,
    /// `MC_TCP_SERVER_MAX_CONNECTIONS_PER_IP` (ours): of those, from one address. 512: an
    /// engine of ours opens up to 33 to a peer (16 lanes, 16 caller connections and the
    /// direct one), so the 8 engines of an 8-GPU host fit with room to spare, and one
    /// address still cannot take every slot.
    pub tcp_server_max_connections_per_ip: usize,
    /// `MC_TCP_SERVER_IDLE_TIMEOUT` (ours, seconds): a data connection without
    /// a request for this long is closed (our lanes reconnect on their own).
    pub tcp_server_idle_timeout: Duration,
    /// `MC_TCP_STAGING_BUDGET_MB` (ours, MiB): pinned host memory the data
    /// server may use to stage device memory, process-wide.
    pub tcp_staging_budget: usize,
    /// `MC_FORCE_HCA`: RDMA or `initialize` fails, naming what is missing (presence
    /// check, as `MC_FORCE_TCP`; `MC_FORCE_TCP` wins when both are set).
    pub force_hca: bool,
    /// `MC_TE_FILTERS` (legacy `MOONCAKE_RDMA_DEVICES` when it is unset): HCA allow-list.
    pub hca_filter: Option<HcaFilter>,
    /// `MC_GID_INDEX` (fallback `NCCL_IB_GID_INDEX`): -1 = automatic, else 0-255.
    pub gid_index: i32,
    /// `MC_IB_PORT`: the HCA port used (1).
    pub ib_port: u32,
    /// `MC_MTU`: largest path MTU, 512/1024/2048/4096.
    pub mtu: u32,
    /// `MC_SLICE_SIZE`: RDMA slice size (65536).
    pub rdma_slice_size: u64,
    /// `MC_NUM_QP_PER_EP`: RC queue pairs per endpoint (2).
    pub num_qp_per_ep: u32,
    /// `MC_MAX_WR`: send and receive queue depth per queue pair (256).
    pub max_wr: u32,
    /// `MC_RETRY_CNT`: times a failed slice is retried on other paths (9).
    pub retry_cnt: u32,
    /// `MC_FRAGMENT_RATIO`: a tail up to slice / ratio joins the previous slice (4).
    pub fragment_ratio: u32,
    /// `MC_CUSTOM_TOPO_JSON`: file whose topology replaces discovery (empty: none).
    pub custom_topo_json: Option<PathBuf>,
    /// `MC_SYSFS_ROOT`: stands for `/sys` in topology discovery.
    pub sysfs_root: PathBuf,
    /// Same-host GPU IPC (`transport/ipc`).
    pub ipc: IpcConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            force_tcp: false,
            transfer_timeout: Duration::from_secs(30),
            min_rpc_port: 15000,
            max_rpc_port: 17000,
            handshake_port: 12001,
            handshake_listen_backlog: 128,
            handshake_connect_timeout: Duration::from_secs(5),
            handshake_max_length: 1 << 20,
            tcp_slice_size: 65536,
            tcp_proto: None,
            tcp_status_timeout: Duration::from_secs(30),
            tcp_lanes_per_peer: default_lanes(),
            tcp_lane_budget: lane_budget_for_cpus(available_cpus()),
            tcp_stripe_size: 1 << 20,
            tcp_pipeline_depth: 16,
            tcp_spin: spin_for_cpus(available_cpus()),
            tcp_caller_conns: caller_conns_for_cpus(available_cpus()),
            tcp_write_runs: true,
            tcp_same_host_cc: same_host_cc_for_cpus(available_cpus()),
            tcp_link_idle_timeout: Duration::from_secs(120),
            metrics_port: None,
            metrics_bind_address: None,
            tcp_bind_address: None,
            use_ipv6: false,
            log_level: LogLevel::Info,
            metadata_cluster_id: String::new(),
            metadata_lease_ttl: Duration::from_secs(10),
            handshake_server_timeout: Duration::from_secs(5),
            handshake_max_connections: 128,
            handshake_max_connections_per_ip: 32,
            handshake_timeout: Duration::from_secs(60),
            notify_queue_bytes: 64 << 20,
            tcp_server_max_connections: 1024,
            tcp_server_max_connections_per_ip: 512,
            tcp_server_idle_timeout: Duration::from_secs(300),
            tcp_staging_budget: 128 << 20,
            force_hca: false,
            hca_filter: None,
            gid_index: -1,
            ib_port: 1,
            mtu: 4096,
            rdma_slice_size: 65536,
            num_qp_per_ep: 2,
            max_wr: 256,
            retry_cnt: 9,
            fragment_ratio: 4,
            custom_topo_json: None,
            sysfs_root: PathBuf::from("/sys"),
            ipc: IpcConfig::default(),
        }
    }
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads variables through `get` (tests pass a map). The sections are read in this
    /// order, and the first bad value is the error.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let env = Env { get: &get };
        // First, so that the legacy variable is named as such whatever else is wrong.
        if let Some(w) = hca_filter(&get).1 {
            warn_once(&w);
        }
        let mut c = Self::default();
        read_transfer(&env, &mut c)?;
        handshake::read(&env, &mut c)?;
        tcp::read(&env, &mut c)?;
        read_metrics_and_metadata(&env, &mut c)?;
        bounds::read(&env, &mut c)?;
        rdma::read(&env, &mut c)?;
        c.ipc = ipc::read(&env)?;
        read_log_level(&env, &mut c)?;
        compat::note_no_effect(&get);
        Ok(c)
    }
}

/// `MC_FORCE_TCP` and `MC_TRANSFER_TIMEOUT`.
fn read_transfer<F: Fn(&str) -> Option<String>>(
    env: &Env<'_, F>,
    c: &mut Config,
) -> Result<(), ConfigError> {
    let get = env.get;
    if let Some(v) = get("MC_FORCE_TCP") {
        c.force_tcp = true;
        if is_false_word(&v) {
            warn_once(&format!(
                "MC_FORCE_TCP={v:?} still forces TCP: upstream checks only that the variable is set; unset it to allow other transports"
            ));
        }
    }
    if let Some(secs) = env.int::<u64>("MC_TRANSFER_TIMEOUT", "a whole number of seconds")? {
        if secs < 5 {
            tracing::warn!("MC_TRANSFER_TIMEOUT={secs} raised to the minimum of 5 seconds");
        }
        c.transfer_timeout = Duration::from_secs(secs.max(5));
    }
    Ok(())
}

/// The metrics endpoint, `MC_USE_IPV6` and the metadata store's cluster id and lease.
fn read_metrics_and_metadata<F: Fn(&str) -> Option<String>>(
    env: &Env<'_, F>,
    c: &mut Config,
) -> Result<(), ConfigError> {
    let get = env.get;
    c.metrics_port = env.int::<u16>("MC_METRICS_PORT", "a TCP port, 0 to 65535")?;
    c.metrics_bind_address =
        env.int::<IpAddr>("MC_METRICS_BIND_ADDRESS", "an IPv4 or IPv6 address")?;
    c.use_ipv6 = env.flag("MC_USE_IPV6")?;
    if let Some(id) = get("MC_METADATA_CLUSTER_ID") {
        c.metadata_cluster_id = id;
    }
    if let Some(ttl) = env.int::<u64>("MC_METADATA_LEASE_TTL_SEC", "seconds, 2 to 3600")? {
        if !(2..=3600).contains(&ttl) {
            return Err(ConfigError {
                var: "MC_METADATA_LEASE_TTL_SEC",
                value: ttl.to_string(),
                expected: "seconds, 2 to 3600".into(),
            });
        }
        c.metadata_lease_ttl = Duration::from_secs(ttl);
    }
    Ok(())
}

impl LogLevel {
    /// `MC_LOG_LEVEL` alone, `default` when it is unset or bad (the full read reports a bad
    /// value): for installing the log before the configuration is read, so that the
    /// configuration's own warnings reach it.
    pub fn from_env_or(default: LogLevel) -> LogLevel {
        let get = |k: &str| std::env::var(k).ok();
        let mut c = Config {
            log_level: default,
            ..Config::default()
        };
        match read_log_level(&Env { get: &get }, &mut c) {
            Ok(()) => c.log_level,
            Err(_) => default,
        }
    }
}

/// `MC_LOG_LEVEL`.
fn read_log_level<F: Fn(&str) -> Option<String>>(
    env: &Env<'_, F>,
    c: &mut Config,
) -> Result<(), ConfigError> {
    let get = env.get;
    if let Some(v) = get("MC_LOG_LEVEL") {
        c.log_level = match v.trim().to_ascii_uppercase().as_str() {
            "TRACE" => LogLevel::Trace,
            "DEBUG" => LogLevel::Debug,
            "INFO" => LogLevel::Info,
            "WARNING" | "WARN" => LogLevel::Warning,
            "ERROR" | "FATAL" => LogLevel::Error,
            _ => return Err(env.error("MC_LOG_LEVEL", "TRACE, DEBUG, INFO, WARNING or ERROR")),
        };
    }
    Ok(())
}
