//! Opening libibverbs and resolving its exported control-path verbs.
//!
//! The library is `MC_IBVERBS_PATH` when that is set (and then nothing
//! else, so a wrong override is an error, not a silent switch to the
//! system library), else `libibverbs.so.1`, then `libibverbs.so`.
//!
//! Symbols are looked up with `dlvsym` at the version rdma-core gives them
//! (`IBVERBS_1.1` for the core verbs). rdma-core still exports the
//! `IBVERBS_1.0` compat versions of those names, which take the pre-2006
//! struct layouts; plain `dlsym` returns the default (newest) version on
//! glibc, but pinning the version says which ABI `ffi.rs` describes and
//! keeps it so if a later release adds one. A library without version
//! nodes (a stand-in built without a version script) is then searched with
//! plain `dlsym`.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::path::Path;

use libloading::os::unix::Library;

use super::ffi::*;

/// The library candidates, in the order they are tried.
pub fn candidates(env: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    match env("MC_IBVERBS_PATH").filter(|p| !p.is_empty()) {
        Some(p) => vec![p],
        None => vec!["libibverbs.so.1".into(), "libibverbs.so".into()],
    }
}

/// Opens the first candidate that loads; otherwise every candidate with why it failed.
pub(super) fn open_first(
    candidates: &[String],
) -> Result<(Library, String), Vec<(String, String)>> {
    let mut tried = Vec::new();
    for c in candidates {
        if c.contains('/') && !Path::new(c).exists() {
            tried.push((c.clone(), "no such file".into()));
            continue;
        }
        // SAFETY: loading libibverbs runs its initialisers (provider
        // discovery is deferred to ibv_get_device_list); RTLD_LOCAL keeps
        // its symbols from interposing on another copy in the process.
        match unsafe { Library::open(Some(c), libc::RTLD_NOW | libc::RTLD_LOCAL) } {
            Ok(lib) => return Ok((lib, c.clone())),
            Err(e) => tried.push((c.clone(), e.to_string())),
        }
    }
    Err(tried)
}

/// The exported verbs the engine calls.
pub(super) struct Api {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    pub free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    pub get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    pub get_device_guid: unsafe extern "C" fn(*mut ibv_device) -> u64,
    pub open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub query_device: unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
    /// The exported `ibv_query_port@IBVERBS_1.1`: the header's
    /// `ibv_query_port` is a macro over an inline that prefers the
    /// `verbs_context` slot and falls back to this symbol, which fills the
    /// legacy prefix of `ibv_port_attr` (every field the engine reads).
    pub query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    /// `IBVERBS_1.8`; needed for optional access flags (relaxed ordering).
    pub reg_mr_iova2:
        Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_uint) -> *mut ibv_mr>,
    /// `IBVERBS_1.12` (rdma-core v34+).
    pub reg_dmabuf_mr:
        Option<unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr>,
    pub dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    pub create_cq: unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut c_void,
        c_int,
    ) -> *mut ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    pub modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub wc_status_str: Option<unsafe extern "C" fn(c_uint) -> *const c_char>,
}

/// Looks up `name` at `version`, then unversioned.
fn lookup(handle: *mut c_void, name: &str, version: &str) -> *mut c_void {
    let (Ok(n), Ok(v)) = (CString::new(name), CString::new(version)) else {
        return std::ptr::null_mut();
    };
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `handle` is a live dlopen handle; both strings are NUL-terminated.
        let p = unsafe { libc::dlvsym(handle, n.as_ptr(), v.as_ptr()) };
        if !p.is_null() {
            return p;
        }
    }
    let _ = &v;
    // SAFETY: as above.
    unsafe { libc::dlsym(handle, n.as_ptr()) }
}

/// A symbol address as the function-pointer type `T`.
///
/// # Safety
/// `T` must be an `extern "C"` function pointer type matching the function at `p`.
unsafe fn f<T: Copy>(p: *mut c_void) -> T {
    const { assert!(std::mem::size_of::<T>() == std::mem::size_of::<*mut c_void>()) };
    // SAFETY: same size (checked above); the type is the caller's promise.
    unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) }
}

/// Resolves every verb; the error names the first required symbol missing.
pub(super) fn resolve(lib: Library) -> (Library, Result<Api, String>) {
    let handle = lib.into_raw();
    let req = |name: &str, version: &str| {
        let p = lookup(handle, name, version);
        if p.is_null() {
            Err(format!("{name}@{version}"))
        } else {
            Ok(p)
        }
    };
    let opt = |name: &str, version: &str| {
        let p = lookup(handle, name, version);
        (!p.is_null()).then_some(p)
    };
    // SAFETY: each pointer is the address of the exported function of that
    // name and version, whose C signature (verbs.h, v44) the field's type
    // spells out; a function pointer and a data pointer have the same size.
    let api = (|| unsafe {
        Ok::<_, String>(Api {
            get_device_list: f(req("ibv_get_device_list", "IBVERBS_1.1")?),
            free_device_list: f(req("ibv_free_device_list", "IBVERBS_1.1")?),
            get_device_name: f(req("ibv_get_device_name", "IBVERBS_1.1")?),
            get_device_guid: f(req("ibv_get_device_guid", "IBVERBS_1.1")?),
            open_device: f(req("ibv_open_device", "IBVERBS_1.1")?),
            close_device: f(req("ibv_close_device", "IBVERBS_1.1")?),
            query_device: f(req("ibv_query_device", "IBVERBS_1.1")?),
            query_port: f(req("ibv_query_port", "IBVERBS_1.1")?),
            query_gid: f(req("ibv_query_gid", "IBVERBS_1.1")?),
            alloc_pd: f(req("ibv_alloc_pd", "IBVERBS_1.1")?),
            dealloc_pd: f(req("ibv_dealloc_pd", "IBVERBS_1.1")?),
            reg_mr: f(req("ibv_reg_mr", "IBVERBS_1.1")?),
            reg_mr_iova2: opt("ibv_reg_mr_iova2", "IBVERBS_1.8").map(|p| f(p)),
            reg_dmabuf_mr: opt("ibv_reg_dmabuf_mr", "IBVERBS_1.12").map(|p| f(p)),
            dereg_mr: f(req("ibv_dereg_mr", "IBVERBS_1.1")?),
            create_cq: f(req("ibv_create_cq", "IBVERBS_1.1")?),
            destroy_cq: f(req("ibv_destroy_cq", "IBVERBS_1.1")?),
            create_qp: f(req("ibv_create_qp", "IBVERBS_1.1")?),
            destroy_qp: f(req("ibv_destroy_qp", "IBVERBS_1.1")?),
            modify_qp: f(req("ibv_modify_qp", "IBVERBS_1.1")?),
            wc_status_str: opt("ibv_wc_status_str", "IBVERBS_1.1").map(|p| f(p)),
        })
    })();
    // SAFETY: `handle` came from `into_raw` above and is owned again here.
    (unsafe { Library::from_raw(handle) }, api)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_override_is_the_only_candidate() {
        let env = |k: &str| (k == "MC_IBVERBS_PATH").then(|| "/opt/soft/libibverbs.so.1".into());
        assert_eq!(candidates(&env), vec!["/opt/soft/libibverbs.so.1"]);
        let none = |_: &str| None;
        assert_eq!(candidates(&none), vec!["libibverbs.so.1", "libibverbs.so"]);
    }

    #[test]
    fn a_missing_file_is_named_with_the_reason() {
        let tried = open_first(&[
            "/nonexistent/libibverbs.so.1".into(),
            "libnot-verbs-xyz.so".into(),
        ])
        .err()
        .unwrap_or_default();
        assert_eq!(tried.len(), 2);
        assert_eq!(
            tried[0],
            ("/nonexistent/libibverbs.so.1".into(), "no such file".into())
        );
        assert!(tried[1].1.contains("libnot-verbs-xyz.so"), "{:?}", tried[1]);
    }
}
