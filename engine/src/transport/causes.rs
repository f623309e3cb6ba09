//! Why a transport cannot take a peer's work (or start), and why it could not register
//! memory with its devices: the cases of [`TransportError`](super::TransportError)'s
//! `Unusable` and `Register`, each with what was seen and the lower error as source.

use thiserror::Error;

use crate::device::{RuntimeUnavailable, Vendor};
use crate::error::Fault;
use crate::transport::rdma::backend::BackendError;
use crate::transport::rdma::register::peer_memory_module;
use crate::verbs::VerbsUnavailable;
use crate::wire::WireError;

/// Why a transport cannot reach a segment, or cannot start.
#[derive(Debug, Error)]
pub enum UnusableCause {
    /// TCP: the host the descriptor names for the data port does not resolve.
    #[error("cannot resolve its data address {data}: {source}")]
    DataAddress {
        /// `host:port`.
        data: String,
        /// The resolver's error.
        #[source]
        source: std::io::Error,
    },
    /// RDMA: the descriptor lists no RDMA device.
    #[error("its descriptor offers {offers:?} and no RDMA devices")]
    NoRdma {
        /// The protocols it lists.
        offers: Vec<String>,
    },
    /// RDMA: a device of the descriptor has a GID that does not parse.
    #[error("device {device:?}: {source}")]
    BadGid {
        /// The device's name.
        device: String,
        /// Why.
        #[source]
        source: WireError,
    },
    /// RDMA (start): the verbs library is unavailable.
    #[error(transparent)]
    Verbs(#[from] VerbsUnavailable),
    /// RDMA (start): an HCA could not be opened; the verbs backend names the HCA and the
    /// step that failed.
    #[error("{0}")]
    OpenHca(String),
    /// RDMA (start): no HCA was given.
    #[error("no HCA to use")]
    NoHca,
    /// RDMA (start): an HCA's port or GID index does not fit a verbs argument.
    #[error("{what} {value} of HCA {hca} is out of range")]
    OutOfRange {
        /// `port` or `GID index`.
        what: &'static str,
        /// The value.
        value: u32,
        /// The HCA.
        hca: String,
    },
    /// RDMA (start): `MC_IB_PORT` does not fit a verbs argument.
    #[error("MC_IB_PORT={value} is out of range (1-255)")]
    IbPort {
        /// The value.
        value: u32,
    },
}

impl UnusableCause {
    /// Whose failure this is: the peer's descriptor, or this host's devices.
    pub fn fault(&self) -> Fault {
        match self {
            Self::DataAddress { .. } | Self::NoRdma { .. } | Self::BadGid { .. } => Fault::Peer,
            Self::Verbs(_) | Self::OpenHca(_) | Self::NoHca => Fault::Host,
            Self::OutOfRange { .. } | Self::IbPort { .. } => Fault::Caller,
        }
    }
}

/// Why memory could not be registered with a transport's devices.
#[derive(Debug, Error)]
pub enum RegisterCause {
    /// Host memory that an HCA refused.
    #[error("ibv_reg_mr failed on {0} (check the memlock limit, ulimit -l)")]
    Host(NicRefusal),
    /// Device memory no HCA can reach, and `MC_FORCE_HCA=1` forbids staging it (boxed:
    /// every engine error stays small to return).
    #[error("{0}; MC_FORCE_HCA=1 asks for RDMA, so the region is not staged over TCP")]
    DeviceForced(Box<DeviceUnreachable>),
    /// A region at the same address is still being unregistered.
    #[error("the region registered before at this address is still being unregistered; try again once that returns")]
    StillUnregistering,
}

impl RegisterCause {
    /// Whose failure this is: registering again too early is the caller's; the rest is
    /// this host's memlock limit, drivers and modules.
    pub fn fault(&self) -> Fault {
        match self {
            Self::StillUnregistering => Fault::Caller,
            Self::Host(_) | Self::DeviceForced(_) => Fault::Host,
        }
    }
}

/// An HCA that refused a registration.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{nic}: {source}")]
pub struct NicRefusal {
    /// The HCA.
    pub nic: String,
    /// The backend's error.
    #[source]
    pub source: BackendError,
}

/// Device memory that no HCA can register: neither on its device address (peer-memory
/// module) nor through dma-buf.
#[derive(Debug, Error)]
#[error("no HCA can reach this {} memory: ibv_reg_mr on the device address failed on {peermem} (the peer-memory kernel module {module} is probably not loaded: modprobe {module}), and dma-buf registration failed: {dmabuf}", .vendor.prefix(), module = peer_memory_module(*.vendor))]
pub struct DeviceUnreachable {
    /// The memory's vendor.
    pub vendor: Vendor,
    /// The refusal of the device address.
    pub peermem: NicRefusal,
    /// Why dma-buf registration failed.
    #[source]
    pub dmabuf: DmabufFailure,
}

/// Why dma-buf registration failed.
#[derive(Debug, Error)]
pub enum DmabufFailure {
    /// No GPU runtime to export the buffer.
    #[error(transparent)]
    NoRuntime(#[from] RuntimeUnavailable),
    /// The driver did not export it (its text).
    #[error("{0}")]
    Export(String),
    /// An HCA refused the exported buffer.
    #[error(transparent)]
    Nic(#[from] NicRefusal),
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    fn refusal(nic: &str) -> NicRefusal {
        NicRefusal {
            nic: nic.into(),
            source: BackendError("ibv_reg_mr failed: Bad address (errno 14)".into()),
        }
    }

    /// The message names both refusals and the module to load, built from the fields; the
    /// HCA's own error stays reachable as a source.
    #[test]
    fn unreachable_device_memory_names_both_refusals() {
        let cause = RegisterCause::DeviceForced(Box::new(DeviceUnreachable {
            vendor: Vendor::Cuda,
            peermem: refusal("mlx5_0"),
            dmabuf: DmabufFailure::Nic(refusal("mlx5_1")),
        }));
        assert_eq!(
            cause.to_string(),
            "no HCA can reach this cuda memory: ibv_reg_mr on the device address failed on \
             mlx5_0: ibv_reg_mr failed: Bad address (errno 14) (the peer-memory kernel module \
             nvidia-peermem is probably not loaded: modprobe nvidia-peermem), and dma-buf \
             registration failed: mlx5_1: ibv_reg_mr failed: Bad address (errno 14); \
             MC_FORCE_HCA=1 asks for RDMA, so the region is not staged over TCP"
        );
        assert_eq!(cause.fault(), Fault::Host);
        let RegisterCause::DeviceForced(d) = &cause else {
            unreachable!()
        };
        let nic = d
            .source()
            .and_then(|dmabuf| dmabuf.source())
            .and_then(|e| e.downcast_ref::<BackendError>());
        assert_eq!(nic, Some(&refusal("mlx5_1").source));
        assert_eq!(RegisterCause::StillUnregistering.fault(), Fault::Caller);
    }

    #[test]
    fn a_peer_without_rdma_is_the_peer_s_a_missing_hca_the_host_s() {
        let no_rdma = UnusableCause::NoRdma {
            offers: vec!["tcp".into()],
        };
        assert_eq!(
            no_rdma.to_string(),
            "its descriptor offers [\"tcp\"] and no RDMA devices"
        );
        assert_eq!(no_rdma.fault(), Fault::Peer);
        assert_eq!(UnusableCause::NoHca.fault(), Fault::Host);
    }
}
