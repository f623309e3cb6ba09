//! Handles of local device memory, as peers receive them: one runtime IPC handle per
//! allocation (a handle names the whole allocation the driver made, so tensors a
//! caching allocator packed into one allocation share it), and per registered region
//! the offset of its start inside that allocation.
//!
//! Memory of the virtual-memory API (PyTorch's expandable segments) has no such handle:
//! a region of it is exported as the allocations mapped under it (`device::vmm`), named
//! by a key of ours (`ipc_vmm`, 128 hex digits like a handle, so that the control
//! messages carry it unchanged) that peers present to our descriptor socket
//! ([`super::fd_share`]).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::fd_share::{Source, MAX_CHUNKS};
use crate::device::ipc::{IpcHandle, IpcRuntime, IPC_HANDLE_BYTES};
use crate::memory::Region;
use crate::wire::descriptor::SegmentDesc;

/// What a handle names: a legacy allocation (by its base) or one exported
/// virtual-memory region (by its number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Key {
    Alloc(u64),
    Vmm(u64),
}

/// A virtual-memory region's allocations, as the descriptor socket hands them out.
struct VmmExport {
    device: u32,
    chunks: Vec<(u64, u64)>,
}

/// Numbers of virtual-memory exports, process-wide (keys stay unique across engines).
static NEXT_VMM: AtomicU64 = AtomicU64::new(1);

/// The `ipc_vmm` key of export `n`: a tag, our pid and `n`, as 64 bytes in hex.
fn vmm_key(n: u64) -> String {
    let mut b = [0u8; IPC_HANDLE_BYTES];
    b[..8].copy_from_slice(b"MCTE-VMM");
    b[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    b[12..20].copy_from_slice(&n.to_le_bytes());
    IpcHandle(b).to_hex()
}

/// What a registered device region advertises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Export {
    /// `shm_name`: the handle in upstream's hex.
    pub shm_name: String,
    /// Offset of the region's start inside the allocation.
    pub offset: u64,
    /// What the handle names (key of the handle cache).
    pub base: Key,
    /// Memory of the virtual-memory API: advertised as `ipc_vmm`, not `shm_name`.
    pub vmm: bool,
    /// The region's location (`cuda:0`), the buffer name of IPC descriptors.
    pub location: String,
}

/// A peer process that opened one of our handles (`opened` control message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Importer {
    /// Where it takes control messages (`host:port`).
    pub control: String,
    /// Its process id (on this host: [`Importer::control`] checked against its liveness).
    pub pid: u32,
}

/// What an unregistration leaves to do: ask `importers` to close `shm_name`.
pub(super) struct Revocation {
    pub shm_name: String,
    pub importers: Vec<Importer>,
}

#[derive(Default)]
struct Tables {
    /// Allocation -> the peers that opened its handle.
    importers: HashMap<Key, Vec<Importer>>,
    /// Registered region start -> its export.
    regions: HashMap<u64, Export>,
    /// Allocation -> (handle hex, regions using it).
    handles: HashMap<Key, (String, usize)>,
    /// `ipc_vmm` key -> the allocations it hands out.
    vmm: HashMap<String, VmmExport>,
}

/// The exports of this engine.
pub(super) struct Exports {
    ipc: Arc<IpcRuntime>,
    tables: Mutex<Tables>,
}

impl Exports {
    pub fn new(ipc: Arc<IpcRuntime>) -> Self {
        Self {
            ipc,
            tables: Mutex::new(Tables::default()),
        }
    }

    /// Exports a device region of this runtime's vendor; host memory and memory the
    /// runtime cannot share are left to the other transports (the reason is logged).
    pub fn add(&self, region: &Arc<Region>) {
        let Some((vendor, device)) = region.device else {
            return;
        };
        if vendor != self.ipc.runtime().vendor() {
            return;
        }
        match self.export(region, device) {
            Ok(export) => {
                tracing::debug!(
                    "{} at {:#x}+{} exported for same-host IPC (allocation {:x?}, offset {})",
                    region.location,
                    region.addr,
                    region.len,
                    export.base,
                    export.offset
                );
                self.tables.lock().regions.insert(region.addr, export);
            }
            Err(why) => tracing::warn!(
                "{} memory at {:#x}+{} is not shared over IPC: {why}; peers on this host reach it over TCP",
                region.location,
                region.addr,
                region.len
            ),
        }
    }

    fn export(&self, region: &Region, device: u32) -> Result<Export, String> {
        self.export_legacy(region, device).or_else(|legacy| {
            self.export_vmm(region, device)
                .map_err(|vmm| format!("{legacy}; as memory of the virtual-memory API: {vmm}"))
        })
    }

    /// Memory of the virtual-memory API (e.g. PyTorch's expandable segments): the
    /// allocations under the region, each checked to export as a file descriptor.
    fn export_vmm(&self, region: &Region, device: u32) -> Result<Export, String> {
        let vmm = self.ipc.vmm()?;
        let chunks = self
            .ipc
            .on_device(device, || {
                Ok(self
                    .ipc
                    .vmm_chunks(region.addr, region.len, MAX_CHUNKS)
                    .and_then(|chunks| {
                        for &(base, _) in &chunks {
                            drop(vmm.export_fd(base)?);
                        }
                        Ok(chunks)
                    }))
            })
            .map_err(|e| e.to_string())??;
        let span_base = chunks.first().map_or(region.addr, |c| c.0);
        let n = NEXT_VMM.fetch_add(1, Ordering::Relaxed);
        let key = vmm_key(n);
        let mut tables = self.tables.lock();
        tables.handles.insert(Key::Vmm(n), (key.clone(), 1));
        tables.vmm.insert(key.clone(), VmmExport { device, chunks });
        Ok(Export {
            shm_name: key,
            offset: region.addr - span_base,
            base: Key::Vmm(n),
            vmm: true,
            location: region.location.clone(),
        })
    }

    fn export_legacy(&self, region: &Region, device: u32) -> Result<Export, String> {
        let (base, size) = self
            .ipc
            .on_device(device, || Ok(self.ipc.allocation_range(region.addr)))
            .map_err(|e| e.to_string())??;
        let offset = region.addr - base;
        if offset.checked_add(region.len).is_none_or(|end| end > size) {
            return Err(format!(
                "the region runs past its allocation ({base:#x}+{size}); register it in pieces, one per allocation"
            ));
        }
        let mut tables = self.tables.lock();
        let shm_name = match tables.handles.get_mut(&Key::Alloc(base)) {
            Some((hex, users)) => {
                *users += 1;
                hex.clone()
            }
            None => {
                let handle = self
                    .ipc
                    .on_device(device, || self.ipc.get_handle(base))
                    .map_err(|e| {
                        format!(
                            "{e} (memory from the virtual-memory API, cuMemCreate/cuMemMap as in PyTorch's expandable segments, is refused by the legacy IPC call)"
                        )
                    })?;
                let hex = handle.to_hex();
                tables.handles.insert(Key::Alloc(base), (hex.clone(), 1));
                hex
            }
        };
        Ok(Export {
            shm_name,
            offset,
            base: Key::Alloc(base),
            vmm: false,
            location: region.location.clone(),
        })
    }

    /// Forgets an unregistered region; the handle of its allocation goes with its last
    /// user. Every importer of that allocation must let go (its mapping reaches the
    /// unregistered range even when other regions keep the handle exported): they are
    /// returned, and forgotten here, so that those still using the allocation open it again.
    pub fn remove(&self, region: &Region) -> Option<Revocation> {
        let mut tables = self.tables.lock();
        let export = tables.regions.remove(&region.addr)?;
        if let Some((_, users)) = tables.handles.get_mut(&export.base) {
            *users -= 1;
            if *users == 0 {
                tables.handles.remove(&export.base);
                tables.vmm.remove(&export.shm_name);
            }
        }
        let importers = tables.importers.remove(&export.base).unwrap_or_default();
        Some(Revocation {
            shm_name: export.shm_name,
            importers,
        })
    }

    /// Records that `importer` opened the handle `shm_name`; refused when we do not export
    /// it (any more) or too many peers hold it.
    pub fn record_importer(&self, shm_name: &str, importer: Importer) -> Result<(), String> {
        let mut tables = self.tables.lock();
        let Some(base) = tables
            .handles
            .iter()
            .find(|(_, (hex, _))| hex.eq_ignore_ascii_case(shm_name))
            .map(|(base, _)| *base)
        else {
            return Err("this handle is not exported (the memory was unregistered); fetch the descriptor again".into());
        };
        let list = tables.importers.entry(base).or_default();
        if list.contains(&importer) {
            return Ok(());
        }
        if list.len() >= super::control::MAX_IMPORTERS_PER_HANDLE {
            return Err(format!(
                "{} peers already hold this handle; use TCP",
                list.len()
            ));
        }
        list.push(importer);
        Ok(())
    }

    /// Adds `shm_name`, `shm_offset` and the location to the exported buffers of `desc`.
    pub fn describe(&self, desc: &mut SegmentDesc) {
        let tables = self.tables.lock();
        for b in &mut desc.buffers {
            if let Some(e) = tables.regions.get(&b.addr) {
                b.name = e.location.clone();
                if e.vmm {
                    b.ipc_vmm = Some(e.shm_name.clone());
                } else {
                    b.shm_name = Some(e.shm_name.clone());
                }
                b.shm_offset = Some(e.offset);
            }
        }
    }

    /// Whether any region is exported as virtual-memory allocations (then the
    /// descriptor names our descriptor socket).
    pub fn has_vmm(&self) -> bool {
        !self.tables.lock().vmm.is_empty()
    }

    /// Regions exported and distinct allocation handles, for the decision summary.
    pub fn counts(&self) -> (usize, usize) {
        let t = self.tables.lock();
        (t.regions.len(), t.handles.len())
    }
}

/// The descriptor socket serves the virtual-memory exports.
pub(super) struct VmmSource(pub Arc<Exports>);

impl Source for VmmSource {
    fn chunks(&self, key: &str) -> Result<(u32, Vec<(u64, u64)>), String> {
        let tables = self.0.tables.lock();
        let found = tables
            .vmm
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, e)| (e.device, e.chunks.clone()));
        found.ok_or_else(|| {
            "this key is not exported (the memory was unregistered); fetch the descriptor again"
                .into()
        })
    }

    fn export(&self, device: u32, base: u64) -> Result<OwnedFd, String> {
        let ipc = &self.0.ipc;
        let vmm = ipc.vmm()?;
        ipc.on_device(device, || Ok(vmm.export_fd(base)))
            .map_err(|e| e.to_string())?
    }
}
