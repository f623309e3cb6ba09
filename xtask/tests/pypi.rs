//! `publish PyPI` against devpi-server on loopback (scripts/release-devpi.sh), with stand-in
//! wheels and sdists, uploaded by `uv publish` from the locked build-tools venv: first publish,
//! identical re-publish skips, an interrupted publish resumes with the missing file only, a
//! changed wheel under the same name is refused with nothing uploaded, bad credentials are
//! refused without showing them.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod support;

use std::process::Command;

use support::devpi::{standin_artifacts, start_devpi, tools_uv};
use xtask::release::pypi::{compare, publish_files, Credentials, Index};

/// One devpi-server for all scenarios, stopped at the end (also on failure).
#[test]
fn devpi_publishes_standin_artifacts_idempotently_and_refuses_changed_bytes() {
    let devpi = start_devpi();
    let uv = tools_uv();
    let sh = xshell::Shell::new().unwrap();
    let work = support::temp_dir("pypi-work");
    let v1 = standin_artifacts(&work.join("v1"), "one");
    let publish = |index: &Index, credentials: &Credentials, files: &[std::path::PathBuf]| {
        publish_files(&sh, &uv, index, credentials, "standin-dist", files)
    };

    // First publish uploads both; the index then lists them with our sha256.
    let index = devpi.index("first");
    let out = publish(&index, &devpi.credentials(), &v1).unwrap();
    assert_eq!(out.uploaded.len(), 2, "{out:?}");
    assert!(out.identical.is_empty());
    assert!(out.place.url.ends_with("/+simple/standin-dist/"));

    // An identical re-publish uploads nothing.
    let again = publish(&index, &devpi.credentials(), &v1).unwrap();
    assert!(again.uploaded.is_empty(), "{again:?}");
    assert_eq!(again.identical.len(), 2);

    // An interrupted publish (the wheel made it, the sdist did not) resumes: the next run
    // uploads the sdist alone.
    let resumed = devpi.index("resumed");
    publish(&resumed, &devpi.credentials(), &v1[..1]).unwrap();
    let out = publish(&resumed, &devpi.credentials(), &v1).unwrap();
    assert_eq!(out.uploaded, ["standin_dist-0.1.0.tar.gz"], "{out:?}");
    assert_eq!(out.identical, ["standin_dist-0.1.0-py3-none-any.whl"]);

    // A changed wheel under the same name is refused, and the sdist that is missing from the
    // index is not uploaded either: nothing half-uploaded.
    let half = devpi.index("half");
    publish(&half, &devpi.credentials(), &v1[..1]).unwrap();
    let v2 = standin_artifacts(&work.join("v2"), "two");
    let err = publish(&half, &devpi.credentials(), &v2)
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
    let after = compare(&half, "standin-dist", &v1[..1]).unwrap();
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
    let bad = Credentials::Password {
        username: devpi.user.clone(),
        password: "wrong-secret".into(),
    };
    let bad_index = devpi.index("bad");
    let err = publish(&bad_index, &bad, &v1).unwrap_err().to_string();
    assert!(
        err.contains("uv publish to") && err.contains("failed"),
        "{err}"
    );
    assert!(
        !err.contains("wrong-secret") && !err.contains(&devpi.password),
        "{err}"
    );
    let nothing = compare(&bad_index, "standin-dist", &v1).unwrap();
    assert_eq!(nothing.missing.len(), 2);

    std::fs::remove_dir_all(&work).unwrap();
}
