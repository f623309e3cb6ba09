//! The `mooncake` Python package's native module, `mooncake._native`, re-exported by
//! `mooncake.engine`: a drop-in for upstream's `from mooncake.engine import TransferEngine`.
//!
//! Layout: [`py_engine`] and [`py_types`] are the Python classes and only convert;
//! [`upstream_contract`] holds upstream's semantics in plain Rust, over
//! [`transfer_engine`]; [`managed_buffers`] is the allocator, [`batch_table`] the batch
//! ids, [`errors`] the one bridge from failures to return codes and `last_error()`,
//! [`gil`] the one way calls block. The wheel links no vendor library: device runtimes
//! and RDMA are the engine's to load at run time.
//!
//! The Python parts need the `python` feature (maturin turns it on); without it the crate
//! is plain Rust, so `cargo test --workspace` never links libpython.

pub mod batch_table;
pub mod bulk_requests;
pub mod cli;
pub mod errors;
pub mod host_memory;
pub mod http_metadata_cli;
pub mod managed_buffers;
pub mod metadata_string;
pub mod store_config;
pub mod upstream_contract;

#[cfg(feature = "python")]
mod gil;
#[cfg(feature = "python")]
mod py_calls;
#[cfg(feature = "python")]
pub mod py_engine;
#[cfg(feature = "python")]
mod py_metrics;
#[cfg(feature = "python")]
pub mod py_store;
#[cfg(feature = "python")]
pub mod py_types;

#[cfg(feature = "python")]
use pyo3::prelude::*;

/// The console scripts, called by `mooncake._cli` with `sys.argv`.
#[cfg(feature = "python")]
#[pyfunction]
fn run_bench(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.detach(|| cli::bench_main(&argv))
}

#[cfg(feature = "python")]
#[pyfunction]
fn run_topology_dump(argv: Vec<String>) -> i32 {
    cli::topology_dump_main(&argv)
}

/// `mooncake-doctor`: `facts` is the JSON of what Python knows (mooncake/doctor.py).
#[cfg(feature = "python")]
#[pyfunction]
#[pyo3(signature = (argv, facts=None))]
fn run_doctor(py: Python<'_>, argv: Vec<String>, facts: Option<String>) -> i32 {
    py.detach(|| cli::doctor_main(&argv, facts.as_deref()))
}

/// `mooncake_master`: the store's master, in this process.
#[cfg(feature = "python")]
#[pyfunction]
fn run_master(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.detach(|| mooncake_store::master::run::main(argv.get(1..).unwrap_or_default()))
}

#[cfg(feature = "python")]
#[pyfunction]
fn run_http_metadata_server(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.detach(|| cli::http_metadata_server_main(&argv))
}

/// Native part of `mooncake.engine` (import that instead).
#[cfg(feature = "python")]
#[pymodule(name = "_native")]
mod native {
    use pyo3::prelude::*;

    #[pymodule_export]
    use super::py_calls::{PyScatterStatus, PyScatterTicket};
    #[pymodule_export]
    use super::py_engine::PyTransferEngine;
    #[pymodule_export]
    use super::py_store::{PyBufferHandle, PyReplicaDescriptor, PyReplicateConfig, PyStore};
    #[pymodule_export]
    use super::py_types::{PyInnerTransferEngine, PyTransferNotify, PyTransferOpcode};
    #[pymodule_export]
    use super::{run_bench, run_doctor, run_http_metadata_server, run_master, run_topology_dump};

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        // The log first: a full configuration read here would spend its once-per-process
        // warnings (the legacy HCA variable's) before anything could print them.
        let level =
            transfer_engine::config::LogLevel::from_env_or(transfer_engine::config::LogLevel::Info);
        transfer_engine::logging::init(level);
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        m.add("Read", super::py_types::PyTransferOpcode::Read)?;
        m.add("Write", super::py_types::PyTransferOpcode::Write)?;
        // Device runtimes (CUDA, MUSA) are loaded at run time, so both builds are "on", and
        // so is "nvlink_intra" (same-host GPU IPC, served where a GPU runtime has devices;
        // consumers gate that protocol on this flag); the others are transports this
        // engine does not have.
        for (name, on) in [
            ("SUPPORT_CUDA", true),
            ("SUPPORT_MUSA", true),
            ("SUPPORT_EFA", false),
            ("SUPPORT_HIP", false),
            ("SUPPORT_MNNVL", false),
            ("SUPPORT_INTRA_NVLINK", true),
            // TCP, RDMA and GPU IPC serve side by side in one engine (upstream: a build
            // with ENABLE_MULTI_PROTOCOL).
            ("SUPPORT_MULTI_PROTOCOL", true),
        ] {
            m.add(name, on)?;
        }
        Ok(())
    }
}
