//! Finding and opening a vendor runtime library: an ordered list of
//! candidates, each tried in turn; when none opens, the error lists every
//! name and path tried and why each failed.

use std::path::{Path, PathBuf};

use libloading::Library;

use super::Vendor;

/// Why no runtime library could be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no {vendor} runtime could be loaded; tried: {}", format_tried(.tried))]
pub struct LoadError {
    /// The vendor searched for.
    pub vendor: Vendor,
    /// Every candidate with the reason it failed.
    pub tried: Vec<(String, String)>,
}

fn format_tried(tried: &[(String, String)]) -> String {
    tried
        .iter()
        .map(|(c, why)| format!("{c} ({why})"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The candidates for `vendor`, in the order they are tried.
///
/// `env` reads variables (tests pass their own); `site_packages` are the
/// Python site-packages folders where PyTorch's CUDA wheels put libcudart.
pub fn candidates(
    vendor: Vendor,
    env: &dyn Fn(&str) -> Option<String>,
    site_packages: &[PathBuf],
) -> Vec<String> {
    let mut out = Vec::new();
    match vendor {
        Vendor::Cuda => {
            if let Some(p) = env("MC_CUDART_PATH") {
                out.push(p);
            }
            for name in ["libcudart.so.13", "libcudart.so.12", "libcudart.so"] {
                out.push(name.into());
            }
            for sp in site_packages {
                out.push(
                    sp.join("nvidia/cu13/lib/libcudart.so.13")
                        .display()
                        .to_string(),
                );
                out.push(
                    sp.join("nvidia/cuda_runtime/lib/libcudart.so.12")
                        .display()
                        .to_string(),
                );
            }
            let home = env("CUDA_HOME").unwrap_or_else(|| "/usr/local/cuda".into());
            for name in ["libcudart.so.13", "libcudart.so.12", "libcudart.so"] {
                out.push(
                    Path::new(&home)
                        .join("lib64")
                        .join(name)
                        .display()
                        .to_string(),
                );
            }
        }
        Vendor::Musa => {
            if let Some(p) = env("MC_MUSART_PATH") {
                out.push(p);
            }
            for name in [
                "libmusart.so",
                "libmusart.so.5",
                "libmusart.so.4",
                "libmusart.so.1.0",
            ] {
                out.push(name.into());
            }
            let mut homes = Vec::new();
            if let Some(h) = env("MUSA_HOME") {
                homes.push(h);
            }
            homes.push("/usr/local/musa".into());
            for home in homes {
                for name in [
                    "libmusart.so",
                    "libmusart.so.5",
                    "libmusart.so.4",
                    "libmusart.so.1.0",
                ] {
                    out.push(
                        Path::new(&home)
                            .join("lib")
                            .join(name)
                            .display()
                            .to_string(),
                    );
                }
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|c| seen.insert(c.clone()));
    out
}

/// Opens the first candidate that loads.
pub fn open_first(vendor: Vendor, candidates: &[String]) -> Result<(Library, String), LoadError> {
    let mut tried = Vec::new();
    for c in candidates {
        let is_path = c.contains('/');
        if is_path && !Path::new(c).exists() {
            tried.push((c.clone(), "no such file".into()));
            continue;
        }
        // SAFETY: loading a vendor runtime runs its initialisers; that is
        // the documented way to use these libraries.
        match unsafe { Library::new(c) } {
            Ok(lib) => return Ok((lib, c.clone())),
            Err(e) => tried.push((c.clone(), short(&e.to_string()))),
        }
    }
    Err(LoadError { vendor, tried })
}

fn short(msg: &str) -> String {
    if msg.contains("No such file") || msg.contains("cannot open shared object") {
        "not found".into()
    } else {
        msg.to_string()
    }
}

/// Python site-packages folders visible to this process (for PyTorch's CUDA wheels).
pub fn site_packages() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(pp) = std::env::var("PYTHONPATH") {
        out.extend(pp.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    // Libraries a Python process already mapped tell where its site-packages are.
    if let Ok(maps) = std::fs::read_to_string("/proc/self/maps") {
        for line in maps.lines() {
            if let Some(i) = line.find("/site-packages/") {
                if let Some(start) = line[..i].rfind(' ') {
                    let p = PathBuf::from(&line[start + 1..i + "/site-packages".len()]);
                    if !out.contains(&p) {
                        out.push(p);
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_candidates_start_with_the_override_and_cover_torch_wheels() {
        let env = |k: &str| (k == "MC_CUDART_PATH").then(|| "/opt/x/libcudart.so.12".to_string());
        let c = candidates(Vendor::Cuda, &env, &[PathBuf::from("/venv/site-packages")]);
        assert_eq!(c[0], "/opt/x/libcudart.so.12");
        assert!(c.contains(&"libcudart.so.13".to_string()));
        assert!(c.contains(&"/venv/site-packages/nvidia/cu13/lib/libcudart.so.13".to_string()));
        assert!(
            c.contains(&"/venv/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12".to_string())
        );
        assert!(c.contains(&"/usr/local/cuda/lib64/libcudart.so.12".to_string()));
    }

    #[test]
    fn musa_candidates_cover_sonames_and_musa_home() {
        let env = |k: &str| (k == "MUSA_HOME").then(|| "/opt/musa-5.2".to_string());
        let c = candidates(Vendor::Musa, &env, &[]);
        for want in [
            "libmusart.so",
            "libmusart.so.5",
            "libmusart.so.4",
            "libmusart.so.1.0",
            "/opt/musa-5.2/lib/libmusart.so.5",
            "/usr/local/musa/lib/libmusart.so",
        ] {
            assert!(c.contains(&want.to_string()), "{want} missing from {c:?}");
        }
    }

    #[test]
    fn failure_lists_every_candidate() {
        let c = vec![
            "libnot-a-runtime-xyz.so".to_string(),
            "/nonexistent/libmusart.so".to_string(),
        ];
        let err = open_first(Vendor::Musa, &c).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("libnot-a-runtime-xyz.so (not found)"),
            "{text}"
        );
        assert!(
            text.contains("/nonexistent/libmusart.so (no such file)"),
            "{text}"
        );
        assert_eq!(err.tried.len(), 2);
    }
}
