//! The source a release is built from (phase `verify source`): a release tag whose commit is
//! `HEAD`, a clean tree, and the crates' and the wheel's versions equal to the tag's. Shared by
//! `release`, `plan` and `images`.

use std::path::{Path, PathBuf};

use anyhow::{bail, format_err, Context};
use serde::{Deserialize, Serialize};
use xshell::{cmd, Shell};

use crate::version::{normalize_name, ReleaseTag, Version};
use crate::{Workspace, LEDGER};

/// The source a release is built from, proven to be the tag's commit.
#[derive(Debug, Clone, Serialize)]
pub struct Source {
    pub tag: String,
    pub version: String,
    pub commit: String,
    /// Committer time of the tag's commit: the build's `SOURCE_DATE_EPOCH`.
    pub commit_time: i64,
}

/// Checks, in this order, and stops at the first failure: the tag is a release tag; it exists;
/// its commit is `HEAD`; the tree is clean; the crates' and the wheel's versions are the tag's.
pub fn source(sh: &Shell, ws: &Workspace, tag: &str) -> anyhow::Result<Source> {
    let tag = ReleaseTag::parse(tag)?;
    let commit = tag_commit(sh, &tag)?;
    let head_commit = "HEAD^{commit}";
    let head = cmd!(sh, "git rev-parse --verify {head_commit}")
        .quiet()
        .read()
        .context("cannot read HEAD: is this a git checkout with at least one commit?")?;
    if commit != head {
        bail!(
            "tag {tag} is commit {commit} but HEAD is {head}: the release is built from the tag's \
             commit only. Check it out (`git checkout {tag}`) or build from a fresh clone of the tag."
        );
    }
    clean_tree(sh)?;
    versions(sh, ws, &tag)?;
    let commit_time = cmd!(sh, "git log -1 --format=%ct {commit}")
        .quiet()
        .read()?;
    let commit_time = commit_time
        .trim()
        .parse()
        .context("cannot read the commit time")?;
    Ok(Source {
        tag: tag.name.clone(),
        version: tag.version.to_string(),
        commit,
        commit_time,
    })
}

/// The commit a tag names, through an annotated tag object if there is one.
pub fn tag_commit(sh: &Shell, tag: &ReleaseTag) -> anyhow::Result<String> {
    let refname = format!("refs/tags/{tag}");
    if cmd!(sh, "git check-ref-format {refname}")
        .quiet()
        .ignore_stderr()
        .run()
        .is_err()
    {
        bail!("`{tag}` is not a valid git tag name (git check-ref-format refs/tags/{tag})");
    }
    let peeled = format!("{refname}^{{commit}}");
    cmd!(sh, "git rev-parse --verify --quiet {peeled}")
        .quiet()
        .ignore_stderr()
        .read()
        .map_err(|_| {
            format_err!(
                "tag {tag} does not exist in this clone: create it on the release commit \
             (`git tag -a {tag} -m {tag}`) or fetch it (`git fetch --tags`)"
            )
        })
}

fn clean_tree(sh: &Shell) -> anyhow::Result<()> {
    let status = cmd!(sh, "git status --porcelain=v1 --untracked-files=all")
        .quiet()
        .read()?;
    // The ledger is the one file a release writes into the checkout; it is in no artifact, so
    // a re-run in the same checkout may find it changed.
    let lines: Vec<&str> = status
        .lines()
        .filter(|l| l.get(3..) != Some(LEDGER))
        .collect();
    if lines.is_empty() {
        return Ok(());
    }
    let mut shown = lines
        .iter()
        .take(10)
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n");
    if lines.len() > 10 {
        shown.push_str(&format!("\n    … and {} more", lines.len() - 10));
    }
    bail!(
        "the working tree is not clean ({} changed or untracked paths):\n{shown}\n\
         A release builds exactly the tagged commit: commit or stash them (`git stash -u`), or \
         build from a fresh clone.",
        lines.len()
    )
}

#[derive(Deserialize)]
struct Metadata {
    packages: Vec<Package>,
}

#[derive(Deserialize)]
struct Package {
    name: String,
    version: String,
    manifest_path: PathBuf,
}

/// Every crate's version and the wheel's version equal the tag's (see `version.rs` for the
/// Cargo <-> PEP 440 mapping), and the wheel is the configured distribution.
fn versions(sh: &Shell, ws: &Workspace, tag: &ReleaseTag) -> anyhow::Result<()> {
    let want_cargo = tag.version.cargo();
    let fix = format!(
        "set `version = \"{want_cargo}\"` under [workspace.package] in Cargo.toml, commit, and tag \
         that commit (a tag that was pushed is never moved: cut the next .postN tag instead)"
    );
    let json = cmd!(sh, "cargo metadata --no-deps --offline --format-version 1")
        .quiet()
        .read()
        .context("cannot read the workspace with `cargo metadata`")?;
    let meta: Metadata = serde_json::from_str(&json).context("cannot parse `cargo metadata`")?;
    let wrong: Vec<String> = meta
        .packages
        .iter()
        .filter(|p| p.version != want_cargo)
        .map(|p| format!("{} {}", p.name, p.version))
        .collect();
    if !wrong.is_empty() {
        bail!(
            "tag {tag} is version {} (Cargo version {want_cargo}), but the crates say otherwise: {}. \
             To release this source, {fix}.",
            tag.version,
            wrong.join(", ")
        );
    }

    let project = ws.wheel_project_dir();
    let pyproject = wheel_pyproject(&project)?;
    if normalize_name(&pyproject.name) != normalize_name(&ws.config.distribution) {
        bail!(
            "{} names the distribution `{}` but release.toml says `{}`: make them the same",
            project.join("pyproject.toml").display(),
            pyproject.name,
            ws.config.distribution
        );
    }
    let wheel_version = match pyproject.version {
        Some(v) => Version::parse_pep440(&v).with_context(|| {
            format!("[project] version in {}/pyproject.toml", project.display())
        })?,
        None => {
            let manifest = project.join(pyproject.manifest_path.as_deref().unwrap_or("Cargo.toml"));
            let manifest = manifest.canonicalize().unwrap_or(manifest);
            let package = meta
                .packages
                .iter()
                .find(|p| p.manifest_path.canonicalize().ok().as_deref() == Some(&manifest))
                .ok_or_else(|| {
                    format_err!(
                        "the wheel's crate {} is not a workspace member",
                        manifest.display()
                    )
                })?;
            Version::parse_cargo(&package.version)?
        }
    };
    if wheel_version != tag.version {
        bail!(
            "tag {tag} is version {} but the wheel would be {wheel_version}: {fix}",
            tag.version
        );
    }
    Ok(())
}

pub struct WheelProject {
    pub name: String,
    /// `[project] version` when static; `None` when maturin takes it from the crate.
    pub version: Option<String>,
    pub manifest_path: Option<String>,
    /// `[tool.maturin.sbom] rust` and `auditwheel`, as written (maturin defaults to true).
    pub sbom_rust: Option<bool>,
    pub sbom_auditwheel: Option<bool>,
    /// `[tool.maturin] features`: the crate's features in the wheel.
    pub features: Vec<String>,
}

pub fn wheel_pyproject(project: &Path) -> anyhow::Result<WheelProject> {
    let path = project.join("pyproject.toml");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let doc: toml::Table = toml::from_str(&text).with_context(|| format!("{}", path.display()))?;
    let get = |keys: &[&str]| -> Option<toml::Value> {
        let mut v = doc.get(keys[0])?;
        for k in &keys[1..] {
            v = v.get(k)?;
        }
        Some(v.clone())
    };
    let name = get(&["project", "name"])
        .and_then(|v| v.as_str().map(str::to_owned))
        .ok_or_else(|| format_err!("{} has no [project] name", path.display()))?;
    let version = get(&["project", "version"]).and_then(|v| v.as_str().map(str::to_owned));
    let dynamic = get(&["project", "dynamic"])
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .any(|v| v.as_str() == Some("version"));
    if version.is_none() && !dynamic {
        bail!(
            "{} has neither [project] version nor dynamic = [\"version\"]",
            path.display()
        );
    }
    Ok(WheelProject {
        name,
        version,
        manifest_path: get(&["tool", "maturin", "manifest-path"])
            .and_then(|v| v.as_str().map(str::to_owned)),
        sbom_rust: get(&["tool", "maturin", "sbom", "rust"]).and_then(|v| v.as_bool()),
        sbom_auditwheel: get(&["tool", "maturin", "sbom", "auditwheel"]).and_then(|v| v.as_bool()),
        features: get(&["tool", "maturin", "features"])
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
    })
}
