//! PyPI trusted publishing (OIDC) through `uv publish`, against a loopback stand-in that plays
//! GitHub's ID-token endpoint and the index (`/_/oidc/*`, the upload endpoint and a PEP 691
//! project page), as PyPI answers them. A stand-in, because PyPI's trusted publishing cannot
//! run here; the uploader is the real uv of the locked build-tools venv. Plain HTTP only (see
//! the test's comment), so the stand-in's token routes document what PyPI answers.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod support;

use std::sync::{Arc, Mutex};

use support::devpi::{standin_artifacts, tools_uv};
use support::github_standin::serve_fn;
use xtask::checksums::sha256_file;
use xtask::release::pypi::{publish_files, Credentials, Index};

const WHEEL: &str = "standin_dist-0.1.0-py3-none-any.whl";

/// The stand-in; `mint_ok` false: the index refuses the GitHub ID token. Returns its URL and
/// the authorization headers of the uploads it accepted.
fn standin(mint_ok: bool, wheel_sha: String) -> (String, Arc<Mutex<Vec<String>>>) {
    let uploads = Arc::new(Mutex::new(Vec::new()));
    let seen = uploads.clone();
    let url = serve_fn(move |req| {
        match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/_/oidc/audience") => (200, r#"{"audience": "pypi"}"#.into()),
        ("GET", "/id-token") => {
            let auth = req.headers.get("authorization").map(String::as_str)
                == Some("bearer request-token");
            let audience = req.query.iter().any(|(k, v)| k == "audience" && v == "pypi");
            if auth && audience {
                (200, r#"{"value": "the.github.jwt"}"#.into())
            } else {
                (403, "{}".into())
            }
        }
        ("POST", "/_/oidc/mint-token") => {
            let body: serde_json::Value = serde_json::from_slice(&req.body).unwrap_or_default();
            if mint_ok && body["token"] == "the.github.jwt" {
                (
                    200,
                    r#"{"success": true, "token": "pypi-minted-secret", "expires": 900}"#.into(),
                )
            } else {
                (422, r#"{"message": "Token request failed", "errors": [{"code": "invalid-publisher", "description": "valid token, but no corresponding publisher"}]}"#.into())
            }
        }
        ("POST", "/legacy/") => {
            let auth = req.headers.get("authorization").cloned().unwrap_or_default();
            seen.lock().unwrap().push(auth);
            (200, "{}".into())
        }
        ("GET", "/simple/standin-dist/") if !seen.lock().unwrap().is_empty() => (
            200,
            serde_json::json!({"meta": {"api-version": "1.0"}, "name": "standin-dist", "files": [
                {"filename": WHEEL, "url": format!("/files/{WHEEL}"), "hashes": {"sha256": wheel_sha}}]})
            .to_string(),
        ),
        _ => (404, "{}".into()),
    }
    });
    (url, uploads)
}

fn publish_with_trusted_publishing(mint_ok: bool) -> (anyhow::Result<()>, Vec<String>) {
    let dir = support::temp_dir("trusted-publishing");
    let _cleanup = support::Scratch(dir.clone());
    let wheel = standin_artifacts(&dir, "one")[0].clone();
    let (sha, _) = sha256_file(&wheel).unwrap();
    let (url, uploads) = standin(mint_ok, sha);
    let index = Index {
        upload_url: format!("{url}/legacy/"),
        simple_url: format!("{url}/simple/"),
    };
    let sh = xshell::Shell::new().unwrap();
    sh.set_var("GITHUB_ACTIONS", "true");
    sh.set_var(
        "ACTIONS_ID_TOKEN_REQUEST_URL",
        format!("{url}/id-token?api-version=2.0"),
    );
    sh.set_var("ACTIONS_ID_TOKEN_REQUEST_TOKEN", "request-token");
    let out = publish_files(
        &sh,
        &tools_uv(),
        &index,
        &Credentials::TrustedPublishing,
        "standin-dist",
        &[wheel],
    )
    .map(|_| ());
    let seen = uploads.lock().unwrap().clone();
    (out, seen)
}

/// uv insists on HTTPS for the OIDC exchange (it asks `https://<index>/_/oidc/audience`), which
/// this plain-HTTP stand-in cannot serve: the exchange itself is uv's and is not run here. What
/// is checked: `Credentials::TrustedPublishing` makes uv attempt trusted publishing (not a
/// password), its failure is reported with uv's reason, and nothing reaches the upload endpoint.
#[test]
fn trusted_publishing_is_left_to_uv_and_a_failed_exchange_uploads_nothing() {
    let (out, uploads) = publish_with_trusted_publishing(true);
    let err = out.unwrap_err().to_string();
    assert!(
        err.contains("uv publish to") && err.contains("failed"),
        "{err}"
    );
    assert!(
        err.contains("Failed to obtain token for trusted publishing"),
        "{err}"
    );
    assert!(
        !err.contains("request-token") && !err.contains("the.github.jwt"),
        "{err}"
    );
    assert!(uploads.is_empty(), "{uploads:?}");
}
