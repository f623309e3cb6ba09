//! `cargo xtask pin-base [--builder-image] [<image>...]`: resolve each image's base tag (and
//! with `--builder-image`, `[baseline] builder_image`) to the digest the registry serves now and
//! write it into release.toml as `host/path:tag@sha256:<hex>`, comments and layout kept. The one
//! way a base gets its digest: the builds refuse a base without one.

use anyhow::{bail, Context};
use xshell::Shell;

use crate::config::ReleaseConfig;
use crate::flags;
use crate::image_reference::ImageRef;
use crate::images::registry;
use crate::Workspace;

impl flags::PinBase {
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        let ws = Workspace::load(sh)?;
        let images = &ws.config.images.images;
        if images.is_empty() && !self.builder_image {
            bail!("release.toml [images] names no image ([[images.image]]): nothing to pin");
        }
        for name in &self.images {
            if ws.config.images.get(name).is_none() {
                let known: Vec<&str> = images.iter().map(|i| i.name.as_str()).collect();
                bail!(
                    "no image {name:?} in release.toml [images] (known: {})",
                    known.join(", ")
                );
            }
        }
        registry::check_skopeo(sh)?;
        let path = ws.root.join("release.toml");
        let mut text = std::fs::read_to_string(&path)?;
        let mut changed = 0;
        for image in images {
            if !self.images.is_empty() && !self.images.contains(&image.name) {
                continue;
            }
            if let Some(pinned) = resolve(sh, &image.name, &image.base)? {
                text = set_base(&text, &image.name, &pinned)?;
                changed += 1;
            }
        }
        if self.builder_image {
            let current = &ws.config.baseline.builder_image;
            if let Some(pinned) = resolve(sh, "builder image", current)? {
                text = set_builder_image(&text, &pinned)?;
                changed += 1;
            }
        }
        if changed > 0 {
            // Never write a file the release would then refuse.
            ReleaseConfig::parse(&text).context("the re-pinned release.toml does not parse")?;
            std::fs::write(&path, &text)
                .with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!(
                "{}: {changed} reference(s) pinned; review and commit the change",
                path.display()
            );
        }
        Ok(())
    }
}

/// The pinned form of `reference` when it differs from `reference`; says what happened.
fn resolve(sh: &Shell, what: &str, reference: &str) -> anyhow::Result<Option<String>> {
    let base = ImageRef::parse(reference).with_context(|| what.to_owned())?;
    let tag = base.by_tag();
    let digest = registry::resolve(sh, &tag)?.with_context(|| {
        format!("{what}: the registry has no {tag}; check the tag in release.toml")
    })?;
    match &base.digest {
        Some(old) if *old == digest => {
            eprintln!("{what}: {tag} is still {digest}: unchanged");
            return Ok(None);
        }
        Some(old) => eprintln!("{what}: {tag} moved from {old} to {digest}: re-pinned"),
        None => eprintln!("{what}: {tag} is {digest}: pinned"),
    }
    Ok(Some(base.with_digest(&digest).to_string()))
}

/// release.toml with `[baseline] builder_image` set, everything else kept.
pub fn set_builder_image(text: &str, image: &str) -> anyhow::Result<String> {
    let mut doc: toml_edit::DocumentMut = text.parse().context("release.toml does not parse")?;
    let item = doc
        .get_mut("baseline")
        .and_then(|b| b.get_mut("builder_image"))
        .context("release.toml has no [baseline] builder_image")?;
    replace_value(item, image);
    Ok(doc.to_string())
}

fn replace_value(item: &mut toml_edit::Item, value: &str) {
    let decor = item
        .as_value()
        .map(|v| v.decor().clone())
        .unwrap_or_default();
    *item = toml_edit::value(value);
    if let Some(v) = item.as_value_mut() {
        *v.decor_mut() = decor;
    }
}

/// release.toml with `base` of `[[images.image]] name = <name>` set to `base`, keeping the
/// value's comment and everything else byte for byte.
pub fn set_base(text: &str, name: &str, base: &str) -> anyhow::Result<String> {
    let mut doc: toml_edit::DocumentMut = text.parse().context("release.toml does not parse")?;
    let tables = doc
        .get_mut("images")
        .and_then(|i| i.get_mut("image"))
        .and_then(|i| i.as_array_of_tables_mut())
        .context("release.toml has no [[images.image]]")?;
    let table = tables
        .iter_mut()
        .find(|t| t.get("name").and_then(|n| n.as_str()) == Some(name))
        .with_context(|| format!("release.toml has no [[images.image]] named {name:?}"))?;
    let item = table
        .get_mut("base")
        .with_context(|| format!("[[images.image]] {name} has no base"))?;
    let decor = item
        .as_value()
        .map(|v| v.decor().clone())
        .unwrap_or_default();
    *item = toml_edit::value(base);
    if let Some(v) = item.as_value_mut() {
        *v.decor_mut() = decor;
    }
    Ok(doc.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPO_CONFIG: &str = include_str!("../../release.toml");

    #[test]
    fn set_base_changes_only_that_value() {
        let pinned = format!(
            "registry.mthreads.com/mcconline/inference/vllm/vllm-openai:v0.28.0@sha256:{}",
            "0".repeat(64)
        );
        let out = set_base(REPO_CONFIG, "vllm-musa", &pinned).unwrap();
        let c = ReleaseConfig::parse(&out).unwrap();
        assert_eq!(c.images.get("vllm-musa").unwrap().base, pinned);
        let before = ReleaseConfig::parse(REPO_CONFIG).unwrap();
        assert_eq!(
            c.images.get("sglang-musa"),
            before.images.get("sglang-musa")
        );
        // One line differs; comments survive.
        let diff: Vec<_> = REPO_CONFIG
            .lines()
            .zip(out.lines())
            .filter(|(a, b)| a != b)
            .collect();
        assert_eq!(diff.len(), 1, "{diff:?}");
        assert_eq!(REPO_CONFIG.lines().count(), out.lines().count());
        assert!(set_base(REPO_CONFIG, "nope", &pinned)
            .unwrap_err()
            .to_string()
            .contains("nope"));
    }
}
