//! Handing the file descriptors of exported virtual-memory allocations
//! (`device::vmm`) to our engines on this host, over a unix socket with `SCM_RIGHTS`.
//!
//! Why a socket and not `pidfd_getfd` (PyTorch's choice for its own expandable-segment
//! sharing): `pidfd_getfd` needs ptrace rights over the exporter, which Yama's default
//! (`ptrace_scope=1`, Ubuntu) refuses between sibling processes and containers drop with
//! `CAP_SYS_PTRACE`; and it would let the importer take any descriptor of the exporter.
//! Here the exporter hands out only the allocations it exported, to processes of its own
//! user (`SO_PEERCRED`), and nothing about ptrace needs loosening.
//!
//! The socket is in the abstract namespace (`@mooncake-ipc-<pid>-<nonce>`, in the segment
//! descriptor as `ipc_fd_socket`): nothing to clean up, reachable within the network
//! namespace (host networking, as same-host engines run). One exchange per connection:
//!
//! - importer: the buffer's `ipc_vmm` key (128 hex digits) and `\n`;
//! - exporter: a little-endian `u32` length and a JSON header
//!   `{"ok":true,"chunks":[[offset,size],...]}` (or `{"ok":false,"error":"..."}`), then
//!   one descriptor per chunk, in order, at most [`FDS_PER_MESSAGE`] per message (each
//!   with one data byte).
//!
//! Bounds: the exporter serves one connection at a time, each within [`IO_TIMEOUT`], a
//! request of at most [`MAX_REQUEST`] bytes, and holds at most [`FDS_PER_MESSAGE`]
//! exported descriptors at once; the importer accepts a header of at most
//! [`MAX_HEADER`] bytes, [`MAX_CHUNKS`] chunks covering at most [`MAX_SPAN`] bytes back
//! to back, and exactly one descriptor per chunk.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Most allocations one exported region may span (an expandable segment maps 20 MiB
/// chunks: 320 GiB).
pub(super) const MAX_CHUNKS: usize = 16384;
/// Most bytes one import may map.
pub(super) const MAX_SPAN: u64 = 1 << 44;
/// Descriptors per message (the kernel's limit is 253).
pub(super) const FDS_PER_MESSAGE: usize = 64;
/// Longest request line.
pub(super) const MAX_REQUEST: u64 = 256;
/// Largest reply header.
pub(super) const MAX_HEADER: u32 = 1 << 20;
/// Each side's time for one exchange.
pub(super) const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// One allocation handed over: its descriptor, offset in the range and size.
pub(super) type Chunk = (OwnedFd, u64, u64);

/// The reply's header.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// (offset in the range, size), back to back from 0.
    #[serde(default)]
    chunks: Vec<[u64; 2]>,
}

/// What the exporter serves: for a key, the allocations (base, size) to export, and
/// the export of one of them.
pub(super) trait Source: Send + Sync + 'static {
    /// The allocations under the region `key` names, or why none.
    fn chunks(&self, key: &str) -> Result<(u32, Vec<(u64, u64)>), String>;
    /// One allocation (`base`, on `device`) as a file descriptor.
    fn export(&self, device: u32, base: u64) -> Result<OwnedFd, String>;
}

/// The exporter's socket and its thread; dropping it stops the thread.
pub(super) struct FdServer {
    name: String,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn abstract_addr(name: &str) -> std::io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(name.as_bytes())
}

impl FdServer {
    /// Binds a new abstract socket and serves `source` on it.
    pub fn start(source: Arc<dyn Source>) -> std::io::Result<Self> {
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let name = format!("mooncake-ipc-{}-{nonce:x}", std::process::id());
        let listener = UnixListener::bind_addr(&abstract_addr(&name)?)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("te-ipc-fds".into())
            .spawn(move || serve(&listener, &*source, &flag))?;
        Ok(Self {
            name,
            stop,
            thread: Some(thread),
        })
    }

    /// The descriptor's `ipc_fd_socket`: `@` and the abstract name.
    pub fn address(&self) -> String {
        format!("@{}", self.name)
    }
}

impl Drop for FdServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept.
        if let Ok(addr) = abstract_addr(&self.name) {
            let _ = UnixStream::connect_addr(&addr);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(listener: &UnixListener, source: &dyn Source, stop: &AtomicBool) {
    loop {
        let accepted = listener.accept();
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match accepted {
            Ok((stream, _)) => {
                if let Err(why) = serve_one(&stream, source) {
                    tracing::debug!("IPC descriptor request not served: {why}");
                }
            }
            // Out of descriptors or the like: let the process recover.
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// The uid of the process at the other end.
fn peer_uid(stream: &UnixStream) -> Result<u32, String> {
    crate::sys::socket::peer_uid(stream.as_fd()).map_err(|e| format!("SO_PEERCRED: {e}"))
}

fn serve_one(stream: &UnixStream, source: &dyn Source) -> Result<(), String> {
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(IO_TIMEOUT)))
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(stream.take(MAX_REQUEST))
        .read_line(&mut line)
        .map_err(|e| format!("reading the request: {e}"))?;
    let me = crate::sys::getuid();
    let found = peer_uid(stream).and_then(|uid| {
        if uid != me {
            return Err(format!(
                "descriptors are handed to processes of this engine's user (uid {me}) only, not to uid {uid}"
            ));
        }
        source.chunks(line.trim())
    });
    let header = match &found {
        Ok((_, chunks)) => {
            let mut offset = 0;
            let mut list = Vec::with_capacity(chunks.len());
            for &(_, size) in chunks {
                list.push([offset, size]);
                offset += size;
            }
            Header {
                ok: true,
                error: None,
                chunks: list,
            }
        }
        Err(why) => Header {
            ok: false,
            error: Some(why.clone()),
            chunks: Vec::new(),
        },
    };
    let text = serde_json::to_vec(&header).map_err(|e| e.to_string())?;
    let mut out = stream;
    out.write_all(&(text.len() as u32).to_le_bytes())
        .and_then(|()| out.write_all(&text))
        .map_err(|e| format!("writing the header: {e}"))?;
    let Ok((device, chunks)) = found else {
        return Ok(());
    };
    for batch in chunks.chunks(FDS_PER_MESSAGE) {
        let fds = batch
            .iter()
            .map(|&(base, _)| source.export(device, base))
            .collect::<Result<Vec<OwnedFd>, String>>()?;
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
        send_fds(stream, &borrowed).map_err(|e| format!("sending descriptors: {e}"))?;
    }
    Ok(())
}

fn send_fds(stream: &UnixStream, fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    crate::sys::socket::send_fds(stream.as_fd(), fds)
}

/// Receives one message, appending its descriptors (at most `max`) to `out`; returns
/// the data bytes read (0: the exporter closed).
fn recv_fds(stream: &UnixStream, max: usize, out: &mut Vec<OwnedFd>) -> std::io::Result<usize> {
    crate::sys::socket::recv_fds(stream.as_fd(), max, out)
}

/// Whether `text` is an `ipc_fd_socket` as we advertise it.
fn socket_name(text: &str) -> Option<&str> {
    let name = text.strip_prefix('@')?;
    let ok = !name.is_empty()
        && name.len() <= 100
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    ok.then_some(name)
}

/// Asks the exporter at `socket` for the allocations of `key`: the descriptors with
/// (offset, size) each, back to back from 0, and the span they cover.
pub(super) fn fetch(socket: &str, key: &str) -> Result<(Vec<Chunk>, u64), String> {
    let name = socket_name(socket)
        .ok_or_else(|| format!("ipc_fd_socket {socket:?} is not an abstract socket name"))?;
    let stream = abstract_addr(name)
        .and_then(|a| UnixStream::connect_addr(&a))
        .map_err(|e| format!("cannot reach the exporter's socket {socket} ({e}); it must run in this network namespace"))?;
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(IO_TIMEOUT)))
        .map_err(|e| e.to_string())?;
    (&stream)
        .write_all(format!("{key}\n").as_bytes())
        .map_err(|e| format!("sending the request: {e}"))?;
    let mut len = [0u8; 4];
    (&stream)
        .read_exact(&mut len)
        .map_err(|e| format!("reading the reply: {e}"))?;
    let len = u32::from_le_bytes(len);
    if len > MAX_HEADER {
        return Err(format!(
            "the reply header is {len} bytes (at most {MAX_HEADER})"
        ));
    }
    let mut text = vec![0u8; len as usize];
    (&stream)
        .read_exact(&mut text)
        .map_err(|e| format!("reading the reply: {e}"))?;
    let header: Header =
        serde_json::from_slice(&text).map_err(|e| format!("the reply is not understood: {e}"))?;
    if !header.ok {
        return Err(format!(
            "the exporter refused: {}",
            header.error.as_deref().unwrap_or("no reason given")
        ));
    }
    let span = check_chunks(&header.chunks)?;
    let mut fds = Vec::with_capacity(header.chunks.len());
    while fds.len() < header.chunks.len() {
        let want = (header.chunks.len() - fds.len()).min(FDS_PER_MESSAGE);
        let n =
            recv_fds(&stream, want, &mut fds).map_err(|e| format!("receiving descriptors: {e}"))?;
        if n == 0 {
            return Err(format!(
                "the exporter closed after {} of {} descriptors",
                fds.len(),
                header.chunks.len()
            ));
        }
        if fds.len() > header.chunks.len() {
            return Err("the exporter sent more descriptors than chunks".into());
        }
    }
    let chunks = fds
        .into_iter()
        .zip(&header.chunks)
        .map(|(fd, &[offset, size])| (fd, offset, size))
        .collect();
    Ok((chunks, span))
}

/// The span the chunks cover, if they lie back to back from 0 within the bounds.
fn check_chunks(chunks: &[[u64; 2]]) -> Result<u64, String> {
    if chunks.is_empty() || chunks.len() > MAX_CHUNKS {
        return Err(format!(
            "the exporter listed {} chunks (1 to {MAX_CHUNKS} accepted)",
            chunks.len()
        ));
    }
    let mut end = 0u64;
    for &[offset, size] in chunks {
        if offset != end || size == 0 {
            return Err(format!(
                "the chunks are not back to back from 0 (chunk at {offset} of {size} bytes after {end})"
            ));
        }
        end = end
            .checked_add(size)
            .filter(|&e| e <= MAX_SPAN)
            .ok_or_else(|| format!("the chunks cover more than {MAX_SPAN} bytes"))?;
    }
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serves memfds as "allocations", so descriptors really cross the socket.
    struct Memfds;

    impl Source for Memfds {
        fn chunks(&self, key: &str) -> Result<(u32, Vec<(u64, u64)>), String> {
            match key {
                "three" => Ok((0, vec![(0x1000, 4096), (0x2000, 8192), (0x4000, 4096)])),
                "many" => Ok((0, (0..150).map(|i| (i * 4096, 4096)).collect())),
                _ => Err(format!("no export named {key:?}")),
            }
        }

        fn export(&self, _device: u32, base: u64) -> Result<OwnedFd, String> {
            let fd =
                crate::sys::memfd_create(c"chunk", libc::MFD_CLOEXEC).map_err(|e| e.to_string())?;
            let mut f = std::fs::File::from(fd);
            f.write_all(&base.to_le_bytes())
                .map_err(|e| e.to_string())?;
            Ok(f.into())
        }
    }

    fn first_word(fd: OwnedFd) -> u64 {
        use std::io::Seek;
        let mut f = std::fs::File::from(fd);
        f.rewind().unwrap();
        let mut b = [0u8; 8];
        f.read_exact(&mut b).unwrap();
        u64::from_le_bytes(b)
    }

    #[test]
    fn descriptors_cross_in_order_and_refusals_carry_the_reason() {
        let server = FdServer::start(Arc::new(Memfds)).unwrap();
        let (chunks, span) = fetch(&server.address(), "three").unwrap();
        assert_eq!(span, 16384);
        let got: Vec<(u64, u64, u64)> = chunks
            .into_iter()
            .map(|(fd, off, size)| (first_word(fd), off, size))
            .collect();
        assert_eq!(
            got,
            vec![
                (0x1000, 0, 4096),
                (0x2000, 4096, 8192),
                (0x4000, 12288, 4096)
            ]
        );
        // More than one message's worth.
        let (many, span) = fetch(&server.address(), "many").unwrap();
        assert_eq!((many.len(), span), (150, 150 * 4096));
        assert_eq!(first_word(many.into_iter().nth(149).unwrap().0), 149 * 4096);
        let err = fetch(&server.address(), "nope").unwrap_err();
        assert!(err.contains("no export named"), "{err}");
        assert!(fetch("not-a-socket", "three").is_err());
        assert!(fetch("@mooncake-ipc-nobody-listens", "three")
            .unwrap_err()
            .contains("cannot reach"));
    }

    #[test]
    fn hostile_requests_and_replies_are_bounded() {
        let server = FdServer::start(Arc::new(Memfds)).unwrap();
        // A request that never ends: cut at MAX_REQUEST, refused, the server goes on.
        let name = server.address();
        let s = UnixStream::connect_addr(&abstract_addr(&name[1..]).unwrap()).unwrap();
        (&s).write_all(&vec![b'x'; 10_000]).unwrap_or(());
        let mut len = [0u8; 4];
        (&s).read_exact(&mut len).unwrap();
        drop(s);
        // The server goes on serving.
        assert!(fetch(&name, "three").is_ok());
        // Replies a lying exporter could send.
        assert!(check_chunks(&[]).is_err());
        assert!(check_chunks(&[[0, 4096], [8192, 4096]]).is_err(), "gap");
        assert!(check_chunks(&[[0, 0]]).is_err(), "empty chunk");
        assert!(check_chunks(&[[0, u64::MAX], [u64::MAX, 1]]).is_err());
        assert!(check_chunks(&vec![[0, 1]; MAX_CHUNKS + 1]).is_err());
        assert_eq!(check_chunks(&[[0, 4096], [4096, 4096]]), Ok(8192));
    }
}
