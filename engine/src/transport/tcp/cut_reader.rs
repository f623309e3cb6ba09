//! Socket reads and writes of the engine's own buffers (staging chunks) that stop once the
//! connection is cut, as [`MemSpan`](crate::memory::MemSpan) I/O does: after a cut, bytes the
//! peer keeps sending must not flow on into device memory.

use std::io::{self, Read, Write};
use std::net::TcpStream;

use crate::memory::SocketCut;

/// `stream`, checked against `cut` before every read and write.
#[derive(Clone, Copy)]
pub struct CutStream<'a> {
    pub(crate) stream: &'a TcpStream,
    pub(crate) cut: &'a SocketCut,
}

impl CutStream<'_> {
    fn check(&self) -> io::Result<()> {
        self.cut.check()
    }
}

impl Read for CutStream<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.check()?;
        let mut s: &TcpStream = self.stream;
        s.read(buf)
    }
}

impl Write for CutStream<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.check()?;
        let mut s: &TcpStream = self.stream;
        s.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
