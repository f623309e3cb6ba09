//! Which transports an engine starts, decided from what `initialize` asked for, the
//! configuration, and what this host offers. Pure: the caller gathers the inputs (and,
//! when [`probes_rdma`] says no, does not even load verbs or read sysfs) and acts on the
//! [`Plan`].
//!
//! TCP is always started. On top of it:
//! * `"tcp"`: nothing else.
//! * `"rdma"`: RDMA when usable; otherwise one warning saying why and TCP alone, or,
//!   with `MC_FORCE_HCA`, an error naming what is missing.
//! * `""`: what upstream picks automatically: RDMA when an HCA is usable, else TCP
//!   (a warning when HCAs exist but cannot be used; an error with `MC_FORCE_HCA`).
//! * `"nvlink_intra"`, `"musa"`: the same-host GPU IPC transport, when a GPU runtime with
//!   devices is present.
//! * anything else: an error naming the protocol.
//!
//! Besides, whenever a GPU runtime has devices, the same-host GPU IPC transport starts on
//! its own accord (`Plan::ipc_auto`) for device memory between engines of this host.
//!
//! `MC_FORCE_TCP` turns `"rdma"`, `""` and the IPC protocols into TCP alone, with no
//! probing and no automatic IPC, and wins over `MC_FORCE_HCA` (it is the switch for
//! bisecting RDMA problems; upstream installs only TCP then).

mod refusal;

use crate::device::{RuntimeUnavailable, Vendor};
use crate::topology::{Discovered, HcaChoice, Topology};
use refusal::listed_text;
pub use refusal::{GpuBlocker, RdmaBlocker, RdmaMissing, RdmaProblem, Refusal};

/// RLIMIT_MEMLOCK below this (without CAP_IPC_LOCK) is too low to register a KV cache.
pub const LOW_MEMLOCK: u64 = 1 << 30;

/// The GPU runtime as selection sees it.
#[derive(Debug, Clone)]
pub enum GpuPresence {
    /// No runtime is loaded: why.
    Absent(RuntimeUnavailable),
    /// Not looked at (`MC_FORCE_TCP`).
    NotProbed,
    /// A runtime is loaded with this many devices.
    Runtime {
        /// Its vendor.
        vendor: Vendor,
        /// Devices it reports.
        devices: u32,
    },
}

impl GpuPresence {
    /// The runtime's vendor, when it is loaded and sees at least one device.
    fn with_devices(&self) -> Option<Vendor> {
        match self {
            Self::Runtime { vendor, devices } if *devices > 0 => Some(*vendor),
            _ => None,
        }
    }
}

/// How much memory this process may pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memlock {
    /// RLIMIT_MEMLOCK soft limit in bytes; `None`: unlimited.
    pub limit: Option<u64>,
    /// Whether CAP_IPC_LOCK is effective (the limit then does not apply).
    pub cap_ipc_lock: bool,
}

impl Memlock {
    fn too_low(&self) -> Option<u64> {
        match self.limit {
            Some(l) if l < LOW_MEMLOCK && !self.cap_ipc_lock => Some(l),
            _ => None,
        }
    }
}

/// Everything the decision looks at.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    /// The `protocol` argument of `initialize`.
    pub protocol: &'a str,
    /// `MC_FORCE_TCP`.
    pub force_tcp: bool,
    /// `MC_FORCE_HCA`.
    pub force_hca: bool,
    /// Discovered and filtered HCAs; `None` when not probed.
    pub topology: Option<&'a Discovered>,
    /// The device names the verbs library lists, or why it is unavailable; `None` when
    /// not probed.
    pub verbs: Option<&'a Result<Vec<String>, String>>,
    /// Memory pinning limits.
    pub memlock: Memlock,
    /// The GPU runtime.
    pub gpu: &'a GpuPresence,
    /// The loaded peer-memory kernel module, if any (GPU memory over RDMA needs one).
    pub peer_memory_module: Option<&'a str>,
}

/// The RDMA part of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaPlan {
    /// HCAs to open, each with its port and GID index.
    pub hcas: Vec<HcaChoice>,
    /// Location -> `[preferred, available]` over those HCAs (the descriptor's
    /// `priority_matrix`).
    pub matrix: Topology,
}

/// What to start, and what to tell the user.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct Plan {
    /// Start the RDMA transport (besides TCP).
    pub rdma: Option<RdmaPlan>,
    /// Start the same-host GPU IPC transport (besides TCP): asked for, so failing to
    /// start it fails `initialize`.
    pub ipc: bool,
    /// Start it on its own accord (a GPU runtime with devices; not asked for, not
    /// `MC_FORCE_TCP`): it takes device-to-device requests to engines of this host, and
    /// failing to start it is a warning.
    pub ipc_auto: bool,
    /// Warnings, each to be logged once.
    pub warnings: Vec<String>,
    /// What was chosen and why, for an info line.
    pub notes: Vec<String>,
}

impl Plan {
    fn tcp() -> Self {
        Self {
            rdma: None,
            ipc: false,
            ipc_auto: false,
            warnings: Vec::new(),
            notes: Vec::new(),
        }
    }
}

/// Protocols upstream knows that this engine does not serve, with what they are.
const UNSERVED: &[(&str, &str)] = &[
    ("nvlink", "multi-node NVLink fabric memory (MNNVL)"),
    ("hip", "AMD GPU IPC (HIP)"),
    ("xgmi", "AMD xGMI"),
    ("ascend", "Huawei Ascend"),
    ("hccl", "Huawei Ascend HCCL"),
    ("barex", "Alibaba BareX"),
    ("efa", "AWS Elastic Fabric Adapter"),
    ("cxi", "HPE Slingshot CXI"),
    ("ubshmem", "UB shared memory"),
    ("sunrise_link", "Sunrise Link"),
    ("maca", "MetaX MACA GPU IPC"),
    ("cxl", "CXL memory"),
    ("nvmeof", "NVMe over Fabrics"),
];

pub(super) const SERVED: &str = "this engine serves \"tcp\", \"rdma\", \"\" (automatic: RDMA when an HCA is usable, else TCP), and \"nvlink_intra\" / \"musa\" where a GPU runtime with devices is present";

/// Whether the decision for `protocol` needs the verbs library and the HCA topology.
/// When false the caller must not load verbs nor read sysfs for HCAs.
pub fn probes_rdma(protocol: &str, force_tcp: bool) -> bool {
    !force_tcp && matches!(protocol, "rdma" | "")
}

/// Decides the transports. An error is the reason `initialize` fails.
pub fn decide(inp: &Inputs<'_>) -> Result<Plan, Refusal> {
    let p = inp.protocol;
    if let Some((_, what)) = UNSERVED.iter().find(|(name, _)| *name == p) {
        return Err(Refusal::ProtocolNotServed {
            protocol: p.to_string(),
            what,
        });
    }
    let known = matches!(p, "tcp" | "rdma" | "" | "nvlink_intra" | "musa");
    if !known {
        return Err(Refusal::UnknownProtocol {
            protocol: p.to_string(),
        });
    }
    let mut plan = Plan::tcp();
    if inp.force_tcp {
        if inp.force_hca {
            plan.warnings.push(
                "MC_FORCE_HCA is ignored: MC_FORCE_TCP is also set, and it wins (TCP only)".into(),
            );
        }
        if p != "tcp" {
            plan.notes.push(format!(
                "protocol {p:?}: MC_FORCE_TCP is set, so only TCP is started (RDMA not probed)"
            ));
        }
        return Ok(plan);
    }
    let mut plan = match p {
        "tcp" => {
            if inp.force_hca {
                plan.warnings
                    .push("MC_FORCE_HCA is ignored: initialize asked for protocol \"tcp\"".into());
            }
            plan
        }
        "nvlink_intra" | "musa" => decide_ipc(p, inp.gpu, plan)?,
        _ => decide_rdma(inp, plan)?,
    };
    if let Some(vendor) = inp.gpu.with_devices() {
        if !plan.ipc {
            plan.ipc_auto = true;
            plan.notes.push(format!(
                "same-host GPU IPC over {vendor} for device memory between engines of this host, \
                 automatic (MC_DISABLE_IPC=1 keeps it to peers of the IPC protocol, MC_FORCE_TCP=1 \
                 turns it off)"
            ));
        }
    }
    Ok(plan)
}

fn decide_ipc(p: &str, gpu: &GpuPresence, mut plan: Plan) -> Result<Plan, Refusal> {
    let refuse = |cause: GpuBlocker| {
        Err(Refusal::GpuUnavailable {
            protocol: p.to_string(),
            cause,
        })
    };
    match gpu {
        GpuPresence::Runtime { vendor, devices } if *devices > 0 => {
            if p == "musa" && *vendor != Vendor::Musa {
                return refuse(GpuBlocker::NotMusa { loaded: *vendor });
            }
            plan.ipc = true;
            plan.notes.push(format!(
                "protocol {p:?}: same-host GPU IPC over {vendor} ({devices} device(s)), TCP beside it"
            ));
            Ok(plan)
        }
        GpuPresence::Runtime { vendor, .. } => refuse(GpuBlocker::NoDevice { vendor: *vendor }),
        GpuPresence::Absent(why) => refuse(GpuBlocker::NoRuntime(why.clone())),
        GpuPresence::NotProbed => refuse(GpuBlocker::NotProbed),
    }
}

fn decide_rdma(inp: &Inputs<'_>, mut plan: Plan) -> Result<Plan, Refusal> {
    let auto = inp.protocol.is_empty();
    let usable = rdma_usable(inp, &mut plan.warnings);
    let memlock_low = inp.memlock.too_low();
    match usable {
        Ok(rdma) => {
            if let Some(limit) = memlock_low {
                let low = RdmaBlocker::Memlock { limit };
                if inp.force_hca {
                    return Err(Refusal::RdmaRequired { cause: low });
                }
                plan.warnings.push(low.to_string());
            }
            if inp.gpu.with_devices().is_some() && inp.peer_memory_module.is_none() {
                plan.notes.push(
                    "no peer-memory module (mthreads_peermem, nvidia_peermem) is loaded: registering GPU memory with the HCAs is checked, and reported, when it is registered".into(),
                );
            }
            let names: Vec<&str> = rdma.hcas.iter().map(|h| h.name.as_str()).collect();
            plan.notes.push(format!(
                "protocol {:?}: RDMA over {}{}",
                inp.protocol,
                names.join(", "),
                if auto {
                    " (chosen as upstream does when an HCA is found)"
                } else {
                    ""
                }
            ));
            plan.rdma = Some(rdma);
            Ok(plan)
        }
        Err(missing) if inp.force_hca => Err(Refusal::RdmaRequired {
            cause: missing.into(),
        }),
        Err(missing) => {
            if auto && !missing.hca_present {
                plan.notes.push(format!(
                    "protocol \"\": no HCA found, TCP chosen ({missing})"
                ));
            } else {
                plan.warnings.push(format!(
                    "falling back to TCP: protocol {:?} asked for RDMA, but {missing} (set MC_FORCE_HCA=1 to make this an error)",
                    inp.protocol
                ));
            }
            Ok(plan)
        }
    }
}

fn rdma_usable(inp: &Inputs<'_>, warnings: &mut Vec<String>) -> Result<RdmaPlan, RdmaMissing> {
    let (Some(topo), Some(verbs)) = (inp.topology, inp.verbs) else {
        return Err(RdmaMissing {
            problems: vec![RdmaProblem::NotProbed],
            hca_present: false,
        });
    };
    let hca_present = !topo.present.is_empty();
    let fail = |problems: Vec<RdmaProblem>| RdmaMissing {
        problems,
        hca_present,
    };
    warnings.extend(topo.warnings.iter().cloned());
    let mut problems = Vec::new();
    if let Err(why) = verbs {
        problems.push(RdmaProblem::VerbsUnavailable { why: why.clone() });
    }
    if !hca_present {
        problems.push(RdmaProblem::NoHca {
            root: topo.root.clone(),
        });
    } else if let Some(why) = &topo.none_matched {
        problems.push(RdmaProblem::NoneMatched { why: why.clone() });
    } else if topo.usable.is_empty() {
        problems.push(RdmaProblem::NoUsablePort {
            unusable: topo.unusable.clone(),
        });
    }
    let listed = match verbs {
        Ok(listed) if problems.is_empty() => listed,
        _ => return Err(fail(problems)),
    };
    let (hcas, unlisted): (Vec<HcaChoice>, Vec<HcaChoice>) = topo
        .usable
        .iter()
        .cloned()
        .partition(|h| listed.contains(&h.name));
    let listed_text = listed_text(listed);
    if hcas.is_empty() {
        return Err(fail(vec![RdmaProblem::NotListed {
            usable: unlisted.into_iter().map(|h| h.name).collect(),
            listed: listed.clone(),
        }]));
    }
    for h in &unlisted {
        warnings.push(format!(
            "HCA {} is in sysfs but the verbs library does not list it (it lists: {listed_text}); not used",
            h.name
        ));
    }
    let keep: Vec<&str> = hcas.iter().map(|h| h.name.as_str()).collect();
    let mut matrix = topo.matrix.clone();
    for lists in matrix.values_mut() {
        for list in lists.iter_mut() {
            list.retain(|n| keep.contains(&n.as_str()));
        }
    }
    Ok(RdmaPlan { hcas, matrix })
}

#[cfg(test)]
mod tests;
