//! The crates' dependency direction of DESIGN.md: `bindings -> store -> engine`,
//! `bindings -> doctor, bench -> engine`; nothing imports `bindings`, the engine imports
//! no crate of ours, and the store none but the engine. Read from each `Cargo.toml`.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test")]

use std::path::Path;

/// Our crates by folder, with their package names.
const CRATES: &[(&str, &str)] = &[
    ("engine", "transfer-engine"),
    ("store", "mooncake-store"),
    ("bench", "transfer-engine-bench"),
    ("doctor", "transfer-engine-doctor"),
    ("bindings", "mooncake-bindings"),
    ("tests", "e2e"),
    ("xtask", "xtask"),
];

/// Which of our crates each crate may depend on (normal, dev and build dependencies).
const ALLOWED: &[(&str, &[&str])] = &[
    ("engine", &[]),
    ("store", &["transfer-engine"]),
    ("bench", &["transfer-engine"]),
    ("doctor", &["transfer-engine"]),
    (
        "bindings",
        &[
            "transfer-engine",
            "mooncake-store",
            "transfer-engine-bench",
            "transfer-engine-doctor",
        ],
    ),
    // End-to-end tests across crates (DESIGN.md): the store's master and clients on hosts
    // of their own, too.
    (
        "tests",
        &["transfer-engine", "mooncake-store", "transfer-engine-bench"],
    ),
    ("xtask", &[]),
];

fn ours_used_by(manifest: &str) -> Vec<&'static str> {
    CRATES
        .iter()
        .map(|&(_, name)| name)
        .filter(|name| {
            manifest.lines().any(|l| {
                let l = l.trim_start();
                l.starts_with(&format!("{name} ")) || l.starts_with(&format!("{name}="))
            })
        })
        .collect()
}

#[test]
fn crates_depend_downward_only() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut problems = Vec::new();
    for &(dir, allowed) in ALLOWED {
        let manifest = std::fs::read_to_string(root.join(dir).join("Cargo.toml")).unwrap();
        // A crate's dev-dependency on itself only turns on its `test-child` feature.
        let own = CRATES
            .iter()
            .find(|&&(d, _)| d == dir)
            .map(|&(_, name)| name);
        for used in ours_used_by(&manifest) {
            if !allowed.contains(&used) && Some(used) != own {
                problems.push(format!("{dir}/Cargo.toml depends on {used}"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "dependencies against the layering: {problems:?}"
    );
}

#[test]
fn an_upward_dependency_is_caught() {
    let manifest = "[dependencies]\nmooncake-bindings = { path = \"../bindings\" }\n";
    assert_eq!(ours_used_by(manifest), vec!["mooncake-bindings"]);
}
