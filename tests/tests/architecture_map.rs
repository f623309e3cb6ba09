//! `ARCHITECTURE.md` is the map a newcomer follows: every repository path it names in
//! backticks must exist, so a file that moves without its map failing here cannot happen.

use std::path::{Path, PathBuf};

/// Top-level folders of the repository; a backticked span starting with one is a path.
const ROOTS: &[&str] = &[
    "engine/",
    "store/",
    "bindings/",
    "bench/",
    "doctor/",
    "cli/",
    "tests/",
    "xtask/",
    "scripts/",
    "docs/",
    "images/",
    "workflows/",
];

fn repo() -> PathBuf {
    // The e2e crate is the repository's `tests/` folder.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The backticked spans of `text` that name repository paths.
fn named_paths(text: &str) -> Vec<&str> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| ROOTS.iter().any(|r| span.starts_with(r)))
        .filter(|span| !span.contains(char::is_whitespace))
        .collect()
}

fn missing(root: &Path, text: &str) -> Vec<String> {
    named_paths(text)
        .into_iter()
        .filter(|p| !root.join(p).exists())
        .map(str::to_string)
        .collect()
}

#[test]
fn every_path_the_architecture_map_names_exists() {
    let root = repo();
    let text = match std::fs::read_to_string(root.join("ARCHITECTURE.md")) {
        Ok(t) => t,
        Err(e) => panic!("cannot read ARCHITECTURE.md: {e}"),
    };
    let named = named_paths(&text);
    assert!(
        named.len() >= 40,
        "ARCHITECTURE.md names only {} paths: is the code map still there?",
        named.len()
    );
    let gone = missing(&root, &text);
    assert!(
        gone.is_empty(),
        "ARCHITECTURE.md names paths that do not exist (moved or renamed? update the map): {gone:?}"
    );
}

#[test]
fn a_moved_file_is_caught() {
    let text = "see `engine/src/engine/mod.rs` and `engine/src/no_such_file.rs`, not `MC_X`";
    assert_eq!(missing(&repo(), text), ["engine/src/no_such_file.rs"]);
}
