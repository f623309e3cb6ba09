//! `mooncake.store`: `MooncakeDistributedStore` and `ReplicateConfig`, in upstream's
//! names and return conventions (0 / bytes read / upstream's negative codes). Each method
//! converts its arguments, calls [`mooncake_store::client::StoreClient`] with the GIL
//! released, and converts back; failures are logged with their reason and kept for
//! `last_error()`.

use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use pyo3::exceptions::{PyNotImplementedError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList};

use mooncake_store::client::{ClientConfig, Piece, StoreClient, StoreError};
use mooncake_store::master::state::{PutConfig, Replica};
use mooncake_store::Code;
use transfer_engine::TransferEngine;

use crate::py_engine::PyTransferEngine;
use crate::py_types::PyInnerTransferEngine;
use crate::store_config;
use crate::upstream_contract::ContractEngine;

/// `ReplicateConfig()`: how many replicas, and where.
#[pyclass(name = "ReplicateConfig", module = "mooncake.store")]
#[derive(Clone, Default)]
pub struct PyReplicateConfig {
    #[pyo3(get, set)]
    replica_num: usize,
    #[pyo3(get, set)]
    with_soft_pin: bool,
    #[pyo3(get, set)]
    with_hard_pin: bool,
    #[pyo3(get, set)]
    preferred_segment: String,
    #[pyo3(get, set)]
    preferred_segments: Vec<String>,
    #[pyo3(get, set)]
    group_ids: Option<Vec<String>>,
}

#[pymethods]
impl PyReplicateConfig {
    #[new]
    fn new() -> Self {
        Self {
            replica_num: 1,
            ..Self::default()
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "ReplicateConfig(replica_num={}, preferred_segment={:?}, with_soft_pin={})",
            self.replica_num, self.preferred_segment, self.with_soft_pin
        )
    }
}

impl PyReplicateConfig {
    fn to_put(&self) -> PutConfig {
        let preferred = if self.preferred_segment.is_empty() {
            self.preferred_segments.first().cloned().unwrap_or_default()
        } else {
            self.preferred_segment.clone()
        };
        PutConfig {
            replica_num: u32::try_from(self.replica_num.max(1)).unwrap_or(u32::MAX),
            preferred_segment: preferred,
            with_soft_pin: self.with_soft_pin || self.with_hard_pin,
        }
    }
}

fn put_config(config: Option<PyRef<'_, PyReplicateConfig>>) -> PutConfig {
    config.map_or_else(|| PyReplicateConfig::new().to_put(), |c| c.to_put())
}

/// One replica's place (`get_replica_desc`).
#[pyclass(frozen, name = "ReplicaDescriptor", module = "mooncake.store")]
pub struct PyReplicaDescriptor {
    replica: Replica,
}

#[pymethods]
impl PyReplicaDescriptor {
    fn is_memory_replica(&self) -> bool {
        true
    }
    fn is_disk_replica(&self) -> bool {
        false
    }
    #[getter]
    fn segment_name(&self) -> String {
        self.replica.segment.clone()
    }
    #[getter]
    fn buffer_address(&self) -> u64 {
        self.replica.addr
    }
    #[getter]
    fn size(&self) -> u64 {
        self.replica.len
    }
    fn __repr__(&self) -> String {
        format!(
            "ReplicaDescriptor(segment={:?}, address={:#x}, size={})",
            self.replica.segment, self.replica.addr, self.replica.len
        )
    }
}

/// A value read by `get_buffer`: `ptr()` and `size()` as upstream's handle.
#[pyclass(frozen, name = "BufferHandle", module = "mooncake.store")]
pub struct PyBufferHandle {
    bytes: Vec<u8>,
}

#[pymethods]
impl PyBufferHandle {
    fn ptr(&self) -> usize {
        self.bytes.as_ptr() as usize
    }
    fn size(&self) -> usize {
        self.bytes.len()
    }
    fn __len__(&self) -> usize {
        self.bytes.len()
    }
    fn tobytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.bytes)
    }
}

/// A Mooncake Store client.
#[pyclass(frozen, name = "MooncakeDistributedStore", module = "mooncake.store")]
pub struct PyStore {
    client: RwLock<Option<Arc<StoreClient>>>,
    /// The engine this object started itself (none when `engine=` was given).
    own_engine: Mutex<Option<ContractEngine>>,
    last_error: Mutex<Option<String>>,
}

fn log_failure(call: &str, e: &StoreError) {
    if e.code == Code::ObjectNotFound {
        tracing::debug!("{call}: {e}");
    } else {
        tracing::warn!("{call}: {e}");
    }
}

/// Which engine `engine=` names: what `TransferEngine.get_engine()` returns, or the
/// `TransferEngine` itself.
fn engine_arg(obj: &Bound<'_, PyAny>) -> PyResult<Arc<TransferEngine>> {
    if let Ok(inner) = obj.cast::<PyInnerTransferEngine>() {
        return Ok(Arc::clone(&inner.get().inner));
    }
    if let Ok(te) = obj.cast::<PyTransferEngine>() {
        return te.get().shared_engine().ok_or_else(|| {
            PyValueError::new_err(
                "engine=: this TransferEngine is not initialized; call initialize() first",
            )
        });
    }
    Err(PyTypeError::new_err(format!(
        "engine= takes a mooncake.engine.TransferEngine or what its get_engine() returns, not {}",
        obj.get_type()
            .name()
            .map_or_else(|_| "?".to_string(), |n| n.to_string())
    )))
}

fn bytes_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(b.to_vec());
    }
    // memoryview, numpy arrays and anything else with the buffer protocol.
    let b = obj
        .py()
        .get_type::<PyBytes>()
        .call1((obj,))
        .map_err(|_| PyTypeError::new_err("the value must be bytes, bytearray or a buffer"))?;
    Ok(b.cast::<PyBytes>()?.as_bytes().to_vec())
}

impl PyStore {
    fn client(&self) -> Result<Arc<StoreClient>, StoreError> {
        self.client.read().clone().ok_or_else(|| {
            StoreError::new(
                Code::UnavailableInCurrentStatus,
                "the store is not set up, or was closed: call setup() first",
            )
        })
    }

    fn note(&self, call: &str, e: &StoreError) -> i32 {
        log_failure(call, e);
        *self.last_error.lock() = Some(format!("{call}: {e}"));
        e.code.value()
    }

    fn code(&self, call: &str, r: Result<(), StoreError>) -> i32 {
        match r {
            Ok(()) => 0,
            Err(e) => self.note(call, &e),
        }
    }

    fn codes(
        &self,
        call: &str,
        r: Result<Vec<Result<(), StoreError>>, StoreError>,
        n: usize,
    ) -> Vec<i32> {
        match r {
            Ok(v) => v.into_iter().map(|r| self.code(call, r)).collect(),
            Err(e) => vec![self.note(call, &e); n],
        }
    }

    fn sizes(
        &self,
        call: &str,
        r: Result<Vec<Result<u64, StoreError>>, StoreError>,
        n: usize,
    ) -> Vec<i64> {
        match r {
            Ok(v) => v
                .into_iter()
                .map(|r| match r {
                    Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
                    Err(e) => i64::from(self.note(call, &e)),
                })
                .collect(),
            Err(e) => vec![i64::from(self.note(call, &e)); n],
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn do_setup(
        &self,
        py: Python<'_>,
        local_hostname: String,
        metadata_server: String,
        global_segment_size: u64,
        local_buffer_size: u64,
        protocol: String,
        device_name: String,
        master_server_addr: String,
        engine: Option<Arc<TransferEngine>>,
    ) -> i32 {
        if self.client.read().is_some() {
            let e = StoreError::new(
                Code::UnavailableInCurrentStatus,
                "setup was already called on this store; close() it first",
            );
            return self.note("setup", &e);
        }
        let cfg = ClientConfig {
            global_segment_size,
            local_buffer_size,
            master_server_addr,
        };
        let result = py.detach(
            || -> Result<(StoreClient, Option<ContractEngine>), StoreError> {
                let (engine, own) = match engine {
                    Some(e) => (e, None),
                    None => {
                        let own = ContractEngine::new();
                        let name = own_segment_name(&local_hostname, &metadata_server);
                        own.initialize(&name, &metadata_server, &protocol, &device_name)
                            .map_err(|e| {
                                StoreError::new(
                                    Code::InternalError,
                                    format!("cannot start the transfer engine: {e}"),
                                )
                            })?;
                        let e = own
                            .engine()
                            .map_err(|e| StoreError::new(Code::InternalError, e.to_string()))?;
                        (e, Some(own))
                    }
                };
                Ok((StoreClient::setup(engine, &cfg)?, own))
            },
        );
        match result {
            Ok((client, own)) => {
                *self.client.write() = Some(Arc::new(client));
                *self.own_engine.lock() = own;
                0
            }
            Err(e) => self.note("setup", &e),
        }
    }
}

/// The segment name of a store's own engine. As upstream's store, a name without a port
/// gets one with a metadata server (in P2P mode the engine adds its handshake port), so
/// that several stores on one host never share a name.
fn own_segment_name(local_hostname: &str, metadata_server: &str) -> String {
    let has_port = local_hostname
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok());
    if has_port || metadata_server == transfer_engine::P2P_HANDSHAKE {
        return local_hostname.to_string();
    }
    let port = std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .map_or(0, |a| a.port());
    format!("{local_hostname}:{port}")
}

fn pieces_of(ptrs: &[u64], sizes: &[u64]) -> Result<Vec<Piece>, StoreError> {
    if ptrs.len() != sizes.len() {
        return Err(StoreError::new(
            Code::InvalidParams,
            format!("{} buffer pointers but {} sizes", ptrs.len(), sizes.len()),
        ));
    }
    if ptrs.contains(&0) {
        return Err(StoreError::new(
            Code::InvalidParams,
            "a buffer pointer is 0",
        ));
    }
    Ok(ptrs
        .iter()
        .zip(sizes)
        .map(|(&p, &s)| Piece::new(p, s))
        .collect())
}

fn multi(all_ptrs: &[Vec<u64>], all_sizes: &[Vec<u64>]) -> Result<Vec<Vec<Piece>>, StoreError> {
    if all_ptrs.len() != all_sizes.len() {
        return Err(StoreError::new(
            Code::InvalidParams,
            format!(
                "{} pointer lists but {} size lists",
                all_ptrs.len(),
                all_sizes.len()
            ),
        ));
    }
    all_ptrs
        .iter()
        .zip(all_sizes)
        .map(|(p, s)| pieces_of(p, s))
        .collect()
}

#[pymethods]
impl PyStore {
    #[new]
    fn new() -> Self {
        Self {
            client: RwLock::new(None),
            own_engine: Mutex::new(None),
            last_error: Mutex::new(None),
        }
    }

    /// `setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
    /// protocol, rdma_devices, master_server_addr, engine=None)`, or `setup(config: dict)`.
    #[pyo3(signature = (local_hostname, metadata_server=None, global_segment_size=None, local_buffer_size=None, protocol=None, rdma_devices=None, master_server_addr=None, engine=None, **kwargs))]
    #[allow(clippy::too_many_arguments)]
    fn setup(
        &self,
        py: Python<'_>,
        local_hostname: &Bound<'_, PyAny>,
        metadata_server: Option<String>,
        global_segment_size: Option<&Bound<'_, PyAny>>,
        local_buffer_size: Option<&Bound<'_, PyAny>>,
        protocol: Option<String>,
        rdma_devices: Option<String>,
        master_server_addr: Option<String>,
        engine: Option<&Bound<'_, PyAny>>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<i32> {
        let args = store_config::SetupArgs::collect(
            local_hostname,
            metadata_server,
            global_segment_size,
            local_buffer_size,
            protocol,
            rdma_devices,
            master_server_addr,
            kwargs,
        )?;
        let engine = engine
            .filter(|e| !e.is_none())
            .map(engine_arg)
            .transpose()?;
        Ok(self.do_setup(
            py,
            args.local_hostname,
            args.metadata_server,
            args.global_segment_size,
            args.local_buffer_size,
            args.protocol,
            args.device_name,
            args.master_server_addr,
            engine,
        ))
    }

    /// Upstream's client through a separate `mooncake_client` process: not served here.
    #[pyo3(signature = (*_args, **_kwargs))]
    fn setup_dummy(
        &self,
        _args: &Bound<'_, pyo3::types::PyTuple>,
        _kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<i32> {
        Err(PyNotImplementedError::new_err(
            "setup_dummy needs upstream's standalone mooncake_client process, which this mooncake does not provide; \
             use setup(local_hostname, metadata_server, global_segment_size, local_buffer_size, protocol, device_name, master_server_addr)",
        ))
    }

    /// The last failure's reason, or None.
    fn last_error(&self) -> Option<String> {
        self.last_error.lock().clone()
    }

    fn get_hostname(&self) -> String {
        self.client().and_then(|c| c.hostname()).unwrap_or_default()
    }

    fn register_buffer(&self, py: Python<'_>, buffer_ptr: u64, size: u64) -> i32 {
        let r = self
            .client()
            .and_then(|c| py.detach(|| c.register_buffer(buffer_ptr, size)));
        self.code("register_buffer", r)
    }

    fn unregister_buffer(&self, py: Python<'_>, buffer_ptr: u64) -> i32 {
        let r = self
            .client()
            .and_then(|c| py.detach(|| c.unregister_buffer(buffer_ptr)));
        self.code("unregister_buffer", r)
    }

    #[pyo3(signature = (key, buffer_ptr, size, config=None))]
    fn put_from(
        &self,
        py: Python<'_>,
        key: String,
        buffer_ptr: u64,
        size: u64,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> i32 {
        let cfg = put_config(config);
        let r = self.client().and_then(|c| {
            let pieces = pieces_of(&[buffer_ptr], &[size])?;
            // SAFETY: upstream's contract: the caller's buffer is valid for the call.
            let mut v = py.detach(|| unsafe { c.batch_put_from(&[key], &[pieces], &cfg) })?;
            v.pop().unwrap_or(Ok(()))
        });
        self.code("put_from", r)
    }

    fn get_into(&self, py: Python<'_>, key: String, buffer_ptr: u64, size: u64) -> i64 {
        let r = self.client().and_then(|c| {
            let pieces = pieces_of(&[buffer_ptr], &[size])?;
            // SAFETY: upstream's contract: the caller's buffer is valid for the call.
            py.detach(|| unsafe { c.batch_get_into(&[key], &[pieces]) })
        });
        self.sizes("get_into", r, 1).pop().unwrap_or(-1)
    }

    #[pyo3(signature = (keys, buffer_ptrs, sizes, config=None))]
    fn batch_put_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<u64>,
        sizes: Vec<u64>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> Vec<i32> {
        let n = keys.len();
        let cfg = put_config(config);
        let r = self.client().and_then(|c| {
            let all_p: Vec<Vec<u64>> = buffer_ptrs.into_iter().map(|p| vec![p]).collect();
            let all_s: Vec<Vec<u64>> = sizes.into_iter().map(|s| vec![s]).collect();
            let pieces = multi(&all_p, &all_s)?;
            // SAFETY: upstream's contract: the caller's buffers are valid for the call.
            py.detach(|| unsafe { c.batch_put_from(&keys, &pieces, &cfg) })
        });
        self.codes("batch_put_from", r, n)
    }

    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<u64>,
        sizes: Vec<u64>,
    ) -> Vec<i64> {
        let n = keys.len();
        let r = self.client().and_then(|c| {
            let all_p: Vec<Vec<u64>> = buffer_ptrs.into_iter().map(|p| vec![p]).collect();
            let all_s: Vec<Vec<u64>> = sizes.into_iter().map(|s| vec![s]).collect();
            let pieces = multi(&all_p, &all_s)?;
            // SAFETY: upstream's contract: the caller's buffers are valid for the call.
            py.detach(|| unsafe { c.batch_get_into(&keys, &pieces) })
        });
        self.sizes("batch_get_into", r, n)
    }

    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, config=None))]
    fn batch_put_from_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<u64>>,
        all_sizes: Vec<Vec<u64>>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> Vec<i32> {
        let n = keys.len();
        let cfg = put_config(config);
        let r = self.client().and_then(|c| {
            let pieces = multi(&all_buffer_ptrs, &all_sizes)?;
            // SAFETY: upstream's contract: the caller's buffers are valid for the call.
            py.detach(|| unsafe { c.batch_put_from(&keys, &pieces, &cfg) })
        });
        self.codes("batch_put_from_multi_buffers", r, n)
    }

    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, prefer_alloc_in_same_node=false))]
    fn batch_get_into_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<u64>>,
        all_sizes: Vec<Vec<u64>>,
        prefer_alloc_in_same_node: bool,
    ) -> Vec<i64> {
        let _ = prefer_alloc_in_same_node;
        let n = keys.len();
        let r = self.client().and_then(|c| {
            let pieces = multi(&all_buffer_ptrs, &all_sizes)?;
            // SAFETY: upstream's contract: the caller's buffers are valid for the call.
            py.detach(|| unsafe { c.batch_get_into(&keys, &pieces) })
        });
        self.sizes("batch_get_into_multi_buffers", r, n)
    }

    #[pyo3(signature = (key, value, config=None))]
    fn put(
        &self,
        py: Python<'_>,
        key: String,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        let value = bytes_arg(value)?;
        let cfg = put_config(config);
        let r = self
            .client()
            .and_then(|c| py.detach(|| c.put_parts(&key, &[&value], &cfg)));
        Ok(self.code("put", r))
    }

    #[pyo3(signature = (key, *parts, config=None))]
    fn put_parts(
        &self,
        py: Python<'_>,
        key: String,
        parts: &Bound<'_, pyo3::types::PyTuple>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        let parts: Vec<Vec<u8>> = parts
            .iter()
            .map(|p| bytes_arg(&p))
            .collect::<PyResult<_>>()?;
        let cfg = put_config(config);
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let r = self
            .client()
            .and_then(|c| py.detach(|| c.put_parts(&key, &refs, &cfg)));
        Ok(self.code("put_parts", r))
    }

    #[pyo3(signature = (keys, values, config=None))]
    fn put_batch(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: Vec<Bound<'_, PyAny>>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        if keys.len() != values.len() {
            let e = StoreError::new(
                Code::InvalidParams,
                format!("{} keys but {} values", keys.len(), values.len()),
            );
            return Ok(self.note("put_batch", &e));
        }
        let values: Vec<Vec<u8>> = values.iter().map(bytes_arg).collect::<PyResult<_>>()?;
        let cfg = put_config(config);
        let r = self.client().and_then(|c| {
            let pieces: Vec<Vec<Piece>> = values
                .iter()
                .map(|v| vec![Piece::new(v.as_ptr() as u64, v.len() as u64)])
                .collect();
            // SAFETY: the pieces are the `values` vectors, alive until this returns.
            py.detach(|| unsafe { c.batch_put_from(&keys, &pieces, &cfg) })
        });
        let codes = self.codes("put_batch", r, keys.len());
        Ok(codes.into_iter().find(|&c| c != 0).unwrap_or(0))
    }

    /// The value, or empty bytes when the key is missing (as upstream).
    fn get<'py>(&self, py: Python<'py>, key: String) -> Bound<'py, PyBytes> {
        let got = self.get_values(py, "get", vec![key]).pop().flatten();
        PyBytes::new(py, got.as_deref().unwrap_or_default())
    }

    fn get_batch<'py>(&self, py: Python<'py>, keys: Vec<String>) -> Vec<Bound<'py, PyBytes>> {
        self.get_values(py, "get_batch", keys)
            .into_iter()
            .map(|v| PyBytes::new(py, v.as_deref().unwrap_or_default()))
            .collect()
    }

    /// The value in a `BufferHandle`, or None when the key is missing.
    fn get_buffer(&self, py: Python<'_>, key: String) -> Option<PyBufferHandle> {
        self.get_values(py, "get_buffer", vec![key])
            .pop()
            .flatten()
            .map(|bytes| PyBufferHandle { bytes })
    }

    fn batch_get_buffer(&self, py: Python<'_>, keys: Vec<String>) -> Vec<Option<PyBufferHandle>> {
        self.get_values(py, "batch_get_buffer", keys)
            .into_iter()
            .map(|v| v.map(|bytes| PyBufferHandle { bytes }))
            .collect()
    }

    /// 1, 0, or a negative code.
    fn is_exist(&self, py: Python<'_>, key: String) -> i32 {
        self.batch_is_exist(py, vec![key]).pop().unwrap_or(-1)
    }

    fn batch_is_exist(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i32> {
        let n = keys.len();
        match self
            .client()
            .and_then(|c| py.detach(|| c.batch_exist(&keys)))
        {
            Ok(v) => v
                .into_iter()
                .map(|r| match r {
                    Ok(b) => i32::from(b),
                    Err(e) => self.note("batch_is_exist", &e),
                })
                .collect(),
            Err(e) => vec![self.note("batch_is_exist", &e); n],
        }
    }

    /// The object's size, or a negative code.
    fn get_size(&self, py: Python<'_>, key: String) -> i64 {
        match self.replicas(py, "get_size", vec![key]).pop() {
            Some(Ok(r)) => r
                .first()
                .map_or(-1, |r| i64::try_from(r.len).unwrap_or(i64::MAX)),
            Some(Err(code)) => i64::from(code),
            None => -1,
        }
    }

    fn get_replica_desc(&self, py: Python<'_>, key: String) -> Vec<PyReplicaDescriptor> {
        match self.replicas(py, "get_replica_desc", vec![key]).pop() {
            Some(Ok(r)) => r
                .into_iter()
                .map(|replica| PyReplicaDescriptor { replica })
                .collect(),
            _ => Vec::new(),
        }
    }

    fn batch_get_replica_desc<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        let found = self.replicas(py, "batch_get_replica_desc", keys.clone());
        for (key, r) in keys.into_iter().zip(found) {
            let list = PyList::empty(py);
            if let Ok(r) = r {
                for replica in r {
                    list.append(Bound::new(py, PyReplicaDescriptor { replica })?)?;
                }
            }
            out.set_item(key, list)?;
        }
        Ok(out)
    }

    #[pyo3(signature = (key, force=false))]
    fn remove(&self, py: Python<'_>, key: String, force: bool) -> i32 {
        self.batch_remove(py, vec![key], force).pop().unwrap_or(-1)
    }

    #[pyo3(signature = (keys, force=false))]
    fn batch_remove(&self, py: Python<'_>, keys: Vec<String>, force: bool) -> Vec<i32> {
        let n = keys.len();
        let r = self
            .client()
            .and_then(|c| py.detach(|| c.batch_remove(&keys, force)));
        self.codes("batch_remove", r, n)
    }

    /// How many objects were removed, or a negative code.
    #[pyo3(signature = (regex, force=false))]
    fn remove_by_regex(&self, py: Python<'_>, regex: String, force: bool) -> i64 {
        let _ = force;
        match self
            .client()
            .and_then(|c| py.detach(|| c.remove_by_regex(&regex)))
        {
            Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
            Err(e) => i64::from(self.note("remove_by_regex", &e)),
        }
    }

    /// How many objects were removed, or a negative code.
    #[pyo3(signature = (force=false))]
    fn remove_all(&self, py: Python<'_>, force: bool) -> i64 {
        let _ = force;
        match self.client().and_then(|c| py.detach(|| c.remove_all())) {
            Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
            Err(e) => i64::from(self.note("remove_all", &e)),
        }
    }

    /// 0 when the master answers.
    fn health_check(&self, py: Python<'_>) -> i32 {
        let r = self
            .client()
            .and_then(|c| py.detach(|| c.batch_exist(&["__mooncake_health__".to_string()])))
            .map(|_| ());
        self.code("health_check", r)
    }

    /// Unmounts this client's segment and stops it; later calls fail with -1010.
    fn close(&self, py: Python<'_>) -> i32 {
        let Some(client) = self.client.write().take() else {
            return 0;
        };
        let r = py.detach(|| client.close());
        *self.own_engine.lock() = None;
        self.code("close", r)
    }

    fn __repr__(&self) -> String {
        match self.client() {
            Ok(c) => format!(
                "MooncakeDistributedStore(hostname={:?})",
                c.hostname().unwrap_or_default()
            ),
            Err(_) => "MooncakeDistributedStore(not set up)".to_string(),
        }
    }
}

impl PyStore {
    fn get_values(&self, py: Python<'_>, call: &str, keys: Vec<String>) -> Vec<Option<Vec<u8>>> {
        let n = keys.len();
        match self
            .client()
            .and_then(|c| py.detach(|| c.batch_get_bytes(&keys)))
        {
            Ok(v) => v
                .into_iter()
                .map(|r| match r {
                    Ok(b) => Some(b),
                    Err(e) => {
                        self.note(call, &e);
                        None
                    }
                })
                .collect(),
            Err(e) => {
                self.note(call, &e);
                vec![None; n]
            }
        }
    }

    fn replicas(
        &self,
        py: Python<'_>,
        call: &str,
        keys: Vec<String>,
    ) -> Vec<Result<Vec<Replica>, i32>> {
        let n = keys.len();
        match self
            .client()
            .and_then(|c| py.detach(|| c.batch_replicas(&keys)))
        {
            Ok(v) => v
                .into_iter()
                .map(|r| r.map_err(|e| self.note(call, &e)))
                .collect(),
            Err(e) => vec![Err(self.note(call, &e)); n],
        }
    }
}
