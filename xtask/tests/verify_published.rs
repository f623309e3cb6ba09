//! `cargo xtask verify <tag> --published` against the GitHub stand-in and devpi-server: a
//! release published in both places is identical everywhere to its publication record; a
//! tampered asset, a missing one, a tampered record and a record that does not match the
//! release's `sha256.sum` are each named, per file and place, and fail the command.

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
use xtask::publication::{Place, PlacedFile, Publication};

const TAG: &str = "v0.1.0";
const WHEEL: &str = "standin_dist-0.1.0-py3-none-any.whl";
const SDIST: &str = "standin_dist-0.1.0.tar.gz";
/// GitHub-only assets: the index is not asked for them.
const DEBUG: &str = "standin_dist-0.1.0-py3-none-any.debug";
const SBOM: &str = "standin_dist-0.1.0.cdx.json";

/// The publication record `publish undraft` writes for these files.
fn record(
    sums: &[u8],
    manifest: &[u8],
    github: &[(&str, &[u8])],
    index: &[(&str, &[u8])],
) -> Publication {
    let place = |name: &str, files: &[(&str, &[u8])]| Place {
        name: name.to_owned(),
        url: format!("https://{name}/"),
        files: files
            .iter()
            .map(|(n, b)| {
                let f = PlacedFile {
                    url: format!("https://{name}/{n}"),
                    sha256: sha256_bytes(b),
                };
                ((*n).to_owned(), f)
            })
            .collect(),
    };
    Publication {
        tag: TAG.to_owned(),
        sums_sha256: sha256_bytes(sums),
        manifest_sha256: sha256_bytes(manifest),
        github: Some(place("GitHub Releases", github)),
        index: Some(place("PyPI", index)),
        images: Default::default(),
        attestations: Vec::new(),
    }
}

fn line<'a>(out: &'a str, place: &str, name: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(place) && l.contains(name))
        .unwrap_or_else(|| panic!("no line for {place} {name} in:\n{out}"))
}

#[test]
fn verify_published_compares_both_places_with_the_publication_record() {
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
    let github_files: [(&str, &[u8]); 6] = [
        (WHEEL, &wheel),
        (SDIST, &sdist),
        (DEBUG, &debug),
        (SBOM, &sbom),
        ("sha256.sum", sums.as_bytes()),
        ("dist-manifest.json", &manifest),
    ];
    let rec = record(
        sums.as_bytes(),
        &manifest,
        &github_files,
        &[(WHEEL, &wheel), (SDIST, &sdist)],
    );
    let rec_bytes = rec.to_bytes().unwrap();
    let gh = GitHubStandin::start();
    let mut assets = github_files.to_vec();
    assets.push(("publication.json", &rec_bytes));
    gh.add_release(TAG, false, &assets);
    let toml = support::standin_release_toml();
    std::fs::write(root.join("release.toml"), toml).unwrap();
    let env = [
        ("GITHUB_API_URL", gh.url.as_str()),
        ("PYPI_INDEX_URL", index.simple_url.as_str()),
    ];
    let verify = |root: &Path| xtask_in(root, &["verify", TAG, "--published"], &env);

    // Published in both places, as recorded: identical everywhere, one progress line a file.
    let run = verify(&root);
    run.assert_ok();
    assert!(
        run.stderr
            .contains("reference: publication.json of the GitHub release (o/r)"),
        "{}",
        run.stderr
    );
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
            .contains("2 of 8 published files of v0.1.0 are not what its publication record says"),
        "{}",
        run.stderr
    );
    gh.tamper(TAG, WHEEL, Some(&wheel));
    gh.tamper(TAG, SDIST, Some(&sdist));
    verify(&root).assert_ok();

    // The maintainer's record is the reference where there is one: the release's must be
    // identical to it. A record on the release that claims other bytes is named.
    let dist = root.join("target/dist").join(TAG);
    std::fs::create_dir_all(&dist).unwrap();
    std::fs::write(dist.join("publication.json"), &rec_bytes).unwrap();
    let run = verify(&root);
    run.assert_ok();
    assert!(line(&run.stdout, "GitHub", "publication.json").ends_with("identical"));
    let mut forged = rec.clone();
    forged.index.as_mut().unwrap().url = "https://elsewhere/".into();
    let forged_bytes = forged.to_bytes().unwrap();
    gh.tamper(TAG, "publication.json", Some(&forged_bytes));
    let run = verify(&root);
    assert!(!run.success());
    assert!(
        line(&run.stdout, "GitHub", "publication.json").ends_with(&format!(
            "DIFFERENT (sha256 {})",
            sha256_bytes(&forged_bytes)
        )),
        "{}",
        run.stdout
    );

    // Without a local record, one on the release must name the sha256.sum served beside it.
    std::fs::remove_file(dist.join("publication.json")).unwrap();
    let mut other = rec.clone();
    other.sums_sha256 = sha256_bytes(b"other sums");
    gh.tamper(TAG, "publication.json", Some(&other.to_bytes().unwrap()));
    verify(&root).assert_fails_with("names a sha256.sum with sha256");
    // ... and give every file the sha256 that sha256.sum lists.
    let mut other = rec.clone();
    let w = other.index.as_mut().unwrap().files.get_mut(WHEEL).unwrap();
    w.sha256 = sha256_bytes(b"another build");
    gh.tamper(TAG, "publication.json", Some(&other.to_bytes().unwrap()));
    verify(&root).assert_fails_with("its sha256.sum says otherwise");

    // No record anywhere: says where one comes from.
    gh.tamper(TAG, "publication.json", None);
    verify(&root).assert_fails_with("there is no publication record of v0.1.0");
}
