//! A KV-cache transfer engine, wire-compatible with the Mooncake Transfer
//! Engine 0.3.12+ over TCP (P2P handshake, segment descriptors, TCP v2).
//!
//! Layers, lowest first: [`config`], [`memory`], [`wire`] (pure codecs, no
//! I/O), [`metadata`] (how peers' descriptors are found), [`transport`]
//! (TCP), and [`engine`] (the public API).
//!
//! ```no_run
//! use transfer_engine::{Config, TransferEngine, Request, OpCode};
//! let engine = TransferEngine::new("127.0.0.1", "P2PHANDSHAKE", Config::from_env()?)?;
//! let buf = vec![0u8; 4096];
//! engine.register_memory(buf.as_ptr() as u64, 4096, "cpu:0")?;
//! println!("peers address me as {}", engine.session_id());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]
// `unsafe` lives in `memory`, `device`, `verbs`, `sys` and the RDMA backends only
// (tests/layering.rs checks it); every block says why it is sound.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod config;
pub mod conn_limit;
pub mod deadline_io;
pub mod device;
pub mod engine;
pub mod error;
pub mod http_serve;
pub mod log_throttle;
pub mod logging;
pub mod memory;
pub mod metadata;
pub mod metrics;
pub mod net;
pub mod notify_queue;
pub mod sys;
pub mod task;
pub mod topology;
pub mod transport;
pub mod verbs;
pub mod wire;

pub use config::Config;
pub use engine::error::EngineError;
pub use engine::{Batch, Notify, Request, SubmitOptions, TransferEngine, P2P_HANDSHAKE};
pub use error::{Fault, TransferError};
pub use memory::host_buffer::{self, HostBuffer};
pub use task::TaskStatus;
pub use transport::TransportRequest;
pub use wire::tcp::OpCode;
