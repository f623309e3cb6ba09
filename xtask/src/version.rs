//! Release tags, PEP 440 versions, and their mapping to Cargo's semver.
//!
//! A release tag is `v` followed by a PEP 440 *final* or *post* release in normal form:
//! `v0.3.12` or `v0.3.12.post1`. Pre-releases, dev releases, local versions and epochs are not
//! release tags (the pipeline cuts none; PyPI refuses local versions).
//!
//! Cargo versions are semver, which has no post releases, so the mapping is:
//!
//! | tag             | PEP 440 (wheel, sdist) | Cargo (`[workspace.package] version`) |
//! |-----------------|------------------------|---------------------------------------|
//! | `v0.3.12`       | `0.3.12`               | `0.3.12`                              |
//! | `v0.3.12.post1` | `0.3.12.post1`         | `0.3.12-post1`                        |
//!
//! `0.3.12-post1` is a semver pre-release identifier, but PEP 440 reads `-post1` as the post
//! release separator, so maturin turns the Cargo version `0.3.12-post1` into the wheel version
//! `0.3.12.post1`. No crate of this workspace is published to crates.io, so the semver ordering
//! of `-post1` (before `0.3.12`) never matters.

use std::fmt;

use anyhow::{bail, format_err};

/// A PEP 440 version of the release subset: `MAJOR.MINOR.PATCH[.postN]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub release: [u64; 3],
    pub post: Option<u64>,
}

impl Version {
    /// Parses a PEP 440 version leniently (case, separators `.`/`-`/`_`, `post`/`rev`/`r`, the
    /// implicit `-N` post release, leading zeros) and refuses what is not a release.
    pub fn parse_pep440(s: &str) -> anyhow::Result<Version> {
        let lower = s.trim().to_ascii_lowercase();
        let mut rest = lower.as_str();
        if rest.contains('!') {
            bail!("`{s}` has an epoch: release versions have none");
        }
        if rest.contains('+') {
            bail!("`{s}` has a local version label (`+…`): PyPI refuses local versions");
        }
        let mut release = Vec::new();
        loop {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                bail!("`{s}` is not a PEP 440 version: expected a number at `{rest}`");
            }
            release.push(parse_number(&rest[..digits], s)?);
            rest = &rest[digits..];
            match rest.strip_prefix('.') {
                Some(r) if r.starts_with(|c: char| c.is_ascii_digit()) => rest = r,
                _ => break,
            }
        }
        let release: [u64; 3] = release.try_into().map_err(|r: Vec<u64>| {
            format_err!(
                "`{s}` has {} release components: releases are MAJOR.MINOR.PATCH",
                r.len()
            )
        })?;
        let post =
            if rest.is_empty() {
                None
            } else {
                Some(parse_post(rest).ok_or_else(|| {
                let what = if ["a", "b", "c", "rc", "alpha", "beta", "pre", "preview", "dev"]
                    .iter()
                    .any(|p| rest.trim_start_matches(['.', '-', '_']).starts_with(p))
                {
                    "a pre-release or dev release: release tags name final or post releases"
                } else {
                    "not a PEP 440 release: expected MAJOR.MINOR.PATCH or MAJOR.MINOR.PATCH.postN"
                };
                format_err!("`{s}` is {what}")
            })?)
            };
        Ok(Version { release, post })
    }

    /// Parses a Cargo (semver) version under the mapping of this module.
    pub fn parse_cargo(s: &str) -> anyhow::Result<Version> {
        let (core, pre) = match s.split_once('-') {
            Some((core, pre)) => (core, Some(pre)),
            None => (s, None),
        };
        if core.contains('+') || pre.is_some_and(|p| p.contains('+')) {
            bail!("Cargo version `{s}` has build metadata (`+…`); release versions have none");
        }
        let parts: Vec<&str> = core.split('.').collect();
        let [a, b, c] = parts[..] else {
            bail!("Cargo version `{s}` is not MAJOR.MINOR.PATCH");
        };
        let release = [
            parse_number(a, s)?,
            parse_number(b, s)?,
            parse_number(c, s)?,
        ];
        let post = match pre {
            None => None,
            Some(p) => match p.strip_prefix("post").map(|n| parse_number(n, s)) {
                Some(Ok(n)) => Some(n),
                _ => bail!(
                    "Cargo version `{s}` has the pre-release part `-{p}`: only `-postN` \
                     (the PEP 440 post release .postN) is used here"
                ),
            },
        };
        Ok(Version { release, post })
    }

    /// The Cargo version that maps to this PEP 440 version.
    pub fn cargo(&self) -> String {
        let [a, b, c] = self.release;
        match self.post {
            None => format!("{a}.{b}.{c}"),
            Some(n) => format!("{a}.{b}.{c}-post{n}"),
        }
    }
}

/// The normal PEP 440 form: `0.3.12`, `0.3.12.post1`.
impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c] = self.release;
        write!(f, "{a}.{b}.{c}")?;
        if let Some(n) = self.post {
            write!(f, ".post{n}")?;
        }
        Ok(())
    }
}

fn parse_number(digits: &str, whole: &str) -> anyhow::Result<u64> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        bail!("`{whole}`: `{digits}` is not a number");
    }
    digits
        .parse()
        .map_err(|_| format_err!("`{whole}`: `{digits}` is too large"))
}

/// The post-release suffix of PEP 440: `[.-_]?(post|rev|r)[.-_]?N?` or `-N`.
fn parse_post(s: &str) -> Option<u64> {
    if let Some(n) = s.strip_prefix('-') {
        if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
            return n.parse().ok();
        }
    }
    let s = s.strip_prefix(['.', '-', '_']).unwrap_or(s);
    let s = ["post", "rev", "r"]
        .iter()
        .find_map(|p| s.strip_prefix(p))?;
    let s = s.strip_prefix(['.', '-', '_']).unwrap_or(s);
    if s.is_empty() {
        return Some(0);
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A validated release tag: `v` + a PEP 440 release in normal form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseTag {
    pub name: String,
    pub version: Version,
}

impl ReleaseTag {
    pub fn parse(tag: &str) -> anyhow::Result<ReleaseTag> {
        const FORM: &str = "release tags are `v<major>.<minor>.<patch>` or \
                            `v<major>.<minor>.<patch>.post<N>`, e.g. `v0.3.12` or `v0.3.12.post1`";
        let Some(rest) = tag.strip_prefix('v') else {
            bail!("`{tag}` is not a release tag: {FORM}");
        };
        let version = Version::parse_pep440(rest)
            .map_err(|e| format_err!("`{tag}` is not a release tag: {e}; {FORM}"))?;
        let normal = format!("v{version}");
        if normal != tag {
            bail!(
                "`{tag}` is PEP 440 version {version} but is not written in normal form: \
                 tag the release `{normal}` instead"
            );
        }
        Ok(ReleaseTag {
            name: tag.to_owned(),
            version,
        })
    }

    pub fn is_post_release(&self) -> bool {
        self.version.post.is_some()
    }
}

impl fmt::Display for ReleaseTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// The distribution name as wheel and sdist file names spell it (PEP 427 / PEP 625):
/// lower case, runs of `-_.` become `_`.
pub fn dist_file_stem(name: &str) -> String {
    normalize_name(name).replace('-', "_")
}

/// PEP 503 normalised project name: lower case, runs of `-_.` become `-`.
pub fn normalize_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
            continue;
        }
        if sep && !out.is_empty() {
            out.push('-');
        }
        sep = false;
        out.push(c.to_ascii_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_in_normal_form_parse() {
        let t = ReleaseTag::parse("v0.3.12.post1").unwrap();
        assert_eq!(t.version.to_string(), "0.3.12.post1");
        assert_eq!(t.version.cargo(), "0.3.12-post1");
        assert!(t.is_post_release());
        let t = ReleaseTag::parse("v0.1.0").unwrap();
        assert_eq!(t.version.to_string(), "0.1.0");
        assert_eq!(t.version.cargo(), "0.1.0");
    }

    #[test]
    fn tags_not_in_normal_form_name_the_normal_tag() {
        for (tag, normal) in [
            ("v0.3.12-post1", "v0.3.12.post1"),
            ("v0.3.12.POST1", "v0.3.12.post1"),
            ("v0.3.12post1", "v0.3.12.post1"),
            ("v0.3.12-1", "v0.3.12.post1"),
            ("v0.3.12.rev2", "v0.3.12.post2"),
            ("v0.03.12", "v0.3.12"),
            ("v0.3.12.post", "v0.3.12.post0"),
        ] {
            let err = ReleaseTag::parse(tag).unwrap_err().to_string();
            assert!(
                err.contains(&format!("tag the release `{normal}`")),
                "{tag}: {err}"
            );
        }
    }

    #[test]
    fn malformed_tags_are_refused_with_the_expected_form() {
        for tag in [
            "0.3.12",
            "v0.3",
            "v0.3.12.4",
            "vx",
            "v0.3.12rc1",
            "v0.3.12.dev1",
            "v1!0.1.0",
            "v0.1.0+local",
            "release-0.1",
            "v0.3.12-rc1",
            "",
        ] {
            let err = ReleaseTag::parse(tag).unwrap_err().to_string();
            assert!(
                err.contains("e.g. `v0.3.12`") || err.contains("is not a release tag"),
                "{tag}: {err}"
            );
        }
        let err = ReleaseTag::parse("v0.3.12rc1").unwrap_err().to_string();
        assert!(err.contains("pre-release"), "{err}");
    }

    #[test]
    fn cargo_versions_map_both_ways() {
        for (cargo, pep) in [("0.1.0", "0.1.0"), ("0.3.12-post1", "0.3.12.post1")] {
            let v = Version::parse_cargo(cargo).unwrap();
            assert_eq!(v.to_string(), pep);
            assert_eq!(v.cargo(), cargo);
            assert_eq!(Version::parse_pep440(pep).unwrap(), v);
        }
        assert!(Version::parse_cargo("0.1.0-alpha.1")
            .unwrap_err()
            .to_string()
            .contains("-alpha.1"));
        assert!(Version::parse_cargo("0.1").is_err());
        assert!(Version::parse_cargo("0.1.0+meta").is_err());
    }

    #[test]
    fn names_normalise() {
        assert_eq!(
            normalize_name("Mooncake_Transfer.Engine--MUSA"),
            "mooncake-transfer-engine-musa"
        );
        assert_eq!(
            dist_file_stem("mooncake-transfer-engine-musa"),
            "mooncake_transfer_engine_musa"
        );
    }
}
