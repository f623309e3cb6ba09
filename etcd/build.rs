//! Generates etcd v3's KV, Lease and Watch clients from a description in Rust
//! (`tonic_build::manual`): the messages are `prost` structs in `src/messages.rs`, so no
//! `.proto` file and no `protoc` is needed to build.

use tonic_build::manual::{Builder, Method, Service};

fn method(
    name: &str,
    route: &str,
    input: &str,
    output: &str,
) -> tonic_build::manual::MethodBuilder {
    Method::builder()
        .name(name)
        .route_name(route)
        .input_type(format!("crate::messages::{input}"))
        .output_type(format!("crate::messages::{output}"))
        .codec_path("tonic_prost::ProstCodec")
}

fn main() {
    let kv = Service::builder()
        .name("KV")
        .package("etcdserverpb")
        .method(method("range", "Range", "RangeRequest", "RangeResponse").build())
        .method(method("put", "Put", "PutRequest", "PutResponse").build())
        .method(
            method(
                "delete_range",
                "DeleteRange",
                "DeleteRangeRequest",
                "DeleteRangeResponse",
            )
            .build(),
        )
        .method(method("txn", "Txn", "TxnRequest", "TxnResponse").build())
        .build();
    let lease = Service::builder()
        .name("Lease")
        .package("etcdserverpb")
        .method(
            method(
                "lease_grant",
                "LeaseGrant",
                "LeaseGrantRequest",
                "LeaseGrantResponse",
            )
            .build(),
        )
        .method(
            method(
                "lease_revoke",
                "LeaseRevoke",
                "LeaseRevokeRequest",
                "LeaseRevokeResponse",
            )
            .build(),
        )
        .method(
            method(
                "lease_keep_alive",
                "LeaseKeepAlive",
                "LeaseKeepAliveRequest",
                "LeaseKeepAliveResponse",
            )
            .client_streaming()
            .server_streaming()
            .build(),
        )
        .build();
    let watch = Service::builder()
        .name("Watch")
        .package("etcdserverpb")
        .method(
            method("watch", "Watch", "WatchRequest", "WatchResponse")
                .client_streaming()
                .server_streaming()
                .build(),
        )
        .build();
    Builder::new()
        .build_server(false)
        .compile(&[kv, lease, watch]);
    println!("cargo:rerun-if-changed=build.rs");
}
