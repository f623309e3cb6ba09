//! Mooncake Store on the transfer engine: `mooncake_master` and the client that
//! `mooncake.store.MooncakeDistributedStore` wraps. The engine moves every byte; the
//! store adds placement, leases, eviction and liveness.
//!
//! Layout: [`master`] (the state machine and its edges: RPC service, HTTP routes, the
//! command line), [`rpc`] (the messages and the generated gRPC service), [`client`]
//! (setup, the master link, the data path), [`ha`] (leader election on etcd), [`codes`]
//! (upstream's return codes).

#![deny(unsafe_code)]

pub mod client;
pub mod codes;
pub mod ha;
pub mod master;
pub mod rpc;

pub use codes::Code;
