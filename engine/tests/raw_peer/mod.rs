//! A hostile peer's tools: raw connections from chosen loopback addresses,
//! dribbling bytes, and waiting for the server to close on us.

#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use socket2::{Domain, Socket, Type};
use transfer_engine::wire::tcp::{RequestHeader, Status, HEADER_LEN, STATUS_LEN};
use transfer_engine::{Config, HostBuffer, OpCode, TransferEngine};

/// Bytes of the host buffer a [`target`] registers.
pub const TARGET_LEN: usize = 4 << 20;

/// An engine on 127.0.0.1 with one registered host buffer of [`TARGET_LEN`] bytes, and
/// its data server's address, for a raw client to drive.
pub fn target() -> (TransferEngine, HostBuffer, SocketAddr) {
    let e = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", Config::default()).unwrap();
    let buf = HostBuffer::new(TARGET_LEN);
    e.register_memory(buf.addr(), TARGET_LEN as u64, "cpu:0")
        .unwrap();
    let data = format!("127.0.0.1:{}", e.data_port()).parse().unwrap();
    (e, buf, data)
}

/// A v2 request header, as a raw client sends it.
pub fn header(op: OpCode, addr: u64, size: usize) -> [u8; HEADER_LEN] {
    RequestHeader {
        size: size as u64,
        addr,
        opcode: op,
        v2: true,
    }
    .encode()
}

/// The next status the server sends on `s`.
pub fn status(s: &mut TcpStream) -> Status {
    let mut b = [0u8; STATUS_LEN];
    s.read_exact(&mut b).unwrap();
    Status::decode(&b).unwrap()
}

/// `len` bytes that differ with `seed` and along the run, so a misplaced block shows.
pub fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 31 + seed * 7) % 251) as u8)
        .collect()
}

/// A TCP connection to `dst` from the loopback address `src` (127.0.0.2,
/// ...), so per-address caps see it apart from an engine on 127.0.0.1.
pub fn connect_from(src: &str, dst: SocketAddr) -> TcpStream {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::new(src.parse().unwrap(), 0).into())
        .unwrap();
    s.connect(&dst.into()).unwrap();
    s.into()
}

/// Blocks until the server closes `s` (EOF or reset); fails after `limit`.
pub fn wait_closed(s: &mut TcpStream, limit: Duration) {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 64];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return,
            Err(e) => panic!("the server did not close the connection within {limit:?}: {e}"),
        }
    }
}

/// Whether the server has closed `s` already (without waiting).
pub fn is_closed(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 1];
    let closed = match (&*s).read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    };
    s.set_nonblocking(false).unwrap();
    closed
}

/// Sends `first`, then one byte every 100 ms (for at most a minute) until
/// the other side closes or `stop` is set: well inside any per-read timeout.
pub fn dribble(mut s: TcpStream, first: Vec<u8>, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        if s.write_all(&first).is_err() {
            return;
        }
        for _ in 0..600 {
            if stop.load(Ordering::Acquire) || s.write_all(b"x").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

/// A stand-in engine's handshake port: serves the descriptor of one segment whose data port
/// is `data_port` and whose one buffer is `[remote, remote + 1 GiB)`. Returns the session id
/// and the server (which stops when dropped).
pub fn serve_descriptor(
    data_port: u16,
    remote: u64,
) -> (
    String,
    transfer_engine::metadata::handshake::HandshakeServer,
) {
    serve_descriptor_taking_runs(data_port, remote, false)
}

/// As [`serve_descriptor`], saying in the descriptor whether the data port takes runs of
/// writes (`tcp_write_runs`, ours only; upstream's descriptors never say so).
pub fn serve_descriptor_taking_runs(
    data_port: u16,
    remote: u64,
    write_runs: bool,
) -> (
    String,
    transfer_engine::metadata::handshake::HandshakeServer,
) {
    use transfer_engine::metadata::handshake::HandshakeServer;
    use transfer_engine::wire::descriptor::{BufferDesc, SegmentDesc};
    use transfer_engine::wire::handshake::MessageType;

    let rpc = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    rpc.set_nonblocking(true).unwrap();
    let session = format!("127.0.0.1:{}", rpc.local_addr().unwrap().port());
    let text = SegmentDesc {
        name: session.clone(),
        protocol: vec!["tcp".into()],
        tcp_data_port: data_port,
        tcp_data_host: None,
        tcp_proto_version: 2,
        tcp_write_runs: write_runs,
        timestamp: String::new(),
        buffers: vec![BufferDesc {
            name: session.clone(),
            addr: remote,
            length: 1 << 30,
            ..BufferDesc::default()
        }],
        ..SegmentDesc::default()
    }
    .encode();
    let server = HandshakeServer::start(
        rpc,
        1 << 20,
        Arc::new(move |kind: MessageType, _: &str| {
            (kind == MessageType::Metadata).then(|| text.clone())
        }),
    )
    .unwrap();
    (session, server)
}
