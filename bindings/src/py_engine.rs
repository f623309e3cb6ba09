//! `mooncake.engine.TransferEngine`: each method extracts its arguments, calls
//! [`ContractEngine`] (with the GIL released where it can block) and converts the result
//! with upstream's return conventions. No logic of its own.
//!
//! Argument names are upstream's; every method also takes them as keywords. Arguments of
//! the wrong type raise `TypeError` before anything runs.

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyType};
use transfer_engine::{OpCode, Request};

use crate::bulk_requests::{page_requests, FIELD_COLUMNS};
use crate::errors::{self, BindingError};
use crate::gil::detached;
use crate::py_calls::{
    int_array, order_after_stream, raise_unless_ok, PyScatterTicket, ScatterLists,
};
use crate::py_types::{opcode_arg, PyInnerTransferEngine, PyTransferNotify, PyTransferOpcode};
use crate::upstream_contract::{batch_requests, ContractEngine};

/// A transfer engine. Create it, then `initialize(...)`; failures are return codes
/// (0 / -1, batch id 0), and `TransferEngine.last_error()` says why.
#[pyclass(frozen, name = "TransferEngine", module = "mooncake.engine")]
pub struct PyTransferEngine {
    pub(crate) inner: ContractEngine,
}

/// The one request of a single-transfer call.
fn single(op: OpCode, local: u64, remote: u64, len: u64) -> Result<Vec<Request>, BindingError> {
    Ok(vec![Request::new(op, local, remote, len)])
}

impl PyTransferEngine {
    /// The running engine, for `mooncake.store` (`setup(..., engine=te)`).
    pub fn shared_engine(&self) -> Option<std::sync::Arc<transfer_engine::TransferEngine>> {
        self.inner.engine().ok()
    }

    /// Sync transfer of `requests`, with an optional notify; 0 / -1.
    fn sync(
        &self,
        py: Python<'_>,
        call: &str,
        target: &str,
        requests: Result<Vec<Request>, BindingError>,
        notify: Option<PyTransferNotify>,
        nic_hint: &str,
    ) -> PyResult<i32> {
        let notify = notify.as_ref().map(Into::into);
        let result = match requests {
            Ok(reqs) => detached(py, |interrupted| {
                // SAFETY: upstream's contract: the caller passes local buffers it owns for
                // the duration of the call.
                unsafe {
                    self.inner
                        .transfer_sync(target, &reqs, notify.as_ref(), nic_hint, interrupted)
                }
            })?,
            Err(e) => Err(e),
        };
        Ok(errors::status(call, result))
    }

    /// Async submission of `requests`; the batch id, or 0.
    fn submit(
        &self,
        py: Python<'_>,
        call: &str,
        target: &str,
        requests: Result<Vec<Request>, BindingError>,
        nic_hint: &str,
    ) -> PyResult<u64> {
        let result = match requests {
            // SAFETY: upstream's contract: local buffers stay valid until a status call
            // reports the batch finished.
            Ok(reqs) => detached(py, |_| unsafe {
                self.inner.submit(target, &reqs, nic_hint)
            })?,
            Err(e) => Err(e),
        };
        Ok(errors::value_or(call, result, 0))
    }

    /// `requests` in consecutive sync batches of at most `max` (0: one batch); 0 / -1.
    fn sync_chunked(
        &self,
        py: Python<'_>,
        call: &str,
        target: &str,
        requests: Result<Vec<Request>, BindingError>,
        max: usize,
        nic_hint: &str,
    ) -> PyResult<i32> {
        let reqs = match requests {
            Ok(r) if max > 0 && r.len() > max => r,
            other => return self.sync(py, call, target, other, None, nic_hint),
        };
        for chunk in reqs.chunks(max) {
            let code = self.sync(py, call, target, Ok(chunk.to_vec()), None, nic_hint)?;
            if code != 0 {
                return Ok(code);
            }
        }
        Ok(0)
    }

    /// A scatter call: its requests as one batch, drained first if `wait`; the ticket.
    /// Bad ranges raise `ValueError`, a refused submission `RuntimeError` (with the reason).
    fn scatter(
        slf: &Bound<'_, Self>,
        call: &str,
        endpoint: &str,
        op: OpCode,
        lists: &ScatterLists<'_>,
        wait: bool,
    ) -> PyResult<PyScatterTicket> {
        let py = slf.py();
        let reqs = lists
            .requests(op)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("{call}: {e}")))?;
        let id = slf.get().submit(py, call, endpoint, Ok(reqs), "")?;
        if id == 0 {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                errors::last_error().unwrap_or_else(|| format!("{call}: submission failed")),
            ));
        }
        let ticket = PyScatterTicket::pending(slf.clone().unbind(), id);
        if wait {
            ticket.drain_fully(py)?;
        }
        Ok(ticket)
    }
}

// Upstream's signatures: many positional arguments, each also a keyword.
#[allow(clippy::too_many_arguments)]
#[pymethods]
impl PyTransferEngine {
    #[new]
    fn new() -> Self {
        Self {
            inner: ContractEngine::new(),
        }
    }

    /// `TransferEngine.TransferOpcode`, as upstream attaches it.
    #[classattr]
    #[pyo3(name = "TransferOpcode")]
    fn transfer_opcode_class(py: Python<'_>) -> Py<PyType> {
        py.get_type::<PyTransferOpcode>().unbind()
    }

    /// Why the calling thread's last call on any engine failed; None if it succeeded.
    #[staticmethod]
    fn last_error() -> Option<String> {
        errors::last_error()
    }

    /// The typed cause of the calling thread's last failed call, as a dict: `kind`
    /// (`rdma_unavailable`, `peer_unreachable`, `address_rejected`, `timeout`, ...),
    /// `fault` (whose failure: `caller`, `peer` or `host`),
    /// `message` (what `last_error()` returns), `call`, `peer`, `hint` (the `MC_*`
    /// variable or `mooncake-doctor` check that helps), `code`; None if it succeeded.
    #[staticmethod]
    fn last_error_info(py: Python<'_>) -> PyResult<Option<Bound<'_, PyDict>>> {
        let Some(info) = errors::last_error_info() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("kind", info.kind)?;
        d.set_item("fault", info.fault)?;
        d.set_item("message", info.message)?;
        d.set_item("call", info.call)?;
        d.set_item("peer", info.peer)?;
        d.set_item("hint", info.hint)?;
        d.set_item("code", info.code)?;
        Ok(Some(d))
    }

    #[pyo3(signature = (local_hostname, metadata_server, protocol, device_name))]
    fn initialize(
        &self,
        py: Python<'_>,
        local_hostname: String,
        metadata_server: String,
        protocol: String,
        device_name: String,
    ) -> PyResult<i32> {
        let r = detached(py, |_| {
            self.inner
                .initialize(&local_hostname, &metadata_server, &protocol, &device_name)
        })?;
        Ok(errors::status("initialize", r))
    }

    #[pyo3(signature = (local_hostname, metadata_server, protocol, device_name, metadata_type))]
    fn initialize_ext(
        &self,
        py: Python<'_>,
        local_hostname: String,
        metadata_server: String,
        protocol: String,
        device_name: String,
        metadata_type: String,
    ) -> PyResult<i32> {
        let r = detached(py, |_| {
            self.inner.initialize_ext(
                &local_hostname,
                &metadata_server,
                &protocol,
                &device_name,
                &metadata_type,
            )
        })?;
        Ok(errors::status("initialize_ext", r))
    }

    fn get_rpc_port(&self) -> i32 {
        errors::value_or("get_rpc_port", self.inner.rpc_port().map(i32::from), -1)
    }

    #[pyo3(signature = (length))]
    fn allocate_managed_buffer(&self, py: Python<'_>, length: u64) -> PyResult<u64> {
        let r = detached(py, |_| self.inner.allocate_managed(length))?;
        Ok(errors::value_or("allocate_managed_buffer", r, 0))
    }

    #[pyo3(signature = (buffer_addr, length))]
    fn free_managed_buffer(&self, py: Python<'_>, buffer_addr: u64, length: u64) -> PyResult<i32> {
        let r = detached(py, |_| self.inner.free_managed(buffer_addr, length))?;
        Ok(errors::status("free_managed_buffer", r))
    }

    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint = String::new(), nic_hint = String::new()), text_signature = "($self, target_hostname, buffer, peer_buffer_address, length, transport_hint = '', nic_hint = '')")]
    fn transfer_sync_write(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffer: u64,
        peer_buffer_address: u64,
        length: u64,
        transport_hint: String,
        nic_hint: String,
    ) -> PyResult<i32> {
        let _ = transport_hint;
        let reqs = single(OpCode::Write, buffer, peer_buffer_address, length);
        self.sync(
            py,
            "transfer_sync_write",
            &target_hostname,
            reqs,
            None,
            &nic_hint,
        )
    }

    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint = String::new(), nic_hint = String::new()), text_signature = "($self, target_hostname, buffer, peer_buffer_address, length, transport_hint = '', nic_hint = '')")]
    fn transfer_sync_read(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffer: u64,
        peer_buffer_address: u64,
        length: u64,
        transport_hint: String,
        nic_hint: String,
    ) -> PyResult<i32> {
        let _ = transport_hint;
        let reqs = single(OpCode::Read, buffer, peer_buffer_address, length);
        self.sync(
            py,
            "transfer_sync_read",
            &target_hostname,
            reqs,
            None,
            &nic_hint,
        )
    }

    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, opcode, notify = None, transport_hint = String::new(), nic_hint = String::new()), text_signature = "($self, target_hostname, buffer, peer_buffer_address, length, opcode, notify = None, transport_hint = '', nic_hint = '')")]
    #[allow(clippy::too_many_arguments)]
    fn transfer_sync(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffer: u64,
        peer_buffer_address: u64,
        length: u64,
        opcode: &Bound<'_, PyAny>,
        notify: Option<PyTransferNotify>,
        transport_hint: String,
        nic_hint: String,
    ) -> PyResult<i32> {
        let _ = transport_hint;
        let reqs = single(opcode_arg(opcode)?, buffer, peer_buffer_address, length);
        self.sync(
            py,
            "transfer_sync",
            &target_hostname,
            reqs,
            notify,
            &nic_hint,
        )
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = String::new(), nic_hint = String::new()), text_signature = "($self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = '', nic_hint = '')")]
    fn batch_transfer_sync_write(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        transport_hint: String,
        nic_hint: String,
    ) -> PyResult<i32> {
        let _ = transport_hint;
        let reqs = batch_requests(OpCode::Write, &buffers, &peer_buffer_addresses, &lengths);
        self.sync(
            py,
            "batch_transfer_sync_write",
            &target_hostname,
            reqs,
            None,
            &nic_hint,
        )
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = String::new(), nic_hint = String::new()), text_signature = "($self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = '', nic_hint = '')")]
    fn batch_transfer_sync_read(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        transport_hint: String,
        nic_hint: String,
    ) -> PyResult<i32> {
        let _ = transport_hint;
        let reqs = batch_requests(OpCode::Read, &buffers, &peer_buffer_addresses, &lengths);
        self.sync(
            py,
            "batch_transfer_sync_read",
            &target_hostname,
            reqs,
            None,
            &nic_hint,
        )
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, notify = None, transport_hint = String::new(), nic_hint = String::new()), text_signature = "($self, target_hostname, buffers, peer_buffer_addresses, lengths, opcode, notify = None, transport_hint = '', nic_hint = '')")]
    #[allow(clippy::too_many_arguments)]
    fn batch_transfer_sync(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        opcode: &Bound<'_, PyAny>,
        notify: Option<PyTransferNotify>,
        transport_hint: String,
        nic_hint: String,
    ) -> PyResult<i32> {
        let _ = transport_hint;
        let reqs = batch_requests(
            opcode_arg(opcode)?,
            &buffers,
            &peer_buffer_addresses,
            &lengths,
        );
        self.sync(
            py,
            "batch_transfer_sync",
            &target_hostname,
            reqs,
            notify,
            &nic_hint,
        )
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = String::new(), nic_hint = String::new()), text_signature = "($self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = '', nic_hint = '')")]
    fn batch_transfer_async_write(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        transport_hint: String,
        nic_hint: String,
    ) -> PyResult<u64> {
        let _ = transport_hint;
        let reqs = batch_requests(OpCode::Write, &buffers, &peer_buffer_addresses, &lengths);
        self.submit(
            py,
            "batch_transfer_async_write",
            &target_hostname,
            reqs,
            &nic_hint,
        )
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = String::new(), nic_hint = String::new()), text_signature = "($self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = '', nic_hint = '')")]
    fn batch_transfer_async_read(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        transport_hint: String,
        nic_hint: String,
    ) -> PyResult<u64> {
        let _ = transport_hint;
        let reqs = batch_requests(OpCode::Read, &buffers, &peer_buffer_addresses, &lengths);
        self.submit(
            py,
            "batch_transfer_async_read",
            &target_hostname,
            reqs,
            &nic_hint,
        )
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, transport_hint = String::new(), nic_hint = String::new()), text_signature = "($self, target_hostname, buffers, peer_buffer_addresses, lengths, opcode, transport_hint = '', nic_hint = '')")]
    #[allow(clippy::too_many_arguments)]
    fn batch_transfer_async(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        opcode: &Bound<'_, PyAny>,
        transport_hint: String,
        nic_hint: String,
    ) -> PyResult<u64> {
        let _ = transport_hint;
        let reqs = batch_requests(
            opcode_arg(opcode)?,
            &buffers,
            &peer_buffer_addresses,
            &lengths,
        );
        self.submit(
            py,
            "batch_transfer_async",
            &target_hostname,
            reqs,
            &nic_hint,
        )
    }

    #[pyo3(signature = (batch_ids))]
    fn get_batch_transfer_status(&self, py: Python<'_>, batch_ids: Vec<u64>) -> PyResult<i32> {
        let r = detached(py, |interrupted| {
            self.inner.wait_batches(&batch_ids, interrupted)
        })?;
        Ok(errors::status("get_batch_transfer_status", r))
    }

    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint = String::new(), nic_hint = String::new()), text_signature = "($self, target_hostname, buffer, peer_buffer_address, length, transport_hint = '', nic_hint = '')")]
    fn transfer_submit_write(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffer: u64,
        peer_buffer_address: u64,
        length: u64,
        transport_hint: String,
        nic_hint: String,
    ) -> PyResult<u64> {
        let _ = transport_hint;
        let reqs = single(OpCode::Write, buffer, peer_buffer_address, length);
        self.submit(
            py,
            "transfer_submit_write",
            &target_hostname,
            reqs,
            &nic_hint,
        )
    }

    #[pyo3(signature = (batch_id))]
    fn transfer_check_status(&self, batch_id: u64) -> i32 {
        let poll = self.inner.check_batch(batch_id).and_then(|p| match p {
            crate::batch_table::Poll::Failed(e) => Err(e),
            other => Ok(other.code()),
        });
        errors::value_or("transfer_check_status", poll, -1)
    }

    #[pyo3(signature = (dest_address, src_ptr, length))]
    fn write_bytes_to_buffer(
        &self,
        py: Python<'_>,
        dest_address: u64,
        src_ptr: &Bound<'_, PyAny>,
        length: u64,
    ) -> PyResult<i32> {
        let r = if let Ok(b) = src_ptr.cast::<PyBytes>() {
            let data = b.as_bytes();
            // SAFETY: upstream's contract (a plain memcpy into host memory the caller owns).
            detached(py, |_| unsafe {
                ContractEngine::write_bytes(dest_address, data, length)
            })?
        } else if let Ok(b) = src_ptr.cast::<PyByteArray>() {
            let data = b.to_vec();
            // SAFETY: as above.
            unsafe { ContractEngine::write_bytes(dest_address, &data, length) }
        } else {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "src_ptr must be bytes or bytearray, not {}",
                src_ptr.get_type().name()?
            )));
        };
        Ok(errors::status("write_bytes_to_buffer", r))
    }

    #[pyo3(signature = (source_address, length))]
    fn read_bytes_from_buffer<'py>(
        &self,
        py: Python<'py>,
        source_address: u64,
        length: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let n = usize::try_from(length)
            .map_err(|_| pyo3::exceptions::PyOverflowError::new_err("length too large"))?;
        let mut failure = None;
        let bytes = PyBytes::new_with(py, n, |out| {
            // SAFETY: upstream's contract (a plain copy from host memory the caller owns).
            failure = unsafe { ContractEngine::read_bytes(source_address, out) }.err();
            Ok(())
        })?;
        match errors::settle("read_bytes_from_buffer", failure.map_or(Ok(()), Err)) {
            Ok(()) => Ok(bytes),
            Err(e) => Err(pyo3::exceptions::PyValueError::new_err(e.to_string())),
        }
    }

    #[pyo3(signature = (buffer_addr, capacity, location = String::from("*")), text_signature = "($self, buffer_addr, capacity, location = '*')")]
    fn register_memory(
        &self,
        py: Python<'_>,
        buffer_addr: u64,
        capacity: u64,
        location: String,
    ) -> PyResult<i32> {
        let r = detached(py, |_| {
            self.inner.register_memory(buffer_addr, capacity, &location)
        })?;
        Ok(errors::status_code("register_memory", r))
    }

    #[pyo3(signature = (buffer_addr))]
    fn unregister_memory(&self, py: Python<'_>, buffer_addr: u64) -> PyResult<i32> {
        let r = detached(py, |_| self.inner.unregister_memory(buffer_addr))?;
        Ok(errors::status_code("unregister_memory", r))
    }

    #[pyo3(signature = (buffer_addresses, capacities, location = String::from("*")), text_signature = "($self, buffer_addresses, capacities, location = '*')")]
    fn batch_register_memory(
        &self,
        py: Python<'_>,
        buffer_addresses: Vec<u64>,
        capacities: Vec<u64>,
        location: String,
    ) -> PyResult<i32> {
        let r = detached(py, |_| {
            self.inner
                .batch_register_memory(&buffer_addresses, &capacities, &location)
        })?;
        Ok(errors::status_code("batch_register_memory", r))
    }

    #[pyo3(signature = (buffer_addresses))]
    fn batch_unregister_memory(&self, py: Python<'_>, buffer_addresses: Vec<u64>) -> PyResult<i32> {
        let r = detached(py, |_| {
            self.inner.batch_unregister_memory(&buffer_addresses)
        })?;
        Ok(errors::status_code("batch_unregister_memory", r))
    }

    #[pyo3(signature = (device_name = None))]
    fn get_local_topology(&self, py: Python<'_>, device_name: Option<String>) -> PyResult<String> {
        let r = detached(py, |_| {
            ContractEngine::local_topology(device_name.as_deref())
        })?;
        errors::settle("get_local_topology", r)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
    }

    #[pyo3(signature = (segment_name))]
    fn get_first_buffer_address(&self, py: Python<'_>, segment_name: String) -> PyResult<u64> {
        let r = detached(py, |_| self.inner.first_buffer_address(&segment_name))?;
        Ok(errors::value_or("get_first_buffer_address", r, 0))
    }

    fn get_notifies(&self) -> Vec<PyTransferNotify> {
        self.inner
            .take_notifies()
            .into_iter()
            .map(Into::into)
            .collect()
    }

    #[pyo3(signature = (peer_server_name))]
    fn send_probe(&self, py: Python<'_>, peer_server_name: String) -> PyResult<i32> {
        let r = detached(py, |_| self.inner.probe(&peer_server_name))?;
        Ok(errors::status("send_probe", r))
    }

    /// No-op outside EFA builds, as upstream: returns 0.
    #[pyo3(signature = (segment_name))]
    fn warmup_efa_segment(&self, segment_name: String) -> i32 {
        let _ = segment_name;
        0
    }

    /// Transfer metrics as a dict (shape in `engine.pyi`); RuntimeError before `initialize`.
    fn get_metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let engine = self.inner.engine().map_err(|_| {
            pyo3::exceptions::PyRuntimeError::new_err(
                "get_metrics: the engine is not initialized; call initialize() first",
            )
        })?;
        crate::py_metrics::to_dict(py, &engine.metrics())
    }

    /// The engine, for components that share it; None before `initialize`.
    fn get_engine(&self) -> Option<PyInnerTransferEngine> {
        self.inner
            .engine()
            .ok()
            .map(|inner| PyInnerTransferEngine { inner })
    }

    /// The engine's address (opaque; 0 before `initialize`).
    fn get_engine_ptr(&self) -> usize {
        self.inner
            .engine()
            .map_or(0, |e| std::sync::Arc::as_ptr(&e) as usize)
    }

    /// `batch_transfer_sync_write_arrays`: the batch call with 8-byte integer arrays (buffer protocol) for lists.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = String::new(), nic_hint = String::new()), text_signature = "($self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = '', nic_hint = '')")]
    fn batch_transfer_sync_write_arrays(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: &Bound<'_, PyAny>,
        lengths: &Bound<'_, PyAny>,
        transport_hint: String,
        nic_hint: String,
    ) -> PyResult<i32> {
        let _ = transport_hint;
        let (l, r, n) = (
            int_array(buffers, "buffers", None)?,
            int_array(peer_buffer_addresses, "peer_buffer_addresses", None)?,
            int_array(lengths, "lengths", None)?,
        );
        let reqs = batch_requests(OpCode::Write, &l, &r, &n);
        self.sync(
            py,
            "batch_transfer_sync_write_arrays",
            &target_hostname,
            reqs,
            None,
            &nic_hint,
        )
    }

    /// `batch_transfer_async_write_arrays`: the batch call with 8-byte integer arrays (buffer protocol) for lists.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = String::new(), nic_hint = String::new()), text_signature = "($self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = '', nic_hint = '')")]
    fn batch_transfer_async_write_arrays(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: &Bound<'_, PyAny>,
        lengths: &Bound<'_, PyAny>,
        transport_hint: String,
        nic_hint: String,
    ) -> PyResult<u64> {
        let _ = transport_hint;
        let (l, r, n) = (
            int_array(buffers, "buffers", None)?,
            int_array(peer_buffer_addresses, "peer_buffer_addresses", None)?,
            int_array(lengths, "lengths", None)?,
        );
        let reqs = batch_requests(OpCode::Write, &l, &r, &n);
        self.submit(
            py,
            "batch_transfer_async_write_arrays",
            &target_hostname,
            reqs,
            &nic_hint,
        )
    }

    /// `batch_transfer_sync_read_arrays`: the batch call with 8-byte integer arrays (buffer protocol) for lists.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = String::new(), nic_hint = String::new()), text_signature = "($self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = '', nic_hint = '')")]
    fn batch_transfer_sync_read_arrays(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: &Bound<'_, PyAny>,
        lengths: &Bound<'_, PyAny>,
        transport_hint: String,
        nic_hint: String,
    ) -> PyResult<i32> {
        let _ = transport_hint;
        let (l, r, n) = (
            int_array(buffers, "buffers", None)?,
            int_array(peer_buffer_addresses, "peer_buffer_addresses", None)?,
            int_array(lengths, "lengths", None)?,
        );
        let reqs = batch_requests(OpCode::Read, &l, &r, &n);
        self.sync(
            py,
            "batch_transfer_sync_read_arrays",
            &target_hostname,
            reqs,
            None,
            &nic_hint,
        )
    }

    /// `batch_transfer_async_read_arrays`: the batch call with 8-byte integer arrays (buffer protocol) for lists.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = String::new(), nic_hint = String::new()), text_signature = "($self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = '', nic_hint = '')")]
    fn batch_transfer_async_read_arrays(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: &Bound<'_, PyAny>,
        lengths: &Bound<'_, PyAny>,
        transport_hint: String,
        nic_hint: String,
    ) -> PyResult<u64> {
        let _ = transport_hint;
        let (l, r, n) = (
            int_array(buffers, "buffers", None)?,
            int_array(peer_buffer_addresses, "peer_buffer_addresses", None)?,
            int_array(lengths, "lengths", None)?,
        );
        let reqs = batch_requests(OpCode::Read, &l, &r, &n);
        self.submit(
            py,
            "batch_transfer_async_read_arrays",
            &target_hostname,
            reqs,
            &nic_hint,
        )
    }

    /// `batch_transfer_sync_write_pages`: pages times fields (see `bulk_requests::page_requests`), sent in
    /// batches of at most `max_batch_size` requests (0: one batch); 0 / -1.
    #[pyo3(signature = (target_hostname, src_pages, dst_pages, fields, max_batch_size = 0, transport_hint = String::new(), nic_hint = String::new()), text_signature = "($self, target_hostname, src_pages, dst_pages, fields, max_batch_size = 0, transport_hint = '', nic_hint = '')")]
    fn batch_transfer_sync_write_pages(
        &self,
        py: Python<'_>,
        target_hostname: String,
        src_pages: &Bound<'_, PyAny>,
        dst_pages: &Bound<'_, PyAny>,
        fields: &Bound<'_, PyAny>,
        max_batch_size: usize,
        transport_hint: String,
        nic_hint: String,
    ) -> PyResult<i32> {
        let _ = transport_hint;
        let reqs = page_requests(
            OpCode::Write,
            &int_array(src_pages, "src_pages", None)?,
            &int_array(dst_pages, "dst_pages", None)?,
            &int_array(fields, "fields", Some(FIELD_COLUMNS))?,
        );
        self.sync_chunked(
            py,
            "batch_transfer_sync_write_pages",
            &target_hostname,
            reqs,
            max_batch_size,
            &nic_hint,
        )
    }

    /// `batch_transfer_sync_read_pages`: pages times fields (see `bulk_requests::page_requests`), sent in
    /// batches of at most `max_batch_size` requests (0: one batch); 0 / -1.
    #[pyo3(signature = (target_hostname, src_pages, dst_pages, fields, max_batch_size = 0, transport_hint = String::new(), nic_hint = String::new()), text_signature = "($self, target_hostname, src_pages, dst_pages, fields, max_batch_size = 0, transport_hint = '', nic_hint = '')")]
    fn batch_transfer_sync_read_pages(
        &self,
        py: Python<'_>,
        target_hostname: String,
        src_pages: &Bound<'_, PyAny>,
        dst_pages: &Bound<'_, PyAny>,
        fields: &Bound<'_, PyAny>,
        max_batch_size: usize,
        transport_hint: String,
        nic_hint: String,
    ) -> PyResult<i32> {
        let _ = transport_hint;
        let reqs = page_requests(
            OpCode::Read,
            &int_array(src_pages, "src_pages", None)?,
            &int_array(dst_pages, "dst_pages", None)?,
            &int_array(fields, "fields", Some(FIELD_COLUMNS))?,
        );
        self.sync_chunked(
            py,
            "batch_transfer_sync_read_pages",
            &target_hostname,
            reqs,
            max_batch_size,
            &nic_hint,
        )
    }

    /// `submit_scatter_write`: every range of every region pair, submitted; the ticket.
    #[pyo3(signature = (endpoint, local_base_addresses, local_capacities, remote_base_addresses, remote_capacities, local_offsets, remote_offsets, lengths))]
    fn submit_scatter_write(
        slf: &Bound<'_, Self>,
        endpoint: String,
        local_base_addresses: Vec<u64>,
        local_capacities: Vec<u64>,
        remote_base_addresses: Vec<u64>,
        remote_capacities: Vec<u64>,
        local_offsets: Vec<Vec<u64>>,
        remote_offsets: Vec<Vec<u64>>,
        lengths: Vec<Vec<u64>>,
    ) -> PyResult<PyScatterTicket> {
        let regions = ScatterLists {
            local_bases: &local_base_addresses,
            local_capacities: &local_capacities,
            remote_bases: &remote_base_addresses,
            remote_capacities: &remote_capacities,
            local_offsets: &local_offsets,
            remote_offsets: &remote_offsets,
            lengths: &lengths,
        };
        Self::scatter(
            slf,
            "submit_scatter_write",
            &endpoint,
            OpCode::Write,
            &regions,
            false,
        )
    }

    /// `scatter_transfer_sync_write_with_ticket`: every range of every region pair, waited for; the ticket.
    #[pyo3(signature = (endpoint, local_base_addresses, local_capacities, remote_base_addresses, remote_capacities, local_offsets, remote_offsets, lengths))]
    fn scatter_transfer_sync_write_with_ticket(
        slf: &Bound<'_, Self>,
        endpoint: String,
        local_base_addresses: Vec<u64>,
        local_capacities: Vec<u64>,
        remote_base_addresses: Vec<u64>,
        remote_capacities: Vec<u64>,
        local_offsets: Vec<Vec<u64>>,
        remote_offsets: Vec<Vec<u64>>,
        lengths: Vec<Vec<u64>>,
    ) -> PyResult<PyScatterTicket> {
        let regions = ScatterLists {
            local_bases: &local_base_addresses,
            local_capacities: &local_capacities,
            remote_bases: &remote_base_addresses,
            remote_capacities: &remote_capacities,
            local_offsets: &local_offsets,
            remote_offsets: &remote_offsets,
            lengths: &lengths,
        };
        Self::scatter(
            slf,
            "scatter_transfer_sync_write_with_ticket",
            &endpoint,
            OpCode::Write,
            &regions,
            true,
        )
    }

    /// `submit_scatter_read`: every range of every region pair, submitted; the ticket.
    #[pyo3(signature = (endpoint, local_base_addresses, local_capacities, remote_base_addresses, remote_capacities, local_offsets, remote_offsets, lengths))]
    fn submit_scatter_read(
        slf: &Bound<'_, Self>,
        endpoint: String,
        local_base_addresses: Vec<u64>,
        local_capacities: Vec<u64>,
        remote_base_addresses: Vec<u64>,
        remote_capacities: Vec<u64>,
        local_offsets: Vec<Vec<u64>>,
        remote_offsets: Vec<Vec<u64>>,
        lengths: Vec<Vec<u64>>,
    ) -> PyResult<PyScatterTicket> {
        let regions = ScatterLists {
            local_bases: &local_base_addresses,
            local_capacities: &local_capacities,
            remote_bases: &remote_base_addresses,
            remote_capacities: &remote_capacities,
            local_offsets: &local_offsets,
            remote_offsets: &remote_offsets,
            lengths: &lengths,
        };
        Self::scatter(
            slf,
            "submit_scatter_read",
            &endpoint,
            OpCode::Read,
            &regions,
            false,
        )
    }

    /// `scatter_transfer_sync_read_with_ticket`: every range of every region pair, waited for; the ticket.
    #[pyo3(signature = (endpoint, local_base_addresses, local_capacities, remote_base_addresses, remote_capacities, local_offsets, remote_offsets, lengths))]
    fn scatter_transfer_sync_read_with_ticket(
        slf: &Bound<'_, Self>,
        endpoint: String,
        local_base_addresses: Vec<u64>,
        local_capacities: Vec<u64>,
        remote_base_addresses: Vec<u64>,
        remote_capacities: Vec<u64>,
        local_offsets: Vec<Vec<u64>>,
        remote_offsets: Vec<Vec<u64>>,
        lengths: Vec<Vec<u64>>,
    ) -> PyResult<PyScatterTicket> {
        let regions = ScatterLists {
            local_bases: &local_base_addresses,
            local_capacities: &local_capacities,
            remote_bases: &remote_base_addresses,
            remote_capacities: &remote_capacities,
            local_offsets: &local_offsets,
            remote_offsets: &remote_offsets,
            lengths: &lengths,
        };
        Self::scatter(
            slf,
            "scatter_transfer_sync_read_with_ticket",
            &endpoint,
            OpCode::Read,
            &regions,
            true,
        )
    }

    /// `transfer_write_on_cuda`: after the work queued on `stream_ptr` (see
    /// `py_calls::order_after_stream`); None, or `RuntimeError` with the reason.
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, stream_ptr = 0, transport_hint = String::new(), nic_hint = String::new()), text_signature = "($self, target_hostname, buffer, peer_buffer_address, length, stream_ptr = 0, transport_hint = '', nic_hint = '')")]
    fn transfer_write_on_cuda(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffer: u64,
        peer_buffer_address: u64,
        length: u64,
        stream_ptr: u64,
        transport_hint: String,
        nic_hint: String,
    ) -> PyResult<()> {
        let _ = transport_hint;
        let reqs = single(OpCode::Write, buffer, peer_buffer_address, length);
        order_after_stream(py, "transfer_write_on_cuda", stream_ptr)?;
        let code = self.sync(
            py,
            "transfer_write_on_cuda",
            &target_hostname,
            reqs,
            None,
            &nic_hint,
        )?;
        raise_unless_ok("transfer_write_on_cuda", code)
    }

    /// `batch_transfer_write_on_cuda`: after the work queued on `stream_ptr` (see
    /// `py_calls::order_after_stream`); None, or `RuntimeError` with the reason.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, stream_ptr = 0, transport_hint = String::new(), nic_hint = String::new()), text_signature = "($self, target_hostname, buffers, peer_buffer_addresses, lengths, stream_ptr = 0, transport_hint = '', nic_hint = '')")]
    fn batch_transfer_write_on_cuda(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        stream_ptr: u64,
        transport_hint: String,
        nic_hint: String,
    ) -> PyResult<()> {
        let _ = transport_hint;
        let reqs = batch_requests(OpCode::Write, &buffers, &peer_buffer_addresses, &lengths);
        order_after_stream(py, "batch_transfer_write_on_cuda", stream_ptr)?;
        let code = self.sync(
            py,
            "batch_transfer_write_on_cuda",
            &target_hostname,
            reqs,
            None,
            &nic_hint,
        )?;
        raise_unless_ok("batch_transfer_write_on_cuda", code)
    }

    /// `transfer_read_on_cuda`: after the work queued on `stream_ptr` (see
    /// `py_calls::order_after_stream`); None, or `RuntimeError` with the reason.
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, stream_ptr = 0, transport_hint = String::new(), nic_hint = String::new()), text_signature = "($self, target_hostname, buffer, peer_buffer_address, length, stream_ptr = 0, transport_hint = '', nic_hint = '')")]
    fn transfer_read_on_cuda(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffer: u64,
        peer_buffer_address: u64,
        length: u64,
        stream_ptr: u64,
        transport_hint: String,
        nic_hint: String,
    ) -> PyResult<()> {
        let _ = transport_hint;
        let reqs = single(OpCode::Read, buffer, peer_buffer_address, length);
        order_after_stream(py, "transfer_read_on_cuda", stream_ptr)?;
        let code = self.sync(
            py,
            "transfer_read_on_cuda",
            &target_hostname,
            reqs,
            None,
            &nic_hint,
        )?;
        raise_unless_ok("transfer_read_on_cuda", code)
    }

    /// `batch_transfer_read_on_cuda`: after the work queued on `stream_ptr` (see
    /// `py_calls::order_after_stream`); None, or `RuntimeError` with the reason.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, stream_ptr = 0, transport_hint = String::new(), nic_hint = String::new()), text_signature = "($self, target_hostname, buffers, peer_buffer_addresses, lengths, stream_ptr = 0, transport_hint = '', nic_hint = '')")]
    fn batch_transfer_read_on_cuda(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        stream_ptr: u64,
        transport_hint: String,
        nic_hint: String,
    ) -> PyResult<()> {
        let _ = transport_hint;
        let reqs = batch_requests(OpCode::Read, &buffers, &peer_buffer_addresses, &lengths);
        order_after_stream(py, "batch_transfer_read_on_cuda", stream_ptr)?;
        let code = self.sync(
            py,
            "batch_transfer_read_on_cuda",
            &target_hostname,
            reqs,
            None,
            &nic_hint,
        )?;
        raise_unless_ok("batch_transfer_read_on_cuda", code)
    }

    fn __repr__(&self) -> String {
        match self.inner.engine() {
            Ok(e) => format!("TransferEngine(session_id={:?})", e.session_id()),
            Err(_) => "TransferEngine(not initialized)".to_string(),
        }
    }
}
