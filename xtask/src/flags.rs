//! The whole command line of `cargo xtask`, in one place.

use anyhow::{bail, format_err};

pub const HELP: &str = "\
cargo xtask: the release orchestrator

USAGE:
    cargo xtask <command> [options]

COMMANDS:
    plan <tag>                  print, as JSON, what `release <tag>` would do (nothing is built)
    check-baseline [--strict-baseline]
                                compare this host with the baseline pinned in release.toml
    verify <dir-or-tag>         re-hash the artifacts of a release directory (or of
                                target/dist/<tag>) against its sha256.sum and manifest
    verify <tag> --published    download the tag's files from the GitHub Release and the index
                                and say, per file and place, whether they are identical to
                                RELEASES.md, different or missing (GITHUB_API_URL, GITHUB_TOKEN
                                for a private repository, PYPI_INDEX_URL)
    release <tag> [--dry-run] [--strict-baseline] [--skip-images] [--allow-older]
                                verify source and baseline, build, audit, checksum, publish
                                (GitHub draft, PyPI, GitHub out of draft), build and push the
                                images, write RELEASES.md. --dry-run stops before publishing and
                                works offline; --skip-images leaves the images to `images <tag>`;
                                --allow-older publishes a version below the index's newest.
    publish github <dir-or-tag> [--allow-older]
                                step 1 of publishing a release directory (or target/dist/<tag>):
                                the index preflight, then the draft GitHub release, its assets
                                uploaded and verified by digest
    publish pypi <dir-or-tag> [--check-only] [--allow-older]
                                step 2: the wheel and sdist on the index (identical: skipped,
                                other bytes: stop). --check-only: the preflight alone (what the
                                index holds, what would be uploaded); upload nothing
    publish undraft <dir-or-tag>
                                step 3: once the index holds the same files and the assets are
                                ours by digest, the GitHub release out of draft
    images <tag> [--force] [--builder podman|buildah|docker-buildx]
                                build the serving images of release.toml [images] from the
                                release directory target/dist/<tag>, push them by digest,
                                record the digests in its manifest and RELEASES.md. A tag that
                                already holds another digest stops the run unless --force.
    pin-base [--builder-image] [<image>...]
                                resolve each [[images.image]] base tag through its registry and
                                write `@sha256:<digest>` into release.toml (all images if none
                                is named; --builder-image: [baseline] builder_image too)

Strict baseline is the default on GitHub Actions (GITHUB_ACTIONS=true).
Images: the builder is the first of podman, buildah, docker buildx found (or
XTASK_IMAGE_BUILDER); IMAGE_REGISTRY_USERNAME/IMAGE_REGISTRY_PASSWORD log in to the registry.
";

#[derive(Debug, PartialEq, Eq)]
pub enum Xtask {
    Help,
    Plan(Plan),
    CheckBaseline(CheckBaseline),
    Verify(Verify),
    Release(Release),
    Publish(Publish),
    Images(Images),
    PinBase(PinBase),
}

#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    pub tag: String,
}

#[derive(Debug, PartialEq, Eq)]
pub struct CheckBaseline {
    pub strict_baseline: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Verify {
    pub dir_or_tag: String,
    /// Compare what GitHub and the index serve with RELEASES.md.
    pub published: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Release {
    pub tag: String,
    pub dry_run: bool,
    pub strict_baseline: bool,
    pub skip_images: bool,
    /// Publish a version that sorts below the newest release on the index.
    pub allow_older: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Publish {
    pub step: PublishStep,
    pub dir_or_tag: String,
    /// `pypi` only: compare with the index, upload nothing.
    pub check_only: bool,
    /// `github`, `pypi`: publish a version that sorts below the newest release on the index.
    pub allow_older: bool,
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum PublishStep {
    Github,
    Pypi,
    Undraft,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Images {
    pub tag: String,
    pub force: bool,
    pub builder: Option<String>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct PinBase {
    pub images: Vec<String>,
    pub builder_image: bool,
}

impl Xtask {
    pub fn from_env() -> anyhow::Result<Xtask> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        Xtask::parse(&args)
    }

    pub fn parse(args: &[String]) -> anyhow::Result<Xtask> {
        let mut args = Args {
            rest: args.iter().map(String::as_str).collect(),
        };
        let Some(cmd) = args.next_positional() else {
            return Ok(Xtask::Help);
        };
        let parsed = match cmd {
            "help" | "--help" | "-h" => Xtask::Help,
            "plan" => Xtask::Plan(Plan {
                tag: args.required("<tag>")?,
            }),
            "check-baseline" => Xtask::CheckBaseline(CheckBaseline {
                strict_baseline: args.flag("--strict-baseline"),
            }),
            "verify" => {
                let published = args.flag("--published");
                Xtask::Verify(Verify {
                    dir_or_tag: args.required("<dir-or-tag>")?,
                    published,
                })
            }
            "release" => {
                let dry_run = args.flag("--dry-run");
                let strict_baseline = args.flag("--strict-baseline");
                let skip_images = args.flag("--skip-images");
                let allow_older = args.flag("--allow-older");
                Xtask::Release(Release {
                    tag: args.required("<tag>")?,
                    dry_run,
                    strict_baseline,
                    skip_images,
                    allow_older,
                })
            }
            "publish" => {
                let check_only = args.flag("--check-only");
                let allow_older = args.flag("--allow-older");
                let step = match args.required("<step>")?.as_str() {
                    "github" => PublishStep::Github,
                    "pypi" => PublishStep::Pypi,
                    "undraft" => PublishStep::Undraft,
                    other => {
                        bail!("unknown publish step `{other}`: github, pypi or undraft\n\n{HELP}")
                    }
                };
                if check_only && step != PublishStep::Pypi {
                    bail!("--check-only belongs to `publish pypi`\n\n{HELP}");
                }
                if allow_older && step == PublishStep::Undraft {
                    bail!("--allow-older belongs to `publish github` and `publish pypi`\n\n{HELP}");
                }
                Xtask::Publish(Publish {
                    step,
                    dir_or_tag: args.required("<dir-or-tag>")?,
                    check_only,
                    allow_older,
                })
            }
            "images" => {
                let force = args.flag("--force");
                let builder = args.value("--builder")?;
                Xtask::Images(Images {
                    tag: args.required("<tag>")?,
                    force,
                    builder,
                })
            }
            "pin-base" => {
                let builder_image = args.flag("--builder-image");
                let mut images = Vec::new();
                while let Some(name) = args.next_positional() {
                    images.push(name.to_owned());
                }
                Xtask::PinBase(PinBase {
                    images,
                    builder_image,
                })
            }
            other => bail!("unknown command `{other}`\n\n{HELP}"),
        };
        args.finish()?;
        Ok(parsed)
    }
}

struct Args<'a> {
    rest: Vec<&'a str>,
}

impl<'a> Args<'a> {
    fn flag(&mut self, name: &str) -> bool {
        let before = self.rest.len();
        self.rest.retain(|a| *a != name);
        self.rest.len() != before
    }

    /// `--name value` or `--name=value`.
    fn value(&mut self, name: &str) -> anyhow::Result<Option<String>> {
        let prefix = format!("{name}=");
        if let Some(i) = self.rest.iter().position(|a| a.starts_with(&prefix)) {
            let v = self.rest.remove(i)[prefix.len()..].to_owned();
            return Ok(Some(v));
        }
        let Some(i) = self.rest.iter().position(|a| *a == name) else {
            return Ok(None);
        };
        if i + 1 >= self.rest.len() || self.rest[i + 1].starts_with("--") {
            bail!("{name} needs a value\n\n{HELP}");
        }
        let v = self.rest.remove(i + 1).to_owned();
        self.rest.remove(i);
        Ok(Some(v))
    }

    fn next_positional(&mut self) -> Option<&'a str> {
        let i = self
            .rest
            .iter()
            .position(|a| !a.starts_with("--") || *a == "--help")?;
        Some(self.rest.remove(i))
    }

    fn required(&mut self, what: &str) -> anyhow::Result<String> {
        self.next_positional()
            .map(str::to_owned)
            .ok_or_else(|| format_err!("missing argument {what}\n\n{HELP}"))
    }

    fn finish(self) -> anyhow::Result<()> {
        if let Some(extra) = self.rest.first() {
            bail!("unexpected argument `{extra}`\n\n{HELP}");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> anyhow::Result<Xtask> {
        Xtask::parse(&s.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
    }

    #[test]
    fn commands_parse() {
        assert_eq!(parse("").unwrap(), Xtask::Help);
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
    fn mistakes_are_errors() {
        assert!(parse("release")
            .unwrap_err()
            .to_string()
            .contains("missing argument <tag>"));
        assert!(parse("release v0.1.0 --dryrun")
            .unwrap_err()
            .to_string()
            .contains("--dryrun"));
        assert!(parse("release v0.1.0 v0.2.0").is_err());
        assert!(parse("images v0.1.0 --builder")
            .unwrap_err()
            .to_string()
            .contains("--builder needs a value"));
        assert!(parse("images").unwrap_err().to_string().contains("<tag>"));
        assert!(parse("publish")
            .unwrap_err()
            .to_string()
            .contains("missing argument <step>"));
        assert!(parse("publish gitlab d")
            .unwrap_err()
            .to_string()
            .contains("unknown publish step `gitlab`"));
        assert!(parse("publish github d --check-only")
            .unwrap_err()
            .to_string()
            .contains("--check-only belongs to `publish pypi`"));
        assert!(parse("publish undraft d --allow-older")
            .unwrap_err()
            .to_string()
            .contains("--allow-older belongs to"));
        assert!(parse("publish undraft")
            .unwrap_err()
            .to_string()
            .contains("<dir-or-tag>"));
        assert!(parse("shipit")
            .unwrap_err()
            .to_string()
            .contains("unknown command"));
    }
}
