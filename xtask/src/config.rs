//! `release.toml`: the pinned baseline and every release target. Unknown keys are errors, so a
//! typo never silently falls back to a default.

use std::path::Path;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

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

/// Serving images; the images issue fills this section.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Images {}

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
        let text = REPO_CONFIG.replace("[images]\n", "[images]\nregistry = \"x\"\n");
        let err = format!("{:#}", ReleaseConfig::parse(&text).unwrap_err());
        assert!(err.contains("unknown field `registry`"), "{err}");
    }

    #[test]
    fn bad_values_are_errors() {
        let text = REPO_CONFIG.replace("manylinux_2_35_x86_64", "linux_x86_64");
        assert!(format!("{:#}", ReleaseConfig::parse(&text).unwrap_err()).contains("PEP 600"));
    }
}
