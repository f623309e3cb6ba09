//! Phase `audit`: the wheel is what the release says it is.
//!
//! - its platform tag is the baseline's, and PyPI's auditwheel agrees that the contents qualify;
//! - no vendor runtime is bundled (file names) or linked (ELF `DT_NEEDED`): the engine loads
//!   libmusa, libmusart, libibverbs and libcudart at run time, so the wheel imports anywhere;
//! - no SBOM is embedded (it would break reproducibility);
//! - it installs into a clean venv, and a smoke test imports it and moves bytes over TCP
//!   between two engines in two processes.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, format_err, Context};
use serde::Serialize;
use xshell::{cmd, Shell};

use crate::Workspace;

/// Vendor runtimes that must be neither bundled nor linked.
pub const VENDOR_LIBRARIES: &[&str] =
    &["libmusa", "libmusart", "libibverbs", "libcudart", "libmlx5"];

const SMOKE: &str = include_str!("smoke.py");
const LIST_WHEEL: &str = r#"
import json, sys, zipfile
print(json.dumps(zipfile.ZipFile(sys.argv[1]).namelist()))
"#;

#[derive(Debug, Clone, Serialize)]
pub struct AuditReport {
    pub platform_tag: String,
    /// `auditwheel show`'s verdict, when auditwheel is in the build tools.
    pub auditwheel: Option<String>,
    pub shared_objects: Vec<SharedObject>,
    pub smoke: serde_json::Value,
}

#[derive(Debug, Clone, Serialize)]
pub struct SharedObject {
    pub path: String,
    pub needed: Vec<String>,
}

/// `python` makes the clean venv: the interpreter the baseline check found (the baseline's
/// Python when the host has it).
pub fn audit(
    sh: &Shell,
    ws: &Workspace,
    wheel: &Path,
    tools_venv: &Path,
    python: &str,
) -> anyhow::Result<AuditReport> {
    let name = wheel
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let platform_tag = check_platform_tag(name, &ws.config.baseline.wheel_platform)?;
    let files = list_wheel(sh, tools_venv, wheel)?;
    check_contents(&files)?;
    let auditwheel = run_auditwheel(sh, ws, tools_venv, wheel)?;
    let (vpython, site) = install_clean(sh, ws, python, wheel)?;
    let shared_objects = linked_libraries(&files, &site)?;
    let smoke = smoke_test(sh, ws, &vpython)?;
    Ok(AuditReport {
        platform_tag,
        auditwheel,
        shared_objects,
        smoke,
    })
}

/// The wheel's platform tag (last `-` field of the name) is the wanted one.
pub fn check_platform_tag(wheel_name: &str, wanted: &str) -> anyhow::Result<String> {
    let tag = wheel_name
        .strip_suffix(".whl")
        .and_then(|s| s.rsplit('-').next())
        .ok_or_else(|| format_err!("{wheel_name} is not a wheel file name"))?;
    if tag != wanted {
        bail!("{wheel_name} has platform tag {tag}, the release wants {wanted} (release.toml baseline.wheel_platform)");
    }
    Ok(tag.to_owned())
}

/// No bundled vendor runtime, no SBOM.
pub fn check_contents(files: &[String]) -> anyhow::Result<()> {
    for f in files {
        let base = f.rsplit('/').next().unwrap_or(f);
        if is_vendor_library(base) {
            bail!("the wheel bundles {f}: vendor runtimes are loaded from the host at run time, never shipped");
        }
        if f.contains(".dist-info/sboms/") {
            bail!("the wheel embeds an SBOM ({f}), so no two builds are alike: turn maturin's SBOM off");
        }
    }
    Ok(())
}

pub(crate) fn is_vendor_library(name: &str) -> bool {
    VENDOR_LIBRARIES.iter().any(|v| {
        name.strip_prefix(v)
            .is_some_and(|rest| rest.starts_with(".so") || rest.starts_with('-'))
    })
}

/// `auditwheel show` must find the wheel consistent with a tag no newer than the wanted one.
pub fn check_auditwheel(out: &str, wanted: &str) -> anyhow::Result<String> {
    let flat = out.split_whitespace().collect::<Vec<_>>().join(" ");
    let found = flat
        .split('"')
        .find(|s| s.starts_with("manylinux_") || s.starts_with("linux_"))
        .ok_or_else(|| format_err!("cannot read auditwheel's verdict:\n{out}"))?;
    let glibc = |t: &str| -> Option<(u32, u32)> {
        let mut p = t.strip_prefix("manylinux_")?.splitn(3, '_');
        Some((p.next()?.parse().ok()?, p.next()?.parse().ok()?))
    };
    match (glibc(found), glibc(wanted)) {
        (Some(f), Some(w)) if f <= w => Ok(format!("consistent with {found}")),
        _ => bail!("auditwheel says the wheel is only {found}, the release wants {wanted}:\n{out}"),
    }
}

/// The file names inside the wheel.
fn list_wheel(sh: &Shell, tools_venv: &Path, wheel: &Path) -> anyhow::Result<Vec<String>> {
    let tools_python = tools_venv.join("bin").join("python");
    let listing = cmd!(sh, "{tools_python} -c {LIST_WHEEL} {wheel}")
        .quiet()
        .read()?;
    Ok(serde_json::from_str(&listing)?)
}

/// `auditwheel show`'s verdict, checked against the baseline's platform, when the build tools
/// have auditwheel.
fn run_auditwheel(
    sh: &Shell,
    ws: &Workspace,
    tools_venv: &Path,
    wheel: &Path,
) -> anyhow::Result<Option<String>> {
    let auditwheel = tools_venv.join("bin").join("auditwheel");
    if !auditwheel.exists() {
        return Ok(None);
    }
    let out = cmd!(sh, "{auditwheel} show {wheel}")
        .quiet()
        .read()
        .context("auditwheel show failed")?;
    Ok(Some(check_auditwheel(
        &out,
        &ws.config.baseline.wheel_platform,
    )?))
}

/// Installs the wheel alone into a fresh venv; returns its interpreter and site-packages.
fn install_clean(
    sh: &Shell,
    ws: &Workspace,
    python: &str,
    wheel: &Path,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let venv = ws.scratch_dir().join("smoke-venv");
    if venv.exists() {
        fs::remove_dir_all(&venv)?;
    }
    cmd!(sh, "{python} -m venv {venv}")
        .quiet()
        .run()
        .context("cannot create the smoke-test venv")?;
    let vpython = venv.join("bin").join("python");
    cmd!(
        sh,
        "{vpython} -m pip install --quiet --disable-pip-version-check --no-index --no-deps {wheel}"
    )
    .run()
    .context("the wheel does not install into a clean venv")?;
    let site = cmd!(
        sh,
        "{vpython} -c 'import sysconfig; print(sysconfig.get_paths()[\"platlib\"])'"
    )
    .quiet()
    .read()?;
    Ok((vpython, PathBuf::from(site)))
}

/// The `DT_NEEDED` of every installed extension; a vendor runtime among them is an error.
fn linked_libraries(files: &[String], site: &Path) -> anyhow::Result<Vec<SharedObject>> {
    let mut shared_objects = Vec::new();
    for path in installed_shared_objects(files, site) {
        let bytes = fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let needed = elf_needed(&bytes)
            .with_context(|| format!("{} is not a readable ELF", path.display()))?;
        let rel = path
            .strip_prefix(site)
            .unwrap_or(&path)
            .display()
            .to_string();
        if let Some(bad) = needed.iter().find(|n| is_vendor_library(n)) {
            bail!(
                "{rel} links {bad} (DT_NEEDED): the wheel would not import without the vendor \
                 runtime. Load it at run time (libloading) instead of linking it."
            );
        }
        shared_objects.push(SharedObject { path: rel, needed });
    }
    if shared_objects.is_empty() {
        bail!("the wheel holds no extension module (.so)");
    }
    Ok(shared_objects)
}

/// `smoke.py` in the clean venv, from `/`: import, then 1 MiB over TCP between two engines.
fn smoke_test(sh: &Shell, ws: &Workspace, vpython: &Path) -> anyhow::Result<serde_json::Value> {
    let imports = ws.config.wheel.smoke_imports.join(",");
    let _d = sh.push_dir("/");
    let out = cmd!(sh, "{vpython} -I -c {SMOKE} {imports}")
        .env("MC_LOG_LEVEL", "warning")
        .ignore_status()
        .output()
        .context("cannot run the smoke test")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let smoke: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .map_err(|_| {
            let stderr = String::from_utf8_lossy(&out.stderr);
            format_err!("the smoke test printed no result:\n{stdout}{stderr}")
        })?;
    if !out.status.success() || smoke.get("ok") != Some(&serde_json::Value::Bool(true)) {
        bail!("the smoke test failed: the installed wheel does not import or cannot move bytes: {smoke}");
    }
    Ok(smoke)
}

fn installed_shared_objects(files: &[String], site: &Path) -> Vec<PathBuf> {
    files
        .iter()
        .filter(|f| !f.contains(".dist-info/") && !f.contains(".data/"))
        .filter(|f| f.ends_with(".so") || f.contains(".so."))
        .map(|f| site.join(f))
        .collect()
}

/// The `DT_NEEDED` entries of an ELF file (read with goblin).
pub fn elf_needed(b: &[u8]) -> anyhow::Result<Vec<String>> {
    let elf =
        goblin::elf::Elf::parse(b).map_err(|e| format_err!("not a readable ELF file: {e}"))?;
    Ok(elf.libraries.iter().map(|l| (*l).to_owned()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elf_needed_reads_a_real_shared_object() {
        // The test binary itself links libc.
        let exe = std::env::current_exe().unwrap();
        let needed = elf_needed(&fs::read(exe).unwrap()).unwrap();
        assert!(
            needed.iter().any(|n| n.starts_with("libc.so")),
            "{needed:?}"
        );
        assert!(elf_needed(b"\x7fELF\x02\x01").is_err());
        assert!(elf_needed(b"#!/bin/sh").is_err());
    }

    #[test]
    fn vendor_libraries_are_recognised_by_name() {
        for n in [
            "libmusa.so",
            "libmusart.so.5",
            "libibverbs.so.1",
            "libcudart.so.12",
            "libcudart-1a2b3c.so.12",
        ] {
            assert!(is_vendor_library(n), "{n}");
        }
        for n in [
            "libc.so.6",
            "libmusa_helpers.so",
            "libgcc_s.so.1",
            "_native.abi3.so",
        ] {
            assert!(!is_vendor_library(n), "{n}");
        }
    }

    #[test]
    fn standin_wheel_contents_are_checked() {
        let ok = [
            "mooncake/__init__.py",
            "mooncake/_native.abi3.so",
            "x-0.1.0.dist-info/RECORD",
        ];
        check_contents(&ok.map(String::from)).unwrap();
        let bundled = ["mooncake/_native.abi3.so", "x.libs/libmusart-3f2a.so.5"];
        assert!(check_contents(&bundled.map(String::from))
            .unwrap_err()
            .to_string()
            .contains("bundles x.libs/libmusart"));
        let sbom = ["x-0.1.0.dist-info/sboms/x.cyclonedx.json"];
        assert!(check_contents(&sbom.map(String::from))
            .unwrap_err()
            .to_string()
            .contains("SBOM"));
    }

    #[test]
    fn platform_tags_and_auditwheel_verdicts() {
        let w = "mooncake_transfer_engine_musa-0.1.0-cp39-abi3-manylinux_2_35_x86_64.whl";
        assert_eq!(
            check_platform_tag(w, "manylinux_2_35_x86_64").unwrap(),
            "manylinux_2_35_x86_64"
        );
        assert!(check_platform_tag(
            "x-0.1.0-cp39-abi3-linux_x86_64.whl",
            "manylinux_2_35_x86_64"
        )
        .is_err());
        let out = "\nx.whl is consistent with the following platform tag:\n\"manylinux_2_34_x86_64\".\n\nThe wheel references external versioned symbols";
        assert!(check_auditwheel(out, "manylinux_2_35_x86_64").is_ok());
        let out = "x.whl is consistent with the following platform tag: \"linux_x86_64\".";
        assert!(check_auditwheel(out, "manylinux_2_35_x86_64").is_err());
        let out = "is consistent with the following platform tag: \"manylinux_2_36_x86_64\".";
        assert!(check_auditwheel(out, "manylinux_2_35_x86_64").is_err());
    }
}
