//! Server names / session ids: `host:port`, `[v6]:port`, bare IPv6,
//! `v6%scope:port` (upstream `parseHostNameWithPort`).

use std::net::Ipv6Addr;

use super::WireError;

/// A parsed `host:port`; `host` has no brackets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// Host name or IP literal, without brackets.
    pub host: String,
    /// Port; the default port when the name had none.
    pub port: u16,
}

impl HostPort {
    /// Parses a server name; `default_port` (`MC_HANDSHAKE_PORT`) fills a missing port.
    pub fn parse(name: &str, default_port: u16) -> Result<Self, WireError> {
        let bad = |why: &str| WireError::Invalid(format!("server name {name:?}: {why}"));
        if name.is_empty() {
            return Err(bad("empty"));
        }
        if let Some(rest) = name.strip_prefix('[') {
            let (host, after) = rest.split_once(']').ok_or_else(|| bad("missing ']'"))?;
            let port = match after {
                "" => default_port,
                p => parse_port(p.strip_prefix(':').ok_or_else(|| bad("junk after ']'"))?)
                    .ok_or_else(|| bad("bad port"))?,
            };
            if host.is_empty() {
                return Err(bad("empty host"));
            }
            return Ok(Self {
                host: host.to_string(),
                port,
            });
        }
        if name.parse::<Ipv6Addr>().is_ok() {
            return Ok(Self {
                host: name.to_string(),
                port: default_port,
            });
        }
        match name.rsplit_once(':') {
            None => Ok(Self {
                host: name.to_string(),
                port: default_port,
            }),
            Some((host, port)) => {
                let port = parse_port(port).ok_or_else(|| bad("bad port"))?;
                if host.is_empty() {
                    return Err(bad("empty host"));
                }
                Ok(Self {
                    host: host.to_string(),
                    port,
                })
            }
        }
    }

    /// The canonical session id: IPv6 hosts in brackets.
    pub fn session_id(&self) -> String {
        format!("{}:{}", wrap_ipv6(&self.host), self.port)
    }
}

/// A segment name as the API takes it (`target_hostname`), parsed once at the API edge.
///
/// `name` is the key metadata stores use; `rpc` is where the segment's engine answers
/// handshakes in P2P mode (the name itself, `MC_HANDSHAKE_PORT` when it has no port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentId {
    name: String,
    rpc: HostPort,
}

impl SegmentId {
    /// Parses a segment name; `default_port` fills a missing port.
    pub fn parse(name: &str, default_port: u16) -> Result<Self, WireError> {
        Ok(Self {
            name: name.to_string(),
            rpc: HostPort::parse(name, default_port)?,
        })
    }

    /// The name as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Host and handshake port of the segment's engine.
    pub fn rpc(&self) -> &HostPort {
        &self.rpc
    }
}

impl std::fmt::Display for SegmentId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

fn parse_port(s: &str) -> Option<u16> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `[host]` for IPv6 literals (with or without a `%scope`), `host` otherwise.
pub fn wrap_ipv6(host: &str) -> String {
    let addr_part = host.split('%').next().unwrap_or(host);
    if addr_part.parse::<Ipv6Addr>().is_ok() {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, reason = "tests index known-good data")]
mod tests {
    use super::*;

    fn hp(h: &str, p: u16) -> HostPort {
        HostPort {
            host: h.into(),
            port: p,
        }
    }

    #[test]
    fn parses_every_upstream_form() {
        assert_eq!(
            HostPort::parse("10.0.0.1:15001", 12001).unwrap(),
            hp("10.0.0.1", 15001)
        );
        assert_eq!(
            HostPort::parse("node-a", 12001).unwrap(),
            hp("node-a", 12001)
        );
        assert_eq!(
            HostPort::parse("[::1]:16000", 12001).unwrap(),
            hp("::1", 16000)
        );
        assert_eq!(
            HostPort::parse("[fe80::1]", 12001).unwrap(),
            hp("fe80::1", 12001)
        );
        assert_eq!(
            HostPort::parse("fe80::1", 12001).unwrap(),
            hp("fe80::1", 12001)
        );
        assert_eq!(
            HostPort::parse("fe80::1%eth0:15000", 12001).unwrap(),
            hp("fe80::1%eth0", 15000)
        );
    }

    #[test]
    fn session_ids_bracket_ipv6() {
        assert_eq!(hp("::1", 5).session_id(), "[::1]:5");
        assert_eq!(hp("fe80::1%eth0", 5).session_id(), "[fe80::1%eth0]:5");
        assert_eq!(hp("127.0.0.1", 5).session_id(), "127.0.0.1:5");
    }

    #[test]
    fn rejects_malformed_names() {
        for bad in [
            "",
            "host:",
            "host:99999",
            "host:1x",
            "[::1",
            "[::1]x",
            "[]:5",
            ":5",
        ] {
            assert!(HostPort::parse(bad, 1).is_err(), "{bad}");
        }
    }
}
