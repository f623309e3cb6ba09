//! `release.toml`: the pinned baseline and every release target. Unknown keys are errors, so a
//! typo never silently falls back to a default.

use std::path::Path;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::image_reference::ImageRef;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseConfig {
    /// The PyPI distribution name (`[project] name` of the wheel's pyproject.toml).
    pub distribution: String,
    pub baseline: Baseline,
    pub wheel: Wheel,
    pub github: GitHub,
    pub pypi: PyPi,
    #[serde(default)]
    pub images: Images,
}

/// The build host every release is built on (the seeds' builder image).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Baseline {
    /// `ID` of /etc/os-release.
    pub os_id: String,
    /// `VERSION_ID` of /etc/os-release.
    pub os_version: String,
    pub glibc: String,
    pub musa: String,
    pub torch: String,
    pub python: String,
    /// MUSA GPU architecture of the builder image; a property of the image, not probed.
    pub musa_arch: String,
    /// Wheel platform tag, e.g. `manylinux_2_35_x86_64`.
    pub wheel_platform: String,
    pub builder_image: String,
    /// Where the MUSA toolkit records its version, relative to the host root.
    pub musa_version_file: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Wheel {
    /// Directory (relative to the workspace) holding pyproject.toml and the crate maturin builds.
    pub project_dir: String,
    /// Modules the smoke test imports from the installed wheel.
    pub smoke_imports: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GitHub {
    /// `owner/name`.
    pub repository: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PyPi {
    /// Legacy upload API endpoint.
    pub repository_url: String,
    /// Simple API root (PEP 503/691) asked what the index already holds.
    pub index_url: String,
}

/// Serving images: where they are pushed, and each recipe with its base pinned by digest.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Images {
    /// `host[:port]/path`: images are pushed as `<registry>/<name>:<version>`.
    #[serde(default)]
    pub registry: String,
    #[serde(default, rename = "image")]
    pub images: Vec<ImageRecipe>,
}

/// One `[[images.image]]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ImageRecipe {
    /// Repository name under `images.registry`, e.g. `vllm-musa`.
    pub name: String,
    /// Directory (relative to the workspace) holding the `Dockerfile`.
    pub recipe: String,
    /// `host/path:tag@sha256:<hex>`. The tag says what was pinned; the digest is what is built
    /// from. `cargo xtask pin-base` fills in the digest; nothing is built while it is missing.
    pub base: String,
    /// A hash-locked requirements file in the recipe directory whose wheels are fetched into
    /// the build context (the build itself reaches no index).
    #[serde(default)]
    pub requirements: Option<String>,
}

impl Images {
    pub fn get(&self, name: &str) -> Option<&ImageRecipe> {
        self.images.iter().find(|i| i.name == name)
    }

    /// `<registry>/<name>:<version>`.
    pub fn target(&self, image: &ImageRecipe, version: &str) -> anyhow::Result<ImageRef> {
        ImageRef::parse(&format!(
            "{}/{}:{version}",
            self.registry.trim_end_matches('/'),
            image.name
        ))
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.images.is_empty() {
            return Ok(());
        }
        let mut seen = std::collections::BTreeSet::new();
        for image in &self.images {
            let n = &image.name;
            if n.is_empty()
                || !n
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            {
                bail!("[[images.image]] name = {n:?}: use lowercase letters, digits and `-`");
            }
            if !seen.insert(n) {
                bail!("[[images.image]] name = {n:?} appears twice");
            }
            ImageRef::parse(&image.base).with_context(|| format!("[[images.image]] {n}: base"))?;
            if let Some(r) = &image.requirements {
                if r.contains('/') || r.is_empty() {
                    bail!(
                        "[[images.image]] {n}: requirements = {r:?} must be a file name in {}",
                        image.recipe
                    );
                }
            }
            self.target(image, "0")
                .with_context(|| format!("images.registry = {:?} with image {n}", self.registry))?;
        }
        Ok(())
    }
}

impl ReleaseConfig {
    pub fn load(path: &Path) -> anyhow::Result<ReleaseConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let config = ReleaseConfig::parse(&text)
            .with_context(|| format!("{} is not a valid release configuration", path.display()))?;
        Ok(config)
    }

    pub fn parse(text: &str) -> anyhow::Result<ReleaseConfig> {
        let config: ReleaseConfig = toml::from_str(text)?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self
            .github
            .repository
            .split('/')
            .filter(|p| !p.is_empty())
            .count()
            != 2
        {
            bail!(
                "github.repository = {:?}: expected `owner/name`",
                self.github.repository
            );
        }
        self.baseline.manylinux()?;
        self.images.validate()?;
        for url in [&self.pypi.repository_url, &self.pypi.index_url] {
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                bail!("{url:?} is not an http(s) URL");
            }
        }
        Ok(())
    }

    pub fn github_owner_repo(&self) -> (&str, &str) {
        self.github.repository.split_once('/').unwrap_or(("", ""))
    }
}

impl Baseline {
    /// `manylinux_2_35_x86_64` -> (`manylinux_2_35`, `x86_64`).
    pub fn manylinux(&self) -> anyhow::Result<(String, String)> {
        let p = &self.wheel_platform;
        let parts: Vec<&str> = p.splitn(4, '_').collect();
        match parts[..] {
            ["manylinux", major, minor, arch]
                if major.parse::<u32>().is_ok() && minor.parse::<u32>().is_ok() && !arch.is_empty() =>
            {
                Ok((format!("manylinux_{major}_{minor}"), arch.to_owned()))
            }
            _ => bail!(
                "baseline.wheel_platform = {p:?}: expected a PEP 600 tag `manylinux_<glibc major>_<minor>_<arch>`"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPO_CONFIG: &str = include_str!("../../release.toml");

    #[test]
    fn the_repository_release_toml_parses_and_pins_the_seed_baseline() {
        let c = ReleaseConfig::parse(REPO_CONFIG).unwrap();
        assert_eq!(c.distribution, "mooncake-transfer-engine-musa");
        let b = &c.baseline;
        assert_eq!(
            (b.os_id.as_str(), b.os_version.as_str(), b.glibc.as_str()),
            ("ubuntu", "22.04", "2.35")
        );
        assert_eq!(
            (b.musa.as_str(), b.torch.as_str(), b.python.as_str()),
            ("5.2.0", "2.9.1.post1", "3.10")
        );
        assert_eq!(b.musa_arch, "mp31");
        assert_eq!(
            b.manylinux().unwrap(),
            ("manylinux_2_35".to_owned(), "x86_64".to_owned())
        );
        assert!(b
            .builder_image
            .contains("pytorch:2.9.1.post1-py3.10-musa5.2.0-mp31-devel-ubuntu22.04-amd64"));
    }

    #[test]
    fn unknown_keys_are_errors() {
        let text = REPO_CONFIG.replace("[github]\n", "[github]\nrepo = \"typo\"\n");
        let err = format!("{:#}", ReleaseConfig::parse(&text).unwrap_err());
        assert!(err.contains("unknown field `repo`"), "{err}");
        let text = REPO_CONFIG.replace("[images]\n", "[images]\nregistri = \"x\"\n");
        let err = format!("{:#}", ReleaseConfig::parse(&text).unwrap_err());
        assert!(err.contains("unknown field `registri`"), "{err}");
        let text = REPO_CONFIG.replace(
            "[[images.image]]\n",
            "[[images.image]]\nbase_digest = \"\"\n",
        );
        let err = format!("{:#}", ReleaseConfig::parse(&text).unwrap_err());
        assert!(err.contains("unknown field `base_digest`"), "{err}");
    }

    #[test]
    fn the_repository_release_toml_names_both_serving_images() {
        let c = ReleaseConfig::parse(REPO_CONFIG).unwrap();
        let names: Vec<&str> = c.images.images.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["vllm-musa", "sglang-musa"]);
        let vllm = c.images.get("vllm-musa").unwrap();
        assert!(vllm
            .base
            .starts_with("registry.mthreads.com/mcconline/inference/vllm/vllm-openai:v0.28.0"));
        assert_eq!(
            c.images.get("sglang-musa").unwrap().requirements.as_deref(),
            Some("requirements-router.txt")
        );
        for i in &c.images.images {
            assert!(std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(&i.recipe)
                .join("Dockerfile")
                .is_file());
        }
    }

    #[test]
    fn bad_image_entries_are_errors() {
        for (from, to, why) in [
            (
                "name = \"vllm-musa\"",
                "name = \"sglang-musa\"",
                "appears twice",
            ),
            ("name = \"vllm-musa\"", "name = \"vLLM\"", "lowercase"),
            ("base = \"registry.mthreads.com/", "base = \"", "base"),
        ] {
            let text = REPO_CONFIG.replacen(from, to, 1);
            let err = format!("{:#}", ReleaseConfig::parse(&text).unwrap_err());
            assert!(err.contains(why), "{to}: {err}");
        }
    }

    #[test]
    fn bad_values_are_errors() {
        let text = REPO_CONFIG.replace("manylinux_2_35_x86_64", "linux_x86_64");
        assert!(format!("{:#}", ReleaseConfig::parse(&text).unwrap_err()).contains("PEP 600"));
    }
}
