//! The soft NIC (a SOFTWARE stand-in for libibverbs.so.1, tests/soft_nic/) checked on
//! its own, before any engine runs over it: a C program built against the real
//! rdma-core headers and linked against the real libibverbs runs as two processes
//! over it (LD_LIBRARY_PATH), moving verified bytes with RDMA WRITE and READ, and
//! meeting the completion statuses a real RC queue pair gives.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod soft_nic;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use soft_nic::SoftFabric;

/// selftest.c, linked against the system's real libibverbs (libibverbs-dev).
fn selftest() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = soft_nic::build_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("selftest");
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/soft_nic/selftest.c");
        let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(["-O2", "-pthread", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&bin)
            .arg(&src)
            .arg("-libverbs")
            .output()
            .expect("a C compiler (cc) is needed");
        assert!(
            out.status.success(),
            "building selftest.c failed (needs libibverbs-dev: scripts/install-deps.sh):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        bin
    })
}

fn run(fabric: &SoftFabric, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(selftest());
    cmd.args(args);
    fabric.apply_to(&mut cmd);
    // The program links the real libibverbs.so.1; the soft NIC replaces it here.
    cmd.env("LD_LIBRARY_PATH", soft_nic::library().parent().unwrap());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn passes(fabric: &SoftFabric, args: &[&str], env: &[(&str, &str)]) -> String {
    let out = run(fabric, args, env);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "selftest {args:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn transfers_over(hcas: &[&str]) {
    let fabric = SoftFabric::new(hcas);
    let out = passes(&fabric, &["xfer", &hcas.len().to_string()], &[]);
    for h in hcas {
        assert!(
            out.contains(&format!(
                "hca {h}: WRITE, batched WRITE, 2-SGE WRITE, READ, reverse WRITE verified"
            )),
            "{out}"
        );
    }
}

#[test]
fn write_and_read_between_processes_one_hca() {
    transfers_over(&["soft_0"]);
}

#[test]
fn write_and_read_between_processes_two_hcas() {
    transfers_over(&["soft_0", "soft_1"]);
}

#[test]
fn write_and_read_between_processes_four_hcas() {
    transfers_over(&["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]);
}

macro_rules! negative_cases {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            let fabric = SoftFabric::new(&["soft_0"]);
            let out = passes(&fabric, &["neg", stringify!($name)], &[]);
            assert!(out.contains(concat!("case ", stringify!($name), ": ok")) || out.contains("peer killed"), "{out}");
        }
    )*};
}

// Each case is described where selftest.c checks it; in short:
// bad rkey, out of bounds (above and below), no REMOTE_WRITE on the MR or the QP,
// no REMOTE_READ -> REM_ACCESS_ERR; bad lkey, lkey out of bounds, READ into an MR
// without LOCAL_WRITE -> LOC_PROT_ERR; post before RTS -> EINVAL and no completion;
// peer QP not yet RTR, peer QP destroyed -> RETRY_EXC_ERR; peer SIGKILLed ->
// RETRY_EXC_ERR then FLUSH_ERR for the rest of the batch; max_send_wr -> ENOMEM.
negative_cases!(
    bad_rkey,
    oob,
    oob_below,
    no_remote_write,
    qp_no_remote_write,
    no_remote_read,
    bad_lkey,
    lkey_oob,
    read_into_readonly,
    not_rts,
    peer_not_ready,
    peer_killed,
    peer_qp_destroyed,
    max_send_wr,
);

#[test]
fn injected_remote_access_error_then_flush() {
    let fabric = SoftFabric::new(&["soft_0"]);
    passes(
        &fabric,
        &["neg", "inject"],
        &[("SOFTNIC_FAIL", "rem_access@2")],
    );
}

#[test]
fn the_injection_case_fails_without_the_injection() {
    // Proves the selftest's checks can fail: the same case with nothing injected.
    let fabric = SoftFabric::new(&["soft_0"]);
    let out = run(&fabric, &["neg", "inject"], &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("want 2 'remote access error'"), "{err}");
}

#[test]
fn injected_retry_exceeded_on_one_hca() {
    let fabric = SoftFabric::new(&["soft_0", "soft_1"]);
    let out = run(
        &fabric,
        &["xfer", "2"],
        &[("SOFTNIC_FAIL", "retry_exc@hca:soft_1")],
    );
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("hca soft_0: WRITE"), "{stdout}");
    assert!(
        stderr.contains("transport retry counter exceeded"),
        "{stderr}"
    );
}

#[test]
fn concurrent_posts_on_one_qp_while_polling() {
    let fabric = SoftFabric::new(&["soft_0"]);
    let out = passes(&fabric, &["threads"], &[]);
    assert!(
        out.contains("threads: 8000 completions in order per thread"),
        "{out}"
    );
}

#[test]
fn qp_state_machine_and_port_contract() {
    let fabric = SoftFabric::new(&["soft_0"]);
    assert!(passes(&fabric, &["states"], &[]).contains("states: ok"));
}

#[test]
fn a_down_hca_is_listed_with_its_port_down() {
    let fabric = SoftFabric::with_hcas(vec![
        soft_nic::HcaSpec::new("soft_0", 0),
        soft_nic::HcaSpec::new("soft_1", 1).port_down(),
    ]);
    let out = passes(&fabric, &["list"], &[]);
    assert_eq!(out, "soft_0 active\nsoft_1 down\n");
    let state = fabric
        .sysfs_root()
        .join("class/infiniband/soft_1/ports/1/state");
    assert_eq!(std::fs::read_to_string(state).unwrap(), "1: DOWN\n");
}

#[test]
fn sysfs_tree_describes_the_same_hcas() {
    let fabric = SoftFabric::with_hcas(vec![
        soft_nic::HcaSpec::new("soft_0", 0),
        soft_nic::HcaSpec::new("soft_1", 1).numa(1),
    ]);
    let sys = fabric.sysfs_root();
    let read = |p: &str| std::fs::read_to_string(sys.join(p)).unwrap();
    assert_eq!(read("class/infiniband/soft_0/ports/1/state"), "4: ACTIVE\n");
    assert_eq!(
        read("class/infiniband/soft_0/ports/1/link_layer"),
        "Ethernet\n"
    );
    assert_eq!(
        read("class/infiniband/soft_1/ports/1/gids/0"),
        "fe80:0000:0000:0000:0000:0000:0000:0002\n"
    );
    assert_eq!(
        read("class/infiniband/soft_1/ports/1/gids/1"),
        "0000:0000:0000:0000:0000:ffff:7f00:0201\n"
    );
    assert_eq!(
        read("class/infiniband/soft_1/ports/1/gid_attrs/types/1"),
        "RoCE v2\n"
    );
    assert_eq!(read("class/infiniband/soft_1/device/numa_node"), "1\n");
    assert!(sys.join("devices/system/node/node1").is_dir());
    // Upstream takes the PCI address from realpath(class/infiniband/<dev>/../..).
    let dev = std::fs::canonicalize(sys.join("class/infiniband/soft_1/../..")).unwrap();
    assert_eq!(dev.file_name().unwrap(), "0000:11:00.0");
    let bus = std::fs::canonicalize(sys.join("bus/pci/devices/0000:11:00.0")).unwrap();
    assert_eq!(bus, dev);
}

/// Every symbol the soft NIC exports carries the version the real rdma-core
/// library gives it, so binaries linked against the real one resolve against it.
#[test]
fn exports_rdma_core_symbol_versions() {
    fn exports(lib: &Path) -> Vec<(String, String)> {
        let out = Command::new("objdump")
            .arg("-T")
            .arg(lib)
            .output()
            .expect("objdump (binutils)");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(" DF .text"))
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let (ver, name) = (f[f.len() - 2], f[f.len() - 1]);
                // "(IBVERBS_1.0)" marks a hidden compatibility version.
                (!ver.starts_with('(')).then(|| (name.to_string(), ver.to_string()))
            })
            .collect()
    }
    let ours = exports(soft_nic::library());
    let real = [
        "/usr/lib/x86_64-linux-gnu/libibverbs.so.1",
        "/usr/lib/aarch64-linux-gnu/libibverbs.so.1",
        "/usr/lib64/libibverbs.so.1",
    ]
    .iter()
    .map(Path::new)
    .find(|p| p.exists())
    .expect("the real libibverbs.so.1 (libibverbs1, installed with libibverbs-dev)");
    let real = exports(real);
    assert!(ours.len() >= 30, "{ours:?}");
    for (name, ver) in &ours {
        assert!(
            real.iter().any(|(n, v)| n == name && v == ver),
            "{name}@@{ver} is not how rdma-core exports {name}"
        );
    }
}

/// Small run of the benchmark mode: bytes verified, figures printed (timings on a
/// shared machine are not asserted; see README.md for the full command).
#[test]
fn bench_mode_runs_and_prints_the_ratio() {
    let fabric = SoftFabric::new(&["soft_0"]);
    let out = passes(&fabric, &["bench", "65536", "200"], &[]);
    assert!(
        out.contains("raw process_vm_writev") && out.contains("ratio"),
        "{out}"
    );
    print!("{out}");
    // Cycling over 16 blocks (and fewer WRITEs than blocks): every written block verified.
    for iters in ["200", "10"] {
        let fabric = SoftFabric::new(&["soft_0"]);
        let out = passes(&fabric, &["bench", "65536", iters, "1048576"], &[]);
        assert!(out.contains("span 1048576:"), "{out}");
        print!("{out}");
    }
}
