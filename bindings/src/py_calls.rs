//! Argument readers and result types of upstream 0.3.14's newer calls on
//! `TransferEngine`: 8-byte integer arrays through the buffer protocol, scatter tickets
//! (`ScatterTransferTicket`, `ScatterTransferCompletionStatus`) and the CUDA stream
//! ordering of the `*_on_cuda` calls. The methods themselves are in `py_engine`.

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::batch_table::Poll;
use transfer_engine::{OpCode, Request};

use crate::bulk_requests::{decode_u64s, scatter_requests, ScatterRegion};
use crate::errors::{self, BindingError};
use crate::gil::detached;
use crate::py_engine::PyTransferEngine;

/// The integers of a C-contiguous array of 8-byte integers (numpy `int64`/`uint64`, an
/// `array('q')`, ...), of `ndim` dimensions and, for 2-D, `columns` columns.
///
/// The abi3 (Python 3.9) limited API has no `Py_buffer`, so the array is read through a
/// `memoryview`: one contiguous copy of its bytes, no Python object per entry.
pub fn int_array(obj: &Bound<'_, PyAny>, what: &str, columns: Option<usize>) -> PyResult<Vec<u64>> {
    let py = obj.py();
    let view = py
        .import("builtins")?
        .getattr("memoryview")?
        .call1((obj,))
        .map_err(|_| {
            PyTypeError::new_err(format!(
                "{what} must support the buffer protocol (a numpy array of int64/uint64, array('q'), ...); got {}",
                obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
            ))
        })?;
    let format: String = view.getattr("format")?.extract()?;
    let itemsize: usize = view.getattr("itemsize")?.extract()?;
    let code = format.trim_start_matches(['@', '=', '<']);
    if itemsize != 8 || !matches!(code, "q" | "Q" | "l" | "L" | "n" | "N") {
        return Err(PyTypeError::new_err(format!(
            "{what} must hold 8-byte integers (int64 or uint64); its format is {format:?} of {itemsize} bytes"
        )));
    }
    if !view.getattr("c_contiguous")?.extract::<bool>()? {
        return Err(PyValueError::new_err(format!(
            "{what} must be C-contiguous (numpy: np.ascontiguousarray)"
        )));
    }
    let shape: Vec<usize> = view.getattr("shape")?.cast_into::<PyTuple>()?.extract()?;
    let wanted = if columns.is_some() { 2 } else { 1 };
    if shape.len() != wanted || columns.is_some_and(|c| shape[1] != c) {
        return Err(PyValueError::new_err(format!(
            "{what} must be {}; its shape is {shape:?}",
            match columns {
                Some(c) => format!("a 2-D [N, {c}] array"),
                None => "a 1-D array".to_string(),
            }
        )));
    }
    let bytes = view.call_method0("tobytes")?.cast_into::<PyBytes>()?;
    let signed = code.chars().all(|c| c.is_ascii_lowercase());
    decode_u64s(what, bytes.as_bytes(), signed).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// How a scatter operation ended, as upstream's enum has it.
#[pyclass(
    eq,
    eq_int,
    hash,
    frozen,
    name = "ScatterTransferCompletionStatus",
    module = "mooncake.engine"
)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum PyScatterStatus {
    /// Every range moved.
    #[pyo3(name = "COMPLETED")]
    Completed = 0,
    /// A range failed; nothing of the operation is in flight any more.
    #[pyo3(name = "FAILED_DRAINED")]
    FailedDrained = -1,
    /// Still in flight (not drained yet, or the last drain timed out).
    #[pyo3(name = "COMPLETION_UNKNOWN")]
    CompletionUnknown = -2,
}

#[pymethods]
impl PyScatterStatus {
    /// The member's name, as pybind11 enums have it.
    #[getter]
    fn name(&self) -> &'static str {
        match self {
            Self::Completed => "COMPLETED",
            Self::FailedDrained => "FAILED_DRAINED",
            Self::CompletionUnknown => "COMPLETION_UNKNOWN",
        }
    }

    /// The member's integer value.
    #[getter]
    fn value(&self) -> i64 {
        *self as i64
    }

    fn __index__(&self) -> i64 {
        *self as i64
    }
}

/// Keeps a scatter operation's batch until it is drained: `drain(timeout_ms)` waits up to
/// that long and returns the status; once `drained`, the status is final.
#[pyclass(frozen, name = "ScatterTransferTicket", module = "mooncake.engine")]
pub struct PyScatterTicket {
    engine: Py<PyTransferEngine>,
    /// The batch id while in flight; None once drained.
    batch: Mutex<Option<u64>>,
    status: Mutex<PyScatterStatus>,
}

impl PyScatterTicket {
    /// A ticket for batch `id` of `engine`, not drained yet.
    pub fn pending(engine: Py<PyTransferEngine>, id: u64) -> Self {
        Self {
            engine,
            batch: Mutex::new(Some(id)),
            status: Mutex::new(PyScatterStatus::CompletionUnknown),
        }
    }

    /// Waits until the batch finished or, past its deadline, drained (upstream's sync
    /// scatter calls return a drained ticket).
    pub fn drain_fully(&self, py: Python<'_>) -> PyResult<()> {
        let Some(id) = self.batch.lock().take() else {
            return Ok(());
        };
        let contract = &self.engine.get().inner;
        let r = detached(py, |interrupted| contract.wait_batches(&[id], interrupted))?;
        *self.status.lock() = match errors::status("scatter transfer", r) {
            0 => PyScatterStatus::Completed,
            _ => PyScatterStatus::FailedDrained,
        };
        Ok(())
    }
}

/// The eight arguments of a scatter call: per region pair its bases and capacities, and
/// per range its offsets and length.
pub struct ScatterLists<'a> {
    pub local_bases: &'a [u64],
    pub local_capacities: &'a [u64],
    pub remote_bases: &'a [u64],
    pub remote_capacities: &'a [u64],
    pub local_offsets: &'a [Vec<u64>],
    pub remote_offsets: &'a [Vec<u64>],
    pub lengths: &'a [Vec<u64>],
}

impl ScatterLists<'_> {
    /// The requests, every range checked against its region's capacities.
    pub fn requests(&self, op: OpCode) -> Result<Vec<Request>, BindingError> {
        let n = self.local_bases.len();
        let counts = [
            self.local_capacities.len(),
            self.remote_bases.len(),
            self.remote_capacities.len(),
            self.local_offsets.len(),
            self.remote_offsets.len(),
            self.lengths.len(),
        ];
        if counts.iter().any(|&c| c != n) {
            return Err(BindingError::InvalidArgument(format!(
                "the eight lists must have one entry per region; they have {n} and {counts:?}"
            )));
        }
        let regions: Vec<ScatterRegion<'_>> = (0..n)
            .map(|i| ScatterRegion {
                local_base: self.local_bases[i],
                local_capacity: self.local_capacities[i],
                remote_base: self.remote_bases[i],
                remote_capacity: self.remote_capacities[i],
                local_offsets: &self.local_offsets[i],
                remote_offsets: &self.remote_offsets[i],
                lengths: &self.lengths[i],
            })
            .collect();
        scatter_requests(op, &regions)
    }
}

#[pymethods]
impl PyScatterTicket {
    #[getter]
    fn status(&self) -> PyScatterStatus {
        *self.status.lock()
    }

    #[getter]
    fn drained(&self) -> bool {
        *self.status.lock() != PyScatterStatus::CompletionUnknown
    }

    /// Waits up to `timeout_ms` for the operation to finish; its status (still
    /// `COMPLETION_UNKNOWN` if it did not finish in time). A failure's reason is
    /// `TransferEngine.last_error()`.
    #[pyo3(signature = (timeout_ms, /))]
    fn drain(&self, py: Python<'_>, timeout_ms: u64) -> PyResult<PyScatterStatus> {
        let mut slot = self.batch.lock();
        let Some(id) = *slot else {
            return Ok(*self.status.lock());
        };
        let contract = &self.engine.get().inner;
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        let outcome = detached(py, |interrupted| loop {
            match contract.check_batch(id) {
                Ok(Poll::Completed) => return Some(Ok(())),
                Ok(Poll::Failed(e)) | Err(e) => return Some(Err(e)),
                // A timed-out batch reads as failed once its parts have drained.
                Ok(Poll::Pending | Poll::TimedOut) => {}
            }
            if Instant::now() >= deadline || interrupted() {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        })?;
        let status = match outcome {
            None => PyScatterStatus::CompletionUnknown,
            Some(r) => {
                *slot = None;
                match errors::status("ScatterTransferTicket.drain", r) {
                    0 => PyScatterStatus::Completed,
                    _ => PyScatterStatus::FailedDrained,
                }
            }
        };
        *self.status.lock() = status;
        Ok(status)
    }
}

/// Orders a `*_on_cuda` call after the work queued on the caller's stream: waits for the
/// stream through the CUDA runtime loaded at run time. The transfer then runs before the
/// call returns, so work the caller queues on the stream afterwards follows it. (Upstream
/// queues a host function on the stream instead and returns at once; this blocks the
/// calling thread, with the GIL released, until the transfer is done.)
pub fn order_after_stream(py: Python<'_>, call: &str, stream_ptr: u64) -> PyResult<()> {
    use transfer_engine::device::{self, Vendor};
    let rt = device::runtime().map_err(|e| {
        PyRuntimeError::new_err(format!(
            "{call} needs a CUDA runtime to order the transfer on stream {stream_ptr:#x}: {e}"
        ))
    })?;
    if rt.vendor() != Vendor::Cuda {
        return Err(PyRuntimeError::new_err(format!(
            "{call} orders on a CUDA stream, but the loaded runtime is {} ({})",
            rt.vendor(),
            rt.path()
        )));
    }
    // SAFETY: upstream's contract: `stream_ptr` is 0 or a live `cudaStream_t` of this
    // process (torch.cuda.current_stream().cuda_stream).
    detached(py, |_| unsafe { rt.synchronize_stream(stream_ptr) })?.map_err(|e| {
        PyRuntimeError::new_err(format!("{call}: waiting for stream {stream_ptr:#x}: {e}"))
    })
}

/// A `*_on_cuda` call's result: None, or `RuntimeError` with the reason (upstream raises).
pub fn raise_unless_ok(call: &str, code: i32) -> PyResult<()> {
    if code == 0 {
        return Ok(());
    }
    Err(PyRuntimeError::new_err(
        errors::last_error().unwrap_or_else(|| format!("{call} failed")),
    ))
}
