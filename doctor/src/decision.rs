//! `decision`: what `initialize(protocol, device_name)` would start now, and why — the
//! engine's own `select::decide` over the facts gathered for this run.

use serde_json::json;
use transfer_engine::device::RuntimeUnavailable;
use transfer_engine::transport::select::{
    self, GpuBlocker, GpuPresence, RdmaBlocker, RdmaProblem, Refusal,
};

use crate::host::Inputs;
use crate::probe::{Facts, GpuFacts};
use crate::report::Check;

/// The decision check.
pub fn check(inp: &Inputs, facts: &Facts) -> Check {
    let config = match &facts.config {
        Ok(c) => c,
        Err(e) => {
            return Check::fail(
                "decision",
                format!("initialize would fail: {e}"),
                "fix the variable named above",
            )
        }
    };
    let gpu = match &facts.gpu {
        GpuFacts::Loaded(rt) => GpuPresence::Runtime {
            vendor: rt.vendor(),
            devices: rt.device_count(),
        },
        GpuFacts::Disabled => GpuPresence::Absent(RuntimeUnavailable::Disabled),
        GpuFacts::BadChoice(e) => GpuPresence::Absent(e.clone().into()),
        GpuFacts::NotLoaded(errors) => {
            GpuPresence::Absent(RuntimeUnavailable::NotLoaded(errors.clone()))
        }
    };
    let probing = select::probes_rdma(&inp.protocol, config.force_tcp);
    let verbs = facts
        .verbs
        .as_ref()
        .map(|(_, names)| names.clone())
        .map_err(Clone::clone);
    let topology = match &facts.topology {
        Ok(t) => Some(t),
        Err(e) => {
            return Check::fail(
                "decision",
                format!("initialize would fail: {e}"),
                "fix or unset MC_CUSTOM_TOPO_JSON",
            )
        }
    };
    let peer_memory = facts.peer_memory.first().map(String::as_str);
    let decided = select::decide(&select::Inputs {
        protocol: &inp.protocol,
        force_tcp: config.force_tcp,
        force_hca: config.force_hca,
        topology: if probing { topology } else { None },
        verbs: if probing { Some(&verbs) } else { None },
        memlock: inp.memlock(),
        gpu: &gpu,
        peer_memory_module: peer_memory,
    });
    let asked = format!(
        "initialize(protocol={:?}, device_name={:?}){}{}",
        inp.protocol,
        inp.device_name,
        if config.force_tcp {
            " with MC_FORCE_TCP"
        } else {
            ""
        },
        if config.force_hca {
            " with MC_FORCE_HCA"
        } else {
            ""
        },
    );
    match decided {
        Err(refusal) => Check::fail(
            "decision",
            format!("{asked} would fail: {refusal}"),
            refusal.hint(),
        )
        .with_data(json!({
            "error": refusal.to_string(),
            "refusal": refusal_name(&refusal),
            "blockers": blocker_names(&refusal),
        })),
        Ok(plan) => {
            let mut transports = Vec::new();
            if plan.ipc {
                transports.push("ipc");
            } else if plan.ipc_auto {
                transports.push("ipc (automatic: device memory to engines of this host)");
            }
            if plan.rdma.is_some() {
                transports.push("rdma");
            }
            transports.push("tcp");
            let mut lines = vec![format!("{asked} starts: {}", transports.join(" + "))];
            if let Some(r) = &plan.rdma {
                for (loc, [pref, avail]) in &r.matrix {
                    lines.push(format!(
                        "{loc}: preferred [{}], available [{}]",
                        pref.join(", "),
                        avail.join(", ")
                    ));
                }
            }
            lines.extend(plan.notes.iter().map(|n| format!("why: {n}")));
            lines.extend(plan.warnings.iter().map(|w| format!("warning: {w}")));
            let data = json!({
                "protocol": inp.protocol,
                "transports": transports,
                "hcas": plan.rdma.as_ref().map(|r| r.hcas.iter().map(|h| json!({
                    "name": h.name, "port": h.port, "gid_index": h.gid_index,
                    "link_layer": h.link_layer, "numa_node": h.numa_node, "pci": h.bdf,
                })).collect::<Vec<_>>()),
                "matrix": plan.rdma.as_ref().map(|r| r.matrix.clone()),
                "notes": plan.notes,
                "warnings": plan.warnings,
            });
            let saw = lines.join("\n");
            if plan.warnings.is_empty() {
                Check::ok("decision", saw)
            } else {
                Check::warn(
                    "decision",
                    saw,
                    "see the rdma.* checks; MC_FORCE_HCA=1 makes a fallback to TCP an error, MC_FORCE_TCP=1 bisects RDMA problems",
                )
            }
            .with_data(data)
        }
    }
}

/// The refusal's name in the JSON report (stable, for machines).
fn refusal_name(r: &Refusal) -> &'static str {
    match r {
        Refusal::ProtocolNotServed { .. } => "protocol_not_served",
        Refusal::UnknownProtocol { .. } => "unknown_protocol",
        Refusal::RdmaRequired { .. } => "rdma_required",
        Refusal::GpuUnavailable { .. } => "gpu_unavailable",
        Refusal::Topology { .. } => "topology",
    }
}

/// What stands in the way of a refused transport, one stable name per cause (for
/// machines; the message says the same in words).
fn blocker_names(r: &Refusal) -> Vec<&'static str> {
    match r {
        Refusal::RdmaRequired { cause } => match cause {
            RdmaBlocker::Memlock { .. } => vec!["memlock"],
            RdmaBlocker::Start(_) => vec!["rdma_start"],
            RdmaBlocker::Missing(m) => m
                .problems
                .iter()
                .map(|p| match p {
                    RdmaProblem::NotProbed => "not_probed",
                    RdmaProblem::VerbsUnavailable { .. } => "verbs_unavailable",
                    RdmaProblem::NoHca { .. } => "no_hca",
                    RdmaProblem::NoneMatched { .. } => "filters_match_none",
                    RdmaProblem::NoUsablePort { .. } => "no_usable_port",
                    RdmaProblem::NotListed { .. } => "hcas_not_listed_by_verbs",
                })
                .collect(),
        },
        Refusal::GpuUnavailable { cause, .. } => vec![match cause {
            GpuBlocker::IpcStart { .. } => "ipc_start",
            GpuBlocker::NotMusa { .. } => "not_musa",
            GpuBlocker::NoDevice { .. } => "no_gpu_device",
            GpuBlocker::NoRuntime(_) | GpuBlocker::NotProbed => "no_gpu_runtime",
        }],
        Refusal::ProtocolNotServed { .. } | Refusal::UnknownProtocol { .. } => vec!["protocol"],
        Refusal::Topology { .. } => vec!["topology_file"],
    }
}
