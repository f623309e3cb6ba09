//! `cargo xtask verify <tag> --published`: download what was published for a tag from the
//! GitHub Release and from the package index, and say for every file and place whether it is
//! identical to what the tag's publication record (`publication.json`) says that place serves,
//! different, or missing.
//!
//! The reference is the record in `target/dist/<tag>/` where there is one (the maintainer's
//! copy, or one downloaded from the release workflow's artifacts), and then the record the
//! release serves must be identical to it; else the record the release serves, which must then
//! agree with the `sha256.sum` served next to it (both attested by the release workflow:
//! `gh attestation verify sha256.sum --repo <owner>/<repo>`). Each place is compared with the
//! reference on its own: nothing is trusted because it came from one place.

use std::collections::BTreeMap;
use std::fmt;

use anyhow::{bail, Context};

use crate::checksums::{parse_sums, sha256_bytes, SUMS};
use crate::publication::{self, Place, Publication, PUBLICATION};
use crate::release::{github, pypi};
use crate::{env, Workspace};

/// What one place serves under one file name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Identical,
    /// The sha256 of what the place serves.
    Different(String),
    Missing,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Identical => write!(f, "identical"),
            Verdict::Different(sha) => write!(f, "DIFFERENT (sha256 {sha})"),
            Verdict::Missing => write!(f, "MISSING"),
        }
    }
}

/// One file at one place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub place: &'static str,
    pub name: String,
    pub verdict: Verdict,
}

/// Downloads and compares; the checks come in the order GitHub, then the index.
pub fn published(ws: &Workspace, tag: &str) -> anyhow::Result<Vec<Check>> {
    let token = env::var(env::GITHUB_TOKEN);
    let target = github::Target::from_env(ws);
    let assets = github::download_assets(&target, token.as_deref(), tag)?;
    let dist = ws.dist_dir(tag);
    let local = publication::read(&dist)?;
    let mut checks = Vec::new();
    let record = match (local, assets.get(PUBLICATION)) {
        (Some(local), served) => {
            eprintln!("    reference: {}", dist.join(PUBLICATION).display());
            let want = sha256_bytes(&local.to_bytes()?);
            checks.push(check("GitHub", PUBLICATION, &want, served));
            local
        }
        (None, Some(served)) => {
            eprintln!(
                "    reference: {PUBLICATION} of the GitHub release ({}/{}), checked against \
                 its {SUMS}",
                target.owner, target.repo
            );
            let record = Publication::parse(served)
                .with_context(|| format!("the {PUBLICATION} of release {tag}"))?;
            agrees_with_sums(&record, assets.get(SUMS))?;
            record
        }
        (None, None) => bail!(
            "there is no publication record of {tag}: neither {} nor a {PUBLICATION} on the \
             GitHub release ({}/{}). Download the release workflow's `release-publication` \
             artifact into {}, or check the files by hand against the release's {SUMS}.",
            dist.join(PUBLICATION).display(),
            target.owner,
            target.repo,
            dist.display()
        ),
    };
    if record.tag != tag {
        bail!("the publication record is of {}, not {tag}", record.tag);
    }

    match &record.github {
        Some(place) => {
            for (name, f) in &place.files {
                checks.push(check("GitHub", name, &f.sha256, assets.get(name)));
            }
        }
        None => checks.push(unrecorded("GitHub")),
    }
    match &record.index {
        Some(place) => {
            let names: Vec<String> = place.files.keys().cloned().collect();
            let on_index = pypi::download(&pypi::index(ws), &ws.config.distribution, &names)?;
            for (name, f) in &place.files {
                checks.push(check("index", name, &f.sha256, on_index.get(name)));
            }
        }
        None => checks.push(unrecorded("index")),
    }
    Ok(checks)
}

/// A place the record does not name: the release never got there.
fn unrecorded(place: &'static str) -> Check {
    Check {
        place,
        name: "(no files recorded: not published there)".to_owned(),
        verdict: Verdict::Missing,
    }
}

/// A record taken from the release itself must name the `sha256.sum` served beside it and, for
/// every file, the sha256 that file has there.
fn agrees_with_sums(record: &Publication, sums: Option<&Vec<u8>>) -> anyhow::Result<()> {
    let Some(sums) = sums else {
        bail!("the release serves {PUBLICATION} but no {SUMS}: it cannot be checked");
    };
    let served = sha256_bytes(sums);
    if served != record.sums_sha256 {
        bail!(
            "the release's {PUBLICATION} names a {SUMS} with sha256 {}, the release serves \
             {served}: one of them was replaced; do not install from this release",
            record.sums_sha256
        );
    }
    let lines = parse_sums(&String::from_utf8_lossy(sums))?;
    let listed: BTreeMap<&str, &str> = lines
        .iter()
        .map(|l| (l.name.as_str(), l.sha256.as_str()))
        .collect();
    let places = [&record.github, &record.index];
    for place in places.into_iter().flatten() {
        if let Some((name, f)) = disagreeing(place, &listed, &record.sums_sha256).first() {
            bail!(
                "the release's {PUBLICATION} records {name} at {} with sha256 {}, its {SUMS} \
                 says otherwise: do not install from this release",
                place.name,
                f
            );
        }
    }
    Ok(())
}

/// The files of `place` whose sha256 is not the one `sha256.sum` lists.
fn disagreeing<'a>(
    place: &'a Place,
    listed: &BTreeMap<&str, &str>,
    sums_sha256: &str,
) -> Vec<(&'a str, &'a str)> {
    place
        .files
        .iter()
        .filter(|(name, f)| {
            let want = if name.as_str() == SUMS {
                Some(sums_sha256)
            } else {
                listed.get(name.as_str()).copied()
            };
            want != Some(f.sha256.as_str())
        })
        .map(|(name, f)| (name.as_str(), f.sha256.as_str()))
        .collect()
}

fn check(place: &'static str, name: &str, want: &str, got: Option<&Vec<u8>>) -> Check {
    let verdict = match got {
        None => Verdict::Missing,
        Some(bytes) => {
            let sha = sha256_bytes(bytes);
            if sha == want {
                Verdict::Identical
            } else {
                Verdict::Different(sha)
            }
        }
    };
    Check {
        place,
        name: name.to_owned(),
        verdict,
    }
}

/// The report, one line per file and place; an error when anything is not identical.
pub fn report(tag: &str, checks: &[Check]) -> anyhow::Result<()> {
    for c in checks {
        println!("{:<7} {:<60} {}", c.place, c.name, c.verdict);
    }
    let bad = checks
        .iter()
        .filter(|c| c.verdict != Verdict::Identical)
        .count();
    if bad > 0 {
        bail!(
            "{bad} of {} published files of {tag} are not what its publication record says: do \
             not install them; report the release (the files differ or are missing where marked)",
            checks.len()
        );
    }
    eprintln!(
        "{tag}: all {} published files are identical to its publication record",
        checks.len()
    );
    Ok(())
}
