//! The whole pipeline on the real wheel: two cold release builds, minutes. Runs in the test
//! suite (reproducibility is a release requirement); alone:
//!
//!     cargo test -p xtask --test reproducible -- --nocapture
//!
//! Two clones of one commit, at different paths, build with `release <tag> --dry-run` and
//! `release <tag>`; their wheel, sdist, debug info, SBOM, the standalone binaries' archives,
//! checksums and installers (cargo-dist), manifest and sums must be byte-identical, and the wheel ships its extension stripped (under 3 MB). The second
//! publishes to the GitHub Releases stand-in and devpi-server, then publishes again (a re-run
//! that finds everything identical), and writes the publication record and the ledger.
//!
//! Both clones build in one cargo target directory (`$XTASK_CARGO_TARGET_DIR`, else one in
//! the test's temp dir), so the second compiles only the workspace's crates; the test asserts
//! it. `$XTASK_REPRO_KEEP_DIST`: where to copy the first clone's release directory.
//!
//! Source: `$XTASK_REPRO_SOURCE` (a git repository, default this workspace) at HEAD; tag
//! `$XTASK_REPRO_TAG` (default `v<workspace version>`), made in the clones if missing.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod support;

use std::path::{Path, PathBuf};

use support::devpi::start_devpi;
use support::github_standin::{GitHubStandin, TagTarget};
use support::{git_in as git, xtask_in};

/// The release's files, without the publication record (only a published release has one).
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.ends_with(xtask::publication::PUBLICATION))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

fn clone_tagged(root: &Path, source: &Path, dir: &Path, tag: &str) {
    std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
    git(
        root,
        &[
            "clone",
            "--quiet",
            "--no-local",
            source.to_str().unwrap(),
            dir.to_str().unwrap(),
        ],
    );
    if git(dir, &["tag", "-l", tag]).is_empty() {
        git(dir, &["tag", tag]);
    }
}

/// With `$XTASK_REPRO_KEEP_DIST`, the first clone's release directory is copied there: the
/// test suite's later steps install the released wheel instead of building another.
fn keep_dist(dist: &Path) {
    let Ok(keep) = std::env::var("XTASK_REPRO_KEEP_DIST") else {
        return;
    };
    let keep = PathBuf::from(keep);
    let _ = std::fs::remove_dir_all(&keep);
    std::fs::create_dir_all(&keep).unwrap();
    for entry in std::fs::read_dir(dist).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, keep.join(path.file_name().unwrap())).unwrap();
    }
}

#[test]
fn two_clones_build_byte_identical_artifacts_and_publish_to_the_standins() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let source = std::env::var("XTASK_REPRO_SOURCE")
        .map(PathBuf::from)
        .unwrap_or(workspace);
    let tag = std::env::var("XTASK_REPRO_TAG")
        .unwrap_or_else(|_| format!("v{}", env!("CARGO_PKG_VERSION")));
    let root = support::temp_dir("repro");
    let (a, b) = (
        root.join("first-clone"),
        root.join("second/clone-at-another-path"),
    );
    clone_tagged(&root, &source, &a, &tag);
    let commit = git(&a, &["rev-parse", "HEAD"]);
    // One target directory for both clones, as CI shares one with the images test: the
    // second clone compiles only the workspace's crates, and must still match byte for byte.
    let target = std::env::var("XTASK_CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("cargo-target"));
    let target = ("XTASK_CARGO_TARGET_DIR", target.to_str().unwrap());

    let first = xtask_in(&a, &["release", &tag, "--dry-run"], &[target]);
    eprintln!("{}", first.stderr);
    first.assert_ok();
    keep_dist(&a.join("target/dist").join(&tag));
    // Cloned after the first build: its sources are newer than the shared target dir's
    // records, so cargo compiles the workspace's crates again, from this clone's paths.
    clone_tagged(&root, &source, &b, &tag);

    let gh = GitHubStandin::start();
    gh.tag(&tag, TagTarget::Commit(commit.clone()));
    let devpi = start_devpi();
    let index = devpi.index("release");
    let env = [
        target,
        ("GITHUB_API_URL", gh.url.as_str()),
        ("GITHUB_TOKEN", "standin-token"),
        ("PYPI_REPOSITORY_URL", index.upload_url.as_str()),
        ("PYPI_INDEX_URL", index.simple_url.as_str()),
        ("PYPI_USERNAME", devpi.user.as_str()),
        ("PYPI_API_TOKEN", devpi.password.as_str()),
    ];
    // No registry here: the images have their own end-to-end test (scripts/test-images.sh).
    let second = xtask_in(&b, &["release", &tag, "--skip-images"], &env);
    eprintln!("{}", second.stderr);
    second.assert_ok();
    assert!(second.stderr.contains("images: skipped: --skip-images"));
    // The dependencies' artifacts were the first clone's: no checkout path in their flags.
    assert!(
        !second.stderr.contains("Compiling tokio ")
            && second.stderr.contains("Compiling transfer-engine "),
        "the second clone rebuilt its dependencies, or built nothing"
    );
    assert!(!second.stderr.contains(&devpi.password) && !second.stderr.contains("standin-token"));

    let (fa, fb) = (
        files(&a.join("target/dist").join(&tag)),
        files(&b.join("target/dist").join(&tag)),
    );
    let names: Vec<&str> = fa.iter().map(|(n, _)| n.as_str()).collect();
    // The wheel's six files and, per standalone binary, its archive, checksum and installer.
    assert_eq!(fa.len(), 6 + 3 * 3, "{names:?}");
    for app in [
        "transfer-engine-doctor",
        "transfer-engine-bench",
        "mooncake-store",
    ] {
        let archive = format!("{app}-x86_64-unknown-linux-gnu.tar.xz");
        for name in [
            archive.clone(),
            format!("{archive}.sha256"),
            format!("{app}-installer.sh"),
        ] {
            assert!(names.contains(&name.as_str()), "no {name} in {names:?}");
        }
    }
    for ((na, ba), (nb, bb)) in fa.iter().zip(&fb) {
        assert_eq!(na, nb);
        assert!(ba == bb, "{na} differs between the two clones");
    }
    // The stripped wheel, its debug file (named by the .so's .gnu_debuglink) and the SBOM.
    let (wheel, wheel_bytes) = fa.iter().find(|(n, _)| n.ends_with(".whl")).unwrap();
    let debug = wheel.strip_suffix(".whl").unwrap().to_owned() + ".debug";
    assert!(names.contains(&debug.as_str()), "{names:?}");
    assert!(names.iter().any(|n| n.ends_with(".cdx.json")), "{names:?}");
    eprintln!("wheel {wheel}: {} bytes", wheel_bytes.len());
    // Under 3 MB: the engine alone was about 1.67 MB with `[profile.wheel]`, fat LTO and
    // opt-level "s"; Mooncake Store (master and client, tonic's server side) brings it to
    // about 2.76 MB (xtask/README.md "Wheel size"). An unstripped wheel is about 7 MB.
    assert!(wheel_bytes.len() < 3_000_000, "{} bytes", wheel_bytes.len());
    let manifest: serde_json::Value = serde_json::from_slice(
        &fa.iter()
            .find(|(n, _)| n == "dist-manifest.json")
            .unwrap()
            .1,
    )
    .unwrap();
    let stripped = &manifest["build"]["stripped"];
    eprintln!(
        "strip: wheel {} -> {} bytes, extension {} -> {} bytes",
        stripped["wheel_size_before"],
        stripped["wheel_size_after"],
        stripped["so_size_before"],
        stripped["so_size_after"]
    );
    assert_eq!(stripped["debug_file"], debug.as_str());
    let sums = String::from_utf8(
        fa.iter()
            .find(|(n, _)| n == "sha256.sum")
            .unwrap()
            .1
            .clone(),
    )
    .unwrap();
    assert!(
        sums.contains(&format!("  {debug}\n")) && sums.contains(".cdx.json\n"),
        "{sums}"
    );
    assert!(
        sums.contains("  mooncake-store-x86_64-unknown-linux-gnu.tar.xz\n")
            && sums.contains("  mooncake-store-installer.sh\n"),
        "{sums}"
    );
    let binaries = &manifest["build"]["binaries"];
    eprintln!("binaries: {binaries}");
    assert_eq!(
        binaries["apps"].as_array().map(Vec::len),
        Some(3),
        "{binaries}"
    );
    assert!(binaries["installers_skipped"].is_null(), "{binaries}");

    let release = gh.release(&tag).unwrap();
    assert!(!release.draft);
    // The fifteen files, and the publication record the publishing wrote last.
    assert_eq!(release.assets.len(), 16);
    let record = std::fs::read(b.join("target/dist").join(&tag).join("publication.json")).unwrap();
    assert_eq!(
        release
            .assets
            .iter()
            .find(|x| x.name == "publication.json")
            .unwrap()
            .bytes,
        record
    );
    for (name, bytes) in &fb {
        assert_eq!(
            &release
                .assets
                .iter()
                .find(|x| &x.name == name)
                .unwrap()
                .bytes,
            bytes
        );
    }
    gh.assert_no_violations();
    let ledger = std::fs::read_to_string(b.join("RELEASES.md")).unwrap();
    assert!(
        ledger.contains(&format!("<!-- release {tag} -->")) && ledger.contains(&commit),
        "{ledger}"
    );

    // Re-publishing the same tag from the same checkout: identical everywhere, nothing uploaded.
    let uploads_before = gh
        .log()
        .iter()
        .filter(|l| l.contains("/assets?name="))
        .count();
    let again = xtask_in(&b, &["release", &tag, "--skip-images"], &env);
    eprintln!("{}", again.stderr);
    again.assert_ok();
    assert!(
        again.stderr.contains("0 uploaded, 15 already identical"),
        "GitHub"
    );
    assert!(
        again.stderr.contains("0 uploaded, 2 already identical"),
        "PyPI"
    );
    assert!(again.stderr.contains("RELEASES.md already has this entry"));
    assert!(again
        .stderr
        .contains("publication.json: already attached, identical"));
    assert_eq!(
        gh.log()
            .iter()
            .filter(|l| l.contains("/assets?name="))
            .count(),
        uploads_before
    );
    assert_eq!(
        std::fs::read_to_string(b.join("RELEASES.md")).unwrap(),
        ledger
    );

    drop(devpi);
    std::fs::remove_dir_all(&root).unwrap();
}
