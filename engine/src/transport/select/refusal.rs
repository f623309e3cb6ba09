//! Why `initialize` refuses the transports it was asked for, as data: the refusal, and
//! what stands in the way (memlock, RDMA missing problem by problem, a transport that
//! would not start, no GPU runtime, a bad topology file), each with what was seen.

use std::path::PathBuf;

use thiserror::Error;

use super::SERVED;
use crate::device::{RuntimeUnavailable, Vendor};
use crate::error::Fault;
use crate::topology::json::TopoFileError;
use crate::transport::TransportError;

/// Why `initialize` refuses to start the transports it was asked for: what was refused,
/// why, and ([`hint`](Self::hint)) what helps. Callers tell refusals apart by variant,
/// never by wording.
#[derive(Debug, Error)]
pub enum Refusal {
    /// A protocol upstream knows that this engine does not serve.
    #[error("protocol {protocol:?} ({what}) is not served by this engine; {SERVED}")]
    ProtocolNotServed {
        /// The protocol asked for.
        protocol: String,
        /// What it is.
        what: &'static str,
    },
    /// A protocol nobody knows (a typo?).
    #[error("unknown protocol {protocol:?}; {SERVED}")]
    UnknownProtocol {
        /// The protocol asked for.
        protocol: String,
    },
    /// `MC_FORCE_HCA` requires RDMA, and RDMA cannot be used or started.
    #[error("MC_FORCE_HCA is set but RDMA cannot be used: {cause}")]
    RdmaRequired {
        /// What stands in the way.
        #[source]
        cause: RdmaBlocker,
    },
    /// A same-host GPU IPC protocol, without a GPU runtime that can serve it.
    #[error("protocol {protocol:?} moves GPU memory between processes of this host, but {cause}")]
    GpuUnavailable {
        /// The protocol asked for.
        protocol: String,
        /// What is missing.
        #[source]
        cause: GpuBlocker,
    },
    /// The HCA topology cannot be read (an unreadable `MC_CUSTOM_TOPO_JSON`).
    #[error("{cause}")]
    Topology {
        /// What is wrong, naming the file.
        #[source]
        cause: TopoFileError,
    },
}

impl Refusal {
    /// The `MC_*` variable or `mooncake-doctor` check that helps.
    pub fn hint(&self) -> &'static str {
        match self {
            Self::ProtocolNotServed { .. } | Self::UnknownProtocol { .. } => {
                "initialize's protocol must be \"tcp\", \"rdma\", \"\" (automatic), \"nvlink_intra\" or \"musa\""
            }
            Self::RdmaRequired { .. } => {
                "mooncake-doctor (rdma.* and decision checks) says what is missing; unset MC_FORCE_HCA to allow the TCP fallback, MC_TE_FILTERS names the HCAs"
            }
            Self::GpuUnavailable { .. } => {
                "mooncake-doctor (gpu.runtime) lists the runtime libraries tried; MC_GPU_RUNTIME picks the runtime, MC_MUSART_PATH / MC_CUDART_PATH its file"
            }
            Self::Topology { .. } => "fix or unset MC_CUSTOM_TOPO_JSON",
        }
    }

    /// Whose failure this is: a protocol or topology file the caller chose, or what
    /// this host lacks.
    pub fn fault(&self) -> Fault {
        match self {
            Self::ProtocolNotServed { .. }
            | Self::UnknownProtocol { .. }
            | Self::Topology { .. } => Fault::Caller,
            Self::RdmaRequired { .. } | Self::GpuUnavailable { .. } => Fault::Host,
        }
    }
}

/// What keeps RDMA from being used when `MC_FORCE_HCA` requires it.
#[derive(Debug, Error)]
pub enum RdmaBlocker {
    /// The memlock limit is too low to register a KV cache.
    #[error("RLIMIT_MEMLOCK is {} KiB and CAP_IPC_LOCK is not held: registering memory with the HCAs pins it and will fail past that; run with `ulimit -l unlimited` (docker: --ulimit memlock=-1:-1 or --cap-add IPC_LOCK)", .limit >> 10)]
    Memlock {
        /// `RLIMIT_MEMLOCK` in bytes.
        limit: u64,
    },
    /// RDMA is not usable on this host.
    #[error(transparent)]
    Missing(#[from] RdmaMissing),
    /// The RDMA transport did not start (boxed: every engine error stays small to return).
    #[error("the RDMA transport cannot start: {0}")]
    Start(#[source] Box<TransportError>),
}

/// Why RDMA cannot be used on this host: every problem found.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{}", join(.problems))]
pub struct RdmaMissing {
    /// The problems, in the order they were found.
    pub problems: Vec<RdmaProblem>,
    /// Whether the host has any HCA at all (then failing to use it is worth a warning).
    pub hca_present: bool,
}

fn join(problems: &[RdmaProblem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// One reason RDMA cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RdmaProblem {
    /// The HCAs and the verbs library were not looked at.
    #[error("RDMA was not probed")]
    NotProbed,
    /// The verbs library does not load (or lists no devices), with its reason.
    #[error("the verbs library is unavailable ({why})")]
    VerbsUnavailable {
        /// The loader's reason.
        why: String,
    },
    /// sysfs shows no HCA.
    #[error("no RDMA device (HCA) under {}/class/infiniband", .root.display())]
    NoHca {
        /// The sysfs root read.
        root: PathBuf,
    },
    /// HCAs exist but `MC_TE_FILTERS` / `device_name` leave none (topology's reason).
    #[error("{why}")]
    NoneMatched {
        /// What the filters matched against.
        why: String,
    },
    /// No HCA has a usable port.
    #[error("no HCA has a usable port: {}", .unusable.join("; "))]
    NoUsablePort {
        /// Each HCA with why its port is unusable.
        unusable: Vec<String>,
    },
    /// The verbs library lists none of the usable HCAs.
    #[error("the verbs library lists none of the usable HCAs ({}); it lists: {} (are /dev/infiniband devices visible in this container?)", .usable.join(", "), listed_text(.listed))]
    NotListed {
        /// The usable HCAs (sysfs).
        usable: Vec<String>,
        /// What the library lists.
        listed: Vec<String>,
    },
}

/// `listed`, or `none`.
pub(super) fn listed_text(listed: &[String]) -> String {
    if listed.is_empty() {
        "none".to_string()
    } else {
        listed.join(", ")
    }
}

/// What keeps a same-host GPU IPC protocol from being served.
#[derive(Debug, Error)]
pub enum GpuBlocker {
    /// The IPC transport did not start; its reason (the IPC transport reports text).
    #[error("same-host GPU IPC cannot start: {reason}")]
    IpcStart {
        /// Why.
        reason: String,
    },
    /// `musa` asked for, and the loaded runtime is another vendor's.
    #[error("it needs the MUSA runtime, and the loaded GPU runtime is {loaded} (MC_GPU_RUNTIME selects it)")]
    NotMusa {
        /// The loaded runtime's vendor.
        loaded: Vendor,
    },
    /// The runtime sees no device.
    #[error("the {vendor} runtime reports no device")]
    NoDevice {
        /// Its vendor.
        vendor: Vendor,
    },
    /// No runtime is loaded.
    #[error("no GPU runtime is loaded: {0}")]
    NoRuntime(#[source] RuntimeUnavailable),
    /// The GPU runtime was not looked at (`MC_FORCE_TCP`).
    #[error("no GPU runtime is loaded: it was not probed (MC_FORCE_TCP)")]
    NotProbed,
}
