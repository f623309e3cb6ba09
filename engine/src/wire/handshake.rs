//! The P2P handshake frame: `length: u64 LE | type: u8 | JSON payload`.
//!
//! `length` counts the type byte and the payload. A frame whose first body
//! byte is greater than 3 is a legacy frame without a type byte, treated as a
//! Connection message (upstream does the same).

use super::WireError;

/// Bytes of the length prefix.
pub const LENGTH_PREFIX: usize = 8;
/// Upstream default for `MC_HANDSHAKE_MAX_LENGTH`.
pub const DEFAULT_MAX_LENGTH: u64 = 1 << 20;

/// What a handshake frame asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageType {
    /// RDMA queue-pair exchange.
    Connection = 0,
    /// Segment descriptor request.
    Metadata = 1,
    /// A user notification.
    Notify = 2,
    /// Liveness probe.
    Probe = 3,
    /// Same-host GPU IPC control between engines of this project (JSON bodies; see
    /// `transport::ipc::control`). Upstream does not know it and never sends it.
    IpcControl = 16,
}

impl MessageType {
    fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Connection),
            1 => Some(Self::Metadata),
            2 => Some(Self::Notify),
            3 => Some(Self::Probe),
            16 => Some(Self::IpcControl),
            _ => None,
        }
    }
}

/// A decoded frame body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Message type (Connection for legacy frames).
    pub kind: MessageType,
    /// JSON text (may end with `\n`).
    pub payload: Vec<u8>,
}

impl Frame {
    /// A frame carrying `json`; a trailing newline is added as upstream's writer does.
    pub fn new(kind: MessageType, json: &str) -> Self {
        let mut payload = Vec::with_capacity(json.len() + 1);
        payload.extend_from_slice(json.as_bytes());
        if !json.ends_with('\n') {
            payload.push(b'\n');
        }
        Self { kind, payload }
    }

    /// The complete frame, length prefix included.
    pub fn encode(&self) -> Vec<u8> {
        let len = self.payload.len() as u64 + 1;
        let mut out = Vec::with_capacity(LENGTH_PREFIX + len as usize);
        out.extend_from_slice(&len.to_le_bytes());
        out.push(self.kind as u8);
        out.extend_from_slice(&self.payload);
        out
    }

    /// The payload as JSON text, without the trailing newline.
    pub fn json(&self) -> Result<&str, WireError> {
        let text = std::str::from_utf8(&self.payload).map_err(|_| WireError::NotUtf8)?;
        Ok(text.trim_end_matches(['\n', '\r']))
    }
}

/// Checks a length prefix before anything else is read: 0 and anything above
/// `max` are refused, so a peer cannot make us allocate what it likes.
pub fn decode_length(prefix: &[u8; LENGTH_PREFIX], max: u64) -> Result<usize, WireError> {
    let len = u64::from_le_bytes(*prefix);
    if len == 0 {
        return Err(WireError::EmptyFrame);
    }
    if len > max {
        return Err(WireError::FrameTooLong { len, max });
    }
    usize::try_from(len).map_err(|_| WireError::FrameTooLong { len, max })
}

/// Decodes the `length` bytes that follow the prefix.
pub fn decode_body(body: &[u8]) -> Result<Frame, WireError> {
    let (&first, rest) = body.split_first().ok_or(WireError::EmptyFrame)?;
    match MessageType::from_u8(first) {
        Some(kind) => Ok(Frame {
            kind,
            payload: rest.to_vec(),
        }),
        // Legacy frame: no type byte, the whole body is a Connection payload.
        None => Ok(Frame {
            kind: MessageType::Connection,
            payload: body.to_vec(),
        }),
    }
}

/// Decodes a complete frame held in one buffer (prefix included).
pub fn decode_frame(buf: &[u8], max: u64) -> Result<Frame, WireError> {
    let prefix: &[u8; LENGTH_PREFIX] = buf
        .get(..LENGTH_PREFIX)
        .and_then(|p| p.try_into().ok())
        .ok_or(WireError::Truncated {
            needed: LENGTH_PREFIX,
            got: buf.len(),
        })?;
    let len = decode_length(prefix, max)?;
    let body = buf.get(LENGTH_PREFIX..).unwrap_or_default();
    if body.len() < len {
        return Err(WireError::Truncated {
            needed: len,
            got: body.len(),
        });
    }
    if body.len() > len {
        return Err(WireError::TrailingBytes(body.len() - len));
    }
    decode_body(body)
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, reason = "tests index known-good data")]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_type() {
        for kind in [
            MessageType::Connection,
            MessageType::Metadata,
            MessageType::Notify,
            MessageType::Probe,
            MessageType::IpcControl,
        ] {
            let f = Frame::new(kind, "{\"a\":1}");
            let bytes = f.encode();
            assert_eq!(u64::from_le_bytes(bytes[..8].try_into().unwrap()), 9);
            assert_eq!(bytes[8], kind as u8);
            let back = decode_frame(&bytes, DEFAULT_MAX_LENGTH).unwrap();
            assert_eq!(back, f);
            assert_eq!(back.json().unwrap(), "{\"a\":1}");
        }
    }

    #[test]
    fn legacy_frame_without_type_is_connection() {
        let json = b"{\"qp_num\":[]}\n";
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(json);
        let f = decode_frame(&bytes, DEFAULT_MAX_LENGTH).unwrap();
        assert_eq!(f.kind, MessageType::Connection);
        assert_eq!(f.payload, json);
    }

    #[test]
    fn zero_and_oversized_lengths_are_refused() {
        assert_eq!(
            decode_length(&0u64.to_le_bytes(), 100),
            Err(WireError::EmptyFrame)
        );
        assert_eq!(
            decode_length(&101u64.to_le_bytes(), 100),
            Err(WireError::FrameTooLong { len: 101, max: 100 })
        );
        assert!(decode_length(&u64::MAX.to_le_bytes(), DEFAULT_MAX_LENGTH).is_err());
        assert_eq!(decode_length(&100u64.to_le_bytes(), 100), Ok(100));
    }

    #[test]
    fn truncated_and_trailing_input_is_an_error() {
        let bytes = Frame::new(MessageType::Probe, "{}").encode();
        for cut in 0..bytes.len() {
            assert!(
                decode_frame(&bytes[..cut], DEFAULT_MAX_LENGTH).is_err(),
                "cut {cut}"
            );
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(
            decode_frame(&long, DEFAULT_MAX_LENGTH),
            Err(WireError::TrailingBytes(1))
        );
    }

    #[test]
    fn non_utf8_payload_is_an_error_not_a_panic() {
        let f = Frame {
            kind: MessageType::Notify,
            payload: vec![0xff, 0xfe],
        };
        assert_eq!(f.json(), Err(WireError::NotUtf8));
    }
}
