//! Socket helpers shared by the handshake and data listeners.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use socket2::{Domain, Protocol, Socket, Type};

use crate::sys::socket as sys;

/// Binds a listener on a random free port in `[min, max]` (500 attempts, then
/// a linear scan), as upstream picks its RPC port.
pub fn bind_in_range(ip: IpAddr, min: u16, max: u16, backlog: i32) -> io::Result<TcpListener> {
    let span = u32::from(max - min) + 1;
    let mut seed = random_seed();
    let mut last = None;
    for attempt in 0..500 + span {
        let port = if attempt < 500 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            min + (seed % u64::from(span)) as u16
        } else {
            min + (attempt - 500) as u16
        };
        match bind(SocketAddr::new(ip, port), backlog) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("empty port range")))
}

fn bind(addr: SocketAddr, backlog: i32) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(backlog)?;
    let listener: TcpListener = socket.into();
    listener.set_nonblocking(true)?;
    Ok(listener)
}

fn random_seed() -> u64 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    (t ^ (u64::from(std::process::id()) << 32)) | 1
}

/// Bytes received on socket `fd` and not yet read (`FIONREAD`).
pub fn bytes_queued(fd: &impl AsFd) -> io::Result<usize> {
    sys::bytes_queued(fd.as_fd())
}

/// Whether the peer of socket `fd` closed (or reset) it: at its end, with nothing left to
/// read. One non-blocking peek, nothing taken; a socket with bytes waiting is not closed.
pub fn closed_by_peer(fd: &impl AsFd) -> bool {
    let mut byte = [0u8; 1];
    match sys::recv(fd.as_fd(), &mut byte, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        ),
    }
}

/// Makes `fd` readable (for `poll`) only once `bytes` are queued, or at its end.
pub fn set_read_low_mark(fd: &impl AsFd, bytes: usize) -> io::Result<()> {
    let v = libc::c_int::try_from(bytes.max(1)).unwrap_or(libc::c_int::MAX);
    sys::set_rcvlowat(fd.as_fd(), v)
}

/// Waits until `fd` is readable (or hung up) for at most `timeout`.
pub fn wait_readable(fd: &impl AsFd, timeout: Duration) -> io::Result<bool> {
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    match sys::poll_readable(fd.as_fd(), ms) {
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(false),
        other => other,
    }
}

/// Resolves `host` (a name or an IP literal, IPv6 possibly with a `%scope`) and `port`
/// to socket addresses (IPv4 first unless `MC_USE_IPV6`).
pub fn resolve(host: &str, port: u16, ipv6: bool) -> io::Result<Vec<SocketAddr>> {
    let name = host.split('%').next().unwrap_or(host);
    let mut addrs: Vec<SocketAddr> = (name, port).to_socket_addrs()?.collect();
    if !ipv6 && addrs.iter().any(SocketAddr::is_ipv4) {
        addrs.retain(SocketAddr::is_ipv4);
    }
    if addrs.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{host:?} resolves to no address"),
        ));
    }
    Ok(addrs)
}

/// The address to listen on for a given local host name: the name itself
/// when it is an IP literal, otherwise every interface.
pub fn listen_ip(local_host: &str, bind: Option<IpAddr>, ipv6: bool) -> IpAddr {
    if let Some(ip) = bind {
        return ip;
    }
    if let Ok(ip) = local_host.parse::<IpAddr>() {
        return ip;
    }
    if ipv6 {
        IpAddr::from([0u16; 8])
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    }
}

/// Local wall-clock time as `YYYY-MM-DD HH:MM:SS.ffffff` (upstream's descriptor timestamp).
pub fn timestamp_now() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let Some(tm) = crate::sys::local_time(now.as_secs() as i64) else {
        return String::new();
    };
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        now.subsec_micros()
    )
}

/// Whether `stream` joins two addresses of this host: a loopback address, or the host's
/// own (the kernel routes such a connection over loopback too).
pub fn same_host(stream: &TcpStream) -> bool {
    match (stream.local_addr(), stream.peer_addr()) {
        (Ok(local), Ok(peer)) => peer.ip().is_loopback() || local.ip() == peer.ip(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_inside_the_range() {
        let l = bind_in_range(IpAddr::V4(Ipv4Addr::LOCALHOST), 21000, 21100, 16).unwrap();
        let p = l.local_addr().unwrap().port();
        assert!((21000..=21100).contains(&p));
    }

    #[test]
    fn timestamp_has_upstream_shape() {
        let t = timestamp_now();
        assert_eq!(t.len(), 26, "{t}");
        assert_eq!(&t[4..5], "-");
        assert_eq!(&t[19..20], ".");
    }
}
