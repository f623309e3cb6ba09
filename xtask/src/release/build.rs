//! Phase `build`: the wheel and the sdist, reproducibly.
//!
//! Same tag, same host baseline, same bytes: `SOURCE_DATE_EPOCH` is the tag's commit time (zip
//! and tar mtimes), maturin's SBOM is off (it holds a random serial number and a timestamp), path
//! prefixes are remapped (`/src`, `/cargo`, `/rustup`, `/target`) so no checkout or home directory reaches
//! the `.so`, the toolchain is `rust-toolchain.toml`'s, Cargo.lock is `--locked`, and maturin
//! comes from a hash-locked venv (`xtask/requirements-build.txt`).
//!
//! Then the extension is stripped and its debug info becomes the asset `<wheel stem>.debug`
//! (`strip.rs`), and the wheel's Rust dependency tree the asset `<stem>-<version>.cdx.json`
//! (`sbom.rs`): both depend on the sources only, like the wheel.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, format_err, Context};
use serde::Serialize;
use xshell::{cmd, Shell};

use crate::env;
use crate::release::{sbom, strip, TARGET_TRIPLE};
use crate::source::{self, Source};
use crate::version::dist_file_stem;
use crate::Workspace;

/// The cargo profile of the release wheel (workspace Cargo.toml `[profile.wheel]`: fat LTO,
/// opt-level "s").
pub const WHEEL_PROFILE: &str = "wheel";

/// The lock file of the Python build tools (maturin, auditwheel), with hashes.
pub const BUILD_REQUIREMENTS: &str = "xtask/requirements-build.txt";

#[derive(Debug, Clone, Serialize)]
pub struct Built {
    pub wheel: PathBuf,
    pub sdist: PathBuf,
    /// The extension's debug info, `<wheel stem>.debug` (a GitHub asset, not on the index).
    pub debug: PathBuf,
    /// The CycloneDX SBOM of the wheel's Rust crate, `<stem>-<version>.cdx.json`.
    pub sbom: PathBuf,
    /// Tool name -> version line.
    pub tools: BTreeMap<String, String>,
    /// What made the build reproducible, for the manifest.
    pub settings: BuildSettings,
}

#[derive(Debug, Clone, Serialize)]
pub struct BuildSettings {
    pub source_date_epoch: i64,
    pub compatibility: String,
    pub target_arch: String,
    pub path_prefixes_remapped_to: Vec<String>,
    pub cargo_locked: bool,
    /// The cargo profile of the extension ([`WHEEL_PROFILE`]).
    pub cargo_profile: String,
    pub maturin_sbom: bool,
    /// The strip step: the extension in the wheel, its build-id, the debug file, sizes.
    pub stripped: strip::Stripped,
    /// The SBOM asset's format.
    pub sbom: String,
}

/// The cargo target directory of release builds: [`env::XTASK_CARGO_TARGET_DIR`] when set
/// (one directory several checkouts share, so each builds only its own crates), else the
/// checkout's scratch space.
pub(crate) fn target_dir(ws: &Workspace) -> PathBuf {
    env::var(env::XTASK_CARGO_TARGET_DIR)
        .map(PathBuf::from)
        .unwrap_or_else(|| ws.scratch_dir().join("cargo-target"))
}

/// A host path prefix and what it becomes in the artifacts.
pub(crate) type PathRemap = (String, &'static str);

/// The path prefixes the build remaps, so that no path of this host is in the artifacts.
///
/// rustc applies the last matching prefix. The checkout's own prefix is not among these
/// flags: it reaches only the workspace's crates (see [`checkout_remap_wrapper`]), so that
/// the dependencies' flags, and with them their compiled artifacts, are the same from every
/// checkout.
fn path_remaps(target: &Path) -> Vec<PathRemap> {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".to_owned());
    let cargo_home = std::env::var("CARGO_HOME").unwrap_or_else(|_| format!("{home}/.cargo"));
    let rustup_home = std::env::var("RUSTUP_HOME").unwrap_or_else(|_| format!("{home}/.rustup"));
    vec![
        (cargo_home, "/cargo"),
        (rustup_home, "/rustup"),
        (target.display().to_string(), "/target"),
    ]
}

/// What the checkout's prefix becomes in the artifacts.
const CHECKOUT_REMAPPED_TO: &str = "/src";

/// A `RUSTC_WORKSPACE_WRAPPER` that adds `--remap-path-prefix=<checkout>=/src` to the
/// workspace crates' rustc calls only: cargo hashes `RUSTFLAGS` into every crate's
/// fingerprint, so a checkout path there would rebuild every dependency per checkout.
/// Given last, it wins over the target dir's prefix, which the default target dir is under.
///
/// Cargo hashes the wrapper's path into the workspace crates' metadata (and so into their
/// `OUT_DIR`, which reaches the `.so`): the script lives at one path whatever the checkout,
/// the same bytes from every checkout, and reads the checkout from
/// [`env::XTASK_REMAP_CHECKOUT`].
fn checkout_remap_wrapper() -> anyhow::Result<PathBuf> {
    let script = format!(
        "#!/bin/sh\n# Written by `cargo xtask release` (xtask/src/release/build.rs).\n\
         exec \"$@\" \"--remap-path-prefix=${}={CHECKOUT_REMAPPED_TO}\"\n",
        env::XTASK_REMAP_CHECKOUT
    );
    let path = std::env::temp_dir().join("xtask-remap-rustc");
    if fs::read_to_string(&path).ok().as_deref() == Some(script.as_str()) {
        return Ok(path);
    }
    // Written aside and renamed: another release may be running the script now.
    let aside = path.with_extension(std::process::id().to_string());
    fs::write(&aside, script).with_context(|| format!("cannot write {}", aside.display()))?;
    let mut perms = fs::metadata(&aside)?.permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    fs::set_permissions(&aside, perms)?;
    fs::rename(&aside, &path)?;
    Ok(path)
}

/// The versions of the tools that made the release, for the manifest.
fn tool_versions(
    sh: &Shell,
    maturin: &Path,
    python: &Path,
) -> anyhow::Result<BTreeMap<String, String>> {
    let objcopy = cmd!(sh, "objcopy --version").quiet().read()?;
    Ok(BTreeMap::from([
        ("rustc".to_owned(), cmd!(sh, "rustc -V").quiet().read()?),
        ("cargo".to_owned(), cmd!(sh, "cargo -V").quiet().read()?),
        (
            "maturin".to_owned(),
            cmd!(sh, "{maturin} --version").quiet().read()?,
        ),
        (
            "objcopy".to_owned(),
            objcopy.lines().next().unwrap_or_default().to_owned(),
        ),
        (
            "python (build tools)".to_owned(),
            cmd!(sh, "{python} --version").quiet().read()?,
        ),
    ]))
}

pub fn build(sh: &Shell, ws: &Workspace, source: &Source) -> anyhow::Result<Built> {
    let project = ws.wheel_project_dir();
    preflight(ws, &project)?;
    let (compatibility, target_arch) = ws.config.baseline.manylinux()?;
    let host_arch = std::env::consts::ARCH;
    if host_arch != target_arch {
        bail!("this host is {host_arch}, the release wheel is {target_arch}: build on an {target_arch} host");
    }

    let venv = tools_venv(sh, ws)?;
    let maturin = venv.join("bin").join("maturin");
    let stage = ws.scratch_dir().join("stage").join(&source.tag);
    if stage.exists() {
        fs::remove_dir_all(&stage)?;
    }
    fs::create_dir_all(&stage)?;

    let (_env, remaps) = reproducible_env(sh, ws, source)?;
    let _dir = sh.push_dir(&project);
    cmd!(sh, "{maturin} sdist --out {stage}")
        .env_remove("RUSTFLAGS")
        .run()
        .context("cannot build the sdist (maturin sdist)")?;
    cmd!(
        sh,
        "{maturin} build --profile {WHEEL_PROFILE} --locked --compatibility {compatibility} --out {stage}"
    )
    .env_remove("RUSTFLAGS")
    .run()
    .context("cannot build the wheel (maturin build)")?;

    let (wheel, sdist) = collect(ws, &stage, &source.version)?;
    let python = venv.join("bin").join("python");
    let work = ws.scratch_dir().join("strip");
    let stripped = strip::strip_wheel(sh, &python, &wheel, &stage, &work)?;
    eprintln!(
        "    stripped {}: wheel {} -> {} bytes, extension {} -> {} bytes; debug info in {} \
         (build-id {})",
        stripped.member,
        stripped.wheel_size_before,
        stripped.wheel_size_after,
        stripped.so_size_before,
        stripped.so_size_after,
        stripped.debug_file,
        stripped.build_id
    );
    let dist = ws.dist_dir(&source.tag);
    if dist.exists() {
        fs::remove_dir_all(&dist)?;
    }
    fs::create_dir_all(&dist)?;
    let wheel = move_into(&wheel, &dist)?;
    let sdist = move_into(&sdist, &dist)?;
    let debug = move_into(&stripped.debug, &dist)?;
    let so = strip::read_member(sh, &python, &wheel, &work)?;
    strip::check_pair(&so, &fs::read(&debug)?, &stripped.debug_file)?;
    let sbom = dist.join(format!(
        "{}-{}.cdx.json",
        dist_file_stem(&ws.config.distribution),
        source.version
    ));
    write_sbom(sh, ws, &project, source, &sbom)?;

    let tools = tool_versions(sh, &maturin, &python)?;

    let stripped = strip::Stripped { debug, ..stripped };
    Ok(Built {
        wheel,
        sdist,
        debug: stripped.debug.clone(),
        sbom,
        tools,
        settings: BuildSettings {
            source_date_epoch: source.commit_time,
            compatibility,
            target_arch,
            path_prefixes_remapped_to: remaps
                .iter()
                .map(|(_, to)| to.to_string())
                .chain([CHECKOUT_REMAPPED_TO.to_owned()])
                .collect(),
            cargo_locked: true,
            cargo_profile: WHEEL_PROFILE.to_owned(),
            maturin_sbom: false,
            stripped,
            sbom: "CycloneDX 1.5 JSON".to_owned(),
        },
    })
}

/// The environment of every release build (the wheel's, the standalone binaries'): the
/// tag's commit time, the path remaps, the shared target directory, no incremental state.
/// Returns the guards (the environment lasts while they live) and the remaps applied.
pub(crate) fn reproducible_env<'a>(
    sh: &'a Shell,
    ws: &Workspace,
    source: &Source,
) -> anyhow::Result<(Vec<xshell::PushEnv<'a>>, Vec<PathRemap>)> {
    let target = target_dir(ws);
    let wrapper = checkout_remap_wrapper()?;
    let remaps = path_remaps(&target);
    let mut rustflags: Vec<String> = remaps
        .iter()
        .map(|(from, to)| format!("--remap-path-prefix={from}={to}"))
        .collect();
    // A build-id whatever the linker's default: the debug file is found by it. SHA-1 of the
    // output, so it is as reproducible as the bytes.
    rustflags.push("-Clink-arg=-Wl,--build-id=sha1".to_owned());
    // CARGO_ENCODED_RUSTFLAGS wins over RUSTFLAGS, which cargo-dist sets to "" for its builds.
    let guards = vec![
        sh.push_env("SOURCE_DATE_EPOCH", source.commit_time.to_string()),
        sh.push_env("CARGO_ENCODED_RUSTFLAGS", rustflags.join("\x1f")),
        sh.push_env("CARGO_TARGET_DIR", &target),
        sh.push_env("RUSTC_WORKSPACE_WRAPPER", &wrapper),
        sh.push_env(env::XTASK_REMAP_CHECKOUT, &ws.root),
        sh.push_env("CARGO_INCREMENTAL", "0"),
    ];
    Ok((guards, remaps))
}

/// The SBOM of the wheel's crate with the wheel's features (`[tool.maturin] features`).
fn write_sbom(
    sh: &Shell,
    ws: &Workspace,
    project: &Path,
    source: &Source,
    out: &Path,
) -> anyhow::Result<()> {
    let pyproject = source::wheel_pyproject(project)?;
    let manifest = project.join(pyproject.manifest_path.as_deref().unwrap_or("Cargo.toml"));
    let metadata = sbom::cargo_metadata(sh, &manifest, &pyproject.features, TARGET_TRIPLE, false)?;
    let lock = fs::read_to_string(ws.root.join("Cargo.lock")).context("cannot read Cargo.lock")?;
    fs::write(out, sbom::generate(&metadata, &lock, source.commit_time)?)?;
    Ok(())
}

/// What must hold of the sources before maturin runs.
fn preflight(ws: &Workspace, project: &Path) -> anyhow::Result<()> {
    let pyproject = source::wheel_pyproject(project)?;
    if pyproject.sbom_rust != Some(false) || pyproject.sbom_auditwheel != Some(false) {
        bail!(
            "maturin would embed an SBOM (a random serial number and a timestamp: no two builds \
             alike). Add to {}/pyproject.toml:\n\n    [tool.maturin.sbom]\n    rust = false\n    \
             auditwheel = false\n",
            ws.config.wheel.project_dir
        );
    }
    Ok(())
}

/// The one wheel and the one sdist in `stage`, with the names the release expects.
fn collect(ws: &Workspace, stage: &Path, version: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
    let stem = dist_file_stem(&ws.config.distribution);
    let platform = &ws.config.baseline.wheel_platform;
    let mut wheels = Vec::new();
    let mut sdists = Vec::new();
    for entry in fs::read_dir(stage)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        if name.ends_with(".whl") {
            wheels.push((path, name));
        } else if name.ends_with(".tar.gz") {
            sdists.push((path, name));
        }
    }
    let [(wheel, wheel_name)] = &wheels[..] else {
        bail!(
            "expected one wheel in {}, found {}",
            stage.display(),
            wheels.len()
        );
    };
    let [(sdist, sdist_name)] = &sdists[..] else {
        bail!(
            "expected one sdist in {}, found {}",
            stage.display(),
            sdists.len()
        );
    };
    if !wheel_name.starts_with(&format!("{stem}-{version}-"))
        || !wheel_name.ends_with(&format!("-{platform}.whl"))
    {
        bail!(
            "maturin built {wheel_name}, expected {stem}-{version}-<python>-<abi>-{platform}.whl"
        );
    }
    if *sdist_name != format!("{stem}-{version}.tar.gz") {
        bail!("maturin built {sdist_name}, expected {stem}-{version}.tar.gz");
    }
    Ok((wheel.clone(), sdist.clone()))
}

pub(crate) fn move_into(file: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    let to = dir.join(
        file.file_name()
            .ok_or_else(|| format_err!("no file name"))?,
    );
    fs::rename(file, &to).or_else(|_| fs::copy(file, &to).map(drop))?;
    Ok(to)
}

/// The venv of the Python build tools, installed from the hash-locked requirements; rebuilt when
/// the lock file changes.
pub fn tools_venv(sh: &Shell, ws: &Workspace) -> anyhow::Result<PathBuf> {
    let lock = ws.root.join(BUILD_REQUIREMENTS);
    let text = fs::read(&lock).with_context(|| format!("cannot read {}", lock.display()))?;
    let want = crate::checksums::sha256_bytes(&text);
    let venv = ws.scratch_dir().join("tools-venv");
    let stamp = venv.join(".requirements.sha256");
    if fs::read_to_string(&stamp).ok().as_deref() == Some(want.as_str()) {
        return Ok(venv);
    }
    if venv.exists() {
        fs::remove_dir_all(&venv)?;
    }
    let python = env::var(env::XTASK_PYTHON).unwrap_or_else(|| "python3".to_owned());
    cmd!(sh, "{python} -m venv {venv}").run().with_context(|| {
        format!(
            "cannot create the build-tools venv with {python}: install python3-venv or set {}",
            env::XTASK_PYTHON
        )
    })?;
    let pip = venv.join("bin").join("pip");
    cmd!(sh, "{pip} install --quiet --disable-pip-version-check --no-input --require-hashes --only-binary=:all: -r {lock}")
        .run()
        .with_context(|| format!("cannot install the locked build tools ({BUILD_REQUIREMENTS})"))?;
    fs::write(&stamp, want)?;
    Ok(venv)
}
