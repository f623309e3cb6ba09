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
