//! `cargo xtask verify <dir-or-tag>`: re-hash a release's artifacts against its `sha256.sum`
//! and manifest. What an image builder runs before it installs the wheel.
//! `cargo xtask verify <tag> --published`: the files as GitHub and the index serve them, compared
//! with the publication record (`verify/published.rs`).

use xshell::Shell;

use crate::checksums;
use crate::flags;
use crate::Workspace;

pub mod published;

impl flags::Verify {
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        if self.published {
            let ws = Workspace::load(sh)?;
            let checks = published::published(&ws, &self.dir_or_tag)?;
            return published::report(&self.dir_or_tag, &checks);
        }
        let dir = checksums::resolve_dir(&sh.current_dir(), &self.dir_or_tag);
        let verified = checksums::verify_dir(&dir)?;
        for (name, size) in &verified.files {
            println!("{name}: OK ({size} bytes)");
        }
        eprintln!(
            "{}: {} files match sha256.sum and the manifest",
            dir.display(),
            verified.files.len()
        );
        Ok(())
    }
}
