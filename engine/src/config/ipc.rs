//! Same-host GPU IPC's section ([`IpcConfig`]) and how it is read.

use std::time::Duration;

use super::env::Env;
use super::ConfigError;

/// Same-host GPU IPC: `MC_DISABLE_IPC` and the tuning of ours, upstream's
/// `MC_INTRANODE_NVLINK`, `MC_FORCE_MUSA` / `MC_FORCE_MNNVL` and `MC_MUSA_IPC_OPEN_DEVICE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpcConfig {
    /// `MC_DISABLE_IPC` (ours): device-to-device requests to same-host peers of protocol
    /// `tcp` or `rdma` keep that protocol instead of going over IPC.
    pub disable: bool,
    /// `MC_INTRANODE_NVLINK` (presence, as upstream): with CUDA, advertise `nvlink_intra`
    /// as the segment's protocol.
    pub intranode_nvlink: bool,
    /// `MC_FORCE_MUSA` or `MC_FORCE_MNNVL` (presence, as upstream): with MUSA, advertise
    /// `musa` as the segment's protocol.
    pub force_musa: bool,
    /// `MC_MUSA_IPC_OPEN_DEVICE=metadata`: open peer handles on the device the peer's
    /// buffer names instead of the local buffer's (`current`).
    pub open_on_buffer_device: bool,
    /// `MC_HOST_ID` (ours): this host's identity instead of the kernel's `boot_id`.
    pub host_id: Option<String>,
    /// `MC_IPC_SLICE_SIZE` (ours, bytes, 4096 to 1 GiB): largest piece of a request.
    pub slice_size: u64,
    /// `MC_IPC_COPY_THREADS` (ours, 1 to 16): copy threads, one stream per device each.
    pub copy_threads: usize,
    /// `MC_IPC_REVOKE_TIMEOUT` (ours, seconds, 1 to 600): how long `unregister_memory`
    /// waits for same-host peers holding a mapping of the memory to let go.
    pub revoke_timeout: Duration,
    /// `MC_IPC_BATCH_COPY` (ours, default on): scattered slices of a copy thread's group
    /// go to the device in one `cudaMemcpyBatchAsync` where the runtime has it; off: one
    /// `MemcpyAsync` per copy.
    pub batch_copy: bool,
}

/// Default of `MC_IPC_SLICE_SIZE`: measured on two H200s over NV18, 64 MiB requests ran at
/// the raw peer-copy rate with 64 MiB slices and at 0.78 of it with 4 MiB slices (more
/// streams interleaving on one link); smaller requests are not affected.
pub const DEFAULT_IPC_SLICE_SIZE: u64 = 64 << 20;

impl Default for IpcConfig {
    fn default() -> Self {
        Self {
            disable: false,
            intranode_nvlink: false,
            force_musa: false,
            open_on_buffer_device: false,
            host_id: None,
            slice_size: DEFAULT_IPC_SLICE_SIZE,
            copy_threads: 4,
            revoke_timeout: Duration::from_secs(5),
            batch_copy: true,
        }
    }
}

pub(super) fn read<F: Fn(&str) -> Option<String>>(
    env: &Env<'_, F>,
) -> Result<IpcConfig, ConfigError> {
    let get = env.get;
    let mut ipc = IpcConfig::default();
    let ranged =
        |var: &'static str, lo: u64, hi: u64, what: &str| -> Result<Option<u64>, ConfigError> {
            let expected = format!("{what}, {lo} to {hi}");
            match env.int::<u64>(var, &expected)? {
                Some(n) if !(lo..=hi).contains(&n) => Err(env.error(var, &expected)),
                n => Ok(n),
            }
        };
    ipc.disable = env.switch(
        "MC_DISABLE_IPC",
        false,
        "1 to turn same-host GPU IPC off for tcp/rdma peers, 0 or unset to keep it",
    )?;
    // Upstream checks these by presence.
    ipc.intranode_nvlink = get("MC_INTRANODE_NVLINK").is_some();
    ipc.force_musa = get("MC_FORCE_MUSA").is_some() || get("MC_FORCE_MNNVL").is_some();
    ipc.open_on_buffer_device = match get("MC_MUSA_IPC_OPEN_DEVICE")
        .map(|v| v.trim().to_ascii_lowercase())
        .as_deref()
    {
        None | Some("" | "current") => false,
        Some("metadata") => true,
        Some(_) => return Err(env.error("MC_MUSA_IPC_OPEN_DEVICE", "current or metadata")),
    };
    ipc.host_id = get("MC_HOST_ID").filter(|s| !s.trim().is_empty());
    if let Some(n) = ranged("MC_IPC_SLICE_SIZE", 4096, 1 << 30, "bytes")? {
        ipc.slice_size = n;
    }
    if let Some(n) = ranged("MC_IPC_COPY_THREADS", 1, 16, "threads")? {
        ipc.copy_threads = n as usize;
    }
    if let Some(n) = ranged("MC_IPC_REVOKE_TIMEOUT", 1, 600, "whole seconds")? {
        ipc.revoke_timeout = Duration::from_secs(n);
    }
    ipc.batch_copy = env.switch(
        "MC_IPC_BATCH_COPY",
        true,
        "0 for one device copy per scattered slice, 1 or unset for batches",
    )?;
    Ok(ipc)
}
