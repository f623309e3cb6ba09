//! The operating system's C interface (libc), behind safe functions.
//!
//! Every libc call the engine makes outside the memory, device and verbs modules is
//! here, so that the rest of the crate holds no `unsafe` (checked by
//! `tests/layering.rs`). The functions take and return safe types: descriptors as
//! [`BorrowedFd`](std::os::fd::BorrowedFd)/[`OwnedFd`](std::os::fd::OwnedFd), failures
//! as [`std::io::Error`], and leave what a failure means to their callers.

pub mod socket;

use std::ffi::CStr;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// The real user id of this process.
pub fn getuid() -> u32 {
    // SAFETY: no arguments; cannot fail.
    unsafe { libc::getuid() }
}

/// Whether no process `pid` exists (`kill(pid, 0)` fails with `ESRCH`). Pids of 0 and
/// below name process groups, not a process: false.
pub fn no_such_process(pid: libc::pid_t) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists; nothing is delivered.
    let rc = unsafe { libc::kill(pid, 0) };
    rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// This process's soft `RLIMIT_MEMLOCK`; `None` when unlimited or unknown.
pub fn memlock_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out-pointer for getrlimit.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    match rc {
        0 if lim.rlim_cur != libc::RLIM_INFINITY => Some(lim.rlim_cur),
        _ => None,
    }
}

/// The NUMA node of the page holding `addr` (move_pages in query mode); `None` when the
/// page is not mapped or the kernel does not say.
pub fn numa_node_of(addr: u64) -> Option<u32> {
    let page = (addr & !4095) as *mut libc::c_void;
    let mut pages = [page];
    let mut status = [-1 as libc::c_int];
    // SAFETY: query mode (nodes = NULL) only reads where the page lives, writing one
    // status into `status`; any address is allowed (an unmapped one is an error status).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0,
            1usize,
            pages.as_mut_ptr(),
            std::ptr::null::<libc::c_int>(),
            status.as_mut_ptr(),
            0,
        )
    };
    (rc == 0 && status[0] >= 0).then_some(status[0] as u32)
}

/// Seconds since the epoch broken down in local time (`localtime_r`).
pub fn local_time(secs: i64) -> Option<libc::tm> {
    let secs = secs as libc::time_t;
    // SAFETY: `tm` is plain data, for which all zeroes is a valid value.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live locals; localtime_r returns null on failure.
    let ok = unsafe { !libc::localtime_r(&secs, &mut tm).is_null() };
    ok.then_some(tm)
}

/// A new anonymous memory file (`memfd_create`).
pub fn memfd_create(name: &CStr, flags: libc::c_uint) -> io::Result<OwnedFd> {
    // SAFETY: a valid C string; the new descriptor is owned at once.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just created, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The CPUs the calling thread may run on (`sched_getaffinity`).
pub fn cpu_affinity() -> io::Result<Vec<usize>> {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: pid 0 is the calling thread; `set` is writable and `size` bytes long.
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE, inside the set.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Lets the calling thread run on `cpus` only (`sched_setaffinity`); CPUs past
/// `CPU_SETSIZE` are left out.
pub fn set_cpu_affinity(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `c` is below CPU_SETSIZE, inside the set.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: pid 0 is the calling thread; `set` is readable and `size` bytes long.
    if unsafe { libc::sched_setaffinity(0, size, &set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One address of one of this host's network interfaces (`getifaddrs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceAddr {
    /// The interface's name (`eth0`).
    pub interface: String,
    /// The address.
    pub ip: std::net::IpAddr,
    /// `IFF_UP`.
    pub up: bool,
    /// `IFF_LOOPBACK`.
    pub loopback: bool,
}

/// The IPv4 and IPv6 addresses of this host's interfaces, in the kernel's order.
pub fn interface_addresses() -> io::Result<Vec<InterfaceAddr>> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; the list is freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut node = head;
    while !node.is_null() {
        // SAFETY: `node` is a node of the list getifaddrs returned, not freed yet.
        let ifa = unsafe { &*node };
        node = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a non-null `ifa_addr` points to a sockaddr at least as large as its
        // family's structure, which its `sa_family` names.
        let ip = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
                }
                _ => continue,
            }
        };
        // SAFETY: a non-null `ifa_name` is a NUL-terminated string owned by the list.
        let interface = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        let flag = |f: libc::c_int| ifa.ifa_flags & f as libc::c_uint != 0;
        out.push(InterfaceAddr {
            interface,
            ip,
            up: flag(libc::IFF_UP),
            loopback: flag(libc::IFF_LOOPBACK),
        });
    }
    // SAFETY: `head` came from getifaddrs and no reference into the list outlives this.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}
