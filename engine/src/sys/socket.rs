//! Socket calls that `std` and `socket2` do not offer: queued bytes, the receive low
//! mark, non-blocking and peeking receives, `poll`, the peer's credentials, and
//! descriptors passed with `SCM_RIGHTS`.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Bytes received on socket `fd` and not yet read (`FIONREAD`).
pub fn bytes_queued(fd: BorrowedFd<'_>) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the valid pointer.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut n) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(n).unwrap_or(0))
}

/// One `recv(2)` into `buf` with `flags`: the bytes received (0: the peer's end).
pub fn recv(fd: BorrowedFd<'_>, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: `buf` is writable for its length, borrowed mutably for the call.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Sets `SO_RCVLOWAT` on `fd`.
pub fn set_rcvlowat(fd: BorrowedFd<'_>, bytes: libc::c_int) -> io::Result<()> {
    // SAFETY: a c_int option value through a valid pointer and its size.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Polls `fd` for `POLLIN` for at most `ms` milliseconds: whether it is ready (readable
/// or hung up). An interrupted poll is an `Interrupted` error.
pub fn poll_readable(fd: BorrowedFd<'_>, ms: i32) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, count 1.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    match rc {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(false),
        _ => Ok(true),
    }
}

/// The uid of the process at the other end of the unix socket `fd` (`SO_PEERCRED`).
pub fn peer_uid(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for the size passed.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// Room for `n` descriptors in a control message, in `u64`s (aligned for `cmsghdr`).
fn control_words(n: usize) -> usize {
    // SAFETY: pure arithmetic macro.
    let bytes = unsafe { libc::CMSG_SPACE((n * std::mem::size_of::<libc::c_int>()) as u32) };
    (bytes as usize).div_ceil(8)
}

/// A message of one data byte (`iov`) and the control buffer `control`; both must
/// outlive its use.
fn message(iov: &mut libc::iovec, control: &mut [u64]) -> libc::msghdr {
    // SAFETY: an all-zero msghdr is valid; the fields set below point at the buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(control) as _;
    msg
}

/// Sends one data byte carrying `fds` (`SCM_RIGHTS`) on the unix socket `sock`.
pub fn send_fds(sock: BorrowedFd<'_>, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut control = vec![0u64; control_words(fds.len())];
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let msg = message(&mut iov, &mut control);
    // SAFETY: `msg` has a control buffer with room for one header and `fds.len()` ints
    // (`control_words`); the header and its data are written inside it.
    unsafe {
        let hdr = libc::CMSG_FIRSTHDR(&msg);
        if hdr.is_null() {
            return Err(io::Error::other("no room for the control message"));
        }
        (*hdr).cmsg_level = libc::SOL_SOCKET;
        (*hdr).cmsg_type = libc::SCM_RIGHTS;
        (*hdr).cmsg_len =
            libc::CMSG_LEN((fds.len() * std::mem::size_of::<libc::c_int>()) as u32) as _;
        let data = libc::CMSG_DATA(hdr).cast::<libc::c_int>();
        for (i, fd) in fds.iter().enumerate() {
            data.add(i).write_unaligned(fd.as_raw_fd());
        }
    }
    // SAFETY: `msg` is fully initialised and its buffers outlive the call.
    let rc = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    match rc {
        1 => Ok(()),
        r if r < 0 => Err(io::Error::last_os_error()),
        _ => Err(io::Error::other("short send")),
    }
}

/// Receives one message on the unix socket `sock`, appending its descriptors (room for
/// `max`) to `out`; returns the data bytes read (0: the sender closed).
pub fn recv_fds(sock: BorrowedFd<'_>, max: usize, out: &mut Vec<OwnedFd>) -> io::Result<usize> {
    let mut control = vec![0u64; control_words(max)];
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut msg = message(&mut iov, &mut control);
    // SAFETY: `msg` points at live buffers of the sizes given.
    let rc = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // Every descriptor received is owned first (and so closed on any error below).
    // SAFETY: the kernel filled `msg`'s control buffer; the macros walk it within
    // `msg_controllen`, and each SCM_RIGHTS payload holds `c_int`s it installed for us.
    unsafe {
        let mut hdr = libc::CMSG_FIRSTHDR(&msg);
        while !hdr.is_null() {
            if (*hdr).cmsg_level == libc::SOL_SOCKET && (*hdr).cmsg_type == libc::SCM_RIGHTS {
                let payload = ((*hdr).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                let data = libc::CMSG_DATA(hdr).cast::<libc::c_int>();
                for i in 0..payload / std::mem::size_of::<libc::c_int>() {
                    let fd = data.add(i).read_unaligned();
                    if fd >= 0 {
                        out.push(OwnedFd::from_raw_fd(fd));
                    }
                }
            }
            hdr = libc::CMSG_NXTHDR(&msg, hdr);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other(
            "more descriptors than announced (control message truncated)",
        ));
    }
    Ok(rc as usize)
}
