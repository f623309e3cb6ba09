//! Generates the master's gRPC service and client from a description in Rust
//! (`tonic_build::manual`): the messages are `prost` structs in `src/rpc/messages.rs`,
//! so no `.proto` file and no `protoc` is needed to build.

fn method(name: &str, route: &str, input: &str, output: &str) -> tonic_build::manual::Method {
    tonic_build::manual::Method::builder()
        .name(name)
        .route_name(route)
        .input_type(format!("crate::rpc::messages::{input}"))
        .output_type(format!("crate::rpc::messages::{output}"))
        .codec_path("tonic_prost::ProstCodec")
        .build()
}

fn main() {
    let service = tonic_build::manual::Service::builder()
        .name("Master")
        .package("mooncake_rs.store.v1")
        .method(method("hello", "Hello", "HelloRequest", "HelloReply"))
        .method(method("ping", "Ping", "ClientRequest", "PingReply"))
        .method(method(
            "mount_segment",
            "MountSegment",
            "MountRequest",
            "CodeReply",
        ))
        .method(method(
            "unmount_segment",
            "UnmountSegment",
            "UnmountRequest",
            "CodeReply",
        ))
        .method(method(
            "disconnect",
            "Disconnect",
            "ClientRequest",
            "CodeReply",
        ))
        .method(method(
            "batch_exist",
            "BatchExist",
            "KeysRequest",
            "CodesReply",
        ))
        .method(method(
            "batch_get_replicas",
            "BatchGetReplicas",
            "KeysRequest",
            "ReplicasReply",
        ))
        .method(method(
            "batch_put_start",
            "BatchPutStart",
            "PutStartRequest",
            "ReplicasReply",
        ))
        .method(method(
            "batch_put_end",
            "BatchPutEnd",
            "KeysRequest",
            "CodesReply",
        ))
        .method(method(
            "batch_put_revoke",
            "BatchPutRevoke",
            "KeysRequest",
            "CodesReply",
        ))
        .method(method(
            "batch_remove",
            "BatchRemove",
            "RemoveRequest",
            "CodesReply",
        ))
        .method(method(
            "remove_by_regex",
            "RemoveByRegex",
            "RegexRequest",
            "CountReply",
        ))
        .method(method(
            "remove_all",
            "RemoveAll",
            "ClientRequest",
            "CountReply",
        ))
        .build();
    tonic_build::manual::Builder::new().compile(&[service]);
    println!("cargo:rerun-if-changed=build.rs");
}
