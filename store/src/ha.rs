//! Master high availability on etcd (`--enable_ha`): several masters, one leader, and no
//! consensus of our own. etcd already is one, so the election is a single key,
//! `mooncake-store/{cluster_id}/master`, whose value is the leader's RPC address. A master
//! leads while it holds that key under a lease it keeps alive; the key goes with the lease
//! when the leader dies, and a standby watching the key takes it with a transaction that
//! only succeeds while the key does not exist.
//!
//! Safety rests on time, as with every lease: a leader declares its leadership lost once a
//! full lease TTL has passed since the last renewal etcd confirmed (counted from when that
//! renewal was sent, which is no later than when etcd restarted the lease's clock), so by
//! the time a standby can win, the old leader has already been told to stop. Being told
//! is not having stopped (a process frozen past its lease runs its queued requests before
//! its timers when it wakes), so the leader's RPC service also asks a [`LeaseFence`] on
//! every call, which reads the same clock and refuses once it has run out.
//!
//! Clients name an HA master as `etcd://h1:2379;h2:2379` ([`parse_etcd_master`]) and ask
//! [`current_leader`] for its address, again after an RPC to it fails.

use std::sync::Arc;
use std::time::Duration;

use mooncake_etcd::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetResponse, LeaseKeepAliveStream,
    LeaseKeeper, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions, WatchStream,
};
use tokio::sync::watch;
use tokio::time::Instant;

/// The lease TTL masters use unless told otherwise: a dead leader is replaced within it.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(5);

/// How long the first contact with etcd may take before [`campaign`] gives up, and the
/// bound on each later operation (upstream's etcd timeout).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A standby reads the key this often in case its watch missed the deletion (a watch
/// broken by an etcd restart, or one whose start revision was compacted away).
const POLL: Duration = Duration::from_secs(1);

/// The key whose value names the leader of `cluster_id`.
pub fn leader_key(cluster_id: &str) -> String {
    format!("mooncake-store/{cluster_id}/master")
}

/// Why an HA operation failed, worded for the operator who has to fix it.
#[derive(Debug, thiserror::Error)]
pub enum HaError {
    #[error("no etcd endpoints given: pass --etcd_endpoints host:port[;host:port...] (or name the master as etcd://host:port[;host:port...])")]
    NoEndpoints,
    #[error(
        "etcd endpoint {endpoint:?}: {problem} (--etcd_endpoints takes host:port, `;`-separated)"
    )]
    BadEndpoint {
        endpoint: String,
        problem: EndpointProblem,
    },
    #[error("cannot reach etcd at {endpoints} within {}: is etcd running? (--etcd_endpoints); last error: {last}", secs(*.within))]
    Unreachable {
        endpoints: String,
        within: Duration,
        #[source]
        last: LastAttempt,
    },
    #[error("etcd at {endpoints} refused {op}: {}", describe(.source))]
    Refused {
        endpoints: String,
        op: String,
        source: mooncake_etcd::Error,
    },
    #[error("etcd at {endpoints}: the leader key {key} holds a value that is not UTF-8 text; delete it (etcdctl del {key}) and restart the masters")]
    BadValue { endpoints: String, key: String },
}

/// What is wrong with an etcd endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EndpointProblem {
    #[error("only plain http etcd endpoints are supported; give host:port")]
    NotHttp,
    #[error("give host:port")]
    NotHostPort,
    #[error("the host is missing")]
    NoHost,
    #[error("the port is not a number from 1 to 65535")]
    BadPort,
}

/// How the last try to reach etcd failed.
#[derive(Debug, thiserror::Error)]
pub enum LastAttempt {
    /// Connecting failed.
    #[error("{}", describe(.0))]
    Connect(#[source] mooncake_etcd::Error),
    /// An operation failed in a way worth trying again.
    #[error("{what}: {}", describe(.source))]
    Failed {
        what: String,
        source: mooncake_etcd::Error,
    },
    /// An operation got no answer in time.
    #[error("{what}: no answer")]
    NoAnswer { what: String },
}

fn secs(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

/// The etcd endpoints of a master named `etcd://h1:2379;h2:2379` (`,` also separates),
/// or `None` when `addr` names a master directly.
pub fn parse_etcd_master(addr: &str) -> Option<Vec<String>> {
    let addr = addr.trim();
    let scheme = addr.get(..7)?;
    if !scheme.eq_ignore_ascii_case("etcd://") {
        return None;
    }
    Some(split_endpoints(&addr[7..]))
}

/// The endpoints of an `--etcd_endpoints` list (`;` or `,` separated; empty pieces of a
/// trailing separator are dropped). An empty result makes [`campaign`] and
/// [`current_leader`] fail with [`HaError::NoEndpoints`].
pub fn split_endpoints(list: &str) -> Vec<String> {
    list.split([';', ','])
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .collect()
}

/// `host:port` (or `http://host:port`; the port defaults to etcd's 2379) as the URL the
/// client dials. TLS is not built in, so `https://` is refused rather than tried in clear.
fn endpoint_url(endpoint: &str) -> Result<String, HaError> {
    let bad = |problem| HaError::BadEndpoint {
        endpoint: endpoint.to_string(),
        problem,
    };
    let hp = endpoint.strip_prefix("http://").unwrap_or(endpoint);
    let hp = hp.trim_end_matches('/');
    if hp.contains("://") {
        return Err(bad(EndpointProblem::NotHttp));
    }
    if hp.contains('/') || hp.is_empty() {
        return Err(bad(EndpointProblem::NotHostPort));
    }
    // A bracketed IPv6 address has colons of its own; the port follows the bracket.
    let after_host = hp.rfind(']').map_or(hp, |i| &hp[i..]);
    match hp.rsplit_once(':') {
        Some((host, port)) if after_host.contains(':') => {
            if host.is_empty() {
                return Err(bad(EndpointProblem::NoHost));
            }
            if port.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(bad(EndpointProblem::BadPort));
            }
            Ok(format!("http://{hp}"))
        }
        _ => Ok(format!("http://{hp}:2379")),
    }
}

/// A client of one etcd cluster, with the endpoint list for messages.
#[derive(Clone)]
struct Etcd {
    client: Client,
    label: String,
}

/// Whether retrying can help: the server was not reached, or answered "not now".
fn transient(e: &mooncake_etcd::Error) -> bool {
    use mooncake_etcd::Error as E;
    match e {
        E::TransportError(_) | E::WatchError(_) => true,
        E::GRpcStatus(s) => matches!(
            s.code(),
            tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Unknown
                | tonic::Code::Cancelled
                | tonic::Code::Aborted
                | tonic::Code::ResourceExhausted
        ),
        _ => false,
    }
}

/// The cause of a client error in a line: tonic's own rendering of a failed connection
/// spells out the whole source chain in Debug form; the message and the innermost cause
/// ("Connection refused (os error 111)") are what an operator needs.
fn describe(e: &mooncake_etcd::Error) -> String {
    let mooncake_etcd::Error::GRpcStatus(status) = e else {
        return e.to_string();
    };
    let mut innermost = None;
    let mut next = std::error::Error::source(status);
    while let Some(cause) = next {
        innermost = Some(cause);
        next = cause.source();
    }
    match innermost {
        Some(cause) => format!("{}: {cause}", status.message()),
        None => format!("{:?}: {}", status.code(), status.message()),
    }
}

impl Etcd {
    /// Builds the client; nothing is dialled yet (the first operation does that, which is
    /// where an unreachable etcd shows).
    async fn connect(endpoints: &[String], timeout: Duration) -> Result<Self, HaError> {
        if endpoints.is_empty() {
            return Err(HaError::NoEndpoints);
        }
        let urls = endpoints
            .iter()
            .map(|e| endpoint_url(e.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        let label = endpoints.join(";");
        let opts = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout);
        let client = Client::connect(urls, Some(opts))
            .await
            .map_err(|e| HaError::Unreachable {
                endpoints: label.clone(),
                within: timeout,
                last: LastAttempt::Connect(e),
            })?;
        Ok(Self { client, label })
    }

    /// Runs the operation `make` builds until it succeeds, fails for good, or `within`
    /// has passed: a dead endpoint of a list fails a call now and then until the balancer
    /// stops choosing it, and an etcd that is starting answers "unavailable" for a while.
    async fn op<T, F>(
        &self,
        what: &str,
        within: Duration,
        make: impl Fn(Client) -> F,
    ) -> Result<T, HaError>
    where
        F: std::future::Future<Output = Result<T, mooncake_etcd::Error>>,
    {
        let deadline = Instant::now() + within;
        let mut pause = Duration::from_millis(20);
        loop {
            let last = match tokio::time::timeout_at(deadline, make(self.client.clone())).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if !transient(&e) => {
                    return Err(HaError::Refused {
                        endpoints: self.label.clone(),
                        op: what.to_string(),
                        source: e,
                    })
                }
                Ok(Err(source)) => LastAttempt::Failed {
                    what: what.to_string(),
                    source,
                },
                Err(_) => LastAttempt::NoAnswer {
                    what: what.to_string(),
                },
            };
            if Instant::now() + pause >= deadline {
                return Err(HaError::Unreachable {
                    endpoints: self.label.clone(),
                    within,
                    last,
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    async fn get(&self, key: &str, within: Duration) -> Result<GetResponse, HaError> {
        self.op(&format!("GET {key}"), within, |mut c| async move {
            c.get(key, None).await
        })
        .await
    }

    /// The leader named by a GET of the key, with the lease holding it.
    fn holder(&self, key: &str, resp: &GetResponse) -> Result<Option<(String, i64)>, HaError> {
        match resp.kvs().first() {
            None => Ok(None),
            Some(kv) => match kv.value_str() {
                Ok(v) => Ok(Some((v.to_string(), kv.lease()))),
                Err(_) => Err(HaError::BadValue {
                    endpoints: self.label.clone(),
                    key: key.to_string(),
                }),
            },
        }
    }

    async fn revoke(&self, lease: i64) {
        let mut c = self.client.clone();
        if let Ok(Err(e)) = tokio::time::timeout(CONNECT_TIMEOUT, c.lease_revoke(lease)).await {
            tracing::debug!("etcd {}: revoking lease {lease:x}: {e}", self.label);
        }
    }

    async fn watch_from(&self, key: &str, revision: i64) -> Option<WatchStream> {
        let mut c = self.client.clone();
        let opts = WatchOptions::new().with_start_revision(revision);
        match tokio::time::timeout(CONNECT_TIMEOUT, c.watch(key, Some(opts))).await {
            Ok(Ok(w)) => Some(w),
            Ok(Err(e)) => {
                tracing::debug!("etcd {}: watch {key}: {e}", self.label);
                None
            }
            Err(_) => None,
        }
    }
}

/// The leader's RPC address for `cluster_id`, or `None` while no master leads (between a
/// leader's death and a standby's election, or when no master runs with `--enable_ha`).
pub async fn current_leader(
    endpoints: &[String],
    cluster_id: &str,
    timeout: Duration,
) -> Result<Option<String>, HaError> {
    let etcd = Etcd::connect(endpoints, timeout).await?;
    let key = leader_key(cluster_id);
    let resp = etcd.get(&key, timeout).await?;
    Ok(etcd.holder(&key, &resp)?.map(|(addr, _)| addr))
}

/// Becomes the leader of `cluster_id` as `my_address`, waiting as a standby for as long as
/// another master leads. Fails only when etcd cannot be reached at the first contact
/// (within [`CONNECT_TIMEOUT`]) or refuses a request; a standby rides out later etcd
/// outages, retrying.
pub async fn campaign(
    endpoints: &[String],
    cluster_id: &str,
    my_address: &str,
    lease_ttl: Duration,
) -> Result<Leadership, HaError> {
    campaign_observing(endpoints, cluster_id, my_address, lease_ttl, |_| {}).await
}

/// [`campaign`], telling `on_leader` the address of each other master seen leading while
/// this one waits (for a standby's `/health`).
pub async fn campaign_observing(
    endpoints: &[String],
    cluster_id: &str,
    my_address: &str,
    lease_ttl: Duration,
    mut on_leader: impl FnMut(&str) + Send,
) -> Result<Leadership, HaError> {
    let etcd = Etcd::connect(endpoints, CONNECT_TIMEOUT).await?;
    let key = leader_key(cluster_id);
    // etcd counts leases in whole seconds; rounding up keeps the caller's lower bound.
    let ttl_secs = i64::try_from(lease_ttl.as_millis().div_ceil(1000))
        .unwrap_or(i64::MAX)
        .max(1);
    let mut first_contact = true;
    let mut last_logged: Option<String> = None;
    loop {
        match attempt(&etcd, &key, my_address, ttl_secs).await {
            Ok(Attempt::Won(l)) => {
                tracing::info!(
                    "elected leader of cluster {cluster_id:?} as {my_address} (etcd {}, lease {:x}, ttl {})",
                    etcd.label,
                    l.lease,
                    secs(l.ttl)
                );
                return Ok(Leadership::start(etcd, key, cluster_id, my_address, l));
            }
            Ok(Attempt::Standby { leader, revision }) => {
                first_contact = false;
                on_leader(&leader);
                if last_logged.as_deref() != Some(leader.as_str()) {
                    tracing::info!(
                        "standby: leader is {leader} (cluster {cluster_id:?}, etcd {})",
                        etcd.label
                    );
                    last_logged = Some(leader);
                }
                wait_vacant(&etcd, &key, revision).await;
            }
            Err(e @ (HaError::BadValue { .. } | HaError::Refused { .. })) => return Err(e),
            Err(e) if first_contact => return Err(e),
            Err(e) => {
                tracing::warn!("standby of cluster {cluster_id:?}: {e}; retrying");
                tokio::time::sleep(POLL).await;
            }
        }
    }
}

/// A won election: the lease, the TTL etcd granted, when the grant was sent, and the
/// revision of the transaction that wrote the key.
struct Won {
    lease: i64,
    ttl: Duration,
    granted_at: Instant,
    revision: i64,
}

enum Attempt {
    Won(Won),
    /// Someone else leads; `revision` is the one after which to watch for the key's end.
    Standby {
        leader: String,
        revision: i64,
    },
}

async fn attempt(etcd: &Etcd, key: &str, me: &str, ttl_secs: i64) -> Result<Attempt, HaError> {
    // Read first so that standbys do not grant a lease every time they look.
    let resp = etcd.get(key, CONNECT_TIMEOUT).await?;
    if let Some((leader, _)) = etcd.holder(key, &resp)? {
        return Ok(Attempt::Standby {
            leader,
            revision: resp.header().map_or(0, |h| h.revision()),
        });
    }
    let granted_at = Instant::now();
    let grant = etcd
        .op("lease grant", CONNECT_TIMEOUT, |mut c| async move {
            c.lease_grant(ttl_secs, None).await
        })
        .await?;
    let lease = grant.id();
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            me,
            Some(PutOptions::new().with_lease(lease)),
        )])
        .or_else([TxnOp::get(key, None)]);
    // Retrying is safe: if an earlier try was applied and only its answer lost, the
    // retry's comparison fails and its read shows the key under our own lease.
    let resp = match etcd
        .op("campaign transaction", CONNECT_TIMEOUT, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    {
        Ok(r) => r,
        Err(e) => {
            etcd.revoke(lease).await;
            return Err(e);
        }
    };
    let revision = resp.header().map_or(0, |h| h.revision());
    let holder = resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => etcd.holder(key, &g).ok().flatten(),
        _ => None,
    });
    let ours = matches!(&holder, Some((_, l)) if *l == lease);
    if resp.succeeded() || ours {
        return Ok(Attempt::Won(Won {
            lease,
            ttl: Duration::from_secs(u64::try_from(grant.ttl()).unwrap_or(1).max(1)),
            granted_at,
            revision,
        }));
    }
    // Another master won between our read and our transaction.
    etcd.revoke(lease).await;
    let leader = holder.map_or_else(|| "(gone already)".to_string(), |(addr, _)| addr);
    Ok(Attempt::Standby { leader, revision })
}

/// Returns once the key is gone: at the deletion event of a watch from `revision + 1`
/// (so nothing between our read and the watch is missed), or at a poll that finds no key.
async fn wait_vacant(etcd: &Etcd, key: &str, revision: i64) {
    let mut next = revision + 1;
    let mut watch = etcd.watch_from(key, next).await;
    let mut failing = false;
    loop {
        tokio::select! {
            m = next_event(&mut watch) => match m {
                Some(resp) if resp.canceled() => watch = None,
                Some(resp) => {
                    for ev in resp.events() {
                        if ev.event_type() == EventType::Delete {
                            return;
                        }
                        if let Some(kv) = ev.kv() {
                            next = kv.mod_revision() + 1;
                        }
                    }
                }
                None => watch = None,
            },
            () = tokio::time::sleep(POLL) => {
                match etcd.get(key, CONNECT_TIMEOUT).await {
                    Ok(resp) => {
                        if failing {
                            tracing::info!("standby: etcd {} answers again", etcd.label);
                            failing = false;
                        }
                        if resp.kvs().is_empty() {
                            return;
                        }
                        if watch.is_none() {
                            let rev = resp.header().map_or(next - 1, |h| h.revision());
                            next = next.max(rev + 1);
                            watch = etcd.watch_from(key, next).await;
                        }
                    }
                    Err(e) => {
                        if !failing {
                            tracing::warn!("standby: {e}; still waiting for the leader key to go");
                            failing = true;
                        }
                    }
                }
            }
        }
    }
}

/// The next response of a watch; `None` when it ended or failed, and never while there is
/// no watch (the poll stands in).
async fn next_event(watch: &mut Option<WatchStream>) -> Option<mooncake_etcd::WatchResponse> {
    match watch {
        Some(w) => w.message().await.ok().flatten(),
        None => std::future::pending().await,
    }
}

/// This master leads. A task on the runtime that ran [`campaign`] renews the lease every
/// third of its TTL and watches the key; [`Leadership::lost`] completes when either fails.
/// Dropping it stops the renewals (the key expires with the lease, as if the process
/// died); [`Leadership::resign`] hands over at once.
pub struct Leadership {
    etcd: Etcd,
    cluster_id: String,
    address: String,
    lease: i64,
    ttl: Duration,
    lost: watch::Receiver<Option<String>>,
    fence: LeaseFence,
    guard: tokio::task::JoinHandle<()>,
}

/// Whether a leadership still holds, by the lease's clock alone: until the last confirmed
/// renewal's send time plus the TTL, etcd keeps the key and no standby can have won.
/// Asking takes no I/O, so the RPC service asks on every call.
#[derive(Clone, Debug)]
pub struct LeaseFence(Arc<parking_lot::Mutex<Option<Instant>>>);

impl LeaseFence {
    fn until(until: Instant) -> Self {
        Self(Arc::new(parking_lot::Mutex::new(Some(until))))
    }

    /// True while the lease certainly holds.
    pub fn holds(&self) -> bool {
        matches!(*self.0.lock(), Some(until) if Instant::now() < until)
    }

    fn extend(&self, until: Instant) {
        let mut g = self.0.lock();
        if let Some(u) = g.as_mut() {
            *u = until.max(*u);
        }
    }

    fn revoke(&self) {
        *self.0.lock() = None;
    }
}

impl Leadership {
    fn start(etcd: Etcd, key: String, cluster_id: &str, address: &str, won: Won) -> Self {
        let (tx, rx) = watch::channel(None);
        let (lease, ttl) = (won.lease, won.ttl);
        let fence = LeaseFence::until(won.granted_at + won.ttl);
        let guard = tokio::spawn(guard(
            etcd.clone(),
            key,
            cluster_id.to_string(),
            won,
            tx,
            fence.clone(),
        ));
        Self {
            etcd,
            cluster_id: cluster_id.to_string(),
            address: address.to_string(),
            lease,
            ttl,
            lost: rx,
            fence,
            guard,
        }
    }

    /// The fence of this leadership: stops holding at the lease's end by its own clock,
    /// and at once when the leadership is lost or resigned.
    pub fn fence(&self) -> LeaseFence {
        self.fence.clone()
    }

    /// The address this master leads as (the leader key's value).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The etcd lease holding the leader key.
    pub fn lease_id(&self) -> i64 {
        self.lease
    }

    /// The TTL etcd granted (the one asked for, rounded up to whole seconds and to etcd's
    /// minimum).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Completes when this master no longer leads: no renewal was confirmed for a whole
    /// TTL, etcd reported the lease gone, or the key was deleted or overwritten. The
    /// master must stop serving then; a standby may already be taking over.
    pub async fn lost(&self) {
        let mut rx = self.lost.clone();
        // An error means the renewal task is gone (its runtime shut down): no renewals
        // any more, which is a loss too.
        let _ = rx.wait_for(Option::is_some).await;
    }

    /// Why the leadership was lost, once [`Leadership::lost`] has completed.
    pub fn why_lost(&self) -> Option<String> {
        if let Some(why) = self.lost.borrow().clone() {
            return Some(why);
        }
        match self.lost.has_changed() {
            Err(_) => Some("the lease renewal task stopped".to_string()),
            Ok(_) => None,
        }
    }

    /// Steps down: revokes the lease, which deletes the key at once, so a standby takes
    /// over without waiting for the TTL. On an error the lease still expires by itself.
    pub async fn resign(self) -> Result<(), HaError> {
        self.guard.abort();
        self.fence.revoke();
        let lease = self.lease;
        self.etcd
            .op("lease revoke", CONNECT_TIMEOUT, |mut c| async move {
                match c.lease_revoke(lease).await {
                    Ok(_) => Ok(()),
                    // Already expired or revoked: the key is gone either way.
                    Err(e) if lease_not_found(&e) => Ok(()),
                    Err(e) => Err(e),
                }
            })
            .await?;
        tracing::info!(
            "resigned the leadership of cluster {:?} ({})",
            self.cluster_id,
            self.address
        );
        Ok(())
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.guard.abort();
        self.fence.revoke();
    }
}

fn lease_not_found(e: &mooncake_etcd::Error) -> bool {
    match e {
        mooncake_etcd::Error::LeaseKeepAliveError(m) => m.contains("not found"),
        mooncake_etcd::Error::GRpcStatus(s) => s.code() == tonic::Code::NotFound,
        _ => false,
    }
}

/// Holds the leadership until it is lost, then says why and drops the lease.
async fn guard(
    etcd: Etcd,
    key: String,
    cluster_id: String,
    won: Won,
    tx: watch::Sender<Option<String>>,
    fence: LeaseFence,
) {
    let why = hold(&etcd, &key, &won, &fence).await;
    fence.revoke();
    tracing::warn!("lost the leadership of cluster {cluster_id:?}: {why}");
    tx.send_replace(Some(why));
    // Whatever is left of the lease would only delay nobody; drop it while we are here.
    etcd.revoke(won.lease).await;
}

/// Renews and watches until the leadership is lost; returns why.
async fn hold(etcd: &Etcd, key: &str, won: &Won, fence: &LeaseFence) -> String {
    let every = won.ttl / 3;
    // The lease lives at least until `confirmed + ttl`: etcd restarts its clock when it
    // receives a renewal, which is after we sent it.
    let mut confirmed = won.granted_at;
    let mut keeper: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    let mut next = won.revision + 1;
    let mut watch = etcd.watch_from(key, next).await;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let expiry = confirmed + won.ttl;
        tokio::select! {
            // First, so that a renewal answered after the expiry cannot hide it.
            biased;
            () = tokio::time::sleep_until(expiry) => {
                return format!(
                    "etcd {} confirmed no lease renewal for {} (the lease TTL)",
                    etcd.label,
                    secs(won.ttl)
                );
            }
            m = next_event(&mut watch) => match m {
                Some(resp) if resp.canceled() => watch = None,
                Some(resp) => {
                    for ev in resp.events() {
                        if ev.event_type() == EventType::Delete {
                            return format!("the leader key {key} was deleted");
                        }
                        if let Some(kv) = ev.kv() {
                            if kv.lease() != won.lease {
                                let by = kv.value_str().unwrap_or("?");
                                return format!("the leader key {key} was overwritten (now {by})");
                            }
                            next = kv.mod_revision() + 1;
                        }
                    }
                }
                None => watch = None,
            },
            _ = tick.tick() => {
                let sent = Instant::now();
                let bound = (sent + every).min(expiry);
                match tokio::time::timeout_at(bound, renew(etcd, &mut keeper, won.lease)).await {
                    Ok(Ok(true)) => {
                        confirmed = sent;
                        fence.extend(confirmed + won.ttl);
                    }
                    Ok(Ok(false)) => return "etcd reports the lease expired".to_string(),
                    Ok(Err(e)) => {
                        tracing::warn!("etcd {}: lease renewal failed: {e}", etcd.label);
                        keeper = None;
                    }
                    Err(_) => {
                        tracing::warn!("etcd {}: lease renewal not answered in time", etcd.label);
                        keeper = None;
                    }
                }
                // The watch may be broken without our knowing; a read settles it.
                let mut c = etcd.client.clone();
                let bound = (Instant::now() + every).min(confirmed + won.ttl);
                if let Ok(Ok(resp)) = tokio::time::timeout_at(bound, c.get(key, None)).await {
                    match resp.kvs().first() {
                        None => return format!("the leader key {key} was deleted"),
                        Some(kv) if kv.lease() != won.lease => {
                            let by = kv.value_str().unwrap_or("?");
                            return format!("the leader key {key} was overwritten (now {by})");
                        }
                        Some(_) => {}
                    }
                    if watch.is_none() {
                        let rev = resp.header().map_or(next - 1, |h| h.revision());
                        next = next.max(rev + 1);
                        watch = etcd.watch_from(key, next).await;
                    }
                }
            }
        }
    }
}

/// One renewal: `Ok(false)` when etcd says the lease no longer exists. The keep-alive
/// stream is opened on demand (opening it is itself a renewal) and dropped on failure.
async fn renew(
    etcd: &Etcd,
    keeper: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    lease: i64,
) -> Result<bool, mooncake_etcd::Error> {
    if let Some((k, s)) = keeper.as_mut() {
        k.keep_alive().await?;
        return match s.message().await? {
            Some(r) => Ok(r.ttl() > 0),
            None => Err(mooncake_etcd::Error::LeaseKeepAliveError(
                "the keep-alive stream ended".into(),
            )),
        };
    }
    let mut c = etcd.client.clone();
    match c.lease_keep_alive(lease).await {
        Ok(ks) => {
            *keeper = Some(ks);
            Ok(true)
        }
        Err(e) if lease_not_found(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_master_addresses() {
        let eps = |v: &[&str]| Some(v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(parse_etcd_master("etcd://h1:2379"), eps(&["h1:2379"]));
        assert_eq!(
            parse_etcd_master("etcd://h1:2379;h2:2379"),
            eps(&["h1:2379", "h2:2379"])
        );
        assert_eq!(
            parse_etcd_master("etcd://h1:2379,h2:2379, h3:1 ;"),
            eps(&["h1:2379", "h2:2379", "h3:1"])
        );
        assert_eq!(parse_etcd_master(" ETCD://h:1 "), eps(&["h:1"]));
        assert_eq!(parse_etcd_master("etcd://"), eps(&[]));
        assert_eq!(parse_etcd_master("127.0.0.1:50051"), None);
        assert_eq!(parse_etcd_master("http://h:2379"), None);
        assert_eq!(parse_etcd_master("etcd:/h:2379"), None);
        assert_eq!(parse_etcd_master("etc"), None);
        assert_eq!(parse_etcd_master(""), None);
    }

    #[test]
    fn endpoints_become_urls() {
        assert_eq!(endpoint_url("h:2379").unwrap(), "http://h:2379");
        assert_eq!(endpoint_url("http://h:1/").unwrap(), "http://h:1");
        assert_eq!(endpoint_url("h").unwrap(), "http://h:2379");
        assert_eq!(endpoint_url("[::1]:2380").unwrap(), "http://[::1]:2380");
        assert_eq!(endpoint_url("[::1]").unwrap(), "http://[::1]:2379");
        use EndpointProblem as P;
        for (bad, problem) in [
            ("https://h:2379", P::NotHttp),
            ("h:x", P::BadPort),
            ("h:0", P::BadPort),
            ("h:70000", P::BadPort),
            (":2379", P::NoHost),
            ("h:1/x", P::NotHostPort),
            ("", P::NotHostPort),
        ] {
            let e = endpoint_url(bad).unwrap_err();
            assert!(
                matches!(&e, HaError::BadEndpoint { problem: p, .. } if *p == problem),
                "{bad}: {e:?}"
            );
            assert!(e.to_string().contains("--etcd_endpoints"), "{bad}: {e}");
        }
    }

    #[test]
    fn keys_and_messages() {
        assert_eq!(leader_key("c1"), "mooncake-store/c1/master");
        let e = HaError::Unreachable {
            endpoints: "h:1;h:2".into(),
            within: Duration::from_secs(5),
            last: LastAttempt::NoAnswer {
                what: "GET k".into(),
            },
        };
        assert_eq!(
            e.to_string(),
            "cannot reach etcd at h:1;h:2 within 5 s: is etcd running? (--etcd_endpoints); last error: GET k: no answer"
        );
        assert_eq!(secs(Duration::from_millis(1500)), "1.5 s");
    }

    #[tokio::test]
    async fn no_endpoints_is_refused_before_dialling() {
        let e = current_leader(&[], "c", Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(e, HaError::NoEndpoints), "{e}");
        let e = campaign(&["h:x".into()], "c", "me:1", DEFAULT_LEASE_TTL)
            .await
            .err()
            .unwrap();
        assert!(matches!(e, HaError::BadEndpoint { .. }), "{e}");
    }
}
