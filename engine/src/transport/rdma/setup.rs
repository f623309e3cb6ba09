//! Endpoint setup: new queue pairs, the type-0 handshake with the peer, and the
//! RESET → RTS transitions, on a thread of its own per HCA so that the HCA's worker keeps
//! polling (and a drain or an unregister never waits on a peer's handshake).

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{unbounded, Sender};

use super::backend::RemoteQp;
use super::endpoint_cut::EndpointCut;
use super::worker::Msg;
use super::{Peer, Shared};
use crate::error::{SharedSource, TransferError, Unreachable, Violation};
use crate::wire::rdma::{format_gid, ConnectMsg};

/// An endpoint to set up.
pub(crate) struct Request {
    /// The peer, for its RPC address.
    pub(crate) peer: Arc<Peer>,
    /// `<segment>@<nic>`.
    pub(crate) path: String,
}

/// Starts HCA `idx`'s setup thread; each finished setup goes back to the HCA's worker as
/// [`Msg::Ready`]. The thread ends when the returned sender is dropped.
pub(crate) fn spawn(
    shared: &Arc<Shared>,
    idx: usize,
) -> std::io::Result<(Sender<Request>, JoinHandle<()>)> {
    let (tx, rx) = unbounded::<Request>();
    let shared = shared.clone();
    let thread = std::thread::Builder::new()
        .name(format!("te-rdma-setup-{idx}"))
        .spawn(move || {
            for req in rx {
                let result = endpoint(&shared, idx, &req.peer, &req.path);
                let Some(worker) = shared.workers.get(idx) else {
                    return;
                };
                let _ = worker.send(Msg::Ready {
                    path: req.path,
                    result,
                });
            }
        })?;
    Ok((tx, thread))
}

/// New queue pairs on HCA `idx` towards the peer NIC at `path`, connected through the
/// endpoint handshake.
pub(crate) fn endpoint(
    shared: &Shared,
    idx: usize,
    peer: &Peer,
    path: &str,
) -> Result<Arc<EndpointCut>, TransferError> {
    let nic = shared
        .nics
        .get(idx)
        .ok_or(TransferError::Canceled("HCA index out of range"))?;
    let unreachable = |cause: Unreachable| {
        shared.mark_dead(&peer.segment, &cause);
        TransferError::PeerUnreachable {
            peer: path.to_string(),
            cause,
        }
    };
    let params = &shared.params;
    let depth = u32::try_from(params.max_wr).unwrap_or(u32::MAX);
    let mut qps = Vec::with_capacity(params.num_qp_per_ep);
    for _ in 0..params.num_qp_per_ep.max(1) {
        qps.push(
            nic.create_qp(depth)
                .map_err(|e| unreachable(Unreachable::CreateQueuePair(SharedSource::new(e))))?,
        );
    }
    let port = nic.port();
    let request = ConnectMsg {
        payload: String::new(),
        local_nic_path: format!("{}@{}", shared.local_name, nic.name()),
        local_lid: port.lid,
        local_gid: format_gid(&port.gid),
        peer_nic_path: path.to_string(),
        qp_num: qps.iter().map(|q| q.qp_num()).collect(),
        ready_ack: None,
        reply_msg: String::new(),
    };
    let reply = shared
        .connector
        .exchange(&peer.rpc, &request.encode())
        .map_err(|e| unreachable(Unreachable::EndpointHandshake(e.into())))?;
    let protocol = |violation: Violation| TransferError::Protocol {
        peer: path.to_string(),
        violation,
    };
    let reply = ConnectMsg::decode(&reply).map_err(|e| protocol(Violation::EndpointReply(e)))?;
    if !reply.reply_msg.is_empty() {
        return Err(unreachable(Unreachable::EndpointRefused {
            reply: reply.reply_msg,
        }));
    }
    if reply.qp_num.len() != qps.len() {
        return Err(protocol(Violation::QueuePairCount {
            ours: qps.len(),
            theirs: reply.qp_num.len(),
        }));
    }
    let gid = reply
        .gid()
        .map_err(|e| protocol(Violation::EndpointGid(e)))?;
    for (qp, &num) in qps.iter().zip(&reply.qp_num) {
        qp.connect(&RemoteQp {
            qp_num: num,
            lid: reply.local_lid,
            gid,
        })
        .map_err(|e| unreachable(Unreachable::ConnectQueuePair(SharedSource::new(e))))?;
    }
    Ok(Arc::new(EndpointCut::new(qps)))
}
