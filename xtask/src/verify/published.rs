//! `cargo xtask verify <tag> --published`: download what was published for a tag from the
//! GitHub Release and from the package index, and say for every file and place whether it is
//! identical to what the tag's entry in `RELEASES.md` records, different, or missing.
//!
//! The reference is the ledger (`RELEASES.md` of this checkout) for the wheel and the sdist,
//! and the `sha256.sum` published on the release (itself checked against the ledger) for the
//! manifest. Nothing is trusted because it came from one place: each place is compared with
//! the ledger on its own.

use std::fmt;

use anyhow::{bail, Context};

use crate::checksums::{parse_sums, sha256_bytes, MANIFEST, SUMS};
use crate::ledger::{self, LEDGER};
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
    let path = ws.root.join(LEDGER);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let recorded = ledger::artifacts_in(&text, tag);
    if recorded.is_empty() {
        bail!(
            "{} has no artifacts recorded for {tag}: check out a commit whose ledger has the \
             release (`git checkout origin/main -- {LEDGER}`), then run this again",
            path.display()
        );
    }
    let mut checks = Vec::new();

    let token = env::var(env::GITHUB_TOKEN);
    let target = github::Target::from_env(ws);
    let assets = github::download_assets(&target, token.as_deref(), tag)?;
    let sums = match assets.get(SUMS) {
        Some(bytes) => Some(parse_sums(&String::from_utf8_lossy(bytes))?),
        None => None,
    };
    for (name, want) in &recorded {
        checks.push(check("GitHub", name, Some(want), assets.get(name)));
    }
    // sha256.sum: identical when it records the ledger's sums for the ledger's files.
    let sums_verdict = match (&sums, assets.get(SUMS)) {
        (Some(lines), Some(bytes)) => {
            let agrees = recorded
                .iter()
                .all(|(n, sha)| lines.iter().any(|l| &l.name == n && &l.sha256 == sha));
            if agrees {
                Verdict::Identical
            } else {
                Verdict::Different(sha256_bytes(bytes))
            }
        }
        _ => Verdict::Missing,
    };
    checks.push(Check {
        place: "GitHub",
        name: SUMS.to_owned(),
        verdict: sums_verdict,
    });
    let manifest_sha = sums
        .iter()
        .flatten()
        .find(|l| l.name == MANIFEST)
        .map(|l| l.sha256.clone());
    checks.push(check(
        "GitHub",
        MANIFEST,
        manifest_sha.as_ref(),
        assets.get(MANIFEST),
    ));

    // The index holds the wheel and the sdist; the other assets are GitHub's alone.
    let names: Vec<String> = recorded
        .keys()
        .filter(|n| pypi::goes_to_index(n))
        .cloned()
        .collect();
    let on_index = pypi::download(&pypi::index(ws), &ws.config.distribution, &names)?;
    for (name, want) in recorded.iter().filter(|(n, _)| pypi::goes_to_index(n)) {
        checks.push(check("index", name, Some(want), on_index.get(name)));
    }
    Ok(checks)
}

fn check(place: &'static str, name: &str, want: Option<&String>, got: Option<&Vec<u8>>) -> Check {
    let verdict = match got {
        None => Verdict::Missing,
        Some(bytes) => {
            let sha = sha256_bytes(bytes);
            if want == Some(&sha) {
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
            "{bad} of {} published files of {tag} are not what RELEASES.md records: do not \
             install them; report the release (the files differ or are missing where marked)",
            checks.len()
        );
    }
    eprintln!(
        "{tag}: all {} published files are identical to RELEASES.md",
        checks.len()
    );
    Ok(())
}
