//! How `initialize` and `initialize_ext` turn their metadata arguments into the engine's
//! connection string, as upstream does.

use transfer_engine::P2P_HANDSHAKE;

/// `initialize(.., metadata_server, ..)`: exactly `P2PHANDSHAKE` stays as is;
/// `"proto://rest"` is (proto, rest); anything else means etcd.
pub fn for_initialize(metadata_server: &str) -> String {
    if metadata_server == P2P_HANDSHAKE {
        return P2P_HANDSHAKE.to_string();
    }
    match metadata_server.split_once("://") {
        Some((proto, rest)) => for_initialize_ext(rest, proto),
        None => for_initialize_ext(metadata_server, "etcd"),
    }
}

/// `initialize_ext(.., metadata_server, .., metadata_type)`: `metadata_type://server`
/// unless the server already has a scheme or is `P2PHANDSHAKE`.
pub fn for_initialize_ext(metadata_server: &str, metadata_type: &str) -> String {
    if metadata_server == P2P_HANDSHAKE || metadata_server.contains("://") {
        metadata_server.to_string()
    } else {
        format!("{metadata_type}://{metadata_server}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_rules() {
        assert_eq!(for_initialize("P2PHANDSHAKE"), "P2PHANDSHAKE");
        assert_eq!(
            for_initialize("http://h:8080/metadata"),
            "http://h:8080/metadata"
        );
        assert_eq!(for_initialize("10.0.0.1:2379"), "etcd://10.0.0.1:2379");
        assert_eq!(for_initialize("etcd://a:1,b:2"), "etcd://a:1,b:2");
        assert_eq!(for_initialize_ext("h:2379", "redis"), "redis://h:2379");
        assert_eq!(for_initialize_ext("P2PHANDSHAKE", "etcd"), "P2PHANDSHAKE");
        assert_eq!(for_initialize_ext("http://x", "etcd"), "http://x");
    }
}
