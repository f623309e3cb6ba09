//! The facts the checks judge, gathered once per run with the engine's own code: the
//! configuration (`Config::from_lookup` over the run's environment), the GPU runtime
//! (`device::load_with`), the verbs library (`Verbs::load_from`), sysfs (`topology`).

use transfer_engine::device::{self, Choice, LoadError, Runtime};
use transfer_engine::topology::{self, gpu::Gpu, sysfs, Discovered};
use transfer_engine::verbs::{self, Verbs};
use transfer_engine::Config;

use crate::host::Inputs;

/// The GPU runtime the engine would load.
pub enum GpuFacts {
    /// `MC_GPU_RUNTIME` is not understood.
    BadChoice(transfer_engine::config::ConfigError),
    /// `MC_GPU_RUNTIME=none`.
    Disabled,
    /// Loaded.
    Loaded(Runtime),
    /// Nothing loaded: each vendor with every candidate tried.
    NotLoaded(Vec<LoadError>),
}

/// Everything the checks look at.
pub struct Facts {
    /// The configuration, or the error naming the bad variable.
    pub config: Result<Config, String>,
    /// The GPU runtime.
    pub gpu: GpuFacts,
    /// The GPUs the runtime reports, for topology.
    pub gpus: Vec<Gpu>,
    /// Where the verbs library was loaded from and the devices it lists, or why not.
    pub verbs: Result<(String, Vec<String>), String>,
    /// Every HCA in sysfs, with ports and GIDs.
    pub hcas: Vec<sysfs::Hca>,
    /// Discovery as `initialize` would do it (filters, port, GID), or why it failed.
    pub topology: Result<Discovered, String>,
    /// Peer-memory kernel modules loaded (from `/proc/modules`, then `/sys/module`).
    pub peer_memory: Vec<String>,
}

/// Gathers the facts for `inp`.
pub fn gather(inp: &Inputs) -> Facts {
    let env = |k: &str| inp.var(k);
    let config = Config::from_lookup(env)
        .map(|mut c| {
            c.sysfs_root = inp.sysfs_root.clone();
            c
        })
        .map_err(|e| e.to_string());
    let gpu = match Choice::parse(inp.var("MC_GPU_RUNTIME").as_deref()) {
        Err(e) => GpuFacts::BadChoice(e),
        Ok(choice) => match device::load_with(choice, &env) {
            Ok(rt) => GpuFacts::Loaded(rt),
            Err(errors) if errors.is_empty() => GpuFacts::Disabled,
            Err(errors) => GpuFacts::NotLoaded(errors),
        },
    };
    let gpus = match &gpu {
        GpuFacts::Loaded(rt) => topology::gpu::of_runtime(rt),
        _ => Vec::new(),
    };
    let verbs = Verbs::load_from(&verbs::loader::candidates(&env))
        .map_err(|e| e.to_string())
        .and_then(|v| {
            let names = v.devices().map_err(|e| e.to_string())?;
            Ok((
                v.path().to_string(),
                names.into_iter().map(|d| d.name).collect(),
            ))
        });
    let hcas = sysfs::hcas(&inp.sysfs_root);
    let topology = match &config {
        Ok(c) => topology::discover(&topology::Params::new(c, &inp.device_name, &gpus))
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.clone()),
    };
    Facts {
        config,
        gpu,
        gpus,
        verbs,
        hcas,
        topology,
        peer_memory: peer_memory_modules(inp),
    }
}

/// Kernel modules that let HCAs register GPU memory.
pub const PEER_MEMORY_MODULES: [&str; 3] = ["mthreads_peermem", "nvidia_peermem", "nv_peer_mem"];

fn peer_memory_modules(inp: &Inputs) -> Vec<String> {
    let listed = std::fs::read_to_string(inp.procfs_root.join("modules")).unwrap_or_default();
    PEER_MEMORY_MODULES
        .iter()
        .filter(|m| {
            listed
                .lines()
                .any(|l| l.split_whitespace().next() == Some(**m))
                || inp.sysfs_root.join("module").join(m).exists()
        })
        .map(|m| m.to_string())
        .collect()
}
