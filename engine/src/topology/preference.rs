//! Which HCAs each memory location prefers, computed as upstream's `topology.cpp` does.
//!
//! * `cpu:N`: the HCAs on NUMA node N are preferred, every other HCA is available.
//! * a GPU: the candidates are the HCAs on the GPU's NUMA node (all HCAs when none is
//!   there or the node is unknown); among them, those at the smallest PCIe distance are
//!   preferred and every other HCA is available. A GPU whose PCI placement is unknown
//!   prefers none and has every HCA available.
//!
//! Pure: the caller resolves sysfs paths; this only compares them.

use super::Topology;

/// Where a device sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// HCA name, or the GPU's location (`cuda:0`, `musa:3`).
    pub name: String,
    /// NUMA node, if known.
    pub numa: Option<i32>,
    /// The resolved sysfs path of its PCI function (`/sys/devices/pci0000:17/.../0000:18:00.0`).
    pub pci_path: Option<String>,
}

/// Upstream's PCIe distance: strip the longest common prefix of the two resolved paths
/// (character by character) and count the `/` left in both remainders.
pub fn pci_distance(a: &str, b: &str) -> usize {
    let common = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    let slashes = |s: &str| s.bytes().skip(common).filter(|&c| c == b'/').count();
    slashes(a) + slashes(b)
}

/// The location -> `[preferred, available]` map for `hcas` (in their order), NUMA
/// `nodes` and `gpus`.
pub fn matrix(hcas: &[Place], nodes: &[u32], gpus: &[Place]) -> Topology {
    let mut topo = Topology::new();
    for &node in nodes {
        let on_node = |h: &Place| h.numa == Some(node as i32);
        topo.insert(format!("cpu:{node}"), split(hcas, on_node));
    }
    for gpu in gpus {
        topo.insert(gpu.name.clone(), split(hcas, preferred_for_gpu(hcas, gpu)));
    }
    topo
}

fn preferred_for_gpu<'a>(hcas: &'a [Place], gpu: &Place) -> impl Fn(&Place) -> bool + 'a {
    let local: Vec<&Place> = hcas
        .iter()
        .filter(|h| gpu.numa.is_some() && h.numa == gpu.numa)
        .collect();
    let candidates: Vec<&Place> = if local.is_empty() {
        hcas.iter().collect()
    } else {
        local
    };
    let distances: Vec<(&str, usize)> = match &gpu.pci_path {
        Some(g) => candidates
            .iter()
            .filter_map(|h| Some((h.name.as_str(), pci_distance(h.pci_path.as_deref()?, g))))
            .collect(),
        None => Vec::new(),
    };
    let min = distances.iter().map(|&(_, d)| d).min();
    let nearest: Vec<String> = distances
        .iter()
        .filter(|&&(_, d)| Some(d) == min)
        .map(|&(n, _)| n.to_string())
        .collect();
    move |h: &Place| nearest.contains(&h.name)
}

fn split(hcas: &[Place], preferred: impl Fn(&Place) -> bool) -> [Vec<String>; 2] {
    let (pref, avail): (Vec<&Place>, Vec<&Place>) = hcas.iter().partition(|h| preferred(h));
    let names = |v: Vec<&Place>| v.into_iter().map(|h| h.name.clone()).collect();
    [names(pref), names(avail)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(name: &str, numa: i32, path: &str) -> Place {
        Place {
            name: name.into(),
            numa: Some(numa),
            pci_path: Some(path.into()),
        }
    }

    #[test]
    fn distance_counts_slashes_after_the_common_prefix() {
        let gpu = "/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:00.0";
        let same_switch = "/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0/0000:1a:00.0";
        let other_root = "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0";
        assert_eq!(pci_distance(gpu, gpu), 0);
        // Siblings behind one switch: the remainders (`9:00.0`, `a:00.0`) hold no `/`.
        assert_eq!(pci_distance(gpu, same_switch), 0);
        assert!(pci_distance(gpu, other_root) > pci_distance(gpu, same_switch));
        assert_eq!(pci_distance("/a/b/c", "/a/d/e/f"), 1 + 2);
    }

    #[test]
    fn gpu_prefers_the_nearest_hcas_on_its_node_and_cpu_its_node() {
        let hcas = [
            place("mlx5_0", 0, "/d/pci0/sw0/hca0"),
            place("mlx5_1", 0, "/d/pci0/sw1/hca1"),
            place("mlx5_2", 1, "/d/pci1/sw2/hca2"),
        ];
        let gpus = [
            place("cuda:0", 0, "/d/pci0/sw0/gpu0"),
            Place {
                name: "cuda:1".into(),
                numa: None,
                pci_path: None,
            },
        ];
        let t = matrix(&hcas, &[0, 1], &gpus);
        assert_eq!(t["cuda:0"], [vec!["mlx5_0"], vec!["mlx5_1", "mlx5_2"]]);
        assert_eq!(t["cuda:1"], [vec![], vec!["mlx5_0", "mlx5_1", "mlx5_2"]]);
        assert_eq!(t["cpu:0"], [vec!["mlx5_0", "mlx5_1"], vec!["mlx5_2"]]);
        assert_eq!(t["cpu:1"], [vec!["mlx5_2"], vec!["mlx5_0", "mlx5_1"]]);
    }

    #[test]
    fn gpu_on_a_node_without_hcas_considers_all_and_ties_are_all_preferred() {
        let hcas = [place("a", 0, "/d/pci0/x/h0"), place("b", 0, "/d/pci0/y/h1")];
        let t = matrix(&hcas, &[], &[place("musa:0", 1, "/d/pci1/z/g0")]);
        assert_eq!(t["musa:0"], [vec!["a", "b"], vec![]]);
    }
}
