//! The release orchestrator behind `cargo xtask`. See `xtask/README.md` for the map.
//!
//! `main.rs` parses [`flags`] and calls `run` on the chosen command; each command lives in its
//! own module (`plan`, `check_baseline`, `verify`, `release`, `publish`, `images`,
//! `pin_base`), the phases of a release in `release/`, the image builders and registry in
//! `images/`. The records they share depend on no command: [`source`], [`checksums`] (the
//! manifest, frozen once checksummed), [`publication`] (where the release was published),
//! [`ledger`] (rendered from both), [`image_reference`].

// The lints the workspace is adopting: a failure is an error that says what to do, not a panic.
#![warn(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::undocumented_unsafe_blocks
)]

use std::path::{Path, PathBuf};

pub mod attestation;
pub mod check_baseline;
pub mod checksums;
pub mod config;
pub mod env;
pub mod flags;
pub mod image_reference;
pub mod images;
pub mod ledger;
pub mod phase;
pub mod pin_base;
pub mod plan;
pub mod publication;
pub mod publish;
pub mod release;
pub mod retry;
pub mod source;
pub mod verify;
pub mod version;

pub use config::ReleaseConfig;

/// The release ledger, at the workspace root (written by `ledger.rs`; `source.rs` lets it be
/// the one file that may differ from the tag in a clean tree).
pub const LEDGER: &str = "RELEASES.md";

/// The workspace xtask operates on: `$XTASK_ROOT`, or the one it was built from.
pub fn project_root() -> PathBuf {
    match env::var(env::XTASK_ROOT) {
        Some(root) => PathBuf::from(root),
        None => {
            // xtask/ sits in the workspace root.
            let xtask_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
            xtask_dir.parent().unwrap_or(xtask_dir).to_path_buf()
        }
    }
}

/// A workspace and its release configuration.
#[derive(Debug, Clone)]
pub struct Workspace {
    pub root: PathBuf,
    pub config: ReleaseConfig,
}

impl Workspace {
    pub fn load(sh: &xshell::Shell) -> anyhow::Result<Workspace> {
        let root = sh.current_dir();
        let config = ReleaseConfig::load(&root.join("release.toml"))?;
        Ok(Workspace { root, config })
    }

    /// Where a release's artifacts, sums and manifest land.
    pub fn dist_dir(&self, tag: &str) -> PathBuf {
        self.root.join("target").join("dist").join(tag)
    }

    /// xtask's own scratch space (build venv, staging).
    pub fn scratch_dir(&self) -> PathBuf {
        self.root.join("target").join("xtask")
    }

    pub fn wheel_project_dir(&self) -> PathBuf {
        self.root.join(&self.config.wheel.project_dir)
    }
}
