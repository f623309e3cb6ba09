//! Socket reads and writes bounded by one deadline for the whole exchange.
//!
//! A per-read timeout bounds nothing against a peer that sends one byte just
//! before each timeout: the exchange goes on forever. Here each read or write
//! gets the time left until the deadline as its socket timeout, so the whole
//! exchange ends by the deadline however the peer paces its bytes.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

/// The deadline passed before the exchange completed.
fn expired() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "deadline passed")
}

/// Sets the socket's read and write timeouts to the time left; fails once none is left.
fn arm(stream: &TcpStream, deadline: Instant) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(expired());
    }
    stream.set_read_timeout(Some(left))?;
    stream.set_write_timeout(Some(left))
}

/// Maps the socket's timeout (WouldBlock or TimedOut, by platform) to [`expired`].
fn deadline_error(e: io::Error) -> io::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => expired(),
        _ => e,
    }
}

/// Reads exactly `buf.len()` bytes before `deadline`.
pub fn read_exact_by(stream: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    let mut got = 0;
    while let Some(rest) = buf.get_mut(got..).filter(|r| !r.is_empty()) {
        arm(stream, deadline)?;
        match stream.read(rest) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(deadline_error(e)),
        }
    }
    Ok(())
}

/// Writes all of `buf` before `deadline`.
pub fn write_all_by(stream: &mut TcpStream, buf: &[u8], deadline: Instant) -> io::Result<()> {
    let mut sent = 0;
    while let Some(rest) = buf.get(sent..).filter(|r| !r.is_empty()) {
        arm(stream, deadline)?;
        match stream.write(rest) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(deadline_error(e)),
        }
    }
    Ok(())
}

/// Reads and drops bytes until EOF or `deadline`, whichever comes first.
pub fn drain_until_eof_by(stream: &mut TcpStream, deadline: Instant) {
    let mut sink = [0u8; 256];
    while arm(stream, deadline).is_ok() {
        match stream.read(&mut sink) {
            Ok(n) if n > 0 => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            _ => return,
        }
    }
}

/// Whether `e` says the deadline passed.
pub fn is_deadline(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::TimedOut
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::time::Duration;

    #[test]
    fn a_silent_peer_fails_the_read_at_the_deadline() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_held, _) = l.accept().unwrap();
        let mut buf = [0u8; 4];
        let e = read_exact_by(&mut c, &mut buf, Instant::now() + Duration::from_millis(50))
            .unwrap_err();
        assert!(is_deadline(&e), "{e}");
        let e = read_exact_by(&mut c, &mut buf, Instant::now()).unwrap_err();
        assert!(is_deadline(&e), "{e}");
    }

    #[test]
    fn whole_buffers_move_before_the_deadline() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        write_all_by(&mut c, b"hello", deadline).unwrap();
        let mut buf = [0u8; 5];
        read_exact_by(&mut s, &mut buf, deadline).unwrap();
        assert_eq!(&buf, b"hello");
        drop(c);
        drain_until_eof_by(&mut s, deadline);
    }
}
