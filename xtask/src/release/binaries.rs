//! Phase `binaries`: the standalone binaries (`mooncake-doctor`, `transfer_engine_bench`,
//! `mooncake_master`), built and described by cargo-dist, published by us.
//!
//! cargo-dist (`dist`, from the hash-locked build tools) reads `[workspace.metadata.dist]`
//! and makes, per crate that sets `dist = true`, a `<crate>-<target>.tar.xz` with its
//! `.sha256` and a shell installer that downloads the archive from the GitHub release and
//! checks its SHA256. It runs in two steps, as its own CI does on several machines:
//!
//! 1. `dist build --artifacts=local`: the binaries (profile `dist`, in the release build's
//!    environment: remapped paths, the tag's commit time) and their archives.
//! 2. The archives are packed again with the same members and modes but every mtime at
//!    `SOURCE_DATE_EPOCH`, owner 0 and names sorted (cargo-dist stamps the time it copied
//!    the files, so no two builds would match), their `.sha256` rewritten, and the local
//!    step's manifest, with those checksums, left where the next step reads it.
//! 3. `dist build --artifacts=global`: the installers, each embedding its archive's checksum.
//!
//! Then every executable is checked: no vendor runtime linked (`DT_NEEDED`), no glibc symbol
//! newer than the baseline's, `--help` runs. The files join the release directory; our
//! `sha256.sum` and manifest cover them, and publishing uploads them with the wheel.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, format_err, Context};
use serde::Serialize;
use xshell::{cmd, Shell};

use crate::release::audit::{elf_needed, is_vendor_library};
use crate::release::build::{move_into, reproducible_env, target_dir};
use crate::release::{file_name, TARGET_TRIPLE};
use crate::source::Source;
use crate::version::ReleaseTag;
use crate::Workspace;

/// cargo-dist's artifact kinds, as its manifest names them.
pub const ARCHIVE_KIND: &str = "executable-zip";
pub const CHECKSUM_KIND: &str = "checksum";
pub const INSTALLER_KIND: &str = "installer";

/// Where `dist build --artifacts=global` looks for the local step's manifest: a file in
/// cargo-dist's output directory whose name ends in `dist-manifest.json`.
const LOCAL_MANIFEST: &str = "local-dist-manifest.json";

#[derive(Debug, Clone, Serialize)]
pub struct Binaries {
    /// `dist --version`.
    pub dist_version: String,
    /// The tag cargo-dist was given (`v` + the Cargo version).
    pub dist_tag: String,
    pub apps: Vec<BinaryApp>,
    /// Why there are no installers, when there are none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub installers_skipped: Option<String>,
    /// How the archives were made reproducible.
    pub archives: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct BinaryApp {
    /// The crate's name (cargo-dist's app).
    pub app_name: String,
    pub app_version: String,
    // File names only in the manifest: it holds no path of this host.
    #[serde(serialize_with = "name_only")]
    pub archive: PathBuf,
    #[serde(serialize_with = "name_only")]
    pub checksum: PathBuf,
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "maybe_name_only"
    )]
    pub installer: Option<PathBuf>,
    pub executables: Vec<Executable>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Executable {
    pub name: String,
    pub needed: Vec<String>,
    /// The newest `GLIBC_x.y` symbol version it needs.
    pub glibc: Option<String>,
}

fn name_only<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&file_name(p))
}

fn maybe_name_only<S: serde::Serializer>(p: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
    match p {
        Some(p) => s.serialize_str(&file_name(p)),
        None => s.serialize_none(),
    }
}

impl Binaries {
    pub fn summary(&self) -> String {
        let names: Vec<String> = self
            .apps
            .iter()
            .flat_map(|a| a.executables.iter().map(|e| e.name.clone()))
            .collect();
        let installers = match &self.installers_skipped {
            None => format!("{} installers", self.apps.len()),
            Some(why) => format!("no installers ({why})"),
        };
        format!(
            "{} archives ({}), {installers}; no vendor runtime linked",
            self.apps.len(),
            names.join(", ")
        )
    }
}

pub fn build(
    sh: &Shell,
    ws: &Workspace,
    source: &Source,
    tools_venv: &Path,
    dist_dir: &Path,
) -> anyhow::Result<Binaries> {
    let dist = tools_venv.join("bin").join("dist");
    let dist_version = cmd!(sh, "{dist} --version")
        .quiet()
        .read()
        .with_context(|| format!("cannot run cargo-dist ({})", dist.display()))?;
    let dist_tag = dist_tag(&ReleaseTag::parse(&source.tag)?);
    let out = target_dir(ws).join("distrib");
    if out.exists() {
        fs::remove_dir_all(&out)?;
    }
    let (_env, _) = reproducible_env(sh, ws, source)?;
    let _dir = sh.push_dir(&ws.root);
    // cargo-dist runs `cargo build` without `--locked`: the lock file must come out as it went in.
    let lock = ws.root.join("Cargo.lock");
    let locked = fs::read(&lock).context("cannot read Cargo.lock")?;

    let local = cmd!(
        sh,
        "{dist} build --artifacts=local --target {TARGET_TRIPLE} --tag {dist_tag} --output-format=json"
    )
    .read()
    .context("cargo-dist could not build the standalone binaries (dist build --artifacts=local)")?;
    if fs::read(&lock)? != locked {
        fs::write(&lock, &locked)?;
        bail!("cargo-dist's build changed Cargo.lock (restored): run `cargo update --workspace --offline`, commit Cargo.lock, and tag again");
    }
    let mut manifest: serde_json::Value = serde_json::from_str(&local)
        .context("cargo-dist printed no manifest (dist build --output-format=json)")?;
    let archives = archives(&manifest)?;
    if archives.is_empty() {
        bail!("cargo-dist built no archive: set `[package.metadata.dist] dist = true` in the crates whose binaries the release ships");
    }
    let scratch = ws.scratch_dir().join("binaries");
    if scratch.exists() {
        fs::remove_dir_all(&scratch)?;
    }
    fs::create_dir_all(&scratch)?;
    let mut shas = Vec::new();
    for a in &archives {
        let path = out.join(&a.name);
        let sha = normalise_archive(sh, &path, &scratch, source.commit_time)?;
        fs::write(out.join(&a.checksum), format!("{sha} *{}\n", a.name))?;
        manifest["artifacts"][&a.name]["checksums"]["sha256"] = sha.clone().into();
        shas.push(sha);
    }
    fs::write(
        out.join(LOCAL_MANIFEST),
        serde_json::to_vec_pretty(&manifest)?,
    )?;

    let installers_skipped = no_installers(&dist_tag, &source.tag);
    if installers_skipped.is_none() {
        cmd!(
            sh,
            "{dist} build --artifacts=global --target {TARGET_TRIPLE} --tag {dist_tag} --output-format=json"
        )
        .ignore_stdout()
        .run()
        .context("cargo-dist could not write the installers (dist build --artifacts=global)")?;
    }

    let (owner, repo) = ws.config.github_owner_repo();
    let download = format!(
        "https://github.com/{owner}/{repo}/releases/download/{}",
        source.tag
    );
    let mut apps = Vec::new();
    for (a, sha) in archives.into_iter().zip(shas) {
        let executables = check_archive(
            sh,
            &out.join(&a.name),
            &a,
            &scratch,
            &ws.config.baseline.glibc,
        )?;
        let installer = match installers_skipped {
            Some(_) => None,
            None => {
                let path = out.join(format!("{}-installer.sh", a.app_name));
                check_installer(&path, &a.name, &sha, &download)?;
                Some(move_into(&path, dist_dir)?)
            }
        };
        apps.push(BinaryApp {
            app_name: a.app_name.clone(),
            app_version: a.app_version.clone(),
            archive: move_into(&out.join(&a.name), dist_dir)?,
            checksum: move_into(&out.join(&a.checksum), dist_dir)?,
            installer,
            executables,
        });
    }
    Ok(Binaries {
        dist_version,
        dist_tag,
        apps,
        installers_skipped,
        archives: "packed again by GNU tar: members and modes as cargo-dist's, mtime \
                   SOURCE_DATE_EPOCH, owner 0, names sorted; xz -6, one thread"
            .to_owned(),
    })
}

/// The tag cargo-dist is given: `v` and the Cargo version (semver).
pub fn dist_tag(tag: &ReleaseTag) -> String {
    format!("v{}", tag.version.cargo())
}

/// Why a release gets no installers, if it gets none: an installer downloads from the
/// release cargo-dist was told of, and a post release's tag (`v0.3.12.post1`) is no semver,
/// so cargo-dist would point it at `v0.3.12-post1`, a release that does not exist.
pub fn no_installers(dist_tag: &str, tag: &str) -> Option<String> {
    (dist_tag != tag).then(|| {
        format!("cargo-dist names releases by semver ({dist_tag}), the GitHub release is {tag}")
    })
}

/// One archive of the local step's manifest.
#[derive(Debug, Clone, PartialEq)]
struct Archive {
    name: String,
    checksum: String,
    app_name: String,
    app_version: String,
    executables: Vec<String>,
}

/// The archives cargo-dist's manifest lists for [`TARGET_TRIPLE`], with their releases.
fn archives(manifest: &serde_json::Value) -> anyhow::Result<Vec<Archive>> {
    let mut out = Vec::new();
    let releases = manifest["releases"].as_array().cloned().unwrap_or_default();
    for release in releases {
        let names = release["artifacts"].as_array().cloned().unwrap_or_default();
        for name in names.iter().filter_map(|n| n.as_str()) {
            let artifact = &manifest["artifacts"][name];
            let for_target = artifact["target_triples"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t == TARGET_TRIPLE));
            if artifact["kind"] != ARCHIVE_KIND || !for_target {
                continue;
            }
            let field = |v: &serde_json::Value, what: &str| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| format_err!("cargo-dist's manifest gives {name} no {what}"))
            };
            let executables = artifact["assets"]
                .as_array()
                .map(|assets| {
                    assets
                        .iter()
                        .filter(|a| a["kind"] == "executable")
                        .filter_map(|a| a["name"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            out.push(Archive {
                name: name.to_owned(),
                checksum: field(&artifact["checksum"], "checksum file")?,
                app_name: field(&release["app_name"], "app name")?,
                app_version: field(&release["app_version"], "app version")?,
                executables,
            });
        }
    }
    Ok(out)
}

/// Packs `archive` again from its own members (see the module doc); returns its SHA256.
/// The member list and modes must come out as they went in.
fn normalise_archive(
    sh: &Shell,
    archive: &Path,
    scratch: &Path,
    epoch: i64,
) -> anyhow::Result<String> {
    let name = file_name(archive);
    let unpacked = scratch.join(format!("{name}.d"));
    fs::create_dir_all(&unpacked)?;
    let before = members(sh, archive)?;
    cmd!(sh, "tar -xJf {archive} -C {unpacked}").quiet().run()?;
    let tar = scratch.join(format!("{name}.tar"));
    let roots: Vec<String> = fs::read_dir(&unpacked)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    let mtime = format!("--mtime=@{epoch}");
    cmd!(sh, "tar --sort=name {mtime} --owner=0 --group=0 --numeric-owner --format=gnu -C {unpacked} -cf {tar} {roots...}")
        .quiet()
        .run()
        .context("cannot pack the archive again (GNU tar with --sort=name)")?;
    let xz = cmd!(sh, "xz -6 -T1 -c {tar}")
        .quiet()
        .output()
        .context("cannot compress the archive (xz)")?;
    fs::write(archive, xz.stdout)?;
    let after = members(sh, archive)?;
    if before != after {
        bail!("{name} packed again differs from cargo-dist's:\n  before {before:?}\n  after  {after:?}");
    }
    Ok(crate::checksums::sha256_file(archive)?.0)
}

/// `(mode, size, path)` of each member, sorted.
fn members(sh: &Shell, archive: &Path) -> anyhow::Result<Vec<(String, String, String)>> {
    let listing = cmd!(sh, "tar -tvJf {archive}").quiet().read()?;
    let mut out: Vec<_> = listing
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((
                f.first()?.to_string(),
                f.get(2)?.to_string(),
                f.last()?.to_string(),
            ))
        })
        .collect();
    out.sort_by(|a, b| a.2.cmp(&b.2));
    Ok(out)
}

/// Unpacks the archive and checks each executable cargo-dist says it holds.
fn check_archive(
    sh: &Shell,
    archive: &Path,
    a: &Archive,
    scratch: &Path,
    glibc: &str,
) -> anyhow::Result<Vec<Executable>> {
    let dir = scratch.join(format!("{}.check", a.name));
    fs::create_dir_all(&dir)?;
    cmd!(sh, "tar -xJf {archive} -C {dir}").quiet().run()?;
    let root = dir.join(a.name.trim_end_matches(".tar.xz"));
    if a.executables.is_empty() {
        bail!("{} holds no executable", a.name);
    }
    let mut out = Vec::new();
    for name in &a.executables {
        let path = root.join(name);
        let bytes = fs::read(&path).with_context(|| format!("{} has no {name}", a.name))?;
        let needed = elf_needed(&bytes).with_context(|| format!("{name} in {}", a.name))?;
        if let Some(bad) = needed.iter().find(|n| is_vendor_library(n)) {
            bail!(
                "{name} links {bad} (DT_NEEDED): it would not start without the vendor runtime. \
                 Load it at run time (libloading) instead of linking it."
            );
        }
        let newest = newest_glibc(&bytes)?;
        if let Some(v) = &newest {
            if version_key(v) > version_key(glibc) {
                bail!("{name} needs glibc {v}, newer than the baseline's {glibc}: build on the baseline host (release.toml)");
            }
        }
        let help = cmd!(sh, "{path} --help")
            .quiet()
            .ignore_stdout()
            .ignore_stderr()
            .output()
            .with_context(|| format!("cannot run {name} --help"))?;
        if !help.status.success() {
            bail!("{name} --help exited with {}", help.status);
        }
        out.push(Executable {
            name: name.clone(),
            needed,
            glibc: newest,
        });
    }
    Ok(out)
}

/// The newest `GLIBC_x.y` version an ELF file requires (`.gnu.version_r`).
pub fn newest_glibc(bytes: &[u8]) -> anyhow::Result<Option<String>> {
    let elf =
        goblin::elf::Elf::parse(bytes).map_err(|e| format_err!("not a readable ELF file: {e}"))?;
    let mut newest: Option<String> = None;
    if let Some(verneed) = &elf.verneed {
        for need in verneed.iter() {
            for aux in need.iter() {
                let Some(v) = elf
                    .dynstrtab
                    .get_at(aux.vna_name)
                    .and_then(|n| n.strip_prefix("GLIBC_"))
                else {
                    continue;
                };
                if v.starts_with(|c: char| c.is_ascii_digit())
                    && newest
                        .as_deref()
                        .is_none_or(|n| version_key(v) > version_key(n))
                {
                    newest = Some(v.to_owned());
                }
            }
        }
    }
    Ok(newest)
}

fn version_key(v: &str) -> Vec<u64> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

/// The installer downloads our archive from our release and checks the archive's SHA256.
fn check_installer(path: &Path, archive: &str, sha: &str, download: &str) -> anyhow::Result<()> {
    let text = fs::read_to_string(path)
        .with_context(|| format!("cargo-dist wrote no installer {}", path.display()))?;
    for (what, want) in [
        ("the archive", format!("\"{archive}\")")),
        ("the archive's SHA256", format!("_checksum_value=\"{sha}\"")),
        ("the release's download URL", format!("\"{download}\"")),
    ] {
        if !text.contains(&want) {
            bail!("{} does not name {what} ({want})", file_name(path));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archives_come_from_the_manifest_releases_for_the_target() {
        let m = serde_json::json!({
            "releases": [{"app_name": "doc", "app_version": "0.1.0",
                          "artifacts": ["doc-x86_64-unknown-linux-gnu.tar.xz", "doc-installer.sh",
                                        "doc-aarch64-unknown-linux-gnu.tar.xz"]}],
            "artifacts": {
                "doc-x86_64-unknown-linux-gnu.tar.xz": {
                    "kind": "executable-zip", "target_triples": ["x86_64-unknown-linux-gnu"],
                    "checksum": "doc-x86_64-unknown-linux-gnu.tar.xz.sha256",
                    "assets": [{"kind": "readme", "name": "README.md"},
                               {"kind": "executable", "name": "mooncake-doctor"}]},
                "doc-aarch64-unknown-linux-gnu.tar.xz": {
                    "kind": "executable-zip", "target_triples": ["aarch64-unknown-linux-gnu"],
                    "checksum": "x.sha256"},
                "doc-installer.sh": {"kind": "installer"}
            }
        });
        let a = archives(&m).unwrap();
        assert_eq!(
            a,
            vec![Archive {
                name: "doc-x86_64-unknown-linux-gnu.tar.xz".into(),
                checksum: "doc-x86_64-unknown-linux-gnu.tar.xz.sha256".into(),
                app_name: "doc".into(),
                app_version: "0.1.0".into(),
                executables: vec!["mooncake-doctor".into()],
            }]
        );
        let mut no_checksum = m.clone();
        no_checksum["artifacts"]["doc-x86_64-unknown-linux-gnu.tar.xz"]["checksum"] =
            serde_json::Value::Null;
        assert!(archives(&no_checksum)
            .unwrap_err()
            .to_string()
            .contains("no checksum file"));
    }

    #[test]
    fn a_post_release_gets_no_installers_and_says_why() {
        assert_eq!(no_installers("v0.3.12", "v0.3.12"), None);
        let why = no_installers("v0.3.12-post1", "v0.3.12.post1").unwrap();
        assert!(
            why.contains("v0.3.12-post1") && why.contains("v0.3.12.post1"),
            "{why}"
        );
    }

    #[test]
    fn the_newest_glibc_version_is_read_from_a_real_binary() {
        let exe = std::env::current_exe().unwrap();
        let v = newest_glibc(&fs::read(exe).unwrap()).unwrap().unwrap();
        assert!(version_key(&v) >= version_key("2.2.5"), "{v}");
        assert!(version_key("2.35") > version_key("2.4"));
        assert!(newest_glibc(b"#!/bin/sh").is_err());
    }

    #[test]
    fn an_installer_must_name_the_archive_its_checksum_and_our_release() {
        let dir = crate::checksums::tests::temp_dir("installer");
        let path = dir.join("doc-installer.sh");
        let url = "https://github.com/o/r/releases/download/v1.0.0";
        let good = format!(
            "case \"$x\" in\n \"doc.tar.xz\")\n _checksum_value=\"ab12\"\nARTIFACT_DOWNLOAD_URLS=\"{url}\"\n"
        );
        fs::write(&path, &good).unwrap();
        check_installer(&path, "doc.tar.xz", "ab12", url).unwrap();
        let e = check_installer(&path, "doc.tar.xz", "cd34", url).unwrap_err();
        assert!(e.to_string().contains("SHA256"), "{e}");
        let e = check_installer(
            &path,
            "doc.tar.xz",
            "ab12",
            "https://github.com/o/r/releases/download/v1.0.0.post1",
        )
        .unwrap_err();
        assert!(e.to_string().contains("download URL"), "{e}");
        fs::remove_dir_all(dir).unwrap();
    }
}
