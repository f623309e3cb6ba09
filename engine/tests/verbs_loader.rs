//! The verbs loader on this machine: no RDMA hardware and a kernel without
//! RDMA support, with Debian's real `libibverbs1` installed. Every outcome
//! must be an ordinary [`VerbsUnavailable`] with the right reason; nothing
//! may crash. Cases that read `MC_IBVERBS_PATH` run in a child process
//! (this test binary re-run), so no test changes its own environment.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

use std::path::Path;
use std::process::Command;

use transfer_engine::verbs::{Verbs, VerbsError, VerbsUnavailable};

const CHILD: &str = "VERBS_LOADER_CHILD";

/// Runs `test` of this binary in a child with `env` set; returns its stdout.
fn run_child(test: &str, env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env_remove("MC_IBVERBS_PATH");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "child {test} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The child's `RESULT ...` line (the harness may print its test name first).
fn result_line(out: &str) -> &str {
    let at = out
        .find("RESULT")
        .unwrap_or_else(|| panic!("no RESULT in {out}"));
    out[at..].lines().next().unwrap_or_default()
}

/// Child side: prints what `Verbs::load()` (from the environment) gave.
#[test]
fn child_load_from_env() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    match Verbs::load() {
        Ok(v) => println!("RESULT loaded {}", v.path()),
        Err(e) => println!("RESULT unavailable {e:?} | {e}"),
    }
}

#[test]
fn override_naming_a_missing_file_is_unavailable_naming_the_path() {
    let out = run_child(
        "child_load_from_env",
        &[("MC_IBVERBS_PATH", "/nonexistent/dir/libibverbs.so.1")],
    );
    let line = result_line(&out);
    assert!(line.starts_with("RESULT unavailable NotLoaded"), "{line}");
    assert!(
        line.contains("/nonexistent/dir/libibverbs.so.1: no such file"),
        "{line}"
    );
    // The override is the only candidate: no silent switch to the system library.
    assert!(!line.contains("\"libibverbs.so.1\""), "{line}");
    assert!(
        line.contains("MC_IBVERBS_PATH"),
        "the message says what to do: {line}"
    );
}

#[test]
fn override_naming_a_file_that_is_not_a_library_keeps_dlerror() {
    let dir = std::env::temp_dir().join(format!("verbs-loader-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bogus = dir.join("libibverbs.so.1");
    std::fs::write(&bogus, b"not an ELF file").unwrap();
    let out = run_child(
        "child_load_from_env",
        &[("MC_IBVERBS_PATH", bogus.to_str().unwrap())],
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let line = result_line(&out);
    assert!(line.starts_with("RESULT unavailable NotLoaded"), "{line}");
    // dlerror's text for a file that is not an ELF object.
    assert!(
        line.contains("invalid ELF header") || line.contains("file too short"),
        "{line}"
    );
}

#[test]
fn a_library_without_the_verbs_is_missing_symbol() {
    let err = Verbs::load_from(&["libc.so.6".into()]).unwrap_err();
    match &err {
        VerbsUnavailable::MissingSymbol { path, symbol } => {
            assert_eq!(path, "libc.so.6");
            assert_eq!(symbol, "ibv_get_device_list@IBVERBS_1.1");
        }
        other => panic!("expected MissingSymbol, got {other:?}"),
    }
    assert!(err.to_string().contains("not a usable libibverbs"), "{err}");
}

/// Debian's libibverbs1 on a kernel without `CONFIG_INFINIBAND`: the library
/// loads, listing devices fails with ENOSYS, and that is reported as "no
/// RDMA support in the kernel". With `/sys/class/infiniband` present but
/// empty it is "no RDMA device"; on a host with devices they are listed.
#[test]
fn system_libibverbs_without_rdma_is_unavailable_with_the_reason() {
    let verbs = match Verbs::load_from(&["libibverbs.so.1".into()]) {
        Ok(v) => v,
        Err(e) => {
            // Only where rdma-core is not installed (scripts/install-deps.sh installs it).
            assert!(matches!(e, VerbsUnavailable::NotLoaded { .. }), "{e:?}");
            assert!(e.to_string().contains("libibverbs.so.1"), "{e}");
            eprintln!("SKIP: libibverbs.so.1 is not installed: {e}");
            return;
        }
    };
    assert_eq!(verbs.path(), "libibverbs.so.1");
    let ib = Path::new("/sys/class/infiniband");
    let has_devices = std::fs::read_dir(ib)
        .map(|d| d.count() > 0)
        .unwrap_or(false);
    match verbs.devices() {
        Err(VerbsError::Unavailable(u @ VerbsUnavailable::NoKernelSupport { .. })) => {
            assert!(!ib.exists(), "ENOSYS although {} exists", ib.display());
            let text = u.to_string();
            assert!(text.contains("the kernel has no RDMA support"), "{text}");
            assert!(text.contains("libibverbs.so.1"), "{text}");
        }
        Err(VerbsError::Unavailable(u @ VerbsUnavailable::NoDevice { .. })) => {
            assert!(!has_devices, "{u} although {} lists devices", ib.display());
            assert!(
                ib.exists(),
                "no {} should be ENOSYS, not {u:?}",
                ib.display()
            );
            assert!(u.to_string().contains("no RDMA device"), "{u}");
        }
        Ok(devs) => {
            assert!(has_devices && !devs.is_empty(), "{devs:?}");
            return;
        }
        Err(other) => panic!("unexpected: {other:?}"),
    }
    // Opening by name reports the same reason, not "no such device".
    let err = verbs.open("mlx5_0").unwrap_err();
    assert!(matches!(err, VerbsError::Unavailable(_)), "{err:?}");
    // Loading again (dlopen reference counting) gives the same answer.
    let again = Verbs::load_from(&["libibverbs.so.1".into()]).unwrap();
    assert_eq!(
        again.devices().unwrap_err().to_string(),
        verbs.devices().unwrap_err().to_string()
    );
}

/// With no override, `Verbs::load()` finds the system library by its soname.
#[test]
fn default_candidates_find_the_system_library() {
    let out = run_child("child_load_from_env", &[]);
    let line = result_line(&out);
    if line.starts_with("RESULT loaded") {
        assert_eq!(line, "RESULT loaded libibverbs.so.1");
    } else {
        assert!(
            line.contains("libibverbs.so.1") && line.contains("libibverbs.so"),
            "{line}"
        );
    }
}
