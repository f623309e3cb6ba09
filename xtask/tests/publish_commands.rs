//! The release workflow's publishing steps, run as the workflow runs them: each
//! `run: cargo xtask publish ...` line of `workflows/release-musa.yaml`, through bash, with
//! `cargo xtask` the built xtask, against the GitHub stand-in and devpi-server on loopback.
//! Between `--check-only` and `undraft` the test uploads to devpi in place of PyPA's action.
//!
//! The order holds: the release stays a draft until the index has the same bytes; a re-run
//! changes nothing; other bytes under a published name stop every step; a release directory
//! that does not match its `sha256.sum` is refused before anything is asked.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::devpi::{standin_artifacts, start_devpi};
use support::github_standin::{GitHubStandin, TagTarget};
use support::xtask_in;
use xtask::checksums::{self, Manifest, ManifestArtifact, ManifestImage, ManifestRelease, SUMS};
use xtask::publication::{self, PUBLICATION};

const TAG: &str = "v0.1.0";
const COMMIT: &str = "1111111111111111111111111111111111111111";
const WORKFLOW: &str = include_str!("../../workflows/release-musa.yaml");

/// The `run:` line of the workflow that calls `cargo xtask publish <step>`.
fn workflow_line(step: &str) -> String {
    let lines: Vec<&str> = WORKFLOW
        .lines()
        .map(str::trim)
        .filter_map(|l| l.strip_prefix("run: "))
        .map(|l| l.split(" # ").next().unwrap_or(l))
        .filter(|l| l.starts_with(&format!("cargo xtask publish {step} ")))
        .collect();
    assert_eq!(lines.len(), 1, "one `cargo xtask publish {step}` step");
    lines[0].to_owned()
}

/// A workspace whose release.toml names the stand-ins' project and repository, and whose
/// `target/dist/<tag>` holds a release directory as `cargo xtask release` writes it.
fn workspace(root: &Path, variant: &str) -> PathBuf {
    let toml = support::standin_release_toml();
    std::fs::write(root.join("release.toml"), toml).unwrap();
    let dist = root.join("target/dist").join(TAG);
    let uploads = standin_artifacts(&dist, variant);
    let wheel = ManifestArtifact::file(&uploads[0], "python-wheel", vec![]).unwrap();
    let sdist = ManifestArtifact::file(&uploads[1], "source-tarball", vec![]).unwrap();
    let artifacts: BTreeMap<_, _> = [wheel, sdist]
        .into_iter()
        .map(|a| (a.name.clone(), a))
        .collect();
    let mut upload_files: Vec<String> = artifacts.keys().cloned().collect();
    upload_files.extend([SUMS.to_owned(), checksums::MANIFEST.to_owned()]);
    let manifest = Manifest {
        dist_version: "xtask test".into(),
        announcement_tag: TAG.into(),
        announcement_is_prerelease: false,
        source: serde_json::json!({ "tag": TAG, "commit": COMMIT }),
        releases: vec![ManifestRelease {
            app_name: "standin-dist".into(),
            app_version: "0.1.0".into(),
            artifacts: artifacts.keys().cloned().collect(),
            hosting: serde_json::json!({}),
        }],
        artifacts,
        upload_files,
        baseline: serde_json::json!({}),
        tools: BTreeMap::new(),
        build: serde_json::json!({}),
        audit: serde_json::json!({}),
    };
    checksums::write(&dist, &manifest).unwrap();
    dist
}

struct Step {
    ok: bool,
    out: String,
}

/// Runs one workflow line with bash in `root`, `cargo` being a shim for the built xtask.
fn run_line(root: &Path, line: &str, env: &[(&str, &str)]) -> Step {
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let shim = bin.join("cargo");
    std::fs::write(
        &shim,
        format!(
            "#!/bin/sh\n[ \"$1\" = xtask ] || {{ echo \"not cargo xtask: $*\" >&2; exit 2; }}\nshift\nexec {} \"$@\"\n",
            env!("CARGO_BIN_EXE_xtask")
        ),
    )
    .unwrap();
    Command::new("chmod").arg("+x").arg(&shim).status().unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let mut cmd = Command::new("bash");
    cmd.args(["-euo", "pipefail", "-c", line])
        .current_dir(root)
        .env("PATH", path)
        .env("TAG", TAG)
        .env("XTASK_ROOT", root)
        .env_remove("GITHUB_ACTIONS")
        .env_remove("ACTIONS_ID_TOKEN_REQUEST_URL")
        .env_remove("PYPI_API_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().unwrap();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    eprintln!("$ {line}\n{out}");
    Step {
        ok: o.status.success(),
        out,
    }
}

fn asset_uploads(gh: &GitHubStandin) -> usize {
    gh.log()
        .iter()
        .filter(|l| l.starts_with("POST") && l.contains("/assets?name="))
        .count()
}

#[test]
fn the_workflow_publishes_in_order_and_a_rerun_changes_nothing() {
    let root = support::temp_dir("publish-commands");
    let _cleanup = support::Scratch(root.clone());
    // devpi first: its venv also reads the stand-ins' metadata.
    let devpi = start_devpi();
    let dist = workspace(&root, "one");
    let gh = GitHubStandin::start();
    gh.tag(TAG, TagTarget::Commit(COMMIT.into()));
    let index = devpi.index("workflow");
    let env = [
        ("GITHUB_API_URL", gh.url.as_str()),
        ("GITHUB_TOKEN", "standin-token"),
        ("PYPI_REPOSITORY_URL", index.upload_url.as_str()),
        ("PYPI_INDEX_URL", index.simple_url.as_str()),
    ];
    let (draft, check, undraft) = (
        workflow_line("github"),
        workflow_line("pypi"),
        workflow_line("undraft"),
    );

    // github-draft: a draft with the four files, verified.
    let s = run_line(&root, &draft, &env);
    assert!(s.ok, "{}", s.out);
    assert!(s.out.contains("4 assets verified by digest"), "{}", s.out);
    let r = gh.release(TAG).unwrap();
    assert!(r.draft);
    assert_eq!(r.assets.len(), 4);

    // publish-pypi: the comparison shows what would be uploaded, uploads nothing.
    let s = run_line(&root, &check, &env);
    assert!(s.ok, "{}", s.out);
    assert!(
        s.out
            .contains("0 of 2 files already identical; to upload: standin_dist-0.1.0"),
        "{}",
        s.out
    );
    assert!(s.out.contains("holds no files of the project"), "{}", s.out);
    // github-undraft before the index has the files: refused, still a draft.
    let s = run_line(&root, &undraft, &env);
    assert!(!s.ok);
    assert!(
        s.out
            .contains("the GitHub release stays a draft until the index has the same bytes"),
        "{}",
        s.out
    );
    assert!(gh.release(TAG).unwrap().draft);

    // PyPA's action uploads (here: the xtask's uploader, uv, on devpi); then undraft publishes.
    let uploads: Vec<_> = [
        "standin_dist-0.1.0-py3-none-any.whl",
        "standin_dist-0.1.0.tar.gz",
    ]
    .iter()
    .map(|n| dist.join(n))
    .collect();
    devpi.upload_standin(&index, &uploads);
    let s = run_line(&root, &undraft, &env);
    assert!(s.ok, "{}", s.out);
    assert!(!gh.release(TAG).unwrap().draft);
    // The publication record: both places with every file as each serves it, attached to the
    // release that is now public.
    let record = publication::read(&dist)
        .unwrap()
        .expect("publication.json written");
    let github = record.github.as_ref().unwrap();
    let on_index = record.index.as_ref().unwrap();
    assert_eq!(github.files.len(), 4, "{record:?}");
    assert_eq!(
        on_index.files.keys().collect::<Vec<_>>(),
        [
            "standin_dist-0.1.0-py3-none-any.whl",
            "standin_dist-0.1.0.tar.gz"
        ]
    );
    assert!(on_index
        .files
        .values()
        .all(|f| f.url.starts_with("http://127.0.0.1")));
    let attached = |gh: &GitHubStandin| {
        let r = gh.release(TAG).unwrap();
        r.assets
            .iter()
            .find(|a| a.name == PUBLICATION)
            .map(|a| a.bytes.clone())
    };
    assert_eq!(attached(&gh), Some(record.to_bytes().unwrap()));
    assert!(
        s.out
            .contains("publication.json: attached on release v0.1.0"),
        "{}",
        s.out
    );
    // What users run: every file identical to the record, in both places.
    let verify = xtask_in(&root, &["verify", TAG, "--published"], &env);
    verify.assert_ok();
    assert_eq!(verify.stdout.lines().count(), 7, "{}", verify.stdout);

    // A partial publish (the record never reached the release): the re-run attaches it.
    gh.tamper(TAG, PUBLICATION, None);
    let s = run_line(&root, &undraft, &env);
    assert!(s.ok, "{}", s.out);
    assert_eq!(attached(&gh), Some(record.to_bytes().unwrap()));

    // A later phase added to the record (images, attestations): `publish record` replaces the
    // release's copy, and the record keeps both places.
    let mut grown = record.clone();
    grown.images.insert(
        "vllm-musa".into(),
        ManifestImage {
            reference: "127.0.0.1:5000/o/vllm-musa:0.1.0".into(),
            digest: format!("sha256:{}", "d".repeat(64)),
            base: format!("127.0.0.1:5000/o/base:1@sha256:{}", "b".repeat(64)),
            recipe: "images/vllm-musa".into(),
            wheel_sha256: "a".repeat(64),
        },
    );
    publication::write(&dist, &grown).unwrap();
    let s = run_line(&root, &workflow_line("record"), &env);
    assert!(s.ok, "{}", s.out);
    assert!(s.out.contains("replacing the earlier record"), "{}", s.out);
    assert_eq!(attached(&gh), Some(grown.to_bytes().unwrap()));
    assert_eq!(gh.release(TAG).unwrap().assets.len(), 5);

    // A re-run of every job: nothing uploaded, nothing changed.
    let before = asset_uploads(&gh);
    for line in [&draft, &check, &undraft] {
        let s = run_line(&root, line, &env);
        assert!(s.ok, "{}", s.out);
    }
    assert_eq!(asset_uploads(&gh), before);
    let s = run_line(&root, &check, &env);
    assert!(
        s.out
            .contains("2 of 2 files already identical; to upload: none"),
        "{}",
        s.out
    );
    assert!(
        s.out
            .contains("holds 2 files of 1 versions (0.1.0 .. 0.1.0; newest release: 0.1.0)"),
        "the preflight shows what the index holds: {}",
        s.out
    );
    gh.assert_no_violations();

    // Other bytes under the same names (a non-reproducible rebuild): every step stops, the
    // GitHub step at the index preflight, before it asks GitHub anything.
    workspace(&root, "two");
    let s = run_line(&root, &workflow_line("record"), &env);
    assert!(
        !s.ok && s.out.contains("it belongs to another build"),
        "the record of the first build is not attached for the second: {}",
        s.out
    );
    let requests = gh.log().len();
    for line in [&draft, &check, &undraft] {
        let s = run_line(&root, line, &env);
        assert!(
            !s.ok
                && s.out
                    .contains("already holds other bytes under our file names"),
            "{line}: {}",
            s.out
        );
    }
    assert_eq!(gh.log().len(), requests);

    // A release directory that does not match its sha256.sum: refused before any request.
    let requests = gh.log().len();
    let wheel = dist.join("standin_dist-0.1.0-py3-none-any.whl");
    std::fs::write(&wheel, b"tampered").unwrap();
    let s = run_line(&root, &draft, &env);
    assert!(
        !s.ok && s.out.contains("does not match its recorded sums"),
        "{}",
        s.out
    );
    assert_eq!(gh.log().len(), requests);
    gh.assert_no_violations();
}
