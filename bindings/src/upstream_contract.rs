//! Upstream's Python `TransferEngine` contract in plain Rust: initialize (and
//! re-initialize), registration, sync / batch / async transfers with upstream's timeouts,
//! batch ids, managed buffers, notifies and probes over [`transfer_engine::TransferEngine`].
//!
//! Nothing here knows Python; `py_engine` only converts arguments and results. Methods
//! that wait take `interrupted`, polled while they wait (Ctrl-C).
//!
//! **Re-initialization.** `initialize` on an initialized object starts a new engine (new
//! ports, new session id) and, once it is up, carries every registration over to it
//! (`register_memory` regions and managed-buffer chunks), then drops the old one: its
//! cached segments and connections go, batches still in flight on it fail ("the engine
//! shut down"). If the new engine cannot start, the old one stays and `-1` is returned.
//! This is what upstream does (a second call builds a new engine), minus losing the
//! registrations.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use transfer_engine::{
    topology, Batch, Config, EngineError, Notify, OpCode, Request, SubmitOptions, TransferEngine,
    TransportRequest,
};

use crate::batch_table::{self, BatchTable, Poll};
use crate::errors::BindingError;
use crate::host_memory;
use crate::managed_buffers::{ChunkSource, ManagedBuffers};
use crate::metadata_string;

/// Location recorded for managed-buffer chunks (host memory).
const MANAGED_LOCATION: &str = "cpu:0";

/// One `mooncake.engine.TransferEngine` object.
#[derive(Default)]
pub struct ContractEngine {
    engine: RwLock<Option<Arc<TransferEngine>>>,
    /// Every region registered through this object: addr -> (len, location). Also the lock
    /// that orders registrations against re-initialization.
    registrations: Mutex<BTreeMap<u64, (u64, String)>>,
    managed: Mutex<ManagedBuffers>,
    batches: BatchTable,
}

impl ContractEngine {
    /// A new object; no engine until [`initialize`](Self::initialize).
    pub fn new() -> Self {
        Self::default()
    }

    /// The running engine.
    pub fn engine(&self) -> Result<Arc<TransferEngine>, BindingError> {
        self.engine
            .read()
            .clone()
            .ok_or(BindingError::NotInitialized)
    }

    /// `initialize(local_hostname, metadata_server, protocol, device_name)`.
    pub fn initialize(
        &self,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
    ) -> Result<(), BindingError> {
        let conn = metadata_string::for_initialize(metadata_server);
        self.start(local_hostname, &conn, protocol, device_name)
    }

    /// `initialize_ext(local_hostname, metadata_server, protocol, device_name, metadata_type)`.
    pub fn initialize_ext(
        &self,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
        metadata_type: &str,
    ) -> Result<(), BindingError> {
        let conn = metadata_string::for_initialize_ext(metadata_server, metadata_type);
        self.start(local_hostname, &conn, protocol, device_name)
    }

    fn start(
        &self,
        local_hostname: &str,
        conn: &str,
        protocol: &str,
        device_name: &str,
    ) -> Result<(), BindingError> {
        if protocol == "xgmi" {
            return Err(BindingError::InvalidArgument(
                "protocol \"xgmi\" is not supported (as upstream)".into(),
            ));
        }
        let config = Config::from_env().map_err(EngineError::from)?;
        // The protocol picks the transports (TCP always; RDMA, GPU IPC), device_name
        // narrows the HCAs; a protocol not served, or RDMA required by MC_FORCE_HCA but
        // unusable, fails here with the reason (initialize returns -1, last_error() says why).
        let request = TransportRequest::new(protocol, device_name);
        let new = Arc::new(TransferEngine::with_transports(
            local_hostname,
            conn,
            config,
            &request,
        )?);
        let registrations = self.registrations.lock();
        let mut slot = self.engine.write();
        if let Some(old) = slot.as_ref() {
            tracing::warn!(
                "initialize called again: replacing engine {} with {}; carrying over {} registered regions",
                old.session_id(),
                new.session_id(),
                registrations.len()
            );
            for (&addr, (len, location)) in registrations.iter() {
                if let Err(e) = new.register_memory(addr, *len, location) {
                    tracing::error!(
                        "re-initialize: cannot register {addr:#x}+{len} on the new engine: {e}"
                    );
                }
            }
        }
        *slot = Some(new);
        Ok(())
    }

    /// `get_rpc_port()`.
    pub fn rpc_port(&self) -> Result<u16, BindingError> {
        Ok(self.engine()?.rpc_port())
    }

    /// `register_memory(addr, len, location)`.
    pub fn register_memory(&self, addr: u64, len: u64, location: &str) -> Result<(), BindingError> {
        let mut registrations = self.registrations.lock();
        self.engine()?.register_memory(addr, len, location)?;
        registrations.insert(addr, (len, location.to_string()));
        Ok(())
    }

    /// `unregister_memory(addr)`.
    pub fn unregister_memory(&self, addr: u64) -> Result<(), BindingError> {
        let mut registrations = self.registrations.lock();
        self.engine()?.unregister_memory(addr)?;
        registrations.remove(&addr);
        Ok(())
    }

    /// `batch_register_memory(addrs, lens, location)`: all or nothing (a failure
    /// unregisters what this call registered).
    pub fn batch_register_memory(
        &self,
        addrs: &[u64],
        lens: &[u64],
        location: &str,
    ) -> Result<(), BindingError> {
        if addrs.len() != lens.len() {
            return Err(BindingError::InvalidArgument(format!(
                "{} addresses but {} capacities",
                addrs.len(),
                lens.len()
            )));
        }
        for (i, (&addr, &len)) in addrs.iter().zip(lens).enumerate() {
            if let Err(e) = self.register_memory(addr, len, location) {
                for &done in addrs.iter().take(i) {
                    let _ = self.unregister_memory(done);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// `batch_unregister_memory(addrs)`: unregisters every address it can; reports the
    /// first failure.
    pub fn batch_unregister_memory(&self, addrs: &[u64]) -> Result<(), BindingError> {
        let mut first = Ok(());
        for &addr in addrs {
            if let Err(e) = self.unregister_memory(addr) {
                first = first.and(Err(e));
            }
        }
        first
    }

    /// `transfer_sync*` and `batch_transfer_sync*`: one batch, waited for until upstream's
    /// deadline (`MC_TRANSFER_TIMEOUT` + 1 ns per byte); then the notify, if any.
    ///
    /// # Safety
    /// Every local range must be valid host memory (writable for reads) for the call.
    pub unsafe fn transfer_sync(
        &self,
        target: &str,
        requests: &[Request],
        notify: Option<&Notify>,
        nic_hint: &str,
        interrupted: &dyn Fn() -> bool,
    ) -> Result<(), BindingError> {
        let engine = self.engine()?;
        let options = SubmitOptions {
            caller_waits: true,
            nic: nic(nic_hint),
        };
        // SAFETY: the caller guarantees the local ranges for the call; the wait below
        // returns only once the batch finished or was drained (timeout, interrupt), so no
        // engine thread touches them after this call returns (upstream's sync calls do not
        // guarantee that).
        let batch = unsafe { engine.submit_with(target, requests, &options) }?;
        batch_table::wait(&batch, target, interrupted)?;
        if let Some(n) = notify {
            engine.send_notify(target, n)?;
        }
        Ok(())
    }

    /// `batch_transfer_async*` and `transfer_submit_write`: submits; returns the batch id.
    ///
    /// # Safety
    /// Every local range must stay valid until a status call reports the batch finished,
    /// failed or timed out (each drains it first).
    pub unsafe fn submit(
        &self,
        target: &str,
        requests: &[Request],
        nic_hint: &str,
    ) -> Result<u64, BindingError> {
        let engine = self.engine()?;
        let options = SubmitOptions {
            nic: nic(nic_hint),
            ..SubmitOptions::default()
        };
        // SAFETY: forwarded to the caller.
        let batch: Batch = unsafe { engine.submit_with(target, requests, &options) }?;
        Ok(self.batches.insert(batch, target))
    }

    /// `get_batch_transfer_status(ids)`.
    pub fn wait_batches(
        &self,
        ids: &[u64],
        interrupted: &dyn Fn() -> bool,
    ) -> Result<(), BindingError> {
        self.batches.wait_all(ids, interrupted)
    }

    /// `transfer_check_status(id)`.
    pub fn check_batch(&self, id: u64) -> Result<Poll, BindingError> {
        self.batches.poll(id, std::time::Instant::now())
    }

    /// `allocate_managed_buffer(len)`: host memory from registered chunks.
    pub fn allocate_managed(&self, len: u64) -> Result<u64, BindingError> {
        let mut managed = self.managed.lock();
        let mut source = RegisteredHostMemory { contract: self };
        managed
            .allocate(len, &mut source)
            .map_err(|e| BindingError::Managed(e.to_string()))
    }

    /// `free_managed_buffer(addr, len)`.
    pub fn free_managed(&self, addr: u64, len: u64) -> Result<(), BindingError> {
        let mut managed = self.managed.lock();
        let mut source = RegisteredHostMemory { contract: self };
        managed
            .free(addr, len, &mut source)
            .map_err(|e| BindingError::Managed(e.to_string()))
    }

    /// `get_first_buffer_address(segment)`: the first buffer of the segment's descriptor
    /// (lowest address for our own).
    pub fn first_buffer_address(&self, segment: &str) -> Result<u64, BindingError> {
        let buffers = self.engine()?.segment_buffers(segment)?;
        buffers.first().map(|b| b.addr).ok_or_else(|| {
            BindingError::InvalidArgument(format!("segment {segment:?} has no registered buffer"))
        })
    }

    /// `get_notifies()`: drains the notifications received (none before `initialize`).
    pub fn take_notifies(&self) -> Vec<Notify> {
        self.engine
            .read()
            .as_ref()
            .map(|e| e.take_notifies())
            .unwrap_or_default()
    }

    /// `send_probe(peer)`.
    pub fn probe(&self, peer: &str) -> Result<(), BindingError> {
        Ok(self.engine()?.probe(peer)?)
    }

    /// `write_bytes_to_buffer(dest, data, length)`: copies the first `length` bytes of `data`.
    ///
    /// # Safety
    /// `[dest, dest+length)` must be writable host memory (upstream: a plain memcpy).
    pub unsafe fn write_bytes(dest: u64, data: &[u8], length: u64) -> Result<(), BindingError> {
        let n = usize::try_from(length).unwrap_or(usize::MAX);
        let src = data.get(..n).ok_or_else(|| {
            BindingError::InvalidArgument(format!(
                "length {length} exceeds the {} bytes given",
                data.len()
            ))
        })?;
        if dest == 0 && n > 0 {
            return Err(BindingError::InvalidArgument(
                "destination address is 0".into(),
            ));
        }
        // SAFETY: forwarded to the caller.
        unsafe { host_memory::write(dest, src) };
        Ok(())
    }

    /// `read_bytes_from_buffer(source, length)` into `out` (whose length is `length`).
    ///
    /// # Safety
    /// `[source, source+out.len())` must be readable host memory.
    pub unsafe fn read_bytes(source: u64, out: &mut [u8]) -> Result<(), BindingError> {
        if source == 0 && !out.is_empty() {
            return Err(BindingError::InvalidArgument("source address is 0".into()));
        }
        // SAFETY: forwarded to the caller.
        unsafe { host_memory::read(source, out) };
        Ok(())
    }

    /// `get_local_topology(device_name)`: the host's topology JSON (no engine needed),
    /// narrowed by `MC_TE_FILTERS` and `device_name` as `initialize` narrows it. Fails
    /// on a bad variable or an unusable `MC_CUSTOM_TOPO_JSON`.
    pub fn local_topology(device_name: Option<&str>) -> Result<String, BindingError> {
        let config = Config::from_env().map_err(EngineError::from)?;
        let found = topology::local(&config, device_name.unwrap_or(""))
            .map_err(|e| BindingError::InvalidArgument(e.to_string()))?;
        for w in &found.warnings {
            if transfer_engine::log_throttle::first_time(w) {
                tracing::warn!("{w}");
            }
        }
        Ok(topology::to_json(&found.matrix))
    }
}

/// The requests of a batch call: three lists of equal length.
pub fn batch_requests(
    op: OpCode,
    locals: &[u64],
    remotes: &[u64],
    lens: &[u64],
) -> Result<Vec<Request>, BindingError> {
    if locals.len() != remotes.len() || locals.len() != lens.len() {
        return Err(BindingError::InvalidArgument(format!(
            "buffers, peer_buffer_addresses and lengths differ in length ({}, {}, {})",
            locals.len(),
            remotes.len(),
            lens.len()
        )));
    }
    Ok(locals
        .iter()
        .zip(remotes)
        .zip(lens)
        .map(|((&local, &remote), &len)| Request {
            op,
            local,
            remote,
            len,
        })
        .collect())
}

impl Drop for ContractEngine {
    fn drop(&mut self) {
        // Managed memory goes back only once no engine can touch it: batches of this object
        // are drained (connections carrying them cut), and unregister cuts the peers' accesses
        // in flight and returns once they let go. The engine's connection threads are joined
        // when the last handle to it goes (a `get_engine()` holder may keep it longer).
        self.batches.cancel_all();
        let mappings = self.managed.get_mut().take_mappings();
        if let Some(engine) = self.engine.get_mut().take() {
            for &(addr, _) in &mappings {
                let _ = engine.unregister_memory(addr);
            }
            drop(engine);
        }
        for (addr, len) in mappings {
            // SAFETY: our own mapping, unregistered above; Python code that still holds its
            // address after the engine is gone is outside upstream's contract too.
            unsafe { host_memory::unmap(addr, len) };
        }
    }
}

/// Chunks for the managed-buffer allocator: host mappings registered with the engine.
struct RegisteredHostMemory<'a> {
    contract: &'a ContractEngine,
}

impl ChunkSource for RegisteredHostMemory<'_> {
    type Error = BindingError;

    fn acquire(&mut self, len: u64) -> Result<u64, BindingError> {
        // Checked first so that nothing is mapped for an object that cannot register it.
        self.contract.engine()?;
        let addr = host_memory::map(len).map_err(|e| {
            BindingError::Managed(format!("cannot map {len} bytes of host memory: {e}"))
        })?;
        if let Err(e) = self.contract.register_memory(addr, len, MANAGED_LOCATION) {
            // SAFETY: mapped just above and never handed out.
            unsafe { host_memory::unmap(addr, len) };
            return Err(e);
        }
        Ok(addr)
    }

    fn release(&mut self, addr: u64, len: u64) {
        if let Err(e) = self.contract.unregister_memory(addr) {
            tracing::warn!("free_managed_buffer: unregister {addr:#x}: {e}");
        }
        // SAFETY: a dedicated mapping from `acquire`, freed by its owner and unregistered.
        unsafe { host_memory::unmap(addr, len) };
    }
}

/// Upstream's `nic_hint` argument: `""` leaves the choice to the topology.
fn nic(hint: &str) -> Option<String> {
    (!hint.is_empty()).then(|| hint.to_string())
}
