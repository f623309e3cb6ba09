//! `cargo xtask publish <step> <dir-or-tag>`: one publishing step on a built release directory,
//! as the release workflow's jobs run them; `release/publish.rs` holds the steps and their order.

use xshell::Shell;

use anyhow::bail;

use crate::checksums;
use crate::flags;
use crate::publication::{self, Publication};
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
                let record = publish::undraft(&ws, &dist, &manifest)?;
                let url = |p: &Option<crate::publication::Place>| {
                    p.as_ref().map(|p| p.url.clone()).unwrap_or_default()
                };
                format!(
                    "published {} (the index holds the same files: {})",
                    url(&record.github),
                    url(&record.index)
                )
            }
            flags::PublishStep::Record => {
                if publication::read(&dist)?.is_none() {
                    bail!(
                        "{} has no {}: `cargo xtask publish undraft` writes it",
                        dist.display(),
                        publication::PUBLICATION
                    );
                }
                // Refuses a record of another build than this directory's.
                let record = Publication::load_or_new(&dist, &manifest)?;
                publish::attach(&ws, &record)?
            }
        };
        println!("{outcome}");
        Ok(())
    }
}
