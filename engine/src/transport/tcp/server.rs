//! The data-port server: checks every range against registered memory, pins the
//! region for the access (so `unregister` can cut this connection and know when the
//! memory is free), then moves bytes straight between the socket and that memory.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use super::cut_reader::CutStream;
use crate::memory::{Abort, MemoryRegistry, SocketCut};
use crate::net;
use crate::wire::tcp::{OpCode, RequestHeader, Status, HEADER_LEN};

/// A running data-port listener; stops (and closes its connections) on drop.
pub struct TcpServer {
    port: u16,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    memory: Arc<MemoryRegistry>,
    io_timeout: Duration,
    stop: AtomicBool,
    conns: Mutex<HashMap<u64, Arc<SocketCut>>>,
    next_id: AtomicU64,
}

impl TcpServer {
    /// Serves `listener` (non-blocking); `io_timeout` bounds every stalled read or write.
    pub fn start(
        listener: TcpListener,
        memory: Arc<MemoryRegistry>,
        io_timeout: Duration,
    ) -> io::Result<Self> {
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            memory,
            io_timeout,
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("te-tcp-{port}"))
            .spawn(move || accept_loop(listener, s))?;
        Ok(Self {
            port,
            shared,
            thread: Some(thread),
        })
    }

    /// The listening port (advertised as `tcp_data_port`).
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for (_, c) in self.shared.conns.lock().drain() {
            c.abort();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::Acquire) {
        match net::wait_readable(&listener, Duration::from_millis(100)) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::error!("data listener poll failed: {e}");
                return;
            }
        }
        let (stream, peer) = match listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                tracing::warn!("data accept failed: {e}");
                continue;
            }
        };
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let cut = match stream.try_clone() {
            Ok(c) => Arc::new(SocketCut::new(c)),
            Err(e) => {
                tracing::warn!("cannot track connection from {peer}: {e}");
                continue;
            }
        };
        shared.conns.lock().insert(id, cut.clone());
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("te-tcp-conn".into())
            .spawn(move || {
                if let Err(e) = serve(stream, peer, &cut, &s) {
                    if !s.stop.load(Ordering::Acquire) {
                        tracing::debug!("data connection from {peer} ended: {e}");
                    }
                }
                s.conns.lock().remove(&id);
            });
        if let Err(e) = spawned {
            tracing::error!("cannot start a data connection thread: {e}");
            shared.conns.lock().remove(&id);
        }
    }
}

fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    cut: &Arc<SocketCut>,
    shared: &Shared,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(shared.io_timeout))?;
    stream.set_write_timeout(Some(shared.io_timeout))?;
    let holder: Arc<dyn Abort> = cut.clone();
    let mut own = CutStream {
        stream: &stream,
        cut,
    };
    let mut header = [0u8; HEADER_LEN];
    let mut scratch = Vec::new();
    loop {
        // Idle connections wait here without a deadline, but notice shutdown.
        loop {
            if shared.stop.load(Ordering::Acquire) || cut.is_cut() {
                return Ok(());
            }
            if net::wait_readable(&stream, Duration::from_millis(200))? {
                break;
            }
        }
        if !net::read_exact_or_eof(&mut own, &mut header)? {
            return Ok(());
        }
        let h = RequestHeader::decode(&header)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let Some(pin) = shared.memory.pin(h.addr, h.size, &holder) else {
            tracing::warn!(
                "rejected {:?} of {:#x}+{} from {peer}: not inside one registered buffer",
                h.opcode,
                h.addr,
                h.size
            );
            if !h.v2 {
                // v1 has no way to say no: close, as upstream does.
                return Ok(());
            }
            own.write_all(&Status::AddrRejected.encode())?;
            if h.opcode == OpCode::Write {
                discard(&mut own, h.size, &mut scratch)?;
            }
            continue;
        };
        let ok = Status::Ok.encode();
        let status: &[u8] = if h.v2 { &ok } else { &[] };
        if let Some((_, device)) = pin.region().device {
            // Device memory: staged through pinned host buffers.
            match h.opcode {
                OpCode::Write => {
                    crate::device::staging::receive_into(
                        device,
                        &mut own,
                        h.addr,
                        h.size as usize,
                    )?;
                    own.write_all(status)?;
                }
                OpCode::Read => {
                    crate::device::staging::send_from(
                        device,
                        &mut own,
                        status,
                        h.addr,
                        h.size as usize,
                    )?;
                }
            }
            continue;
        }
        let span = pin.span(h.addr, h.size).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "range outside its pinned region",
            )
        })?;
        match h.opcode {
            OpCode::Write => {
                span.recv_from(&stream, cut)?;
                own.write_all(status)?;
            }
            OpCode::Read => span.send_to(&stream, status, cut)?,
        }
    }
}

/// Reads and drops the payload of a rejected write so the connection stays in step.
fn discard(stream: &mut impl Read, mut left: u64, scratch: &mut Vec<u8>) -> io::Result<()> {
    scratch.resize(64 << 10, 0);
    while left > 0 {
        let n = left.min(scratch.len() as u64) as usize;
        let got = stream.read(&mut scratch[..n])?;
        if got == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        left -= got as u64;
    }
    Ok(())
}
