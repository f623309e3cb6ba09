//! Where registered memory lives: `cpu:N`, `cuda:N`, `musa:N`, resolved from `*`.

use super::error::{DeviceMismatch, EngineError};

pub(super) fn resolve_location(addr: u64, location: &str) -> Result<String, EngineError> {
    use crate::device::{self, Vendor};
    if let Some((vendor, dev)) = Vendor::parse_location(location) {
        let fail = |cause: DeviceMismatch| EngineError::Device {
            location: location.to_string(),
            addr,
            cause,
        };
        let rt = device::runtime().map_err(|e| fail(e.into()))?;
        if rt.vendor() != vendor {
            return Err(fail(DeviceMismatch::OtherVendor {
                loaded: rt.vendor(),
                path: rt.path().to_string(),
            }));
        }
        return match rt.device_of(addr) {
            Some(d) if d == dev => Ok(location.to_string()),
            Some(device) => Err(fail(DeviceMismatch::OtherDevice { device })),
            None => Err(fail(DeviceMismatch::NotDeviceMemory {
                path: rt.path().to_string(),
            })),
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
