//! Pure codecs for everything that crosses the wire. No I/O here: every
//! function takes bytes and returns values or a [`WireError`], so the codecs
//! are unit-testable and fuzzable, and peer input can never cause a panic.

// Peer input is parsed here: an index out of range must be an error, never a panic.
#![deny(clippy::indexing_slicing)]

pub mod descriptor;
pub mod handshake;
pub mod rdma;
pub mod session;
pub mod tcp;

use thiserror::Error;

/// Malformed or unacceptable bytes from a peer.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// Fewer bytes than the format needs.
    #[error("truncated input: needed {needed} bytes, got {got}")]
    Truncated {
        /// Bytes the format needs.
        needed: usize,
        /// Bytes available.
        got: usize,
    },
    /// Bytes left after a complete frame.
    #[error("{0} unexpected bytes after the frame")]
    TrailingBytes(usize),
    /// A handshake frame with length 0.
    #[error("empty handshake frame (length 0)")]
    EmptyFrame,
    /// A handshake frame longer than the configured limit.
    #[error("handshake frame of {len} bytes exceeds the limit of {max} (MC_HANDSHAKE_MAX_LENGTH)")]
    FrameTooLong {
        /// Announced length.
        len: u64,
        /// Configured maximum.
        max: u64,
    },
    /// A TCP header with an opcode other than read/write.
    #[error("unknown opcode byte {0:#04x} in TCP header")]
    BadOpcode(u8),
    /// A status frame without the `MCTV` magic.
    #[error("status frame {0:#018x} lacks the MCTV magic")]
    BadStatusMagic(u64),
    /// A status frame with an unknown code.
    #[error("unknown status code {0} in MCTV status frame")]
    UnknownStatus(u32),
    /// A payload that is not UTF-8.
    #[error("payload is not UTF-8 text")]
    NotUtf8,
    /// A payload that is not the JSON expected.
    #[error("malformed JSON: {0}")]
    Json(String),
    /// Well-formed but unacceptable content.
    #[error("{0}")]
    Invalid(String),
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, reason = "tests index known-good data")]
mod fuzz {
    //! Arbitrary peer bytes never panic any decoder.
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = super::handshake::decode_frame(&bytes, 256);
            let _ = super::handshake::decode_body(&bytes);
            if let Ok(h) = <[u8; 24]>::try_from(&bytes[..bytes.len().min(24)]) {
                let _ = super::tcp::RequestHeader::decode(&h);
                if let Some(Ok(run)) = super::tcp::RunHeader::decode(&h) {
                    let heads: Vec<_> = bytes
                        .chunks_exact(24)
                        .filter_map(|c| <[u8; 24]>::try_from(c).ok())
                        .filter_map(|c| super::tcp::RequestHeader::decode(&c).ok())
                        .collect();
                    let _ = run.check(&heads);
                }
            }
            if let Ok(s) = <[u8; 8]>::try_from(&bytes[..bytes.len().min(8)]) {
                let _ = super::tcp::Status::decode(&s);
            }
            let text = String::from_utf8_lossy(&bytes);
            let _ = super::descriptor::SegmentDesc::decode(&text);
            let _ = super::descriptor::NotifyMsg::decode(&text);
            let _ = super::session::HostPort::parse(&text, 1);
        }

        #[test]
        fn descriptor_like_json_never_panics(
            name in "[a-z0-9:.\\[\\]]{0,20}",
            addr in any::<u64>(), len in any::<u64>(), port in any::<u16>(),
        ) {
            let json = format!(
                r#"{{"name":"{name}","protocol":"tcp","tcp_data_port":{port},"buffers":[{{"name":"b","addr":{addr},"length":{len}}}]}}"#
            );
            if let Ok(d) = super::descriptor::SegmentDesc::decode(&json) {
                let _ = d.find_buffer(addr, len);
                prop_assert!(d.buffers[0].addr.checked_add(d.buffers[0].length).is_some());
            }
        }
    }
}
