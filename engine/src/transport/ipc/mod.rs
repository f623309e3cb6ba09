//! Same-host GPU to GPU through the runtime's IPC handles: protocol `nvlink_intra` with
//! CUDA, `musa` with MUSA (upstream's names), over NVLink / MTLink where the GPUs have it.
//!
//! Serving side: every registered device region gets the IPC handle of the allocation
//! holding it ([`exports`]), advertised per buffer as `shm_name` (upper-case hex of the
//! 64-byte handle, upstream's encoding) with `shm_offset`, the region's offset inside
//! that allocation (ours; upstream peers ignore it and assume 0). The descriptor also
//! carries `host_id` (the kernel's boot id), `pid` and `pid_ns`, so that a peer on
//! another host never opens a handle, and a peer on this one notices when we exit.
//!
//! Initiating side: a request whose local and remote memory are both device memory,
//! to a peer on this host, is taken by this transport ([`Transport::takes`]) even when
//! the peer's protocol is `tcp` or `rdma`, unless `MC_DISABLE_IPC=1` (or `MC_FORCE_TCP=1`,
//! with which this transport is not started). Upstream peers
//! send no `host_id`: they are taken only when their protocol is the IPC protocol
//! (which upstream only serves within a node). The peer's handle is opened once
//! ([`imports`]) and the slices are copied device to device on streams ([`copier`]).
//! A handle that cannot be opened sends that buffer's requests back to TCP, logged
//! once with the reason.
//!
//! Revocation ([`control`]): an importer announces each handle it opens to the exporter
//! (when the peer advertises `ipc_control`, i.e. is one of our engines), and
//! `unregister_memory` on the exporter returns only after every live importer of that
//! allocation closed its mapping, or `MC_IPC_REVOKE_TIMEOUT` passed (logged as an error).

mod control;
mod copier;
mod exports;
mod fd_share;
mod host;
mod imports;
mod settings;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub use settings::IpcSettings;

use super::{Slice, Transport, TransportError};
use crate::config::Config;
use crate::device::ipc::IpcRuntime;
use crate::device::peer_mapping::PeerMapping;
use crate::device::Vendor;
use crate::error::{TransferError, Unreachable};
use crate::memory::{MemoryRegistry, Region};
use crate::wire::descriptor::{BufferDesc, SegmentDesc};
use crate::wire::session::SegmentId;
use control::{Control, Reply};
use copier::{Copier, Copy};
use exports::{Exports, Importer, Revocation, VmmSource};
use fd_share::FdServer;
use host::HostIdentity;
use imports::Imports;

/// Protocol name of the CUDA IPC transport (upstream's).
pub const PROTOCOL_CUDA: &str = "nvlink_intra";
/// Protocol name of the MUSA IPC transport (upstream's).
pub const PROTOCOL_MUSA: &str = "musa";

/// A batch is handed to the copy threads in groups of about this many bytes as it is
/// cut, so that the first copies run while later requests are still being resolved.
const GROUP_BYTES: u64 = 16 << 20;
/// ... or of this many copies, whichever comes first (scattered small blocks).
const GROUP_COPIES: usize = 32;

/// How long a peer process found alive is taken to be alive by [`Transport::takes`].
const ALIVE_FOR: Duration = Duration::from_millis(1);

/// Kinds of per-peer decisions, logged once each time they change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    HostBuffer,
    Declined,
    PeerGone,
    Ipc,
    Unmappable,
}

/// The IPC transport.
pub struct IpcTransport {
    ipc: Arc<IpcRuntime>,
    protocol: &'static str,
    settings: IpcSettings,
    host: HostIdentity,
    exports: Arc<Exports>,
    /// Hands the allocations of virtual-memory exports to same-host peers.
    fds: FdServer,
    imports: Imports,
    /// Per peer, the kind of the last decision logged (so each is logged once).
    decisions: Mutex<HashMap<String, Decision>>,
    /// The peer pid last found alive, and when: [`Transport::takes`] runs per request,
    /// and a liveness check is a system call.
    alive: Mutex<Option<(u32, Instant)>>,
    /// Our segment name (the `exporter` of our `release` messages).
    session_id: String,
    /// Where we take control messages: `host:port` of the handshake port.
    control: String,
    /// Handshake bounds for the control messages we send.
    config: Config,
    // Last: joined after the tables above are no longer needed by new work.
    copier: Copier,
}

impl IpcTransport {
    /// Starts the transport when a GPU runtime with devices and IPC calls is loaded;
    /// otherwise says why it is unavailable.
    /// `session_id` is our segment name, `control` the `host:port` of our handshake port.
    pub fn start(
        _memory: Arc<MemoryRegistry>,
        config: &Config,
        session_id: &str,
        control: &str,
    ) -> Result<Self, String> {
        let rt = crate::device::runtime().map_err(|e| e.to_string())?;
        if rt.device_count() == 0 {
            return Err(format!(
                "the {} runtime {} reports no devices",
                rt.vendor(),
                rt.path()
            ));
        }
        let settings = IpcSettings::new(rt.vendor(), config);
        let ipc = Arc::new(
            IpcRuntime::load(rt.clone())
                .map_err(|e| format!("{} has no IPC calls: {e}", rt.path()))?,
        );
        let host = HostIdentity::local(settings.host_id.clone())?;
        let copier = Copier::start(&ipc, settings.copy_threads, settings.batch_copy)
            .map_err(|e| format!("cannot start copy threads: {e}"))?;
        let protocol = match rt.vendor() {
            Vendor::Cuda => PROTOCOL_CUDA,
            Vendor::Musa => PROTOCOL_MUSA,
        };
        let exports = Arc::new(Exports::new(ipc.clone()));
        let fds = FdServer::start(Arc::new(VmmSource(exports.clone())))
            .map_err(|e| format!("cannot open the IPC descriptor socket: {e}"))?;
        let t = Self {
            exports,
            fds,
            imports: Imports::new(ipc.clone()),
            ipc,
            protocol,
            settings,
            host,
            decisions: Mutex::new(HashMap::new()),
            alive: Mutex::new(None),
            session_id: session_id.to_string(),
            control: control.to_string(),
            config: config.clone(),
            copier,
        };
        tracing::info!("{}", t.describe_decision());
        Ok(t)
    }

    /// Whether the segment advertises the IPC protocol itself (`MC_INTRANODE_NVLINK`,
    /// `MC_FORCE_MUSA`): then its descriptor says `protocol: "nvlink_intra"` / `"musa"`.
    pub fn advertises_protocol(&self) -> bool {
        self.settings.forced
    }

    /// One line for logs and the topology dump: what this transport does and has done.
    pub fn describe_decision(&self) -> String {
        let (regions, handles) = self.exports.counts();
        let (opens, closes, cached) = self.imports.counts();
        let driver = self
            .ipc
            .driver_path()
            .unwrap_or("none: device regions are not exported");
        let vmm = match self.ipc.vmm() {
            Ok(_) => format!(
                "virtual-memory allocations handed over on {}",
                self.fds.address()
            ),
            Err(why) => format!("virtual-memory allocations not shared ({why})"),
        };
        format!(
            "{protocol}: {vendor} IPC on {n} device(s) ({rt}; allocation ranges from {driver}); \
             same-host device-to-device requests {auto}; advertised protocol {adv}; host id {host}; \
             {regions} region(s) exported in {handles} handle(s); {vmm}; {opens} peer handle(s) opened, \
             {closes} closed, {cached} open now; slices of {slice} bytes on {threads} copy thread(s); \
             scattered slices {batch}",
            protocol = self.protocol,
            vendor = self.ipc.runtime().vendor(),
            n = self.ipc.runtime().device_count(),
            rt = self.ipc.runtime().path(),
            auto = if self.settings.auto {
                "go over IPC whatever the peer's protocol (MC_DISABLE_IPC=1 turns this off)"
            } else {
                "go over IPC only to peers whose protocol is this one (MC_DISABLE_IPC=1)"
            },
            adv = if self.settings.forced {
                self.protocol
            } else {
                "unchanged (MC_INTRANODE_NVLINK / MC_FORCE_MUSA unset)"
            },
            host = self.host.host_id,
            slice = self.settings.slice_size,
            threads = self.settings.copy_threads,
            batch = match self.ipc.runtime().batch_copy() {
                Ok(call) if self.copier.batching() => format!("go in one {call} per group"),
                Ok(call) if self.settings.batch_copy => {
                    format!("go one by one ({call} failed once, see the warning)")
                }
                Ok(_) => "go one by one (MC_IPC_BATCH_COPY=0)".to_string(),
                Err(why) => format!("go one by one ({why})"),
            },
        )
    }

    /// Why a request to `peer` is not taken, or `None` if this transport takes it.
    fn decline(&self, peer: &SegmentDesc, local_device: Option<u32>) -> Option<&'static str> {
        if local_device.is_none() {
            return Some("the local memory is host memory");
        }
        let speaks_ipc = peer.protocol.iter().any(|p| p == self.protocol);
        match self.host.same_host(peer) {
            Some(false) => return Some("the peer runs on another host"),
            None if !speaks_ipc => {
                return Some("the peer does not say which host it runs on (an upstream peer of protocol tcp/rdma)")
            }
            _ => {}
        }
        if !speaks_ipc && !self.settings.auto {
            return Some("MC_DISABLE_IPC=1");
        }
        None
    }

    /// Logs `text` when the decision for `peer` changes kind (the text is built then only).
    fn note(&self, peer: &SegmentDesc, kind: Decision, text: impl FnOnce() -> String) {
        let mut seen = self.decisions.lock();
        if seen.get(peer.name.as_str()) != Some(&kind) {
            tracing::info!("segment {}: {}", peer.name, text());
            seen.insert(peer.name.clone(), kind);
        }
    }

    /// Whether `peer`'s process has exited, checked at most once per [`ALIVE_FOR`] while
    /// it is alive: a batch asks once per request. (A peer may exit right after any
    /// check; this only widens that window by `ALIVE_FOR`.)
    fn peer_gone(&self, peer: &SegmentDesc) -> bool {
        if let (Some(pid), Some((seen, at))) = (peer.pid, *self.alive.lock()) {
            if pid == seen && at.elapsed() < ALIVE_FOR {
                return false;
            }
        }
        let gone = self.host.peer_gone(peer);
        if let (false, Some(pid)) = (gone, peer.pid) {
            *self.alive.lock() = Some((pid, Instant::now()));
        }
        gone
    }

    fn open_device(&self, remote: &BufferDesc, local_device: u32) -> u32 {
        if self.settings.open_on_buffer_device {
            if let Some((_, d)) = Vendor::parse_location(&remote.name) {
                if d < self.ipc.runtime().device_count() {
                    return d;
                }
            }
        }
        local_device
    }
}

impl IpcTransport {
    /// Tells the exporter `peer` that we opened its handle `shm`, so that it can revoke
    /// it. Upstream peers (no `ipc_control`) are not told and cannot revoke.
    fn announce(&self, peer: &SegmentDesc, shm: &str) -> Result<(), String> {
        let Some(addr) = peer.ipc_control.as_deref() else {
            tracing::debug!(
                "segment {} (upstream) cannot revoke the IPC handle we open: it is not told",
                peer.name
            );
            return Ok(());
        };
        let msg = Control::Opened {
            shm_name: shm.to_string(),
            importer: self.control.clone(),
            pid: self.host.pid,
            host_id: self.host.host_id.clone(),
        };
        let to = crate::wire::session::HostPort::parse(addr, 0)
            .map_err(|e| format!("its ipc_control {addr:?} is not a host:port: {e}"))?;
        let reply = crate::metadata::handshake::request(
            &to,
            crate::wire::handshake::MessageType::IpcControl,
            &msg.encode(),
            &self.config,
        )
        .map_err(|e| format!("it could not be told that we opened its handle: {e}"))?;
        Reply::check(&reply).map_err(|e| format!("it refused the handle: {e}"))
    }

    /// Asks every importer of the unregistered region's allocation to let go, and waits
    /// (all in parallel, within `MC_IPC_REVOKE_TIMEOUT`). An importer whose process is
    /// gone counts as released; one that does not answer in time is logged as an error.
    fn revoke(&self, region: &Region, r: Revocation, revoked_at: &str) {
        let live: Vec<Importer> = r
            .importers
            .into_iter()
            .filter(|i| !self.importer_gone(i))
            .collect();
        if live.is_empty() {
            return;
        }
        let limit = self.settings.revoke_timeout;
        let deadline = Instant::now() + limit;
        let msg = Control::Release {
            shm_name: r.shm_name,
            exporter: self.session_id.clone(),
            revoked_at: revoked_at.to_string(),
        }
        .encode();
        std::thread::scope(|scope| {
            for importer in &live {
                let msg = &msg;
                scope.spawn(move || {
                    let result = self.release_one(importer, msg, deadline);
                    match result {
                        Ok(()) => tracing::debug!(
                            "importer {} (pid {}) released {} at {:#x}",
                            importer.control,
                            importer.pid,
                            region.location,
                            region.addr
                        ),
                        Err(_) if self.importer_gone(importer) => {}
                        Err(why) => tracing::error!(
                            "unregistering {} memory at {:#x}+{}: the same-host peer at {} (pid {}) holding an IPC mapping of it did not confirm it let go within {limit:?} (MC_IPC_REVOKE_TIMEOUT): {why}; it may still write into this memory",
                            region.location,
                            region.addr,
                            region.len,
                            importer.control,
                            importer.pid
                        ),
                    }
                });
            }
        });
    }

    fn release_one(&self, importer: &Importer, msg: &str, deadline: Instant) -> Result<(), String> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("no time left".into());
        }
        let mut cfg = self.config.clone();
        cfg.handshake_timeout = left;
        cfg.handshake_connect_timeout = cfg.handshake_connect_timeout.min(left);
        let to = crate::wire::session::HostPort::parse(&importer.control, 0)
            .map_err(|e| e.to_string())?;
        let reply = crate::metadata::handshake::request(
            &to,
            crate::wire::handshake::MessageType::IpcControl,
            msg,
            &cfg,
        )
        .map_err(|e| e.to_string())?;
        Reply::check(&reply)
    }

    fn importer_gone(&self, i: &Importer) -> bool {
        self.host.peer_gone(&SegmentDesc {
            pid: Some(i.pid),
            pid_ns: Some(self.host.pid_ns.clone()),
            host_id: Some(self.host.host_id.clone()),
            ..SegmentDesc::default()
        })
    }

    /// Answers a peer's control message: every field is checked, nothing panics.
    fn serve_control(&self, json: &str, forget: &dyn Fn(&str)) -> String {
        let msg = match Control::decode(json) {
            Ok(m) => m,
            Err(why) => {
                tracing::warn!("IPC control message refused: {why}");
                return Reply::refused(why);
            }
        };
        match msg {
            Control::Opened {
                shm_name,
                importer,
                pid,
                host_id,
            } => {
                if host_id != self.host.host_id {
                    return Reply::refused("the importer runs on another host");
                }
                match self.exports.record_importer(
                    &shm_name,
                    Importer {
                        control: importer,
                        pid,
                    },
                ) {
                    Ok(()) => Reply::ok(),
                    Err(why) => Reply::refused(why),
                }
            }
            Control::Release {
                shm_name,
                exporter,
                revoked_at,
            } => {
                // New submits fetch the descriptor again; then the revoked handle is
                // refused for descriptors as old as the revocation.
                forget(&exporter);
                let Some(mapping) = self.imports.revoke(&exporter, &shm_name, &revoked_at) else {
                    return Reply::ok();
                };
                // Copies in flight hold the mapping: wait for them (device time only).
                let deadline = Instant::now() + self.settings.revoke_timeout;
                while Arc::strong_count(&mapping) > 1 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let done = Arc::strong_count(&mapping) == 1;
                drop(mapping);
                self.imports.closed(&exporter, &shm_name);
                if !done {
                    return Reply::refused("copies to the memory are still in flight");
                }
                tracing::info!("segment {exporter} unregistered memory: its IPC mapping is closed");
                Reply::ok()
            }
        }
    }
}

impl Transport for IpcTransport {
    fn protocol(&self) -> &'static str {
        self.protocol
    }

    fn describe(&self, desc: &mut SegmentDesc) {
        self.exports.describe(desc);
        self.host.describe(desc);
        desc.ipc_control = Some(self.control.clone());
        if self.exports.has_vmm() {
            desc.ipc_fd_socket = Some(self.fds.address());
        }
        if self.settings.forced {
            desc.protocol = vec![self.protocol.to_string()];
        }
    }

    fn reaches(&self, peer: &SegmentDesc) -> bool {
        peer.protocol.iter().any(|p| p == self.protocol) && self.host.same_host(peer) != Some(false)
    }

    fn takes(&self, peer: &SegmentDesc, local_device: Option<u32>, remote: &BufferDesc) -> bool {
        if remote.shm_name.is_none() && remote.ipc_vmm.is_none() {
            if local_device.is_some() && self.host.same_host(peer) == Some(true) {
                self.note(peer, Decision::HostBuffer, || {
                    format!(
                        "device requests to its host memory at {:#x} go over TCP",
                        remote.addr
                    )
                });
            }
            return false;
        }
        if let Some(why) = self.decline(peer, local_device) {
            if local_device.is_some() {
                self.note(peer, Decision::Declined, || {
                    format!(
                        "device-to-device requests go over its protocol {:?}, not {}: {why}",
                        peer.protocol, self.protocol
                    )
                });
            }
            return false;
        }
        if self.peer_gone(peer) {
            self.imports.forget(&peer.name);
            self.note(peer, Decision::PeerGone, || {
                "its process has exited; its IPC mappings are closed".into()
            });
            return false;
        }
        let device = local_device.unwrap_or(0);
        match self
            .imports
            .resolve(peer, remote, self.open_device(remote, device), &|shm| {
                self.announce(peer, shm)
            }) {
            Ok(_) => {
                self.note(peer, Decision::Ipc, || {
                    format!(
                        "device-to-device requests go over {} (same host)",
                        self.protocol
                    )
                });
                true
            }
            Err(why) => {
                self.note(peer, Decision::Unmappable, || {
                    format!(
                        "buffer {:#x} cannot be mapped over {} ({why}); its requests go over TCP",
                        remote.addr, self.protocol
                    )
                });
                false
            }
        }
    }

    fn unreachable(&self, _segment: &SegmentId, peer: &SegmentDesc) -> Option<Unreachable> {
        self.host
            .peer_gone(peer)
            .then_some(Unreachable::ProcessExited)
    }

    fn slice_size(&self) -> u64 {
        self.settings.slice_size
    }

    /// Peer handles opened count as connects, those opened again after the peer revoked
    /// our mapping (memory it unregistered, its allocation still reached through another
    /// buffer) as reconnects. Nothing corresponds to a retry: a failed copy fails its
    /// request.
    fn counters(&self) -> crate::metrics::TransportCounters {
        crate::metrics::TransportCounters {
            connects: self.imports.counts().0,
            reconnects: self.imports.reopens(),
            ..Default::default()
        }
    }

    // size: resolves and groups a post's slices in one pass, reusing the last buffer's
    // lookup and mapping and handing each group to a copy thread as soon as it is cut. Not
    // cut into steps yet.
    fn post(
        &self,
        segment: &SegmentId,
        peer: &SegmentDesc,
        slices: Vec<Slice>,
    ) -> Result<(), TransportError> {
        let peer_name: Arc<str> = Arc::from(segment.to_string());
        // Copies start while the rest of the batch is being resolved: each group of about
        // `GROUP_BYTES` goes to a copy thread as soon as it is cut. A batch smaller than
        // one group is spread over the threads whole, as before.
        let mut group = Vec::with_capacity(slices.len().min(GROUP_COPIES));
        let mut group_bytes = 0u64;
        let mut flushed = false;
        // Consecutive slices mostly fall in the same peer buffer: its lookup and mapping
        // are reused (the buffer's address, the local device, where it is mapped here).
        let mut last: Option<(&BufferDesc, u32, u64, Arc<PeerMapping>)> = None;
        for s in slices {
            let Some(device) = s.local_device else {
                s.finish(Err(TransferError::PeerUnreachable {
                    peer: segment.to_string(),
                    cause: Unreachable::HostMemory {
                        protocol: self.protocol,
                    },
                }));
                continue;
            };
            let hit = last
                .as_ref()
                .filter(|(b, d, _, _)| *d == device && b.contains(s.remote, s.len));
            let (buffer, base, mapping) = match hit {
                Some((b, _, base, m)) => (*b, *base, m.clone()),
                None => {
                    let Some(buffer) = peer.find_buffer(s.remote, s.len) else {
                        address_rejected(segment, s);
                        continue;
                    };
                    match self.imports.resolve(
                        peer,
                        buffer,
                        self.open_device(buffer, device),
                        &|shm| self.announce(peer, shm),
                    ) {
                        Ok(target) => {
                            last =
                                Some((buffer, device, target.buffer_base, target.mapping.clone()));
                            (buffer, target.buffer_base, target.mapping)
                        }
                        Err(reason) => {
                            s.finish(Err(TransferError::PeerUnreachable {
                                peer: segment.to_string(),
                                cause: Unreachable::Import {
                                    protocol: self.protocol,
                                    reason,
                                },
                            }));
                            continue;
                        }
                    }
                }
            };
            // Inside the buffer (found above), which lies inside the mapping (`resolve`):
            // cut once here, the range is what the copy may touch.
            let here = s
                .remote
                .checked_sub(buffer.addr)
                .and_then(|o| o.checked_add(base));
            let remote = match here.map(|addr| mapping.range(addr, s.len)) {
                Some(Ok(remote)) => remote,
                _ => {
                    address_rejected(segment, s);
                    continue;
                }
            };
            group_bytes += s.len;
            group.push(Copy {
                slice: s,
                remote,
                device,
                peer: peer_name.clone(),
            });
            if group_bytes >= GROUP_BYTES || group.len() >= GROUP_COPIES {
                self.copier.post_group(std::mem::take(&mut group));
                group_bytes = 0;
                flushed = true;
            }
        }
        if !group.is_empty() {
            if flushed {
                self.copier.post_group(group);
            } else {
                self.copier.post(group);
            }
        }
        Ok(())
    }

    fn evict_idle(&self) {
        let host = &self.host;
        self.imports.forget_gone(|pid, pid_ns, host_id| {
            host.peer_gone(&SegmentDesc {
                pid,
                pid_ns: pid_ns.map(str::to_string),
                host_id: host_id.map(str::to_string),
                ..SegmentDesc::default()
            })
        });
    }

    fn on_register(&self, region: &Arc<Region>) -> Result<(), TransportError> {
        self.exports.add(region);
        Ok(())
    }

    fn on_unregister(&self, region: &Arc<Region>) {
        // Descriptors encoded from now on no longer list the region (the registry
        // retired it before this hook), so importers may trust only those.
        let revoked_at = crate::net::timestamp_now();
        if let Some(r) = self.exports.remove(region) {
            self.revoke(region, r, &revoked_at);
        }
    }

    fn handle_ipc_control(&self, json: &str, forget: &dyn Fn(&str)) -> Option<String> {
        Some(self.serve_control(json, forget))
    }

    fn decision(&self) -> Option<String> {
        Some(self.describe_decision())
    }
}

/// Fails `s`, whose remote range is not inside memory the peer registered and we mapped.
fn address_rejected(segment: &SegmentId, s: Slice) {
    let (peer, addr, len) = (segment.to_string(), s.remote, s.len);
    s.finish(Err(TransferError::AddressRejected { peer, addr, len }));
}

impl Drop for IpcTransport {
    fn drop(&mut self) {
        // Mappings close once the copy threads (dropped after this) release theirs.
        self.imports.clear();
    }
}
