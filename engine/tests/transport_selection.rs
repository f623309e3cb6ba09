//! Transport selection end to end: engines started with `initialize`'s protocol and
//! device_name over synthetic sysfs trees (`MC_SYSFS_ROOT` through `Config::sysfs_root`),
//! with GPUs from the FAKE MUSA runtime (fake_gpu/fake_runtime.c: 8 devices whose PCI
//! addresses come from `FAKE_GPU_PCI_BUS_IDS`). No verbs library is built in yet, so
//! RDMA is never usable here: what is checked is the fallback, the errors and topology.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]
mod fake_gpu;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use transfer_engine::device::Vendor;
use transfer_engine::topology::synthetic::{PortSpec, Tree};
use transfer_engine::{topology, Config, TransferEngine, TransportRequest, P2P_HANDSHAKE};

/// 8 HCAs, 8 GPUs, two NUMA nodes: GPU i shares a PCIe switch with mlx5_i.
fn eight_by_eight() -> (PathBuf, Vec<String>) {
    let root = std::env::temp_dir().join(format!("te-sel-8x8-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let t = Tree::new(&root).unwrap();
    t.numa_node(0).unwrap();
    t.numa_node(1).unwrap();
    let mut gpu_ids = Vec::new();
    for i in 0..8usize {
        let node = (i / 4) as i32;
        let domain = if node == 0 {
            "pci0000:00"
        } else {
            "pci0000:80"
        };
        let bus = 0x10 * (i + 1);
        let bridge = format!(
            "{domain}/0000:{:02x}:{:02x}.0/0000:{bus:02x}:00.0",
            node * 0x80,
            i % 4 + 1
        );
        let gpu = format!("0000:{:02x}:00.0", bus + 1);
        t.pci_function(&format!("{bridge}/{gpu}"), node).unwrap();
        let v2 = format!("0000:0000:0000:0000:0000:ffff:0a00:{:02x}01", i + 1);
        let hca_path = format!("{bridge}/0000:{:02x}:00.0", bus + 2);
        t.hca(
            &format!("mlx5_{i}"),
            &hca_path,
            node,
            &[PortSpec::roce(&v2)],
        )
        .unwrap();
        gpu_ids.push(gpu);
    }
    (root, gpu_ids)
}

/// The tree (written once for all tests) and the fake runtime pointed at its GPUs.
fn setup() -> PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let (root, ids) = eight_by_eight();
        // The runtime reports upper-case hex, as CUDA does; topology lower-cases it.
        std::env::set_var("FAKE_GPU_PCI_BUS_IDS", ids.join(",").to_uppercase());
        std::env::set_var("FAKE_GPU_DEVICES", "8");
        fake_gpu::install_fake(Vendor::Musa);
        root
    })
    .clone()
}

fn config(root: &Path) -> Config {
    Config {
        sysfs_root: root.to_path_buf(),
        ..Config::default()
    }
}

fn start(config: Config, protocol: &str, device_name: &str) -> Result<TransferEngine, String> {
    TransferEngine::with_transports(
        "127.0.0.1",
        P2P_HANDSHAKE,
        config,
        &TransportRequest::new(protocol, device_name),
    )
    .map_err(|e| e.to_string())
}

#[test]
fn gpus_of_the_runtime_prefer_the_hca_on_their_switch() {
    let root = setup();
    let found = topology::local(&config(&root), "").unwrap();
    for i in 0..8 {
        let entry = &found.matrix[&format!("musa:{i}")];
        assert_eq!(entry[0], [format!("mlx5_{i}")], "musa:{i}: {entry:?}");
        assert_eq!(entry[1].len(), 7);
    }
    // device_name narrows as MC_TE_FILTERS does.
    let narrowed = topology::local(&config(&root), "mlx5_6,mlx5_7").unwrap();
    assert_eq!(
        narrowed.matrix["musa:0"],
        [vec!["mlx5_6", "mlx5_7"], vec![]]
    );
    assert_eq!(
        narrowed.matrix["musa:6"],
        [vec!["mlx5_6".to_string()], vec!["mlx5_7".into()]]
    );
}

#[test]
fn rdma_without_verbs_falls_back_to_tcp_and_force_hca_fails_with_the_reason() {
    let root = setup();
    let e = start(config(&root), "rdma", "mlx5_0").unwrap();
    assert_eq!(e.local_descriptor().protocol, ["tcp"]);
    let err = start(
        Config {
            force_hca: true,
            ..config(&root)
        },
        "rdma",
        "",
    )
    .err()
    .unwrap();
    assert!(
        err.contains("MC_FORCE_HCA is set but RDMA cannot be used"),
        "{err}"
    );
    assert!(err.contains("verbs library is unavailable"), "{err}");
    // MC_FORCE_TCP wins and probes nothing: a broken custom topology is not even read.
    let e = start(
        Config {
            force_tcp: true,
            force_hca: true,
            custom_topo_json: Some("/nonexistent/topo.json".into()),
            ..config(&root)
        },
        "rdma",
        "",
    )
    .unwrap();
    assert_eq!(e.local_descriptor().protocol, ["tcp"]);
    let err = start(
        Config {
            custom_topo_json: Some("/nonexistent/topo.json".into()),
            ..config(&root)
        },
        "rdma",
        "",
    )
    .err()
    .unwrap();
    assert!(err.contains("MC_CUSTOM_TOPO_JSON"), "{err}");
}

#[test]
fn unserved_protocols_fail_and_ipc_protocols_start_the_ipc_transport() {
    let root = setup();
    let err = start(config(&root), "nvlink", "").err().unwrap();
    assert!(
        err.contains("protocol \"nvlink\"") && err.contains("not served"),
        "{err}"
    );
    // 8 fake MUSA devices: `musa` is served by the same-host IPC transport.
    let e = start(config(&root), "musa", "").unwrap();
    let decisions = e.transport_decisions();
    assert!(
        decisions.iter().any(|(protocol, _)| *protocol == "musa"),
        "{decisions:?}"
    );
    assert!(start(config(&root), "tcp", "").is_ok());
}
