//! `e2e-test-child`: the child processes of the interop tests, one binary that plays the
//! role its first argument names and then prints [`rdma_interop::CHILD_DONE`] (the
//! engine's `tests/child/play.rs`). Not a test
//! itself: `cargo test` lists and runs tests only, and a child entry point among them
//! would pass having done nothing. Built for this crate's tests only (the `test-child`
//! feature).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test support: a panic is the parent test's failure"
)]

mod netns_peer;
mod netns_store;
#[path = "../../../engine/tests/child/play.rs"]
mod play;
mod rdma_interop;

/// Every role, by the name a test starts it with.
const ROLES: &[play::Role] = &[
    (
        "upstream-initiator",
        rdma_interop::upstream_initiator_on_our_target,
    ),
    (
        "our-initiator",
        rdma_interop::our_initiator_on_upstream_target,
    ),
    ("netns-peer", netns_peer::netns_peer),
    ("netns-http-metadata", netns_peer::netns_http_metadata),
    ("netns-gpu-peer", netns_peer::netns_gpu_peer),
    ("netns-store-master", netns_store::netns_store_master),
    ("netns-store-client", netns_store::netns_store_client),
];

fn main() {
    play::play("e2e-test-child", ROLES);
}
