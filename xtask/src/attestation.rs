//! `cargo xtask record-attestation <dir-or-tag> <bundle>...`: record in the release's publication
//! record (`publication.json`) what the release workflow attested
//! (`actions/attest-build-provenance`): per attestation, its predicate type and every subject with
//! its digest, read from the Sigstore bundles the action writes (`bundle-path`). Signatures are
//! GitHub's and Sigstore's to check (`gh attestation verify`); this checks that each subject is a
//! file of the release with those bytes (`sha256.sum` and the manifest included: neither changes
//! after the `checksums` phase), or one of the recorded images with that digest, before anything
//! is recorded.

use std::path::Path;

use anyhow::{bail, format_err, Context};
use base64::Engine;
use serde::Deserialize;
use xshell::Shell;

use crate::checksums::{self, AttestedSubject, Manifest, ManifestAttestation, MANIFEST, SUMS};
use crate::flags;
use crate::publication::{self, Publication};

impl flags::RecordAttestation {
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        let dist = checksums::resolve_dir(&sh.current_dir(), &self.dir_or_tag);
        checksums::verify_dir(&dist)?;
        let manifest = checksums::read_manifest(&dist)?;
        let mut record = Publication::load_or_new(&dist, &manifest)?;
        for bundle in &self.bundles {
            let text = std::fs::read_to_string(bundle)
                .with_context(|| format!("cannot read {}", bundle.display()))?;
            for attestation in parse_bundles(&text)
                .with_context(|| format!("{} is not an attestation bundle", bundle.display()))?
            {
                check_subjects(&dist, &manifest, &record, &attestation)?;
                println!(
                    "{}: {} subjects attested ({})",
                    bundle.display(),
                    attestation.subjects.len(),
                    attestation.predicate_type
                );
                record.record_attestation(attestation);
            }
        }
        publication::write(&dist, &record)?;
        Ok(())
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Bundle {
    dsse_envelope: Envelope,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    payload: String,
    payload_type: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Statement {
    subject: Vec<Subject>,
    predicate_type: String,
}

#[derive(Deserialize)]
struct Subject {
    name: String,
    digest: std::collections::BTreeMap<String, String>,
}

/// The in-toto statements of a Sigstore bundle file: one JSON bundle, or JSON Lines of them.
pub fn parse_bundles(text: &str) -> anyhow::Result<Vec<ManifestAttestation>> {
    let bundles: Vec<Bundle> = match serde_json::from_str::<Bundle>(text) {
        Ok(one) => vec![one],
        Err(_) => text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()
            .context("expected a Sigstore bundle with a DSSE envelope (JSON, or JSON Lines)")?,
    };
    bundles.into_iter().map(statement).collect()
}

fn statement(bundle: Bundle) -> anyhow::Result<ManifestAttestation> {
    let envelope = bundle.dsse_envelope;
    if envelope.payload_type != "application/vnd.in-toto+json" {
        bail!(
            "DSSE payload type {:?}, expected an in-toto statement",
            envelope.payload_type
        );
    }
    let payload = base64::engine::general_purpose::STANDARD
        .decode(envelope.payload.as_bytes())
        .context("the DSSE payload is not base64")?;
    let statement: Statement =
        serde_json::from_slice(&payload).context("the DSSE payload is not an in-toto statement")?;
    let subjects = statement
        .subject
        .into_iter()
        .map(|s| {
            let sha = s
                .digest
                .get("sha256")
                .ok_or_else(|| format_err!("subject {:?} has no sha256 digest", s.name))?;
            Ok(AttestedSubject {
                name: s.name,
                digest: format!("sha256:{sha}"),
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if subjects.is_empty() {
        bail!("the statement names no subject");
    }
    Ok(ManifestAttestation {
        predicate_type: statement.predicate_type,
        subjects,
    })
}

/// Every subject is ours: a release file with those bytes, or a recorded image by name with that
/// digest.
pub fn check_subjects(
    dist: &Path,
    manifest: &Manifest,
    record: &Publication,
    attestation: &ManifestAttestation,
) -> anyhow::Result<()> {
    for s in &attestation.subjects {
        let ours = match s.name.as_str() {
            SUMS => Some(record.sums_sha256.clone()),
            MANIFEST => Some(record.manifest_sha256.clone()),
            name => manifest
                .artifacts
                .get(name)
                .map(|a| a.sha256().unwrap_or_default().to_owned()),
        };
        if let Some(ours) = ours {
            let ours = format!("sha256:{ours}");
            if ours != s.digest {
                bail!(
                    "the attestation names {} with {}, but the release holds {ours}: it attests \
                     other bytes; nothing was recorded",
                    s.name,
                    s.digest
                );
            }
            continue;
        }
        if record.image_by_digest(s).is_none() {
            bail!(
                "the attestation names {} ({}), which is neither a file of {} nor one of its \
                 images by digest; nothing was recorded",
                s.name,
                s.digest,
                dist.display()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(subjects: &[(&str, &str)]) -> String {
        let statement = serde_json::json!({
            "_type": "https://in-toto.io/Statement/v1",
            "subject": subjects.iter().map(|(n, d)| serde_json::json!({"name": n, "digest": {"sha256": d}})).collect::<Vec<_>>(),
            "predicateType": "https://slsa.dev/provenance/v1",
            "predicate": {},
        });
        let payload = base64::engine::general_purpose::STANDARD.encode(statement.to_string());
        serde_json::json!({
            "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
            "verificationMaterial": {},
            "dsseEnvelope": {"payload": payload, "payloadType": "application/vnd.in-toto+json", "signatures": []},
        })
        .to_string()
    }

    #[test]
    fn bundles_give_their_subjects_in_one_file_or_as_json_lines() {
        let one = bundle(&[("x.whl", "aa"), ("sha256.sum", "bb")]);
        let a = parse_bundles(&one).unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].predicate_type, "https://slsa.dev/provenance/v1");
        assert_eq!(
            a[0].subjects[0],
            AttestedSubject {
                name: "x.whl".into(),
                digest: "sha256:aa".into()
            }
        );
        let lines = format!("{one}\n{}\n", bundle(&[("ghcr.io/o/img", "cc")]));
        assert_eq!(parse_bundles(&lines).unwrap().len(), 2);
        assert!(parse_bundles("{\"x\": 1}").is_err());
    }

    #[test]
    fn subjects_are_checked_against_the_release_then_recorded_once() {
        use crate::checksums::tests::{standin_manifest, temp_dir};
        let dir = temp_dir("attestation");
        checksums::write(&dir, &standin_manifest(&dir)).unwrap();
        let m = checksums::read_manifest(&dir).unwrap();
        let r = Publication::new(&dir, &m).unwrap();
        let wheel = "standin-0.1.0-py3-none-any.whl";
        let sha = m.artifacts[wheel].sha256().unwrap().to_owned();
        let check = |subjects: &[(&str, &str)]| {
            let a = parse_bundles(&bundle(subjects)).unwrap().remove(0);
            check_subjects(&dir, &m, &r, &a).map(|()| a)
        };
        // Other bytes, or a subject that is not ours: refused, naming it.
        let err = check(&[(wheel, "00")]).unwrap_err().to_string();
        assert!(err.contains("it attests other bytes"), "{err}");
        let err = check(&[("ghcr.io/o/other", "11")]).unwrap_err().to_string();
        assert!(
            err.contains("ghcr.io/o/other (sha256:11), which is neither"),
            "{err}"
        );
        // The manifest as it is: it never changes after the checksums phase.
        let err = check(&[(MANIFEST, "22")]).unwrap_err().to_string();
        assert!(err.contains("it attests other bytes"), "{err}");
        let good = bundle(&[(wheel, &sha), (MANIFEST, &r.manifest_sha256)]);
        check(&[(wheel, &sha), (MANIFEST, &r.manifest_sha256)]).unwrap();

        let path = dir.join("bundle.json");
        std::fs::write(&path, &good).unwrap();
        let sh = Shell::new().unwrap();
        for _ in 0..2 {
            flags::RecordAttestation {
                dir_or_tag: dir.display().to_string(),
                bundles: vec![path.clone()],
            }
            .run(&sh)
            .unwrap();
        }
        let recorded = publication::read(&dir).unwrap().unwrap().attestations;
        assert_eq!(recorded.len(), 1, "a re-run records nothing twice");
        assert_eq!(recorded[0].subjects.len(), 2);
        assert!(recorded[0].subjects.contains(&AttestedSubject {
            name: wheel.into(),
            digest: format!("sha256:{sha}"),
        }));
        checksums::verify_dir(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
