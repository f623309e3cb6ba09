//! A reader that says once when half of a reply's payload is in: a lane with one read into
//! device memory out may then ask for the next, so that the peer finds that request while
//! it still sends this one and copies its first chunk out of its device ahead (see the
//! client's `DEVICE_READS_OUT`).

use std::io::{self, Read};

/// Reads through `inner`, running `reached` once as soon as `mark` bytes have come.
pub struct Halfway<R, F: FnMut()> {
    inner: R,
    /// Bytes still to come before `reached` runs; `None` once it ran.
    left: Option<usize>,
    reached: F,
}

impl<R: Read, F: FnMut()> Halfway<R, F> {
    /// Over a payload of `len` bytes: `reached` runs once `len / 2` of them are read
    /// (at once for an empty payload's zero bytes, on the first read).
    pub fn new(inner: R, len: usize, reached: F) -> Self {
        Self {
            inner,
            left: Some(len / 2),
            reached,
        }
    }
}

impl<R: Read, F: FnMut()> Read for Halfway<R, F> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(left) = self.left else {
            return self.inner.read(buf);
        };
        // A read stops at the mark, so that the mark is told as soon as its bytes are in,
        // not after a read that runs on to the end of the chunk.
        let want = if left == 0 {
            buf.len()
        } else {
            buf.len().min(left)
        };
        let n = self.inner.read(buf.get_mut(..want).unwrap_or_default())?;
        if n >= left {
            self.left = None;
            (self.reached)();
        } else {
            self.left = Some(left - n);
        }
        Ok(n)
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, reason = "tests index known-good data")]
mod tests {
    use super::*;

    /// Hands out at most `step` bytes a read, counting the bytes read so far.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(self.step).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn the_mark_is_told_once_exactly_when_half_the_bytes_are_in() {
        let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        for step in [1, 7, 333, 500, 501, 4096] {
            let told = std::cell::Cell::new(0);
            let mut r = Halfway::new(Trickle { data: &data, step }, data.len(), || {
                told.set(told.get() + 1);
            });
            let mut out = vec![0u8; data.len()];
            let mut at = 0;
            let mut told_at = None;
            while at < out.len() {
                let n = r.read(&mut out[at..]).unwrap();
                assert!(n > 0);
                at += n;
                if told.get() == 1 && told_at.is_none() {
                    told_at = Some(at);
                }
                assert_eq!(
                    told.get(),
                    usize::from(at >= 500),
                    "at {at} bytes (step {step})"
                );
            }
            assert_eq!(
                told_at,
                Some(500),
                "told after the wrong read (step {step})"
            );
            assert_eq!(out, data, "bytes changed on the way (step {step})");
        }
    }

    #[test]
    fn a_failed_read_tells_nothing() {
        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::ErrorKind::ConnectionReset.into())
            }
        }
        let mut told = false;
        let mut r = Halfway::new(Broken, 10, || told = true);
        assert!(r.read(&mut [0u8; 10]).is_err());
        assert!(!told);
    }
}
