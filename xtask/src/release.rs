//! `cargo xtask release <tag>`: the order of the phases. Each phase lives in `release/` and is
//! safe to re-run; publishing compares what exists with what it would upload.
//!
//! verify source -> verify baseline -> [check images] -> build -> binaries -> audit -> checksums ->
//! GitHub draft -> publish PyPI -> GitHub undraft -> images -> ledger (the publishing steps are
//! `release/publish.rs`, shared with `cargo xtask publish`). `--dry-run` stops before publishing and
//! needs no network. Unless `--skip-images`, a publishing run checks the images' pre-conditions
//! (bases pinned, a builder, skopeo) before it builds anything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use xshell::Shell;

use crate::checksums::{self, Manifest, ManifestArtifact, ManifestRelease, MANIFEST, SUMS};
use crate::flags;
use crate::images;
use crate::ledger;
use crate::phase::Phases;
use crate::release::verify::{BaselineMode, BaselineReport};
use crate::source::{self, Source};
use crate::version::ReleaseTag;
use crate::Workspace;

pub mod audit;
pub mod binaries;
pub mod build;
pub mod github;
pub mod publish;
pub mod pypi;
pub mod sbom;
pub mod strip;
pub mod verify;

/// The target triple of the wheel, for the manifest.
pub const TARGET_TRIPLE: &str = "x86_64-unknown-linux-gnu";

impl flags::Release {
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        let ws = Workspace::load(sh)?;
        let mut phases = Phases::new(format!("release {}", self.tag));
        let result = run_phases(sh, &ws, &self, &mut phases);
        eprint!("{}", phases.summary());
        result
    }
}

fn run_phases(
    sh: &Shell,
    ws: &Workspace,
    cmd: &flags::Release,
    phases: &mut Phases,
) -> anyhow::Result<()> {
    let prepared = prepare(sh, ws, cmd, phases)?;
    if cmd.dry_run {
        dry_run(ws, &prepared, phases);
        return Ok(());
    }
    publish_phases(sh, ws, cmd, prepared, phases)
}

/// What the phases before publishing leave: a checked, built, audited, checksummed release.
struct Prepared {
    source: Source,
    /// `None` with `--dry-run` or `--skip-images`.
    image_plan: Option<images::Plan>,
    dist: PathBuf,
    manifest: Manifest,
}

/// verify source -> verify baseline -> [check images] -> build -> binaries -> audit -> checksums.
fn prepare(
    sh: &Shell,
    ws: &Workspace,
    cmd: &flags::Release,
    phases: &mut Phases,
) -> anyhow::Result<Prepared> {
    let source = phases.run("verify source", || {
        let s = source::source(sh, ws, &cmd.tag)?;
        let outcome = format!(
            "{} is {} (clean tree, version {})",
            s.tag, s.commit, s.version
        );
        Ok((s, outcome))
    })?;
    let baseline = phases.run("verify baseline", || {
        let r = verify::baseline(
            sh,
            &ws.config.baseline,
            BaselineMode::from_flag(cmd.strict_baseline),
        )?;
        let outcome = r.outcome();
        Ok((r, outcome))
    })?;
    let image_plan = if !cmd.dry_run && !cmd.skip_images {
        Some(phases.run("check images", || {
            let plan = images::Plan::check(sh, ws, None)?;
            let outcome = plan.summary();
            Ok((plan, outcome))
        })?)
    } else {
        None
    };
    let built = phases.run("build", || {
        let b = build::build(sh, ws, &source)?;
        let outcome = format!("{}, {}", file_name(&b.wheel), file_name(&b.sdist));
        Ok((b, outcome))
    })?;
    let dist = ws.dist_dir(&source.tag);
    let binaries = phases.run("binaries", || {
        let venv = build::tools_venv(sh, ws)?;
        let b = binaries::build(sh, ws, &source, &venv, &dist)?;
        let outcome = b.summary();
        Ok((b, outcome))
    })?;
    let audited = phases.run("audit", || {
        let venv = build::tools_venv(sh, ws)?;
        let python = baseline.found.python_bin.as_deref().unwrap_or("python3");
        let a = audit::audit(sh, ws, &built.wheel, &venv, python)?;
        let outcome = format!(
            "{}; no vendor runtime linked; smoke test moved {} bytes on Python {}",
            a.auditwheel
                .clone()
                .unwrap_or_else(|| a.platform_tag.clone()),
            a.smoke["bytes_moved"],
            a.smoke["python"].as_str().unwrap_or("?")
        );
        Ok((a, outcome))
    })?;
    let manifest = phases.run("checksums", || {
        let m = manifest(ws, &source, &baseline, &built, &binaries, &audited)?;
        checksums::write(&dist, &m)?;
        checksums::verify_dir(&dist)?;
        Ok((m, format!("{} and {MANIFEST} in {}", SUMS, dist.display())))
    })?;

    Ok(Prepared {
        source,
        image_plan,
        dist,
        manifest,
    })
}

/// `--dry-run`: what publishing would send, and the ledger entry it would write.
fn dry_run(ws: &Workspace, prepared: &Prepared, phases: &mut Phases) {
    let Prepared {
        source,
        dist,
        manifest,
        ..
    } = prepared;
    for name in [
        "GitHub draft",
        "publish PyPI",
        "GitHub undraft",
        "images",
        "ledger",
    ] {
        phases.skip(name, "--dry-run");
    }
    eprintln!("\nDry run: the release would publish these files:");
    for f in &manifest.upload_files {
        eprintln!("    {}", dist.join(f).display());
    }
    eprintln!(
        "and add this entry to RELEASES.md:\n\n{}",
        ledger::entry(ws, source, manifest, None)
    );
}

/// GitHub draft -> publish PyPI -> GitHub undraft -> images -> ledger (`xtask/README.md`).
fn publish_phases(
    sh: &Shell,
    ws: &Workspace,
    cmd: &flags::Release,
    prepared: Prepared,
    phases: &mut Phases,
) -> anyhow::Result<()> {
    let Prepared {
        source,
        image_plan,
        dist,
        manifest,
    } = prepared;
    phases.run("GitHub draft", || {
        let r = publish::github(ws, &dist, &manifest, cmd.allow_older)?;
        let outcome = r.summary();
        Ok((r, outcome))
    })?;
    phases.run("publish PyPI", || {
        let r = publish::pypi(sh, ws, &dist, &manifest, cmd.allow_older)?;
        let outcome = r.summary();
        Ok((r, outcome))
    })?;
    phases.run("GitHub undraft", || {
        let record = publish::undraft(ws, &dist, &manifest)?;
        let url = record.github.as_ref().map(|p| p.url.as_str());
        let outcome = format!("{} is public", url.unwrap_or_default());
        Ok(((), outcome))
    })?;
    let pushed = if let Some(plan) = &image_plan {
        phases.run("images", || {
            let pushed = images::build_and_push(sh, ws, &source, &dist, &manifest, plan, false)?;
            let outcome = pushed
                .values()
                .map(|i| i.by_digest())
                .collect::<Vec<_>>()
                .join(", ");
            Ok((pushed, outcome))
        })?
    } else {
        phases.skip(
            "images",
            "--skip-images: run `cargo xtask images <tag>` to build them",
        );
        BTreeMap::new()
    };
    phases.run("ledger", || {
        let (record, outcome) = images::record(ws, &source, &dist, &manifest, pushed)?;
        let attached = publish::attach(ws, &record)?;
        Ok(((), format!("{outcome}; {attached}")))
    })?;
    Ok(())
}

/// The release manifest: see `checksums.rs` for its conventions.
pub fn manifest(
    ws: &Workspace,
    source: &Source,
    baseline: &BaselineReport,
    built: &build::Built,
    binaries: &binaries::Binaries,
    audited: &audit::AuditReport,
) -> anyhow::Result<Manifest> {
    let wheel =
        ManifestArtifact::file(&built.wheel, "python-wheel", vec![TARGET_TRIPLE.to_owned()])?;
    let sdist = ManifestArtifact::file(&built.sdist, "source-tarball", vec![])?;
    // cargo-dist's kinds for debug info and SBOMs; GitHub assets only (`pypi::index_files`).
    let debug = ManifestArtifact::file(&built.debug, "symbols", vec![TARGET_TRIPLE.to_owned()])?;
    let sbom = ManifestArtifact::file(&built.sbom, "sbom", vec![])?;
    let sums = ManifestArtifact {
        name: SUMS.to_owned(),
        kind: "unified-checksum".to_owned(),
        target_triples: vec![],
        size: None,
        checksums: BTreeMap::new(),
    };
    let tag = ReleaseTag::parse(&source.tag)?;
    let mut artifacts: BTreeMap<String, ManifestArtifact> = [wheel, sdist, debug, sbom, sums]
        .into_iter()
        .map(|a| (a.name.clone(), a))
        .collect();
    let mut upload_files = vec![
        file_name(&built.wheel),
        file_name(&built.sdist),
        file_name(&built.debug),
        file_name(&built.sbom),
    ];
    let hosting = hosting(ws, source)?;
    let mut releases = vec![ManifestRelease {
        app_name: ws.config.distribution.clone(),
        app_version: source.version.clone(),
        artifacts: artifacts.keys().cloned().collect(),
        hosting: hosting.clone(),
    }];
    // Each standalone binary's crate is a release of its own, as cargo-dist describes it.
    for app in &binaries.apps {
        let files = [
            Some((&app.archive, binaries::ARCHIVE_KIND, true)),
            Some((&app.checksum, binaries::CHECKSUM_KIND, false)),
            app.installer
                .as_ref()
                .map(|i| (i, binaries::INSTALLER_KIND, false)),
        ];
        let mut names = Vec::new();
        for (path, kind, per_target) in files.into_iter().flatten() {
            let triples = if per_target {
                vec![TARGET_TRIPLE.to_owned()]
            } else {
                vec![]
            };
            let a = ManifestArtifact::file(path, kind, triples)?;
            names.push(a.name.clone());
            upload_files.push(a.name.clone());
            artifacts.insert(a.name.clone(), a);
        }
        releases.push(ManifestRelease {
            app_name: app.app_name.clone(),
            app_version: app.app_version.clone(),
            artifacts: names,
            hosting: hosting.clone(),
        });
    }
    upload_files.extend([SUMS.to_owned(), MANIFEST.to_owned()]);
    let mut tools = built.tools.clone();
    tools.insert("dist".to_owned(), binaries.dist_version.clone());
    let mut build = serde_json::to_value(&built.settings)?;
    build["binaries"] = serde_json::to_value(binaries)?;
    Ok(Manifest {
        dist_version: format!("xtask {}", env!("CARGO_PKG_VERSION")),
        announcement_tag: source.tag.clone(),
        announcement_is_prerelease: false,
        source: serde_json::json!({
            "tag": source.tag,
            "commit": source.commit,
            "source_date_epoch": source.commit_time,
            "post_release": tag.is_post_release(),
        }),
        releases,
        artifacts,
        upload_files,
        baseline: serde_json::to_value(baseline)?,
        tools,
        build,
        audit: serde_json::to_value(audited)?,
    })
}

/// Every place release.toml sends the release to (cargo-dist's `hosting`, with `pypi` and
/// `images` added): known before anything is published, so the manifest can hold it.
/// `publication.json` records what publishing found there.
fn hosting(ws: &Workspace, source: &Source) -> anyhow::Result<serde_json::Value> {
    let (owner, repo) = ws.config.github_owner_repo();
    let images = ws
        .config
        .images
        .images
        .iter()
        .map(|r| {
            let target = ws.config.images.target(r, &source.version)?;
            Ok((r.name.clone(), target.to_string()))
        })
        .collect::<anyhow::Result<BTreeMap<String, String>>>()?;
    Ok(serde_json::json!({
        "github": {
            "artifact_base_url": "https://github.com",
            "artifact_download_path": format!("/{owner}/{repo}/releases/download/{}", source.tag),
            "owner": owner,
            "repo": repo,
        },
        "pypi": {
            "repository_url": ws.config.pypi.repository_url,
            "index_url": ws.config.pypi.index_url,
            "project": ws.config.distribution,
            "version": source.version,
        },
        "images": images,
    }))
}

/// A path's file name, for messages and asset names.
pub fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
