//! Reading an OCI image layout directory (`index.json`, `blobs/sha256/*`): the image's manifest
//! digest, which is the digest the registry will report once it is pushed unchanged, and the
//! labels of its configuration.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use anyhow::{bail, format_err, Context};
use serde::Deserialize;

use crate::checksums::sha256_bytes;
use crate::image_reference::is_sha256_digest;

const REF_NAME: &str = "org.opencontainers.image.ref.name";
const INDEX_MEDIA_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

#[derive(Debug, Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: String,
    digest: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct Manifest {
    config: Option<Descriptor>,
    #[serde(default)]
    manifests: Vec<Descriptor>,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
struct Config {
    #[serde(default)]
    config: ConfigBody,
}

#[derive(Debug, Default, Deserialize)]
struct ConfigBody {
    #[serde(default, rename = "Labels")]
    labels: Option<BTreeMap<String, String>>,
}

/// One image in a layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutImage {
    /// `sha256:<hex>` of the manifest (or of the index, for a multi-platform build).
    pub digest: String,
    /// A multi-platform index: pushed with `skopeo copy --all`.
    pub is_index: bool,
    pub labels: BTreeMap<String, String>,
    pub layers: usize,
}

/// The image tagged `tag` in the layout at `dir` (or its only image).
pub fn read(dir: &Path, tag: &str) -> anyhow::Result<LayoutImage> {
    let index: Index = serde_json::from_slice(
        &fs::read(dir.join("index.json"))
            .with_context(|| format!("{} is not an OCI image layout", dir.display()))?,
    )
    .with_context(|| format!("{}/index.json", dir.display()))?;
    let tagged: Vec<&Descriptor> = index
        .manifests
        .iter()
        .filter(|d| d.annotations.get(REF_NAME).map(String::as_str) == Some(tag))
        .collect();
    let top = match (&tagged[..], &index.manifests[..]) {
        ([one], _) => (*one).clone(),
        ([], [one]) => one.clone(),
        _ => bail!(
            "{}: expected one image tagged {tag:?}, found {} tagged and {} in all",
            dir.display(),
            tagged.len(),
            index.manifests.len()
        ),
    };
    let is_index = INDEX_MEDIA_TYPES.contains(&top.media_type.as_str());
    let manifest: Manifest = serde_json::from_slice(&blob(dir, &top.digest)?)
        .with_context(|| format!("manifest {}", top.digest))?;
    // Labels come from the (first) platform's configuration.
    let platform = if is_index {
        let first = manifest
            .manifests
            .first()
            .ok_or_else(|| format_err!("index {} lists no image", top.digest))?;
        serde_json::from_slice(&blob(dir, &first.digest)?)?
    } else {
        manifest
    };
    let config = platform
        .config
        .ok_or_else(|| format_err!("image {} has no config", top.digest))?;
    let config: Config = serde_json::from_slice(&blob(dir, &config.digest)?)
        .with_context(|| format!("config {}", config.digest))?;
    Ok(LayoutImage {
        digest: top.digest,
        is_index,
        labels: config.config.labels.unwrap_or_default(),
        layers: platform.layers.len(),
    })
}

/// A blob, checked against its name.
fn blob(dir: &Path, digest: &str) -> anyhow::Result<Vec<u8>> {
    if !is_sha256_digest(digest) {
        bail!("{}: unsupported digest {digest:?}", dir.display());
    }
    let path = dir.join("blobs/sha256").join(&digest["sha256:".len()..]);
    let bytes = fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let got = format!("sha256:{}", sha256_bytes(&bytes));
    if got != digest {
        bail!(
            "{} holds {got}, not {digest}: the layout is damaged",
            path.display()
        );
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(dir: &Path, bytes: &[u8]) -> String {
        let hex = sha256_bytes(bytes);
        fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        fs::write(dir.join("blobs/sha256").join(&hex), bytes).unwrap();
        format!("sha256:{hex}")
    }

    fn layout(dir: &Path) -> String {
        let config = put(
            dir,
            br#"{"config":{"Labels":{"org.opencontainers.image.version":"0.3.13"}}}"#,
        );
        let layer = put(dir, b"layer");
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 1},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer, "size": 5}],
        });
        let manifest = put(dir, manifest.to_string().as_bytes());
        let index = serde_json::json!({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest, "size": 1,
            "annotations": {REF_NAME: "0.3.13"}}]});
        fs::write(dir.join("index.json"), index.to_string()).unwrap();
        manifest
    }

    #[test]
    fn reads_the_digest_and_labels_and_checks_every_blob() {
        let dir = std::env::temp_dir().join(format!("xtask-oci-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let manifest = layout(&dir);
        let image = read(&dir, "0.3.13").unwrap();
        assert_eq!(image.digest, manifest);
        assert!(!image.is_index);
        assert_eq!(image.layers, 1);
        assert_eq!(image.labels["org.opencontainers.image.version"], "0.3.13");
        // The only image is found under another tag too; a damaged blob is an error.
        assert_eq!(read(&dir, "other").unwrap().digest, manifest);
        let hex = &manifest["sha256:".len()..];
        fs::write(dir.join("blobs/sha256").join(hex), b"{}").unwrap();
        assert!(format!("{:#}", read(&dir, "0.3.13").unwrap_err()).contains("damaged"));
        fs::remove_dir_all(&dir).unwrap();
        assert!(
            format!("{:#}", read(&dir, "0.3.13").unwrap_err()).contains("not an OCI image layout")
        );
    }
}
