//! The local topology in upstream's JSON shape: each location maps to
//! `[preferred HCAs, available HCAs]`. This TCP build discovers NUMA nodes
//! (`cpu:N`); RDMA devices and GPUs join when those layers land.

use std::collections::BTreeMap;
use std::path::Path;

/// Topology entries keyed by location.
pub type Topology = BTreeMap<String, [Vec<String>; 2]>;

/// Discovers NUMA nodes under `sys_root` (normally `/`); at least `cpu:0`.
pub fn discover(sys_root: &Path) -> Topology {
    let mut topo = Topology::new();
    if let Ok(dir) = std::fs::read_dir(sys_root.join("sys/devices/system/node")) {
        for entry in dir.flatten() {
            let name = entry.file_name();
            let Some(n) = name.to_str().and_then(|s| s.strip_prefix("node")) else {
                continue;
            };
            if n.parse::<u32>().is_ok() {
                topo.insert(format!("cpu:{n}"), [Vec::new(), Vec::new()]);
            }
        }
    }
    if topo.is_empty() {
        topo.insert("cpu:0".into(), [Vec::new(), Vec::new()]);
    }
    topo
}

/// NUMA nodes of this host plus the GPUs of the loaded runtime (`cuda:i` / `musa:i`).
pub fn local() -> Topology {
    let mut topo = discover(Path::new("/"));
    if let Ok(rt) = crate::device::runtime() {
        for i in 0..rt.device_count() {
            topo.insert(
                format!("{}:{i}", rt.vendor().prefix()),
                [Vec::new(), Vec::new()],
            );
        }
    }
    topo
}

/// The JSON text upstream's `get_local_topology` returns (pretty-printed).
pub fn to_json(topo: &Topology) -> String {
    serde_json::to_string_pretty(topo).unwrap_or_else(|_| "{}".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_numa_nodes_from_a_synthetic_sysfs() {
        let root = std::env::temp_dir().join(format!("te-topo-{}", std::process::id()));
        for n in ["node0", "node1", "possible"] {
            std::fs::create_dir_all(root.join("sys/devices/system/node").join(n)).unwrap();
        }
        let t = discover(&root);
        assert_eq!(t.keys().collect::<Vec<_>>(), ["cpu:0", "cpu:1"]);
        let v: serde_json::Value = serde_json::from_str(&to_json(&t)).unwrap();
        assert_eq!(v["cpu:1"], serde_json::json!([[], []]));
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn missing_sysfs_still_gives_cpu0() {
        let t = discover(Path::new("/nonexistent-root"));
        assert_eq!(t.keys().collect::<Vec<_>>(), ["cpu:0"]);
    }
}
