//! Peers' data hosts given by name, resolved once per [`TTL`] instead of once per batch.
//!
//! A descriptor names its data host as its engine was told (`local_hostname`), and that
//! is a host name wherever a deployment uses names (upstream's own tools default to the
//! machine's). Each batch asked the resolver (`getaddrinfo`: `/etc/hosts` opened and parsed,
//! or a DNS round trip): on the 2-CPU VM that took a 4 KiB write's p50 from 13-23 µs to
//! 30-35 µs; on the 16-CPU host, with names kept, 4 KiB p50 fell to 0.46-0.79x and the
//! serving shape moved 1.03-1.16x (docs/benchmarks.md, issue 12, session 22). Names are
//! re-resolved after [`TTL`], so a peer whose name moves is found again within seconds;
//! failures are not kept, so a name that starts resolving is used at once.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use parking_lot::RwLock;

/// How long a resolved name is used before it is resolved again.
pub const TTL: Duration = Duration::from_secs(10);

/// Names kept at most: descriptors come from the metadata store and peers, so their
/// count is bounded here, not by what they say.
pub const MAX_NAMES: usize = 1024;

/// Host names and the address each resolved to, with when.
#[derive(Default)]
pub struct ResolvedHosts {
    names: RwLock<HashMap<String, (IpAddr, Instant)>>,
}

impl ResolvedHosts {
    /// The address of `host`: the one resolved less than [`TTL`] before `now`, or what
    /// `resolve` gives now (kept when it succeeds).
    pub fn ip_of(
        &self,
        host: &str,
        now: Instant,
        resolve: impl FnOnce() -> io::Result<IpAddr>,
    ) -> io::Result<IpAddr> {
        let fresh = |at: Instant| now.saturating_duration_since(at) < TTL;
        if let Some(&(ip, at)) = self.names.read().get(host) {
            if fresh(at) {
                return Ok(ip);
            }
        }
        let ip = resolve()?;
        let mut names = self.names.write();
        if names.len() >= MAX_NAMES && !names.contains_key(host) {
            names.retain(|_, &mut (_, at)| fresh(at));
            // All fresh: the one resolved longest ago makes room.
            let oldest = names
                .iter()
                .min_by_key(|(_, &(_, at))| at)
                .map(|(name, _)| name.clone());
            if let (true, Some(name)) = (names.len() >= MAX_NAMES, oldest) {
                names.remove(&name);
            }
        }
        names.insert(host.to_string(), (ip, now));
        Ok(ip)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.names.read().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn a_name_is_resolved_once_until_its_time_is_up() {
        let hosts = ResolvedHosts::default();
        let calls = Cell::new(0);
        let resolve = |to: u8| {
            let calls = &calls;
            move || {
                calls.set(calls.get() + 1);
                Ok(ip(to))
            }
        };
        let t0 = Instant::now();
        assert_eq!(hosts.ip_of("peer", t0, resolve(1)).unwrap(), ip(1));
        let almost = t0 + TTL - Duration::from_millis(1);
        assert_eq!(hosts.ip_of("peer", almost, resolve(2)).unwrap(), ip(1));
        assert_eq!(calls.get(), 1);
        // Once the time is up the name is asked for again, and its new address used.
        assert_eq!(hosts.ip_of("peer", t0 + TTL, resolve(2)).unwrap(), ip(2));
        assert_eq!(calls.get(), 2);
        assert_eq!(hosts.ip_of("other", t0 + TTL, resolve(3)).unwrap(), ip(3));
        assert_eq!(calls.get(), 3);
    }

    #[test]
    fn a_failed_resolution_is_not_kept() {
        let hosts = ResolvedHosts::default();
        let t0 = Instant::now();
        let e = hosts
            .ip_of("peer", t0, || {
                Err(io::Error::new(io::ErrorKind::NotFound, "no such host"))
            })
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert_eq!(hosts.ip_of("peer", t0, || Ok(ip(4))).unwrap(), ip(4));
        // An address kept past its time is not used when resolving it again fails.
        let later = t0 + TTL;
        assert!(hosts
            .ip_of("peer", later, || Err(io::Error::other("resolver down")))
            .is_err());
    }

    #[test]
    fn names_kept_stay_bounded_whatever_peers_announce() {
        let hosts = ResolvedHosts::default();
        let t0 = Instant::now();
        for i in 0..MAX_NAMES {
            hosts.ip_of(&format!("old-{i}"), t0, || Ok(ip(1))).unwrap();
        }
        assert_eq!(hosts.len(), MAX_NAMES);
        // Past their time, the old names make room for a new one.
        let later = t0 + TTL;
        hosts.ip_of("new", later, || Ok(ip(2))).unwrap();
        assert_eq!(hosts.len(), 1);
        // All fresh: the one resolved longest ago makes room, the rest stay kept.
        for i in 1..MAX_NAMES {
            let at = later + Duration::from_micros(i as u64);
            hosts.ip_of(&format!("more-{i}"), at, || Ok(ip(3))).unwrap();
        }
        assert_eq!(hosts.len(), MAX_NAMES);
        let at = later + Duration::from_millis(10);
        hosts.ip_of("one-too-many", at, || Ok(ip(4))).unwrap();
        assert_eq!(hosts.len(), MAX_NAMES);
        assert_eq!(
            hosts.ip_of("one-too-many", at, || Ok(ip(5))).unwrap(),
            ip(4)
        );
        assert_eq!(hosts.ip_of("more-1", at, || Ok(ip(6))).unwrap(), ip(3));
        assert_eq!(
            hosts.ip_of("new", at, || Ok(ip(7))).unwrap(),
            ip(7),
            "the oldest went"
        );
    }
}
