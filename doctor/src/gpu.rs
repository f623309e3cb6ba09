//! `gpu.runtime`: which MUSA / CUDA runtime the engine loads, from where, which version,
//! and the devices it sees.

use serde_json::json;
use transfer_engine::device::Vendor;

use crate::host::Inputs;
use crate::probe::{Facts, GpuFacts};
use crate::report::Check;

/// The GPU runtime check.
pub fn check(inp: &Inputs, facts: &Facts) -> Check {
    let visible: Vec<String> = ["MUSA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"]
        .iter()
        .filter_map(|v| inp.var(v).map(|val| format!("{v}={val:?}")))
        .collect();
    let visible_text = if visible.is_empty() {
        "no *_VISIBLE_DEVICES set".to_string()
    } else {
        visible.join(", ")
    };
    match &facts.gpu {
        GpuFacts::BadChoice(e) => Check::fail(
            "gpu.runtime",
            e.to_string(),
            "set MC_GPU_RUNTIME to auto, musa, cuda or none",
        ),
        GpuFacts::Disabled => Check::ok(
            "gpu.runtime",
            "GPU runtimes are disabled (MC_GPU_RUNTIME=none): only host memory is registered",
        ),
        GpuFacts::Loaded(rt) => {
            let file = mapped_file(rt.path()).unwrap_or_else(|| rt.path().to_string());
            let version = version_of(&file);
            let saw = format!(
                "{} runtime {} loaded from {file}{}; {} device(s) visible ({visible_text})",
                rt.vendor(),
                rt.path(),
                version
                    .as_deref()
                    .map(|v| format!(" (version {v})"))
                    .unwrap_or_default(),
                rt.device_count()
            );
            let data = json!({
                "vendor": rt.vendor().prefix(),
                "library": rt.path(),
                "file": file,
                "version": version,
                "devices": rt.device_count(),
                "visible": visible,
                "gpus": facts.gpus.iter().map(|g| json!({"location": g.location, "pci": g.pci_bus_id})).collect::<Vec<_>>(),
            });
            let check = if rt.device_count() == 0 {
                Check::warn(
                    "gpu.runtime",
                    saw,
                    format!(
                        "the runtime loads but sees no device: check the driver ({}), that the container was given the GPUs, and {}",
                        match rt.vendor() {
                            Vendor::Musa => "mthreads-gmi",
                            Vendor::Cuda => "nvidia-smi",
                        },
                        visible_text
                    ),
                )
            } else {
                Check::ok("gpu.runtime", saw)
            };
            check.with_data(data)
        }
        GpuFacts::NotLoaded(errors) => {
            let tried: Vec<_> = errors
                .iter()
                .map(|e| {
                    json!({
                        "vendor": e.vendor.prefix(),
                        "tried": e.tried.iter().map(|(c, why)| json!({"candidate": c, "error": why})).collect::<Vec<_>>(),
                    })
                })
                .collect();
            let summary: Vec<String> = errors
                .iter()
                .map(|e| {
                    format!(
                        "{}: {} candidate(s) tried, none loaded",
                        e.vendor,
                        e.tried.len()
                    )
                })
                .collect();
            Check::warn(
                "gpu.runtime",
                format!(
                    "no GPU runtime loads ({}): only host memory can be registered; {visible_text}",
                    summary.join("; ")
                ),
                "the wheel does not ship the MUSA runtime: install the MUSA toolkit (libmusart.so under /usr/local/musa/lib) and add it to LD_LIBRARY_PATH, or name the file with MC_MUSART_PATH (CUDA: MC_CUDART_PATH); `--json` lists every path tried",
            )
            .with_data(json!({"tried": tried, "visible": visible}))
        }
    }
}

/// The file the dynamic loader mapped for library `name` (this process's maps).
fn mapped_file(name: &str) -> Option<String> {
    if name.contains('/') {
        return std::fs::canonicalize(name)
            .ok()
            .map(|p| p.display().to_string());
    }
    let stem = name.split(".so").next()?;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|path| {
            path.rsplit('/')
                .next()
                .is_some_and(|f| f.starts_with(&format!("{stem}.so")))
        })
        .map(str::to_string)
}

/// The version in a library's file name (`libmusart.so.5.2.0` -> `5.2.0`).
fn version_of(file: &str) -> Option<String> {
    let name = file.rsplit('/').next()?;
    let (_, v) = name.split_once(".so.")?;
    (!v.is_empty()).then(|| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_comes_from_the_file_name() {
        assert_eq!(
            version_of("/usr/local/musa/lib/libmusart.so.5.2.0").as_deref(),
            Some("5.2.0")
        );
        assert_eq!(version_of("/x/libcudart.so"), None);
    }
}
