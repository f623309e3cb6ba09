//! `cudaMemcpyBatchAsync`: many pointer-to-pointer copies enqueued by one runtime call.
//!
//! Scattered blocks cost one runtime call each with `MemcpyAsync` (about 5 us per 1 MiB
//! peer copy on two H200s, beyond the link time); a batch hands the driver all of a
//! group's copies at once. The call is optional: resolved at load beside the rest of
//! the runtime, and missing (MUSA, CUDA before 12.8) it leaves one `MemcpyAsync` per
//! copy, with the reason given by [`BatchCopy::describe`].
//!
//! The signature depends on the runtime's major version (both libraries export the
//! same unversioned name): CUDA 12.8/12.9 (`libcudart.so.12`) take a `size_t *failIdx`
//! before the stream, CUDA 13 does not. `cudaRuntimeGetVersion` tells which.

use std::ffi::{c_int, c_uint, c_void};

use libloading::Library;

use super::{Status, Stream, Vendor};

/// `cudaMemcpyAttributes` (CUDA 12.8+ `driver_types.h`): source access order, source
/// and destination location hints (`cudaMemLocation`: type, id), flags.
#[repr(C)]
pub(crate) struct MemcpyAttributes {
    src_access_order: c_int,
    src_loc_hint: [c_int; 2],
    dst_loc_hint: [c_int; 2],
    flags: c_uint,
}

/// `cudaMemcpySrcAccessOrderStream`: the source is read in stream order, as with
/// `MemcpyAsync` (the location hints are ignored for device memory; 0 leaves them unset).
const SRC_ACCESS_ORDER_STREAM: c_int = 1;
/// The first runtime with the call (`CUDART_VERSION` 12080).
const FIRST_VERSION: c_int = 12080;
/// From here on the call has no `failIdx`.
const NO_FAIL_INDEX_FROM: c_int = 13000;

type V12 = unsafe extern "C" fn(
    *const *mut c_void,
    *const *const c_void,
    *const usize,
    usize,
    *mut MemcpyAttributes,
    *mut usize,
    usize,
    *mut usize,
    Stream,
) -> Status;
type V13 = unsafe extern "C" fn(
    *const *mut c_void,
    *const *const c_void,
    *const usize,
    usize,
    *mut MemcpyAttributes,
    *mut usize,
    usize,
    Stream,
) -> Status;

/// The batch call of a loaded runtime, in the signature of its version.
#[derive(Clone, Copy)]
pub(crate) enum BatchCopy {
    /// CUDA 12.8 and 12.9: with `failIdx`.
    WithFailIndex(V12),
    /// CUDA 13 and later.
    Plain(V13),
}

impl BatchCopy {
    /// The call of `lib` (a `vendor` runtime), or why there is none.
    pub(crate) fn resolve(lib: &Library, vendor: Vendor) -> Result<Self, String> {
        if vendor != Vendor::Cuda {
            return Err(format!(
                "{}MemcpyBatchAsync is not used: its signature is not known here",
                vendor.prefix()
            ));
        }
        let version: unsafe extern "C" fn(*mut c_int) -> Status =
            super::vmm::sym(lib, "cudaRuntimeGetVersion")?;
        let mut v: c_int = 0;
        // SAFETY: valid out-pointer; the call only reports the library's version.
        if unsafe { version(&mut v) } != 0 {
            return Err("cudaRuntimeGetVersion failed".into());
        }
        if v < FIRST_VERSION {
            return Err(format!(
                "runtime {}.{} predates cudaMemcpyBatchAsync (12.8)",
                v / 1000,
                v % 1000 / 10
            ));
        }
        Ok(if v >= NO_FAIL_INDEX_FROM {
            Self::Plain(super::vmm::sym(lib, "cudaMemcpyBatchAsync")?)
        } else {
            Self::WithFailIndex(super::vmm::sym(lib, "cudaMemcpyBatchAsync")?)
        })
    }

    /// For logs: which call and signature.
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            Self::WithFailIndex(_) => "cudaMemcpyBatchAsync (CUDA 12.8 signature, with failIdx)",
            Self::Plain(_) => "cudaMemcpyBatchAsync (CUDA 13 signature)",
        }
    }

    /// Enqueues `dsts[i] <- srcs[i]` for `sizes[i]` bytes on `stream`, in stream order.
    ///
    /// # Safety
    /// The three slices have one length; every range is valid for its size until the
    /// stream is synchronised. Overlapping copies of one batch land in no given order.
    pub(crate) unsafe fn call(
        &self,
        dsts: &[*mut c_void],
        srcs: &[*const c_void],
        sizes: &[usize],
        stream: Stream,
    ) -> Status {
        let mut attrs = MemcpyAttributes {
            src_access_order: SRC_ACCESS_ORDER_STREAM,
            src_loc_hint: [0; 2],
            dst_loc_hint: [0; 2],
            flags: 0,
        };
        // One set of attributes for every copy: it applies from copy 0 on.
        let mut first = 0usize;
        let count = dsts.len().min(srcs.len()).min(sizes.len());
        match self {
            Self::WithFailIndex(f) => {
                let mut fail = usize::MAX;
                // SAFETY: arrays of `count` entries each; the attributes and indices live
                // through the call; the ranges are the caller's promise.
                unsafe {
                    f(
                        dsts.as_ptr(),
                        srcs.as_ptr(),
                        sizes.as_ptr(),
                        count,
                        &mut attrs,
                        &mut first,
                        1,
                        &mut fail,
                        stream,
                    )
                }
            }
            // SAFETY: as above, without the failure index.
            Self::Plain(f) => unsafe {
                f(
                    dsts.as_ptr(),
                    srcs.as_ptr(),
                    sizes.as_ptr(),
                    count,
                    &mut attrs,
                    &mut first,
                    1,
                    stream,
                )
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_have_the_runtime_layout() {
        // 4 (order) + 8 (cudaMemLocation) + 8 + 4 (flags), 4-byte aligned.
        assert_eq!(std::mem::size_of::<MemcpyAttributes>(), 24);
        assert_eq!(std::mem::align_of::<MemcpyAttributes>(), 4);
    }
}
