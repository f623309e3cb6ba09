//! Roles of `rdma_engine.rs`: engines started as `initialize(..., "rdma", ...)` starts
//! them, over the soft NIC of the parent's fabric.

use crate::common::{engine, fnv, pattern, Buf, Peer};
use transfer_engine::{OpCode, Request, TransferError};

/// `rdma-engine-moves-bytes`: an engine on every soft HCA moves verified bytes both ways
/// with a peer process.
pub fn moves_bytes_both_ways() {
    let len = 6 << 20;
    let mut peer = Peer::spawn(len, 11);
    let e = engine();
    // Peers read one protocol: ours says `rdma` (and keeps its TCP port for our peers).
    let ours =
        transfer_engine::wire::descriptor::SegmentDesc::decode(&e.local_descriptor().encode())
            .unwrap();
    assert_eq!(ours.protocol, ["rdma"], "{ours:?}");
    let hcas: Vec<String> = std::env::var("SOFTNIC_HCAS")
        .unwrap()
        .split(',')
        .map(String::from)
        .collect();
    let names: Vec<&str> = ours.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, hcas, "every soft HCA is used");

    // RDMA moves registered memory only (as upstream): the local side registers too.
    let local = Buf::new(len as usize);
    e.register_memory(local.addr(), len, "cpu:0").unwrap();
    // Read the peer's pattern: one large request (sliced and striped) and odd sizes.
    let reqs = [
        Request::new(OpCode::Read, local.addr(), peer.addr, 4 << 20),
        Request::new(
            OpCode::Read,
            local.addr() + (4 << 20),
            peer.addr + (4 << 20),
            3,
        ),
        Request::new(
            OpCode::Read,
            local.addr() + (4 << 20) + 3,
            peer.addr + (4 << 20) + 3,
            (2 << 20) - 3,
        ),
    ];
    // SAFETY: `local` outlives the synchronous call; nothing else touches it meanwhile.
    unsafe { e.transfer_sync(&peer.session, &reqs) }.unwrap();
    assert!(
        local.to_vec() == pattern(len as usize, 11),
        "read bytes differ"
    );

    let data = pattern(len as usize, 42);
    local.write_at(0, &data).unwrap();
    let write = [Request::new(OpCode::Write, local.addr(), peer.addr, len)];
    // SAFETY: as above.
    unsafe { e.transfer_sync(&peer.session, &write) }.unwrap();
    assert_eq!(peer.hash(peer.addr, len), fnv(&data));
}

/// `rdma-engine-injected-failure`: a write fails as the soft NIC fails it, so it went
/// over RDMA.
pub fn rdma_failure_is_the_rdma_path() {
    let len = 1 << 20;
    let peer = Peer::spawn(len, 5);
    let e = engine();
    let local = Buf::new(len as usize);
    e.register_memory(local.addr(), len, "cpu:0").unwrap();
    let reqs = [Request::new(OpCode::Write, local.addr(), peer.addr, len)];
    // SAFETY: `local` outlives the synchronous call; nothing else touches it meanwhile.
    let err = unsafe { e.transfer_sync(&peer.session, &reqs) }.unwrap_err();
    let text = err.to_string();
    // The soft NIC fails every WR posted on its only HCA with a remote access error:
    // had the bytes gone over TCP, the write would have succeeded.
    assert!(
        matches!(
            err,
            transfer_engine::EngineError::Transfer {
                source: TransferError::AddressRejected { .. },
                ..
            }
        ),
        "{text}"
    );
}

/// `rdma-engine-force-hca`: with `MC_FORCE_HCA` and no usable HCA, the engine does not
/// start and says why.
pub fn force_hca_without_rdma_fails_with_the_reason() {
    let config = transfer_engine::Config::from_env().unwrap();
    let request = transfer_engine::TransportRequest::new("rdma", "");
    let err = transfer_engine::TransferEngine::with_transports(
        "127.0.0.1",
        "P2PHANDSHAKE",
        config,
        &request,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("MC_FORCE_HCA"), "{err}");
    assert!(
        err.contains("soft_9"),
        "the filter's missing HCA is named: {err}"
    );
}
