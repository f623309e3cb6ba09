//! What the doctor looks at, gathered in one place so that tests can replace every part:
//! the environment (a map, not the process's), the sysfs, procfs and /dev roots, the
//! memlock limit, and the facts only Python knows.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use transfer_engine::transport::select::Memlock;

/// Everything a doctor run reads and what it was asked to do.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// Environment variables (the process's, or a test's).
    pub env: BTreeMap<String, String>,
    /// Stands for `/sys` (`--sysfs-root`, else `MC_SYSFS_ROOT`).
    pub sysfs_root: PathBuf,
    /// Stands for `/proc` (`--procfs-root`, else `MC_PROCFS_ROOT`).
    pub procfs_root: PathBuf,
    /// Stands for `/dev` (`--dev-root`, else `MC_DEV_ROOT`); also where `/.dockerenv` is
    /// looked for (its parent).
    pub dev_root: PathBuf,
    /// RLIMIT_MEMLOCK and CAP_IPC_LOCK; `None`: this process's.
    pub memlock: Option<Memlock>,
    /// The `protocol` argument `initialize` would get (`--protocol`, default `""`).
    pub protocol: String,
    /// The `device_name` argument (`--device-name`).
    pub device_name: String,
    /// Facts from Python (`mooncake.doctor`): JSON, see [`crate::python`].
    pub python: Option<serde_json::Value>,
    /// Run the loopback transfer.
    pub selftest: bool,
    /// Probe this running engine (`host:port`).
    pub peer: Option<String>,
    /// Bound of the selftest and of the peer probe.
    pub budget: Duration,
}

impl Inputs {
    /// This process's environment and roots, nothing asked.
    pub fn from_process() -> Self {
        Self::with_env(std::env::vars().collect())
    }

    /// Inputs over `env`, roots from it (`MC_SYSFS_ROOT`, `MC_PROCFS_ROOT`, `MC_DEV_ROOT`).
    pub fn with_env(env: BTreeMap<String, String>) -> Self {
        let root = |var: &str, default: &str| {
            PathBuf::from(
                env.get(var)
                    .filter(|v| !v.is_empty())
                    .map_or(default, String::as_str),
            )
        };
        Self {
            sysfs_root: root("MC_SYSFS_ROOT", "/sys"),
            procfs_root: root("MC_PROCFS_ROOT", "/proc"),
            dev_root: root("MC_DEV_ROOT", "/dev"),
            env,
            memlock: None,
            protocol: String::new(),
            device_name: String::new(),
            python: None,
            selftest: false,
            peer: None,
            budget: Duration::from_secs(3),
        }
    }

    /// The variable `name`, if set.
    pub fn var(&self, name: &str) -> Option<String> {
        self.env.get(name).cloned()
    }

    /// The memlock limit to judge: the injected one, else this process's.
    pub fn memlock(&self) -> Memlock {
        self.memlock
            .unwrap_or_else(transfer_engine::transport::memlock)
    }
}
