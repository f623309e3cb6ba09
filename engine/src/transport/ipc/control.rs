//! Revocation of IPC access: the control messages (handshake type 16, JSON) between our
//! engines on one host.
//!
//! An importer that opens a peer's handle says so (`opened`) before its first copy, and
//! the exporter records it per allocation. When the exporter unregisters memory inside
//! that allocation it asks each recorded importer to let go (`release`) and waits, within
//! `MC_IPC_REVOKE_TIMEOUT`, for the acknowledgement: the importer has refused new copies
//! to the handle, waited for those in flight, closed its mapping and dropped its cached
//! descriptor. Only then does `unregister_memory` return, so the caller may free or reuse
//! the memory. Upstream engines neither send nor answer these messages: an upstream
//! importer is never asked (docs/gpu.md).

use serde::{Deserialize, Serialize};

use crate::wire::session::HostPort;

/// Longest `importer` / `exporter` address accepted (bytes).
pub(super) const MAX_ADDRESS: usize = 300;
/// Importers recorded per exported allocation: past this, `opened` is refused and the
/// importer uses the TCP path for that allocation.
pub(super) const MAX_IMPORTERS_PER_HANDLE: usize = 64;

/// One control message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(super) enum Control {
    /// Importer -> exporter, before the importer's first copy through the handle.
    Opened {
        /// The handle (upstream hex), as the exporter advertised it.
        shm_name: String,
        /// `host:port` where the importer takes control messages.
        importer: String,
        /// The importer's process (a dead one counts as released).
        pid: u32,
        /// The importer's host identity; must equal the exporter's.
        host_id: String,
    },
    /// Exporter -> importer: stop using the handle and close it, then reply.
    Release {
        /// The handle to close.
        shm_name: String,
        /// The exporter's segment name (its descriptor's `name`).
        exporter: String,
        /// The exporter's clock when it revoked (descriptor timestamp format): the
        /// importer refuses this handle for descriptors encoded no later than this.
        revoked_at: String,
    },
}

/// The answer to either message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Reply {
    /// Whether the message was acted on.
    pub ok: bool,
    /// Why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Reply {
    pub fn ok() -> String {
        encode(&Reply {
            ok: true,
            error: None,
        })
    }

    pub fn refused(why: impl Into<String>) -> String {
        encode(&Reply {
            ok: false,
            error: Some(why.into()),
        })
    }

    /// `Ok` for an acknowledgement, else what the peer said or why its text is not a reply.
    pub fn check(text: &str) -> Result<(), String> {
        match serde_json::from_str::<Reply>(text) {
            Ok(Reply { ok: true, .. }) => Ok(()),
            Ok(Reply { error, .. }) => Err(error.unwrap_or_else(|| "refused".into())),
            Err(e) => Err(format!("not an IPC control reply ({e})")),
        }
    }
}

fn encode<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| r#"{"ok":false}"#.into())
}

impl Control {
    pub fn encode(&self) -> String {
        encode(self)
    }

    /// Parses a peer's message; every field is checked for what it may hold.
    pub fn decode(json: &str) -> Result<Self, String> {
        let c: Control =
            serde_json::from_str(json).map_err(|e| format!("not an IPC control message: {e}"))?;
        let address_ok =
            |a: &str| a.len() <= MAX_ADDRESS && HostPort::parse(a, 0).is_ok_and(|h| h.port != 0);
        match &c {
            Control::Opened {
                shm_name,
                importer,
                pid,
                host_id,
            } => {
                if !hex_handle(shm_name) {
                    return Err("shm_name is not an IPC handle in hex".into());
                }
                if !address_ok(importer) {
                    return Err("importer is not a host:port".into());
                }
                if *pid == 0 || i32::try_from(*pid).is_err() {
                    return Err("pid is out of range".into());
                }
                if host_id.is_empty() || host_id.len() > MAX_ADDRESS {
                    return Err("host_id is empty or too long".into());
                }
            }
            Control::Release {
                shm_name,
                exporter,
                revoked_at,
            } => {
                if !hex_handle(shm_name) {
                    return Err("shm_name is not an IPC handle in hex".into());
                }
                if exporter.is_empty() || exporter.len() > MAX_ADDRESS {
                    return Err("exporter is empty or too long".into());
                }
                if !timestamp_shape(revoked_at) {
                    return Err("revoked_at is not a YYYY-MM-DD HH:MM:SS.ffffff timestamp".into());
                }
            }
        }
        Ok(c)
    }
}

/// Whether `s` has the fixed-width shape of descriptor timestamps (compared as text).
fn timestamp_shape(s: &str) -> bool {
    const SHAPE: &[u8] = b"dddd-dd-dd dd:dd:dd.dddddd";
    s.len() == SHAPE.len()
        && s.bytes().zip(SHAPE).all(|(c, &want)| match want {
            b'd' => c.is_ascii_digit(),
            other => c == other,
        })
}

fn hex_handle(s: &str) -> bool {
    s.len() == 2 * crate::device::ipc::IPC_HANDLE_BYTES && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_hostile_input() {
        let h = "AB".repeat(crate::device::ipc::IPC_HANDLE_BYTES);
        let m = Control::Opened {
            shm_name: h.clone(),
            importer: "127.0.0.1:15001".into(),
            pid: 42,
            host_id: "boot".into(),
        };
        let text = m.encode();
        assert!(text.contains(r#""op":"opened""#), "{text}");
        assert_eq!(Control::decode(&text).unwrap(), m);
        let r = Control::Release {
            shm_name: h.clone(),
            exporter: "127.0.0.1:15002".into(),
            revoked_at: "2026-11-30 14:00:00.000001".into(),
        };
        assert_eq!(Control::decode(&r.encode()).unwrap(), r);
        for bad in [
            "",
            "null",
            "[]",
            r#"{"op":"opened"}"#,
            r#"{"op":"nuke","shm_name":"00"}"#,
            r#"{"op":"opened","shm_name":"zz","importer":"a:1","pid":1,"host_id":"b"}"#,
            &format!(
                r#"{{"op":"opened","shm_name":"{h}","importer":"{}","pid":1,"host_id":"b"}}"#,
                "x".repeat(5000)
            ),
            &format!(
                r#"{{"op":"opened","shm_name":"{h}","importer":"a:1","pid":0,"host_id":"b"}}"#
            ),
            &format!(
                r#"{{"op":"opened","shm_name":"{h}","importer":"a:1","pid":4294967295,"host_id":"b"}}"#
            ),
            &format!(r#"{{"op":"release","shm_name":"{h}","exporter":"","revoked_at":"t"}}"#),
            &format!(r#"{{"op":"release","shm_name":"{h}","exporter":"a:1","revoked_at":"9999"}}"#),
            &format!(
                r#"{{"op":"release","shm_name":"{h}","exporter":"a:1","revoked_at":"2026-11-30 14:00:00.00000x"}}"#
            ),
        ] {
            assert!(Control::decode(bad).is_err(), "{bad}");
        }
        assert!(timestamp_shape(&crate::net::timestamp_now()));
        assert_eq!(Reply::check(&Reply::ok()), Ok(()));
        assert_eq!(Reply::check(&Reply::refused("no")), Err("no".to_string()));
        assert!(Reply::check("garbage").is_err());
    }
}
