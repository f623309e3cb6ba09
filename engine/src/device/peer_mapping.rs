//! Another process's device allocation mapped into this one: opened from its runtime IPC
//! handle or imported from its virtual-memory descriptors, with the base and size the
//! driver reports, and closed when the last holder lets go.
//!
//! The mapping is the proof a copy to or from a peer needs: a [`PeerRange`] can only be
//! cut inside one, and it keeps the mapping open; so copies in flight keep what they
//! touch mapped, and a close waits for them. Only this module opens and closes mappings,
//! so no other code can unmap memory a copy still uses.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::ipc::{IpcHandle, IpcRuntime};
use super::peer_copies::CopyError;

/// A peer allocation mapped here; unmapped when the last holder drops it.
pub(crate) struct PeerMapping {
    base: u64,
    size: u64,
    closer: Closer,
}

/// How the mapping is given back, with what that needs.
enum Closer {
    /// A legacy handle opened on `device`: `IpcCloseMemHandle`.
    Handle { ipc: Arc<IpcRuntime>, device: u32 },
    /// Allocations of the virtual-memory API mapped back to back on `device`: the range
    /// (`span` bytes) and the pieces mapped in it, unmapped and freed.
    Vmm {
        ipc: Arc<IpcRuntime>,
        device: u32,
        span: usize,
        pieces: Vec<(u64, usize)>,
    },
    /// Memory nothing has to give back (the tests' stand-in for a peer's).
    #[cfg(test)]
    Nothing,
}

impl PeerMapping {
    /// Base of the mapping in this process.
    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    /// Its size, as the driver reports it: every range cut from it lies inside.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// The `len` bytes at `addr` (an address here), if they lie inside the mapping: the
    /// remote end of a copy, keeping the mapping open while it lives.
    pub(crate) fn range(self: &Arc<Self>, addr: u64, len: u64) -> Result<PeerRange, CopyError> {
        let inside = addr >= self.base
            && addr
                .checked_add(len)
                .zip(self.base.checked_add(self.size))
                .is_some_and(|(end, limit)| end <= limit);
        let len_usize = usize::try_from(len).ok().filter(|_| inside);
        match len_usize {
            Some(len) => Ok(PeerRange {
                mapping: self.clone(),
                addr,
                len,
            }),
            None => Err(CopyError::OutsideMapping {
                addr,
                len,
                base: self.base,
                size: self.size,
            }),
        }
    }

    /// A mapping of `[base, base+size)` that closes nothing: the tests' peer memory.
    #[cfg(test)]
    pub(crate) fn for_tests(base: u64, size: u64) -> Arc<Self> {
        Arc::new(Self {
            base,
            size,
            closer: Closer::Nothing,
        })
    }
}

impl Drop for PeerMapping {
    fn drop(&mut self) {
        let base = self.base;
        let (ipc, closed) = match &self.closer {
            Closer::Handle { ipc, device } => (ipc, ipc.on_device(*device, || ipc.close(base))),
            Closer::Vmm {
                ipc,
                device,
                span,
                pieces,
            } => {
                let closed = match ipc.vmm() {
                    Ok(vmm) => ipc.on_device(*device, || {
                        vmm.unmap(base, *span, pieces);
                        Ok(())
                    }),
                    // Imported through these calls, so they were there.
                    Err(_) => Ok(()),
                };
                (ipc, closed)
            }
            #[cfg(test)]
            Closer::Nothing => return,
        };
        if let Err(e) = closed {
            tracing::warn!("closing the IPC mapping at {base:#x}: {e}");
        }
        ipc.peer_closes.fetch_add(1, Ordering::Relaxed);
    }
}

/// `len` bytes of a peer's allocation, mapped here at `addr`; the mapping stays open
/// while the range lives.
pub(crate) struct PeerRange {
    mapping: Arc<PeerMapping>,
    addr: u64,
    len: usize,
}

impl PeerRange {
    /// Address here of the first byte.
    pub(crate) fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Gives up the range, keeping its mapping open.
    pub(crate) fn into_mapping(self) -> Arc<PeerMapping> {
        self.mapping
    }
}

impl IpcRuntime {
    /// Maps another process's allocation, named by `handle`, on `device`, and asks the
    /// driver its size (a mapping whose size is unknown bounds nothing, and is closed).
    pub(crate) fn open_peer(
        self: &Arc<Self>,
        handle: IpcHandle,
        device: u32,
    ) -> Result<PeerMapping, String> {
        let base = self
            .on_device(device, || self.open(handle))
            .map_err(|e| e.to_string())?;
        self.peer_opens.fetch_add(1, Ordering::Relaxed);
        // Size 0 until known: dropped on the way out, it closes the handle.
        let mut mapping = PeerMapping {
            base,
            size: 0,
            closer: Closer::Handle {
                ipc: self.clone(),
                device,
            },
        };
        mapping.size = match self.on_device(device, || Ok(self.allocation_range(base))) {
            Ok(Ok((b, size))) if b == base => size,
            Ok(Ok((b, _))) => {
                return Err(format!(
                    "the driver places the opened handle at {b:#x}, not at its base {base:#x}"
                ))
            }
            Ok(Err(e)) => return Err(format!("the size of the opened allocation is unknown: {e}")),
            Err(e) => return Err(e.to_string()),
        };
        Ok(mapping)
    }

    /// Maps the allocations `chunks` (descriptor, offset, size), which cover `[0, span)`
    /// back to back as the peer has them, into one new range readable and writable by
    /// `device`. The descriptors may be closed afterwards.
    pub(crate) fn import_peer(
        self: &Arc<Self>,
        chunks: &[(OwnedFd, u64, u64)],
        span: u64,
        device: u32,
    ) -> Result<PeerMapping, String> {
        let vmm = self.vmm()?;
        let mapped = self
            .on_device(device, || Ok(vmm.import(chunks, span, device)))
            .map_err(|e| e.to_string())??;
        let (base, span_bytes, pieces) = mapped.into_parts();
        self.peer_opens.fetch_add(1, Ordering::Relaxed);
        Ok(PeerMapping {
            base,
            size: span,
            closer: Closer::Vmm {
                ipc: self.clone(),
                device,
                span: span_bytes,
                pieces,
            },
        })
    }

    /// (peer mappings opened, closed) since this runtime was loaded.
    pub(crate) fn peer_counts(&self) -> (u64, u64) {
        (
            self.peer_opens.load(Ordering::Relaxed),
            self.peer_closes.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_cut_only_inside_its_mapping() {
        let m = PeerMapping::for_tests(0x1000, 0x100);
        let r = m.range(0x1080, 0x80).unwrap();
        assert_eq!((r.addr(), r.len()), (0x1080, 0x80));
        assert_eq!(Arc::strong_count(&m), 2, "the range keeps the mapping open");
        drop(r);
        assert_eq!(Arc::strong_count(&m), 1);
        for (addr, len) in [
            (0x1080, 0x81),
            (0xfff, 1),
            (0x1100, 1),
            (u64::MAX, 2),
            (0x1000, u64::MAX),
        ] {
            let e = m.range(addr, len).err().unwrap();
            assert!(
                matches!(e, CopyError::OutsideMapping { .. }),
                "{addr:#x}+{len}: {e}"
            );
        }
        assert_eq!(Arc::strong_count(&m), 1, "a refused range holds nothing");
        assert!(
            m.range(0x1100, 0).is_ok(),
            "an empty range at the end is inside"
        );
    }
}
