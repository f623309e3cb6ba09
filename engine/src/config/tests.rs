//! Reading the configuration: defaults, every variable's parsing and its errors, the
//! deprecated aliases, and the defaults that follow the CPUs.

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

#[test]
fn default_lanes_follow_the_cpus_this_thread_may_run_on() {
    // As `numactl --cpunodebind` or `taskset` would bind a process: one CPU allowed.
    let old = crate::sys::cpu_affinity().unwrap();
    let first = *old.first().expect("this thread may run on some CPU");
    crate::sys::set_cpu_affinity(&[first]).unwrap();
    let bound = (available_cpus(), Config::default().tcp_lanes_per_peer);
    crate::sys::set_cpu_affinity(&old).unwrap();
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
