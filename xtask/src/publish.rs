//! `cargo xtask publish <step> <dir-or-tag>`: one publishing step on a built release directory,
//! as the release workflow's jobs run them; `release/publish.rs` holds the steps and their order.

use xshell::Shell;

use crate::checksums;
use crate::flags;
use crate::release::publish;
use crate::Workspace;

impl flags::Publish {
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        let ws = Workspace::load(sh)?;
        let dist = checksums::resolve_dir(&sh.current_dir(), &self.dir_or_tag);
        let verified = checksums::verify_dir(&dist)?;
        let manifest = checksums::read_manifest(&dist)?;
        eprintln!(
            "{}: release {}, {} files match sha256.sum and the manifest",
            dist.display(),
            manifest.announcement_tag,
            verified.files.len()
        );
        let outcome = match self.step {
            flags::PublishStep::Github => {
                let p = publish::github(&ws, &dist, &manifest, self.allow_older)?;
                format!("GitHub draft: {}", p.summary())
            }
            flags::PublishStep::Pypi if self.check_only => {
                publish::preflight(&ws, &dist, &manifest, self.allow_older)?
            }
            flags::PublishStep::Pypi => {
                let p = publish::pypi(sh, &ws, &dist, &manifest, self.allow_older)?;
                format!("PyPI: {}", p.summary())
            }
            flags::PublishStep::Undraft => {
                let [github, index] = publish::undraft(&ws, &dist, &manifest)?;
                format!(
                    "published {} (the index holds the same files: {})",
                    github.url, index.url
                )
            }
        };
        println!("{outcome}");
        Ok(())
    }
}
