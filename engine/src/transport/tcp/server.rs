//! The data-port server: checks every range against registered memory, then
//! moves bytes straight between the socket and that memory.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::config::Config;
use crate::conn_limit::ConnLimiter;
use crate::log_throttle::LogThrottle;
use crate::memory::MemoryRegistry;
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
    conns: Mutex<HashMap<u64, TcpStream>>,
    next_id: AtomicU64,
    /// Caps connections (and so threads) in total and per peer address.
    slots: Arc<ConnLimiter>,
    /// A connection without a request for this long is closed.
    idle_timeout: Duration,
    refusal_log: LogThrottle,
    idle_log: LogThrottle,
}

impl TcpServer {
    /// Serves `listener` (non-blocking) within the limits of `config`:
    /// `MC_TCP_STATUS_TIMEOUT_SEC` bounds every stalled read or write,
    /// `MC_TCP_SERVER_MAX_CONNECTIONS[_PER_IP]` the connections served at
    /// once, `MC_TCP_SERVER_IDLE_TIMEOUT` how long one may wait for a request.
    pub fn start(
        listener: TcpListener,
        memory: Arc<MemoryRegistry>,
        config: &Config,
    ) -> io::Result<Self> {
        let io_timeout = config.tcp_status_timeout;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            memory,
            io_timeout,
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            slots: ConnLimiter::new(
                config.tcp_server_max_connections,
                config.tcp_server_max_connections_per_ip,
            ),
            idle_timeout: config.tcp_server_idle_timeout,
            refusal_log: LogThrottle::per_second(),
            idle_log: LogThrottle::per_second(),
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
            let _ = c.shutdown(Shutdown::Both);
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
        // Refused connections are closed at once (dropped): a thread each
        // for any number of idle connections is what the cap prevents.
        let permit = match shared.slots.try_acquire(peer.ip()) {
            Ok(p) => p,
            Err(why) => {
                if let Some(left_out) = shared.refusal_log.allow() {
                    tracing::warn!(
                        "data connection from {peer} closed: {why} (MC_TCP_SERVER_MAX_CONNECTIONS / MC_TCP_SERVER_MAX_CONNECTIONS_PER_IP); {left_out} such lines left out"
                    );
                }
                continue;
            }
        };
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        match stream.try_clone() {
            Ok(c) => {
                shared.conns.lock().insert(id, c);
            }
            Err(e) => {
                tracing::warn!("cannot track connection from {peer}: {e}");
                continue;
            }
        }
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("te-tcp-conn".into())
            .spawn(move || {
                let _permit = permit;
                if let Err(e) = serve(stream, peer, &s) {
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

fn serve(mut stream: TcpStream, peer: SocketAddr, shared: &Shared) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(shared.io_timeout))?;
    stream.set_write_timeout(Some(shared.io_timeout))?;
    let mut header = [0u8; HEADER_LEN];
    let mut scratch = Vec::new();
    loop {
        // Idle connections wait here until the idle timeout, and notice shutdown.
        let idle_since = Instant::now();
        loop {
            if shared.stop.load(Ordering::Acquire) {
                return Ok(());
            }
            if net::wait_readable(&stream, Duration::from_millis(200))? {
                break;
            }
            if idle_since.elapsed() >= shared.idle_timeout {
                if let Some(left_out) = shared.idle_log.allow() {
                    tracing::warn!(
                        "data connection from {peer} closed: no request for {:?} (MC_TCP_SERVER_IDLE_TIMEOUT); {left_out} such lines left out",
                        shared.idle_timeout
                    );
                }
                return Ok(());
            }
        }
        if !net::read_exact_or_eof(&mut stream, &mut header)? {
            return Ok(());
        }
        let h = RequestHeader::decode(&header)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let region = shared.memory.find(h.addr, h.size);
        let guard = region.as_deref().and_then(|r| shared.memory.pin(r));
        let Some(_guard) = guard else {
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
            stream.write_all(&Status::AddrRejected.encode())?;
            if h.opcode == OpCode::Write {
                discard(&mut stream, h.size, &mut scratch)?;
            }
            continue;
        };
        if let Some((_, device)) = _guard.region().device {
            // Device memory: staged through pinned host buffers.
            match h.opcode {
                OpCode::Write => {
                    crate::device::staging_pool::receive_into(
                        device,
                        &mut stream,
                        h.addr,
                        h.size as usize,
                    )?;
                    if h.v2 {
                        stream.write_all(&Status::Ok.encode())?;
                    }
                }
                OpCode::Read => {
                    let prefix = if h.v2 {
                        &Status::Ok.encode()[..]
                    } else {
                        &[][..]
                    };
                    crate::device::staging_pool::send_from(
                        device,
                        &mut stream,
                        prefix,
                        h.addr,
                        h.size as usize,
                    )?;
                }
            }
            continue;
        }
        // SAFETY: [addr, addr+size) lies inside a registered host region,
        // which is pinned (cannot be unregistered) until `_guard` drops.
        let mem = unsafe { std::slice::from_raw_parts_mut(h.addr as *mut u8, h.size as usize) };
        match h.opcode {
            OpCode::Write => {
                stream.read_exact(mem)?;
                if h.v2 {
                    stream.write_all(&Status::Ok.encode())?;
                }
            }
            OpCode::Read => {
                if h.v2 {
                    net::write_two(&mut stream, &Status::Ok.encode(), mem)?;
                } else {
                    stream.write_all(mem)?;
                }
            }
        }
    }
}

/// Reads and drops the payload of a rejected write so the connection stays in step.
fn discard(stream: &mut TcpStream, mut left: u64, scratch: &mut Vec<u8>) -> io::Result<()> {
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
