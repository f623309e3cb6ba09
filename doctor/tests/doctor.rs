//! The doctor over synthetic hosts: sysfs trees written by `topology::synthetic`, procfs
//! and /dev trees in a temporary folder, the environment as a map, memlock injected. One
//! test per failure of the seeds' FAQ tables, then exit codes and JSON through the real
//! binary, the selftest, and `--peer` against a live engine process and a closed port.
//!
//! The GPU runtime, where one is needed, is the FAKE runtime of `engine/tests/fake_gpu`
//! (host memory behind the CUDA/MUSA API): no GPU here.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use transfer_engine::topology::synthetic::{PortSpec, Tree};
use transfer_engine::transport::select::Memlock;
use transfer_engine_doctor::{run, Inputs, Report, Status};

const PCI0: &str = "pci0000:00/0000:00:01.0/0000:18:00.0";
const PCI1: &str = "pci0000:80/0000:80:01.0/0000:98:00.0";
const V2_GID: &str = "0000:0000:0000:0000:0000:ffff:0a00:0001";

/// A synthetic host under a fresh temporary folder: `sys/`, `proc/`, `dev/`.
struct Host {
    dir: PathBuf,
    sys: Tree,
    env: BTreeMap<String, String>,
    memlock: Option<Memlock>,
}

impl Host {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "doctor-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("proc/1")).unwrap();
        std::fs::create_dir_all(dir.join("dev")).unwrap();
        let sys = Tree::new(dir.join("sys")).unwrap();
        sys.numa_node(0).unwrap();
        let mut env = BTreeMap::new();
        // Deterministic: no verbs library (this host's may or may not load), no GPU runtime.
        env.insert(
            "MC_IBVERBS_PATH".into(),
            dir.join("no-libibverbs.so.1").display().to_string(),
        );
        env.insert("MC_GPU_RUNTIME".into(), "none".into());
        Self {
            dir,
            sys,
            env,
            memlock: Some(Memlock {
                limit: None,
                cap_ipc_lock: false,
            }),
        }
    }

    fn set(mut self, k: &str, v: &str) -> Self {
        self.env.insert(k.into(), v.into());
        self
    }

    fn hca(self, name: &str, pci: &str, port: PortSpec) -> Self {
        self.sys.hca(name, pci, 0, &[port]).unwrap();
        self
    }

    fn hca_on(self, name: &str, pci: &str, numa: i32, port: PortSpec) -> Self {
        self.sys.numa_node(numa as u32).unwrap();
        self.sys.hca(name, pci, numa, &[port]).unwrap();
        self
    }

    fn uverbs(self) -> Self {
        let d = self.dir.join("dev/infiniband");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("uverbs0"), "").unwrap();
        std::fs::write(d.join("rdma_cm"), "").unwrap();
        self
    }

    fn docker(self) -> Self {
        std::fs::write(self.dir.join(".dockerenv"), "").unwrap();
        self
    }

    fn modules(self, text: &str) -> Self {
        std::fs::write(self.dir.join("proc/modules"), text).unwrap();
        self
    }

    fn inputs(&self) -> Inputs {
        let mut i = Inputs::with_env(self.env.clone());
        i.sysfs_root = self.dir.join("sys");
        i.procfs_root = self.dir.join("proc");
        i.dev_root = self.dir.join("dev");
        i.memlock = self.memlock;
        i
    }

    fn run(&self) -> Report {
        run(&self.inputs())
    }

    /// Env for the binary: roots through the variables it reads.
    fn command(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_mooncake-doctor"));
        c.env_clear()
            .envs(&self.env)
            .env("MC_SYSFS_ROOT", self.dir.join("sys"))
            .env("MC_PROCFS_ROOT", self.dir.join("proc"))
            .env("MC_DEV_ROOT", self.dir.join("dev"))
            .env("MC_LOG_LEVEL", "ERROR");
        c
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn roce() -> PortSpec {
    PortSpec::roce(V2_GID)
}

fn check<'a>(r: &'a Report, id: &str) -> &'a transfer_engine_doctor::Check {
    r.get(id).unwrap_or_else(|| panic!("no check {id}: {r:#?}"))
}

fn fix(r: &Report, id: &str) -> String {
    check(r, id).fix.clone().unwrap_or_default()
}

#[test]
fn no_hca_warns_and_the_decision_is_tcp() {
    let r = Host::new().run();
    let c = check(&r, "rdma.hcas");
    assert_eq!(c.status, Status::Warn, "{c:?}");
    assert!(c.saw.contains("no RDMA device (HCA)"), "{}", c.saw);
    let d = check(&r, "decision");
    assert_eq!(d.data["transports"], json!(["tcp"]), "{d:?}");
    assert!(d.saw.contains("no HCA found, TCP chosen"), "{}", d.saw);
    assert_eq!(r.exit_code(), 1);
}

#[test]
fn no_hca_with_force_hca_fails() {
    let r = Host::new().set("MC_FORCE_HCA", "1").run();
    assert_eq!(check(&r, "rdma.hcas").status, Status::Fail);
    let d = check(&r, "decision");
    assert_eq!(d.status, Status::Fail);
    assert!(
        d.saw
            .contains("MC_FORCE_HCA is set but RDMA cannot be used"),
        "{}",
        d.saw
    );
    assert_eq!(r.exit_code(), 2);
}

#[test]
fn refusals_are_typed_in_the_json_with_their_own_fix() {
    let r = Host::new().set("MC_FORCE_HCA", "1").run();
    let d = check(&r, "decision");
    assert_eq!(d.data["refusal"], "rdma_required", "{d:?}");
    assert!(
        d.data["blockers"]
            .as_array()
            .is_some_and(|b| b.contains(&json!("no_hca"))),
        "{d:?}"
    );
    assert!(fix(&r, "decision").contains("unset MC_FORCE_HCA"));
    for (protocol, refusal, fix_names, blocker) in [
        ("efa", "protocol_not_served", "nvlink_intra", "protocol"),
        ("rmda", "unknown_protocol", "nvlink_intra", "protocol"),
        (
            "musa",
            "gpu_unavailable",
            "MC_GPU_RUNTIME",
            "no_gpu_runtime",
        ),
    ] {
        let mut i = Host::new().inputs();
        i.protocol = protocol.into();
        let r = run(&i);
        let d = check(&r, "decision");
        assert_eq!(d.status, Status::Fail, "{d:?}");
        assert_eq!(d.data["refusal"], refusal, "{d:?}");
        assert_eq!(d.data["blockers"], json!([blocker]), "{d:?}");
        assert!(fix(&r, "decision").contains(fix_names), "{d:?}");
    }
}

#[test]
fn tcp_protocol_makes_missing_rdma_information_only() {
    let mut i = Host::new().inputs();
    i.protocol = "tcp".into();
    let r = run(&i);
    assert_eq!(r.exit_code(), 0, "{}", r.to_table(false));
    assert!(check(&r, "rdma.hcas").saw.contains("RDMA not asked for"));
}

#[test]
fn port_down_says_which_port_and_what_to_check() {
    let h = Host::new()
        .uverbs()
        .hca("mlx5_0", PCI0, roce().with_state("1: DOWN"));
    let r = h.run();
    let c = check(&r, "rdma.hcas");
    assert_eq!(c.status, Status::Warn, "{c:?}");
    assert!(c.saw.contains("mlx5_0: port 1 is not ACTIVE"), "{}", c.saw);
    assert!(
        c.saw.contains("mlx5_0 port 1: 1: DOWN Ethernet"),
        "{}",
        c.saw
    );
    assert!(fix(&r, "rdma.hcas").contains("MC_IB_PORT"));
    assert_eq!(check(&r, "decision").data["transports"], json!(["tcp"]));
}

#[test]
fn hcas_list_ports_gids_and_types() {
    let h = Host::new()
        .uverbs()
        .hca("mlx5_0", PCI0, roce())
        .hca("mlx5_1", PCI1, roce());
    let r = h.run();
    let c = check(&r, "rdma.hcas");
    assert_eq!(c.status, Status::Ok, "{c:?}");
    assert!(
        c.saw
            .contains("usable: mlx5_0 (port 1, GID 1), mlx5_1 (port 1, GID 1)"),
        "{}",
        c.saw
    );
    assert!(c.saw.contains("1 ::ffff:10.0.0.1 (RoCE v2)"), "{}", c.saw);
    assert_eq!(c.data["ports"][0]["gids"][0]["type"], "IB/RoCE v1");
    assert_eq!(c.data["ports"][0]["auto_gid_index"], 1);
    // The verbs library is missing here, so the engine would not use them: said so.
    let d = check(&r, "decision");
    assert_eq!(d.status, Status::Warn, "{d:?}");
    assert!(d.saw.contains("falling back to TCP"), "{}", d.saw);
    assert_eq!(check(&r, "rdma.verbs").status, Status::Warn);
}

#[test]
fn filter_naming_a_missing_hca() {
    let h = Host::new()
        .uverbs()
        .hca("mlx5_0", PCI0, roce())
        .set("MC_TE_FILTERS", "mlx5_9");
    let r = h.run();
    let c = check(&r, "rdma.filters");
    assert_eq!(c.status, Status::Warn, "{c:?}");
    assert!(
        c.saw.contains("MC_TE_FILTERS=mlx5_9") && c.saw.contains("selects: none"),
        "{}",
        c.saw
    );
    assert!(
        fix(&r, "rdma.filters").contains("(mlx5_0)"),
        "{}",
        fix(&r, "rdma.filters")
    );
    assert_eq!(c.data["selected"], json!([]));
    // With MC_FORCE_HCA the same mistake is fatal.
    let r = Host::new()
        .uverbs()
        .hca("mlx5_0", PCI0, roce())
        .set("MC_TE_FILTERS", "mlx5_9")
        .set("MC_FORCE_HCA", "1")
        .run();
    assert_eq!(check(&r, "rdma.filters").status, Status::Fail);
    assert_eq!(r.exit_code(), 2);
}

#[test]
fn legacy_variable_is_named_with_its_replacement() {
    let h = Host::new()
        .uverbs()
        .hca("mlx5_0", PCI0, roce())
        .hca("mlx5_1", PCI1, roce())
        .set("MOONCAKE_RDMA_DEVICES", "mlx5_1");
    let r = h.run();
    let c = check(&r, "rdma.filters");
    assert_eq!(c.status, Status::Warn, "{c:?}");
    assert!(
        c.saw
            .contains("MOONCAKE_RDMA_DEVICES=mlx5_1; selects: mlx5_1"),
        "{}",
        c.saw
    );
    assert!(c.saw.contains("deprecated"), "{}", c.saw);
    assert!(fix(&r, "rdma.filters").contains("use MC_TE_FILTERS"));
    assert_eq!(c.data["from"], "MOONCAKE_RDMA_DEVICES");
    // The legacy variable naming a missing HCA: both problems are said.
    let h = Host::new()
        .uverbs()
        .hca("mlx5_0", PCI0, roce())
        .set("MOONCAKE_RDMA_DEVICES", "mlx5_9");
    let r = h.run();
    let c = check(&r, "rdma.filters");
    assert_eq!(c.status, Status::Warn);
    assert!(
        c.saw.contains("matches none") && c.saw.contains("deprecated"),
        "{}",
        c.saw
    );
    assert!(fix(&r, "rdma.filters").contains("unset the legacy MOONCAKE_RDMA_DEVICES"));
}

#[test]
fn both_variables_set_says_which_wins() {
    let h = Host::new()
        .uverbs()
        .hca("mlx5_0", PCI0, roce())
        .hca("mlx5_1", PCI1, roce())
        .set("MOONCAKE_RDMA_DEVICES", "mlx5_1")
        .set("MC_TE_FILTERS", "mlx5_0");
    let r = h.run();
    let c = check(&r, "rdma.filters");
    assert_eq!(c.status, Status::Warn);
    assert!(
        c.saw.contains("both set") && c.saw.contains("MC_TE_FILTERS wins"),
        "{}",
        c.saw
    );
    assert_eq!(c.data["selected"], json!(["mlx5_0"]));
}

#[test]
fn device_name_narrows_what_is_selected() {
    // The host must outlive the run: dropping it removes its tree.
    let h = Host::new()
        .uverbs()
        .hca("mlx5_0", PCI0, roce())
        .hca("mlx5_1", PCI1, roce());
    let mut i = h.inputs();
    i.device_name = "mlx5_1".into();
    let r = run(&i);
    let c = check(&r, "rdma.filters");
    assert_eq!(c.status, Status::Ok, "{c:?}");
    assert_eq!(c.data["selected"], json!(["mlx5_1"]));
}

/// Builds the FAKE runtime of engine/tests/fake_gpu for `prefix` (cuda or musa).
fn fake_runtime(prefix: &str, file: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("doctor-fake-{prefix}"));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join(file);
    let tmp = dir.join(format!("{file}.{}", std::process::id()));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fake_gpu/fake_runtime.c");
    let ok = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O1", "-pthread"])
        .arg(format!("-DPREFIX={prefix}"))
        .arg("-o")
        .arg(&tmp)
        .arg(&src)
        .status()
        .expect("a C compiler (cc) builds the fake GPU runtime")
        .success();
    assert!(ok);
    std::fs::rename(&tmp, &lib).unwrap();
    lib
}

#[test]
fn peermem_missing_with_a_fake_gpu_runtime() {
    let cuda = fake_runtime("cuda", "libcudart.so.12");
    let h = Host::new()
        .uverbs()
        .hca("mlx5_0", PCI0, roce())
        .set("MC_GPU_RUNTIME", "cuda")
        .set("MC_CUDART_PATH", cuda.to_str().unwrap());
    let r = h.run();
    let g = check(&r, "gpu.runtime");
    assert_eq!(g.status, Status::Ok, "{g:?}");
    assert!(
        g.saw.contains("2 device(s)") && g.saw.contains("(version 12)"),
        "{}",
        g.saw
    );
    let c = check(&r, "rdma.peermem");
    assert_eq!(c.status, Status::Warn, "{c:?}");
    assert!(c.saw.contains("nvidia_peermem"), "{}", c.saw);
    assert!(fix(&r, "rdma.peermem").contains("modprobe nvidia_peermem"));

    // Loaded (as /proc/modules lists it): ok.
    let h = h.modules("nvidia_peermem 16384 0 - Live 0x0000000000000000\nmlx5_ib 1 0 - Live 0x0\n");
    assert_eq!(check(&h.run(), "rdma.peermem").status, Status::Ok);

    // MUSA names its own module.
    let musa = fake_runtime("musa", "libmusart.so.5");
    let r = Host::new()
        .uverbs()
        .hca("mlx5_0", PCI0, roce())
        .set("MC_GPU_RUNTIME", "musa")
        .set("MC_MUSART_PATH", musa.to_str().unwrap())
        .run();
    assert!(
        fix(&r, "rdma.peermem").contains("modprobe mthreads_peermem"),
        "{r:#?}"
    );
}

/// With a GPU runtime that has devices the engine starts same-host GPU IPC on its own
/// accord, whatever the protocol: the decision says so, and says TCP alone with
/// `MC_FORCE_TCP=1`.
#[test]
fn the_decision_names_automatic_ipc_with_a_gpu_runtime_unless_tcp_is_forced() {
    let cuda = fake_runtime("cuda", "libcudart.so.12");
    let h = Host::new()
        .set("MC_GPU_RUNTIME", "cuda")
        .set("MC_CUDART_PATH", cuda.to_str().unwrap());
    let r = h.run();
    let d = check(&r, "decision");
    assert_eq!(
        d.data["transports"],
        json!([
            "ipc (automatic: device memory to engines of this host)",
            "tcp"
        ]),
        "{d:?}"
    );
    assert!(d.saw.contains("automatic (MC_DISABLE_IPC=1"), "{}", d.saw);
    let r = h.set("MC_FORCE_TCP", "1").run();
    assert_eq!(check(&r, "decision").data["transports"], json!(["tcp"]));
}

#[test]
fn runtime_library_missing_lists_what_was_tried() {
    let r = Host::new()
        .set("MC_GPU_RUNTIME", "musa")
        .set("MC_MUSART_PATH", "/nowhere/libmusart.so")
        .run();
    let c = check(&r, "gpu.runtime");
    assert_eq!(c.status, Status::Warn, "{c:?}");
    assert!(c.saw.contains("no GPU runtime loads"), "{}", c.saw);
    assert!(fix(&r, "gpu.runtime").contains("LD_LIBRARY_PATH"));
    let tried = &c.data["tried"][0]["tried"][0];
    assert_eq!(tried["candidate"], "/nowhere/libmusart.so");
    assert_eq!(tried["error"], "no such file");
}

#[test]
fn memlock_low_is_injected_and_named() {
    let mut h = Host::new().uverbs().hca("mlx5_0", PCI0, roce());
    h.memlock = Some(Memlock {
        limit: Some(64 << 10),
        cap_ipc_lock: false,
    });
    let r = h.run();
    let c = check(&r, "rdma.memlock");
    assert_eq!(c.status, Status::Warn, "{c:?}");
    assert!(
        c.saw
            .contains("RLIMIT_MEMLOCK 64 KiB, CAP_IPC_LOCK not held"),
        "{}",
        c.saw
    );
    assert!(fix(&r, "rdma.memlock").contains("memlock=-1"));
    // In a container the fix is the docker flag.
    let h = h.docker();
    assert!(fix(&h.run(), "rdma.memlock")
        .starts_with("start the container with --ulimit memlock=-1:-1"));
    // CAP_IPC_LOCK lifts the limit.
    let mut h = h;
    h.memlock = Some(Memlock {
        limit: Some(64 << 10),
        cap_ipc_lock: true,
    });
    assert_eq!(check(&h.run(), "rdma.memlock").status, Status::Ok);
}

#[test]
fn container_without_dev_infiniband() {
    let h = Host::new().docker().hca("mlx5_0", PCI0, roce());
    let r = h.run();
    let c = check(&r, "rdma.dev");
    assert_eq!(c.status, Status::Warn, "{c:?}");
    assert!(
        c.saw.contains("started without --device /dev/infiniband"),
        "{}",
        c.saw
    );
    assert!(fix(&r, "rdma.dev").contains("--device /dev/infiniband"));
    // Kubernetes, seen through /proc/1/cgroup.
    let h = Host::new().hca("mlx5_0", PCI0, roce());
    std::fs::write(
        h.dir.join("proc/1/cgroup"),
        "0::/kubepods/burstable/pod1/abc\n",
    )
    .unwrap();
    assert!(check(&h.run(), "rdma.dev")
        .saw
        .contains("kubepods container"));
    // With the devices passed: ok.
    let h = Host::new().docker().uverbs().hca("mlx5_0", PCI0, roce());
    assert_eq!(check(&h.run(), "rdma.dev").status, Status::Ok);
}

#[test]
fn bad_variable_fails_the_config_check() {
    let r = Host::new().set("MC_TRANSFER_TIMEOUT", "soon").run();
    let c = check(&r, "config");
    assert_eq!(c.status, Status::Fail);
    assert!(c.saw.contains("MC_TRANSFER_TIMEOUT"), "{}", c.saw);
    assert_eq!(r.exit_code(), 2);
}

#[test]
fn python_facts_two_distributions_and_wrong_python() {
    let mut i = Host::new().inputs();
    i.protocol = "tcp".into();
    i.python = Some(json!({
        "python_version": "3.11.9", "implementation": "cpython", "machine": "x86_64",
        "system": "Linux", "glibc": "2.35",
        "wheel": {"name": "mooncake-transfer-engine-musa", "version": "0.1.0",
                  "tags": ["cp310-cp310-manylinux_2_35_x86_64"]},
        "distributions": [
            {"name": "mooncake-transfer-engine-musa", "version": "0.1.0", "location": "/venv/site-packages", "this_engine": true},
            {"name": "mooncake-transfer-engine", "version": "0.3.12", "location": "/venv/site-packages"}
        ]
    }));
    let r = run(&i);
    let w = check(&r, "python.wheel");
    assert_eq!(w.status, Status::Fail);
    assert!(
        w.saw.contains("needs Python 3.10, this is 3.11"),
        "{}",
        w.saw
    );
    let d = check(&r, "python.distributions");
    assert_eq!(d.status, Status::Fail);
    assert!(
        fix(&r, "python.distributions").contains("`pip uninstall mooncake-transfer-engine`"),
        "{}",
        fix(&r, "python.distributions")
    );
    assert_eq!(r.exit_code(), 2);
}

// --- the binary: exit codes, JSON, table ---

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn exit_codes_and_json_shape_from_the_binary() {
    let h = Host::new();
    let ok = h
        .command()
        .args(["--json", "--protocol", "tcp"])
        .output()
        .unwrap();
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    let doc = json_of(&ok);
    assert_eq!(doc["doctor"], 1);
    assert_eq!(doc["status"], "ok");
    assert_eq!(doc["exit_code"], 0);
    assert!(doc["elapsed_ms"].is_u64());
    let checks = doc["checks"].as_array().unwrap();
    assert_eq!(
        doc["summary"]["ok"].as_u64().unwrap() as usize,
        checks.len()
    );
    for c in checks {
        for key in ["id", "status", "saw", "fix", "data"] {
            assert!(c.get(key).is_some(), "{key} missing in {c}");
        }
    }
    let ids: Vec<&str> = checks.iter().map(|c| c["id"].as_str().unwrap()).collect();
    for id in [
        "config",
        "gpu.runtime",
        "rdma.verbs",
        "rdma.dev",
        "rdma.hcas",
        "rdma.filters",
        "rdma.peermem",
        "rdma.memlock",
        "decision",
    ] {
        assert!(ids.contains(&id), "{id} not in {ids:?}");
    }

    let warn = h.command().arg("--json").output().unwrap();
    assert_eq!(warn.status.code(), Some(1));
    assert_eq!(json_of(&warn)["status"], "warn");

    let fail = h.command().env("MC_FORCE_HCA", "1").output().unwrap();
    assert_eq!(fail.status.code(), Some(2));
    let table = String::from_utf8(fail.stdout).unwrap();
    assert!(table.contains("fail  decision"), "{table}");
    assert!(table.contains("fix: "), "{table}");
    assert!(!table.contains('\x1b'), "colour on a pipe: {table}");

    let bad = h.command().arg("--bogus").output().unwrap();
    assert_eq!(bad.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown argument \"--bogus\""));
}

#[test]
fn roots_on_the_command_line_win_over_the_variables() {
    let h = Host::new().hca("mlx5_0", PCI0, roce());
    let empty = Host::new();
    let out = h
        .command()
        .args(["--json", "--sysfs-root"])
        .arg(empty.dir.join("sys"))
        .output()
        .unwrap();
    let doc = json_of(&out);
    let hcas = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "rdma.hcas")
        .unwrap()
        .clone();
    assert!(
        hcas["saw"].as_str().unwrap().contains("no RDMA device"),
        "{hcas}"
    );
}

/// The soft NIC of engine/tests/soft_nic (a SOFTWARE libibverbs.so.1), built here.
fn soft_nic() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("doctor-soft-nic");
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libibverbs.so.1");
    let tmp = dir.join(format!("libibverbs.so.1.{}", std::process::id()));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/soft_nic");
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O2", "-pthread", "-fvisibility=hidden"])
        .arg("-Wl,-soname,libibverbs.so.1")
        .arg(format!(
            "-Wl,--version-script={}",
            src.join("softnic.map").display()
        ))
        .arg("-o")
        .arg(&tmp)
        .arg(src.join("softnic.c"))
        .output()
        .expect("a C compiler (cc) builds the soft NIC");
    assert!(
        out.status.success(),
        "building the soft NIC failed (it needs rdma-core's headers: apt-get install libibverbs-dev):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, &lib).unwrap();
    lib
}

#[test]
fn decision_over_the_soft_nic_is_rdma_with_hcas_per_location() {
    let lib = soft_nic();
    let h = Host::new()
        .uverbs()
        .hca_on("soft_0", PCI0, 0, roce())
        .hca_on("soft_1", PCI1, 1, roce())
        .set("MC_IBVERBS_PATH", lib.to_str().unwrap());
    let out = h
        .command()
        .env("SOFTNIC_HCAS", "soft_0,soft_1")
        .arg("--json")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let doc = json_of(&out);
    let by_id = |id: &str| {
        doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(
        by_id("rdma.verbs")["data"]["devices"],
        json!(["soft_0", "soft_1"])
    );
    let d = by_id("decision");
    assert_eq!(d["data"]["transports"], json!(["rdma", "tcp"]), "{d}");
    let hcas: Vec<&str> = d["data"]["hcas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["name"].as_str().unwrap())
        .collect();
    assert_eq!(hcas, ["soft_0", "soft_1"]);
    // Each CPU node prefers the HCA on its own node.
    assert_eq!(d["data"]["matrix"]["cpu:0"][0], json!(["soft_0"]), "{d}");
    assert_eq!(d["data"]["matrix"]["cpu:1"][0], json!(["soft_1"]), "{d}");
    // The allow-list narrows the decision too.
    let out = h
        .command()
        .env("SOFTNIC_HCAS", "soft_0,soft_1")
        .env("MC_TE_FILTERS", "soft_1")
        .arg("--json")
        .output()
        .unwrap();
    let doc = json_of(&out);
    let d = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "decision")
        .unwrap();
    assert_eq!(d["data"]["hcas"][0]["name"], "soft_1", "{d}");
    assert_eq!(d["data"]["hcas"].as_array().unwrap().len(), 1);
}

// --- selftest and peer ---

#[test]
fn selftest_moves_verified_bytes() {
    let mut i = Host::new().inputs();
    i.protocol = "tcp".into();
    i.selftest = true;
    i.budget = Duration::from_secs(10);
    let r = run(&i);
    let c = check(&r, "selftest");
    assert_eq!(c.status, Status::Ok, "{c:?}");
    assert_eq!(c.data["verified"], true);
    assert_eq!(c.data["bytes"], 32 << 20);
    assert!(c.data["write_gbps"].as_f64().unwrap() > 0.0);
    assert_eq!(c.data["protocols"], json!(["tcp"]));
}

#[test]
fn selftest_with_an_unservable_protocol_fails_saying_why() {
    let mut i = Host::new().inputs();
    i.protocol = "efa".into();
    i.selftest = true;
    let r = run(&i);
    let c = check(&r, "selftest");
    assert_eq!(c.status, Status::Fail);
    assert!(c.saw.contains("not served by this engine"), "{}", c.saw);
}

/// A live engine for the `--peer` probe: one of this test process, which the probe reaches
/// over loopback TCP as it would another process's (the doctor opens its own engine).
fn live_peer() -> (transfer_engine::TransferEngine, transfer_engine::HostBuffer) {
    let e = transfer_engine::TransferEngine::new(
        "127.0.0.1",
        transfer_engine::P2P_HANDSHAKE,
        transfer_engine::Config::default(),
    )
    .unwrap();
    let buf = transfer_engine::HostBuffer::new(1 << 20);
    e.register_memory(buf.addr(), 1 << 20, "cpu:0").unwrap();
    (e, buf)
}

#[test]
fn peer_live_engine() {
    let (peer, _buf) = live_peer();
    let session = peer.session_id().to_owned();
    let mut i = Host::new().inputs();
    i.protocol = "tcp".into();
    i.peer = Some(session.clone());
    let r = run(&i);
    let c = check(&r, "peer");
    assert_eq!(c.status, Status::Ok, "{c:?}");
    assert!(
        c.saw.contains("serves tcp with 1 buffer(s), 1048576 bytes"),
        "{}",
        c.saw
    );
    assert!(c.saw.contains("accepts connections"), "{}", c.saw);
    assert_eq!(c.data["segment"], session.as_str());
}

#[test]
fn peer_closed_port_fails_clearly() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let h = Host::new();
    let t = Instant::now();
    let out = h
        .command()
        .args(["--protocol", "tcp", "--peer", &format!("127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table.contains("fail  peer") && table.contains(&format!("probe of 127.0.0.1:{port}")),
        "{table}"
    );
    assert!(table.to_lowercase().contains("refused"), "{table}");
    assert!(table.contains("is an engine running there"), "{table}");
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn peer_that_never_answers_is_bounded_by_the_timeout() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let mut i = Host::new().inputs();
    i.protocol = "tcp".into();
    i.peer = Some(format!("127.0.0.1:{port}"));
    i.budget = Duration::from_secs(1);
    let t = Instant::now();
    let r = run(&i);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let c = check(&r, "peer");
    assert_eq!(c.status, Status::Fail);
    assert_eq!(c.data["step"], "probe");
    drop(l);
}
