//! `release <tag>` refuses, before anything is built, a source that is not the tag: each test
//! makes a real git repository and runs the xtask binary on it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod support;

use support::Fixture;

/// The release stopped in `verify source`: nothing was built, no dist directory exists.
#[track_caller]
fn assert_stopped_before_build(f: &Fixture, run: &support::Run) {
    assert!(
        run.stderr.contains("<== verify source: FAILED"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("==> build"), "{}", run.stderr);
    assert!(!f.dir.join("target/dist").exists());
    assert!(!f.dir.join("target/xtask").exists());
}

#[test]
fn tag_on_another_commit_is_refused_before_build() {
    let f = Fixture::new("other-commit", "0.1.0");
    let tagged = f.git(&["rev-parse", "HEAD"]);
    f.git(&["tag", "-a", "v0.1.0", "-m", "v0.1.0"]);
    f.write("bindings/src/lib.rs", "// later work\n");
    let head = f.commit("later work");
    let run = f.xtask(&["release", "v0.1.0", "--dry-run"]);
    run.assert_fails_with(&format!("tag v0.1.0 is commit {tagged} but HEAD is {head}"));
    run.assert_fails_with("git checkout v0.1.0");
    assert_stopped_before_build(&f, &run);
}

#[test]
fn dirty_tree_is_refused_before_build() {
    let f = Fixture::new("dirty", "0.1.0");
    f.git(&["tag", "v0.1.0"]);
    f.write("bindings/src/lib.rs", "// uncommitted\n");
    f.write("notes.txt", "untracked\n");
    let run = f.xtask(&["release", "v0.1.0", "--dry-run"]);
    run.assert_fails_with("the working tree is not clean (2 changed or untracked paths)");
    run.assert_fails_with(" M bindings/src/lib.rs");
    run.assert_fails_with("?? notes.txt");
    run.assert_fails_with("git stash -u");
    assert_stopped_before_build(&f, &run);
}

#[test]
fn ignored_files_do_not_make_the_tree_dirty() {
    let f = Fixture::new("ignored", "0.1.0");
    f.git(&["tag", "v0.1.0"]);
    f.write("target/leftover", "build output\n");
    f.xtask(&["plan", "v0.1.0"]).assert_ok();
}

#[test]
fn version_mismatch_is_refused_before_build() {
    let f = Fixture::new("version", "0.1.0");
    f.git(&["tag", "v0.2.0"]);
    let run = f.xtask(&["release", "v0.2.0", "--dry-run"]);
    run.assert_fails_with("tag v0.2.0 is version 0.2.0 (Cargo version 0.2.0), but the crates say otherwise: fixture-bindings 0.1.0");
    run.assert_fails_with("set `version = \"0.2.0\"` under [workspace.package] in Cargo.toml");
    assert_stopped_before_build(&f, &run);
}

#[test]
fn static_wheel_version_mismatch_is_refused_before_build() {
    let f = Fixture::new("wheel-version", "0.1.0");
    f.write(
        "bindings/pyproject.toml",
        "[project]\nname = \"mooncake-transfer-engine-musa\"\nversion = \"0.1.1\"\n\n\
         [tool.maturin.sbom]\nrust = false\nauditwheel = false\n",
    );
    f.commit("static version");
    f.git(&["tag", "v0.1.0"]);
    let run = f.xtask(&["release", "v0.1.0", "--dry-run"]);
    run.assert_fails_with("tag v0.1.0 is version 0.1.0 but the wheel would be 0.1.1");
    assert_stopped_before_build(&f, &run);
}

#[test]
fn distribution_name_mismatch_is_refused_before_build() {
    let f = Fixture::new("dist-name", "0.1.0");
    f.write(
        "bindings/pyproject.toml",
        "[project]\nname = \"mooncake-transfer-engine\"\ndynamic = [\"version\"]\n",
    );
    f.commit("rename");
    f.git(&["tag", "v0.1.0"]);
    let run = f.xtask(&["release", "v0.1.0", "--dry-run"]);
    run.assert_fails_with("names the distribution `mooncake-transfer-engine` but release.toml says `mooncake-transfer-engine-musa`");
    assert_stopped_before_build(&f, &run);
}

#[test]
fn malformed_tags_are_refused_before_build() {
    let f = Fixture::new("malformed", "0.1.0");
    for (tag, says) in [
        ("0.1.0", "`0.1.0` is not a release tag"),
        ("v0.1", "`v0.1` is not a release tag"),
        ("v0.1.0rc1", "a pre-release or dev release"),
        ("v0.1.0-post1", "tag the release `v0.1.0.post1` instead"),
        ("v0.1.0+local", "PyPI refuses local versions"),
    ] {
        let run = f.xtask(&["release", tag, "--dry-run"]);
        run.assert_fails_with(says);
        assert_stopped_before_build(&f, &run);
    }
}

#[test]
fn missing_tag_is_refused_before_build() {
    let f = Fixture::new("missing", "0.1.0");
    let run = f.xtask(&["release", "v0.1.0", "--dry-run"]);
    run.assert_fails_with("tag v0.1.0 does not exist in this clone");
    run.assert_fails_with("git fetch --tags");
    assert_stopped_before_build(&f, &run);
}

#[test]
fn post_release_tag_maps_to_the_cargo_post_version() {
    let f = Fixture::new("post", "0.3.12-post1");
    f.git(&["tag", "-a", "v0.3.12.post1", "-m", "post release"]);
    let run = f.xtask(&["plan", "v0.3.12.post1"]);
    run.assert_ok();
    let plan: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(plan["version"], "0.3.12.post1");
    assert_eq!(plan["cargo_version"], "0.3.12-post1");
    assert_eq!(plan["source"]["ok"], true);
    assert_eq!(plan["source"]["commit"], f.git(&["rev-parse", "HEAD"]));
    assert_eq!(plan["source"]["source_date_epoch"], 1_700_000_000);

    // The same source under the final tag does not match.
    f.git(&["tag", "v0.3.12"]);
    f.xtask(&["plan", "v0.3.12"])
        .assert_fails_with("fixture-bindings 0.3.12-post1");
}

#[test]
fn plan_prints_what_release_would_do() {
    let f = Fixture::new("plan", "0.1.0");
    f.git(&["tag", "v0.1.0"]);
    let run = f.xtask(&["plan", "v0.1.0"]);
    run.assert_ok();
    let plan: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    let names: Vec<&str> = plan["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names[0],
        "mooncake_transfer_engine_musa-0.1.0-<python>-<abi>-manylinux_2_35_x86_64.whl"
    );
    assert_eq!(names[1], "mooncake_transfer_engine_musa-0.1.0.tar.gz");
    assert_eq!(
        names[2],
        "mooncake_transfer_engine_musa-0.1.0-<python>-<abi>-manylinux_2_35_x86_64.debug"
    );
    assert_eq!(names[3], "mooncake_transfer_engine_musa-0.1.0.cdx.json");
    let phases: Vec<&str> = plan["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(phases[2..4], ["build", "binaries"]);
    // The order of publishing in xtask/README.md.
    assert_eq!(
        phases[6..],
        [
            "GitHub draft",
            "publish PyPI",
            "GitHub undraft",
            "images",
            "ledger"
        ]
    );
    assert!(!f.dir.join("target/dist").exists(), "plan builds nothing");
}

#[test]
fn a_ledger_written_by_a_release_does_not_make_the_tree_dirty() {
    let f = Fixture::new("ledger", "0.1.0");
    f.write("RELEASES.md", "# Releases\n");
    f.commit("ledger");
    f.git(&["tag", "v0.1.0"]);
    f.write("RELEASES.md", "# Releases\n\n<!-- release v0.1.0 -->\n");
    f.xtask(&["plan", "v0.1.0"]).assert_ok();
    f.write("README.md", "changed\n");
    f.xtask(&["plan", "v0.1.0"])
        .assert_fails_with("?? README.md");
}

#[test]
fn an_sbom_left_on_is_refused_before_maturin_runs() {
    let f = Fixture::new("sbom", "0.1.0");
    f.write(
        "bindings/pyproject.toml",
        "[project]\nname = \"mooncake-transfer-engine-musa\"\ndynamic = [\"version\"]\n",
    );
    f.commit("sbom on");
    f.git(&["tag", "v0.1.0"]);
    let run = f.xtask(&["release", "v0.1.0", "--dry-run"]);
    run.assert_fails_with("maturin would embed an SBOM");
    run.assert_fails_with("[tool.maturin.sbom]\n    rust = false\n    auditwheel = false");
    assert!(
        run.stderr.contains("<== verify source: ok") && run.stderr.contains("<== build: FAILED"),
        "{}",
        run.stderr
    );
    assert!(
        !f.dir.join("target/xtask/tools-venv").exists(),
        "no tool was installed"
    );
}
