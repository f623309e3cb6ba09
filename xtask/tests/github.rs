//! The GitHub steps of publishing (draft, then undraft) against the loopback stand-in, whose
//! requests and responses are checked against GitHub's OpenAPI description: a new release,
//! re-runs with all, some and none of the assets, a digest mismatch, a 502 then success, tags
//! GitHub does not have, and an undraft that finds the assets changed.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod support;

use std::path::PathBuf;
use std::time::Duration;

use support::github_standin::{Fault, GitHubStandin, TagTarget};
use xtask::release::github::{draft_files, undraft_files, Target};
use xtask::retry::Policy;

const COMMIT: &str = "1111111111111111111111111111111111111111";
const TAG: &str = "v0.1.0";
const FILES: [(&str, &[u8]); 4] = [
    (
        "standin-0.1.0-cp39-abi3-manylinux_2_35_x86_64.whl",
        b"stand-in wheel",
    ),
    ("standin-0.1.0.tar.gz", b"stand-in sdist"),
    ("sha256.sum", b"stand-in sums"),
    ("dist-manifest.json", b"{}"),
];

/// The four files of a release, in a directory removed when the guard drops.
fn files(name: &str) -> (support::Scratch, Vec<PathBuf>) {
    let dir = support::temp_dir(name);
    let paths = FILES
        .iter()
        .map(|(n, b)| {
            std::fs::write(dir.join(n), b).unwrap();
            dir.join(n)
        })
        .collect();
    (support::Scratch(dir), paths)
}

fn target(gh: &GitHubStandin) -> Target {
    Target {
        api_url: gh.url.clone(),
        owner: "o".into(),
        repo: "r".into(),
        retry: Policy {
            first_delay: Duration::from_millis(10),
            attempts: 4,
        },
    }
}

fn standin() -> GitHubStandin {
    let gh = GitHubStandin::start();
    gh.tag(TAG, TagTarget::Commit(COMMIT.into()));
    gh
}

fn uploads(gh: &GitHubStandin) -> Vec<String> {
    gh.log()
        .into_iter()
        .filter(|l| l.starts_with("POST") && l.contains("/assets?name="))
        .collect()
}

/// Both steps, as `cargo xtask release` runs them around PyPI.
fn publish_files(
    target: &Target,
    token: &str,
    tag: &str,
    commit: &str,
    files: &[PathBuf],
) -> anyhow::Result<xtask::publication::Published> {
    let out = draft_files(target, token, tag, commit, files)?;
    undraft_files(target, token, tag, files)?;
    Ok(out)
}

#[test]
fn a_new_release_is_drafted_uploaded_and_published() {
    let gh = standin();
    let (_dir, paths) = files("gh-new");
    let out = draft_files(&target(&gh), "t0ken", TAG, COMMIT, &paths).unwrap();
    assert_eq!(out.uploaded.len(), 4);
    assert!(out.identical.is_empty());
    assert!(gh.release(TAG).unwrap().draft, "a draft until undraft");
    assert!(!gh.log().iter().any(|l| l.starts_with("PATCH")));
    let place = undraft_files(&target(&gh), "t0ken", TAG, &paths).unwrap();
    assert_eq!(place.url, out.place.url);
    let r = gh.release(TAG).unwrap();
    assert!(!r.draft, "published at the end");
    assert_eq!(r.commitish, COMMIT);
    for (n, b) in FILES {
        assert_eq!(r.assets.iter().find(|a| a.name == n).unwrap().bytes, b);
    }
    let log = gh.log();
    let create = log
        .iter()
        .position(|l| l.starts_with("POST /repos/o/r/releases ->"))
        .unwrap();
    let publish = log.iter().position(|l| l.starts_with("PATCH")).unwrap();
    assert!(
        log.iter()
            .rposition(|l| l.contains("/assets?name="))
            .unwrap()
            < publish,
        "{log:#?}"
    );
    assert!(create < publish);
    assert!(gh
        .state
        .lock()
        .unwrap()
        .auth
        .iter()
        .all(|a| a == "Bearer t0ken"));
    gh.assert_no_violations();
}

#[test]
fn a_rerun_with_all_assets_changes_nothing() {
    let gh = standin();
    gh.add_release(TAG, false, &FILES);
    let out = publish_files(&target(&gh), "t", TAG, COMMIT, &files("gh-all").1).unwrap();
    assert_eq!(out.identical.len(), 4);
    assert!(out.uploaded.is_empty());
    assert!(uploads(&gh).is_empty());
    assert!(!gh
        .log()
        .iter()
        .any(|l| l.starts_with("PATCH") || l.starts_with("DELETE")));
    gh.assert_no_violations();
}

#[test]
fn a_rerun_with_some_assets_uploads_only_the_missing_ones() {
    let gh = standin();
    gh.add_release(TAG, true, &FILES[..2]);
    let out = publish_files(&target(&gh), "t", TAG, COMMIT, &files("gh-some").1).unwrap();
    assert_eq!(out.identical, vec![FILES[0].0, FILES[1].0]);
    assert_eq!(out.uploaded, vec![FILES[2].0, FILES[3].0]);
    assert_eq!(uploads(&gh).len(), 2);
    assert!(!gh.release(TAG).unwrap().draft);
    gh.assert_no_violations();
}

#[test]
fn a_rerun_on_an_empty_draft_uploads_everything() {
    let gh = standin();
    gh.add_release(TAG, true, &[]);
    let out = publish_files(&target(&gh), "t", TAG, COMMIT, &files("gh-none").1).unwrap();
    assert_eq!(out.uploaded.len(), 4);
    assert!(
        !gh.log()
            .iter()
            .any(|l| l.starts_with("POST /repos/o/r/releases ->")),
        "no second release"
    );
    assert_eq!(gh.state.lock().unwrap().releases.len(), 1);
    gh.assert_no_violations();
}

#[test]
fn a_digest_mismatch_stops_and_never_clobbers() {
    let gh = standin();
    gh.add_release(TAG, true, &[(FILES[0].0, b"other bytes")]);
    let err = publish_files(&target(&gh), "t", TAG, COMMIT, &files("gh-mismatch").1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("already has {} with sha256", FILES[0].0)),
        "{err}"
    );
    assert!(err.contains("not overwriting"), "{err}");
    let r = gh.release(TAG).unwrap();
    assert_eq!(r.assets[0].bytes, b"other bytes");
    assert!(r.draft, "not published");
    assert!(!gh
        .log()
        .iter()
        .any(|l| l.starts_with("DELETE") || l.starts_with("PATCH")));
    assert!(uploads(&gh).is_empty());
    gh.assert_no_violations();
}

#[test]
fn a_502_on_upload_is_cleaned_up_and_retried() {
    let gh = standin();
    gh.fault(Fault {
        method: "POST",
        path_part: "/assets",
        status: 502,
        leave_open_asset: true,
    });
    gh.fault(Fault {
        method: "GET",
        path_part: "/releases",
        status: 503,
        leave_open_asset: false,
    });
    let out = publish_files(&target(&gh), "t", TAG, COMMIT, &files("gh-502").1).unwrap();
    assert_eq!(out.uploaded.len(), 4);
    let log = gh.log();
    let failed = log
        .iter()
        .position(|l| l.contains("/assets?name=") && l.ends_with("-> 502"))
        .unwrap();
    let deleted = log
        .iter()
        .position(|l| l.starts_with("DELETE") && l.ends_with("-> 204"))
        .unwrap();
    let retried = log
        .iter()
        .position(|l| l.contains(&format!("/assets?name={}", FILES[0].0)) && l.ends_with("-> 201"))
        .unwrap();
    assert!(failed < deleted && deleted < retried, "{log:#?}");
    assert!(
        log.iter().any(|l| l.ends_with("-> 503")),
        "a failed list is retried too"
    );
    let r = gh.release(TAG).unwrap();
    assert_eq!(r.assets.len(), 4);
    assert!(r.assets.iter().all(|a| a.state == "uploaded"));
    gh.assert_no_violations();
}

#[test]
fn a_tag_github_lacks_or_places_elsewhere_is_refused() {
    let gh = GitHubStandin::start();
    let err = publish_files(&target(&gh), "t", TAG, COMMIT, &files("gh-notag").1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tag v0.1.0 is not on GitHub (o/r): push it first (`git push origin v0.1.0`)"),
        "{err}"
    );
    gh.tag(
        TAG,
        TagTarget::Annotated(
            "2222222222222222222222222222222222222222".into(),
            "3333333333333333333333333333333333333333".into(),
        ),
    );
    let err = publish_files(&target(&gh), "t", TAG, COMMIT, &files("gh-elsewhere").1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("tag v0.1.0 on GitHub is commit 3333333333333333333333333333333333333333, but we built 1111"), "{err}");
    assert!(
        gh.state.lock().unwrap().releases.is_empty(),
        "nothing created"
    );
    gh.assert_no_violations();
}

#[test]
fn undraft_refuses_a_missing_release_and_changed_assets() {
    let gh = standin();
    let (_dir, paths) = files("gh-undraft");
    let err = undraft_files(&target(&gh), "t", TAG, &paths)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("there is no release v0.1.0 on GitHub (o/r) to publish"),
        "{err}"
    );
    gh.add_release(TAG, true, &FILES[..3]);
    let err = undraft_files(&target(&gh), "t", TAG, &paths)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("release v0.1.0 lacks dist-manifest.json"),
        "{err}"
    );
    draft_files(&target(&gh), "t", TAG, COMMIT, &paths).unwrap();
    std::fs::write(&paths[0], b"rebuilt, other bytes").unwrap();
    let err = undraft_files(&target(&gh), "t", TAG, &paths)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not overwriting"), "{err}");
    assert!(gh.release(TAG).unwrap().draft, "still a draft");
    assert!(!gh.log().iter().any(|l| l.starts_with("PATCH")));
    gh.assert_no_violations();
}

#[test]
fn an_annotated_tag_is_peeled_to_its_commit() {
    let gh = GitHubStandin::start();
    gh.tag(
        TAG,
        TagTarget::Annotated(
            "2222222222222222222222222222222222222222".into(),
            COMMIT.into(),
        ),
    );
    publish_files(&target(&gh), "t", TAG, COMMIT, &files("gh-annotated").1).unwrap();
    gh.assert_no_violations();
}

/// The stand-in's checks are not vacuous: they flag what GitHub's description forbids.
#[test]
fn the_openapi_checks_catch_bad_messages() {
    use support::openapi::Spec;
    let spec = Spec::load(support::github_standin::OPENAPI);
    let op = spec
        .operation("POST", "/repos/o/r/releases/1/assets")
        .unwrap();
    assert_eq!(op.id, "repos/upload-release-asset");
    let v = spec.check_request(&op, &[], None, b"x");
    assert!(
        v.iter()
            .any(|e| e.contains("required query parameter `name` missing")),
        "{v:?}"
    );
    assert!(
        v.iter().any(|e| e.contains("Content-Type header required")),
        "{v:?}"
    );
    let v = spec.check_response(&op, 201, br#"{"id": 1, "name": "a", "state": "starter"}"#);
    assert!(
        v.iter()
            .any(|e| e.contains("required property `digest` missing")),
        "{v:?}"
    );
    assert!(v.iter().any(|e| e.contains("not in enum")), "{v:?}");
    assert!(spec
        .check_response(&op, 418, b"")
        .iter()
        .any(|e| e.contains("status 418 is not declared")));
    let op = spec.operation("POST", "/repos/o/r/releases").unwrap();
    let v = spec.check_request(
        &op,
        &[],
        Some("application/json"),
        br#"{"tag_name": "v1", "draft": "yes"}"#,
    );
    assert!(
        v.iter()
            .any(|e| e.contains(".draft") && e.contains("not of type boolean")),
        "{v:?}"
    );
    assert!(spec
        .operation("GET", "/repos/o/r/git/ref/tags/v0.1.0")
        .is_ok());
    assert!(spec.operation("PUT", "/repos/o/r/releases").is_err());
    assert!(spec.operation("GET", "/repos/o/r/pulls").is_err());
}
