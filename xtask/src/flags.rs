//! The whole command line of `cargo xtask`, in one place (clap's derive API: the help text is
//! generated from these doc comments).

use anyhow::bail;
use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "cargo xtask: the release orchestrator",
    arg_required_else_help = true,
    after_help = "Strict baseline is the default on GitHub Actions (GITHUB_ACTIONS=true).\n\
        Images: the builder is the first of podman, buildah, docker buildx found (or\n\
        XTASK_IMAGE_BUILDER); IMAGE_REGISTRY_USERNAME/IMAGE_REGISTRY_PASSWORD log in to the registry."
)]
struct Cli {
    #[command(subcommand)]
    command: Xtask,
}

#[derive(Debug, PartialEq, Eq, Subcommand)]
pub enum Xtask {
    /// Print, as JSON, what `release <tag>` would do (nothing is built).
    Plan(Plan),
    /// Compare this host with the baseline pinned in release.toml.
    CheckBaseline(CheckBaseline),
    /// Re-hash a release directory (or target/dist/<tag>) against its sha256.sum and manifest;
    /// with --published, compare what GitHub and the index serve with the publication record.
    Verify(Verify),
    /// Verify source and baseline, build, audit, checksum, publish (GitHub draft, PyPI, GitHub
    /// out of draft), build and push the images, write RELEASES.md.
    Release(Release),
    /// One publishing step on a release directory (or target/dist/<tag>), as the release
    /// workflow's jobs run them.
    Publish(Publish),
    /// Build the serving images of release.toml [images] from target/dist/<tag>, push them by
    /// digest, record the digests in its publication.json and RELEASES.md.
    Images(Images),
    /// Resolve each [[images.image]] base tag through its registry and write
    /// `@sha256:<digest>` into release.toml.
    PinBase(PinBase),
    /// Record in a release directory's publication.json what attestation bundles (Sigstore,
    /// from actions/attest-build-provenance) attest: predicate type, subjects and digests.
    RecordAttestation(RecordAttestation),
}

#[derive(Debug, PartialEq, Eq, Args)]
pub struct Plan {
    pub tag: String,
}

#[derive(Debug, PartialEq, Eq, Args)]
pub struct CheckBaseline {
    /// Any difference from the baseline fails.
    #[arg(long)]
    pub strict_baseline: bool,
}

#[derive(Debug, PartialEq, Eq, Args)]
pub struct Verify {
    /// A release directory or a tag (target/dist/<tag>); a tag with --published.
    pub dir_or_tag: String,
    /// Download the tag's files from the GitHub Release and the index and say, per file and
    /// place, whether they are identical to the publication record (the release's
    /// publication.json; target/dist/<tag>/publication.json too where there is one), different
    /// or missing (GITHUB_API_URL, GITHUB_TOKEN for a private repository, PYPI_INDEX_URL).
    #[arg(long)]
    pub published: bool,
}

#[derive(Debug, PartialEq, Eq, Args)]
pub struct Release {
    pub tag: String,
    /// Stop before publishing; works offline.
    #[arg(long)]
    pub dry_run: bool,
    /// Any difference from the baseline fails.
    #[arg(long)]
    pub strict_baseline: bool,
    /// Leave the images to `images <tag>`.
    #[arg(long)]
    pub skip_images: bool,
    /// Publish a version that sorts below the newest release on the index.
    #[arg(long)]
    pub allow_older: bool,
}

#[derive(Debug, PartialEq, Eq, Args)]
pub struct Publish {
    /// github: the index preflight, then the draft release, its assets uploaded and verified
    /// by digest; pypi: the wheel and sdist on the index; undraft: once the index holds the same
    /// files and the assets are ours by digest, the release out of draft and publication.json
    /// written and attached; record: publication.json attached again (after images,
    /// record-attestation).
    pub step: PublishStep,
    pub dir_or_tag: String,
    /// `pypi` only: the preflight alone (what the index holds, what would be uploaded).
    #[arg(long)]
    pub check_only: bool,
    /// `github`, `pypi`: publish a version that sorts below the newest release on the index.
    #[arg(long)]
    pub allow_older: bool,
}

#[derive(Debug, PartialEq, Eq, Clone, Copy, ValueEnum)]
pub enum PublishStep {
    Github,
    Pypi,
    Undraft,
    Record,
}

#[derive(Debug, PartialEq, Eq, Args)]
pub struct Images {
    pub tag: String,
    /// Replace an image whose tag already holds another digest.
    #[arg(long)]
    pub force: bool,
    /// podman, buildah or docker-buildx.
    #[arg(long, value_name = "BUILDER")]
    pub builder: Option<String>,
}

#[derive(Debug, PartialEq, Eq, Args)]
pub struct RecordAttestation {
    /// A release directory or a tag (target/dist/<tag>).
    pub dir_or_tag: String,
    /// Bundle files (JSON, or JSON Lines of bundles).
    #[arg(required = true)]
    pub bundles: Vec<std::path::PathBuf>,
}

#[derive(Debug, PartialEq, Eq, Args)]
pub struct PinBase {
    /// The images to pin (all if none is named).
    pub images: Vec<String>,
    /// Pin [baseline] builder_image too.
    #[arg(long)]
    pub builder_image: bool,
}

impl Xtask {
    /// The command line of this process; `--help` and clap's own errors exit here.
    pub fn from_env() -> anyhow::Result<Xtask> {
        let flags = Cli::parse().command;
        flags.check()?;
        Ok(flags)
    }

    /// `args` without the program name.
    pub fn parse(args: &[&str]) -> anyhow::Result<Xtask> {
        let cli = Cli::try_parse_from(std::iter::once("xtask").chain(args.iter().copied()))?;
        cli.command.check()?;
        Ok(cli.command)
    }

    /// What clap cannot say: options that belong to some publishing steps only.
    fn check(&self) -> anyhow::Result<()> {
        if let Xtask::Publish(p) = self {
            if p.check_only && p.step != PublishStep::Pypi {
                bail!("--check-only belongs to `publish pypi`");
            }
            if p.allow_older && p.step == PublishStep::Undraft {
                bail!("--allow-older belongs to `publish github` and `publish pypi`");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> anyhow::Result<Xtask> {
        Xtask::parse(&s.split_whitespace().collect::<Vec<_>>())
    }

    fn error(s: &str) -> String {
        parse(s).unwrap_err().to_string()
    }

    #[test]
    fn commands_parse() {
        assert_eq!(
            parse("release v0.1.0 --dry-run").unwrap(),
            Xtask::Release(Release {
                tag: "v0.1.0".into(),
                dry_run: true,
                strict_baseline: false,
                skip_images: false,
                allow_older: false
            })
        );
        assert_eq!(
            parse("release --strict-baseline v0.1.0").unwrap(),
            Xtask::Release(Release {
                tag: "v0.1.0".into(),
                dry_run: false,
                strict_baseline: true,
                skip_images: false,
                allow_older: false
            })
        );
        assert_eq!(
            parse("release v0.1.0 --skip-images --allow-older").unwrap(),
            Xtask::Release(Release {
                tag: "v0.1.0".into(),
                dry_run: false,
                strict_baseline: false,
                skip_images: true,
                allow_older: true
            })
        );
        assert_eq!(
            parse("images v0.1.0 --builder podman --force").unwrap(),
            Xtask::Images(Images {
                tag: "v0.1.0".into(),
                force: true,
                builder: Some("podman".into())
            })
        );
        assert_eq!(
            parse("images --builder=buildah v0.1.0").unwrap(),
            Xtask::Images(Images {
                tag: "v0.1.0".into(),
                force: false,
                builder: Some("buildah".into())
            })
        );
        assert_eq!(
            parse("pin-base").unwrap(),
            Xtask::PinBase(PinBase {
                images: vec![],
                builder_image: false
            })
        );
        assert_eq!(
            parse("pin-base vllm-musa --builder-image sglang-musa").unwrap(),
            Xtask::PinBase(PinBase {
                images: vec!["vllm-musa".into(), "sglang-musa".into()],
                builder_image: true
            })
        );
        assert_eq!(
            parse("publish github target/dist/v0.1.0").unwrap(),
            Xtask::Publish(Publish {
                step: PublishStep::Github,
                dir_or_tag: "target/dist/v0.1.0".into(),
                check_only: false,
                allow_older: false
            })
        );
        assert_eq!(
            parse("publish pypi --check-only v0.1.0 --allow-older").unwrap(),
            Xtask::Publish(Publish {
                step: PublishStep::Pypi,
                dir_or_tag: "v0.1.0".into(),
                check_only: true,
                allow_older: true
            })
        );
        assert_eq!(
            parse("publish undraft v0.1.0").unwrap(),
            Xtask::Publish(Publish {
                step: PublishStep::Undraft,
                dir_or_tag: "v0.1.0".into(),
                check_only: false,
                allow_older: false
            })
        );
        assert_eq!(
            parse("plan v0.1.0").unwrap(),
            Xtask::Plan(Plan {
                tag: "v0.1.0".into()
            })
        );
        assert_eq!(
            parse("verify target/dist/v0.1.0").unwrap(),
            Xtask::Verify(Verify {
                dir_or_tag: "target/dist/v0.1.0".into(),
                published: false
            })
        );
        assert_eq!(
            parse("verify --published v0.1.0").unwrap(),
            Xtask::Verify(Verify {
                dir_or_tag: "v0.1.0".into(),
                published: true
            })
        );
        assert_eq!(
            parse("check-baseline --strict-baseline").unwrap(),
            Xtask::CheckBaseline(CheckBaseline {
                strict_baseline: true
            })
        );
    }

    #[test]
    fn mistakes_are_errors_that_name_them() {
        assert!(error("release").contains("<TAG>"), "{}", error("release"));
        assert!(error("release v0.1.0 --dryrun").contains("--dryrun"));
        assert!(error("release v0.1.0 v0.2.0").contains("v0.2.0"));
        assert!(error("images v0.1.0 --builder").contains("--builder"));
        assert!(error("images").contains("<TAG>"));
        assert!(error("publish").contains("<STEP>"));
        let e = error("publish gitlab d");
        assert!(
            e.contains("gitlab") && e.contains("github, pypi, undraft"),
            "{e}"
        );
        assert!(error("publish github d --check-only")
            .contains("--check-only belongs to `publish pypi`"));
        assert!(error("publish undraft d --allow-older").contains("--allow-older belongs to"));
        assert!(error("publish undraft").contains("<DIR_OR_TAG>"));
        assert!(error("shipit").contains("shipit"));
    }

    #[test]
    fn the_help_lists_every_command() {
        let help = error("help");
        for command in [
            "plan",
            "check-baseline",
            "verify",
            "release",
            "publish",
            "images",
            "pin-base",
        ] {
            // The release workflow's images job looks for `  images  ` in `cargo xtask help`.
            assert!(
                help.lines()
                    .any(|l| l.trim_start().starts_with(&format!("{command} "))),
                "{command}: {help}"
            );
        }
    }
}
