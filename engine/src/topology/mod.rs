//! The local topology: which HCAs exist and can carry RDMA, where they and the GPUs sit,
//! and, for each memory location, which HCAs to prefer, in upstream's JSON shape:
//! each location maps to `[preferred HCAs, available HCAs]`.
//!
//! Discovery reads sysfs (`MC_SYSFS_ROOT`, default `/sys`), narrows the HCAs with the
//! allow-lists (`MC_TE_FILTERS` and the `device_name` argument), keeps those whose port
//! `MC_IB_PORT` is ACTIVE with a usable GID, and computes preferences by NUMA node and
//! PCIe distance ([`preference`]). `MC_CUSTOM_TOPO_JSON` replaces the computed map.
//! Nothing here logs: what the user should hear comes back in
//! [`Discovered::warnings`], for the caller to log once.

pub mod filters;
pub mod gpu;
pub mod json;
pub mod preference;
pub mod synthetic;
pub mod sysfs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::{Config, HcaFilter};
pub use json::to_json;
use preference::Place;

/// Topology entries keyed by location: `[preferred, available]` HCA names.
pub type Topology = BTreeMap<String, [Vec<String>; 2]>;

/// An HCA the RDMA transport may use, with the port and GID it should use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaChoice {
    /// Device name (`mlx5_0`).
    pub name: String,
    /// Port number (`MC_IB_PORT`).
    pub port: u32,
    /// GID index (`MC_GID_INDEX`, or the automatic choice).
    pub gid_index: u32,
    /// `Ethernet` (RoCE) or `InfiniBand`.
    pub link_layer: String,
    /// Local identifier of the port.
    pub lid: u16,
    /// NUMA node of the HCA, if known.
    pub numa_node: Option<i32>,
    /// PCI address, if known.
    pub bdf: Option<String>,
}

/// What discovery found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovered {
    /// The sysfs root read.
    pub root: PathBuf,
    /// Every HCA under `class/infiniband`, usable or not.
    pub present: Vec<String>,
    /// HCAs that pass the filters and have an ACTIVE port with a GID, in name order
    /// (with `MC_CUSTOM_TOPO_JSON`: those the file names).
    pub usable: Vec<HcaChoice>,
    /// HCAs that passed the filters but cannot be used, each with why.
    pub unusable: Vec<String>,
    /// Set when HCAs exist but the filters leave none: why.
    pub none_matched: Option<String>,
    /// The location -> `[preferred, available]` map over the usable HCAs.
    pub matrix: Topology,
    /// What the user should be told (once).
    pub warnings: Vec<String>,
}

/// What discovery needs.
#[derive(Debug, Clone)]
pub struct Params<'a> {
    /// Stands for `/sys`.
    pub sysfs_root: &'a Path,
    /// `MC_TE_FILTERS` (or its legacy alias).
    pub filter: Option<&'a HcaFilter>,
    /// The `device_name` argument of `initialize` (comma list; empty: all).
    pub device_name: &'a str,
    /// `MC_CUSTOM_TOPO_JSON`.
    pub custom_json: Option<&'a Path>,
    /// `MC_IB_PORT`.
    pub ib_port: u32,
    /// `MC_GID_INDEX` (-1: automatic).
    pub gid_index: i32,
    /// The GPUs to place.
    pub gpus: &'a [gpu::Gpu],
}

impl<'a> Params<'a> {
    /// The parameters `config` gives, for `device_name` and `gpus`.
    pub fn new(config: &'a Config, device_name: &'a str, gpus: &'a [gpu::Gpu]) -> Self {
        Self {
            sysfs_root: &config.sysfs_root,
            filter: config.hca_filter.as_ref(),
            device_name,
            custom_json: config.custom_topo_json.as_deref(),
            ib_port: config.ib_port,
            gid_index: config.gid_index,
            gpus,
        }
    }
}

/// Discovers the topology. Fails only on an unreadable or malformed `MC_CUSTOM_TOPO_JSON`.
// size: discovery in order (the HCAs, a custom topology, the wanted and usable HCAs, the
// matrix), each step feeding the next. Not cut into steps yet.
pub fn discover(p: &Params<'_>) -> Result<Discovered, json::TopoFileError> {
    let root = p.sysfs_root;
    let all = sysfs::hcas(root);
    let present: Vec<String> = all.iter().map(|h| h.name.clone()).collect();
    let mut out = Discovered {
        root: root.to_path_buf(),
        present: present.clone(),
        usable: Vec::new(),
        unusable: Vec::new(),
        none_matched: None,
        matrix: Topology::new(),
        warnings: Vec::new(),
    };
    let custom = match p.custom_json {
        Some(path) => Some(json::load(path)?),
        None => None,
    };
    let wanted: Vec<String> = match &custom {
        Some(topo) => {
            let named = json::hca_names(topo);
            for name in named.iter().filter(|n| !present.contains(n)) {
                out.warnings.push(format!(
                    "MC_CUSTOM_TOPO_JSON names HCA {name:?}, which this host does not have (ignored); HCAs present: {}",
                    listing(&present)
                ));
            }
            named
        }
        None => {
            let f = filters::apply(&present, p.filter, p.device_name);
            out.warnings.extend(f.warnings);
            out.none_matched = f.none_matched;
            f.kept
        }
    };
    for name in &wanted {
        let Some(hca) = all.iter().find(|h| &h.name == name) else {
            continue;
        };
        match choose_port(hca, p.ib_port, p.gid_index) {
            Ok(choice) => out.usable.push(choice),
            Err(why) => out.unusable.push(format!("{name}: {why}")),
        }
    }
    let usable_names: Vec<&str> = out.usable.iter().map(|h| h.name.as_str()).collect();
    out.matrix = match custom {
        Some(mut topo) => {
            for lists in topo.values_mut() {
                for list in lists.iter_mut() {
                    list.retain(|n| usable_names.contains(&n.as_str()));
                }
            }
            topo
        }
        None => {
            let hca_places: Vec<Place> = all
                .iter()
                .filter(|h| usable_names.contains(&h.name.as_str()))
                .map(|h| Place {
                    name: h.name.clone(),
                    numa: h.numa_node,
                    pci_path: h.pci_path.clone(),
                })
                .collect();
            let gpu_places: Vec<Place> = p
                .gpus
                .iter()
                .map(|g| {
                    let (pci_path, numa) = match &g.pci_bus_id {
                        Some(bdf) => sysfs::pci_function(root, bdf),
                        None => (None, None),
                    };
                    Place {
                        name: g.location.clone(),
                        numa,
                        pci_path,
                    }
                })
                .collect();
            let mut nodes = sysfs::numa_nodes(root);
            if nodes.is_empty() {
                nodes.push(0);
            }
            preference::matrix(&hca_places, &nodes, &gpu_places)
        }
    };
    Ok(out)
}

/// The topology of this host as `config` and `device_name` narrow it, with the GPUs of
/// the loaded runtime.
pub fn local(config: &Config, device_name: &str) -> Result<Discovered, json::TopoFileError> {
    let gpus = gpu::discover();
    discover(&Params::new(config, device_name, &gpus))
}

/// The port and GID `hca` would use, or why it cannot be used.
fn choose_port(hca: &sysfs::Hca, port: u32, gid_index: i32) -> Result<HcaChoice, String> {
    let Some(p) = hca.port(port) else {
        let have: Vec<String> = hca.ports.iter().map(|p| p.num.to_string()).collect();
        return Err(format!(
            "no port {port} (MC_IB_PORT); ports: {}",
            if have.is_empty() {
                "none".into()
            } else {
                have.join(", ")
            }
        ));
    };
    if !p.active {
        return Err(format!("port {port} is not ACTIVE (state {:?})", p.state));
    }
    let index = if gid_index < 0 {
        sysfs::auto_gid_index(p).ok_or(format!("port {port} has an empty GID table"))?
    } else {
        let i = gid_index as u32;
        if !p.gids.iter().any(|g| g.index == i) {
            return Err(format!(
                "port {port} has no GID at index {i} (MC_GID_INDEX); non-empty indices: {:?}",
                p.gids.iter().map(|g| g.index).collect::<Vec<_>>()
            ));
        }
        i
    };
    Ok(HcaChoice {
        name: hca.name.clone(),
        port,
        gid_index: index,
        link_layer: p.link_layer.clone(),
        lid: p.lid,
        numa_node: hca.numa_node,
        bdf: hca.bdf.clone(),
    })
}

fn listing(names: &[String]) -> String {
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

#[cfg(test)]
mod tests;
