//! The wheel's Rust dependency tree as a CycloneDX 1.5 JSON SBOM, a release asset of its own
//! (`<distribution>-<version>.cdx.json`; maturin's own SBOM stays off, see `build.rs`).
//!
//! Input: `cargo metadata --locked --filter-platform <triple> --features <the wheel's>` on the
//! wheel's crate (the resolve graph, names, versions, licenses) and `Cargo.lock` (the crates'
//! SHA-256). Every package reachable from the wheel's crate through normal and build
//! dependencies is a component (`pkg:cargo/NAME@VERSION`), with its lock checksum where it comes
//! from a registry; dev-dependencies are left out. Reproducible: the timestamp is
//! `SOURCE_DATE_EPOCH`, the serial number a UUID made from the SHA-256 of the rest of the
//! document, and every list is sorted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{bail, format_err, Context};
use serde_json::{json, Value};
use xshell::{cmd, Shell};

use crate::checksums::sha256_bytes;

/// `cargo metadata` of the wheel's crate, with the wheel's features, for one target.
pub fn cargo_metadata(
    sh: &Shell,
    manifest_path: &Path,
    features: &[String],
    target: &str,
    offline: bool,
) -> anyhow::Result<Value> {
    let features = features.join(",");
    let mut args = vec![
        "metadata".to_owned(),
        "--format-version=1".to_owned(),
        "--locked".to_owned(),
        format!("--filter-platform={target}"),
        format!("--features={features}"),
    ];
    if offline {
        args.push("--offline".to_owned());
    }
    let out = cmd!(sh, "cargo {args...} --manifest-path {manifest_path}")
        .quiet()
        .read()
        .context("cannot read the dependency tree (cargo metadata)")?;
    Ok(serde_json::from_str(&out)?)
}

/// The SBOM's bytes: pretty JSON and a final newline.
pub fn generate(metadata: &Value, lock: &str, source_date_epoch: i64) -> anyhow::Result<Vec<u8>> {
    let checksums = lock_checksums(lock)?;
    let packages: BTreeMap<&str, &Value> = metadata["packages"]
        .as_array()
        .ok_or_else(|| format_err!("cargo metadata lists no packages"))?
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p)))
        .collect();
    let nodes: BTreeMap<&str, &Value> = metadata["resolve"]["nodes"]
        .as_array()
        .ok_or_else(|| format_err!("cargo metadata has no resolve graph"))?
        .iter()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    let root = metadata["resolve"]["root"]
        .as_str()
        .ok_or_else(|| format_err!("cargo metadata has no root package: run it on the crate"))?;

    let graph = shipped_graph(&nodes, root)?;

    let mut refs = BTreeMap::new();
    let mut components = Vec::new();
    for id in graph.keys() {
        let p = packages
            .get(id)
            .ok_or_else(|| format_err!("{id} is not among the packages"))?;
        let c = component(p, &checksums)?;
        refs.insert(*id, c["bom-ref"].clone());
        if *id != root {
            components.push(c);
        }
    }
    components.sort_by(|a, b| a["bom-ref"].as_str().cmp(&b["bom-ref"].as_str()));
    let dependencies = dependency_list(&graph, &refs);
    let root_component = component(
        packages
            .get(root)
            .ok_or_else(|| format_err!("{root} is not among the packages"))?,
        &checksums,
    )?;

    let mut bom = json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "timestamp": rfc3339(source_date_epoch)?,
            "tools": {
                "components": [{
                    "type": "application",
                    "name": "xtask",
                    "version": env!("CARGO_PKG_VERSION"),
                    "description": "cargo xtask release: the release's SBOM of the wheel's Rust crate",
                }],
            },
            "component": root_component,
        },
        "components": components,
        "dependencies": dependencies,
    });
    let unserialized = serde_json::to_vec(&bom)?;
    if let Some(map) = bom.as_object_mut() {
        map.insert(
            "serialNumber".to_owned(),
            Value::String(content_uuid(&unserialized)),
        );
    }
    Ok((serde_json::to_string_pretty(&bom)? + "\n").into_bytes())
}

/// The packages reachable from `root` through normal and build dependencies (what the wheel
/// ships), each with its direct dependencies.
fn shipped_graph<'a>(
    nodes: &BTreeMap<&'a str, &'a Value>,
    root: &'a str,
) -> anyhow::Result<BTreeMap<&'a str, BTreeSet<&'a str>>> {
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut todo = vec![root];
    while let Some(id) = todo.pop() {
        if graph.contains_key(id) {
            continue;
        }
        let node = nodes
            .get(id)
            .ok_or_else(|| format_err!("{id} is not in the resolve graph"))?;
        let mut direct = BTreeSet::new();
        for dep in node["deps"].as_array().into_iter().flatten() {
            let kinds = dep["dep_kinds"].as_array().into_iter().flatten();
            let shipped = kinds
                .clone()
                .any(|k| k["kind"].is_null() || k["kind"] == "build");
            if let (true, Some(pkg)) = (shipped, dep["pkg"].as_str()) {
                direct.insert(pkg);
                todo.push(pkg);
            }
        }
        graph.insert(id, direct);
    }
    Ok(graph)
}

/// CycloneDX `dependencies`, sorted so the SBOM is the same bytes on every run.
fn dependency_list(
    graph: &BTreeMap<&str, BTreeSet<&str>>,
    refs: &BTreeMap<&str, Value>,
) -> Vec<Value> {
    let mut dependencies: Vec<Value> = graph
        .iter()
        .map(|(id, deps)| {
            let mut on: Vec<&Value> = deps.iter().filter_map(|d| refs.get(d)).collect();
            on.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
            json!({ "ref": refs[id], "dependsOn": on })
        })
        .collect();
    dependencies.sort_by(|a, b| a["ref"].as_str().cmp(&b["ref"].as_str()));
    dependencies
}

/// One package as a CycloneDX component.
fn component(p: &Value, checksums: &BTreeMap<(String, String), String>) -> anyhow::Result<Value> {
    let (Some(name), Some(version)) = (p["name"].as_str(), p["version"].as_str()) else {
        bail!("a package in cargo metadata has no name or version: {p}");
    };
    let purl = format!("pkg:cargo/{name}@{version}");
    let mut c = json!({
        "type": "library",
        "bom-ref": purl,
        "name": name,
        "version": version,
        "purl": purl,
    });
    let map = c
        .as_object_mut()
        .ok_or_else(|| format_err!("a component is an object"))?;
    if let Some(d) = p["description"].as_str() {
        map.insert("description".to_owned(), json!(d.trim()));
    }
    if let Some(source) = p["source"].as_str() {
        if let Some(sum) = checksums.get(&(format!("{name} {version}"), source.to_owned())) {
            map.insert(
                "hashes".to_owned(),
                json!([{ "alg": "SHA-256", "content": sum }]),
            );
        }
    }
    if let Some(l) = p["license"].as_str() {
        // Cargo's old `MIT/Apache-2.0` is `MIT OR Apache-2.0` in SPDX.
        map.insert(
            "licenses".to_owned(),
            json!([{ "expression": l.replace('/', " OR ") }]),
        );
    }
    if let Some(r) = p["repository"].as_str() {
        map.insert(
            "externalReferences".to_owned(),
            json!([{ "type": "vcs", "url": r }]),
        );
    }
    Ok(c)
}

/// `Cargo.lock`'s checksums: (`name version`, source) -> sha256 hex.
pub fn lock_checksums(lock: &str) -> anyhow::Result<BTreeMap<(String, String), String>> {
    let doc: toml::Table = toml::from_str(lock).context("Cargo.lock is not TOML")?;
    let mut out = BTreeMap::new();
    for p in doc
        .get("package")
        .and_then(|p| p.as_array())
        .into_iter()
        .flatten()
    {
        let get = |k: &str| p.get(k).and_then(|v| v.as_str());
        if let (Some(n), Some(v), Some(s), Some(c)) =
            (get("name"), get("version"), get("source"), get("checksum"))
        {
            out.insert((format!("{n} {v}"), s.to_owned()), c.to_owned());
        }
    }
    Ok(out)
}

/// `urn:uuid:` of a version-5-shaped UUID taken from the SHA-256 of `bytes`.
fn content_uuid(bytes: &[u8]) -> String {
    let h = sha256_bytes(bytes);
    let mut hex: Vec<char> = h.chars().take(32).collect();
    hex[12] = '5';
    hex[16] = ['8', '9', 'a', 'b'][usize::from(hex[16].to_digit(16).unwrap_or(0) as u8 & 3)];
    let s: String = hex.into_iter().collect();
    format!(
        "urn:uuid:{}-{}-{}-{}-{}",
        &s[0..8],
        &s[8..12],
        &s[12..16],
        &s[16..20],
        &s[20..32]
    )
}

/// `YYYY-MM-DDTHH:MM:SSZ` of a Unix time (UTC; the date is the ledger's).
pub fn rfc3339(epoch: i64) -> anyhow::Result<String> {
    if epoch < 0 {
        bail!("SOURCE_DATE_EPOCH {epoch} is before 1970");
    }
    let secs = epoch % 86_400;
    Ok(format!(
        "{}T{:02}:{:02}:{:02}Z",
        crate::ledger::utc_date(epoch),
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf()
    }

    #[test]
    fn timestamps_are_utc_rfc3339() {
        assert_eq!(rfc3339(0).unwrap(), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400).unwrap(), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_798_761_599).unwrap(), "2026-12-31T23:59:59Z");
        assert!(rfc3339(-1).is_err());
    }

    /// The real wheel crate: every locked dependency present with its purl and checksum, the
    /// same bytes twice, and nothing from the clock.
    #[test]
    fn the_sbom_of_the_bindings_lists_every_locked_dependency_with_purl_and_checksum() {
        let ws = workspace();
        let sh = Shell::new().unwrap();
        let metadata = cargo_metadata(
            &sh,
            &ws.join("bindings/Cargo.toml"),
            &["python".to_owned()],
            "x86_64-unknown-linux-gnu",
            true,
        )
        .unwrap();
        let lock = std::fs::read_to_string(ws.join("Cargo.lock")).unwrap();
        let a = generate(&metadata, &lock, 1_700_000_000).unwrap();
        let b = generate(&metadata, &lock, 1_700_000_000).unwrap();
        assert_eq!(a, b, "same input, same bytes");
        assert_ne!(a, generate(&metadata, &lock, 1_700_000_001).unwrap());

        let bom: Value = serde_json::from_slice(&a).unwrap();
        assert_eq!(bom["bomFormat"], "CycloneDX");
        assert_eq!(bom["specVersion"], "1.5");
        assert_eq!(bom["metadata"]["timestamp"], "2023-11-14T22:13:20Z");
        assert_eq!(
            bom["metadata"]["component"]["purl"],
            format!("pkg:cargo/mooncake-bindings@{}", env!("CARGO_PKG_VERSION"))
        );
        let serial = bom["serialNumber"].as_str().unwrap();
        assert!(
            serial.starts_with("urn:uuid:") && serial.len() == 45,
            "{serial}"
        );
        let components = bom["components"].as_array().unwrap();
        let by_purl: BTreeMap<&str, &Value> = components
            .iter()
            .map(|c| (c["purl"].as_str().unwrap(), c))
            .collect();

        // Every registry package the lock file holds for the bindings' tree (pyo3 with the
        // `python` feature among them) is there, with the lock's checksum.
        let sums = lock_checksums(&lock).unwrap();
        for must in ["pyo3", "parking_lot", "thiserror", "tracing", "libc"] {
            assert!(
                components.iter().any(|c| c["name"] == must),
                "{must} missing"
            );
        }
        for c in components {
            assert_eq!(
                c["purl"],
                format!(
                    "pkg:cargo/{}@{}",
                    c["name"].as_str().unwrap(),
                    c["version"].as_str().unwrap()
                )
            );
        }
        let mut registry = 0;
        for ((name_version, _), sum) in &sums {
            let (name, version) = name_version.split_once(' ').unwrap();
            let Some(c) = by_purl.get(format!("pkg:cargo/{name}@{version}").as_str()) else {
                continue;
            };
            assert_eq!(c["hashes"][0]["alg"], "SHA-256");
            assert_eq!(c["hashes"][0]["content"], sum.as_str(), "{name} {version}");
            registry += 1;
        }
        let path_crates = components.iter().filter(|c| c["hashes"].is_null()).count();
        assert_eq!(registry + path_crates, components.len());
        assert!(registry > 10, "{registry} registry crates");

        // Every locked dependency of the bindings crate, walked in Cargo.lock itself.
        let lock_doc: toml::Table = toml::from_str(&lock).unwrap();
        let lock_pkgs = lock_doc["package"].as_array().unwrap();
        let find = |n: &str| {
            lock_pkgs
                .iter()
                .filter(|p| p["name"].as_str() == Some(n.split(' ').next().unwrap()))
                .find(|p| {
                    n.split(' ')
                        .nth(1)
                        .is_none_or(|v| p["version"].as_str() == Some(v))
                })
                .unwrap()
        };
        let root = find("mooncake-bindings");
        for dep in root["dependencies"].as_array().unwrap() {
            let name = dep.as_str().unwrap();
            let p = find(name);
            let purl = format!(
                "pkg:cargo/{}@{}",
                p["name"].as_str().unwrap(),
                p["version"].as_str().unwrap()
            );
            assert!(by_purl.contains_key(purl.as_str()), "{purl} missing");
        }

        // The graph names only components.
        let refs: BTreeSet<&str> = components
            .iter()
            .map(|c| c["bom-ref"].as_str().unwrap())
            .chain([bom["metadata"]["component"]["bom-ref"].as_str().unwrap()])
            .collect();
        for d in bom["dependencies"].as_array().unwrap() {
            assert!(refs.contains(d["ref"].as_str().unwrap()));
            for on in d["dependsOn"].as_array().unwrap() {
                assert!(refs.contains(on.as_str().unwrap()));
            }
        }
        assert_eq!(bom["dependencies"].as_array().unwrap().len(), refs.len());
    }
}
