//! Where registered memory lives: `cpu:N`, `cuda:N`, `musa:N`, resolved from `*`.

use super::error::EngineError;

pub(super) fn resolve_location(addr: u64, location: &str) -> Result<String, EngineError> {
    use crate::device::{self, Vendor};
    if let Some((vendor, dev)) = Vendor::parse_location(location) {
        let fail = |why: String| {
            EngineError::Device(format!(
                "cannot register {location} memory at {addr:#x}: {why}"
            ))
        };
        let rt = device::runtime().map_err(|e| fail(e.to_string()))?;
        if rt.vendor() != vendor {
            return Err(fail(format!(
                "the loaded GPU runtime is {} ({})",
                rt.vendor(),
                rt.path()
            )));
        }
        return match rt.device_of(addr) {
            Some(d) if d == dev => Ok(location.to_string()),
            Some(d) => Err(fail(format!("the pointer is on device {d}"))),
            None => Err(fail(format!(
                "{} reports host or unknown memory at this address",
                rt.path()
            ))),
        };
    }
    if location == "*" || location.is_empty() {
        if let Some((vendor, d)) = device::device_of(addr) {
            return Ok(format!("{}:{d}", vendor.prefix()));
        }
        return Ok(format!("cpu:{}", numa_node_of(addr).unwrap_or(0)));
    }
    Ok(location.to_string())
}

/// The NUMA node of the page holding `addr` (move_pages in query mode).
fn numa_node_of(addr: u64) -> Option<u32> {
    crate::sys::numa_node_of(addr)
}
