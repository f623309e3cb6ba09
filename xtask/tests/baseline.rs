//! `check-baseline` against synthetic host roots (etc/os-release, the MUSA version file) and a
//! stand-in interpreter that reports Python, glibc and PyTorch versions.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use support::{temp_dir, xtask_in, Fixture};

/// A host root and a stand-in `python` for it.
fn host(
    name: &str,
    os: &str,
    musa: Option<&str>,
    python: &str,
    glibc: &str,
    torch: Option<&str>,
) -> (PathBuf, PathBuf) {
    let root = temp_dir(name);
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(root.join("etc/os-release"), os).unwrap();
    if let Some(m) = musa {
        std::fs::create_dir_all(root.join("usr/local/musa")).unwrap();
        std::fs::write(root.join("usr/local/musa/version.txt"), m).unwrap();
    }
    let torch = torch.map_or("null".to_owned(), |t| format!("\"{t}\""));
    let py = root.join("standin-python");
    std::fs::write(
        &py,
        format!("#!/bin/sh\necho '{{\"python\": \"{python}\", \"glibc\": \"{glibc}\", \"torch\": {torch}}}'\n"),
    )
    .unwrap();
    std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o755)).unwrap();
    (root, py)
}

const UBUNTU: &str = "NAME=\"Ubuntu\"\nVERSION_ID=\"22.04\"\nID=ubuntu\nID_LIKE=debian\n";
const DEBIAN: &str =
    "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_ID=\"12\"\nID=debian\n";

fn check(ws: &Path, root: &Path, py: &Path, args: &[&str], github_actions: bool) -> support::Run {
    let mut env = vec![
        ("XTASK_HOST_ROOT", root.to_str().unwrap()),
        ("XTASK_BASELINE_PYTHON", py.to_str().unwrap()),
    ];
    if github_actions {
        env.push(("GITHUB_ACTIONS", "true"));
    }
    let mut all = vec!["check-baseline"];
    all.extend_from_slice(args);
    xtask_in(ws, &all, &env)
}

#[test]
fn the_builder_image_passes_strict_mode() {
    let ws = Fixture::new("baseline-ok", "0.1.0");
    let (root, py) = host(
        "host-ubuntu",
        UBUNTU,
        Some("MUSA Toolkit 5.2.0-server\n"),
        "3.10.12",
        "2.35",
        Some("2.9.1.post1"),
    );
    let run = check(&ws.dir, &root, &py, &["--strict-baseline"], false);
    run.assert_ok();
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["mode"], "strict");
    assert_eq!(report["differences"].as_array().unwrap().len(), 0);
    assert_eq!(report["found"]["musa"], "5.2.0");
    assert!(
        run.stderr.contains("strict mode: host is the baseline"),
        "{}",
        run.stderr
    );
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn another_host_fails_strict_mode_naming_each_difference() {
    let ws = Fixture::new("baseline-strict", "0.1.0");
    let (root, py) = host("host-debian", DEBIAN, None, "3.11.7", "2.36", None);
    for run in [
        check(&ws.dir, &root, &py, &["--strict-baseline"], false),
        check(&ws.dir, &root, &py, &[], true), // GITHUB_ACTIONS=true is strict too
    ] {
        run.assert_fails_with("this host is not the release baseline");
        run.assert_fails_with("OS: wanted ubuntu 22.04, found debian 12");
        run.assert_fails_with("glibc: wanted 2.35, found 2.36");
        run.assert_fails_with("MUSA: wanted 5.2.0, found nothing (usr/local/musa/version.txt)");
        run.assert_fails_with("Python: wanted 3.10, found 3.11.7");
        run.assert_fails_with("PyTorch: wanted 2.9.1.post1, found nothing");
        run.assert_fails_with("Build inside the builder image (registry.mthreads.com/");
    }
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn local_mode_records_the_actual_host() {
    let ws = Fixture::new("baseline-local", "0.1.0");
    let (root, py) = host(
        "host-local",
        UBUNTU,
        Some("{\"version\": \"5.1.0\"}"),
        "3.10.4",
        "2.35",
        Some("2.9.1.post1+musa"),
    );
    let run = check(&ws.dir, &root, &py, &[], false);
    run.assert_ok();
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["mode"], "local");
    assert_eq!(report["found"]["os_id"], "ubuntu");
    assert_eq!(report["found"]["musa"], "5.1.0");
    assert_eq!(report["found"]["torch"], "2.9.1.post1+musa");
    assert_eq!(
        report["differences"],
        serde_json::json!(["MUSA: wanted 5.2.0, found 5.1.0 (usr/local/musa/version.txt)"])
    );
    assert!(
        run.stderr
            .contains("differs from the baseline in 1 way (recorded)"),
        "{}",
        run.stderr
    );
    std::fs::remove_dir_all(root).unwrap();
}
