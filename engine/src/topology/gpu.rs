//! GPUs of the loaded runtime, with the PCI address the runtime reports.

/// One GPU as topology sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// Its location name (`cuda:0`, `musa:3`).
    pub location: String,
    /// PCI address (`0000:18:00.0`, lower-case); `None` when the runtime cannot say.
    pub pci_bus_id: Option<String>,
}

/// The GPUs of the process-wide runtime (none when no runtime is loaded).
pub fn discover() -> Vec<Gpu> {
    match crate::device::runtime() {
        Ok(rt) => of_runtime(&rt),
        Err(_) => Vec::new(),
    }
}

/// The GPUs `rt` reports (the doctor passes a runtime it loaded itself).
pub fn of_runtime(rt: &crate::device::Runtime) -> Vec<Gpu> {
    (0..rt.device_count())
        .map(|i| Gpu {
            location: format!("{}:{i}", rt.vendor().prefix()),
            pci_bus_id: rt.pci_bus_id(i),
        })
        .collect()
}
