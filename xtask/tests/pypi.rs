//! `publish PyPI` against devpi-server on loopback (scripts/release-devpi.sh), with stand-in
//! wheels and sdists: first publish, identical re-publish skips, a changed wheel under the same
//! name is refused with nothing half-uploaded, bad credentials are refused without showing them.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod support;

use std::process::Command;

use support::devpi::{standin_artifacts, start_devpi};
use xtask::release::pypi::{publish_files, runtime, Credentials};

/// One devpi-server for all scenarios, stopped at the end (also on failure).
#[test]
fn devpi_publishes_standin_artifacts_idempotently_and_refuses_changed_bytes() {
    let devpi = start_devpi();
    let rt = runtime().unwrap();
    let work = support::temp_dir("pypi-work");

    // The metadata reader gives the form fields twine would send.
    let v1 = standin_artifacts(&work.join("v1"), "one");
    let wheel_fields = &v1[0].fields;
    assert!(wheel_fields.contains(&("filetype".into(), "bdist_wheel".into())));
    assert!(wheel_fields.contains(&("pyversion".into(), "py3".into())));
    assert!(wheel_fields.contains(&("metadata_version".into(), "2.4".into())));
    assert_eq!(
        wheel_fields
            .iter()
            .filter(|(k, _)| k == "classifiers")
            .count(),
        2
    );
    assert!(v1[1]
        .fields
        .contains(&("pyversion".into(), "source".into())));

    // First publish uploads both; the index then lists them with our sha256.
    let index = devpi.index("first");
    let out = rt
        .block_on(publish_files(
            &index,
            &devpi.credentials(),
            "standin-dist",
            &v1,
        ))
        .unwrap();
    assert_eq!(out.uploaded.len(), 2, "{out:?}");
    assert!(out.identical.is_empty());
    assert!(out.place.url.ends_with("/+simple/standin-dist/"));

    // An identical re-publish uploads nothing.
    let again = rt
        .block_on(publish_files(
            &index,
            &devpi.credentials(),
            "standin-dist",
            &v1,
        ))
        .unwrap();
    assert!(again.uploaded.is_empty(), "{again:?}");
    assert_eq!(again.identical.len(), 2);

    // A changed wheel under the same name is refused, and the sdist that is missing from the
    // index is not uploaded either: nothing half-uploaded.
    let half = devpi.index("half");
    rt.block_on(publish_files(
        &half,
        &devpi.credentials(),
        "standin-dist",
        &v1[..1],
    ))
    .unwrap();
    let v2 = standin_artifacts(&work.join("v2"), "two");
    let err = rt
        .block_on(publish_files(
            &half,
            &devpi.credentials(),
            "standin-dist",
            &v2,
        ))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("already holds other bytes under our file names; nothing was uploaded"),
        "{err}"
    );
    assert!(
        err.contains("standin_dist-0.1.0-py3-none-any.whl: the index has sha256"),
        "{err}"
    );
    let after = rt
        .block_on(publish_files(
            &half,
            &devpi.credentials(),
            "standin-dist",
            &v1[..1],
        ))
        .unwrap();
    assert_eq!(
        after.identical.len(),
        1,
        "the index still holds the first wheel"
    );
    let page = Command::new("python3")
        .args(["-c", "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())"])
        .arg(format!("{}standin-dist/", half.simple_url))
        .output()
        .unwrap();
    let page = String::from_utf8_lossy(&page.stdout);
    assert!(
        page.contains("standin_dist-0.1.0-py3-none-any.whl#sha256="),
        "{page}"
    );
    assert!(
        !page.contains("standin_dist-0.1.0.tar.gz"),
        "the sdist was not uploaded: {page}"
    );

    // Wrong credentials: refused, and the message does not show them.
    let bad = Credentials {
        username: devpi.user.clone(),
        password: "wrong-secret".into(),
    };
    let err = rt
        .block_on(publish_files(
            &devpi.index("bad"),
            &bad,
            "standin-dist",
            &v1,
        ))
        .unwrap_err()
        .to_string();
    assert!(err.contains("refused (HTTP 40"), "{err}");
    assert!(
        !err.contains("wrong-secret") && !err.contains(&devpi.password),
        "{err}"
    );

    std::fs::remove_dir_all(&work).unwrap();
}
