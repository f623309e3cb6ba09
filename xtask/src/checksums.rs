//! Phase `checksums`: `sha256.sum` (the `sha256sum -c` format) and `dist-manifest.json`, and
//! their verification (`cargo xtask verify`).
//!
//! The manifest follows cargo-dist's `dist-manifest.json` where it fits: `announcement_tag`,
//! `releases[] {app_name, app_version, artifacts, hosting.github}`, `artifacts{name: {kind,
//! target_triples, checksums: {sha256}}}`, `upload_files`. It adds what cargo-dist has no place
//! for: the source commit, the baseline wanted and found, the tools, the audit, and under
//! `releases[].hosting` every place the release goes to (GitHub repository and tag, index and
//! project, image repositories and tags), as release.toml names them. It holds no path, time or
//! host name, so two clones on one host write the same bytes. It is never written again after
//! this phase: what publishing finds out goes into `publication.json` (`publication.rs`).

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, format_err, Context};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::image_reference::ImageRef;

pub const SUMS: &str = "sha256.sum";
pub const MANIFEST: &str = "dist-manifest.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// `xtask <version>`, as cargo-dist writes `dist_version`.
    pub dist_version: String,
    pub announcement_tag: String,
    pub announcement_is_prerelease: bool,
    pub source: serde_json::Value,
    pub releases: Vec<ManifestRelease>,
    pub artifacts: BTreeMap<String, ManifestArtifact>,
    /// Files a release uploads, in upload order.
    pub upload_files: Vec<String>,
    pub baseline: serde_json::Value,
    pub tools: BTreeMap<String, String>,
    pub build: serde_json::Value,
    pub audit: serde_json::Value,
}

/// One signed attestation: its in-toto predicate and the subjects it names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestAttestation {
    /// e.g. `https://slsa.dev/provenance/v1` (build provenance).
    pub predicate_type: String,
    pub subjects: Vec<AttestedSubject>,
}

/// A file (by its release file name) or an image (by its name), with the digest attested.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AttestedSubject {
    pub name: String,
    /// `sha256:<hex>`.
    pub digest: String,
}

/// One pushed image: pull it as `<reference without tag>@<digest>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestImage {
    /// `host/path:version`.
    pub reference: String,
    /// `sha256:<hex>` of the image manifest the registry serves.
    pub digest: String,
    /// The base it was built from, `host/path:tag@sha256:<hex>`.
    pub base: String,
    /// The recipe directory.
    pub recipe: String,
    /// SHA256 of the wheel installed in it.
    pub wheel_sha256: String,
}

impl ManifestImage {
    /// `host/path@sha256:<hex>`.
    pub fn by_digest(&self) -> String {
        let name = ImageRef::parse(&self.reference)
            .map(|r| r.name)
            .unwrap_or_else(|_| self.reference.clone());
        format!("{name}@{}", self.digest)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestRelease {
    pub app_name: String,
    pub app_version: String,
    pub artifacts: Vec<String>,
    pub hosting: serde_json::Value,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestArtifact {
    pub name: String,
    /// cargo-dist kinds where they exist (`source-tarball`, `unified-checksum`), else
    /// `python-wheel`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_triples: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub checksums: BTreeMap<String, String>,
}

impl ManifestArtifact {
    pub fn file(
        path: &Path,
        kind: &str,
        target_triples: Vec<String>,
    ) -> anyhow::Result<ManifestArtifact> {
        let (sha256, size) = sha256_file(path)?;
        Ok(ManifestArtifact {
            name: file_name(path)?,
            kind: kind.to_owned(),
            target_triples,
            size: Some(size),
            checksums: BTreeMap::from([("sha256".to_owned(), sha256)]),
        })
    }

    pub fn sha256(&self) -> Option<&str> {
        self.checksums.get("sha256").map(String::as_str)
    }
}

/// Hex SHA-256 and size of a file, streamed.
pub fn sha256_file(path: &Path) -> anyhow::Result<(String, u64)> {
    let mut f = fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok((hex(&hasher.finalize()), size))
}

pub fn sha256_bytes(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn file_name(path: &Path) -> anyhow::Result<String> {
    path.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .ok_or_else(|| format_err!("{} has no UTF-8 file name", path.display()))
}

/// Reads `dist-manifest.json` of a release directory.
pub fn read_manifest(dir: &Path) -> anyhow::Result<Manifest> {
    let path = dir.join(MANIFEST);
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a release manifest", path.display()))
}

/// Writes `dist-manifest.json` and then `sha256.sum` over the artifacts and the manifest.
pub fn write(dir: &Path, manifest: &Manifest) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(manifest)? + "\n";
    fs::write(dir.join(MANIFEST), json)?;
    let mut names: Vec<&str> = manifest
        .artifacts
        .values()
        .filter(|a| a.sha256().is_some())
        .map(|a| a.name.as_str())
        .collect();
    names.push(MANIFEST);
    names.sort();
    let mut sums = String::new();
    for name in names {
        let (sha, _) = sha256_file(&dir.join(name))?;
        sums.push_str(&format!("{sha}  {name}\n"));
    }
    fs::write(dir.join(SUMS), sums)?;
    Ok(())
}

/// One line of `sha256.sum`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SumLine {
    pub sha256: String,
    pub name: String,
}

/// Parses `sha256sum` output: `<64 hex>  <name>` (text mode) or `<64 hex> *<name>` (binary).
pub fn parse_sums(text: &str) -> anyhow::Result<Vec<SumLine>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = || {
            format_err!(
                "{SUMS} line {}: expected `<sha256>  <file name>`, got {line:?}",
                i + 1
            )
        };
        let (sha, rest) = line.split_once(' ').ok_or_else(bad)?;
        let name = rest
            .strip_prefix(' ')
            .or_else(|| rest.strip_prefix('*'))
            .ok_or_else(bad)?;
        if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) || name.is_empty() {
            return Err(bad());
        }
        if name.contains('/') || name.starts_with('.') {
            bail!("{SUMS} line {}: {name:?} is not a plain file name", i + 1);
        }
        out.push(SumLine {
            sha256: sha.to_ascii_lowercase(),
            name: name.to_owned(),
        });
    }
    if out.is_empty() {
        bail!("{SUMS} lists no file");
    }
    Ok(out)
}

/// What `verify` found.
#[derive(Debug)]
pub struct Verified {
    pub files: Vec<(String, u64)>,
}

/// Re-hashes every file listed in `sha256.sum`, then checks that the manifest's artifacts agree
/// with the files. Any mismatch is an error naming the file and both digests.
pub fn verify_dir(dir: &Path) -> anyhow::Result<Verified> {
    let sums_path = dir.join(SUMS);
    let text = fs::read_to_string(&sums_path).with_context(|| {
        format!(
            "cannot read {}: is this a release directory?",
            sums_path.display()
        )
    })?;
    let lines = parse_sums(&text)?;
    let mut files = Vec::new();
    let mut problems = Vec::new();
    for line in &lines {
        let path = dir.join(&line.name);
        if !path.exists() {
            problems.push(format!("{}: listed in {SUMS} but missing", line.name));
            continue;
        }
        let (sha, size) = sha256_file(&path)?;
        if sha != line.sha256 {
            problems.push(format!(
                "{}: {SUMS} says {}, the file is {sha}",
                line.name, line.sha256
            ));
        } else {
            files.push((line.name.clone(), size));
        }
    }
    if lines.iter().any(|l| l.name == MANIFEST) && dir.join(MANIFEST).exists() {
        let manifest: Manifest = serde_json::from_str(&fs::read_to_string(dir.join(MANIFEST))?)
            .with_context(|| {
                format!("{} is not a release manifest", dir.join(MANIFEST).display())
            })?;
        for a in manifest.artifacts.values() {
            let Some(want) = a.sha256() else { continue };
            match lines.iter().find(|l| l.name == a.name) {
                None => problems.push(format!("{}: in {MANIFEST} but not in {SUMS}", a.name)),
                Some(l) if l.sha256 != want => problems.push(format!(
                    "{}: {MANIFEST} says {want}, {SUMS} says {}",
                    a.name, l.sha256
                )),
                Some(_) => {}
            }
        }
    } else {
        problems.push(format!("{MANIFEST}: not listed in {SUMS} or missing"));
    }
    if !problems.is_empty() {
        bail!(
            "{} does not match its recorded sums:\n    {}\nDo not use these files: download them \
             again from the release, or rebuild the tag.",
            dir.display(),
            problems.join("\n    ")
        );
    }
    Ok(Verified { files })
}

/// `target/dist/<tag>` for a tag, the directory itself otherwise.
pub fn resolve_dir(root: &Path, dir_or_tag: &str) -> PathBuf {
    let as_path = Path::new(dir_or_tag);
    if as_path.is_dir() {
        return as_path.to_path_buf();
    }
    root.join("target").join("dist").join(dir_or_tag)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("xtask-checksums-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    pub(crate) fn standin_manifest(dir: &Path) -> Manifest {
        fs::write(
            dir.join("standin-0.1.0-py3-none-any.whl"),
            b"stand-in wheel bytes",
        )
        .unwrap();
        fs::write(dir.join("standin-0.1.0.tar.gz"), b"stand-in sdist bytes").unwrap();
        let mut artifacts = BTreeMap::new();
        for (n, k) in [
            ("standin-0.1.0-py3-none-any.whl", "python-wheel"),
            ("standin-0.1.0.tar.gz", "source-tarball"),
        ] {
            artifacts.insert(
                n.to_owned(),
                ManifestArtifact::file(&dir.join(n), k, vec![]).unwrap(),
            );
        }
        Manifest {
            dist_version: "xtask 0.1.0".into(),
            announcement_tag: "v0.1.0".into(),
            announcement_is_prerelease: false,
            source: serde_json::json!({}),
            releases: vec![],
            artifacts,
            upload_files: vec![],
            baseline: serde_json::json!({}),
            tools: BTreeMap::new(),
            build: serde_json::json!({}),
            audit: serde_json::json!({}),
        }
    }

    #[test]
    fn an_image_is_pulled_by_its_repository_and_digest() {
        let image = ManifestImage {
            reference: "127.0.0.1:15000/test/vllm-musa:0.1.0".into(),
            digest: format!("sha256:{}", "a".repeat(64)),
            base: format!(
                "127.0.0.1:15000/test/base:bookworm@sha256:{}",
                "b".repeat(64)
            ),
            recipe: "images/vllm-musa".into(),
            wheel_sha256: "c".repeat(64),
        };
        assert_eq!(
            image.by_digest(),
            format!("127.0.0.1:15000/test/vllm-musa@sha256:{}", "a".repeat(64))
        );
    }

    #[test]
    fn sums_are_in_sha256sum_format_and_verify() {
        let dir = temp_dir("ok");
        write(&dir, &standin_manifest(&dir)).unwrap();
        let sums = fs::read_to_string(dir.join(SUMS)).unwrap();
        assert_eq!(sums.lines().count(), 3, "{sums}");
        assert!(sums.contains(&format!(
            "{}  standin-0.1.0.tar.gz\n",
            sha256_bytes(b"stand-in sdist bytes")
        )));
        // The real sha256sum agrees, where it exists.
        if let Ok(out) = std::process::Command::new("sha256sum")
            .arg("-c")
            .arg(SUMS)
            .current_dir(&dir)
            .output()
        {
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        let v = verify_dir(&dir).unwrap();
        assert_eq!(v.files.len(), 3);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_changed_or_missing_artifact_fails_verification_naming_it() {
        let dir = temp_dir("bad");
        write(&dir, &standin_manifest(&dir)).unwrap();
        fs::write(dir.join("standin-0.1.0-py3-none-any.whl"), b"tampered").unwrap();
        fs::remove_file(dir.join("standin-0.1.0.tar.gz")).unwrap();
        let err = verify_dir(&dir).unwrap_err().to_string();
        assert!(
            err.contains("standin-0.1.0-py3-none-any.whl: sha256.sum says"),
            "{err}"
        );
        assert!(
            err.contains("standin-0.1.0.tar.gz: listed in sha256.sum but missing"),
            "{err}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sum_lines_parse_both_modes_and_refuse_garbage() {
        let h = "a".repeat(64);
        let l = parse_sums(&format!("{h}  a.whl\n{h} *b.tar.gz\n")).unwrap();
        assert_eq!(l[1].name, "b.tar.gz");
        assert!(parse_sums("abc  a.whl").is_err());
        assert!(parse_sums(&format!("{h}  ../etc/passwd")).is_err());
        assert!(parse_sums("").is_err());
    }
}
