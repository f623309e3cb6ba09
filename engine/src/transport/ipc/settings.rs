//! How the IPC transport behaves, from the `IpcConfig` part of [`Config`] (parsed there
//! with every other `MC_*` variable) and the runtime's vendor.

use crate::config::{Config, IpcConfig};
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
    /// Scattered slices of a group go in one batch call where the runtime has one
    /// (`MC_IPC_BATCH_COPY`, default on).
    pub batch_copy: bool,
}

impl IpcSettings {
    /// The settings for `vendor`'s runtime.
    pub fn new(vendor: Vendor, config: &Config) -> Self {
        let IpcConfig {
            disable,
            intranode_nvlink,
            force_musa,
            open_on_buffer_device,
            host_id,
            slice_size,
            copy_threads,
            revoke_timeout,
            batch_copy,
        } = config.ipc.clone();
        Self {
            auto: !disable,
            forced: match vendor {
                Vendor::Cuda => intranode_nvlink,
                Vendor::Musa => force_musa,
            },
            open_on_buffer_device,
            host_id,
            slice_size,
            copy_threads,
            revoke_timeout,
            batch_copy,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigError;

    fn with(vars: &[(&str, &str)], vendor: Vendor) -> Result<IpcSettings, ConfigError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let config =
            Config::from_lookup(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))?;
        Ok(IpcSettings::new(vendor, &config))
    }

    #[test]
    fn defaults_and_switches() {
        let d = with(&[], Vendor::Cuda).unwrap();
        assert!(d.auto && !d.forced && !d.open_on_buffer_device);
        assert_eq!(
            (d.slice_size, d.copy_threads, d.revoke_timeout.as_secs()),
            (64 << 20, 4, 5)
        );
        assert!(d.batch_copy);
        assert!(
            !with(&[("MC_IPC_BATCH_COPY", "0")], Vendor::Cuda)
                .unwrap()
                .batch_copy
        );
        assert!(!with(&[("MC_DISABLE_IPC", "1")], Vendor::Cuda).unwrap().auto);
        assert!(with(&[("MC_DISABLE_IPC", "0")], Vendor::Cuda).unwrap().auto);
        assert!(with(&[("MC_DISABLE_IPC", "")], Vendor::Cuda).unwrap().auto);
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
            with(&[("MC_FORCE_MNNVL", "1")], Vendor::Musa)
                .unwrap()
                .forced
        );
        assert!(
            with(&[("MC_MUSA_IPC_OPEN_DEVICE", "metadata")], Vendor::Musa)
                .unwrap()
                .open_on_buffer_device
        );
        let s = with(
            &[
                ("MC_IPC_SLICE_SIZE", "4096"),
                ("MC_IPC_COPY_THREADS", "16"),
                ("MC_IPC_REVOKE_TIMEOUT", "600"),
                ("MC_HOST_ID", "box-7"),
            ],
            Vendor::Cuda,
        )
        .unwrap();
        assert_eq!(
            (s.slice_size, s.copy_threads, s.revoke_timeout.as_secs()),
            (4096, 16, 600)
        );
        assert_eq!(s.host_id.as_deref(), Some("box-7"));
    }

    #[test]
    fn unknown_values_are_refused_by_name_as_every_config_error() {
        for (var, value) in [
            ("MC_DISABLE_IPC", "maybe"),
            ("MC_MUSA_IPC_OPEN_DEVICE", "peer"),
            ("MC_IPC_COPY_THREADS", "0"),
            ("MC_IPC_COPY_THREADS", "17"),
            ("MC_IPC_REVOKE_TIMEOUT", "0"),
            ("MC_IPC_SLICE_SIZE", "100"),
            ("MC_IPC_SLICE_SIZE", "lots"),
            ("MC_IPC_BATCH_COPY", "sometimes"),
        ] {
            let e = with(&[(var, value)], Vendor::Cuda).unwrap_err();
            assert_eq!((e.var, e.value.as_str()), (var, value));
            let text = e.to_string();
            assert!(text.contains(var) && text.contains(value), "{text}");
        }
    }
}
