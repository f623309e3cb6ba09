//! Every `MC_*` variable the engine reads, parsed once into a typed [`Config`].
//!
//! A value that does not parse is an error naming the variable, the value and
//! what is accepted; nothing falls back silently. Deprecated aliases are
//! accepted with a warning.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

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

/// Same-host GPU IPC: `MC_DISABLE_IPC` and the tuning of ours, upstream's
/// `MC_INTRANODE_NVLINK`, `MC_FORCE_MUSA` / `MC_FORCE_MNNVL` and `MC_MUSA_IPC_OPEN_DEVICE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpcConfig {
    /// `MC_DISABLE_IPC` (ours): device-to-device requests to same-host peers of protocol
    /// `tcp` or `rdma` keep that protocol instead of going over IPC.
    pub disable: bool,
    /// `MC_INTRANODE_NVLINK` (presence, as upstream): with CUDA, advertise `nvlink_intra`
    /// as the segment's protocol.
    pub intranode_nvlink: bool,
    /// `MC_FORCE_MUSA` or `MC_FORCE_MNNVL` (presence, as upstream): with MUSA, advertise
    /// `musa` as the segment's protocol.
    pub force_musa: bool,
    /// `MC_MUSA_IPC_OPEN_DEVICE=metadata`: open peer handles on the device the peer's
    /// buffer names instead of the local buffer's (`current`).
    pub open_on_buffer_device: bool,
    /// `MC_HOST_ID` (ours): this host's identity instead of the kernel's `boot_id`.
    pub host_id: Option<String>,
    /// `MC_IPC_SLICE_SIZE` (ours, bytes, 4096 to 1 GiB): largest piece of a request.
    pub slice_size: u64,
    /// `MC_IPC_COPY_THREADS` (ours, 1 to 16): copy threads, one stream per device each.
    pub copy_threads: usize,
    /// `MC_IPC_REVOKE_TIMEOUT` (ours, seconds, 1 to 600): how long `unregister_memory`
    /// waits for same-host peers holding a mapping of the memory to let go.
    pub revoke_timeout: Duration,
    /// `MC_IPC_BATCH_COPY` (ours, default on): scattered slices of a copy thread's group
    /// go to the device in one `cudaMemcpyBatchAsync` where the runtime has it; off: one
    /// `MemcpyAsync` per copy.
    pub batch_copy: bool,
}

/// Default of `MC_IPC_SLICE_SIZE`: measured on two H200s over NV18, 64 MiB requests ran at
/// the raw peer-copy rate with 64 MiB slices and at 0.78 of it with 4 MiB slices (more
/// streams interleaving on one link); smaller requests are not affected.
pub const DEFAULT_IPC_SLICE_SIZE: u64 = 64 << 20;

impl Default for IpcConfig {
    fn default() -> Self {
        Self {
            disable: false,
            intranode_nvlink: false,
            force_musa: false,
            open_on_buffer_device: false,
            host_id: None,
            slice_size: DEFAULT_IPC_SLICE_SIZE,
            copy_threads: 4,
            revoke_timeout: Duration::from_secs(5),
            batch_copy: true,
        }
    }
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

/// CPUs this process may run on (its affinity mask and cgroup quota).
pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get())
}

fn default_lanes() -> usize {
    lanes_for_cpus(available_cpus())
}

/// How long TCP threads spin before sleeping, for a process that may run on `cpus` CPUs:
/// 50 µs from 2 CPUs on, as a sleeping thread's wake-up (tens of µs, 35-40 µs on the
/// 2-core VM when it lands on the other, halted, CPU) is most of a small request's time;
/// none on one CPU, where a spinning thread takes the CPU the thread it waits for needs.
/// On 2 CPUs a lone request's two threads are the caller and the peer's connection thread
/// (`PeerLink::send_lone`), one per CPU; there, 4 KiB p99 went from 166-177 µs to 19-39 µs.
pub fn spin_for_cpus(cpus: usize) -> Duration {
    if cpus >= 2 {
        Duration::from_micros(50)
    } else {
        Duration::ZERO
    }
}

/// Caller connections per peer for a process that may run on `cpus` CPUs: two per lane,
/// 16 at most, from 8 CPUs on, none below. On the 16-CPU host, callers sending their own
/// batches moved the serving shape 30-37% faster than the lanes, and 10 callers to one
/// peer over 8 connections left two on the lanes, 13% slower than with 16; 32 were no
/// faster than 16 (26.1-30.3 GB/s with 4 peers against 26.0-28.0), and each is a thread on
/// the peer, whose connections from one address are capped
/// (`MC_TCP_SERVER_MAX_CONNECTIONS_PER_IP`). On the 2-core VM the same made it 15-30%
/// slower with a p99 ten times as long: there, the callers outnumber the CPUs and one
/// sending a whole batch holds a CPU another caller's statuses wait for.
pub fn caller_conns_for_cpus(cpus: usize) -> usize {
    if cpus >= 8 {
        (2 * lanes_for_cpus(cpus)).min(16)
    } else {
        0
    }
}

/// The default congestion control of same-host data connections: `reno` below 8 CPUs,
/// the system's from 8 on. reno does not pace; bbr, a common system default, paces each
/// connection through a timer of its own. On the 2-CPU VM, with reno, batches of 64 KiB
/// and 4 MiB moved 1.02-1.72x as much (64 KiB reads least) and the serving shape
/// 1.3-1.6x. On the 16-CPU GPU host the serving shape with 4 peers moved 0.89-0.99x as
/// much in 7 rounds of 7, whether or not the caller connections had reno, and batches
/// gained only where reno's build ran after the other in a round (docs/benchmarks.md,
/// session 16). From 8 CPUs on callers send their own batches; on the 2-CPU VM, with
/// caller connections turned on, reno slowed them too.
pub fn same_host_cc_for_cpus(cpus: usize) -> Option<String> {
    (cpus < 8).then(|| "reno".to_owned())
}

/// Times a caller waiting for its batch looks for completion, yielding in between, before
/// it sleeps: 64 from 8 CPUs on (a sleep and its wake-up cost more than a small request);
/// none below, where each yield hands the CPU to no purpose while the lane and the peer's
/// thread need both CPUs of 2: on the 2-core VM the looks made 4 KiB single requests 71-75
/// µs at p50 against 18-20 µs without them (docs/benchmarks.md, issue 12).
pub fn waiter_looks_for_cpus(cpus: usize) -> u32 {
    if cpus >= 8 {
        64
    } else {
        0
    }
}

/// Lanes per peer for a process that may run on `cpus` CPUs (its affinity mask and cgroup
/// quota, as `available_parallelism` counts them, so a process bound to one NUMA node with
/// `numactl --cpunodebind` or `taskset` counts that node's CPUs): one per CPU, up to 16
/// (`MC_TCP_LANES_PER_PEER`'s most). A lane's copies of cold memory wait on the memory
/// more than they use their CPU, so lanes up to the CPUs still add throughput. On the
/// 16-CPU host 4 MiB writes moved 12.0-12.1 GB/s over 4 lanes, 20.6-21.4 over 8,
/// 26.4-28.1 over 12 and 26.2-28.8 over 16 (reads alike); on 8 of its CPUs, 8 lanes moved
/// 4 MiB batches 1.5x as fast as 4 and 64 KiB reads 1.25x, and 6 lanes left 64 KiB writes
/// 20% slower than 4 or 8 (a batch's groups did not divide evenly among them). On 2 CPUs
/// it is 2, as before (docs/benchmarks.md, issue 12). The hosts measured have one NUMA node.
pub fn lanes_for_cpus(cpus: usize) -> usize {
    cpus.clamp(1, 16)
}

/// Lanes over all peers for a process that may run on `cpus` CPUs: one per CPU, and never
/// fewer than one peer's lanes ([`lanes_for_cpus`]). So one peer gets all its lanes, and
/// several peers share the CPUs instead of each adding its own threads.
pub fn lane_budget_for_cpus(cpus: usize) -> usize {
    cpus.max(lanes_for_cpus(cpus))
}

/// Variables accepted only for compatibility: they tune upstream's bounded
/// queues, which this engine replaces with backpressure.
const NO_EFFECT: &[&str] = &[
    "MC_TCP_ENABLE_CONNECTION_POOL",
    "MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER",
    "MC_TCP_MAX_PENDING_ADMISSIONS_PER_PEER",
    "MC_TCP_ADMISSION_TIMEOUT_MS",
];

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads variables through `get` (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let env = Env { get: &get };
        let mut c = Self::default();
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
        let min = env.first_int::<u16>(&["MC_MIN_RPC_PORT", "MC_MIN_PRC_PORT"], "a port number")?;
        let max = env.first_int::<u16>(&["MC_MAX_RPC_PORT", "MC_MAX_PRC_PORT"], "a port number")?;
        if let Some((var, p)) = min {
            c.min_rpc_port = check_rpc_port(var, p)?;
        }
        if let Some((var, p)) = max {
            c.max_rpc_port = check_rpc_port(var, p)?;
        }
        if c.min_rpc_port > c.max_rpc_port {
            return Err(ConfigError {
                var: "MC_MIN_RPC_PORT",
                value: c.min_rpc_port.to_string(),
                expected: format!("at most MC_MAX_RPC_PORT ({})", c.max_rpc_port),
            });
        }
        if let Some(p) = env.int::<u16>("MC_HANDSHAKE_PORT", "a port number 1-65535")? {
            c.handshake_port = nonzero("MC_HANDSHAKE_PORT", p)?;
        }
        if let Some(b) = env.int::<i32>("MC_HANDSHAKE_LISTEN_BACKLOG", "a positive integer")? {
            c.handshake_listen_backlog = b.max(1);
        }
        if let Some(s) = env.int::<u64>("MC_HANDSHAKE_CONNECT_TIMEOUT", "whole seconds")? {
            c.handshake_connect_timeout =
                Duration::from_secs(nonzero("MC_HANDSHAKE_CONNECT_TIMEOUT", s)?);
        }
        if let Some(n) = env.int::<u64>("MC_HANDSHAKE_MAX_LENGTH", "bytes, 1 to 134217728")? {
            if !(1..=128 << 20).contains(&n) {
                return Err(env.error("MC_HANDSHAKE_MAX_LENGTH", "bytes, 1 to 134217728 (128 MiB)"));
            }
            c.handshake_max_length = n;
        }
        if let Some(n) = env.int::<usize>("MC_TCP_SLICE_SIZE", "bytes, at least 4096")? {
            if n < 4096 {
                return Err(env.error("MC_TCP_SLICE_SIZE", "bytes, at least 4096"));
            }
            c.tcp_slice_size = n;
        }
        if let Some(v) = env.int::<u32>("MC_TCP_PROTO", "1 or 2")? {
            if !(1..=2).contains(&v) {
                return Err(env.error("MC_TCP_PROTO", "1 or 2"));
            }
            c.tcp_proto = Some(v);
        }
        if let Some(s) = env.int::<u64>("MC_TCP_STATUS_TIMEOUT_SEC", "whole seconds, at least 1")? {
            c.tcp_status_timeout = Duration::from_secs(nonzero("MC_TCP_STATUS_TIMEOUT_SEC", s)?);
        }
        let lanes = match env.int::<usize>("MC_TCP_LANES_PER_PEER", "1 to 16")? {
            Some(n) => Some(("MC_TCP_LANES_PER_PEER", n)),
            None => {
                let old = env.int::<usize>("MC_TCP_MAX_CONNECTIONS_PER_PEER", "1 to 16")?;
                if old.is_some() {
                    tracing::warn!(
                        "MC_TCP_MAX_CONNECTIONS_PER_PEER is deprecated; use MC_TCP_LANES_PER_PEER"
                    );
                }
                old.map(|n| ("MC_TCP_MAX_CONNECTIONS_PER_PEER", n))
            }
        };
        if let Some((var, n)) = lanes {
            if !(1..=16).contains(&n) {
                return Err(env.error(var, "1 to 16"));
            }
            c.tcp_lanes_per_peer = n;
        }
        if let Some(n) = env.int::<usize>("MC_TCP_LANE_BUDGET", "1 to 1024")? {
            if !(1..=1024).contains(&n) {
                return Err(env.error("MC_TCP_LANE_BUDGET", "1 to 1024"));
            }
            c.tcp_lane_budget = n;
        }
        if let Some(n) = env.int::<u64>("MC_TCP_STRIPE_SIZE", "bytes, at least 65536")? {
            if n < 65536 {
                return Err(env.error("MC_TCP_STRIPE_SIZE", "bytes, at least 65536"));
            }
            c.tcp_stripe_size = n;
        }
        if let Some(n) = env.int::<usize>("MC_TCP_PIPELINE_DEPTH", "1 to 1024")? {
            if !(1..=1024).contains(&n) {
                return Err(env.error("MC_TCP_PIPELINE_DEPTH", "1 to 1024"));
            }
            c.tcp_pipeline_depth = n;
        }
        if let Some(us) = env.int::<u64>("MC_TCP_SPIN_US", "0 to 1000 microseconds")? {
            if us > 1000 {
                return Err(env.error("MC_TCP_SPIN_US", "0 to 1000 microseconds"));
            }
            c.tcp_spin = Duration::from_micros(us);
        }
        if let Some(n) = env.int::<usize>("MC_TCP_CALLER_CONNS", "0 to 64")? {
            if n > 64 {
                return Err(env.error("MC_TCP_CALLER_CONNS", "0 to 64"));
            }
            c.tcp_caller_conns = n;
        }
        c.tcp_write_runs = env.switch(
            "MC_TCP_WRITE_RUNS",
            c.tcp_write_runs,
            "1/true/yes/on or 0/false/no/off",
        )?;
        if let Some(v) = get("MC_TCP_SAME_HOST_CC") {
            c.tcp_same_host_cc = congestion_control(&v)
                .ok_or_else(|| env.error("MC_TCP_SAME_HOST_CC", CC_EXPECTED))?;
        }
        if let Some(s) = env.int::<u64>("MC_TCP_LINK_IDLE_SEC", "whole seconds, at least 1")? {
            c.tcp_link_idle_timeout = Duration::from_secs(nonzero("MC_TCP_LINK_IDLE_SEC", s)?);
        }
        if let Some(v) = get("MC_TCP_BIND_ADDRESS") {
            let ip = v.trim().parse::<IpAddr>().map_err(|_| ConfigError {
                var: "MC_TCP_BIND_ADDRESS",
                value: v.clone(),
                expected: "an IPv4 or IPv6 address".into(),
            })?;
            c.tcp_bind_address = Some(ip);
        }
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
        Self::read_bounds(&env, &mut c)?;
        Self::read_rdma(&env, &mut c)?;
        c.ipc = Self::read_ipc(&env)?;
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
        for var in NO_EFFECT {
            if get(var).is_some() {
                tracing::info!(
                    "{var} is accepted for compatibility but has no effect: this engine queues any number of requests per peer and applies backpressure instead of rejecting"
                );
            }
        }
        Ok(c)
    }
}

impl Config {
    /// The bounds on what peers can make this engine spend.
    fn read_bounds<F: Fn(&str) -> Option<String>>(
        env: &Env<'_, F>,
        c: &mut Config,
    ) -> Result<(), ConfigError> {
        let secs = |var: &'static str| -> Result<Option<Duration>, ConfigError> {
            match env.int::<u64>(var, "whole seconds, at least 1")? {
                Some(s) => Ok(Some(Duration::from_secs(nonzero(var, s)?))),
                None => Ok(None),
            }
        };
        let count = |var: &'static str| -> Result<Option<usize>, ConfigError> {
            match env.int::<usize>(var, "a count, at least 1")? {
                Some(n) => Ok(Some(nonzero(var, n)?)),
                None => Ok(None),
            }
        };
        if let Some(d) = secs("MC_HANDSHAKE_SERVER_TIMEOUT")? {
            c.handshake_server_timeout = d;
        }
        if let Some(d) = secs("MC_HANDSHAKE_TIMEOUT")? {
            c.handshake_timeout = d;
        }
        if let Some(n) = count("MC_HANDSHAKE_MAX_CONNECTIONS")? {
            c.handshake_max_connections = n;
        }
        if let Some(n) = count("MC_HANDSHAKE_MAX_CONNECTIONS_PER_IP")? {
            c.handshake_max_connections_per_ip = n;
        }
        if let Some(n) = count("MC_TCP_SERVER_MAX_CONNECTIONS")? {
            c.tcp_server_max_connections = n;
        }
        if let Some(n) = count("MC_TCP_SERVER_MAX_CONNECTIONS_PER_IP")? {
            c.tcp_server_max_connections_per_ip = n;
        }
        if let Some(d) = secs("MC_TCP_SERVER_IDLE_TIMEOUT")? {
            c.tcp_server_idle_timeout = d;
        }
        if let Some(n) = env.int::<usize>("MC_NOTIFY_QUEUE_BYTES", "bytes, at least 4096")? {
            if n < 4096 {
                return Err(env.error("MC_NOTIFY_QUEUE_BYTES", "bytes, at least 4096"));
            }
            c.notify_queue_bytes = n;
        }
        // One stager is two 2 MiB chunks: less than 4 MiB could stage nothing.
        let staging = "MiB, 4 to 65536 (one stager is 4 MiB)";
        if let Some(mb) = env.int::<usize>("MC_TCP_STAGING_BUDGET_MB", staging)? {
            if !(4..=65536).contains(&mb) {
                return Err(env.error("MC_TCP_STAGING_BUDGET_MB", staging));
            }
            c.tcp_staging_budget = mb << 20;
        }
        Ok(())
    }
}

impl Config {
    /// The RDMA and topology variables.
    fn read_rdma<F: Fn(&str) -> Option<String>>(
        env: &Env<'_, F>,
        c: &mut Config,
    ) -> Result<(), ConfigError> {
        let get = env.get;
        if let Some(v) = get("MC_FORCE_HCA") {
            c.force_hca = true;
            if is_false_word(&v) {
                warn_once(&format!(
                    "MC_FORCE_HCA={v:?} still forces RDMA: only the variable's presence counts, as for MC_FORCE_TCP; unset it to allow TCP"
                ));
            }
        }
        let (filter, warning) = hca_filter(get);
        if let Some(w) = warning {
            warn_once(&w);
        }
        c.hca_filter = filter;
        let gid = env.first_int::<i32>(
            &["MC_GID_INDEX", "NCCL_IB_GID_INDEX"],
            "-1 (automatic) or a GID index 0-255",
        )?;
        if let Some((var, i)) = gid {
            if !(-1..=255).contains(&i) {
                return Err(env.error(var, "-1 (automatic) or a GID index 0-255"));
            }
            c.gid_index = i;
        }
        let ranged = |var: &'static str, lo: u32, hi: u32| -> Result<Option<u32>, ConfigError> {
            let expected = format!("{lo} to {hi}");
            match env.int::<u32>(var, &expected)? {
                Some(n) if !(lo..=hi).contains(&n) => Err(env.error(var, &expected)),
                other => Ok(other),
            }
        };
        if let Some(p) = ranged("MC_IB_PORT", 1, 255)? {
            c.ib_port = p;
        }
        if let Some(m) = env.int::<u32>("MC_MTU", "512, 1024, 2048 or 4096")? {
            if ![512, 1024, 2048, 4096].contains(&m) {
                return Err(env.error("MC_MTU", "512, 1024, 2048 or 4096"));
            }
            c.mtu = m;
        }
        let slice = "bytes, 4096 to 1073741824";
        if let Some(n) = env.int::<u64>("MC_SLICE_SIZE", slice)? {
            if !(4096..=1 << 30).contains(&n) {
                return Err(env.error("MC_SLICE_SIZE", slice));
            }
            c.rdma_slice_size = n;
        }
        if let Some(n) = ranged("MC_NUM_QP_PER_EP", 1, 256)? {
            c.num_qp_per_ep = n;
        }
        if let Some(n) = ranged("MC_MAX_WR", 1, 65536)? {
            c.max_wr = n;
        }
        if let Some(n) = ranged("MC_RETRY_CNT", 0, 1000)? {
            c.retry_cnt = n;
        }
        if let Some(n) = ranged("MC_FRAGMENT_RATIO", 1, 65536)? {
            c.fragment_ratio = n;
        }
        c.custom_topo_json = get("MC_CUSTOM_TOPO_JSON")
            .filter(|v| !v.trim().is_empty())
            .map(PathBuf::from);
        if let Some(root) = get("MC_SYSFS_ROOT").filter(|v| !v.trim().is_empty()) {
            c.sysfs_root = PathBuf::from(root);
        }
        Ok(())
    }

    fn read_ipc<F: Fn(&str) -> Option<String>>(env: &Env<'_, F>) -> Result<IpcConfig, ConfigError> {
        let get = env.get;
        let mut ipc = IpcConfig::default();
        let ranged =
            |var: &'static str, lo: u64, hi: u64, what: &str| -> Result<Option<u64>, ConfigError> {
                let expected = format!("{what}, {lo} to {hi}");
                match env.int::<u64>(var, &expected)? {
                    Some(n) if !(lo..=hi).contains(&n) => Err(env.error(var, &expected)),
                    n => Ok(n),
                }
            };
        ipc.disable = env.switch(
            "MC_DISABLE_IPC",
            false,
            "1 to turn same-host GPU IPC off for tcp/rdma peers, 0 or unset to keep it",
        )?;
        // Upstream checks these by presence.
        ipc.intranode_nvlink = get("MC_INTRANODE_NVLINK").is_some();
        ipc.force_musa = get("MC_FORCE_MUSA").is_some() || get("MC_FORCE_MNNVL").is_some();
        ipc.open_on_buffer_device = match get("MC_MUSA_IPC_OPEN_DEVICE")
            .map(|v| v.trim().to_ascii_lowercase())
            .as_deref()
        {
            None | Some("" | "current") => false,
            Some("metadata") => true,
            Some(_) => return Err(env.error("MC_MUSA_IPC_OPEN_DEVICE", "current or metadata")),
        };
        ipc.host_id = get("MC_HOST_ID").filter(|s| !s.trim().is_empty());
        if let Some(n) = ranged("MC_IPC_SLICE_SIZE", 4096, 1 << 30, "bytes")? {
            ipc.slice_size = n;
        }
        if let Some(n) = ranged("MC_IPC_COPY_THREADS", 1, 16, "threads")? {
            ipc.copy_threads = n as usize;
        }
        if let Some(n) = ranged("MC_IPC_REVOKE_TIMEOUT", 1, 600, "whole seconds")? {
            ipc.revoke_timeout = Duration::from_secs(n);
        }
        ipc.batch_copy = env.switch(
            "MC_IPC_BATCH_COPY",
            true,
            "0 for one device copy per scattered slice, 1 or unset for batches",
        )?;
        Ok(ipc)
    }
}

/// `MC_TE_FILTERS`, or the legacy `MOONCAKE_RDMA_DEVICES` when it is unset, and the
/// warning to give. An explicit `MC_TE_FILTERS`, even empty (every HCA), wins.
pub fn hca_filter(get: &dyn Fn(&str) -> Option<String>) -> (Option<HcaFilter>, Option<String>) {
    let names = |v: &str| -> Vec<String> {
        v.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    };
    match (get("MC_TE_FILTERS"), get("MOONCAKE_RDMA_DEVICES")) {
        (Some(new), Some(old)) => (
            Some(HcaFilter {
                var: "MC_TE_FILTERS",
                names: names(&new),
            }),
            Some(format!(
                "MC_TE_FILTERS={new:?} and the deprecated MOONCAKE_RDMA_DEVICES={old:?} are both set: MC_TE_FILTERS wins; unset MOONCAKE_RDMA_DEVICES"
            )),
        ),
        (Some(new), None) => (
            Some(HcaFilter {
                var: "MC_TE_FILTERS",
                names: names(&new),
            }),
            None,
        ),
        (None, Some(old)) => (
            Some(HcaFilter {
                var: "MOONCAKE_RDMA_DEVICES",
                names: names(&old),
            }),
            Some(format!(
                "MOONCAKE_RDMA_DEVICES={old:?} is deprecated and honoured only while MC_TE_FILTERS is unset; set MC_TE_FILTERS={old:?} instead"
            )),
        ),
        (None, None) => (None, None),
    }
}

fn is_false_word(v: &str) -> bool {
    switch_word(v) == Some(false)
}

/// The words every on/off variable takes, in any case.
fn switch_word(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// Logs `msg` as a warning the first time this process sees it.
fn warn_once(msg: &str) {
    if crate::log_throttle::first_time(msg) {
        tracing::warn!("{msg}");
    }
}

const CC_EXPECTED: &str =
    "system, or the name of a congestion control the kernel has (reno, cubic, bbr, ...)";

/// `MC_TCP_SAME_HOST_CC`'s value: `Some(None)` for `system`, `Some(Some(name))` for a
/// name the kernel could have (at most 15 letters, digits, `_` or `-`), else `None`.
fn congestion_control(v: &str) -> Option<Option<String>> {
    let v = v.trim();
    if v.eq_ignore_ascii_case("system") {
        return Some(None);
    }
    let name_like = !v.is_empty()
        && v.len() < 16
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    name_like.then(|| Some(v.to_owned()))
}

struct Env<'a, F: Fn(&str) -> Option<String>> {
    get: &'a F,
}

impl<F: Fn(&str) -> Option<String>> Env<'_, F> {
    fn error(&self, var: &'static str, expected: &str) -> ConfigError {
        ConfigError {
            var,
            value: (self.get)(var).unwrap_or_default(),
            expected: expected.into(),
        }
    }

    fn int<T: std::str::FromStr>(
        &self,
        var: &'static str,
        expected: &str,
    ) -> Result<Option<T>, ConfigError> {
        match (self.get)(var) {
            None => Ok(None),
            Some(v) => v.trim().parse::<T>().map(Some).map_err(|_| ConfigError {
                var,
                value: v,
                expected: expected.into(),
            }),
        }
    }

    fn first_int<T: std::str::FromStr>(
        &self,
        vars: &[&'static str],
        expected: &str,
    ) -> Result<Option<(&'static str, T)>, ConfigError> {
        for &var in vars {
            if let Some(v) = self.int::<T>(var, expected)? {
                if var != vars[0] {
                    tracing::warn!("{var} is a misspelt alias; use {}", vars[0]);
                }
                return Ok(Some((var, v)));
            }
        }
        Ok(None)
    }

    fn flag(&self, var: &'static str) -> Result<bool, ConfigError> {
        match (self.get)(var) {
            None => Ok(false),
            Some(v) if v.trim().is_empty() => Ok(true),
            Some(v) => {
                switch_word(&v).ok_or_else(|| self.error(var, "1/true/yes/on or 0/false/no/off"))
            }
        }
    }

    /// A switch whose unset or empty value keeps `default` (an empty value is not a
    /// request to change it).
    fn switch(
        &self,
        var: &'static str,
        default: bool,
        expected: &str,
    ) -> Result<bool, ConfigError> {
        match (self.get)(var) {
            None => Ok(default),
            Some(v) if v.trim().is_empty() => Ok(default),
            Some(v) => switch_word(&v).ok_or_else(|| self.error(var, expected)),
        }
    }
}

fn nonzero<T: Default + PartialEq + ToString>(var: &'static str, v: T) -> Result<T, ConfigError> {
    if v == T::default() {
        return Err(ConfigError {
            var,
            value: v.to_string(),
            expected: "a value greater than 0".into(),
        });
    }
    Ok(v)
}

fn check_rpc_port(var: &'static str, p: u16) -> Result<u16, ConfigError> {
    if p < 1024 || (32768..=60999).contains(&p) {
        return Err(ConfigError {
            var,
            value: p.to_string(),
            expected: "a port in 1024-32767 or 61000-65535 (the kernel's ephemeral range 32768-60999 is refused)".into(),
        });
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn empty_environment_gives_upstream_defaults() {
        assert_eq!(parse(&[]).unwrap(), Config::default());
    }

    #[test]
    fn values_are_parsed() {
        let c = parse(&[
            ("MC_FORCE_TCP", "1"),
            ("MC_TRANSFER_TIMEOUT", "7"),
            ("MC_MIN_RPC_PORT", "20000"),
            ("MC_MAX_RPC_PORT", "20010"),
            ("MC_HANDSHAKE_MAX_LENGTH", "2048"),
            ("MC_TCP_PROTO", "1"),
            ("MC_TCP_LANES_PER_PEER", "2"),
            ("MC_TCP_LANE_BUDGET", "6"),
            ("MC_TCP_SPIN_US", "20"),
            ("MC_TCP_CALLER_CONNS", "0"),
            ("MC_TCP_SAME_HOST_CC", "cubic"),
            ("MC_TCP_WRITE_RUNS", "off"),
            ("MC_TCP_BIND_ADDRESS", "127.0.0.1"),
            ("MC_LOG_LEVEL", "warning"),
            ("MC_HANDSHAKE_SERVER_TIMEOUT", "3"),
            ("MC_HANDSHAKE_TIMEOUT", "20"),
            ("MC_HANDSHAKE_MAX_CONNECTIONS", "32"),
            ("MC_HANDSHAKE_MAX_CONNECTIONS_PER_IP", "4"),
            ("MC_NOTIFY_QUEUE_BYTES", "1048576"),
            ("MC_TCP_SERVER_MAX_CONNECTIONS", "100"),
            ("MC_TCP_SERVER_MAX_CONNECTIONS_PER_IP", "10"),
            ("MC_TCP_SERVER_IDLE_TIMEOUT", "60"),
            ("MC_TCP_STAGING_BUDGET_MB", "16"),
        ])
        .unwrap();
        assert!(c.force_tcp);
        assert_eq!(c.transfer_timeout, Duration::from_secs(7));
        assert_eq!((c.min_rpc_port, c.max_rpc_port), (20000, 20010));
        assert_eq!(c.handshake_max_length, 2048);
        assert_eq!(c.tcp_proto, Some(1));
        assert_eq!(c.tcp_lanes_per_peer, 2);
        assert_eq!(c.tcp_lane_budget, 6);
        assert_eq!(c.tcp_spin, Duration::from_micros(20));
        assert_eq!(c.tcp_caller_conns, 0);
        assert_eq!(c.tcp_same_host_cc.as_deref(), Some("cubic"));
        assert_eq!(c.log_level, LogLevel::Warning);
        assert_eq!(c.handshake_server_timeout, Duration::from_secs(3));
        assert_eq!(c.handshake_timeout, Duration::from_secs(20));
        assert_eq!(c.handshake_max_connections, 32);
        assert_eq!(c.handshake_max_connections_per_ip, 4);
        assert_eq!(c.notify_queue_bytes, 1 << 20);
        assert_eq!(c.tcp_server_max_connections, 100);
        assert_eq!(c.tcp_server_max_connections_per_ip, 10);
        assert_eq!(c.tcp_server_idle_timeout, Duration::from_secs(60));
        assert_eq!(c.tcp_staging_budget, 16 << 20);
    }

    #[test]
    fn timeout_is_clamped_to_five_seconds() {
        let c = parse(&[("MC_TRANSFER_TIMEOUT", "1")]).unwrap();
        assert_eq!(c.transfer_timeout, Duration::from_secs(5));
    }

    #[test]
    fn default_lanes_grow_with_cpus_and_never_fall_below_the_old_default() {
        let lanes: Vec<usize> = [1, 2, 3, 4, 8, 10, 16, 32, 128]
            .iter()
            .map(|&n| lanes_for_cpus(n))
            .collect();
        assert_eq!(lanes, [1, 2, 3, 4, 8, 10, 16, 16, 16]);
        let budgets: Vec<usize> = [1, 2, 4, 16].map(lane_budget_for_cpus).to_vec();
        assert_eq!(budgets, [1, 2, 4, 16]);
        assert_eq!(spin_for_cpus(1), Duration::ZERO);
        assert_eq!(spin_for_cpus(2), Duration::from_micros(50));
        assert_eq!(waiter_looks_for_cpus(2), 0);
        assert_eq!(waiter_looks_for_cpus(16), 64);
        assert_eq!(spin_for_cpus(16), Duration::from_micros(50));
        let callers: Vec<usize> = [2, 4, 7, 8, 16, 64].map(caller_conns_for_cpus).to_vec();
        assert_eq!(callers, [0, 0, 0, 16, 16, 16]);
        for n in 1..=256 {
            assert!(lanes_for_cpus(n) >= n.clamp(1, 4), "{n} CPUs");
            assert!(lanes_for_cpus(n) <= 16, "{n} CPUs");
        }
    }

    #[test]
    fn the_server_takes_every_connection_of_an_eight_gpu_hosts_engines() {
        // The most one engine opens to a peer: all its lanes, all its caller connections
        // and the direct one, whatever its CPUs; eight such engines on one address.
        let most = (1..=1024)
            .map(|cpus| lanes_for_cpus(cpus) + caller_conns_for_cpus(cpus) + 1)
            .max()
            .unwrap_or(0);
        assert_eq!(most, 33);
        let c = Config::default();
        assert!(c.tcp_server_max_connections_per_ip >= 8 * most);
        assert!(c.tcp_server_max_connections_per_ip < c.tcp_server_max_connections);
    }

    fn affinity() -> libc::cpu_set_t {
        // SAFETY: an all-zero cpu_set_t is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: pid 0 is the calling thread; `set` is writable and `size` bytes long.
        assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut set) }, 0);
        set
    }

    fn set_affinity(set: &libc::cpu_set_t) {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: pid 0 is the calling thread; `set` is readable and `size` bytes long.
        assert_eq!(unsafe { libc::sched_setaffinity(0, size, set) }, 0);
    }

    #[test]
    fn default_lanes_follow_the_cpus_this_thread_may_run_on() {
        // As `numactl --cpunodebind` or `taskset` would bind a process: one CPU allowed.
        let old = affinity();
        let first = (0..libc::CPU_SETSIZE as usize)
            // SAFETY: `c` is below CPU_SETSIZE, inside the set.
            .find(|&c| unsafe { libc::CPU_ISSET(c, &old) })
            .expect("this thread may run on some CPU");
        // SAFETY: an all-zero cpu_set_t is the empty set.
        let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `first` is below CPU_SETSIZE, inside the set.
        unsafe { libc::CPU_SET(first, &mut one) };
        set_affinity(&one);
        let bound = (available_cpus(), Config::default().tcp_lanes_per_peer);
        set_affinity(&old);
        assert_eq!(bound, (1, 1));
    }

    #[test]
    fn same_host_congestion_control_is_reno_below_8_cpus_and_system_leaves_it() {
        assert_eq!(same_host_cc_for_cpus(1).as_deref(), Some("reno"));
        assert_eq!(same_host_cc_for_cpus(7).as_deref(), Some("reno"));
        assert_eq!(same_host_cc_for_cpus(8), None);
        assert_eq!(same_host_cc_for_cpus(16), None);
        let c = parse(&[("MC_TCP_SAME_HOST_CC", "System")]).unwrap();
        assert_eq!(c.tcp_same_host_cc, None);
        let c = parse(&[("MC_TCP_SAME_HOST_CC", "reno")]).unwrap();
        assert_eq!(c.tcp_same_host_cc.as_deref(), Some("reno"));
    }

    #[test]
    fn misspelt_port_alias_and_deprecated_lanes_alias_work() {
        let c = parse(&[
            ("MC_MIN_PRC_PORT", "16000"),
            ("MC_TCP_MAX_CONNECTIONS_PER_PEER", "3"),
        ])
        .unwrap();
        assert_eq!(c.min_rpc_port, 16000);
        assert_eq!(c.tcp_lanes_per_peer, 3);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let cases = [
            ("MC_TRANSFER_TIMEOUT", "soon"),
            ("MC_MIN_RPC_PORT", "80"),
            ("MC_MAX_RPC_PORT", "40000"),
            ("MC_HANDSHAKE_MAX_LENGTH", "0"),
            ("MC_HANDSHAKE_MAX_LENGTH", "999999999"),
            ("MC_TCP_PROTO", "3"),
            ("MC_TCP_LANES_PER_PEER", "17"),
            ("MC_TCP_SPIN_US", "1001"),
            ("MC_TCP_LANE_BUDGET", "0"),
            ("MC_TCP_SPIN_US", "fast"),
            ("MC_TCP_CALLER_CONNS", "65"),
            ("MC_TCP_SAME_HOST_CC", ""),
            ("MC_TCP_SAME_HOST_CC", "bbr cubic"),
            ("MC_TCP_SAME_HOST_CC", "a_name_too_long_for_it"),
            ("MC_TCP_WRITE_RUNS", "sometimes"),
            ("MC_TCP_STATUS_TIMEOUT_SEC", "0"),
            ("MC_TCP_BIND_ADDRESS", "localhost"),
            ("MC_METRICS_PORT", "70000"),
            ("MC_METRICS_BIND_ADDRESS", "anywhere"),
            ("MC_LOG_LEVEL", "LOUD"),
            ("MC_USE_IPV6", "maybe"),
            ("MC_HANDSHAKE_SERVER_TIMEOUT", "0"),
            ("MC_HANDSHAKE_TIMEOUT", "1.5"),
            ("MC_HANDSHAKE_MAX_CONNECTIONS", "0"),
            ("MC_HANDSHAKE_MAX_CONNECTIONS_PER_IP", "-1"),
            ("MC_NOTIFY_QUEUE_BYTES", "100"),
            ("MC_TCP_SERVER_MAX_CONNECTIONS", "many"),
            ("MC_TCP_SERVER_MAX_CONNECTIONS_PER_IP", "0"),
            ("MC_TCP_SERVER_IDLE_TIMEOUT", "0"),
            ("MC_TCP_STAGING_BUDGET_MB", "3"),
        ];
        for (var, value) in cases {
            let err = parse(&[(var, value)]).unwrap_err();
            assert_eq!(err.var, var, "{var}={value}");
            assert!(err.to_string().contains(var), "{err}");
        }
    }

    #[test]
    fn rdma_variables_parse_with_upstream_defaults() {
        let d = Config::default();
        assert_eq!((d.gid_index, d.ib_port, d.mtu), (-1, 1, 4096));
        assert_eq!(
            (d.rdma_slice_size, d.num_qp_per_ep, d.max_wr),
            (65536, 2, 256)
        );
        assert_eq!((d.retry_cnt, d.fragment_ratio), (9, 4));
        assert_eq!(d.sysfs_root, PathBuf::from("/sys"));
        assert!(!d.force_hca && d.hca_filter.is_none() && d.custom_topo_json.is_none());
        let c = parse(&[
            ("MC_FORCE_HCA", "1"),
            ("MC_GID_INDEX", "3"),
            ("MC_IB_PORT", "2"),
            ("MC_MTU", "1024"),
            ("MC_SLICE_SIZE", "131072"),
            ("MC_NUM_QP_PER_EP", "4"),
            ("MC_MAX_WR", "128"),
            ("MC_RETRY_CNT", "0"),
            ("MC_FRAGMENT_RATIO", "8"),
            ("MC_CUSTOM_TOPO_JSON", "/etc/topo.json"),
            ("MC_SYSFS_ROOT", "/tmp/sys"),
            ("MC_TE_FILTERS", "mlx5_0, mlx5_2,"),
        ])
        .unwrap();
        assert!(c.force_hca);
        assert_eq!((c.gid_index, c.ib_port, c.mtu), (3, 2, 1024));
        assert_eq!(
            (c.rdma_slice_size, c.num_qp_per_ep, c.max_wr),
            (131072, 4, 128)
        );
        assert_eq!((c.retry_cnt, c.fragment_ratio), (0, 8));
        assert_eq!(c.custom_topo_json, Some(PathBuf::from("/etc/topo.json")));
        assert_eq!(c.sysfs_root, PathBuf::from("/tmp/sys"));
        let f = c.hca_filter.unwrap();
        assert_eq!(
            (f.var, f.names),
            ("MC_TE_FILTERS", vec!["mlx5_0".into(), "mlx5_2".into()])
        );
        // The dump sets MC_CUSTOM_TOPO_JSON='' to mean "none".
        assert!(parse(&[("MC_CUSTOM_TOPO_JSON", "")])
            .unwrap()
            .custom_topo_json
            .is_none());
        assert_eq!(parse(&[("NCCL_IB_GID_INDEX", "1")]).unwrap().gid_index, 1);
        let both = parse(&[("MC_GID_INDEX", "2"), ("NCCL_IB_GID_INDEX", "1")]).unwrap();
        assert_eq!(both.gid_index, 2);
    }

    #[test]
    fn bad_rdma_values_name_the_variable() {
        for (var, value) in [
            ("MC_GID_INDEX", "256"),
            ("MC_GID_INDEX", "-2"),
            ("NCCL_IB_GID_INDEX", "x"),
            ("MC_IB_PORT", "0"),
            ("MC_MTU", "1500"),
            ("MC_SLICE_SIZE", "100"),
            ("MC_NUM_QP_PER_EP", "0"),
            ("MC_MAX_WR", "many"),
            ("MC_RETRY_CNT", "-1"),
            ("MC_FRAGMENT_RATIO", "0"),
        ] {
            let err = parse(&[(var, value)]).unwrap_err();
            assert_eq!(err.var, var, "{var}={value}");
            assert!(err.to_string().contains(var), "{err}");
        }
    }

    #[test]
    fn legacy_device_variable_is_honoured_with_a_warning_and_loses_to_the_new_one() {
        let lookup = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let (f, w) = hca_filter(&lookup(&[("MOONCAKE_RDMA_DEVICES", "mlx5_1")]));
        let f = f.unwrap();
        assert_eq!(
            (f.var, f.names),
            ("MOONCAKE_RDMA_DEVICES", vec!["mlx5_1".into()])
        );
        assert!(w.unwrap().contains("set MC_TE_FILTERS"));
        let (f, w) = hca_filter(&lookup(&[
            ("MOONCAKE_RDMA_DEVICES", "mlx5_1"),
            ("MC_TE_FILTERS", "mlx5_0"),
        ]));
        assert_eq!(f.unwrap().names, ["mlx5_0"]);
        let w = w.unwrap();
        assert!(
            w.contains("both set") && w.contains("MC_TE_FILTERS wins"),
            "{w}"
        );
        // An explicit empty MC_TE_FILTERS (every HCA) still wins.
        let (f, w) = hca_filter(&lookup(&[
            ("MOONCAKE_RDMA_DEVICES", "mlx5_1"),
            ("MC_TE_FILTERS", ""),
        ]));
        assert!(f.unwrap().names.is_empty() && w.is_some());
        assert_eq!(hca_filter(&lookup(&[])), (None, None));
    }

    #[test]
    fn min_above_max_is_an_error() {
        let err = parse(&[("MC_MIN_RPC_PORT", "17000"), ("MC_MAX_RPC_PORT", "16000")]).unwrap_err();
        assert_eq!(err.var, "MC_MIN_RPC_PORT");
    }
}
