//! HCAs, their ports and GID tables, PCI placement and NUMA nodes, read from sysfs.
//!
//! `root` stands for `/sys` (`MC_SYSFS_ROOT` replaces it); the layout below it is the
//! kernel's: `class/infiniband/<dev>/ports/<p>/{state,link_layer,lid,gids/<i>,
//! gid_attrs/types/<i>}`, `class/infiniband/<dev>/device` (a link to the PCI function),
//! `bus/pci/devices/<bdf>` and `devices/system/node/nodeN`. Nothing here fails: what
//! cannot be read is absent, and the caller says why an HCA cannot be used.

use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};

/// The type of a GID table entry (`gid_attrs/types/<i>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GidKind {
    /// `RoCE v2`: routable over UDP/IP; preferred.
    RoceV2,
    /// `IB/RoCE v1`: InfiniBand, or RoCE v1 on Ethernet.
    IbRoceV1,
    /// Anything else the kernel may write (kept verbatim).
    Other(String),
}

/// One non-empty GID table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gid {
    /// Index in the port's table.
    pub index: u32,
    /// The GID.
    pub gid: Ipv6Addr,
    /// Its type.
    pub kind: GidKind,
}

/// One port of an HCA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// Port number (1-based, as verbs counts).
    pub num: u32,
    /// The `state` file as written (`4: ACTIVE`).
    pub state: String,
    /// Whether the state is ACTIVE.
    pub active: bool,
    /// `Ethernet` (RoCE) or `InfiniBand`.
    pub link_layer: String,
    /// Local identifier (0 on RoCE).
    pub lid: u16,
    /// The non-empty GID entries, by index.
    pub gids: Vec<Gid>,
}

/// One HCA under `class/infiniband`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hca {
    /// Device name (`mlx5_0`).
    pub name: String,
    /// PCI address of the function (`0000:18:00.0`), lower-case.
    pub bdf: Option<String>,
    /// NUMA node of the PCI function (`None`: unknown, the kernel's -1).
    pub numa_node: Option<i32>,
    /// The resolved sysfs path of the PCI function, for PCIe distances.
    pub pci_path: Option<String>,
    /// Its ports, by number.
    pub ports: Vec<Port>,
}

impl Hca {
    /// The port numbered `num`.
    pub fn port(&self, num: u32) -> Option<&Port> {
        self.ports.iter().find(|p| p.num == num)
    }
}

/// Every HCA under `root/class/infiniband`, in natural name order (`mlx5_2` before `mlx5_10`).
pub fn hcas(root: &Path) -> Vec<Hca> {
    let mut out: Vec<Hca> = dir_names(&root.join("class/infiniband"))
        .into_iter()
        .map(|name| read_hca(root, name))
        .collect();
    out.sort_by(|a, b| natural_key(&a.name).cmp(&natural_key(&b.name)));
    out
}

/// NUMA nodes listed under `root/devices/system/node` (ascending).
pub fn numa_nodes(root: &Path) -> Vec<u32> {
    let mut nodes: Vec<u32> = dir_names(&root.join("devices/system/node"))
        .iter()
        .filter_map(|n| n.strip_prefix("node")?.parse().ok())
        .collect();
    nodes.sort_unstable();
    nodes
}

/// Where the PCI function `bdf` sits: its resolved path and NUMA node.
pub fn pci_function(root: &Path, bdf: &str) -> (Option<String>, Option<i32>) {
    match std::fs::canonicalize(root.join("bus/pci/devices").join(bdf)) {
        Ok(path) => {
            let numa = read_numa(&path);
            (Some(path.display().to_string()), numa)
        }
        Err(_) => (None, None),
    }
}

/// The kernel module (under `root/module`) that lets HCAs register GPU memory, if loaded.
pub fn peer_memory_module(root: &Path) -> Option<&'static str> {
    ["mthreads_peermem", "nvidia_peermem", "nv_peer_mem"]
        .into_iter()
        .find(|m| root.join("module").join(m).exists())
}

/// The GID index upstream's automatic choice (`MC_GID_INDEX=-1`) takes: RoCE v2 before
/// other types, then routable addresses before private IPv4, before loopback and
/// link-local ones; the lowest index among equals.
pub fn auto_gid_index(port: &Port) -> Option<u32> {
    port.gids
        .iter()
        .max_by_key(|g| (kind_rank(&g.kind), address_rank(&g.gid), u32::MAX - g.index))
        .map(|g| g.index)
}

fn kind_rank(kind: &GidKind) -> u8 {
    match kind {
        GidKind::RoceV2 => 2,
        GidKind::IbRoceV1 => 1,
        GidKind::Other(_) => 0,
    }
}

fn address_rank(gid: &Ipv6Addr) -> u8 {
    match gid.to_ipv4_mapped() {
        Some(v4) if v4.is_loopback() || v4.is_link_local() => 1,
        Some(v4) if v4.is_private() => 2,
        Some(_) => 3,
        None if gid.segments()[0] & 0xffc0 == 0xfe80 => 0,
        None => 3,
    }
}

fn read_hca(root: &Path, name: String) -> Hca {
    let dir = root.join("class/infiniband").join(&name);
    // `device` links to the PCI function; upstream resolves `<dev>/../..`, the same place.
    let function = std::fs::canonicalize(dir.join("device")).ok();
    let bdf = function
        .as_ref()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().to_ascii_lowercase());
    let numa_node = function.as_deref().and_then(read_numa);
    // The distance is measured between `bus/pci/devices/<bdf>` links, as upstream does.
    let pci_path = match &bdf {
        Some(b) => pci_function(root, b)
            .0
            .or_else(|| function.as_ref().map(|p| p.display().to_string())),
        None => None,
    };
    let mut ports: Vec<Port> = dir_names(&dir.join("ports"))
        .into_iter()
        .filter_map(|p| p.parse::<u32>().ok())
        .map(|num| read_port(&dir.join("ports").join(num.to_string()), num))
        .collect();
    ports.sort_by_key(|p| p.num);
    Hca {
        name,
        bdf,
        numa_node,
        pci_path,
        ports,
    }
}

fn read_port(dir: &Path, num: u32) -> Port {
    let state = read_trimmed(&dir.join("state")).unwrap_or_default();
    // IBV_PORT_ACTIVE is 4; ACTIVE_DEFER (5) is not usable, as upstream's check.
    let active = match state.split_once(':') {
        Some((num, _)) => num.trim() == "4",
        None => state.eq_ignore_ascii_case("ACTIVE"),
    };
    let lid = read_trimmed(&dir.join("lid"))
        .and_then(|l| u16::from_str_radix(l.trim_start_matches("0x"), 16).ok())
        .unwrap_or(0);
    let mut gids: Vec<Gid> = dir_names(&dir.join("gids"))
        .into_iter()
        .filter_map(|i| i.parse::<u32>().ok())
        .filter_map(|index| {
            let text = read_trimmed(&dir.join("gids").join(index.to_string()))?;
            let gid: Ipv6Addr = text.parse().ok()?;
            if gid.is_unspecified() {
                return None;
            }
            let kind = match read_trimmed(&dir.join("gid_attrs/types").join(index.to_string())) {
                Some(t) if t.eq_ignore_ascii_case("RoCE v2") => GidKind::RoceV2,
                Some(t) if t.eq_ignore_ascii_case("IB/RoCE v1") => GidKind::IbRoceV1,
                Some(t) => GidKind::Other(t),
                None => GidKind::Other(String::new()),
            };
            Some(Gid { index, gid, kind })
        })
        .collect();
    gids.sort_by_key(|g| g.index);
    Port {
        num,
        state,
        active,
        link_layer: read_trimmed(&dir.join("link_layer")).unwrap_or_default(),
        lid,
        gids,
    }
}

fn read_numa(function: &Path) -> Option<i32> {
    read_trimmed(&function.join("numa_node"))?
        .parse::<i32>()
        .ok()
        .filter(|n| *n >= 0)
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn dir_names(dir: &PathBuf) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Sorts `mlx5_2` before `mlx5_10`: the name without its trailing digits, then their value.
pub fn natural_key(name: &str) -> (&str, u64, &str) {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (stem, num) = name.split_at(name.len() - digits);
    (stem, num.parse().unwrap_or(0), name)
}
