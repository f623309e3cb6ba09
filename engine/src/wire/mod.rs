//! Pure codecs for everything that crosses the wire. No I/O here: every
//! function takes bytes and returns values or a [`WireError`], so the codecs
//! are unit-testable and fuzzable, and peer input can never cause a panic.

pub mod descriptor;
pub mod handshake;
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
