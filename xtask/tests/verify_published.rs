//! `cargo xtask verify <tag> --published` against the GitHub stand-in and devpi-server: a
//! release published in both places is identical everywhere; a tampered asset, a missing one
//! and a tampered ledger are each named, per file and place, and fail the command.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod support;

use std::path::Path;

use support::devpi::{standin_artifacts, start_devpi};
use support::github_standin::GitHubStandin;
use support::xtask_in;
use xtask::checksums::sha256_bytes;

const TAG: &str = "v0.1.0";
const WHEEL: &str = "standin_dist-0.1.0-py3-none-any.whl";
const SDIST: &str = "standin_dist-0.1.0.tar.gz";
/// GitHub-only assets: the index is not asked for them.
const DEBUG: &str = "standin_dist-0.1.0-py3-none-any.debug";
const SBOM: &str = "standin_dist-0.1.0.cdx.json";

/// RELEASES.md with the entry `cargo xtask release` writes for these files.
fn ledger(files: &[(&str, &[u8])]) -> String {
    let mut rows = String::new();
    for (name, bytes) in files {
        rows.push_str(&format!(
            "| `{name}` | {} | `{}` |\n",
            bytes.len(),
            sha256_bytes(bytes)
        ));
    }
    format!(
        "# Releases\n\n<!-- release {TAG} -->\n## {TAG}\n\n- Commit: `1111`\n\n\
         | artifact | bytes | SHA256 |\n|---|---:|---|\n{rows}<!-- /release {TAG} -->\n"
    )
}

fn line<'a>(out: &'a str, place: &str, name: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(place) && l.contains(name))
        .unwrap_or_else(|| panic!("no line for {place} {name} in:\n{out}"))
}

#[test]
fn verify_published_compares_both_places_with_the_ledger() {
    let root = support::temp_dir("verify-published");
    let _cleanup = support::Scratch(root.clone());
    let devpi = start_devpi();
    let index = devpi.index("verify");
    let uploads = standin_artifacts(&root.join("dist"), "one");
    devpi.upload_standin(&index, &uploads);
    let read = |n: &str| std::fs::read(root.join("dist").join(n)).unwrap();
    let (wheel, sdist) = (read(WHEEL), read(SDIST));
    let (debug, sbom) = (b"debug info".to_vec(), b"{}\n".to_vec());
    let manifest = br#"{"announcement_tag": "v0.1.0"}"#.to_vec();
    let sums = format!(
        "{}  {WHEEL}\n{}  {SDIST}\n{}  {DEBUG}\n{}  {SBOM}\n{}  dist-manifest.json\n",
        sha256_bytes(&wheel),
        sha256_bytes(&sdist),
        sha256_bytes(&debug),
        sha256_bytes(&sbom),
        sha256_bytes(&manifest)
    );
    let gh = GitHubStandin::start();
    gh.add_release(
        TAG,
        false,
        &[
            (WHEEL, &wheel),
            (SDIST, &sdist),
            (DEBUG, &debug),
            (SBOM, &sbom),
            ("sha256.sum", sums.as_bytes()),
            ("dist-manifest.json", &manifest),
        ],
    );
    let toml = support::standin_release_toml();
    std::fs::write(root.join("release.toml"), toml).unwrap();
    let write_ledger =
        |files: &[(&str, &[u8])]| std::fs::write(root.join("RELEASES.md"), ledger(files)).unwrap();
    write_ledger(&[
        (WHEEL, &wheel),
        (SDIST, &sdist),
        (DEBUG, &debug),
        (SBOM, &sbom),
    ]);
    let env = [
        ("GITHUB_API_URL", gh.url.as_str()),
        ("PYPI_INDEX_URL", index.simple_url.as_str()),
    ];
    let verify = |root: &Path| xtask_in(root, &["verify", TAG, "--published"], &env);

    // Published in both places, as recorded: identical everywhere, one progress line a file.
    let run = verify(&root);
    run.assert_ok();
    for name in [WHEEL, SDIST] {
        assert!(line(&run.stdout, "GitHub", name).ends_with("identical"));
        assert!(line(&run.stdout, "index", name).ends_with("identical"));
        assert!(
            run.stderr.contains(&format!("[GitHub] {name}: ")),
            "{}",
            run.stderr
        );
        assert!(
            run.stderr.contains(&format!("[index] {name}: ")),
            "{}",
            run.stderr
        );
    }
    for name in [DEBUG, SBOM] {
        assert!(line(&run.stdout, "GitHub", name).ends_with("identical"));
        assert!(
            !run.stdout
                .lines()
                .any(|l| l.starts_with("index") && l.contains(name)),
            "{name} is not the index's: {}",
            run.stdout
        );
    }
    assert!(line(&run.stdout, "GitHub", "sha256.sum").ends_with("identical"));
    assert!(line(&run.stdout, "GitHub", "dist-manifest.json").ends_with("identical"));
    gh.assert_no_violations();

    // The wheel on GitHub tampered with, the sdist gone: named per file and place.
    gh.tamper(TAG, WHEEL, Some(b"tampered"));
    gh.tamper(TAG, SDIST, None);
    let run = verify(&root);
    assert!(!run.success());
    assert!(
        line(&run.stdout, "GitHub", WHEEL)
            .ends_with(&format!("DIFFERENT (sha256 {})", sha256_bytes(b"tampered"))),
        "{}",
        run.stdout
    );
    assert!(line(&run.stdout, "GitHub", SDIST).ends_with("MISSING"));
    assert!(line(&run.stdout, "index", WHEEL).ends_with("identical"));
    assert!(line(&run.stdout, "index", SDIST).ends_with("identical"));
    assert!(
        run.stderr
            .contains("2 of 8 published files of v0.1.0 are not what RELEASES.md records"),
        "{}",
        run.stderr
    );

    // A ledger that records other bytes: every place differs from it, sha256.sum too.
    gh.tamper(TAG, WHEEL, Some(&wheel));
    gh.tamper(TAG, SDIST, Some(&sdist));
    write_ledger(&[
        (WHEEL, b"another build"),
        (SDIST, &sdist),
        (DEBUG, &debug),
        (SBOM, &sbom),
    ]);
    let run = verify(&root);
    assert!(!run.success());
    assert!(line(&run.stdout, "GitHub", WHEEL).contains("DIFFERENT"));
    assert!(line(&run.stdout, "index", WHEEL).contains("DIFFERENT"));
    assert!(line(&run.stdout, "GitHub", "sha256.sum").contains("DIFFERENT"));
    assert!(line(&run.stdout, "index", SDIST).ends_with("identical"));

    // No entry for the tag: says where the ledger comes from.
    std::fs::write(root.join("RELEASES.md"), "# Releases\n").unwrap();
    verify(&root).assert_fails_with("has no artifacts recorded for v0.1.0");
}
