//! The environment of the IPC transport: `MC_DISABLE_IPC` (ours), and upstream's
//! `MC_INTRANODE_NVLINK`, `MC_FORCE_MUSA` / `MC_FORCE_MNNVL` and `MC_MUSA_IPC_OPEN_DEVICE`.

use crate::device::Vendor;

/// How the IPC transport is asked to behave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpcSettings {
    /// Device-to-device requests to same-host peers of protocol `tcp` or `rdma` go over
    /// IPC (`MC_DISABLE_IPC` unset or false).
    pub auto: bool,
    /// Advertise the IPC protocol as the segment's protocol, as upstream does when
    /// `MC_INTRANODE_NVLINK` (CUDA) or `MC_FORCE_MUSA` / `MC_FORCE_MNNVL` (MUSA) is set.
    pub forced: bool,
    /// Open peer handles on the device the peer's buffer lives on
    /// (`MC_MUSA_IPC_OPEN_DEVICE=metadata`) instead of the local buffer's device.
    pub open_on_buffer_device: bool,
    /// Replaces the kernel's `boot_id` as this host's identity (`MC_HOST_ID`): two
    /// containers on one host that must not share GPU memory set different values.
    pub host_id: Option<String>,
    /// Largest piece a request is cut into (`MC_IPC_SLICE_SIZE`, bytes).
    pub slice_size: u64,
    /// Copy threads, each with its own stream per device (`MC_IPC_COPY_THREADS`).
    pub copy_threads: usize,
    /// How long `unregister_memory` waits for the peers holding an IPC mapping of the
    /// memory to let go (`MC_IPC_REVOKE_TIMEOUT`, seconds).
    pub revoke_timeout: std::time::Duration,
}

/// Default of `MC_IPC_REVOKE_TIMEOUT` (seconds).
pub const DEFAULT_REVOKE_TIMEOUT_S: u64 = 5;

/// Default of `MC_IPC_SLICE_SIZE`: measured on two H200s over NV18, 64 MiB requests ran at
/// the raw peer-copy rate with 64 MiB slices and at 0.78 of it with 4 MiB slices (more
/// streams interleaving on one link); smaller requests are not affected.
pub const DEFAULT_SLICE_SIZE: u64 = 64 << 20;
/// Default of `MC_IPC_COPY_THREADS`.
pub const DEFAULT_COPY_THREADS: usize = 4;

fn number(
    env: &dyn Fn(&str) -> Option<String>,
    var: &str,
    default: u64,
    range: std::ops::RangeInclusive<u64>,
) -> Result<u64, String> {
    let Some(v) = env(var).filter(|v| !v.trim().is_empty()) else {
        return Ok(default);
    };
    match v.trim().parse::<u64>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(format!(
            "{var}={v:?} is not understood; use a whole number from {} to {}",
            range.start(),
            range.end()
        )),
    }
}

impl IpcSettings {
    /// Reads the variables through `env`; a value that is not understood is an error
    /// naming the variable and what it accepts.
    pub fn from_env(vendor: Vendor, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, String> {
        let auto = match env("MC_DISABLE_IPC")
            .map(|v| v.trim().to_ascii_lowercase())
            .as_deref()
        {
            None | Some("") | Some("0") | Some("false") | Some("no") | Some("off") => true,
            Some("1") | Some("true") | Some("yes") | Some("on") => false,
            Some(other) => {
                return Err(format!(
                    "MC_DISABLE_IPC={other:?} is not understood; use 1 to turn same-host GPU IPC off, 0 or unset to keep it"
                ))
            }
        };
        // Upstream checks these by presence.
        let forced = match vendor {
            Vendor::Cuda => env("MC_INTRANODE_NVLINK").is_some(),
            Vendor::Musa => env("MC_FORCE_MUSA").is_some() || env("MC_FORCE_MNNVL").is_some(),
        };
        let open_on_buffer_device = match env("MC_MUSA_IPC_OPEN_DEVICE")
            .map(|v| v.trim().to_ascii_lowercase())
            .as_deref()
        {
            None | Some("") | Some("current") => false,
            Some("metadata") => true,
            Some(other) => {
                return Err(format!(
                    "MC_MUSA_IPC_OPEN_DEVICE={other:?} is not understood; use current or metadata"
                ))
            }
        };
        let host_id = env("MC_HOST_ID").filter(|s| !s.trim().is_empty());
        let slice_size = number(
            env,
            "MC_IPC_SLICE_SIZE",
            DEFAULT_SLICE_SIZE,
            4096..=(1 << 30),
        )?;
        let copy_threads = number(
            env,
            "MC_IPC_COPY_THREADS",
            DEFAULT_COPY_THREADS as u64,
            1..=16,
        )? as usize;
        let revoke_timeout = std::time::Duration::from_secs(number(
            env,
            "MC_IPC_REVOKE_TIMEOUT",
            DEFAULT_REVOKE_TIMEOUT_S,
            1..=600,
        )?);
        Ok(Self {
            auto,
            forced,
            open_on_buffer_device,
            host_id,
            slice_size,
            copy_threads,
            revoke_timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)], vendor: Vendor) -> Result<IpcSettings, String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        IpcSettings::from_env(vendor, &|k| {
            vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn defaults_and_switches() {
        let d = with(&[], Vendor::Cuda).unwrap();
        assert!(d.auto && !d.forced && !d.open_on_buffer_device);
        assert!(!with(&[("MC_DISABLE_IPC", "1")], Vendor::Cuda).unwrap().auto);
        assert!(with(&[("MC_DISABLE_IPC", "0")], Vendor::Cuda).unwrap().auto);
        assert!(
            with(&[("MC_INTRANODE_NVLINK", "")], Vendor::Cuda)
                .unwrap()
                .forced
        );
        assert!(
            !with(&[("MC_FORCE_MUSA", "1")], Vendor::Cuda)
                .unwrap()
                .forced
        );
        assert!(
            with(&[("MC_FORCE_MUSA", "1")], Vendor::Musa)
                .unwrap()
                .forced
        );
        assert!(
            with(&[("MC_MUSA_IPC_OPEN_DEVICE", "metadata")], Vendor::Musa)
                .unwrap()
                .open_on_buffer_device
        );
    }

    #[test]
    fn unknown_values_are_refused_by_name() {
        let e = with(&[("MC_DISABLE_IPC", "maybe")], Vendor::Cuda).unwrap_err();
        assert!(e.contains("MC_DISABLE_IPC"), "{e}");
        let e = with(&[("MC_MUSA_IPC_OPEN_DEVICE", "peer")], Vendor::Musa).unwrap_err();
        assert!(e.contains("MC_MUSA_IPC_OPEN_DEVICE"), "{e}");
        let e = with(&[("MC_IPC_COPY_THREADS", "0")], Vendor::Cuda).unwrap_err();
        assert!(e.contains("MC_IPC_COPY_THREADS"), "{e}");
        let e = with(&[("MC_IPC_REVOKE_TIMEOUT", "0")], Vendor::Cuda).unwrap_err();
        assert!(e.contains("MC_IPC_REVOKE_TIMEOUT"), "{e}");
        let ok = with(&[("MC_IPC_SLICE_SIZE", "67108864")], Vendor::Cuda).unwrap();
        assert_eq!(ok.revoke_timeout.as_secs(), DEFAULT_REVOKE_TIMEOUT_S);
        assert_eq!(
            (ok.slice_size, ok.copy_threads),
            (64 << 20, DEFAULT_COPY_THREADS)
        );
    }
}
