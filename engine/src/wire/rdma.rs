//! The RDMA endpoint handshake (message type 0, upstream's `HandShakeDesc`) and GID text.
//!
//! Both sides send the same object: the sender's NIC path (`<server>@<nic>`), LID and GID,
//! the NIC path it wants to reach, its queue pair numbers, and `reply_msg` (empty, or on a
//! reply the reason the request was refused). Every field is bounded before it is used.

use serde::{Deserialize, Serialize};

use super::WireError;

/// Longest connection message accepted (a real one is a few hundred bytes).
pub const MAX_CONNECT_JSON: usize = 64 * 1024;
/// Most queue pair numbers one endpoint may announce.
pub const MAX_QPS: usize = 64;
/// Longest NIC path (`<server>@<nic>`) accepted.
pub const MAX_NIC_PATH: usize = 1024;
/// Longest `reply_msg` kept.
pub const MAX_REPLY_MSG: usize = 4096;

/// A GID: 16 bytes.
pub type Gid = [u8; 16];

/// One side of the endpoint handshake, with upstream's field names. Missing fields read as
/// empty, so that a refusal that carries only `reply_msg` is understood; the passive side
/// then refuses a request with an empty path, GID or queue pair list by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectMsg {
    /// Unused by RDMA (upstream sends `""`).
    #[serde(default)]
    pub payload: String,
    /// The sender's `<server>@<nic>`.
    #[serde(default)]
    pub local_nic_path: String,
    /// The sender's port LID (0 on RoCE).
    #[serde(default)]
    pub local_lid: u16,
    /// The sender's GID, `%02x` pairs joined by `:`.
    #[serde(default)]
    pub local_gid: String,
    /// The `<server>@<nic>` the sender wants to reach.
    #[serde(default)]
    pub peer_nic_path: String,
    /// The sender's queue pair numbers, in endpoint order.
    #[serde(default)]
    pub qp_num: Vec<u32>,
    /// Newer upstreams' optional ready-ACK round trip (not used by us).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_ack: Option<bool>,
    /// Empty, or the reason a request was refused.
    #[serde(default)]
    pub reply_msg: String,
}

impl ConnectMsg {
    /// Parses and bounds a connection message from a peer.
    pub fn decode(json: &str) -> Result<Self, WireError> {
        if json.len() > MAX_CONNECT_JSON {
            return Err(WireError::Invalid(format!(
                "connection message of {} bytes exceeds {MAX_CONNECT_JSON}",
                json.len()
            )));
        }
        // serde would also read a struct from a JSON array, by position.
        if !json.trim_start().starts_with('{') {
            return Err(WireError::Json(
                "a connection message is a JSON object".into(),
            ));
        }
        let msg: Self = serde_json::from_str(json).map_err(|e| WireError::Json(e.to_string()))?;
        if msg.qp_num.len() > MAX_QPS {
            return Err(WireError::Invalid(format!(
                "connection message announces {} queue pairs (at most {MAX_QPS})",
                msg.qp_num.len()
            )));
        }
        for (what, path) in [
            ("local_nic_path", &msg.local_nic_path),
            ("peer_nic_path", &msg.peer_nic_path),
        ] {
            if path.len() > MAX_NIC_PATH {
                return Err(WireError::Invalid(format!(
                    "{what} of {} bytes exceeds {MAX_NIC_PATH}",
                    path.len()
                )));
            }
        }
        if msg.reply_msg.len() > MAX_REPLY_MSG {
            return Err(WireError::Invalid(format!(
                "reply_msg of {} bytes exceeds {MAX_REPLY_MSG}",
                msg.reply_msg.len()
            )));
        }
        Ok(msg)
    }

    /// Compact JSON.
    pub fn encode(&self) -> String {
        // Plain strings and integers: serialising cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The GID, parsed.
    pub fn gid(&self) -> Result<Gid, WireError> {
        parse_gid(&self.local_gid)
    }
}

/// Splits a NIC path `<server>@<nic>` at its last `@`.
pub fn split_nic_path(path: &str) -> Result<(&str, &str), WireError> {
    match path.rsplit_once('@') {
        Some((server, nic)) if !server.is_empty() && !nic.is_empty() => Ok((server, nic)),
        _ => Err(WireError::Invalid(format!(
            "NIC path {path:?} is not <server>@<nic>"
        ))),
    }
}

/// Formats a GID as upstream does: 16 `%02x` pairs joined by `:`.
pub fn format_gid(gid: &Gid) -> String {
    let mut s = String::with_capacity(47);
    for (i, b) in gid.iter().enumerate() {
        if i > 0 {
            s.push(':');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Parses a GID in upstream's text form.
pub fn parse_gid(text: &str) -> Result<Gid, WireError> {
    let bad = || WireError::Invalid(format!("GID {text:?} is not 16 hex bytes joined by ':'"));
    if text.len() > 47 {
        return Err(bad());
    }
    let mut gid = [0u8; 16];
    let mut parts = text.split(':');
    for byte in gid.iter_mut() {
        let part = parts.next().ok_or_else(bad)?;
        if part.is_empty() || part.len() > 2 {
            return Err(bad());
        }
        *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
    }
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok(gid)
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, reason = "tests index known-good data")]
mod tests {
    use super::*;

    /// Written by hand in the shape upstream sends (jsoncpp sorts keys).
    const UPSTREAM_REQUEST: &str = r#"{"local_gid":"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:07","local_lid":0,"local_nic_path":"10.0.0.7:15001@mlx5_0","payload":"","peer_nic_path":"10.0.0.8:15002@mlx5_1","qp_num":[4711,4712],"reply_msg":""}"#;

    #[test]
    fn decodes_upstreams_request() {
        let m = ConnectMsg::decode(UPSTREAM_REQUEST).unwrap();
        assert_eq!(m.qp_num, vec![4711, 4712]);
        assert_eq!(m.gid().unwrap()[10..], [0xff, 0xff, 10, 0, 0, 7]);
        assert_eq!(
            split_nic_path(&m.peer_nic_path).unwrap(),
            ("10.0.0.8:15002", "mlx5_1")
        );
        assert_eq!(ConnectMsg::decode(&m.encode()).unwrap(), m);
    }

    #[test]
    fn a_bare_refusal_is_understood() {
        let m = ConnectMsg::decode(r#"{"reply_msg":"QP count mismatch"}"#).unwrap();
        assert_eq!(m.reply_msg, "QP count mismatch");
        assert!(m.qp_num.is_empty() && m.local_nic_path.is_empty());
    }

    #[test]
    fn gid_text_round_trips_and_rejects_junk() {
        let gid: Gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let text = format_gid(&gid);
        assert_eq!(text, "fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01");
        assert_eq!(parse_gid(&text).unwrap(), gid);
        for bad in [
            "",
            "fe:80",
            "fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01:02",
            "fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:zz",
            "fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:",
            "fe80:0000:0000:0000:0000:0000:0000:0001",
            "fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:100",
        ] {
            assert!(parse_gid(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hostile_messages_are_errors() {
        let huge = format!(
            r#"{{"local_nic_path":"a@b","local_lid":0,"local_gid":"","peer_nic_path":"c@d","qp_num":[{}]}}"#,
            vec!["1"; 100].join(",")
        );
        let long_path = format!(
            r#"{{"local_nic_path":"{}@b","local_lid":0,"local_gid":"","peer_nic_path":"c@d","qp_num":[]}}"#,
            "a".repeat(2000)
        );
        for bad in [
            "",
            "[]",
            "null",
            r#"{"local_nic_path":1}"#,
            r#"{"local_nic_path":"a@b","local_lid":-1,"local_gid":"","peer_nic_path":"c@d","qp_num":[]}"#,
            r#"{"local_nic_path":"a@b","local_lid":70000,"local_gid":"","peer_nic_path":"c@d","qp_num":[]}"#,
            r#"{"local_nic_path":"a@b","local_lid":0,"local_gid":"","peer_nic_path":"c@d","qp_num":"x"}"#,
            r#"{"local_nic_path":"a@b","local_lid":0,"local_gid":"","peer_nic_path":"c@d","qp_num":[-5]}"#,
            &huge,
            &long_path,
            &" ".repeat(MAX_CONNECT_JSON + 1),
        ] {
            assert!(ConnectMsg::decode(bad).is_err(), "{bad:.80}");
        }
        assert!(split_nic_path("nonic").is_err());
        assert!(split_nic_path("@nic").is_err());
        assert!(split_nic_path("srv@").is_err());
    }
}
