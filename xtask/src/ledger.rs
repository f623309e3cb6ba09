//! Phase `ledger`: the release's entry in `RELEASES.md`.
//!
//! One entry per tag between `<!-- release <tag> -->` markers, newest first. The entry depends
//! only on the release (tag, commit, commit date, artifacts, places), never on the clock, so a
//! re-run writes the same bytes and a re-publish replaces the entry in place.

use std::fs;

use anyhow::Context;

use crate::checksums::Manifest;
use crate::source::Source;
use crate::Workspace;

pub use crate::LEDGER;

const HEADER: &str = "\
# Releases

The ledger of every release: tag, commit, artifacts with SHA256, where each was published,
and the serving images by digest. Written by `cargo xtask release <tag>` (images also by
`cargo xtask images <tag>`); check a download with `sha256sum -c sha256.sum` or
`cargo xtask verify <dir>`, pull an image by the digest listed here.
";

/// What a publish phase did: where, and which files it uploaded or found already identical.
#[derive(Debug)]
pub struct Published {
    pub place: Place,
    pub uploaded: Vec<String>,
    pub identical: Vec<String>,
}

impl Published {
    pub fn summary(&self) -> String {
        format!(
            "{} uploaded, {} already identical: {}",
            self.uploaded.len(),
            self.identical.len(),
            self.place.url
        )
    }

    pub fn place(&self) -> Place {
        self.place.clone()
    }
}

/// Where a release was published, one line of the entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub name: String,
    pub url: String,
}

pub fn entry(ws: &Workspace, source: &Source, manifest: &Manifest, places: &[Place]) -> String {
    let mut out = format!("<!-- release {} -->\n## {}\n\n", source.tag, source.tag);
    out.push_str(&format!(
        "- Distribution: `{}` {}\n",
        ws.config.distribution, source.version
    ));
    out.push_str(&format!("- Commit: `{}`\n", source.commit));
    out.push_str(&format!(
        "- Date: {} (commit time, UTC)\n",
        utc_date(source.commit_time)
    ));
    let baseline = &ws.config.baseline;
    out.push_str(&format!(
        "- Baseline: {} {}, glibc {}, MUSA {}, PyTorch {}, Python {}, {} (`{}`)\n",
        baseline.os_id,
        baseline.os_version,
        baseline.glibc,
        baseline.musa,
        baseline.torch,
        baseline.python,
        baseline.musa_arch,
        baseline.builder_image
    ));
    if let Some(mode) = manifest.baseline.get("mode").and_then(|m| m.as_str()) {
        let n = manifest.baseline["differences"]
            .as_array()
            .map_or(0, Vec::len);
        out.push_str(&format!(
            "- Built: {mode} baseline, {n} differences from it\n"
        ));
    }
    for p in places {
        out.push_str(&format!("- Published: {} <{}>\n", p.name, p.url));
    }
    out.push_str("\n| artifact | bytes | SHA256 |\n|---|---:|---|\n");
    for a in manifest.artifacts.values() {
        if let (Some(sha), Some(size)) = (a.sha256(), a.size) {
            out.push_str(&format!("| `{}` | {size} | `{sha}` |\n", a.name));
        }
    }
    if !manifest.images.is_empty() {
        out.push_str("\n| image | digest | base |\n|---|---|---|\n");
        for i in manifest.images.values() {
            out.push_str(&format!(
                "| `{}` | `{}` | `{}` |\n",
                i.reference, i.digest, i.base
            ));
        }
    }
    out.push_str(&format!("<!-- /release {} -->\n", source.tag));
    out
}

/// The places an existing entry names (`- Published: NAME <URL>`), so that a later phase
/// (`cargo xtask images`) can rewrite the entry without forgetting them.
pub fn places_in(ledger: &str, tag: &str) -> Vec<Place> {
    entry_of(ledger, tag)
        .lines()
        .filter_map(|l| l.strip_prefix("- Published: "))
        .filter_map(|l| {
            let (name, url) = l.strip_suffix('>')?.rsplit_once(" <")?;
            Some(Place {
                name: name.to_owned(),
                url: url.to_owned(),
            })
        })
        .collect()
}

/// The artifacts an entry records: file name -> sha256 (`| `NAME` | BYTES | `SHA256` |`).
pub fn artifacts_in(ledger: &str, tag: &str) -> std::collections::BTreeMap<String, String> {
    entry_of(ledger, tag)
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l
                .trim()
                .strip_prefix('|')?
                .strip_suffix('|')?
                .split('|')
                .collect();
            let [name, _bytes, sha] = cells[..] else {
                return None;
            };
            let name = name.trim().strip_prefix('`')?.strip_suffix('`')?;
            let sha = sha.trim().strip_prefix('`')?.strip_suffix('`')?;
            (sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| (name.to_owned(), sha.to_owned()))
        })
        .collect()
}

/// The text of `tag`'s entry, empty when there is none.
fn entry_of<'a>(ledger: &'a str, tag: &str) -> &'a str {
    let open = format!("<!-- release {tag} -->\n");
    let close = format!("<!-- /release {tag} -->\n");
    let Some(start) = ledger.find(&open) else {
        return "";
    };
    match ledger[start..].find(&close) {
        Some(len) => &ledger[start..start + len],
        None => "",
    }
}

/// Writes or replaces the entry; returns whether the file changed.
pub fn write(
    ws: &Workspace,
    source: &Source,
    manifest: &Manifest,
    places: &[Place],
) -> anyhow::Result<bool> {
    let path = ws.root.join(LEDGER);
    let old = fs::read_to_string(&path).unwrap_or_default();
    let new = upsert(&old, &source.tag, &entry(ws, source, manifest, places));
    if new == old {
        return Ok(false);
    }
    fs::write(&path, new).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(true)
}

/// `ledger` with `entry` for `tag`: replaced where it was, else inserted first.
pub fn upsert(ledger: &str, tag: &str, entry: &str) -> String {
    let ledger = if ledger.trim().is_empty() {
        HEADER
    } else {
        ledger
    };
    let open = format!("<!-- release {tag} -->\n");
    let close = format!("<!-- /release {tag} -->\n");
    if let (Some(start), Some(end)) = (ledger.find(&open), ledger.find(&close)) {
        if start < end {
            return format!(
                "{}{entry}{}",
                &ledger[..start],
                &ledger[end + close.len()..]
            );
        }
    }
    match ledger.find("<!-- release ") {
        Some(first) => format!("{}{entry}\n{}", &ledger[..first], &ledger[first..]),
        None => format!(
            "{}\n{entry}",
            ledger.trim_end_matches('\n').to_owned() + "\n"
        ),
    }
}

/// `YYYY-MM-DD` of a Unix time (days-from-civil, inverted; Howard Hinnant's algorithm).
pub fn utc_date(epoch: i64) -> String {
    let z = epoch.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(utc_date(0), "1970-01-01");
        assert_eq!(utc_date(1_700_000_000), "2023-11-14");
        assert_eq!(utc_date(951_782_400), "2000-02-29");
    }

    #[test]
    fn an_entry_lists_places_artifacts_and_images_and_keeps_its_places_on_rewrite() {
        use crate::checksums::ManifestImage;
        let ws = Workspace {
            root: std::path::PathBuf::from("/nonexistent"),
            config: crate::ReleaseConfig::parse(include_str!("../../release.toml")).unwrap(),
        };
        let source = Source {
            tag: "v0.1.0".into(),
            version: "0.1.0".into(),
            commit: "c".repeat(40),
            commit_time: 1_700_000_000,
        };
        let manifest: Manifest = serde_json::from_value(serde_json::json!({
            "dist_version": "xtask 0.1.0", "announcement_tag": "v0.1.0",
            "announcement_is_prerelease": false, "source": {}, "releases": [],
            "artifacts": {"w.whl": {"name": "w.whl", "kind": "python-wheel", "size": 5,
                                    "checksums": {"sha256": "a".repeat(64)}}},
            "upload_files": [], "baseline": {}, "tools": {}, "build": {}, "audit": {},
        }))
        .unwrap();
        let mut with_images = manifest.clone();
        with_images.images.insert(
            "vllm-musa".into(),
            ManifestImage {
                reference: "ghcr.io/o/vllm-musa:0.1.0".into(),
                digest: format!("sha256:{}", "d".repeat(64)),
                base: format!("r.example/vllm:1@sha256:{}", "b".repeat(64)),
                recipe: "images/vllm-musa".into(),
                wheel_sha256: "a".repeat(64),
            },
        );
        let places = [Place {
            name: "PyPI".into(),
            url: "https://p/1".into(),
        }];
        let first = upsert("", "v0.1.0", &entry(&ws, &source, &manifest, &places));
        assert!(!first.contains("| image |"));
        // What `cargo xtask images` does: rewrite the entry with the places it already had.
        let kept = places_in(&first, "v0.1.0");
        let second = upsert(&first, "v0.1.0", &entry(&ws, &source, &with_images, &kept));
        assert!(
            second.contains("- Published: PyPI <https://p/1>"),
            "{second}"
        );
        assert!(second.contains(&format!(
            "| `ghcr.io/o/vllm-musa:0.1.0` | `sha256:{}` | `r.example/vllm:1@sha256:{}` |",
            "d".repeat(64),
            "b".repeat(64)
        )));
        assert!(second.contains(&format!("| `w.whl` | 5 | `{}` |", "a".repeat(64))));
        assert_eq!(second.matches("<!-- release v0.1.0 -->").count(), 1);
    }

    #[test]
    fn places_are_read_back_from_an_entry() {
        let ledger =
            "# Releases\n\n<!-- release v0.2.0 -->\n## v0.2.0\n- Published: PyPI <https://p/2>\n\
                      <!-- /release v0.2.0 -->\n\n<!-- release v0.1.0 -->\n## v0.1.0\n\
                      - Published: GitHub Releases <https://g/1>\n- Published: PyPI <https://p/1>\n\
                      <!-- /release v0.1.0 -->\n";
        let places = places_in(ledger, "v0.1.0");
        assert_eq!(
            places,
            [
                Place {
                    name: "GitHub Releases".into(),
                    url: "https://g/1".into()
                },
                Place {
                    name: "PyPI".into(),
                    url: "https://p/1".into()
                },
            ]
        );
        assert_eq!(places_in(ledger, "v0.2.0").len(), 1);
        assert!(places_in(ledger, "v0.3.0").is_empty());
    }

    #[test]
    fn entries_are_inserted_newest_first_and_replaced_in_place() {
        let e1 = "<!-- release v0.1.0 -->\n## v0.1.0\nA\n<!-- /release v0.1.0 -->\n";
        let e2 = "<!-- release v0.2.0 -->\n## v0.2.0\nB\n<!-- /release v0.2.0 -->\n";
        let l1 = upsert("", "v0.1.0", e1);
        assert!(l1.starts_with("# Releases"));
        let l2 = upsert(&l1, "v0.2.0", e2);
        assert!(l2.find("v0.2.0").unwrap() < l2.find("v0.1.0").unwrap());
        assert_eq!(
            upsert(&l2, "v0.1.0", e1),
            l2,
            "a re-run writes the same bytes"
        );
        let e1b = e1.replace('A', "A2");
        let l3 = upsert(&l2, "v0.1.0", &e1b);
        assert!(l3.contains("A2") && !l3.contains("A\n") && l3.contains("B\n"));
    }
}
