//! Phases `verify source` and `verify baseline`: everything that must hold before a build.

use std::path::{Path, PathBuf};

use anyhow::{bail, format_err, Context};
use serde::{Deserialize, Serialize};
use xshell::{cmd, Shell};

use crate::config::Baseline;
use crate::env;
use crate::release::ledger;
use crate::version::{normalize_name, ReleaseTag, Version};
use crate::Workspace;

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
        .filter(|l| l.get(3..) != Some(ledger::LEDGER))
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
    })
}

// --- baseline ------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BaselineMode {
    /// The host must be the baseline.
    Strict,
    /// The host is recorded, differences are allowed.
    Local,
}

impl BaselineMode {
    pub fn from_flag(strict_baseline: bool) -> BaselineMode {
        let on_actions = env::var(env::GITHUB_ACTIONS).as_deref() == Some("true");
        if strict_baseline || on_actions {
            BaselineMode::Strict
        } else {
            BaselineMode::Local
        }
    }
}

/// What the build host is, as far as the baseline is concerned.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Host {
    pub os_id: Option<String>,
    pub os_version: Option<String>,
    pub glibc: Option<String>,
    pub musa: Option<String>,
    pub python: Option<String>,
    pub torch: Option<String>,
    /// The interpreter that was probed.
    pub python_bin: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BaselineReport {
    pub mode: BaselineMode,
    pub wanted: Baseline,
    pub found: Host,
    /// One line per difference; empty when the host is the baseline.
    pub differences: Vec<String>,
}

impl BaselineReport {
    pub fn outcome(&self) -> String {
        match (self.mode, self.differences.len()) {
            (_, 0) => format!("{:?} mode: host is the baseline", self.mode).to_lowercase(),
            (_, n) => format!(
                "local mode: host differs from the baseline in {n} way{} (recorded): {}",
                if n == 1 { "" } else { "s" },
                self.differences.join("; ")
            ),
        }
    }
}

/// Probes the host (files under `$XTASK_HOST_ROOT`, default `/`; the interpreter
/// `$XTASK_BASELINE_PYTHON`, else `python<baseline.python>`, else `python3`) and compares.
/// Strict mode fails on any difference.
pub fn baseline(
    sh: &Shell,
    wanted: &Baseline,
    mode: BaselineMode,
) -> anyhow::Result<BaselineReport> {
    let root = PathBuf::from(env::var(env::XTASK_HOST_ROOT).unwrap_or_else(|| "/".to_owned()));
    let mut found = Host::default();
    if let Ok(text) = std::fs::read_to_string(root.join("etc/os-release")) {
        found.os_id = os_release_field(&text, "ID");
        found.os_version = os_release_field(&text, "VERSION_ID");
    }
    if let Ok(text) = std::fs::read_to_string(root.join(&wanted.musa_version_file)) {
        found.musa = first_version(&text);
    }
    probe_python(sh, wanted, &mut found);

    let differences = compare(wanted, &found);
    let report = BaselineReport {
        mode,
        wanted: wanted.clone(),
        found,
        differences,
    };
    if mode == BaselineMode::Strict && !report.differences.is_empty() {
        bail!(
            "this host is not the release baseline:\n    {}\nBuild inside the builder image \
             ({}) or, for a local build, leave out --strict-baseline (and GITHUB_ACTIONS=true) \
             to record the differences in the manifest instead.",
            report.differences.join("\n    "),
            wanted.builder_image
        );
    }
    Ok(report)
}

const PROBE: &str = r#"
import json, os, platform, sys
try:
    from importlib.metadata import version
    torch = version("torch")
except Exception:
    torch = None
try:
    glibc = os.confstr("CS_GNU_LIBC_VERSION").split()[-1]
except Exception:
    glibc = platform.libc_ver()[1] or None
print(json.dumps({"python": platform.python_version(), "glibc": glibc, "torch": torch}))
"#;

fn probe_python(sh: &Shell, wanted: &Baseline, found: &mut Host) {
    #[derive(Deserialize)]
    struct Probe {
        python: Option<String>,
        glibc: Option<String>,
        torch: Option<String>,
    }
    let candidates = match env::var(env::XTASK_BASELINE_PYTHON) {
        Some(p) => vec![p],
        None => vec![format!("python{}", wanted.python), "python3".to_owned()],
    };
    // The first candidate that runs (a pyenv shim may exist for a version that is not installed).
    for python in candidates.into_iter().filter(|c| find_program(c).is_some()) {
        let out = cmd!(sh, "{python} -c {PROBE}")
            .quiet()
            .ignore_stderr()
            .read();
        if let Some(p) = out
            .ok()
            .and_then(|o| serde_json::from_str::<Probe>(&o).ok())
        {
            found.python = p.python;
            found.glibc = p.glibc;
            found.torch = p.torch;
            found.python_bin = Some(python);
            return;
        }
    }
}

fn compare(wanted: &Baseline, found: &Host) -> Vec<String> {
    let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "nothing".to_owned());
    let mut out = Vec::new();
    if found.os_id.as_deref() != Some(&wanted.os_id)
        || found.os_version.as_deref() != Some(&wanted.os_version)
    {
        out.push(format!(
            "OS: wanted {} {}, found {} {} (etc/os-release)",
            wanted.os_id,
            wanted.os_version,
            show(&found.os_id),
            show(&found.os_version)
        ));
    }
    if found.glibc.as_deref() != Some(&wanted.glibc) {
        out.push(format!(
            "glibc: wanted {}, found {}",
            wanted.glibc,
            show(&found.glibc)
        ));
    }
    if found.musa.as_deref() != Some(&wanted.musa) {
        out.push(format!(
            "MUSA: wanted {}, found {} ({})",
            wanted.musa,
            show(&found.musa),
            wanted.musa_version_file
        ));
    }
    let python_ok = found.python.as_deref().is_some_and(|v| {
        v == wanted.python
            || v.strip_prefix(&wanted.python)
                .is_some_and(|r| r.starts_with('.'))
    });
    if !python_ok {
        let bin = found
            .python_bin
            .as_deref()
            .map(|b| format!(" ({b})"))
            .unwrap_or_default();
        out.push(format!(
            "Python: wanted {}, found {}{bin}",
            wanted.python,
            show(&found.python)
        ));
    }
    let torch = found
        .torch
        .as_deref()
        .map(|t| t.split('+').next().unwrap_or(t));
    if torch != Some(&wanted.torch) {
        out.push(format!(
            "PyTorch: wanted {}, found {}",
            wanted.torch,
            show(&found.torch)
        ));
    }
    out
}

fn os_release_field(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let v = l.strip_prefix(key)?.strip_prefix('=')?;
        Some(v.trim().trim_matches(|c| c == '"' || c == '\'').to_owned())
    })
}

/// The first `N.N[.N…]` (or `vN.N…`) word in a text: version files come as plain text or JSON.
fn first_version(text: &str) -> Option<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.'))
        .map(|w| {
            w.strip_prefix(['v', 'V'])
                .unwrap_or(w)
                .trim_end_matches('.')
        })
        .find(|w| {
            w.contains('.')
                && w.split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_owned)
}

/// `which`: a program name looked up on PATH, or a path that exists.
fn find_program(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Path::new(name).exists().then(|| PathBuf::from(name));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_release_and_version_files_parse() {
        let text = "PRETTY_NAME=\"Ubuntu 22.04.4 LTS\"\nNAME=\"Ubuntu\"\nVERSION_ID=\"22.04\"\nID=ubuntu\nID_LIKE=debian\n";
        assert_eq!(os_release_field(text, "ID").as_deref(), Some("ubuntu"));
        assert_eq!(
            os_release_field(text, "VERSION_ID").as_deref(),
            Some("22.04")
        );
        assert_eq!(
            first_version("MUSA Toolkit 5.2.0-server\n").as_deref(),
            Some("5.2.0")
        );
        assert_eq!(
            first_version("{\"musa_toolkits\": {\"version\": \"5.2.0\"}}").as_deref(),
            Some("5.2.0")
        );
        assert_eq!(first_version("mp31 v5.2.0.").as_deref(), Some("5.2.0"));
        assert_eq!(first_version("none"), None);
    }
}
