//! `publication.json`: where a release was published, written as it happens.
//!
//! The manifest (`checksums.rs`) is frozen at the `checksums` phase: it is listed in
//! `sha256.sum`, uploaded to the draft and attested, so it cannot learn afterwards what
//! publishing found out. This record can: the GitHub release and the index with every file's
//! download URL and sha256 (`publish undraft`), the pushed images by digest (`images`), the
//! attestations (`record-attestation`). It names the `sha256.sum` and the manifest it belongs
//! to by their sha256, holds no time, and is written with sorted keys, so a re-run writes the
//! same bytes. It is the one asset of a release that changes after the release is public
//! (`cargo xtask publish record` replaces it), and the source `RELEASES.md` is rendered from
//! (`ledger.rs`); `verify --published` compares every place with it.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::checksums::{
    sha256_file, AttestedSubject, Manifest, ManifestAttestation, ManifestImage, MANIFEST, SUMS,
};

pub const PUBLICATION: &str = "publication.json";

/// The record of one release's publication.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publication {
    pub tag: String,
    /// sha256 of the `sha256.sum` this record belongs to (the one on the release).
    pub sums_sha256: String,
    /// sha256 of the `dist-manifest.json` this record belongs to.
    pub manifest_sha256: String,
    /// The GitHub release, once public.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub github: Option<Place>,
    /// The package index, once it holds the wheel and the sdist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<Place>,
    /// Serving images pushed for this release, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub images: BTreeMap<String, ManifestImage>,
    /// What the release workflow attested (GitHub artifact attestations).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attestations: Vec<ManifestAttestation>,
}

/// Where a release was published: its page, and every file as that place serves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Place {
    /// `GitHub Releases` or `PyPI`, for people.
    pub name: String,
    /// The release's page, or the project's page on the index.
    pub url: String,
    /// File name -> where to download it and the sha256 the place reported.
    #[serde(default)]
    pub files: BTreeMap<String, PlacedFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacedFile {
    pub url: String,
    pub sha256: String,
}

/// What a publish step did: where, and which files it uploaded or found already identical.
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
}

impl Publication {
    /// An empty record for the release in `dist` (nothing published yet).
    pub fn new(dist: &Path, manifest: &Manifest) -> anyhow::Result<Publication> {
        Ok(Publication {
            tag: manifest.announcement_tag.clone(),
            sums_sha256: sha256_file(&dist.join(SUMS))?.0,
            manifest_sha256: sha256_file(&dist.join(MANIFEST))?.0,
            github: None,
            index: None,
            images: BTreeMap::new(),
            attestations: Vec::new(),
        })
    }

    /// The record in `dist`, or a new one; a record of other sums or another manifest (a
    /// rebuilt directory) is refused.
    pub fn load_or_new(dist: &Path, manifest: &Manifest) -> anyhow::Result<Publication> {
        let fresh = Publication::new(dist, manifest)?;
        let Some(old) = read(dist)? else {
            return Ok(fresh);
        };
        if (&old.tag, &old.sums_sha256, &old.manifest_sha256)
            != (&fresh.tag, &fresh.sums_sha256, &fresh.manifest_sha256)
        {
            bail!(
                "{} records {} with sha256.sum {} and manifest {}, but {} holds {} with {} and \
                 {}: it belongs to another build. Move it away if this directory was rebuilt \
                 on purpose; never publish two builds under one tag.",
                dist.join(PUBLICATION).display(),
                old.tag,
                old.sums_sha256,
                old.manifest_sha256,
                dist.display(),
                fresh.tag,
                fresh.sums_sha256,
                fresh.manifest_sha256
            );
        }
        Ok(old)
    }

    /// Every file a place serves, with the sha256 `sha256.sum` gives it: a place cannot be
    /// recorded with other bytes than the release's.
    pub fn check_place(&self, dist: &Path, place: &Place) -> anyhow::Result<()> {
        let sums = crate::checksums::parse_sums(&fs::read_to_string(dist.join(SUMS))?)?;
        for (name, f) in &place.files {
            let want = if name == SUMS {
                Some(self.sums_sha256.as_str())
            } else {
                sums.iter()
                    .find(|l| &l.name == name)
                    .map(|l| l.sha256.as_str())
            };
            if want != Some(f.sha256.as_str()) {
                bail!(
                    "{}: {name} has sha256 {} there, the release directory {}",
                    place.name,
                    f.sha256,
                    want.map_or("does not list it".to_owned(), |w| format!("says {w}"))
                );
            }
        }
        Ok(())
    }

    /// Adds `attestation` once: a re-run records nothing twice.
    pub fn record_attestation(&mut self, mut attestation: ManifestAttestation) {
        attestation.subjects.sort();
        if !self.attestations.contains(&attestation) {
            self.attestations.push(attestation);
        }
    }

    /// The image recorded under `name` (a repository, `host/path`) with `digest`.
    pub fn image_by_digest(&self, subject: &AttestedSubject) -> Option<&ManifestImage> {
        self.images.values().find(|i| {
            crate::image_reference::ImageRef::parse(&i.reference)
                .is_ok_and(|r| r.name == subject.name)
                && i.digest == subject.digest
        })
    }

    /// The record as written: pretty JSON, keys in a fixed order, a final newline.
    pub fn to_bytes(&self) -> anyhow::Result<Vec<u8>> {
        Ok((serde_json::to_string_pretty(self)? + "\n").into_bytes())
    }

    pub fn parse(bytes: &[u8]) -> anyhow::Result<Publication> {
        serde_json::from_slice(bytes).context("not a publication record (publication.json)")
    }
}

/// `dist/publication.json`, if there is one.
pub fn read(dist: &Path) -> anyhow::Result<Option<Publication>> {
    let path = dist.join(PUBLICATION);
    match fs::read(&path) {
        Ok(bytes) => Publication::parse(&bytes)
            .with_context(|| format!("{}", path.display()))
            .map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Writes `dist/publication.json`; returns whether its bytes changed.
pub fn write(dist: &Path, record: &Publication) -> anyhow::Result<bool> {
    let path = dist.join(PUBLICATION);
    let bytes = record.to_bytes()?;
    if fs::read(&path).ok().as_deref() == Some(&bytes[..]) {
        return Ok(false);
    }
    fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksums::tests::{standin_manifest, temp_dir};

    #[test]
    fn a_record_belongs_to_one_build_and_checks_what_a_place_serves() {
        let dir = temp_dir("publication");
        let m = standin_manifest(&dir);
        crate::checksums::write(&dir, &m).unwrap();
        let mut r = Publication::load_or_new(&dir, &m).unwrap();
        assert_eq!(r.tag, "v0.1.0");
        let wheel = "standin-0.1.0-py3-none-any.whl";
        let sha = m.artifacts[wheel].sha256().unwrap().to_owned();
        let mut place = Place {
            name: "PyPI".into(),
            url: "https://i/p/".into(),
            files: BTreeMap::from([(
                wheel.to_owned(),
                PlacedFile {
                    url: "https://i/w".into(),
                    sha256: sha.clone(),
                },
            )]),
        };
        r.check_place(&dir, &place).unwrap();
        r.index = Some(place.clone());
        assert!(write(&dir, &r).unwrap());
        assert!(!write(&dir, &r).unwrap(), "the same record, the same bytes");
        assert_eq!(read(&dir).unwrap(), Some(r.clone()));
        assert_eq!(Publication::load_or_new(&dir, &m).unwrap(), r);
        let text = String::from_utf8(r.to_bytes().unwrap()).unwrap();
        assert!(
            !text.contains("\"images\"") && !text.contains("\"github\""),
            "{text}"
        );

        place.files.get_mut(wheel).unwrap().sha256 = "0".repeat(64);
        let err = r.check_place(&dir, &place).unwrap_err().to_string();
        assert!(err.contains(&format!("directory says {sha}")), "{err}");

        // The directory rebuilt with other bytes: the old record is not theirs.
        std::fs::write(dir.join(wheel), b"rebuilt").unwrap();
        let mut m2 = m.clone();
        m2.artifacts.insert(
            wheel.into(),
            crate::checksums::ManifestArtifact::file(&dir.join(wheel), "python-wheel", vec![])
                .unwrap(),
        );
        crate::checksums::write(&dir, &m2).unwrap();
        let err = Publication::load_or_new(&dir, &m2).unwrap_err().to_string();
        assert!(err.contains("it belongs to another build"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
