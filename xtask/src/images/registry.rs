//! The registry side, through `skopeo` (the registry HTTP API with every auth scheme the
//! containers tools know): what a tag resolves to, and pushing a layout without changing a byte.

use std::path::Path;

use anyhow::{bail, Context};
use xshell::{cmd, Shell};

use crate::checksums::sha256_bytes;
use crate::image_reference::is_loopback_host;

pub fn check_skopeo(sh: &Shell) -> anyhow::Result<()> {
    cmd!(sh, "skopeo --version")
        .quiet()
        .ignore_stdout()
        .run()
        .context(
            "skopeo is needed to talk to image registries: install it (apt-get install skopeo)",
        )
}

fn tls_flag(prefix: &str, reference: &str) -> String {
    let host = reference.split('/').next().unwrap_or_default();
    format!("--{prefix}tls-verify={}", !is_loopback_host(host))
}

/// The digest `reference` (`host/path:tag` or `@digest`) resolves to now: the SHA-256 of the
/// manifest (or index) the registry serves. `None` when the registry has no such tag.
pub fn resolve(sh: &Shell, reference: &str) -> anyhow::Result<Option<String>> {
    let tls = tls_flag("", reference);
    let url = format!("docker://{reference}");
    let out = cmd!(sh, "skopeo inspect --raw {tls} {url}")
        .quiet()
        .ignore_status()
        .output()
        .with_context(|| format!("cannot run skopeo inspect {url}"))?;
    if out.status.success() {
        return Ok(Some(format!("sha256:{}", sha256_bytes(&out.stdout))));
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let lower = err.to_lowercase();
    if ["manifest unknown", "name unknown", "not found"]
        .iter()
        .any(|m| lower.contains(m))
    {
        return Ok(None);
    }
    bail!("cannot ask the registry about {reference}: {}", err.trim())
}

/// Pushes the layout's image as `dest` (`host/path:tag`) byte for byte and returns the digest
/// the registry recorded.
pub fn push_layout(
    sh: &Shell,
    layout: &Path,
    layout_tag: &str,
    is_index: bool,
    dest: &str,
    digest_file: &Path,
) -> anyhow::Result<String> {
    let src = format!("oci:{}:{layout_tag}", layout.display());
    let dst = format!("docker://{dest}");
    let tls = tls_flag("dest-", dest);
    let all = is_index.then_some("--all");
    cmd!(sh, "skopeo copy --quiet --preserve-digests {all...} {tls} --digestfile {digest_file} {src} {dst}")
        .run()
        .with_context(|| format!("cannot push {src} to {dst}"))?;
    let digest = std::fs::read_to_string(digest_file)?.trim().to_owned();
    Ok(digest)
}

/// One platform's image as the registry serves it: what the base's layers are checked against.
#[derive(Debug, Clone)]
pub struct RemoteImage {
    /// `name@sha256:...` of the single-platform manifest.
    pub reference: String,
    pub manifest: Vec<u8>,
    pub config: Vec<u8>,
}

/// The manifest and config of `name@digest`; an index (multi-platform) is resolved to its
/// `linux/<arch>` image.
pub fn fetch_image(
    sh: &Shell,
    name: &str,
    digest: &str,
    arch: &str,
) -> anyhow::Result<RemoteImage> {
    let mut reference = format!("{name}@{digest}");
    let mut manifest = inspect_raw(sh, &reference, false)?;
    let top: serde_json::Value = serde_json::from_slice(&manifest)
        .with_context(|| format!("{reference}: the registry's manifest is not JSON"))?;
    if let Some(entries) = top["manifests"].as_array() {
        let platform = entries
            .iter()
            .find(|m| m["platform"]["os"] == "linux" && m["platform"]["architecture"] == arch)
            .and_then(|m| m["digest"].as_str())
            .with_context(|| format!("{reference} is an index without a linux/{arch} image"))?;
        reference = format!("{name}@{platform}");
        manifest = inspect_raw(sh, &reference, false)?;
    }
    let got = format!("sha256:{}", sha256_bytes(&manifest));
    if !reference.ends_with(&got) {
        bail!("{reference}: the registry served a manifest with digest {got}");
    }
    let config = inspect_raw(sh, &reference, true)?;
    Ok(RemoteImage {
        reference,
        manifest,
        config,
    })
}

fn inspect_raw(sh: &Shell, reference: &str, config: bool) -> anyhow::Result<Vec<u8>> {
    let tls = tls_flag("", reference);
    let url = format!("docker://{reference}");
    let config = config.then_some("--config");
    let out = cmd!(sh, "skopeo inspect --raw {config...} {tls} {url}")
        .quiet()
        .output()
        .with_context(|| format!("cannot read {url} from its registry"))?;
    Ok(out.stdout)
}

/// Copies `src` (`name@digest`) into the repository `dest_name` under the same digest, blobs
/// byte for byte; blobs the repository already has are not uploaded again.
pub fn copy_by_digest(sh: &Shell, src: &str, dest_name: &str) -> anyhow::Result<()> {
    let (_, digest) = src
        .split_once('@')
        .with_context(|| format!("{src} is not a reference by digest"))?;
    let dest = format!("{dest_name}@{digest}");
    let (src_tls, dest_tls) = (tls_flag("src-", src), tls_flag("dest-", &dest));
    let (from, to) = (format!("docker://{src}"), format!("docker://{dest}"));
    cmd!(
        sh,
        "skopeo copy --quiet --preserve-digests {src_tls} {dest_tls} {from} {to}"
    )
    .run()
    .with_context(|| format!("cannot copy {src} to {dest}"))
}

/// Logs in to `host` for this process's skopeo calls (credentials through stdin, never argv).
pub fn login(sh: &Shell, host: &str, username: &str, password: &str) -> anyhow::Result<()> {
    let tls = tls_flag("", host);
    cmd!(
        sh,
        "skopeo login {tls} --username {username} --password-stdin {host}"
    )
    .stdin(password)
    .quiet()
    .ignore_stdout()
    .run()
    .with_context(|| format!("cannot log in to {host} as {username}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_is_only_turned_off_for_loopback_registries() {
        assert_eq!(
            tls_flag("", "127.0.0.1:15000/test/x:1"),
            "--tls-verify=false"
        );
        assert_eq!(
            tls_flag("dest-", "localhost:5000/x"),
            "--dest-tls-verify=false"
        );
        assert_eq!(
            tls_flag("", "ghcr.io/mooncake-musa/vllm-musa:0.3.13"),
            "--tls-verify=true"
        );
        assert_eq!(tls_flag("", "127.example.com/x"), "--tls-verify=true");
    }
}
