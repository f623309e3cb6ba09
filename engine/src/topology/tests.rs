//! Discovery over synthetic sysfs trees written by the tests (`synthetic::Tree`).

use super::synthetic::{PortSpec, Tree};
use super::*;
use crate::config::Config;

fn tree(tag: &str) -> Tree {
    let root = std::env::temp_dir().join(format!("te-topo-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    Tree::new(root).unwrap()
}

fn config(tree: &Tree, vars: &[(&str, &str)]) -> Config {
    let root = tree.root.display().to_string();
    Config::from_lookup(|k| {
        if k == "MC_SYSFS_ROOT" {
            return Some(root.clone());
        }
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    })
    .unwrap()
}

fn run(tree: &Tree, vars: &[(&str, &str)], device_name: &str, gpus: &[gpu::Gpu]) -> Discovered {
    let c = config(tree, vars);
    discover(&Params::new(&c, device_name, gpus)).unwrap()
}

fn v2(i: usize) -> String {
    format!("0000:0000:0000:0000:0000:ffff:0a00:{:02x}01", i + 1)
}

/// 8 HCAs and 8 GPUs on two NUMA nodes: GPU i and HCA mlx5_i share PCIe switch i; the
/// first four switches hang off node 0's root complex, the others off node 1's.
fn eight_by_eight(t: &Tree) -> Vec<gpu::Gpu> {
    t.numa_node(0).unwrap();
    t.numa_node(1).unwrap();
    let mut gpus = Vec::new();
    for i in 0..8usize {
        let node = (i / 4) as i32;
        let (domain, root_bus) = if node == 0 {
            ("pci0000:00", 0x00)
        } else {
            ("pci0000:80", 0x80)
        };
        let bridge = format!(
            "{domain}/0000:{root_bus:02x}:{:02x}.0/0000:{:02x}:00.0",
            i % 4 + 1,
            0x10 * (i + 1)
        );
        let gpu_bdf = format!("0000:{:02x}:00.0", 0x10 * (i + 1) + 1);
        let hca_bdf = format!("0000:{:02x}:00.0", 0x10 * (i + 1) + 2);
        t.pci_function(&format!("{bridge}/{gpu_bdf}"), node)
            .unwrap();
        t.hca(
            &format!("mlx5_{i}"),
            &format!("{bridge}/{hca_bdf}"),
            node,
            &[PortSpec::roce(&v2(i))],
        )
        .unwrap();
        gpus.push(gpu::Gpu {
            location: format!("musa:{i}"),
            pci_bus_id: Some(gpu_bdf),
        });
    }
    gpus
}

fn names(range: std::ops::Range<usize>, except: Option<usize>) -> Vec<String> {
    range
        .filter(|&i| Some(i) != except)
        .map(|i| format!("mlx5_{i}"))
        .collect()
}

#[test]
fn no_hca_gives_cpu_entries_without_hcas() {
    let t = tree("none");
    t.numa_node(0).unwrap();
    t.numa_node(1).unwrap();
    let d = run(&t, &[], "", &[]);
    assert!(d.present.is_empty() && d.usable.is_empty());
    assert_eq!(d.matrix.keys().collect::<Vec<_>>(), ["cpu:0", "cpu:1"]);
    let v: serde_json::Value = serde_json::from_str(&to_json(&d.matrix)).unwrap();
    assert_eq!(v["cpu:1"], serde_json::json!([[], []]));
    // No node directory at all: still cpu:0.
    let empty = tree("empty");
    assert_eq!(
        run(&empty, &[], "", &[]).matrix.keys().collect::<Vec<_>>(),
        ["cpu:0"]
    );
}

#[test]
fn hca_with_its_port_down_is_present_but_unusable() {
    let t = tree("down");
    t.numa_node(0).unwrap();
    let port = PortSpec::roce(&v2(0)).with_state("1: DOWN");
    t.hca("mlx5_0", "pci0000:00/0000:00:01.0/0000:01:00.0", 0, &[port])
        .unwrap();
    let d = run(&t, &[], "", &[]);
    assert_eq!(d.present, ["mlx5_0"]);
    assert!(d.usable.is_empty());
    assert_eq!(d.unusable.len(), 1);
    let deferred = tree("deferred");
    let port = PortSpec::roce(&v2(0)).with_state("5: ACTIVE_DEFER");
    deferred
        .hca("mlx5_0", "pci0000:00/0000:00:01.0/0000:01:00.0", 0, &[port])
        .unwrap();
    assert!(run(&deferred, &[], "", &[]).usable.is_empty());
    assert!(
        d.unusable[0].contains("port 1 is not ACTIVE") && d.unusable[0].contains("DOWN"),
        "{:?}",
        d.unusable
    );
    assert_eq!(d.matrix["cpu:0"], [Vec::<String>::new(), vec![]]);
}

#[test]
fn eight_hcas_eight_gpus_two_numa_nodes_prefer_as_upstream() {
    let t = tree("8x8");
    let gpus = eight_by_eight(&t);
    let d = run(&t, &[], "", &gpus);
    assert_eq!(d.usable.len(), 8);
    // RoCE v2 (index 1) is chosen over the link-local v1 entry.
    assert!(
        d.usable.iter().all(|h| h.gid_index == 1 && h.port == 1),
        "{:?}",
        d.usable
    );
    assert_eq!(d.usable[5].numa_node, Some(1));
    assert_eq!(d.usable[5].bdf.as_deref(), Some("0000:62:00.0"));
    assert_eq!(d.matrix["cpu:0"], [names(0..4, None), names(4..8, None)]);
    assert_eq!(d.matrix["cpu:1"], [names(4..8, None), names(0..4, None)]);
    for i in 0..8 {
        let entry = &d.matrix[&format!("musa:{i}")];
        assert_eq!(entry[0], [format!("mlx5_{i}")], "musa:{i}");
        assert_eq!(entry[1], names(0..8, Some(i)), "musa:{i}");
    }
    // A GPU whose runtime gives no PCI address prefers none, every HCA available.
    let blind = [gpu::Gpu {
        location: "cuda:0".into(),
        pci_bus_id: None,
    }];
    let d = run(&t, &[], "", &blind);
    assert_eq!(d.matrix["cuda:0"], [vec![], names(0..8, None)]);
}

#[test]
fn filters_narrow_and_unknown_names_warn_with_the_list_of_hcas() {
    let t = tree("filters");
    let gpus = eight_by_eight(&t);
    let d = run(&t, &[("MC_TE_FILTERS", "mlx5_0,mlx5_5")], "", &gpus);
    let kept: Vec<&str> = d.usable.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(kept, ["mlx5_0", "mlx5_5"]);
    assert_eq!(
        d.matrix["cpu:0"],
        [vec!["mlx5_0".to_string()], vec!["mlx5_5".to_string()]]
    );
    // musa:1 has no filtered HCA on its switch: among its node's candidates (mlx5_0) it
    // prefers the nearest.
    assert_eq!(d.matrix["musa:1"][0], ["mlx5_0"]);
    assert!(d.warnings.is_empty());

    let legacy = run(&t, &[("MOONCAKE_RDMA_DEVICES", "mlx5_3")], "", &[]);
    assert_eq!(legacy.usable.len(), 1);
    assert_eq!(legacy.usable[0].name, "mlx5_3");

    let both = run(
        &t,
        &[
            ("MOONCAKE_RDMA_DEVICES", "mlx5_3"),
            ("MC_TE_FILTERS", "mlx5_4"),
        ],
        "",
        &[],
    );
    assert_eq!(both.usable[0].name, "mlx5_4");

    let arg = run(
        &t,
        &[("MC_TE_FILTERS", "mlx5_1,mlx5_2")],
        "mlx5_2,mlx5_7",
        &[],
    );
    assert_eq!(
        arg.usable
            .iter()
            .map(|h| h.name.as_str())
            .collect::<Vec<_>>(),
        ["mlx5_2"]
    );

    let unknown = run(&t, &[("MC_TE_FILTERS", "mlx5_9,mlx5_1")], "", &[]);
    assert_eq!(unknown.usable.len(), 1);
    assert_eq!(unknown.warnings.len(), 1);
    let w = &unknown.warnings[0];
    assert!(
        w.contains("mlx5_9") && w.contains(&names(0..8, None).join(", ")),
        "{w}"
    );

    let none = run(&t, &[("MC_TE_FILTERS", "mlx5_9")], "", &[]);
    assert!(none.usable.is_empty());
    assert!(none
        .none_matched
        .unwrap()
        .contains("MC_TE_FILTERS (mlx5_9)"));
}

#[test]
fn explicit_gid_index_and_port_are_checked() {
    let t = tree("gid");
    t.hca(
        "mlx5_0",
        "pci0000:00/0000:00:01.0/0000:01:00.0",
        0,
        &[PortSpec::roce(&v2(0))],
    )
    .unwrap();
    let d = run(&t, &[("MC_GID_INDEX", "0")], "", &[]);
    assert_eq!(d.usable[0].gid_index, 0);
    let d = run(&t, &[("MC_GID_INDEX", "3")], "", &[]);
    assert!(
        d.unusable[0].contains("no GID at index 3"),
        "{:?}",
        d.unusable
    );
    let d = run(&t, &[("MC_IB_PORT", "2")], "", &[]);
    assert!(d.unusable[0].contains("no port 2"), "{:?}", d.unusable);
}

#[test]
fn custom_topology_json_replaces_discovery_and_drops_unknown_hcas() {
    let t = tree("custom");
    let _ = eight_by_eight(&t);
    let file = t.root.join("topo.json");
    std::fs::write(
        &file,
        r#"{"cpu:0": [["mlx5_1"], ["mlx5_0", "ghost_0"]], "musa:0": [["mlx5_0"], []]}"#,
    )
    .unwrap();
    let path = file.display().to_string();
    let d = run(&t, &[("MC_CUSTOM_TOPO_JSON", &path)], "", &[]);
    assert_eq!(
        d.matrix["cpu:0"],
        [vec!["mlx5_1".to_string()], vec!["mlx5_0".to_string()]]
    );
    assert_eq!(d.matrix.len(), 2);
    assert_eq!(
        d.usable.iter().map(|h| h.name.as_str()).collect::<Vec<_>>(),
        ["mlx5_1", "mlx5_0"]
    );
    assert!(d.warnings[0].contains("ghost_0"), "{:?}", d.warnings);

    std::fs::write(&file, r#"{"cpu:0": [["mlx5_1"]]}"#).unwrap();
    let c = config(&t, &[("MC_CUSTOM_TOPO_JSON", &path)]);
    let err = discover(&Params::new(&c, "", &[])).unwrap_err();
    assert!(
        matches!(&err, json::TopoFileError::Shape { path: p, source: json::ShapeError::Location { location } }
            if p == &file && location == "cpu:0"),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("MC_CUSTOM_TOPO_JSON") && text.contains("exactly two arrays"),
        "{text}"
    );
    let c = config(&t, &[("MC_CUSTOM_TOPO_JSON", "/nonexistent/topo.json")]);
    let err = discover(&Params::new(&c, "", &[])).unwrap_err();
    assert!(
        matches!(&err, json::TopoFileError::Read { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
        "{err:?}"
    );
    assert!(err.to_string().contains("cannot read"), "{err}");
}
