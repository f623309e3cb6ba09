//! The master: metadata only (segments, placement, leases, eviction, client liveness),
//! never the bytes. [`state`] decides, from events and the time, with no I/O; the RPC
//! [`service`], the [`http`] routes and high availability are thin edges over it, and
//! [`run`] starts them from the command line ([`flags`]).

pub mod alloc;
pub mod flags;
pub mod http;
pub mod incoming;
pub mod run;
pub mod service;
pub mod state;
