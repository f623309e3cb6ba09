//! `cargo xtask verify <dir-or-tag>`: re-hash a release's artifacts against its `sha256.sum`
//! and manifest. What an image builder runs before it installs the wheel.

use xshell::Shell;

use crate::flags;
use crate::release::checksums;

impl flags::Verify {
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
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
