//! Phase `ledger`: the release's entry in `RELEASES.md`.
//!
//! One entry per tag between `<!-- release <tag> -->` markers, newest first, rendered from the
//! release's manifest (tag, commit, commit date, artifacts) and its publication record
//! (`publication.rs`: places, images). Nothing is ever read back from this file but the markers
//! that say where the tag's entry goes. The entry depends only on the release, never on the
//! clock, so a re-run writes the same bytes and a re-publish replaces the entry in place.

use std::fs;

use anyhow::Context;

use crate::checksums::Manifest;
use crate::publication::Publication;
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

/// The entry of a release: `record` is `None` before anything was published (`--dry-run`).
pub fn entry(
    ws: &Workspace,
    source: &Source,
    manifest: &Manifest,
    record: Option<&Publication>,
) -> String {
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
    let places = record.into_iter().flat_map(|r| [&r.github, &r.index]);
    for p in places.flatten() {
        out.push_str(&format!("- Published: {} <{}>\n", p.name, p.url));
    }
    out.push_str("\n| artifact | bytes | SHA256 |\n|---|---:|---|\n");
    for a in manifest.artifacts.values() {
        if let (Some(sha), Some(size)) = (a.sha256(), a.size) {
            out.push_str(&format!("| `{}` | {size} | `{sha}` |\n", a.name));
        }
    }
    let images = record.map(|r| &r.images).filter(|i| !i.is_empty());
    if let Some(images) = images {
        out.push_str("\n| image | digest | base |\n|---|---|---|\n");
        for i in images.values() {
            out.push_str(&format!(
                "| `{}` | `{}` | `{}` |\n",
                i.reference, i.digest, i.base
            ));
        }
    }
    out.push_str(&format!("<!-- /release {} -->\n", source.tag));
    out
}

/// Writes or replaces the entry; returns whether the file changed.
pub fn write(
    ws: &Workspace,
    source: &Source,
    manifest: &Manifest,
    record: &Publication,
) -> anyhow::Result<bool> {
    let path = ws.root.join(LEDGER);
    let old = fs::read_to_string(&path).unwrap_or_default();
    let new = upsert(
        &old,
        &source.tag,
        &entry(ws, source, manifest, Some(record)),
    );
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
pub(crate) mod tests {
    use super::*;
    use crate::checksums::ManifestImage;

    /// The repository's release.toml at `root`.
    pub(crate) fn workspace(root: &std::path::Path) -> Workspace {
        Workspace {
            root: root.to_path_buf(),
            config: crate::ReleaseConfig::parse(include_str!("../../release.toml")).unwrap(),
        }
    }

    pub(crate) fn source() -> Source {
        Source {
            tag: "v0.1.0".into(),
            version: "0.1.0".into(),
            commit: "c".repeat(40),
            commit_time: 1_700_000_000,
        }
    }

    /// The vllm-musa image of `registry` with the digest `d` repeated.
    pub(crate) fn image(registry: &str, d: char) -> ManifestImage {
        ManifestImage {
            reference: format!("{registry}/vllm-musa:0.1.0"),
            digest: format!("sha256:{}", d.to_string().repeat(64)),
            base: format!("{registry}/base:1@sha256:{}", "b".repeat(64)),
            recipe: "images/vllm-musa".into(),
            wheel_sha256: "a".repeat(64),
        }
    }

    #[test]
    fn dates() {
        assert_eq!(utc_date(0), "1970-01-01");
        assert_eq!(utc_date(1_700_000_000), "2023-11-14");
        assert_eq!(utc_date(951_782_400), "2000-02-29");
    }

    #[test]
    fn an_entry_is_rendered_from_the_manifest_and_the_publication_record() {
        use crate::publication::Place;
        let ws = workspace(std::path::Path::new("/nonexistent"));
        let source = source();
        let manifest: Manifest = serde_json::from_value(serde_json::json!({
            "dist_version": "xtask 0.1.0", "announcement_tag": "v0.1.0",
            "announcement_is_prerelease": false, "source": {}, "releases": [],
            "artifacts": {"w.whl": {"name": "w.whl", "kind": "python-wheel", "size": 5,
                                    "checksums": {"sha256": "a".repeat(64)}}},
            "upload_files": [], "baseline": {}, "tools": {}, "build": {}, "audit": {},
        }))
        .unwrap();
        let mut record: Publication = serde_json::from_value(serde_json::json!({
            "tag": "v0.1.0", "sums_sha256": "1".repeat(64), "manifest_sha256": "2".repeat(64),
        }))
        .unwrap();
        let dry = entry(&ws, &source, &manifest, None);
        assert!(
            !dry.contains("- Published:") && !dry.contains("| image |"),
            "{dry}"
        );
        record.index = Some(Place {
            name: "PyPI".into(),
            url: "https://p/1".into(),
            files: Default::default(),
        });
        let first = upsert("", "v0.1.0", &entry(&ws, &source, &manifest, Some(&record)));
        assert!(first.contains("- Published: PyPI <https://p/1>"), "{first}");
        assert!(!first.contains("| image |"));
        // What `cargo xtask images` does: the same record, now with the images.
        record
            .images
            .insert("vllm-musa".into(), image("ghcr.io/o", 'd'));
        let second = upsert(
            &first,
            "v0.1.0",
            &entry(&ws, &source, &manifest, Some(&record)),
        );
        assert!(
            second.contains("- Published: PyPI <https://p/1>"),
            "{second}"
        );
        assert!(second.contains(&format!(
            "| `ghcr.io/o/vllm-musa:0.1.0` | `sha256:{}` | `ghcr.io/o/base:1@sha256:{}` |",
            "d".repeat(64),
            "b".repeat(64)
        )));
        assert!(second.contains(&format!("| `w.whl` | 5 | `{}` |", "a".repeat(64))));
        assert_eq!(second.matches("<!-- release v0.1.0 -->").count(), 1);
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
