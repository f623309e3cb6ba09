//! The address an engine joined to a metadata store tells its peers (its `rpc_meta` host
//! and TCP data host).
//!
//! With a store the segment name is any unique string (`mc-prefill-1a2b`: a pod or role
//! name) that peers never resolve; they connect to the published address. Upstream
//! publishes `MC_TCP_BIND_ADDRESS`, else the first up non-loopback IPv4 address of the
//! host. So do we, except where the name itself says which address of this host it means:
//! an IP literal is published as given (a multi-homed host's chosen interface), a name that
//! resolves to an address of this host as that address (a pod's name, through its
//! `/etc/hosts`, is its pod IP; `localhost` is loopback).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::config::Config;
use crate::net;
use crate::sys::{self, InterfaceAddr};

/// Why an address was chosen; said in the log line of every engine that joins a store.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reason {
    BindAddress,
    NameIsAnAddress,
    NameResolvesHere,
    /// The interface the address belongs to; what the name resolved to, if anything.
    FirstInterface {
        interface: String,
        name_resolved_to: Vec<IpAddr>,
    },
    LoopbackOnly,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::BindAddress => f.write_str("MC_TCP_BIND_ADDRESS"),
            Reason::NameIsAnAddress => f.write_str("the name is an address of this host"),
            Reason::NameResolvesHere => f.write_str("the name resolves to it"),
            Reason::FirstInterface {
                interface,
                name_resolved_to,
            } => {
                write!(f, "the first up non-loopback address, of {interface}")?;
                if name_resolved_to.is_empty() {
                    f.write_str("; the name resolves to nothing")
                } else {
                    write!(
                        f,
                        "; the name resolves to {name_resolved_to:?}, no address of this host"
                    )
                }
            }
            Reason::LoopbackOnly => f.write_str(
                "this host has no up non-loopback address: only engines on this host can reach it",
            ),
        }
    }
}

/// The host an engine named `local_hostname` (host part `name_host`) publishes, said in a
/// log line with the reason: a warning when only engines of this host can reach it.
pub(super) fn announce(local_hostname: &str, name_host: &str, config: &Config) -> String {
    let (ip, why) = published(name_host, config);
    let line = format!(
        "segment {local_hostname:?}: peers reach it at {ip} ({why}; MC_TCP_BIND_ADDRESS chooses another)"
    );
    if why == Reason::LoopbackOnly {
        tracing::warn!("{line}");
    } else {
        tracing::info!("{line}");
    }
    ip.to_string()
}

/// The address to publish for an engine whose name's host part is `name_host`, and why.
fn published(name_host: &str, config: &Config) -> (IpAddr, Reason) {
    let interfaces = sys::interface_addresses().unwrap_or_else(|e| {
        tracing::warn!("cannot list this host's network interfaces (getifaddrs): {e}");
        Vec::new()
    });
    let resolve = |host: &str| {
        net::resolve(host, 0, config.use_ipv6)
            .map(|addrs| addrs.iter().map(std::net::SocketAddr::ip).collect())
            .unwrap_or_default()
    };
    choose(
        name_host,
        config.tcp_bind_address,
        config.use_ipv6,
        resolve,
        &interfaces,
    )
}

/// [`published`] over given interfaces and a given resolver.
fn choose(
    name_host: &str,
    bind: Option<IpAddr>,
    ipv6: bool,
    resolve: impl FnOnce(&str) -> Vec<IpAddr>,
    interfaces: &[InterfaceAddr],
) -> (IpAddr, Reason) {
    if let Some(ip) = bind.filter(|ip| !ip.is_unspecified()) {
        return (ip, Reason::BindAddress);
    }
    let resolved = match name_host.parse::<IpAddr>() {
        Ok(ip) if !ip.is_unspecified() => return (ip, Reason::NameIsAnAddress),
        // A wildcard names no address: nothing to resolve.
        Ok(_) => Vec::new(),
        Err(_) => resolve(name_host),
    };
    let on_an_interface = |ip: &&IpAddr| interfaces.iter().any(|a| a.ip == **ip);
    let here = resolved
        .iter()
        .filter(|ip| !ip.is_loopback())
        .find(on_an_interface)
        .or_else(|| resolved.iter().find(|ip| ip.is_loopback()));
    if let Some(ip) = here {
        return (*ip, Reason::NameResolvesHere);
    }
    let usable = |a: &&InterfaceAddr| a.up && !a.loopback && !a.ip.is_unspecified();
    let v4 = interfaces.iter().filter(usable).find(|a| a.ip.is_ipv4());
    // IPv6 link-local addresses need a scope a peer cannot know.
    let v6 = interfaces
        .iter()
        .filter(usable)
        .find(|a| matches!(a.ip, IpAddr::V6(v6) if !v6.is_unicast_link_local()));
    let first = if ipv6 { v6.or(v4) } else { v4.or(v6) };
    if let Some(a) = first {
        let reason = Reason::FirstInterface {
            interface: a.interface.clone(),
            name_resolved_to: resolved,
        };
        return (a.ip, reason);
    }
    let loopback = if ipv6 {
        IpAddr::V6(Ipv6Addr::LOCALHOST)
    } else {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    };
    (loopback, Reason::LoopbackOnly)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(interface: &str, ip: &str, up: bool) -> InterfaceAddr {
        let ip: IpAddr = ip.parse().unwrap();
        InterfaceAddr {
            interface: interface.into(),
            ip,
            up,
            loopback: ip.is_loopback(),
        }
    }

    fn host() -> Vec<InterfaceAddr> {
        vec![
            iface("lo", "127.0.0.1", true),
            iface("lo", "::1", true),
            iface("eth9", "10.9.0.2", false),
            iface("eth0", "fe80::1", true),
            iface("eth0", "2001:db8::5", true),
            iface("eth0", "192.0.2.7", true),
            iface("eth1", "198.51.100.3", true),
        ]
    }

    fn no_name(_: &str) -> Vec<IpAddr> {
        Vec::new()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_plain_name_gets_the_first_up_non_loopback_ipv4_address() {
        let (got, why) = choose("mc-prefill-1a2b", None, false, no_name, &host());
        assert_eq!(got, ip("192.0.2.7"));
        assert_eq!(
            why,
            Reason::FirstInterface {
                interface: "eth0".into(),
                name_resolved_to: vec![]
            }
        );
        let (got, _) = choose("mc-prefill-1a2b", None, true, no_name, &host());
        assert_eq!(got, ip("2001:db8::5"), "MC_USE_IPV6: a global IPv6 address");
    }

    #[test]
    fn the_bind_address_wins_over_everything() {
        let bind = Some(ip("198.51.100.3"));
        let (got, why) = choose("10.1.1.1", bind, false, no_name, &host());
        assert_eq!((got, why), (ip("198.51.100.3"), Reason::BindAddress));
        let (got, _) = choose("n", Some(ip("0.0.0.0")), false, no_name, &host());
        assert_eq!(got, ip("192.0.2.7"), "a wildcard bind address says nothing");
    }

    #[test]
    fn an_address_as_name_is_published_as_given() {
        let (got, why) = choose("198.51.100.3", None, false, no_name, &host());
        assert_eq!((got, why), (ip("198.51.100.3"), Reason::NameIsAnAddress));
        let (got, _) = choose("0.0.0.0", None, false, no_name, &host());
        assert_eq!(got, ip("192.0.2.7"));
    }

    #[test]
    fn a_name_that_resolves_here_gives_its_address() {
        let pod = |_: &str| vec![ip("127.0.1.1"), ip("198.51.100.3")];
        let (got, why) = choose("pod-7", None, false, pod, &host());
        assert_eq!((got, why), (ip("198.51.100.3"), Reason::NameResolvesHere));
        let localhost = |_: &str| vec![ip("127.0.0.1")];
        let (got, _) = choose("localhost", None, false, localhost, &host());
        assert_eq!(got, ip("127.0.0.1"));
    }

    #[test]
    fn a_name_that_resolves_elsewhere_is_not_published() {
        let elsewhere = |_: &str| vec![ip("203.0.113.9")];
        let (got, why) = choose("other-host", None, false, elsewhere, &host());
        assert_eq!(got, ip("192.0.2.7"));
        assert!(
            why.to_string()
                .contains("resolves to [203.0.113.9], no address of this host"),
            "{why}"
        );
    }

    #[test]
    fn a_host_with_loopback_only_publishes_loopback_and_says_so() {
        let lo = vec![
            iface("lo", "127.0.0.1", true),
            iface("eth0", "192.0.2.7", false),
        ];
        let (got, why) = choose("n", None, false, no_name, &lo);
        assert_eq!((got, why.clone()), (ip("127.0.0.1"), Reason::LoopbackOnly));
        assert!(why.to_string().contains("only engines on this host"));
    }
}
