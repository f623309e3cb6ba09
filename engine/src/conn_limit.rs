//! How many connections peers may hold open on one of our listeners.
//!
//! A listener that starts a thread per connection is exhausted by anyone who
//! opens connections and sits on them. A [`ConnLimiter`] caps the connections
//! in progress twice over: in total (threads and descriptors are finite) and
//! per peer address (so one address cannot take every slot and lock out the
//! others). The handshake server and the data server each own one.
//!
//! A slot is held by a [`ConnPermit`] and given back when the permit drops, so
//! every way a connection thread can end (return, error, panic) frees it.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;

/// Total and per-address caps on concurrent connections of one listener.
#[derive(Debug)]
pub struct ConnLimiter {
    max_total: usize,
    max_per_ip: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    total: usize,
    per_ip: HashMap<IpAddr, usize>,
}

/// Why a connection was refused a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Every slot of the listener is taken.
    Total {
        /// The cap.
        max: usize,
    },
    /// The peer's address already holds its share.
    PerIp {
        /// The cap.
        max: usize,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Total { max } => write!(f, "all {max} connection slots are taken"),
            Self::PerIp { max } => write!(f, "this address already holds {max} connections"),
        }
    }
}

/// One connection slot; freed on drop.
#[derive(Debug)]
pub struct ConnPermit {
    limiter: Arc<ConnLimiter>,
    ip: IpAddr,
}

impl ConnLimiter {
    /// A limiter allowing `max_total` connections, at most `max_per_ip` from one address.
    pub fn new(max_total: usize, max_per_ip: usize) -> Arc<Self> {
        Arc::new(Self {
            max_total,
            max_per_ip,
            state: Mutex::new(State::default()),
        })
    }

    /// Takes a slot for a connection from `ip`, or says why there is none.
    pub fn try_acquire(self: &Arc<Self>, ip: IpAddr) -> Result<ConnPermit, Refusal> {
        // An IPv4 peer reaching a dual-stack socket shows up as ::ffff:a.b.c.d;
        // count it under its IPv4 address so it cannot double its share.
        let ip = ip.to_canonical();
        let mut st = self.state.lock();
        if st.total >= self.max_total {
            return Err(Refusal::Total {
                max: self.max_total,
            });
        }
        let held = st.per_ip.entry(ip).or_insert(0);
        if *held >= self.max_per_ip {
            return Err(Refusal::PerIp {
                max: self.max_per_ip,
            });
        }
        *held += 1;
        st.total += 1;
        Ok(ConnPermit {
            limiter: self.clone(),
            ip,
        })
    }

    /// Connections holding a slot now.
    pub fn active(&self) -> usize {
        self.state.lock().total
    }
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        let mut st = self.limiter.state.lock();
        st.total = st.total.saturating_sub(1);
        if let Some(n) = st.per_ip.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                // Keep the map as small as the set of connected peers.
                st.per_ip.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn per_ip_cap_bites_before_the_total() {
        let l = ConnLimiter::new(4, 2);
        let a1 = l.try_acquire(ip("10.0.0.1")).unwrap();
        let _a2 = l.try_acquire(ip("10.0.0.1")).unwrap();
        assert_eq!(
            l.try_acquire(ip("10.0.0.1")).unwrap_err(),
            Refusal::PerIp { max: 2 }
        );
        // Another address still gets in.
        let _b = l.try_acquire(ip("10.0.0.2")).unwrap();
        drop(a1);
        let _a3 = l.try_acquire(ip("10.0.0.1")).unwrap();
        assert_eq!(l.active(), 3);
    }

    #[test]
    fn total_cap_bites_and_permits_give_slots_back() {
        let l = ConnLimiter::new(2, 2);
        let p: Vec<_> = ["10.0.0.1", "10.0.0.2"]
            .iter()
            .map(|a| l.try_acquire(ip(a)).unwrap())
            .collect();
        assert_eq!(
            l.try_acquire(ip("10.0.0.3")).unwrap_err(),
            Refusal::Total { max: 2 }
        );
        drop(p);
        assert_eq!(l.active(), 0);
        assert!(l.state.lock().per_ip.is_empty());
        l.try_acquire(ip("10.0.0.3")).unwrap();
    }

    #[test]
    fn mapped_ipv4_counts_as_ipv4() {
        let l = ConnLimiter::new(8, 1);
        let _p = l.try_acquire(ip("127.0.0.2")).unwrap();
        assert!(l.try_acquire(ip("::ffff:127.0.0.2")).is_err());
    }
}
