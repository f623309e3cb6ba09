//! The TCP transport's data-port framing: the 24-byte request header and the
//! v2 (`MCTV`) status frame.
//!
//! Layout (upstream `SessionHeader`, sent raw on x86_64/aarch64):
//! `size: u64 LE | addr: u64 LE | opcode: u8 | 7 bytes padding`.
//! The opcode's top bit (`0x80`) marks a v2 request, which the server answers
//! with an 8-byte status frame (after the payload for a write, before the data
//! for a read).

use super::WireError;

/// Size of the request header on the wire.
pub const HEADER_LEN: usize = 24;
/// Size of a v2 status frame on the wire.
pub const STATUS_LEN: usize = 8;
/// Bit set in the opcode byte by v2 clients.
pub const OPCODE_V2_FLAG: u8 = 0x80;
/// "MCTV" in the high 32 bits of every status frame.
pub const STATUS_MAGIC: u32 = 0x4D43_5456;
/// Opcode byte of a run of writes, our framing only: see [`RunHeader`].
pub const RUN_OPCODE: u8 = 0xC1;
/// Writes in one run at most.
pub const RUN_MAX_WRITES: usize = 64;
/// Payload bytes of one run at most.
pub const RUN_MAX_BYTES: u64 = 16 << 20;

/// Direction of a transfer, from the initiator's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpCode {
    /// Remote memory is copied into local memory.
    Read = 0,
    /// Local memory is copied into remote memory.
    Write = 1,
}

impl OpCode {
    /// The opcode from its numeric value (`Read` = 0, `Write` = 1).
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Read),
            1 => Some(Self::Write),
            _ => None,
        }
    }
}

/// One request on the data port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    /// Number of payload bytes.
    pub size: u64,
    /// Remote (target-side) virtual address.
    pub addr: u64,
    /// Read or write.
    pub opcode: OpCode,
    /// Whether the client expects v2 status frames.
    pub v2: bool,
}

impl RequestHeader {
    /// Encodes the header; padding bytes are zero.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..8].copy_from_slice(&self.size.to_le_bytes());
        out[8..16].copy_from_slice(&self.addr.to_le_bytes());
        out[16] = self.opcode as u8 | if self.v2 { OPCODE_V2_FLAG } else { 0 };
        out
    }

    /// Decodes a header; the padding is ignored (upstream sends garbage there).
    pub fn decode(buf: &[u8; HEADER_LEN]) -> Result<Self, WireError> {
        let size = u64::from_le_bytes(take8(buf, 0));
        let addr = u64::from_le_bytes(take8(buf, 8));
        let raw = buf[16];
        let opcode = OpCode::from_u8(raw & !OPCODE_V2_FLAG).ok_or(WireError::BadOpcode(raw))?;
        Ok(Self {
            size,
            addr,
            opcode,
            v2: raw & OPCODE_V2_FLAG != 0,
        })
    }
}

fn take8(buf: &[u8; HEADER_LEN], at: usize) -> [u8; 8] {
    let mut out = [0u8; 8];
    for (o, b) in out.iter_mut().zip(buf.iter().skip(at)) {
        *o = *b;
    }
    out
}

/// A run of v2 writes, headers first (our framing, sent only to peers whose descriptors
/// say `tcp_write_runs`; upstream's servers never see it): this header in the 24-byte
/// layout with opcode byte [`RUN_OPCODE`], `size` the run's payload bytes and `addr` its
/// number of writes; then each write's own v2 header; then their payloads, in order. The
/// server answers each write with its status, in order, as if sent one by one. With every
/// place known before the first payload byte, a server takes the payloads in with a few
/// `recvmsg` calls over all of them, not one each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunHeader {
    /// Writes in the run, 1 to [`RUN_MAX_WRITES`].
    pub writes: usize,
    /// Payload bytes of all of them, at most [`RUN_MAX_BYTES`].
    pub bytes: u64,
}

impl RunHeader {
    /// Encodes the run's header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..8].copy_from_slice(&self.bytes.to_le_bytes());
        out[8..16].copy_from_slice(&(self.writes as u64).to_le_bytes());
        out[16] = RUN_OPCODE;
        out
    }

    /// `None` if `buf` is not a run's header; else the run, or why it is refused (no
    /// writes, or more writes or bytes than a run may have).
    pub fn decode(buf: &[u8; HEADER_LEN]) -> Option<Result<Self, WireError>> {
        if buf[16] != RUN_OPCODE {
            return None;
        }
        let bytes = u64::from_le_bytes(take8(buf, 0));
        let writes = u64::from_le_bytes(take8(buf, 8));
        Some(
            match usize::try_from(writes) {
                Ok(w @ 1..=RUN_MAX_WRITES) if bytes <= RUN_MAX_BYTES => Ok(Self { writes: w, bytes }),
                _ => Err(WireError::Invalid(format!(
                    "a run of {writes} writes of {bytes} bytes (1 to {RUN_MAX_WRITES} writes, {RUN_MAX_BYTES} bytes at most)"
                ))),
            },
        )
    }

    /// Checks the run's write headers against it: v2 writes whose sizes add up to its bytes.
    pub fn check(&self, writes: &[RequestHeader]) -> Result<(), WireError> {
        let sum = writes
            .iter()
            .try_fold(0u64, |acc, h| acc.checked_add(h.size));
        let all_v2_writes = writes.iter().all(|h| h.opcode == OpCode::Write && h.v2);
        if writes.len() != self.writes || !all_v2_writes || sum != Some(self.bytes) {
            return Err(WireError::Invalid(format!(
                "a run announced {} writes of {} bytes, but its headers are {} requests of {:?} bytes, v2 writes: {all_v2_writes}",
                self.writes,
                self.bytes,
                writes.len(),
                sum
            )));
        }
        Ok(())
    }
}

/// The server's verdict on a v2 request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The payload was applied (write) or follows (read).
    Ok,
    /// `[addr, addr+size)` is not inside one registered buffer.
    AddrRejected,
}

impl Status {
    fn code(self) -> u32 {
        match self {
            Self::Ok => 0,
            Self::AddrRejected => 1,
        }
    }

    /// Encodes the status frame: `MAGIC << 32 | code`, little-endian.
    pub fn encode(self) -> [u8; STATUS_LEN] {
        ((u64::from(STATUS_MAGIC) << 32) | u64::from(self.code())).to_le_bytes()
    }

    /// Decodes a status frame; a wrong magic or unknown code is an error.
    pub fn decode(buf: &[u8; STATUS_LEN]) -> Result<Self, WireError> {
        let raw = u64::from_le_bytes(*buf);
        if (raw >> 32) as u32 != STATUS_MAGIC {
            return Err(WireError::BadStatusMagic(raw));
        }
        match raw as u32 {
            0 => Ok(Self::Ok),
            1 => Ok(Self::AddrRejected),
            code => Err(WireError::UnknownStatus(code)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, reason = "tests index known-good data")]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_with_v2_flag() {
        let h = RequestHeader {
            size: 4 << 20,
            addr: 0x7f00_dead_beef,
            opcode: OpCode::Write,
            v2: true,
        };
        let bytes = h.encode();
        assert_eq!(bytes[16], 0x81);
        assert_eq!(&bytes[0..8], &(4u64 << 20).to_le_bytes());
        assert_eq!(RequestHeader::decode(&bytes).unwrap(), h);
    }

    #[test]
    fn header_ignores_padding_garbage() {
        let mut bytes = RequestHeader {
            size: 7,
            addr: 9,
            opcode: OpCode::Read,
            v2: false,
        }
        .encode();
        bytes[17..].copy_from_slice(&[0xAA; 7]);
        let h = RequestHeader::decode(&bytes).unwrap();
        assert_eq!(
            (h.size, h.addr, h.opcode, h.v2),
            (7, 9, OpCode::Read, false)
        );
    }

    #[test]
    fn header_rejects_unknown_opcode() {
        let mut bytes = [0u8; HEADER_LEN];
        bytes[16] = 0x82;
        assert_eq!(
            RequestHeader::decode(&bytes),
            Err(WireError::BadOpcode(0x82))
        );
        bytes[16] = 0x02;
        assert!(RequestHeader::decode(&bytes).is_err());
    }

    #[test]
    fn a_run_header_round_trips_and_is_not_a_request() {
        let run = RunHeader {
            writes: 32,
            bytes: 1 << 20,
        };
        let bytes = run.encode();
        assert_eq!(RunHeader::decode(&bytes), Some(Ok(run)));
        // Upstream's decoder (and ours) refuses it as a request.
        assert_eq!(
            RequestHeader::decode(&bytes),
            Err(WireError::BadOpcode(RUN_OPCODE))
        );
        let write = RequestHeader {
            size: 1,
            addr: 2,
            opcode: OpCode::Write,
            v2: true,
        };
        assert_eq!(RunHeader::decode(&write.encode()), None);
    }

    #[test]
    fn a_run_out_of_bounds_is_refused() {
        for (writes, bytes) in [
            (0, 0),
            (RUN_MAX_WRITES + 1, 1),
            (1, RUN_MAX_BYTES + 1),
            (usize::MAX, 1),
        ] {
            let mut b = RunHeader { writes: 1, bytes }.encode();
            b[8..16].copy_from_slice(&(writes as u64).to_le_bytes());
            assert!(
                matches!(RunHeader::decode(&b), Some(Err(WireError::Invalid(_)))),
                "{writes} writes, {bytes} bytes"
            );
        }
    }

    #[test]
    fn a_run_whose_headers_disagree_with_it_is_refused() {
        let w = |size, opcode, v2| RequestHeader {
            size,
            addr: 0,
            opcode,
            v2,
        };
        let run = RunHeader {
            writes: 2,
            bytes: 10,
        };
        let good = [w(4, OpCode::Write, true), w(6, OpCode::Write, true)];
        assert_eq!(run.check(&good), Ok(()));
        for bad in [
            vec![w(4, OpCode::Write, true)],
            vec![w(4, OpCode::Write, true), w(7, OpCode::Write, true)],
            vec![w(4, OpCode::Read, true), w(6, OpCode::Write, true)],
            vec![w(4, OpCode::Write, false), w(6, OpCode::Write, true)],
            vec![w(u64::MAX, OpCode::Write, true), w(11, OpCode::Write, true)],
        ] {
            assert!(run.check(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn status_frames_match_upstream_values() {
        assert_eq!(
            u64::from_le_bytes(Status::Ok.encode()),
            0x4D43_5456_0000_0000
        );
        assert_eq!(
            u64::from_le_bytes(Status::AddrRejected.encode()),
            0x4D43_5456_0000_0001
        );
        for s in [Status::Ok, Status::AddrRejected] {
            assert_eq!(Status::decode(&s.encode()).unwrap(), s);
        }
    }

    #[test]
    fn status_rejects_bad_magic_and_unknown_code() {
        assert!(matches!(
            Status::decode(&0u64.to_le_bytes()),
            Err(WireError::BadStatusMagic(0))
        ));
        let unknown = (u64::from(STATUS_MAGIC) << 32) | 7;
        assert_eq!(
            Status::decode(&unknown.to_le_bytes()),
            Err(WireError::UnknownStatus(7))
        );
    }
}
