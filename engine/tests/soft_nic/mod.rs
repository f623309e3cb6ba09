//! The soft NIC for integration tests: a SOFTWARE stand-in for `libibverbs.so.1`
//! (softnic.c; see README.md next to it) built once per test binary, and
//! [`SoftFabric`], one fabric (registry directory plus a matching synthetic sysfs
//! tree) whose environment a child process is started with.

#![allow(dead_code)]

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// This directory; the same path from the engine crate and from `tests/` (e2e).
pub fn source_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/soft_nic")
}

/// Cargo's scratch directory of the tests: named to test targets when they are built, and
/// to the test child binary (`tests/child/`) by its parent, as the variable.
fn scratch_dir() -> PathBuf {
    option_env!("CARGO_TARGET_TMPDIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("CARGO_TARGET_TMPDIR").map(PathBuf::from))
        .expect("CARGO_TARGET_TMPDIR: from Cargo in a test, from the parent test in its child")
}

/// Where this test binary's soft NIC build lives.
pub fn build_dir() -> PathBuf {
    scratch_dir().join("soft-nic")
}

fn cc() -> Command {
    Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
}

/// Runs a C build, panicking with its output and a hint when it fails.
fn run_cc(mut cmd: Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("a C compiler (cc) is needed to build {what}: {e}"));
    assert!(
        out.status.success(),
        "building {what} failed (the soft NIC needs Debian's rdma-core headers: \
         apt-get install libibverbs-dev, or scripts/install-deps.sh):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The soft NIC, `<build_dir>/libibverbs.so.1`, compiled on first use.
pub fn library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = build_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let lib = dir.join("libibverbs.so.1");
        let src = source_dir();
        let mut cmd = cc();
        cmd.args([
            "-shared",
            "-fPIC",
            "-O2",
            "-pthread",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fvisibility=hidden",
            "-Wl,-soname,libibverbs.so.1",
        ])
        .arg(format!(
            "-Wl,--version-script={}",
            src.join("softnic.map").display()
        ))
        .arg("-o")
        .arg(&lib)
        .arg(src.join("softnic.c"));
        run_cc(cmd, "the soft NIC (softnic.c)");
        lib
    })
}

/// One HCA of a fabric: its name, where it sits on the PCI tree, its NUMA node.
#[derive(Clone, Debug)]
pub struct HcaSpec {
    pub name: String,
    /// Path below `devices/`, ending in the HCA's PCI address, e.g.
    /// `pci0000:00/0000:00:01.0/0000:10:00.0`.
    pub pci_path: String,
    pub numa_node: u32,
    /// Port 1 DOWN (`SOFTNIC_DOWN` for the library, `1: DOWN` in sysfs).
    pub down: bool,
}

impl HcaSpec {
    /// The `index`-th HCA behind its own root-port bridge, on NUMA node 0.
    pub fn new(name: &str, index: usize) -> Self {
        HcaSpec {
            name: name.to_string(),
            pci_path: format!(
                "pci0000:00/0000:00:{:02x}.0/0000:{:02x}:00.0",
                index + 1,
                index + 0x10
            ),
            numa_node: 0,
            down: false,
        }
    }

    pub fn numa(mut self, node: u32) -> Self {
        self.numa_node = node;
        self
    }

    pub fn pci(mut self, path: &str) -> Self {
        self.pci_path = path.to_string();
        self
    }

    pub fn port_down(mut self) -> Self {
        self.down = true;
        self
    }

    /// The PCI address (last component of the path).
    pub fn bdf(&self) -> &str {
        self.pci_path.rsplit('/').next().unwrap_or(&self.pci_path)
    }
}

/// The soft NIC's GIDs (the contract in the integrator's interfaces brief): index 0
/// `fe80::<i+1>` (RoCE v1), index 1 `::ffff:127.0.<i+1>.1` (RoCE v2).
pub fn gid_text(hca_index: usize, gid_index: usize) -> String {
    let n = hca_index + 1;
    if gid_index == 0 {
        format!("fe80:0000:0000:0000:0000:0000:0000:{n:04x}")
    } else {
        format!("0000:0000:0000:0000:0000:ffff:7f00:{n:02x}01")
    }
}

/// A fresh soft fabric: its registry directory (`SOFTNIC_DIR`) and a synthetic
/// sysfs tree (`MC_SYSFS_ROOT`) describing the same HCAs. Removed on drop.
pub struct SoftFabric {
    root: PathBuf,
    hcas: Vec<HcaSpec>,
}

impl SoftFabric {
    /// HCAs with default placement ([`HcaSpec::new`]).
    pub fn new(hcas: &[&str]) -> Self {
        Self::with_hcas(
            hcas.iter()
                .enumerate()
                .map(|(i, n)| HcaSpec::new(n, i))
                .collect(),
        )
    }

    pub fn with_hcas(hcas: Vec<HcaSpec>) -> Self {
        library();
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let root = scratch_dir().join(format!(
            "soft-fabric/{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("registry")).unwrap();
        let fabric = SoftFabric { root, hcas };
        fabric.write_sysfs();
        fabric
    }

    pub fn hcas(&self) -> &[HcaSpec] {
        &self.hcas
    }

    /// `SOFTNIC_DIR`.
    pub fn dir(&self) -> PathBuf {
        self.root.join("registry")
    }

    /// `MC_SYSFS_ROOT`.
    pub fn sysfs_root(&self) -> PathBuf {
        self.root.join("sys")
    }

    /// The variables a process on this fabric needs.
    pub fn envs(&self) -> Vec<(&'static str, OsString)> {
        let names: Vec<&str> = self.hcas.iter().map(|h| h.name.as_str()).collect();
        let down: Vec<&str> = self
            .hcas
            .iter()
            .filter(|h| h.down)
            .map(|h| h.name.as_str())
            .collect();
        vec![
            ("MC_IBVERBS_PATH", library().as_os_str().to_owned()),
            ("SOFTNIC_HCAS", names.join(",").into()),
            ("SOFTNIC_DOWN", down.join(",").into()),
            ("SOFTNIC_DIR", self.dir().into_os_string()),
            ("MC_SYSFS_ROOT", self.sysfs_root().into_os_string()),
        ]
    }

    pub fn apply_to(&self, cmd: &mut Command) {
        for (k, v) in self.envs() {
            cmd.env(k, v);
        }
    }

    fn write_sysfs(&self) {
        let sys = self.sysfs_root();
        let write = |p: PathBuf, s: &str| {
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, s).unwrap();
        };
        let link = |target: &str, at: PathBuf| {
            std::fs::create_dir_all(at.parent().unwrap()).unwrap();
            std::os::unix::fs::symlink(target, at).unwrap();
        };
        let mut nodes: Vec<u32> = self.hcas.iter().map(|h| h.numa_node).collect();
        nodes.push(0);
        nodes.sort_unstable();
        nodes.dedup();
        for n in nodes {
            std::fs::create_dir_all(sys.join(format!("devices/system/node/node{n}"))).unwrap();
        }
        for (i, h) in self.hcas.iter().enumerate() {
            let pci = sys.join("devices").join(&h.pci_path);
            write(pci.join("numa_node"), &format!("{}\n", h.numa_node));
            let ib = pci.join("infiniband").join(&h.name);
            let port = ib.join("ports/1");
            let (state, phys) = if h.down {
                ("1: DOWN\n", "3: Disabled\n")
            } else {
                ("4: ACTIVE\n", "5: LinkUp\n")
            };
            write(port.join("state"), state);
            write(port.join("phys_state"), phys);
            write(port.join("link_layer"), "Ethernet\n");
            write(port.join("lid"), "0x0\n");
            for (g, ty) in [(0, "IB/RoCE v1"), (1, "RoCE v2")] {
                write(
                    port.join(format!("gids/{g}")),
                    &format!("{}\n", gid_text(i, g)),
                );
                write(
                    port.join(format!("gid_attrs/types/{g}")),
                    &format!("{ty}\n"),
                );
                write(port.join(format!("gid_attrs/ndevs/{g}")), "lo\n");
            }
            link("../..", ib.join("device"));
            link(
                &format!("../../devices/{}/infiniband/{}", h.pci_path, h.name),
                sys.join("class/infiniband").join(&h.name),
            );
            let bus = sys.join("bus/pci/devices").join(h.bdf());
            if !bus.exists() {
                link(&format!("../../../devices/{}", h.pci_path), bus);
            }
        }
    }
}

impl Drop for SoftFabric {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// `cmd`, a child process of the tests, with `fabric`'s environment, protocol `rdma`
/// (`TE_TEST_PROTOCOL`), and none of the caller's RDMA selection variables
/// (`MC_FORCE_TCP`, `MC_FORCE_HCA`, `MC_TE_FILTERS`, `MOONCAKE_RDMA_DEVICES`).
pub fn rdma_child(mut cmd: Command, fabric: &SoftFabric) -> Command {
    cmd.env("TE_TEST_PROTOCOL", "rdma")
        .env_remove("MC_FORCE_TCP")
        .env_remove("MC_FORCE_HCA")
        .env_remove("MC_TE_FILTERS")
        .env_remove("MOONCAKE_RDMA_DEVICES");
    fabric.apply_to(&mut cmd);
    cmd
}
