//! The small Python types of `mooncake.engine`: `TransferOpcode`, `TransferNotify` and
//! `InnerTransferEngine`.

use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use transfer_engine::{Notify, OpCode, TransferEngine};

/// Direction of a transfer: `Read` (remote to local) = 0, `Write` (local to remote) = 1.
#[pyclass(
    eq,
    eq_int,
    hash,
    frozen,
    name = "TransferOpcode",
    module = "mooncake.engine"
)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum PyTransferOpcode {
    /// Remote to local.
    Read = 0,
    /// Local to remote.
    Write = 1,
}

#[pymethods]
impl PyTransferOpcode {
    /// The member's name, as pybind11 enums have it.
    #[getter]
    fn name(&self) -> &'static str {
        match self {
            Self::Read => "Read",
            Self::Write => "Write",
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

impl From<PyTransferOpcode> for OpCode {
    fn from(op: PyTransferOpcode) -> Self {
        match op {
            PyTransferOpcode::Read => OpCode::Read,
            PyTransferOpcode::Write => OpCode::Write,
        }
    }
}

/// An opcode argument: a `TransferOpcode`, or the integers 0 and 1.
pub fn opcode_arg(obj: &Bound<'_, PyAny>) -> PyResult<OpCode> {
    if let Ok(op) = obj.cast::<PyTransferOpcode>() {
        return Ok((*op.get()).into());
    }
    if obj.is_instance_of::<pyo3::types::PyBool>() || !obj.is_instance_of::<pyo3::types::PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "opcode must be a TransferOpcode (or 0 / 1), not {}",
            obj.get_type().name()?
        )));
    }
    match obj.extract::<i64>()? {
        0 => Ok(OpCode::Read),
        1 => Ok(OpCode::Write),
        n => Err(PyValueError::new_err(format!(
            "opcode {n} is not a TransferOpcode: Read = 0, Write = 1"
        ))),
    }
}

/// A notification: sent with `transfer_sync(..., notify=...)`, received by `get_notifies()`.
#[pyclass(
    get_all,
    set_all,
    name = "TransferNotify",
    module = "mooncake.engine",
    from_py_object
)]
#[derive(Clone, Debug, Default)]
pub struct PyTransferNotify {
    /// Sender-chosen name.
    pub name: String,
    /// Message text.
    pub msg: String,
}

#[pymethods]
impl PyTransferNotify {
    #[new]
    #[pyo3(signature = (name = String::new(), msg = String::new()), text_signature = "(name='', msg='')")]
    fn new(name: String, msg: String) -> Self {
        Self { name, msg }
    }

    fn __repr__(&self) -> String {
        format!("TransferNotify(name={:?}, msg={:?})", self.name, self.msg)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Self>()
            .map(|o| {
                let o = o.borrow();
                o.name == self.name && o.msg == self.msg
            })
            .unwrap_or(false)
    }
}

impl From<&PyTransferNotify> for Notify {
    fn from(n: &PyTransferNotify) -> Self {
        Notify {
            name: n.name.clone(),
            notify_msg: n.msg.clone(),
        }
    }
}

impl From<Notify> for PyTransferNotify {
    fn from(n: Notify) -> Self {
        Self {
            name: n.name,
            msg: n.notify_msg,
        }
    }
}

/// The engine behind a `TransferEngine` (`get_engine()`), for components that share it.
#[pyclass(frozen, name = "InnerTransferEngine", module = "mooncake.engine")]
pub struct PyInnerTransferEngine {
    pub inner: Arc<TransferEngine>,
}

#[pymethods]
impl PyInnerTransferEngine {
    /// The session id peers use: `host:rpc_port`.
    #[getter]
    fn session_id(&self) -> String {
        self.inner.session_id().to_string()
    }

    fn __repr__(&self) -> String {
        format!(
            "InnerTransferEngine(session_id={:?})",
            self.inner.session_id()
        )
    }
}
