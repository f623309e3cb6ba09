//! PyPI trusted publishing (OIDC) against a loopback stand-in that plays both GitHub's ID-token
//! endpoint and the index's `/_/oidc/*` routes, as PyPI answers them.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod support;

use support::github_standin::serve_fn;
use xtask::release::pypi::{runtime, trusted_publishing, Index};

fn index(url: &str) -> Index {
    Index {
        upload_url: format!("{url}/legacy/"),
        simple_url: format!("{url}/simple/"),
    }
}

fn standin(mint_ok: bool) -> String {
    serve_fn(move |req| match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/_/oidc/audience") => (200, r#"{"audience": "pypi"}"#.into()),
        ("GET", "/id-token") => {
            let q = |k: &str| {
                req.query
                    .iter()
                    .any(|(a, b)| a == k && (k != "audience" || b == "pypi"))
            };
            let auth = req.headers.get("authorization").map(String::as_str)
                == Some("bearer request-token");
            if q("api-version") && q("audience") && auth {
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
        _ => (404, "{}".into()),
    })
}

#[test]
fn the_github_id_token_is_exchanged_for_a_pypi_token() {
    let url = standin(true);
    let id_url = format!("{url}/id-token?api-version=2.0");
    let token = runtime()
        .unwrap()
        .block_on(trusted_publishing(&index(&url), &id_url, "request-token"))
        .unwrap();
    assert_eq!(token, "pypi-minted-secret");
}

#[test]
fn a_refused_exchange_names_the_reason_and_no_token() {
    let url = standin(false);
    let id_url = format!("{url}/id-token?api-version=2.0");
    let err = runtime()
        .unwrap()
        .block_on(trusted_publishing(&index(&url), &id_url, "request-token"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("invalid-publisher: valid token, but no corresponding publisher"),
        "{err}"
    );
    assert!(
        err.contains("Check the project's trusted publisher"),
        "{err}"
    );
    assert!(
        !err.contains("the.github.jwt") && !err.contains("request-token"),
        "{err}"
    );
}

#[test]
fn an_index_without_oidc_says_to_use_a_token() {
    let url = serve_fn(|_| (404, "{}".into()));
    let err = runtime()
        .unwrap()
        .block_on(trusted_publishing(&index(&url), &format!("{url}/id"), "t"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("does not offer trusted publishing") && err.contains("PYPI_API_TOKEN"),
        "{err}"
    );
}
