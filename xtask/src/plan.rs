//! `cargo xtask plan <tag>`: what `release <tag>` would do, as JSON on stdout. Runs the source
//! checks (git and cargo metadata only); builds nothing, touches no network.

use anyhow::bail;
use serde_json::json;
use xshell::Shell;

use crate::checksums::{MANIFEST, SUMS};
use crate::flags;
use crate::image_reference::ImageRef;
use crate::release::verify::BaselineMode;
use crate::release::{binaries, TARGET_TRIPLE};
use crate::source;
use crate::version::{dist_file_stem, normalize_name, ReleaseTag};
use crate::Workspace;

impl flags::Plan {
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        let ws = Workspace::load(sh)?;
        let tag = ReleaseTag::parse(&self.tag)?;
        let config = &ws.config;
        let version = tag.version.to_string();
        let stem = dist_file_stem(&config.distribution);
        let platform = &config.baseline.wheel_platform;
        let wheel = format!("{stem}-{version}-{}-{platform}.whl", python_abi_tag(&ws));
        let sdist = format!("{stem}-{version}.tar.gz");
        let debug = format!("{}.debug", wheel.trim_end_matches(".whl"));
        let sbom = format!("{stem}-{version}.cdx.json");
        let source = source::source(sh, &ws, &self.tag);
        let (owner, repo) = config.github_owner_repo();
        let index = config.pypi.index_url.trim_end_matches('/');
        let images: Vec<_> = config
            .images
            .images
            .iter()
            .map(|i| {
                json!({
                    "name": i.name,
                    "target": config.images.target(i, &version).map(|t| t.to_string()).unwrap_or_default(),
                    "base": i.base,
                    "base_pinned": ImageRef::parse(&i.base).is_ok_and(|b| b.is_pinned()),
                })
            })
            .collect();
        let mut artifacts = vec![
            json!({"name": wheel, "kind": "python-wheel"}),
            json!({"name": sdist, "kind": "source-tarball"}),
            json!({"name": debug, "kind": "symbols", "place": "GitHub only"}),
            json!({"name": sbom, "kind": "sbom", "place": "GitHub only"}),
        ];
        let installers = binaries::no_installers(&binaries::dist_tag(&tag), &tag.name).is_none();
        for app in dist_apps(&ws) {
            let archive = format!("{app}-{TARGET_TRIPLE}.tar.xz");
            artifacts.push(
                json!({"name": archive, "kind": binaries::ARCHIVE_KIND, "place": "GitHub only"}),
            );
            artifacts.push(json!({"name": format!("{archive}.sha256"), "kind": binaries::CHECKSUM_KIND, "place": "GitHub only"}));
            if installers {
                artifacts.push(json!({"name": format!("{app}-installer.sh"), "kind": binaries::INSTALLER_KIND, "place": "GitHub only"}));
            }
        }
        artifacts.push(json!({"name": SUMS, "kind": "unified-checksum"}));
        artifacts.push(json!({"name": MANIFEST, "kind": "dist-manifest"}));
        let plan = json!({
            "tag": tag.name,
            "version": version,
            "cargo_version": tag.version.cargo(),
            "distribution": config.distribution,
            "source": match &source {
                Ok(s) => json!({"ok": true, "commit": s.commit, "source_date_epoch": s.commit_time}),
                Err(e) => json!({"ok": false, "error": format!("{e:#}")}),
            },
            "baseline": {
                "mode": BaselineMode::from_flag(false),
                "wanted": config.baseline,
            },
            "dist_dir": format!("target/dist/{}", tag.name),
            "artifacts": artifacts,
            "phases": [
                {"name": "verify source", "does": "tag exists, is HEAD, clean tree, versions equal the tag's"},
                {"name": "verify baseline", "does": "compare the host with release.toml [baseline]"},
                {"name": "build", "does": format!("maturin sdist + build --profile wheel --locked --compatibility {}; the extension stripped, its debug info to {debug}; the SBOM", config.baseline.manylinux()?.0)},
                {"name": "binaries", "does": "cargo-dist: the standalone binaries' archives and installers, archives packed reproducibly, no vendor runtime linked, glibc no newer than the baseline's"},
                {"name": "audit", "does": "platform tag, auditwheel, no vendor runtime bundled or linked, smoke test in a clean venv"},
                {"name": "checksums", "does": format!("{SUMS} and {MANIFEST}")},
                {"name": "GitHub draft", "dry_run": "skipped", "target": format!("https://github.com/{owner}/{repo}/releases/tag/{}", tag.name),
                 "does": "draft release, upload the assets, verify them by digest"},
                {"name": "publish PyPI", "dry_run": "skipped", "target": config.pypi.repository_url,
                 "checks": format!("{index}/{}/", normalize_name(&config.distribution))},
                {"name": "GitHub undraft", "dry_run": "skipped",
                 "does": "once the index holds the same wheel and sdist, the release out of draft; both places into publication.json, attached to the release"},
                {"name": "images", "dry_run": "skipped", "images": images,
                 "does": "build, check labels, push by digest unless the tag holds it, record digests in publication.json"},
                {"name": "ledger", "dry_run": "skipped", "target": "RELEASES.md",
                 "does": "render the entry from the manifest and publication.json; attach publication.json again"},
            ],
        });
        println!("{}", serde_json::to_string_pretty(&plan)?);
        if let Err(e) = source {
            bail!("release {} would stop at `verify source`: {e:#}", tag.name);
        }
        Ok(())
    }
}

/// The workspace crates whose binaries cargo-dist releases (`[package.metadata.dist] dist =
/// true`), in the workspace's member order.
pub fn dist_apps(ws: &Workspace) -> Vec<String> {
    let read = |dir: &std::path::Path| -> Option<toml::Table> {
        toml::from_str(&std::fs::read_to_string(dir.join("Cargo.toml")).ok()?).ok()
    };
    let Some(root) = read(&ws.root) else {
        return vec![];
    };
    let members = root
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(|m| m.as_array())
        .cloned()
        .unwrap_or_default();
    members
        .iter()
        .filter_map(|m| read(&ws.root.join(m.as_str()?)))
        .filter_map(|t| {
            let package = t.get("package")?;
            let dist = package
                .get("metadata")?
                .get("dist")?
                .get("dist")?
                .as_bool()?;
            dist.then(|| package.get("name")?.as_str().map(str::to_owned))?
        })
        .collect()
}

/// `cp39-abi3` when the wheel's crate enables pyo3's `abi3-py39`, else a placeholder.
fn python_abi_tag(ws: &Workspace) -> String {
    let manifest =
        std::fs::read_to_string(ws.wheel_project_dir().join("Cargo.toml")).unwrap_or_default();
    let table: toml::Table = toml::from_str(&manifest).unwrap_or_default();
    let features = table
        .get("dependencies")
        .and_then(|d| d.get("pyo3"))
        .and_then(|p| p.get("features"))
        .and_then(|f| f.as_array())
        .cloned()
        .unwrap_or_default();
    features
        .iter()
        .filter_map(|f| f.as_str()?.strip_prefix("abi3-py"))
        .filter_map(|v| v.parse::<u32>().ok())
        .min()
        .map(|v| format!("cp{v}-abi3"))
        .unwrap_or_else(|| "<python>-<abi>".to_owned())
}
