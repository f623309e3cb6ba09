//! The verbs loader on this machine: no RDMA hardware and a kernel without
//! RDMA support, with Debian's real `libibverbs1` installed. Every outcome
//! must be an ordinary [`VerbsUnavailable`] with the right reason; nothing
//! may crash. Cases that read `MC_IBVERBS_PATH` run in a child process
//! (`te-test-child verbs-load`, `tests/child/`), so no test changes its own environment.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod common;

use std::path::Path;

use transfer_engine::verbs::{Verbs, VerbsError, VerbsUnavailable};

/// Runs `te-test-child verbs-load` with `env` set; returns its output.
fn run_child(env: &[(&str, &str)]) -> String {
    let mut cmd = common::child_command("verbs-load");
    cmd.env_remove("MC_IBVERBS_PATH").envs(env.iter().copied());
    common::run_passing(cmd, "verbs-load")
}

/// The child's `RESULT ...` line.
fn result_line(out: &str) -> &str {
    let at = out
        .find("RESULT")
        .unwrap_or_else(|| panic!("no RESULT in {out}"));
    out[at..].lines().next().unwrap_or_default()
}

/// Debian's `libibverbs1`, which scripts/install-deps.sh installs (with libibverbs-dev).
fn system_verbs() -> std::sync::Arc<Verbs> {
    Verbs::load_from(&["libibverbs.so.1".into()]).unwrap_or_else(|e| {
        panic!(
            "libibverbs.so.1 does not load ({e}): these tests need Debian's libibverbs1 \
             (`apt-get install libibverbs1`, or scripts/install-deps.sh)"
        )
    })
}

#[test]
fn override_naming_a_missing_file_is_unavailable_naming_the_path() {
    let out = run_child(&[("MC_IBVERBS_PATH", "/nonexistent/dir/libibverbs.so.1")]);
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
    let out = run_child(&[("MC_IBVERBS_PATH", bogus.to_str().unwrap())]);
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
    let verbs = system_verbs();
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
    let out = run_child(&[]);
    let line = result_line(&out);
    if !line.starts_with("RESULT loaded") {
        // The error names every candidate; and a host where none loads lacks libibverbs1.
        assert!(
            line.contains("libibverbs.so.1") && line.contains("libibverbs.so"),
            "{line}"
        );
        system_verbs();
    }
    assert_eq!(line, "RESULT loaded libibverbs.so.1");
}

/// Our names for completion statuses are the texts of rdma-core's `ibv_wc_status_str`
/// (called here in Debian's real library, which needs no device).
#[test]
fn status_texts_match_the_library() {
    let verbs = system_verbs();
    let mut named = 0;
    for raw in 0..32u32 {
        let ours = transfer_engine::verbs::WcStatus::from_raw(raw);
        if ours != transfer_engine::verbs::WcStatus::Other {
            assert_eq!(ours.to_string(), verbs.wc_status_str(raw), "status {raw}");
            named += 1;
        }
    }
    assert_eq!(named, 16);
}
