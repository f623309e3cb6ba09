//! Writes synthetic sysfs trees in the kernel's layout, for tests and for trying
//! `MC_SYSFS_ROOT` by hand: PCI functions under `devices/`, `bus/pci/devices/<bdf>` links,
//! HCAs under `class/infiniband/<dev>` with ports and GID tables, NUMA nodes. Links are
//! relative, so paths resolve inside the tree wherever it is.

use std::io;
use std::path::{Path, PathBuf};

/// One port to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    /// Contents of `state` (`4: ACTIVE`, `1: DOWN`).
    pub state: String,
    /// `Ethernet` or `InfiniBand`.
    pub link_layer: String,
    /// GID table: (GID text, type text), by index.
    pub gids: Vec<(String, String)>,
}

impl PortSpec {
    /// An ACTIVE RoCE port: GID 0 link-local (`IB/RoCE v1`), GID 1 `v2_gid` (`RoCE v2`).
    pub fn roce(v2_gid: &str) -> Self {
        Self {
            state: "4: ACTIVE".into(),
            link_layer: "Ethernet".into(),
            gids: vec![
                (
                    "fe80:0000:0000:0000:0000:0000:0000:0001".into(),
                    "IB/RoCE v1".into(),
                ),
                (v2_gid.into(), "RoCE v2".into()),
            ],
        }
    }

    /// The same port with another `state`.
    pub fn with_state(mut self, state: &str) -> Self {
        self.state = state.into();
        self
    }
}

/// A sysfs tree under `root` (which stands for `/sys`).
#[derive(Debug, Clone)]
pub struct Tree {
    /// The directory standing for `/sys`.
    pub root: PathBuf,
}

impl Tree {
    /// A tree at `root` (created).
    pub fn new(root: impl Into<PathBuf>) -> io::Result<Self> {
        let root = root.into();
        std::fs::create_dir_all(&root)?;
        Ok(Self { root })
    }

    /// Adds NUMA node `n`.
    pub fn numa_node(&self, n: u32) -> io::Result<()> {
        std::fs::create_dir_all(self.root.join(format!("devices/system/node/node{n}")))
    }

    /// Adds a PCI function at `devices/<path>` (its last component is the BDF), on NUMA
    /// node `numa`, linked from `bus/pci/devices/<bdf>`. Returns the BDF.
    pub fn pci_function(&self, path: &str, numa: i32) -> io::Result<String> {
        let dir = self.root.join("devices").join(path);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("numa_node"), format!("{numa}\n"))?;
        let bdf = path.rsplit('/').next().unwrap_or(path).to_string();
        let links = self.root.join("bus/pci/devices");
        std::fs::create_dir_all(&links)?;
        symlink(&format!("../../../devices/{path}"), &links.join(&bdf))?;
        Ok(bdf)
    }

    /// Adds HCA `name` for the PCI function at `devices/<pci_path>` (written if absent)
    /// with `ports` numbered from 1.
    pub fn hca(&self, name: &str, pci_path: &str, numa: i32, ports: &[PortSpec]) -> io::Result<()> {
        if !self.root.join("devices").join(pci_path).exists() {
            self.pci_function(pci_path, numa)?;
        }
        let dir = self.root.join("class/infiniband").join(name);
        std::fs::create_dir_all(&dir)?;
        symlink(&format!("../../../devices/{pci_path}"), &dir.join("device"))?;
        for (i, port) in ports.iter().enumerate() {
            let p = dir.join(format!("ports/{}", i + 1));
            std::fs::create_dir_all(p.join("gids"))?;
            std::fs::create_dir_all(p.join("gid_attrs/types"))?;
            std::fs::write(p.join("state"), format!("{}\n", port.state))?;
            std::fs::write(p.join("phys_state"), "5: LinkUp\n")?;
            std::fs::write(p.join("link_layer"), format!("{}\n", port.link_layer))?;
            std::fs::write(p.join("lid"), "0x0\n")?;
            for (index, (gid, kind)) in port.gids.iter().enumerate() {
                std::fs::write(p.join("gids").join(index.to_string()), format!("{gid}\n"))?;
                std::fs::write(
                    p.join("gid_attrs/types").join(index.to_string()),
                    format!("{kind}\n"),
                )?;
            }
        }
        Ok(())
    }
}

fn symlink(target: &str, link: &Path) -> io::Result<()> {
    match std::os::unix::fs::symlink(target, link) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}
