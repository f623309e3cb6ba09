//! The segment descriptor JSON (upstream `encodeSegmentDesc` /
//! `decodeSegmentDesc`) and the small Notify / Probe bodies.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::WireError;

/// Most RDMA devices a descriptor may list.
pub const MAX_DEVICES: usize = 256;
/// Most locations a priority matrix may list.
pub const MAX_LOCATIONS: usize = 4096;
/// Most HCA names one priority list may hold.
pub const MAX_PRIORITY_NAMES: usize = 256;

/// A peer's segment: where its data port is and which memory it exposes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentDesc {
    /// Segment name; in P2P mode the session id `host:port`.
    pub name: String,
    /// Transport protocol(s) the segment is served by (`"tcp"`, `"rdma"`, ...).
    #[serde(with = "protocol_field")]
    pub protocol: Vec<String>,
    /// TCP data port (0 when the segment has no TCP transport).
    #[serde(default)]
    pub tcp_data_port: u16,
    /// Host of the TCP data port (upstream 0.3.13+); absent: the host of the segment name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_data_host: Option<String>,
    /// TCP protocol version; absent means 1.
    #[serde(default = "v1")]
    pub tcp_proto_version: u32,
    /// The data port takes runs of writes, headers first (`wire::tcp::RunHeader`); ours
    /// only, not sent by upstream, whose servers would refuse them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tcp_write_runs: bool,
    /// Wall-clock time of encoding, `YYYY-MM-DD HH:MM:SS.ffffff`.
    #[serde(default)]
    pub timestamp: String,
    /// Registered buffers.
    #[serde(default)]
    pub buffers: Vec<BufferDesc>,
    /// The host the segment runs on (its kernel's `boot_id`), so that a peer on another
    /// host never takes the same-host IPC path. Not sent by upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<String>,
    /// The owner's process id and pid namespace (`/proc/self/ns/pid` link text): a peer
    /// on the same host holding IPC mappings of its memory checks that it still runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// See [`pid`](Self::pid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_ns: Option<String>,
    /// Where this engine takes same-host GPU IPC control messages (`host:port` of its
    /// handshake port, message type 16): peers that open its IPC handles say so there,
    /// and are asked to let go when it unregisters the memory. Not sent by upstream,
    /// whose peers are then never told (see docs/gpu.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipc_control: Option<String>,
    /// Where this engine hands the allocations of its `ipc_vmm` buffers to same-host
    /// peers of its user (`@` and an abstract unix socket name; see
    /// `transport/ipc/fd_share.rs`). Ours; upstream neither sends nor reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipc_fd_socket: Option<String>,
    /// RDMA devices (HCAs), in the order of each buffer's `rkey`/`lkey` arrays.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceDesc>,
    /// RDMA: per location, `[preferred HCAs, available HCAs]` (upstream's topology JSON).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub priority_matrix: BTreeMap<String, [Vec<String>; 2]>,
}

/// One RDMA device of a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceDesc {
    /// HCA name (`mlx5_0`).
    pub name: String,
    /// Port LID (0 on RoCE).
    #[serde(default)]
    pub lid: u16,
    /// GID, `%02x` pairs joined by `:`.
    #[serde(default)]
    pub gid: String,
}

fn v1() -> u32 {
    1
}

/// One registered buffer of a segment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferDesc {
    /// For TCP the owner's server name; for RDMA and IPC the location (`cpu:0`, `cuda:1`).
    pub name: String,
    /// Start address in the owner's address space.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
    /// RDMA remote keys, one per device of the segment (device order).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rkey: Vec<u32>,
    /// RDMA local keys, one per device (upstream publishes them; peers do not use them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lkey: Vec<u32>,
    /// IPC transports (`nvlink_intra`, `musa`, ...): the serialized runtime IPC handle of
    /// the allocation holding the buffer, upper-case hex as upstream writes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_name: Option<String>,
    /// Where `addr` lies inside the allocation `shm_name` maps (ours; upstream assumes 0,
    /// and sends nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_offset: Option<u64>,
    /// Ours, instead of `shm_name` for memory of the virtual-memory API (which has no
    /// legacy IPC handle): the key (128 hex digits) to ask `ipc_fd_socket` for. Upstream
    /// peers skip buffers without `shm_name` on their IPC transports and use TCP/RDMA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipc_vmm: Option<String>,
}

impl BufferDesc {
    /// Whether `[addr, addr+len)` lies inside this buffer.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        addr >= self.addr && end <= self.addr + self.length
    }
}

impl SegmentDesc {
    /// Parses and validates a descriptor as upstream does: any buffer with an
    /// empty name, address 0 or length 0 rejects the whole descriptor.
    pub fn decode(json: &str) -> Result<Self, WireError> {
        let desc: Self = serde_json::from_str(json).map_err(|e| WireError::Json(e.to_string()))?;
        desc.validate()?;
        Ok(desc)
    }

    /// Compact JSON, as upstream writes it.
    pub fn encode(&self) -> String {
        // Serialising plain structs of strings and integers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    fn validate(&self) -> Result<(), WireError> {
        if self.name.is_empty() {
            return Err(WireError::Invalid(
                "segment descriptor has an empty name".into(),
            ));
        }
        for b in &self.buffers {
            if b.name.is_empty() || b.addr == 0 || b.length == 0 {
                return Err(WireError::Invalid(format!(
                    "segment {:?} lists an invalid buffer (name {:?}, addr {:#x}, length {})",
                    self.name, b.name, b.addr, b.length
                )));
            }
            if b.addr.checked_add(b.length).is_none() {
                return Err(WireError::Invalid(format!(
                    "segment {:?} lists a buffer that wraps the address space ({:#x} + {})",
                    self.name, b.addr, b.length
                )));
            }
        }
        self.validate_rdma()
    }

    /// Bounds the RDMA fields: array lengths, and an `rkey` per device in every buffer of
    /// an RDMA segment (upstream indexes `rkey` by device).
    fn validate_rdma(&self) -> Result<(), WireError> {
        let bad = |why: String| WireError::Invalid(format!("segment {:?}: {why}", self.name));
        if self.devices.len() > MAX_DEVICES {
            return Err(bad(format!(
                "lists {} RDMA devices (at most {MAX_DEVICES})",
                self.devices.len()
            )));
        }
        if self.priority_matrix.len() > MAX_LOCATIONS {
            return Err(bad(format!(
                "priority_matrix lists {} locations (at most {MAX_LOCATIONS})",
                self.priority_matrix.len()
            )));
        }
        for (loc, lists) in &self.priority_matrix {
            if lists.iter().any(|l| l.len() > MAX_PRIORITY_NAMES) {
                return Err(bad(format!(
                    "priority_matrix entry {loc:?} lists more than {MAX_PRIORITY_NAMES} HCAs"
                )));
            }
        }
        let rdma = self.protocol.iter().any(|p| p == "rdma");
        for b in &self.buffers {
            if (rdma || !b.rkey.is_empty()) && b.rkey.len() != self.devices.len() {
                return Err(bad(format!(
                    "buffer {:#x}+{} has {} rkeys for {} devices (one per device expected)",
                    b.addr,
                    b.length,
                    b.rkey.len(),
                    self.devices.len()
                )));
            }
            if b.lkey.len() > MAX_DEVICES {
                return Err(bad(format!(
                    "buffer {:#x} has {} lkeys (at most {MAX_DEVICES})",
                    b.addr,
                    b.lkey.len()
                )));
            }
        }
        Ok(())
    }

    /// Whether the segment is served over RDMA (devices and keys published).
    pub fn speaks_rdma(&self) -> bool {
        self.protocol.iter().any(|p| p == "rdma") && !self.devices.is_empty()
    }

    /// Whether the segment is served over TCP.
    ///
    /// An engine of ours serving RDMA and TCP says `"protocol": "rdma"` (upstream reads one
    /// protocol) and keeps its TCP data port and host: such a descriptor is served over
    /// TCP too. (Upstream writes `tcp_data_host` only from its TCP transport.)
    pub fn speaks_tcp(&self) -> bool {
        let has = |name: &str| self.protocol.iter().any(|p| p == name);
        self.tcp_data_port != 0 && (has("tcp") || (has("rdma") && self.tcp_data_host.is_some()))
    }

    /// The buffer holding all of `[addr, addr+len)`, if any.
    pub fn find_buffer(&self, addr: u64, len: u64) -> Option<&BufferDesc> {
        self.buffers.iter().find(|b| b.contains(addr, len))
    }
}

mod protocol_field {
    use serde::{Deserialize, Deserializer, Serializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }

    /// One protocol is a string, as upstream writes it. RDMA with TCP beside it is
    /// written `"rdma"`: upstream builds read `protocol` as one string, and our peers find
    /// the TCP transport by its data port (see `SegmentDesc::speaks_tcp`).
    pub(super) fn serialize<S: Serializer>(v: &[String], s: S) -> Result<S::Ok, S::Error> {
        match v {
            [one] => s.serialize_str(one),
            many if many.iter().any(|p| p == "rdma") => s.serialize_str("rdma"),
            many => s.collect_seq(many),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
        Ok(match OneOrMany::deserialize(d)? {
            OneOrMany::One(p) => vec![p],
            OneOrMany::Many(ps) => ps,
        })
    }
}

/// Body of a Notify (type 2) message and of its reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotifyMsg {
    /// Sender-chosen name.
    #[serde(default)]
    pub name: String,
    /// Message text.
    #[serde(default)]
    pub notify_msg: String,
}

impl NotifyMsg {
    /// Parses a notify body.
    pub fn decode(json: &str) -> Result<Self, WireError> {
        serde_json::from_str(json).map_err(|e| WireError::Json(e.to_string()))
    }

    /// Compact JSON.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The reply upstream sends for every accepted notify.
    pub fn success_reply() -> Self {
        Self {
            name: String::new(),
            notify_msg: "success".into(),
        }
    }
}

/// The Probe (type 3) reply body.
pub const PROBE_REPLY: &str = r#"{"status":"success"}"#;

/// Whether a probe reply says the peer is alive.
pub fn probe_reply_ok(json: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(json)
        .ok()
        .and_then(|v| {
            v.get("status")
                .and_then(|s| s.as_str())
                .map(|s| s == "success")
        })
        .unwrap_or(false)
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, reason = "tests index known-good data")]
mod tests {
    use super::*;

    const UPSTREAM_TCP: &str = r#"{"buffers":[{"addr":140000000000,"length":65536,"name":"127.0.0.1:15123"}],"name":"127.0.0.1:15123","protocol":"tcp","tcp_data_port":16001,"tcp_proto_version":2,"timestamp":"2026-07-25 10:00:00.123456"}"#;

    #[test]
    fn decodes_an_upstream_tcp_descriptor() {
        let d = SegmentDesc::decode(UPSTREAM_TCP).unwrap();
        assert_eq!(d.protocol, vec!["tcp"]);
        assert_eq!(d.tcp_data_port, 16001);
        assert_eq!(d.tcp_proto_version, 2);
        assert!(d.speaks_tcp());
        assert_eq!(d.find_buffer(140000000000 + 10, 100).unwrap().length, 65536);
        assert!(d.find_buffer(140000000000 + 65530, 7).is_none());
        assert!(d.find_buffer(u64::MAX - 1, 7).is_none());
    }

    #[test]
    fn round_trips_and_keeps_protocol_a_string() {
        let d = SegmentDesc::decode(UPSTREAM_TCP).unwrap();
        let text = d.encode();
        assert!(text.contains(r#""protocol":"tcp""#), "{text}");
        assert_eq!(SegmentDesc::decode(&text).unwrap(), d);
    }

    #[test]
    fn missing_version_means_v1_and_arrays_of_protocols_parse() {
        let d = SegmentDesc::decode(
            r#"{"name":"n","protocol":["tcp","cxl"],"tcp_data_port":5,"buffers":[]}"#,
        )
        .unwrap();
        assert_eq!(d.tcp_proto_version, 1);
        assert_eq!(d.protocol, vec!["tcp", "cxl"]);
    }

    #[test]
    fn reads_the_data_host_of_newer_upstreams() {
        let d = SegmentDesc::decode(
            r#"{"name":"n:1","protocol":"tcp","tcp_data_port":5,"tcp_data_host":"10.0.0.7","rdma_server_name":""}"#,
        )
        .unwrap();
        assert_eq!(d.tcp_data_host.as_deref(), Some("10.0.0.7"));
    }

    #[test]
    fn rdma_descriptor_fields_are_tolerated() {
        let d = SegmentDesc::decode(
            r#"{"name":"n","protocol":"rdma","devices":[{"name":"mlx5_0","lid":0,"gid":"00"}],
            "buffers":[{"name":"cpu:0","addr":4096,"length":4096,"rkey":[1],"lkey":[2]}],
            "priority_matrix":{"cpu:0":[["mlx5_0"],[]]}}"#,
        )
        .unwrap();
        assert!(!d.speaks_tcp());
    }

    /// Upstream's RDMA form, written by hand in the order jsoncpp writes it (sorted keys).
    const UPSTREAM_RDMA: &str = r#"{"buffers":[{"addr":140000000000,"length":1048576,"lkey":[11,21],"name":"cpu:0","rkey":[12,22]},{"addr":140100000000,"length":4096,"lkey":[13,23],"name":"musa:1","rkey":[14,24]}],"devices":[{"gid":"fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01","lid":0,"name":"mlx5_0"},{"gid":"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:07","lid":3,"name":"mlx5_1"}],"name":"10.0.0.7:15001","priority_matrix":{"cpu:0":[["mlx5_0"],["mlx5_1"]],"musa:1":[["mlx5_1"],[]]},"protocol":"rdma","tcp_data_port":0,"timestamp":"2026-07-25 10:00:00.123456"}"#;

    #[test]
    fn decodes_and_round_trips_upstreams_rdma_form() {
        let d = SegmentDesc::decode(UPSTREAM_RDMA).unwrap();
        assert!(d.speaks_rdma());
        assert!(!d.speaks_tcp());
        assert_eq!(d.devices[1].name, "mlx5_1");
        assert_eq!(d.devices[1].lid, 3);
        assert_eq!(d.buffers[1].name, "musa:1");
        assert_eq!(d.buffers[1].rkey, vec![14, 24]);
        assert_eq!(
            d.priority_matrix["cpu:0"],
            [vec!["mlx5_0".to_string()], vec!["mlx5_1".to_string()]]
        );
        let text = d.encode();
        assert_eq!(SegmentDesc::decode(&text).unwrap(), d);
        // A TCP descriptor gains no RDMA fields.
        let tcp = SegmentDesc::decode(UPSTREAM_TCP).unwrap().encode();
        assert!(
            !tcp.contains("rkey") && !tcp.contains("devices") && !tcp.contains("priority_matrix"),
            "{tcp}"
        );
    }

    #[test]
    fn rdma_beside_tcp_is_written_as_rdma_and_keeps_tcp_reachable() {
        let mut d = SegmentDesc::decode(UPSTREAM_RDMA).unwrap();
        assert!(!d.speaks_tcp(), "upstream's RDMA descriptor offers no TCP");
        d.protocol = vec!["rdma".into(), "tcp".into()];
        d.tcp_data_port = 15555;
        d.tcp_data_host = Some("10.0.0.7".into());
        let text = d.encode();
        assert!(text.contains(r#""protocol":"rdma""#), "{text}");
        let back = SegmentDesc::decode(&text).unwrap();
        assert!(back.speaks_rdma() && back.speaks_tcp());
        assert_eq!(back.tcp_data_port, 15555);
    }

    #[test]
    fn rdma_descriptors_with_wrong_key_counts_or_shapes_are_rejected() {
        let one_rkey = UPSTREAM_RDMA.replace(r#""rkey":[14,24]"#, r#""rkey":[14]"#);
        let e = SegmentDesc::decode(&one_rkey).unwrap_err().to_string();
        assert!(e.contains("1 rkeys for 2 devices"), "{e}");
        let no_rkey = UPSTREAM_RDMA.replace(r#","rkey":[14,24]"#, "");
        assert!(SegmentDesc::decode(&no_rkey).is_err());
        let three_lists = UPSTREAM_RDMA.replace(r#"[["mlx5_1"],[]]"#, r#"[["mlx5_1"],[],[]]"#);
        assert!(SegmentDesc::decode(&three_lists).is_err());
        let flat = UPSTREAM_RDMA.replace(r#"[["mlx5_1"],[]]"#, r#"["mlx5_1"]"#);
        assert!(SegmentDesc::decode(&flat).is_err());
        let names = vec![r#""x""#; MAX_PRIORITY_NAMES + 1].join(",");
        let long = UPSTREAM_RDMA.replace(r#"[["mlx5_1"],[]]"#, &format!("[[{names}],[]]"));
        assert!(SegmentDesc::decode(&long).is_err());
        let negative_key = UPSTREAM_RDMA.replace(r#""rkey":[14,24]"#, r#""rkey":[-1,24]"#);
        assert!(SegmentDesc::decode(&negative_key).is_err());
    }

    #[test]
    fn ipc_fields_round_trip_and_are_optional() {
        let d = SegmentDesc::decode(
            r#"{"name":"n","protocol":"nvlink_intra","buffers":[{"name":"cuda:0","addr":4096,"length":4096,"shm_name":"AB"}]}"#,
        )
        .unwrap();
        assert_eq!(d.buffers[0].shm_name.as_deref(), Some("AB"));
        assert_eq!((d.buffers[0].shm_offset, d.host_id.as_ref()), (None, None));
        let text = d.encode();
        assert!(
            !text.contains("shm_offset") && !text.contains("host_id"),
            "{text}"
        );
        let mut d2 = d.clone();
        d2.host_id = Some("h".into());
        d2.pid = Some(7);
        d2.buffers[0].shm_offset = Some(256);
        assert_eq!(SegmentDesc::decode(&d2.encode()).unwrap(), d2);
        let tcp = SegmentDesc::decode(UPSTREAM_TCP).unwrap().encode();
        assert!(!tcp.contains("shm_name") && !tcp.contains("pid"), "{tcp}");
    }

    #[test]
    fn invalid_buffers_reject_the_descriptor() {
        for bad in [
            r#"{"name":"n","protocol":"tcp","buffers":[{"name":"","addr":1,"length":1}]}"#,
            r#"{"name":"n","protocol":"tcp","buffers":[{"name":"x","addr":0,"length":1}]}"#,
            r#"{"name":"n","protocol":"tcp","buffers":[{"name":"x","addr":1,"length":0}]}"#,
            r#"{"name":"n","protocol":"tcp","buffers":[{"name":"x","addr":18446744073709551615,"length":2}]}"#,
            r#"{"name":"","protocol":"tcp"}"#,
            r#"{"name":"n"}"#,
            r#"{"name":"n","protocol":"tcp","buffers":[{"name":"x","addr":-1,"length":1}]}"#,
            r#"not json"#,
            r#"{"name":"n","protocol":"tcp","buffers":"#,
        ] {
            assert!(SegmentDesc::decode(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn notify_and_probe_bodies() {
        let n = NotifyMsg::decode(r#"{"name":"a","notify_msg":"b"}"#).unwrap();
        assert_eq!((n.name.as_str(), n.notify_msg.as_str()), ("a", "b"));
        assert_eq!(
            NotifyMsg::success_reply().encode(),
            r#"{"name":"","notify_msg":"success"}"#
        );
        assert!(probe_reply_ok(PROBE_REPLY));
        assert!(!probe_reply_ok(r#"{"status":"fail"}"#));
        assert!(!probe_reply_ok("garbage"));
        assert!(NotifyMsg::decode("[").is_err());
    }
}
