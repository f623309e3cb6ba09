//! The RDMA and topology variables: forcing RDMA, the HCA allow-list, GID, port, MTU, the
//! slicing and queue-pair tuning, and the topology's inputs.

use std::path::PathBuf;

use super::compat::hca_filter;
use super::env::{is_false_word, warn_once, Env};
use super::{Config, ConfigError};

/// The RDMA and topology variables.
pub(super) fn read<F: Fn(&str) -> Option<String>>(
    env: &Env<'_, F>,
    c: &mut Config,
) -> Result<(), ConfigError> {
    let get = env.get;
    if let Some(v) = get("MC_FORCE_HCA") {
        c.force_hca = true;
        if is_false_word(&v) {
            warn_once(&format!(
                "MC_FORCE_HCA={v:?} still forces RDMA: only the variable's presence counts, as for MC_FORCE_TCP; unset it to allow TCP"
            ));
        }
    }
    // The deprecation line was logged by `from_lookup` before any other variable was read.
    c.hca_filter = hca_filter(get).0;
    let gid = env.first_int::<i32>(
        &["MC_GID_INDEX", "NCCL_IB_GID_INDEX"],
        "-1 (automatic) or a GID index 0-255",
    )?;
    if let Some((var, i)) = gid {
        if !(-1..=255).contains(&i) {
            return Err(env.error(var, "-1 (automatic) or a GID index 0-255"));
        }
        c.gid_index = i;
    }
    let ranged = |var: &'static str, lo: u32, hi: u32| -> Result<Option<u32>, ConfigError> {
        let expected = format!("{lo} to {hi}");
        match env.int::<u32>(var, &expected)? {
            Some(n) if !(lo..=hi).contains(&n) => Err(env.error(var, &expected)),
            other => Ok(other),
        }
    };
    if let Some(p) = ranged("MC_IB_PORT", 1, 255)? {
        c.ib_port = p;
    }
    if let Some(m) = env.int::<u32>("MC_MTU", "512, 1024, 2048 or 4096")? {
        if ![512, 1024, 2048, 4096].contains(&m) {
            return Err(env.error("MC_MTU", "512, 1024, 2048 or 4096"));
        }
        c.mtu = m;
    }
    let slice = "bytes, 4096 to 1073741824";
    if let Some(n) = env.int::<u64>("MC_SLICE_SIZE", slice)? {
        if !(4096..=1 << 30).contains(&n) {
            return Err(env.error("MC_SLICE_SIZE", slice));
        }
        c.rdma_slice_size = n;
    }
    if let Some(n) = ranged("MC_NUM_QP_PER_EP", 1, 256)? {
        c.num_qp_per_ep = n;
    }
    if let Some(n) = ranged("MC_MAX_WR", 1, 65536)? {
        c.max_wr = n;
    }
    if let Some(n) = ranged("MC_RETRY_CNT", 0, 1000)? {
        c.retry_cnt = n;
    }
    if let Some(n) = ranged("MC_FRAGMENT_RATIO", 1, 65536)? {
        c.fragment_ratio = n;
    }
    c.custom_topo_json = get("MC_CUSTOM_TOPO_JSON")
        .filter(|v| !v.trim().is_empty())
        .map(PathBuf::from);
    if let Some(root) = get("MC_SYSFS_ROOT").filter(|v| !v.trim().is_empty()) {
        c.sysfs_root = PathBuf::from(root);
    }
    Ok(())
}
