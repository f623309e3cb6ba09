//! `rdma.*`: the verbs library, `/dev/infiniband`, HCAs with their ports and GIDs, the
//! HCA allow-lists, peer-memory modules, memlock, and whether this is a container that
//! was started without the RDMA devices.
//!
//! A problem is a warning when the engine would fall back to TCP, a failure when
//! `MC_FORCE_HCA` makes `initialize` fail, and only information when RDMA is not asked
//! for (protocol `tcp`, `MC_FORCE_TCP`).

use std::path::Path;

use serde_json::json;
use transfer_engine::config::hca_filter;
use transfer_engine::topology::{filters, sysfs};
use transfer_engine::transport::select::{self, LOW_MEMLOCK};

use crate::host::Inputs;
use crate::probe::{Facts, GpuFacts};
use crate::report::Check;

/// How bad an RDMA problem is for this run.
#[derive(Clone, Copy)]
struct Stakes {
    wanted: bool,
    force_hca: bool,
}

impl Stakes {
    fn of(inp: &Inputs) -> Self {
        let force_tcp = inp.var("MC_FORCE_TCP").is_some();
        Self {
            wanted: select::probes_rdma(&inp.protocol, force_tcp),
            force_hca: inp.var("MC_FORCE_HCA").is_some() && !force_tcp,
        }
    }

    fn problem(self, id: &'static str, saw: String, fix: String) -> Check {
        match (self.wanted, self.force_hca) {
            (false, _) => Check::ok(id, format!("{saw} (RDMA not asked for)")),
            (true, true) => Check::fail(id, saw, format!("{fix} (MC_FORCE_HCA makes this fatal)")),
            (true, false) => Check::warn(id, saw, fix),
        }
    }
}

/// All RDMA checks.
pub fn checks(inp: &Inputs, facts: &Facts) -> Vec<Check> {
    let stakes = Stakes::of(inp);
    let container = container_kind(inp);
    vec![
        verbs(facts, stakes),
        dev_infiniband(inp, facts, stakes, container.as_deref()),
        hcas(inp, facts, stakes),
        filter_vars(inp, facts, stakes),
        peer_memory(facts),
        memlock(inp, facts, stakes, container.as_deref()),
    ]
}

fn verbs(facts: &Facts, stakes: Stakes) -> Check {
    match &facts.verbs {
        Ok((path, devices)) => Check::ok(
            "rdma.verbs",
            format!("{path} loaded; it lists: {}", listing(devices)),
        )
        .with_data(json!({"library": path, "devices": devices})),
        Err(why) => stakes
            .problem(
                "rdma.verbs",
                why.clone(),
                if facts.hcas.is_empty() {
                    "install rdma-core (libibverbs1 and the provider of your NIC, e.g. ibverbs-providers) on a host with an HCA; MC_IBVERBS_PATH names the library file".into()
                } else {
                    "install rdma-core (libibverbs1, ibverbs-providers) in this image; in a container pass the devices (--device /dev/infiniband); MC_IBVERBS_PATH names the library file".into()
                },
            )
            .with_data(json!({"error": why})),
    }
}

fn dev_infiniband(inp: &Inputs, facts: &Facts, stakes: Stakes, container: Option<&str>) -> Check {
    let dir = inp.dev_root.join("infiniband");
    let mut nodes: Vec<String> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    nodes.sort();
    let data = json!({"path": dir.display().to_string(), "nodes": nodes, "container": container});
    let has_uverbs = nodes.iter().any(|n| n.starts_with("uverbs"));
    if facts.hcas.is_empty() {
        return Check::ok(
            "rdma.dev",
            format!(
                "{}: {} (and no HCA in sysfs)",
                dir.display(),
                listing(&nodes)
            ),
        )
        .with_data(data);
    }
    if has_uverbs {
        return Check::ok(
            "rdma.dev",
            format!("{}: {}", dir.display(), nodes.join(", ")),
        )
        .with_data(data);
    }
    let (saw, fix) = match container {
        Some(kind) => (
            format!(
                "{} has no uverbs device while sysfs shows HCA(s) {}: this {kind} container was started without --device /dev/infiniband",
                dir.display(),
                names(&facts.hcas)
            ),
            "start the container with --device /dev/infiniband (docker/podman; Kubernetes: the RDMA device plugin) and --ulimit memlock=-1:-1 --cap-add IPC_LOCK".to_string(),
        ),
        None => (
            format!(
                "{} has no uverbs device while sysfs shows HCA(s) {}",
                dir.display(),
                names(&facts.hcas)
            ),
            "load the kernel's user verbs (modprobe ib_uverbs, and rdma_ucm) and check the device permissions".to_string(),
        ),
    };
    stakes.problem("rdma.dev", saw, fix).with_data(data)
}

fn hcas(inp: &Inputs, facts: &Facts, stakes: Stakes) -> Check {
    let root = inp.sysfs_root.display();
    let ib_port = facts.config.as_ref().map_or(1, |c| c.ib_port);
    let mut lines = Vec::new();
    let mut data = Vec::new();
    for h in &facts.hcas {
        for p in &h.ports {
            let gids: Vec<String> = p
                .gids
                .iter()
                .map(|g| format!("{} {} ({})", g.index, g.gid, gid_kind(&g.kind)))
                .collect();
            lines.push(format!(
                "{} port {}: {} {} numa {} pci {}; GIDs: {}",
                h.name,
                p.num,
                p.state,
                p.link_layer,
                h.numa_node.map_or("?".into(), |n| n.to_string()),
                h.bdf.as_deref().unwrap_or("?"),
                if gids.is_empty() {
                    "none".into()
                } else {
                    gids.join(", ")
                }
            ));
            data.push(json!({
                "hca": h.name, "port": p.num, "state": p.state, "active": p.active,
                "link_layer": p.link_layer, "lid": p.lid, "numa_node": h.numa_node, "pci": h.bdf,
                "gids": p.gids.iter().map(|g| json!({"index": g.index, "gid": g.gid.to_string(), "type": gid_kind(&g.kind)})).collect::<Vec<_>>(),
                "auto_gid_index": sysfs::auto_gid_index(p),
            }));
        }
    }
    let data = json!({"sysfs_root": root.to_string(), "ports": data});
    if facts.hcas.is_empty() {
        return stakes
            .problem(
                "rdma.hcas",
                format!("no RDMA device (HCA) under {root}/class/infiniband: transfers would use TCP"),
                "on a host with an RDMA NIC, load its driver (mlx5_ib, ...); in a container, mount the host's /sys (the default) and pass --device /dev/infiniband".into(),
            )
            .with_data(data);
    }
    let detail = lines.join("\n");
    match &facts.topology {
        Ok(topo) if !topo.usable.is_empty() => {
            let used: Vec<String> = topo
                .usable
                .iter()
                .map(|c| format!("{} (port {}, GID {})", c.name, c.port, c.gid_index))
                .collect();
            let mut saw = format!("usable: {}\n{detail}", used.join(", "));
            if !topo.unusable.is_empty() {
                saw.push_str(&format!("\nnot usable: {}", topo.unusable.join("; ")));
            }
            Check::ok("rdma.hcas", saw).with_data(data)
        }
        Ok(topo) if topo.none_matched.is_none() => stakes
            .problem(
                "rdma.hcas",
                format!("no HCA has a usable port {ib_port}: {}\n{detail}", topo.unusable.join("; ")),
                format!("a port that is not ACTIVE has no link: check the cable and switch (`ibstat`, `ibv_devinfo`), or pick another port with MC_IB_PORT (now {ib_port}); an empty GID table means no IP on the RoCE interface"),
            )
            .with_data(data),
        Ok(_) => Check::ok(
            "rdma.hcas",
            format!("present (the allow-list leaves none, see rdma.filters)\n{detail}"),
        )
        .with_data(data),
        Err(e) => Check::fail("rdma.hcas", e.clone(), "fix or unset MC_CUSTOM_TOPO_JSON")
            .with_data(data),
    }
}

fn filter_vars(inp: &Inputs, facts: &Facts, stakes: Stakes) -> Check {
    let (filter, var_warning) = hca_filter(&|k| inp.var(k));
    let present: Vec<String> = facts.hcas.iter().map(|h| h.name.clone()).collect();
    let f = filters::apply(&present, filter.as_ref(), &inp.device_name);
    let data = json!({
        "MC_TE_FILTERS": inp.var("MC_TE_FILTERS"),
        "MOONCAKE_RDMA_DEVICES": inp.var("MOONCAKE_RDMA_DEVICES"),
        "device_name": inp.device_name,
        "from": filter.as_ref().map(|f| f.var),
        "selected": f.kept,
    });
    let source = match (&filter, inp.device_name.is_empty()) {
        (None, true) => {
            "no allow-list (MC_TE_FILTERS unset, no device_name): every HCA".to_string()
        }
        (Some(fl), true) => format!("{}={}", fl.var, fl.names.join(",")),
        (None, false) => format!("device_name={}", inp.device_name),
        (Some(fl), false) => format!(
            "{}={} and device_name={}",
            fl.var,
            fl.names.join(","),
            inp.device_name
        ),
    };
    let saw = format!("{source}; selects: {}", listing(&f.kept));
    let legacy = inp.var("MOONCAKE_RDMA_DEVICES").is_some();
    let mut warnings: Vec<String> = var_warning.into_iter().collect();
    warnings.extend(f.warnings);
    if let Some(why) = &f.none_matched {
        let mut fix = format!(
            "name HCAs this host has ({}) in MC_TE_FILTERS / device_name (`ls {}/class/infiniband`)",
            listing(&present),
            inp.sysfs_root.display()
        );
        if legacy {
            fix.push_str("; unset the legacy MOONCAKE_RDMA_DEVICES");
        }
        let mut saw = format!("{saw}: {why}");
        if legacy {
            saw.push_str(&format!("; {}", warnings.join("; ")));
        }
        return stakes.problem("rdma.filters", saw, fix).with_data(data);
    }
    if warnings.is_empty() {
        return Check::ok("rdma.filters", saw).with_data(data);
    }
    let fix = if legacy {
        "use MC_TE_FILTERS (comma list of HCA names) and unset the legacy MOONCAKE_RDMA_DEVICES"
    } else {
        "name only HCAs this host has in MC_TE_FILTERS / device_name"
    };
    Check::warn(
        "rdma.filters",
        format!("{saw}; {}", warnings.join("; ")),
        fix,
    )
    .with_data(data)
}

fn peer_memory(facts: &Facts) -> Check {
    let data = json!({"loaded": facts.peer_memory});
    let gpu = match &facts.gpu {
        GpuFacts::Loaded(rt) if rt.device_count() > 0 => Some(rt.vendor()),
        _ => None,
    };
    if let Some(m) = facts.peer_memory.first() {
        return Check::ok(
            "rdma.peermem",
            format!("{m} is loaded: HCAs can register GPU memory"),
        )
        .with_data(data);
    }
    match gpu {
        Some(vendor) if !facts.hcas.is_empty() => {
            let module = match vendor {
                transfer_engine::device::Vendor::Musa => "mthreads_peermem",
                transfer_engine::device::Vendor::Cuda => "nvidia_peermem",
            };
            Check::warn(
                "rdma.peermem",
                format!("a {vendor} GPU and HCA(s) are present but no peer-memory module ({module}) is loaded: GPUDirect RDMA of GPU memory will fail"),
                format!("on the host: modprobe {module} (lsmod | grep {module}), then restart the service"),
            )
            .with_data(data)
        }
        Some(_) => Check::ok(
            "rdma.peermem",
            "no peer-memory module loaded (no HCA: not needed)",
        )
        .with_data(data),
        None => Check::ok(
            "rdma.peermem",
            "no peer-memory module loaded (no GPU device: not needed)",
        )
        .with_data(data),
    }
}

fn memlock(inp: &Inputs, facts: &Facts, stakes: Stakes, container: Option<&str>) -> Check {
    let m = inp.memlock();
    let limit = m
        .limit
        .map_or("unlimited".to_string(), |l| format!("{} KiB", l >> 10));
    let saw = format!(
        "RLIMIT_MEMLOCK {limit}, CAP_IPC_LOCK {}",
        if m.cap_ipc_lock { "held" } else { "not held" }
    );
    let data = json!({"limit": m.limit, "cap_ipc_lock": m.cap_ipc_lock, "low_below": LOW_MEMLOCK});
    let low = matches!(m.limit, Some(l) if l < LOW_MEMLOCK) && !m.cap_ipc_lock;
    if !low {
        return Check::ok("rdma.memlock", saw).with_data(data);
    }
    let fix = match container {
        Some(_) => "start the container with --ulimit memlock=-1:-1 (or --cap-add IPC_LOCK)".to_string(),
        None => "raise it: `ulimit -l unlimited`, LimitMEMLOCK=infinity in the systemd unit, or memlock unlimited in /etc/security/limits.conf; docker: --ulimit memlock=-1:-1".to_string(),
    };
    let saw = format!("{saw}: registering memory with the HCAs pins it and fails past the limit");
    let check = if facts.hcas.is_empty() {
        Check::ok("rdma.memlock", format!("{saw} (no HCA: not needed now)"))
    } else {
        stakes.problem("rdma.memlock", saw, fix)
    };
    check.with_data(data)
}

/// `docker`, `kubernetes`, ... when this looks like a container.
pub fn container_kind(inp: &Inputs) -> Option<String> {
    let base = inp.dev_root.parent().unwrap_or(Path::new("/"));
    if base.join(".dockerenv").exists() {
        return Some("docker".into());
    }
    if base.join("run/.containerenv").exists() {
        return Some("podman".into());
    }
    let cgroup = std::fs::read_to_string(inp.procfs_root.join("1/cgroup")).unwrap_or_default();
    ["kubepods", "docker", "containerd", "lxc", "libpod"]
        .iter()
        .find(|k| cgroup.contains(*k))
        .map(|k| k.to_string())
}

fn gid_kind(k: &sysfs::GidKind) -> String {
    match k {
        sysfs::GidKind::RoceV2 => "RoCE v2".into(),
        sysfs::GidKind::IbRoceV1 => "IB/RoCE v1".into(),
        sysfs::GidKind::Other(s) => s.clone(),
    }
}

fn names(hcas: &[sysfs::Hca]) -> String {
    hcas.iter()
        .map(|h| h.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn listing(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}
