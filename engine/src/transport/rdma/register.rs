//! Registering a region with every HCA, in upstream's order for device memory, and
//! what happens when no HCA can reach the memory.
//!
//! Host memory: `ibv_reg_mr`; a failure is an error (memlock, usually).
//!
//! Device memory (`cuda:N`, `musa:N`), first that works on every HCA:
//! 1. `ibv_reg_mr` on the device address: works when the vendor's peer-memory kernel
//!    module (`nvidia-peermem`, `mthreads-peermem`) is loaded (upstream's only path on
//!    MUSA, and its default on CUDA).
//! 2. dma-buf: the driver exports the allocation holding the region
//!    (`cuMemGetAddressRange_v2` + `cuMemGetHandleForAddressRange`, or the `mu`
//!    counterparts when the MUSA driver has them; [`crate::device::dmabuf`]) and
//!    `ibv_reg_dmabuf_mr` registers it with the region's address as its iova, so work
//!    requests and peers address it exactly as a peer-memory registration.
//! 3. Staged: no HCA can reach the memory. With `MC_FORCE_HCA=1` that is a registration
//!    error naming the missing module (the user asked for RDMA). Otherwise the region is
//!    kept with no memory region and one warning: our descriptor advertises remote key 0
//!    on every device for it, and every request touching it, ours or a peer's, goes over
//!    TCP, whose client and data server stage device memory through pinned host chunks
//!    from a bounded pool (`MC_TCP_STAGING_BUDGET_MB`). A peer's NIC cannot write into
//!    our device memory through a host bounce buffer without a thread of ours in the
//!    loop, so one-sided RDMA to a staged region is not offered; TCP is what every peer
//!    (ours, and upstream's over its TCP transport) can use instead. Our engines read a
//!    peer buffer whose remote keys are all 0 as staged and send those requests over
//!    TCP; an upstream peer that tries RDMA with key 0 gets a remote access error. An
//!    engine with `MC_FORCE_HCA=1` fails requests to a peer's staged buffer with the
//!    reason instead of using TCP.

use std::sync::Arc;

use super::backend::{BackendError, MrKeys, Nic};
use super::{Shared, PROTOCOL};
use crate::device::Vendor;
use crate::memory::{Lease, Region};
use crate::transport::causes::{DeviceUnreachable, DmabufFailure, NicRefusal, RegisterCause};
use crate::transport::TransportError;

/// How a region reached the HCAs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Registration {
    /// `ibv_reg_mr` on host memory.
    Host,
    /// `ibv_reg_mr` on the device address (peer-memory module).
    PeerMemory,
    /// `ibv_reg_dmabuf_mr` on the driver's export of the allocation.
    DmaBuf,
    /// No memory region: requests touching the region go over TCP (staged there).
    Staged,
}

/// The peer-memory kernel module of `vendor`.
pub(crate) fn peer_memory_module(vendor: Vendor) -> &'static str {
    match vendor {
        Vendor::Musa => "mthreads-peermem",
        Vendor::Cuda => "nvidia-peermem",
    }
}

/// Registers `region` with every HCA of `shared` (device order), as the module doc says.
pub(crate) fn register(
    shared: &Shared,
    region: &Arc<Region>,
) -> Result<(Vec<MrKeys>, Registration), TransportError> {
    let error = |cause: RegisterCause| TransportError::Register {
        addr: region.addr,
        len: region.len,
        protocol: PROTOCOL,
        cause,
    };
    let nics = &shared.nics;
    // Each memory region holds a lease of the region until `on_unregister` (or the
    // transport's drop) deregisters it; unregistering waits for the leases.
    let plain = on_every_nic(nics, region, |nic, lease| nic.register(lease));
    let Some((vendor, _)) = region.device else {
        return plain
            .map(|k| (k, Registration::Host))
            .map_err(|e| error(RegisterCause::Host(e)));
    };
    let peermem = match plain {
        Ok(keys) => return Ok((keys, Registration::PeerMemory)),
        Err(e) => e,
    };
    let dmabuf = match dmabuf(nics, region) {
        Ok(keys) => {
            tracing::info!(
                "{} memory at {:#x}+{} registered through dma-buf (ibv_reg_mr refused it: {peermem})",
                vendor.prefix(),
                region.addr,
                region.len
            );
            return Ok((keys, Registration::DmaBuf));
        }
        Err(e) => e,
    };
    let module = peer_memory_module(vendor);
    let reason = DeviceUnreachable {
        vendor,
        peermem,
        dmabuf,
    };
    if shared.params.force_hca {
        return Err(error(RegisterCause::DeviceForced(Box::new(reason))));
    }
    let warning = format!(
        "{} device memory is STAGED, not registered with the HCAs: {reason}. Every request \
         touching such memory goes over TCP through pinned host buffers (a device-host copy \
         per chunk, and TCP instead of RDMA: far slower, and CPU time on both sides). \
         Load {module} for GPUDirect RDMA, or set MC_FORCE_HCA=1 to make this an error",
        vendor.prefix()
    );
    // Once per process and vendor: the reason is the same for every region.
    if crate::log_throttle::first_time(&format!("rdma staged {}", vendor.prefix())) {
        tracing::warn!("{warning}");
    }
    Ok((Vec::new(), Registration::Staged))
}

/// Runs `reg` on every HCA with a new lease of `region`; on a failure, deregisters what
/// succeeded and names the HCA.
fn on_every_nic(
    nics: &[Arc<dyn Nic>],
    region: &Arc<Region>,
    reg: impl Fn(&dyn Nic, Lease) -> Result<MrKeys, BackendError>,
) -> Result<Vec<MrKeys>, NicRefusal> {
    let mut keys = Vec::with_capacity(nics.len());
    for nic in nics {
        let registered = match region.lease() {
            Some(lease) => reg(nic.as_ref(), lease),
            None => Err(BackendError("the region is being unregistered".into())),
        };
        match registered {
            Ok(k) => keys.push(k),
            Err(e) => {
                for (n, k) in nics.iter().zip(&keys) {
                    n.deregister(*k);
                }
                return Err(NicRefusal {
                    nic: nic.name().to_string(),
                    source: e,
                });
            }
        }
    }
    Ok(keys)
}

/// dma-buf registration of `region` on every HCA; the error says what refused.
fn dmabuf(nics: &[Arc<dyn Nic>], region: &Arc<Region>) -> Result<Vec<MrKeys>, DmabufFailure> {
    let rt = crate::device::runtime()?;
    let buf = crate::device::dmabuf::export(&rt, region.addr, region.len)
        .map_err(DmabufFailure::Export)?;
    // The fd is closed when `buf` drops: each memory region holds the buffer itself.
    Ok(on_every_nic(nics, region, |nic, lease| {
        nic.register_dmabuf(lease, &buf)
    })?)
}
