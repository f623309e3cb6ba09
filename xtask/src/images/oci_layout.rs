//! Reading an OCI image layout directory (`index.json`, `blobs/sha256/*`): the image's manifest
//! digest, which is the digest the registry will report once it is pushed unchanged, and the
//! labels of its configuration.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, format_err, Context};
use serde::Deserialize;
use serde_json::Value;

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

fn read_index(dir: &Path) -> anyhow::Result<Vec<u8>> {
    fs::read(dir.join("index.json"))
        .with_context(|| format!("{} is not an OCI image layout", dir.display()))
}

/// The position in `index.json` of the image tagged `tag` (or of the only image).
fn top_position(dir: &Path, index: &Index, tag: &str) -> anyhow::Result<usize> {
    let tagged: Vec<usize> = (0..index.manifests.len())
        .filter(|&i| {
            index.manifests[i]
                .annotations
                .get(REF_NAME)
                .map(String::as_str)
                == Some(tag)
        })
        .collect();
    match (&tagged[..], &index.manifests[..]) {
        ([one], _) => Ok(*one),
        ([], [_]) => Ok(0),
        _ => bail!(
            "{}: expected one image tagged {tag:?}, found {} tagged and {} in all",
            dir.display(),
            tagged.len(),
            index.manifests.len()
        ),
    }
}

/// The image tagged `tag` in the layout at `dir` (or its only image).
pub fn read(dir: &Path, tag: &str) -> anyhow::Result<LayoutImage> {
    let index: Index = serde_json::from_slice(&read_index(dir)?)
        .with_context(|| format!("{}/index.json", dir.display()))?;
    let top = index.manifests[top_position(dir, &index, tag)?].clone();
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

/// What [`adopt_base_layers`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adopted {
    /// The base's layers, all now named by the base's own digests.
    pub base_layers: usize,
    /// How many of them the builder had written under another digest (compressed again).
    pub replaced: usize,
}

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// Docker's layer media types and their OCI equivalents (the same bytes).
const DOCKER_TO_OCI_LAYER: [(&str, &str); 2] = [
    (
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
        "application/vnd.oci.image.layer.v1.tar+gzip",
    ),
    (
        "application/vnd.docker.image.rootfs.diff.tar",
        "application/vnd.oci.image.layer.v1.tar",
    ),
];

/// Names the built image's first layers by the base's own blobs. A builder that writes an OCI
/// layout compresses every layer again, so the base's layers get new digests: each release
/// would upload the whole base again, and a node holding the base would pull it again. The
/// content is the base's (checked: the config's diff IDs, the digests of the uncompressed
/// layers, start with the base's), so the manifest can point at the base's compressed blobs
/// instead. The recompressed copies are removed from the layout: the push needs the base's
/// blobs in the destination repository first (`registry::copy_by_digest`).
///
/// `base_manifest` and `base_config` are the base's single-platform manifest and config.
pub fn adopt_base_layers(
    dir: &Path,
    tag: &str,
    base_manifest: &[u8],
    base_config: &[u8],
) -> anyhow::Result<Adopted> {
    let index_bytes = read_index(dir)?;
    let index: Index = serde_json::from_slice(&index_bytes)
        .with_context(|| format!("{}/index.json", dir.display()))?;
    let position = top_position(dir, &index, tag)?;
    let top = &index.manifests[position];
    if INDEX_MEDIA_TYPES.contains(&top.media_type.as_str()) {
        bail!(
            "{}: the build is a multi-platform index; the base's layers can only be adopted \
             into a single-platform image (build one platform)",
            dir.display()
        );
    }
    let old_manifest = blob(dir, &top.digest)?;
    let mut manifest: Value = serde_json::from_slice(&old_manifest)
        .with_context(|| format!("manifest {}", top.digest))?;
    let config_digest = manifest["config"]["digest"]
        .as_str()
        .ok_or_else(|| format_err!("manifest {} names no config", top.digest))?
        .to_owned();
    let built_ids = diff_ids(&blob(dir, &config_digest)?, "the built image")?;
    let base_ids = diff_ids(base_config, "the base")?;
    let base: Value = serde_json::from_slice(base_manifest).context("the base's manifest")?;
    let base_layers = base["layers"]
        .as_array()
        .ok_or_else(|| format_err!("the base's manifest lists no layers"))?;
    if base_layers.len() != base_ids.len() {
        bail!(
            "the base's manifest lists {} layers, its config {} diff IDs",
            base_layers.len(),
            base_ids.len()
        );
    }
    ensure_starts_with_base(&built_ids, &base_ids)?;
    let dropped = swap_in_base_layers(&mut manifest, base_layers, &top.digest)?;
    let adopted = Adopted {
        base_layers: base_layers.len(),
        replaced: dropped.len(),
    };
    if dropped.is_empty() {
        return Ok(adopted);
    }
    replace_top_manifest(dir, &index_bytes, position, &manifest, &top.digest, dropped)?;
    Ok(adopted)
}

fn ensure_starts_with_base(built_ids: &[String], base_ids: &[String]) -> anyhow::Result<()> {
    if let Some(i) = (0..base_ids.len()).find(|&i| built_ids.get(i) != Some(&base_ids[i])) {
        bail!(
            "the built image does not start with the base's layers (layer {} of {}: diff ID {} \
             in the build, {} in the base): the builder changed the base's content, so its \
             layers cannot be shared; build with podman or buildah, or check the recipe's FROM",
            i + 1,
            base_ids.len(),
            built_ids.get(i).map(String::as_str).unwrap_or("missing"),
            base_ids[i]
        );
    }
    Ok(())
}

/// Puts the base's layer descriptors in place of the builder's recompressed copies; returns the
/// digests that are no longer referenced.
fn swap_in_base_layers(
    manifest: &mut Value,
    base_layers: &[Value],
    manifest_digest: &str,
) -> anyhow::Result<Vec<String>> {
    let oci = manifest["mediaType"].as_str().unwrap_or(OCI_MANIFEST) == OCI_MANIFEST;
    let layers = manifest["layers"]
        .as_array_mut()
        .ok_or_else(|| format_err!("manifest {} lists no layers", manifest_digest))?;
    let mut dropped = Vec::new();
    for (built, base) in layers.iter_mut().zip(base_layers) {
        let mut adopted = base.clone();
        let media_type = base["mediaType"].as_str().unwrap_or_default();
        if oci {
            if let Some((_, o)) = DOCKER_TO_OCI_LAYER.iter().find(|(d, _)| *d == media_type) {
                adopted["mediaType"] = Value::from(*o);
            }
        }
        if adopted["digest"] != built["digest"] {
            if let Some(d) = built["digest"].as_str() {
                dropped.push(d.to_owned());
            }
            *built = adopted;
        }
    }
    Ok(dropped)
}

fn replace_top_manifest(
    dir: &Path,
    index_bytes: &[u8],
    position: usize,
    manifest: &Value,
    old_digest: &str,
    mut dropped: Vec<String>,
) -> anyhow::Result<()> {
    let new_manifest = serde_json::to_vec(manifest)?;
    let new_digest = put_blob(dir, &new_manifest)?;
    let mut index: Value = serde_json::from_slice(index_bytes)?;
    index["manifests"][position]["digest"] = Value::from(new_digest.as_str());
    index["manifests"][position]["size"] = Value::from(new_manifest.len());
    fs::write(dir.join("index.json"), serde_json::to_vec(&index)?)
        .with_context(|| format!("cannot write {}/index.json", dir.display()))?;
    // The builder's copies are unreferenced now; a base layer is tens of GB.
    dropped.push(old_digest.to_owned());
    for d in dropped.iter().filter(|d| **d != new_digest) {
        let path = blob_path(dir, d)?;
        if path.exists() {
            fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
        }
    }
    Ok(())
}

fn diff_ids(config: &[u8], what: &str) -> anyhow::Result<Vec<String>> {
    let config: Value =
        serde_json::from_slice(config).with_context(|| format!("the config of {what}"))?;
    config["rootfs"]["diff_ids"]
        .as_array()
        .ok_or_else(|| format_err!("the config of {what} has no rootfs.diff_ids"))?
        .iter()
        .map(|d| {
            d.as_str()
                .map(str::to_owned)
                .ok_or_else(|| format_err!("the config of {what}: a diff ID is not a string"))
        })
        .collect()
}

fn blob_path(dir: &Path, digest: &str) -> anyhow::Result<PathBuf> {
    if !is_sha256_digest(digest) {
        bail!("{}: unsupported digest {digest:?}", dir.display());
    }
    Ok(dir.join("blobs/sha256").join(&digest["sha256:".len()..]))
}

fn put_blob(dir: &Path, bytes: &[u8]) -> anyhow::Result<String> {
    let digest = format!("sha256:{}", sha256_bytes(bytes));
    let path = blob_path(dir, &digest)?;
    fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(digest)
}

/// A blob, checked against its name.
fn blob(dir: &Path, digest: &str) -> anyhow::Result<Vec<u8>> {
    let path = blob_path(dir, digest)?;
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

    /// A layout whose image is a base layer compressed again (`recompressed`) plus one layer.
    fn built_layout(dir: &Path) -> String {
        let config = put(
            dir,
            br#"{"config":{},"rootfs":{"type":"layers","diff_ids":["sha256:aa","sha256:bb"]}}"#,
        );
        let recompressed = put(dir, b"base layer, compressed again");
        let own = put(dir, b"own layer");
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 1},
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": recompressed, "size": 28},
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": own, "size": 9},
            ],
        });
        let manifest = put(dir, manifest.to_string().as_bytes());
        let index = serde_json::json!({"schemaVersion": 2, "manifests": [{
            "mediaType": OCI_MANIFEST, "digest": manifest, "size": 1,
            "annotations": {REF_NAME: "0.3.13"}}]});
        fs::write(dir.join("index.json"), index.to_string()).unwrap();
        recompressed
    }

    #[test]
    fn the_base_layers_keep_the_base_digests_and_the_recompressed_copies_go() {
        let dir = std::env::temp_dir().join(format!("xtask-oci-adopt-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let recompressed = built_layout(&dir);
        let before = read(&dir, "0.3.13").unwrap();
        let base_layer = format!("sha256:{}", "c".repeat(64));
        let base_manifest = serde_json::json!({"schemaVersion": 2, "layers": [{
            "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
            "digest": base_layer, "size": 7}]});
        let base_config = br#"{"rootfs":{"type":"layers","diff_ids":["sha256:aa"]}}"#;
        let base_manifest = base_manifest.to_string();

        let adopted =
            adopt_base_layers(&dir, "0.3.13", base_manifest.as_bytes(), base_config).unwrap();
        assert_eq!(
            adopted,
            Adopted {
                base_layers: 1,
                replaced: 1
            }
        );
        let after = read(&dir, "0.3.13").unwrap();
        assert_ne!(after.digest, before.digest);
        assert_eq!((after.layers, &after.labels), (2, &before.labels));
        let manifest: Value = serde_json::from_slice(&blob(&dir, &after.digest).unwrap()).unwrap();
        assert_eq!(manifest["layers"][0]["digest"], base_layer.as_str());
        assert_eq!(manifest["layers"][0]["size"], 7);
        // The same bytes under the OCI name of Docker's media type.
        assert_eq!(
            manifest["layers"][0]["mediaType"],
            "application/vnd.oci.image.layer.v1.tar+gzip"
        );
        assert!(!blob_path(&dir, &recompressed).unwrap().exists());
        assert!(!blob_path(&dir, &before.digest).unwrap().exists());
        // Adopting again changes nothing.
        let again =
            adopt_base_layers(&dir, "0.3.13", base_manifest.as_bytes(), base_config).unwrap();
        assert_eq!(again.replaced, 0);
        assert_eq!(read(&dir, "0.3.13").unwrap().digest, after.digest);

        // Another base (other content) is refused, naming the layer.
        let other = br#"{"rootfs":{"type":"layers","diff_ids":["sha256:dd"]}}"#;
        let err = adopt_base_layers(&dir, "0.3.13", base_manifest.as_bytes(), other).unwrap_err();
        let err = format!("{err:#}");
        assert!(
            err.contains("layer 1 of 1: diff ID sha256:aa in the build, sha256:dd in the base"),
            "{err}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
