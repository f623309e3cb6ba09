//! Peers' device memory mapped into this process: each handle a peer advertises is
//! opened once and cached (a peer's tensors that share an allocation share one mapping),
//! and closed when the peer's descriptor no longer lists it, when the peer's process is
//! gone, or at shutdown. A mapping is device/'s [`PeerMapping`], which owns the opened
//! handle; copies in flight hold their mapping, so a close waits for them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::device::ipc::{IpcHandle, IpcRuntime};
use crate::device::peer_mapping::PeerMapping;
use crate::wire::descriptor::{BufferDesc, SegmentDesc};

/// What a peer's handle gave: a mapping, or why it cannot be used (not retried until
/// the peer's descriptor changes).
type Opened = Result<Arc<PeerMapping>, String>;

struct PeerMaps {
    /// The descriptor the maps were checked against (address and timestamp).
    seen: (usize, String),
    pid: Option<u32>,
    pid_ns: Option<String>,
    host_id: Option<String>,
    maps: HashMap<String, Opened>,
    /// Handles the peer revoked -> when (its clock, descriptor timestamp format), and
    /// when we were told (the entry lapses after [`REVOKED_FOR`]).
    revoked: HashMap<String, (String, Instant)>,
    /// Handles being opened, or revoked and not yet closed.
    busy: HashSet<String>,
}

impl PeerMaps {
    /// Nothing mapped yet for `peer` (its descriptor at address `at`).
    fn new(peer: &SegmentDesc, at: usize) -> Self {
        Self {
            seen: (at, peer.timestamp.clone()),
            pid: peer.pid,
            pid_ns: peer.pid_ns.clone(),
            host_id: peer.host_id.clone(),
            maps: HashMap::new(),
            revoked: HashMap::new(),
            busy: HashSet::new(),
        }
    }
}

/// What the cache says about one handle.
enum Cache {
    Hit(Opened),
    /// Another thread opens or closes it now.
    Busy,
    /// Not there: the caller opens it.
    Miss,
}

/// How long a resolve waits for another thread's open or close of the same handle: an
/// open waits for the peer's answer (within `MC_HANDSHAKE_TIMEOUT`), a close for copies.
const BUSY_WAIT: Duration = Duration::from_secs(10);

/// Revocations remembered per peer.
const MAX_REVOKED: usize = 1024;
/// How long a revocation refuses stale descriptors: the engine drops its cached
/// descriptor when told, so only submits already under way, or a metadata store that has
/// not yet seen the peer's new descriptor, can still present one. Bounded so that a
/// forged `release` with a far-future `revoked_at` cannot keep IPC off for long.
const REVOKED_FOR: Duration = Duration::from_secs(60);

/// Refuses `shm` when the peer revoked it after `peer` (its descriptor) was encoded:
/// such a descriptor may still list the unregistered memory. Timestamps of one host's
/// clock in one fixed-width format compare as text.
fn revoked_check(entry: &PeerMaps, peer: &SegmentDesc, shm: &str) -> Result<(), String> {
    if entry.revoked.is_empty() {
        // The common case, without the upper-casing below (it allocates, per slice).
        return Ok(());
    }
    match entry.revoked.get(&shm.to_ascii_uppercase()) {
        Some((at, told))
            if told.elapsed() < REVOKED_FOR && peer.timestamp.as_str() <= at.as_str() =>
        {
            Err(format!(
            "the peer revoked this handle at {at} when it unregistered memory, after this descriptor ({}) was encoded; fetch it again",
            peer.timestamp
            ))
        }
        _ => Ok(()),
    }
}

/// Mappings per peer segment.
pub(super) struct Imports {
    ipc: Arc<IpcRuntime>,
    peers: Mutex<HashMap<String, PeerMaps>>,
    /// Of the handles opened, those opened again after the peer revoked our mapping of
    /// them.
    reopens: AtomicU64,
}

/// Where a remote range is mapped here.
pub(super) struct Target {
    /// The mapping (held while the copy runs).
    pub mapping: Arc<PeerMapping>,
    /// Address here of the remote buffer's first byte.
    pub buffer_base: u64,
}

impl Imports {
    pub fn new(ipc: Arc<IpcRuntime>) -> Self {
        Self {
            ipc,
            peers: Mutex::new(HashMap::new()),
            reopens: AtomicU64::new(0),
        }
    }

    /// The mapping of `buffer` of `peer` (opened on `device` on first use), or why none.
    /// A new mapping is announced to the peer (`announce`, without any lock held) before
    /// it is used, so that the peer can revoke it; an announcement refused fails it.
    pub fn resolve(
        &self,
        peer: &SegmentDesc,
        buffer: &BufferDesc,
        device: u32,
        announce: &dyn Fn(&str) -> Result<(), String>,
    ) -> Result<Target, String> {
        let (shm, vmm) = match (buffer.shm_name.as_deref(), buffer.ipc_vmm.as_deref()) {
            (Some(shm), _) => (shm, false),
            (None, Some(key)) => (key, true),
            (None, None) => return Err(
                "the buffer has no IPC handle (host memory, or memory the peer could not export)"
                    .into(),
            ),
        };
        // One open of a handle at a time in this process: the runtime's IPC mappings are
        // per process, and a second open while one is alive (being opened, or revoked and
        // waiting for its copies) is not something to rely on.
        let deadline = Instant::now() + BUSY_WAIT;
        let opened = loop {
            match self.cached(peer, shm)? {
                Cache::Hit(o) => break o,
                Cache::Busy if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Cache::Busy => return Err("the handle is being opened or closed".into()),
                Cache::Miss => {
                    // Opened and announced unlocked: the announcement waits on the peer.
                    let o = if vmm {
                        self.open_vmm(peer, shm, device)
                    } else {
                        self.open(shm, device)
                    }
                    .and_then(|m| announce(shm).map(|()| m));
                    let mut peers = self.peers.lock();
                    let Some(entry) = peers.get_mut(&peer.name) else {
                        return Err("the peer's mappings were dropped meanwhile".into());
                    };
                    entry.busy.remove(shm);
                    revoked_check(entry, peer, shm)?;
                    if o.is_ok() && entry.revoked.contains_key(&shm.to_ascii_uppercase()) {
                        self.reopens.fetch_add(1, Ordering::Relaxed);
                    }
                    break entry.maps.entry(shm.to_string()).or_insert(o).clone();
                }
            }
        };
        let mapping = opened?;
        let offset = buffer.shm_offset.unwrap_or(0);
        match offset.checked_add(buffer.length) {
            Some(end) if end <= mapping.size() => Ok(Target {
                buffer_base: mapping.base() + offset,
                mapping,
            }),
            _ => Err(format!(
                "the buffer ({} bytes at offset {offset}) does not fit the {}-byte allocation its handle maps",
                buffer.length,
                mapping.size()
            )),
        }
    }

    /// What the cache holds for `shm` of `peer` (after bringing the peer's entry up to
    /// date with its descriptor), or an error if the peer revoked it. A miss marks the
    /// handle busy: the caller opens it and clears the mark.
    fn cached(&self, peer: &SegmentDesc, shm: &str) -> Result<Cache, String> {
        let mut peers = self.peers.lock();
        let at = peer as *const SegmentDesc as usize;
        if !peers.contains_key(peer.name.as_str()) {
            peers.insert(peer.name.clone(), PeerMaps::new(peer, at));
        }
        let Some(entry) = peers.get_mut(peer.name.as_str()) else {
            return Err("internal: the peer's entry vanished".into());
        };
        if entry.seen.0 != at || entry.seen.1 != peer.timestamp {
            // A new descriptor: close what it no longer lists; a restarted peer (new
            // process) shares nothing with the old one.
            let restarted = entry.pid != peer.pid || entry.host_id != peer.host_id;
            let listed: std::collections::HashSet<&str> = peer
                .buffers
                .iter()
                .filter_map(|b| b.shm_name.as_deref().or(b.ipc_vmm.as_deref()))
                .collect();
            entry
                .maps
                .retain(|k, _| !restarted && listed.contains(k.as_str()));
            if restarted {
                entry.revoked.clear();
            }
            entry.seen = (at, peer.timestamp.clone());
            entry.pid = peer.pid;
            entry.pid_ns = peer.pid_ns.clone();
            entry.host_id = peer.host_id.clone();
        }
        revoked_check(entry, peer, shm)?;
        if let Some(o) = entry.maps.get(shm) {
            return Ok(Cache::Hit(o.clone()));
        }
        if entry.busy.contains(shm) {
            return Ok(Cache::Busy);
        }
        entry.busy.insert(shm.to_string());
        Ok(Cache::Miss)
    }

    /// The peer `exporter` revoked `shm` at `revoked_at`: its mapping leaves the cache and
    /// descriptors encoded until then may not open it again. Returns the mapping, which
    /// closes once the copies in flight that hold it are done.
    pub fn revoke(&self, exporter: &str, shm: &str, revoked_at: &str) -> Option<Arc<PeerMapping>> {
        let mut peers = self.peers.lock();
        let entry = peers.get_mut(exporter)?;
        entry
            .revoked
            .retain(|_, (_, told)| told.elapsed() < REVOKED_FOR);
        if entry.revoked.len() >= MAX_REVOKED
            && !entry.revoked.contains_key(&shm.to_ascii_uppercase())
        {
            // Bounded: the oldest revocations are the least likely to matter.
            if let Some(oldest) = entry
                .revoked
                .iter()
                .min_by_key(|(_, (_, told))| *told)
                .map(|(k, _)| k.clone())
            {
                entry.revoked.remove(&oldest);
            }
        }
        entry.revoked.insert(
            shm.to_ascii_uppercase(),
            (revoked_at.to_string(), Instant::now()),
        );
        let removed = entry.maps.remove(shm).and_then(Result::ok);
        if removed.is_some() {
            // Until it is closed (`closed`), nobody opens the handle again.
            entry.busy.insert(shm.to_string());
        }
        removed
    }

    /// The revoked mapping of `shm` from `exporter` was closed (or given up on).
    pub fn closed(&self, exporter: &str, shm: &str) {
        if let Some(entry) = self.peers.lock().get_mut(exporter) {
            entry.busy.remove(shm);
        }
    }

    fn open(&self, shm: &str, device: u32) -> Opened {
        let handle = IpcHandle::from_hex(shm).ok_or_else(|| {
            format!(
                "shm_name is not a {}-byte IPC handle in hex ({} characters)",
                crate::device::ipc::IPC_HANDLE_BYTES,
                shm.len()
            )
        })?;
        self.ipc.open_peer(handle, device).map(Arc::new)
    }

    /// Maps the allocations of the peer's virtual-memory region `key`, handed over by its
    /// descriptor socket, back to back as the peer has them.
    fn open_vmm(&self, peer: &SegmentDesc, key: &str, device: u32) -> Opened {
        // Before the peer is asked for its descriptors.
        self.ipc.vmm()?;
        let socket = peer
            .ipc_fd_socket
            .as_deref()
            .ok_or("the peer lists virtual-memory buffers but no ipc_fd_socket")?;
        let (chunks, span) = super::fd_share::fetch(socket, key)?;
        self.ipc.import_peer(&chunks, span, device).map(Arc::new)
    }

    /// Drops the mappings of `segment` (closed once copies in flight let go).
    pub fn forget(&self, segment: &str) {
        let gone = self.peers.lock().remove(segment);
        drop(gone);
    }

    /// Drops the mappings of peers `gone` says have exited.
    pub fn forget_gone(&self, gone: impl Fn(Option<u32>, Option<&str>, Option<&str>) -> bool) {
        let removed: Vec<PeerMaps> = {
            let mut peers = self.peers.lock();
            let names: Vec<String> = peers
                .iter()
                .filter(|(_, p)| gone(p.pid, p.pid_ns.as_deref(), p.host_id.as_deref()))
                .map(|(n, _)| n.clone())
                .collect();
            names.iter().filter_map(|n| peers.remove(n)).collect()
        };
        if !removed.is_empty() {
            tracing::info!(
                "closing the IPC mappings of {} peer(s) whose process exited",
                removed.len()
            );
        }
    }

    /// Drops every mapping.
    pub fn clear(&self) {
        let all = std::mem::take(&mut *self.peers.lock());
        drop(all);
    }

    /// Handles opened again after the peer revoked our mapping of them (while the
    /// revocation is remembered), since start.
    pub fn reopens(&self) -> u64 {
        self.reopens.load(Ordering::Relaxed)
    }

    /// (handles opened, mappings closed, mappings cached now) since start.
    pub fn counts(&self) -> (u64, u64, usize) {
        let cached = self
            .peers
            .lock()
            .values()
            .map(|p| p.maps.values().filter(|m| m.is_ok()).count())
            .sum();
        let (opens, closes) = self.ipc.peer_counts();
        (opens, closes, cached)
    }
}
