//! A peer as the RDMA transport sees it ([`Peer`]): its devices and registered buffers,
//! checked once from its descriptor, with the candidate local devices for each buffer.

use super::path::Choice;
use crate::transport::causes::UnusableCause;
use crate::wire::descriptor::{BufferDesc, SegmentDesc};
use crate::wire::rdma::parse_gid;
use crate::wire::session::{HostPort, SegmentId};

/// Whether a peer's buffer is staged there (remote keys all 0 or none): no NIC reaches it.
pub(super) fn staged_at_peer(remote: &BufferDesc) -> bool {
    remote.rkey.iter().all(|&k| k == 0)
}

/// A peer's RDMA device (its port's LID and GID come with the handshake reply).
#[derive(Debug)]
pub(crate) struct PeerDevice {
    name: String,
}

/// A peer's registered buffer: its range, remote keys (device order) and the
/// candidate devices for its location.
#[derive(Debug)]
pub(crate) struct PeerBuffer {
    addr: u64,
    len: u64,
    pub(super) rkeys: Vec<u32>,
    pub(super) choice: Choice,
}

/// What the transport needs of a peer's descriptor, checked once.
#[derive(Debug)]
pub(crate) struct Peer {
    pub(super) segment: String,
    pub(super) rpc: HostPort,
    devices: Vec<PeerDevice>,
    pub(super) buffers: Vec<PeerBuffer>,
}

impl Peer {
    pub(super) fn from_desc(
        segment: &SegmentId,
        desc: &SegmentDesc,
    ) -> Result<Self, UnusableCause> {
        if !desc.speaks_rdma() {
            return Err(UnusableCause::NoRdma {
                offers: desc.protocol.clone(),
            });
        }
        let mut devices = Vec::with_capacity(desc.devices.len());
        for d in &desc.devices {
            parse_gid(&d.gid).map_err(|source| UnusableCause::BadGid {
                device: d.name.clone(),
                source,
            })?;
            devices.push(PeerDevice {
                name: d.name.clone(),
            });
        }
        let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
        let buffers = desc
            .buffers
            .iter()
            .map(|b| PeerBuffer {
                addr: b.addr,
                len: b.length,
                rkeys: b.rkey.clone(),
                choice: Choice::new(&desc.priority_matrix, &b.name, &names),
            })
            .collect();
        Ok(Self {
            segment: segment.name().to_string(),
            rpc: segment.rpc().clone(),
            devices,
            buffers,
        })
    }

    /// The buffer holding all of `[addr, addr+len)`.
    pub(super) fn buffer(&self, addr: u64, len: u64) -> Option<usize> {
        let end = addr.checked_add(len)?;
        self.buffers
            .iter()
            .position(|b| addr >= b.addr && end <= b.addr + b.len)
    }

    pub(super) fn nic_path(&self, device: usize) -> String {
        let name = self.devices.get(device).map_or("?", |d| d.name.as_str());
        format!("{}@{name}", self.segment)
    }
}
