//! The decision table, over hand-made inputs (no host probing).

use super::*;
use crate::topology::HcaChoice;

fn hca(name: &str) -> HcaChoice {
    HcaChoice {
        name: name.into(),
        port: 1,
        gid_index: 1,
        link_layer: "Ethernet".into(),
        lid: 0,
        numa_node: Some(0),
        bdf: None,
    }
}

fn topo(present: &[&str], usable: &[&str]) -> Discovered {
    let mut matrix = Topology::new();
    matrix.insert(
        "cpu:0".into(),
        [usable.iter().map(|s| s.to_string()).collect(), vec![]],
    );
    Discovered {
        root: "/sys".into(),
        present: present.iter().map(|s| s.to_string()).collect(),
        usable: usable.iter().map(|n| hca(n)).collect(),
        unusable: present
            .iter()
            .filter(|p| !usable.contains(p))
            .map(|p| format!("{p}: port 1 is not ACTIVE (state \"1: DOWN\")"))
            .collect(),
        none_matched: None,
        matrix,
        warnings: Vec::new(),
    }
}

const UNLIMITED: Memlock = Memlock {
    limit: None,
    cap_ipc_lock: false,
};

struct Case {
    protocol: &'static str,
    force_tcp: bool,
    force_hca: bool,
    topo: Option<Discovered>,
    verbs: Option<Result<Vec<String>, String>>,
    memlock: Memlock,
    gpu: GpuPresence,
}

impl Case {
    fn new(protocol: &'static str) -> Self {
        Self {
            protocol,
            force_tcp: false,
            force_hca: false,
            topo: Some(topo(&[], &[])),
            verbs: Some(Err("libibverbs.so.1: not found".into())),
            memlock: UNLIMITED,
            gpu: GpuPresence::Absent(RuntimeUnavailable::Disabled),
        }
    }

    fn rdma_host(mut self, hcas: &[&str]) -> Self {
        self.topo = Some(topo(hcas, hcas));
        self.verbs = Some(Ok(hcas.iter().map(|s| s.to_string()).collect()));
        self
    }

    fn decide(&self) -> Result<Plan, Refusal> {
        decide(&Inputs {
            protocol: self.protocol,
            force_tcp: self.force_tcp,
            force_hca: self.force_hca,
            topology: self.topo.as_ref(),
            verbs: self.verbs.as_ref(),
            memlock: self.memlock,
            gpu: &self.gpu,
            peer_memory_module: None,
        })
    }
}

fn tcp_only(p: &Plan) -> bool {
    p.rdma.is_none() && !p.ipc && !p.ipc_auto
}

#[test]
fn force_tcp_probes_nothing_and_gives_tcp() {
    assert!(!probes_rdma("rdma", true));
    assert!(!probes_rdma("", true));
    assert!(!probes_rdma("tcp", false));
    assert!(probes_rdma("rdma", false) && probes_rdma("", false));
    let mut c = Case::new("rdma");
    c.force_tcp = true;
    c.topo = None;
    c.verbs = None;
    let p = c.decide().unwrap();
    assert!(tcp_only(&p) && p.warnings.is_empty(), "{p:?}");
    assert!(p.notes[0].contains("MC_FORCE_TCP"));
    // Bisecting with MC_FORCE_HCA still exported: TCP wins, with a warning.
    c.force_hca = true;
    let p = c.decide().unwrap();
    assert!(tcp_only(&p));
    assert!(p.warnings[0].contains("MC_FORCE_HCA is ignored"));
}

#[test]
fn tcp_is_tcp() {
    let p = Case::new("tcp").rdma_host(&["mlx5_0"]).decide().unwrap();
    assert!(tcp_only(&p) && p.warnings.is_empty());
}

#[test]
fn rdma_without_rdma_falls_back_to_tcp_with_one_warning() {
    let p = Case::new("rdma").decide().unwrap();
    assert!(tcp_only(&p));
    assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
    let w = &p.warnings[0];
    assert!(w.starts_with("falling back to TCP: "), "{w}");
    assert!(
        w.contains("libibverbs.so.1: not found") && w.contains("no RDMA device"),
        "{w}"
    );
}

#[test]
fn force_hca_without_rdma_is_an_error_naming_what_is_missing() {
    let cases: [(&str, Case); 5] = [
        ("verbs library is unavailable", {
            let mut c = Case::new("rdma").rdma_host(&["mlx5_0"]);
            c.verbs = Some(Err("libibverbs.so.1: not found".into()));
            c
        }),
        ("no RDMA device (HCA) under /sys/class/infiniband", {
            let mut c = Case::new("rdma");
            c.verbs = Some(Ok(vec![]));
            c
        }),
        ("port 1 is not ACTIVE", {
            let mut c = Case::new("").rdma_host(&["mlx5_0"]);
            c.topo = Some(topo(&["mlx5_0"], &[]));
            c
        }),
        ("MC_TE_FILTERS (mlx5_9) matches none", {
            let mut c = Case::new("rdma").rdma_host(&["mlx5_0"]);
            let mut t = topo(&["mlx5_0"], &[]);
            t.none_matched =
                Some("MC_TE_FILTERS (mlx5_9) matches none of the HCAs present (mlx5_0)".into());
            c.topo = Some(t);
            c
        }),
        ("RLIMIT_MEMLOCK is 8192 KiB", {
            let mut c = Case::new("rdma").rdma_host(&["mlx5_0"]);
            c.memlock = Memlock {
                limit: Some(8 << 20),
                cap_ipc_lock: false,
            };
            c
        }),
    ];
    for (want, mut c) in cases {
        c.force_hca = true;
        let refusal = c.decide().unwrap_err();
        assert!(
            matches!(refusal, Refusal::RdmaRequired { .. }),
            "{refusal:?}"
        );
        assert!(refusal.hint().contains("MC_FORCE_HCA"));
        let err = refusal.to_string();
        assert!(
            err.starts_with("MC_FORCE_HCA is set but RDMA cannot be used"),
            "{err}"
        );
        assert!(err.contains(want), "want {want:?} in {err}");
    }
}

#[test]
fn rdma_when_usable_with_its_hcas_and_matrix() {
    let mut c = Case::new("rdma").rdma_host(&["mlx5_0", "mlx5_1"]);
    c.verbs = Some(Ok(vec!["mlx5_0".into()]));
    let p = c.decide().unwrap();
    let rdma = p.rdma.unwrap();
    assert_eq!(rdma.hcas, [hca("mlx5_0")]);
    assert_eq!(rdma.matrix["cpu:0"], [vec!["mlx5_0".to_string()], vec![]]);
    assert_eq!(p.warnings.len(), 1);
    assert!(p.warnings[0].contains("mlx5_1") && p.warnings[0].contains("does not list"));
    // Low memlock without the flag: RDMA with a warning; CAP_IPC_LOCK lifts the limit.
    c.verbs = Some(Ok(vec!["mlx5_0".into(), "mlx5_1".into()]));
    c.memlock = Memlock {
        limit: Some(64 << 10),
        cap_ipc_lock: false,
    };
    let p = c.decide().unwrap();
    assert!(p.rdma.is_some() && p.warnings[0].contains("RLIMIT_MEMLOCK"));
    c.memlock.cap_ipc_lock = true;
    assert!(c.decide().unwrap().warnings.is_empty());
}

#[test]
fn empty_protocol_picks_rdma_when_an_hca_is_usable_as_upstream() {
    let p = Case::new("").rdma_host(&["mlx5_0"]).decide().unwrap();
    assert!(p.rdma.is_some());
    assert!(
        p.notes.iter().any(|n| n.contains("as upstream does")),
        "{:?}",
        p.notes
    );
    // No HCA at all: TCP quietly (an info note, no warning).
    let p = Case::new("").decide().unwrap();
    assert!(tcp_only(&p) && p.warnings.is_empty() && !p.notes.is_empty());
    // HCAs present but unusable: a fallback, so a warning.
    let mut c = Case::new("").rdma_host(&["mlx5_0"]);
    c.topo = Some(topo(&["mlx5_0"], &[]));
    let p = c.decide().unwrap();
    assert!(tcp_only(&p) && p.warnings[0].starts_with("falling back to TCP"));
}

#[test]
fn unserved_and_unknown_protocols_are_errors_naming_them() {
    for p in [
        "nvlink", "hip", "ascend", "barex", "efa", "cxi", "ubshmem", "xgmi",
    ] {
        let refusal = Case::new(p).decide().unwrap_err();
        assert!(
            matches!(&refusal, Refusal::ProtocolNotServed { protocol, .. } if protocol == p),
            "{refusal:?}"
        );
        let err = refusal.to_string();
        assert!(
            err.contains(&format!("protocol {p:?}")) && err.contains("not served"),
            "{err}"
        );
    }
    let refusal = Case::new("rmda").decide().unwrap_err();
    assert!(matches!(refusal, Refusal::UnknownProtocol { .. }));
    assert!(refusal.hint().contains("nvlink_intra"));
    let err = refusal.to_string();
    assert!(err.contains("unknown protocol \"rmda\""), "{err}");
}

#[test]
fn ipc_protocols_need_a_gpu_runtime_with_devices() {
    for p in ["nvlink_intra", "musa"] {
        let refusal = Case::new(p).decide().unwrap_err();
        assert!(matches!(refusal, Refusal::GpuUnavailable { .. }));
        assert!(refusal.hint().contains("gpu.runtime"));
        let err = refusal.to_string();
        assert!(err.contains("no GPU runtime") && err.contains(p), "{err}");
        let mut c = Case::new(p);
        c.gpu = GpuPresence::Runtime {
            vendor: Vendor::Musa,
            devices: 0,
        };
        assert!(c
            .decide()
            .unwrap_err()
            .to_string()
            .contains("reports no device"));
        c.gpu = GpuPresence::Runtime {
            vendor: Vendor::Musa,
            devices: 2,
        };
        let plan = c.decide().unwrap();
        assert!(plan.ipc && plan.rdma.is_none());
    }
    let mut c = Case::new("musa");
    c.gpu = GpuPresence::Runtime {
        vendor: Vendor::Cuda,
        devices: 1,
    };
    let refusal = c.decide().unwrap_err();
    assert!(matches!(refusal, Refusal::GpuUnavailable { .. }));
    assert!(refusal.to_string().contains("needs the MUSA runtime"));
    c.protocol = "nvlink_intra";
    assert!(c.decide().unwrap().ipc);
}

#[test]
fn a_gpu_runtime_with_devices_starts_ipc_on_its_own_accord_unless_tcp_is_forced() {
    let gpu = GpuPresence::Runtime {
        vendor: Vendor::Cuda,
        devices: 1,
    };
    for p in ["tcp", "rdma", ""] {
        let mut c = Case::new(p);
        c.gpu = gpu.clone();
        let plan = c.decide().unwrap();
        assert!(plan.ipc_auto && !plan.ipc, "{p:?}: {plan:?}");
        assert!(
            plan.notes.iter().any(|n| n.contains("automatic")),
            "{p:?}: {:?}",
            plan.notes
        );
        c.force_tcp = true;
        assert!(tcp_only(&c.decide().unwrap()), "{p:?} with MC_FORCE_TCP");
        c.force_tcp = false;
        c.gpu = GpuPresence::Runtime {
            vendor: Vendor::Cuda,
            devices: 0,
        };
        assert!(!c.decide().unwrap().ipc_auto, "{p:?} without devices");
    }
    // Asked for, it is not also automatic (its failure to start is then a refusal).
    let mut c = Case::new("nvlink_intra");
    c.gpu = gpu;
    let plan = c.decide().unwrap();
    assert!(plan.ipc && !plan.ipc_auto);
    c.force_tcp = true;
    assert!(tcp_only(&c.decide().unwrap()));
}

/// What stands in the way is data: each problem found, the memlock limit seen.
#[test]
fn force_hca_refusals_carry_each_problem_as_data() {
    let mut c = Case::new("rdma");
    c.force_hca = true;
    match c.decide().unwrap_err() {
        Refusal::RdmaRequired {
            cause: RdmaBlocker::Missing(m),
        } => {
            assert_eq!(
                m.problems,
                [
                    RdmaProblem::VerbsUnavailable {
                        why: "libibverbs.so.1: not found".into()
                    },
                    RdmaProblem::NoHca {
                        root: "/sys".into()
                    },
                ]
            );
            assert!(!m.hca_present);
        }
        other => panic!("{other:?}"),
    }
    let mut c = Case::new("rdma").rdma_host(&["mlx5_0"]);
    c.force_hca = true;
    c.memlock = Memlock {
        limit: Some(8 << 20),
        cap_ipc_lock: false,
    };
    assert!(matches!(
        c.decide().unwrap_err(),
        Refusal::RdmaRequired {
            cause: RdmaBlocker::Memlock { limit }
        } if limit == 8 << 20
    ));
    let mut c = Case::new("musa");
    c.gpu = GpuPresence::Runtime {
        vendor: Vendor::Cuda,
        devices: 1,
    };
    assert!(matches!(
        c.decide().unwrap_err(),
        Refusal::GpuUnavailable {
            cause: GpuBlocker::NotMusa {
                loaded: Vendor::Cuda
            },
            ..
        }
    ));
}
