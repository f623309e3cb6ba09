//! `get_metrics()`'s dict, from the engine's [`MetricsSnapshot`].

use pyo3::prelude::*;
use pyo3::types::PyDict;
use transfer_engine::metrics::{CounterSnapshot, LatencySnapshot, MetricsSnapshot};

fn counters<'py>(py: Python<'py>, c: &CounterSnapshot) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("bytes_read", c.bytes_read)?;
    d.set_item("bytes_written", c.bytes_written)?;
    d.set_item("requests", c.requests)?;
    let failures = PyDict::new(py);
    for (kind, n) in c.failures_by_kind() {
        failures.set_item(kind, n)?;
    }
    d.set_item("failures", failures)?;
    Ok(d)
}

fn latency<'py>(py: Python<'py>, l: &LatencySnapshot) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("count", l.count)?;
    d.set_item("sum_seconds", l.sum_seconds)?;
    Ok(d)
}

/// `{"transports": {protocol: {...}}, "peers": {segment: {...}}, "peer_cap": int}`.
pub fn to_dict<'py>(py: Python<'py>, m: &MetricsSnapshot) -> PyResult<Bound<'py, PyDict>> {
    let transports = PyDict::new(py);
    for t in &m.transports {
        let d = counters(py, &t.counters)?;
        d.set_item("connects", t.connections.connects)?;
        d.set_item("reconnects", t.connections.reconnects)?;
        d.set_item("retries", t.connections.retries)?;
        d.set_item("served_bytes_read", t.connections.served_bytes_read)?;
        d.set_item("served_bytes_written", t.connections.served_bytes_written)?;
        d.set_item("request_latency", latency(py, &t.request_latency)?)?;
        d.set_item("batch_latency", latency(py, &t.batch_latency)?)?;
        transports.set_item(t.protocol, d)?;
    }
    let peers = PyDict::new(py);
    for (name, c) in &m.peers {
        peers.set_item(name, counters(py, c)?)?;
    }
    let out = PyDict::new(py);
    out.set_item("transports", transports)?;
    out.set_item("peers", peers)?;
    out.set_item("peer_cap", m.peer_cap)?;
    Ok(out)
}
