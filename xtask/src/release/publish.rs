//! The three publishing steps of a release directory, in their one order (see `xtask/README.md`,
//! "The order of publishing"): [`github`] (draft, upload, verify) -> [`pypi`] -> [`undraft`]
//! (which writes the publication record and attaches it); [`attach`] attaches the record again
//! once a later phase (images, attestations) added to it.
//! `cargo xtask release` runs them in a row; `cargo xtask publish <step>` runs one, as the
//! release workflow's jobs do.

use std::path::Path;

use anyhow::format_err;
use xshell::Shell;

use crate::checksums::{self, Manifest};
use crate::publication::{self, Publication, Published};
use crate::release::github::RecordOutcome;
use crate::release::{build, github, pypi};
use crate::Workspace;

/// Before anything is uploaded: what the index holds of the project, and a refusal of other
/// bytes under one of our file names, or of a version below the newest release (unless
/// `allow_older`). Returns the one-line outcome.
pub fn preflight(
    ws: &Workspace,
    dist: &Path,
    manifest: &Manifest,
    allow_older: bool,
) -> anyhow::Result<String> {
    let files = pypi::index_files(dist, manifest);
    let c = pypi::compare(&pypi::index(ws), &ws.config.distribution, &files)?;
    eprintln!("    {}", c.describe());
    c.check_not_older(version(manifest)?, allow_older)?;
    let missing: Vec<String> = c
        .missing
        .iter()
        .map(|p| crate::release::file_name(p))
        .collect();
    Ok(format!(
        "{}: {} of {} files already identical; to upload: {}",
        c.project_url,
        c.identical.len(),
        files.len(),
        if missing.is_empty() {
            "none".to_owned()
        } else {
            missing.join(", ")
        }
    ))
}

/// Step 1: after the index preflight, the draft GitHub release with every upload file,
/// verified by digest.
pub fn github(
    ws: &Workspace,
    dist: &Path,
    manifest: &Manifest,
    allow_older: bool,
) -> anyhow::Result<Published> {
    let commit = built_commit(manifest)?;
    preflight(ws, dist, manifest, allow_older)?;
    github::draft(ws, &manifest.announcement_tag, commit, dist, manifest)
}

/// Step 2: the wheel and the sdist on the index (identical: skipped; missing: uploaded;
/// other bytes: stop), after the preflight.
pub fn pypi(
    sh: &Shell,
    ws: &Workspace,
    dist: &Path,
    manifest: &Manifest,
    allow_older: bool,
) -> anyhow::Result<Published> {
    preflight(ws, dist, manifest, allow_older)?;
    let venv = build::tools_venv(sh, ws)?;
    pypi::publish(sh, ws, dist, manifest, &venv)
}

/// Step 3: once the index holds the same wheel and sdist, and the release's assets are ours by
/// digest, the GitHub release goes out of draft. Then both places, with every file's URL and
/// sha256 as the place reports it, go into `publication.json`, which is attached to the release.
pub fn undraft(ws: &Workspace, dist: &Path, manifest: &Manifest) -> anyhow::Result<Publication> {
    let files = pypi::index_files(dist, manifest);
    let on_index = pypi::require_identical(&pypi::index(ws), &ws.config.distribution, &files)?;
    // A record of another build in this directory stops us before the release goes public.
    let mut record = Publication::load_or_new(dist, manifest)?;
    let on_github = github::undraft(ws, &manifest.announcement_tag, dist, manifest)?;
    record.check_place(dist, &on_index)?;
    record.check_place(dist, &on_github)?;
    record.github = Some(on_github);
    record.index = Some(on_index);
    publication::write(dist, &record)?;
    eprintln!("    {}", attach(ws, &record)?);
    Ok(record)
}

/// Attaches `record` to its GitHub release as `publication.json` (replacing an earlier one);
/// returns the one-line outcome. An immutable published release takes no asset: that is said,
/// loudly, and the record stays in the release directory (and the workflow's artifacts).
pub fn attach(ws: &Workspace, record: &Publication) -> anyhow::Result<String> {
    let target = github::Target::from_env(ws);
    let outcome = github::put_record(
        &target,
        &github::token(ws)?,
        &record.tag,
        record.to_bytes()?,
    )?;
    let name = publication::PUBLICATION;
    let tag = &record.tag;
    Ok(match outcome {
        RecordOutcome::Attached => format!("{name}: attached on release {tag}"),
        RecordOutcome::Identical => format!("{name}: already attached, identical on release {tag}"),
        RecordOutcome::Immutable => {
            let warning = format!(
                "WARNING: release {tag} is published and immutable, so GitHub takes no {name}: \
                 keep the release directory's copy (the workflow's `release-images` artifact); \
                 `verify {tag} --published` reads it from target/dist/{tag}/"
            );
            eprintln!("    {warning}");
            warning
        }
    })
}

/// The commit the release was built from, as the manifest records it.
pub fn built_commit(manifest: &Manifest) -> anyhow::Result<&str> {
    manifest.source["commit"].as_str().ok_or_else(|| {
        format_err!(
            "{} has no source.commit: it was not written by `cargo xtask release`",
            checksums::MANIFEST
        )
    })
}

/// The PEP 440 version of the release, as the manifest records it.
fn version(manifest: &Manifest) -> anyhow::Result<&str> {
    manifest
        .releases
        .first()
        .map(|r| r.app_version.as_str())
        .ok_or_else(|| format_err!("{} lists no release", checksums::MANIFEST))
}
