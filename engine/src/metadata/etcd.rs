//! The etcd v3 store (`etcd://h1:2379,h2:2379`), through our `mooncake-etcd` client (`etcd/`)
//! on a small private tokio runtime (one worker thread) owned by the store.
//!
//! Keys and values are upstream's: `mooncake/[<cluster>/]rpc_meta/<name>` and
//! `mooncake/[<cluster>/]ram/<name>`, compact JSON with a trailing newline. Every key this
//! engine writes is bound to one lease of `MC_METADATA_LEASE_TTL_SEC` (10 s), renewed by a
//! task on the store's runtime every third of that: when the engine dies its keys expire.
//! If the lease is lost anyway (etcd was down longer than the TTL, or restarted without its
//! data), the task grants a new one and writes both keys again once etcd answers.
//!
//! Joining over an existing `rpc_meta` entry of another address probes that engine's
//! handshake port: a live engine keeps its name (initialize fails), a dead one (killed,
//! its lease not yet expired) is replaced at once. Peers see a re-registered engine by the
//! engine's per-submit refresh: a miss or an unreachable peer fetches the descriptor again.
//!
//! Timeouts: 5 s to connect and per operation (upstream's); values larger than the
//! client's 4 MiB message limit are refused by the client.

use std::sync::Arc;
use std::time::Duration;

use mooncake_etcd::{Client, ConnectOptions, PutOptions};
use parking_lot::Mutex;

use super::store_failure::{EndpointError, EtcdAttempt};
use super::{
    check_old_owner, local_engine_joined, local_engine_left, stored_desc, KeySpace, MetadataError,
    MetadataStore, RpcMeta, StoreFailure,
};
use crate::config::Config;
use crate::wire::descriptor::SegmentDesc;
use crate::wire::session::{HostPort, SegmentId};

/// Upstream's dial and per-operation timeout.
pub const OP_TIMEOUT: Duration = Duration::from_secs(5);

/// What this engine has written, to write again under a new lease.
#[derive(Default)]
struct Joined {
    name: String,
    rpc: Option<RpcMeta>,
    rpc_meta: String,
    desc: Option<String>,
    lease: i64,
}

struct Shared {
    client: Client,
    store: String,
    keys: KeySpace,
    ttl: Duration,
    joined: Mutex<Joined>,
}

/// One engine's connection to an etcd cluster.
pub struct EtcdStore {
    rt: Option<tokio::runtime::Runtime>,
    shared: Arc<Shared>,
    config: Config,
    keeper: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

fn store_err(store: &str, cause: StoreFailure) -> MetadataError {
    MetadataError::Store {
        store: store.to_string(),
        cause,
    }
}

/// The endpoints of `etcd://h1:2379,h2:2379` (`,` or `;` separated), as URLs.
pub fn parse_endpoints(list: &str) -> Result<Vec<String>, EndpointError> {
    let mut out = Vec::new();
    for ep in list.split([',', ';']).map(str::trim) {
        if ep.is_empty() {
            return Err(EndpointError::Empty {
                list: list.to_string(),
            });
        }
        if ep.contains("://") {
            return Err(EndpointError::Scheme {
                endpoint: ep.to_string(),
            });
        }
        HostPort::parse(ep, 2379)?;
        out.push(format!("http://{ep}"));
    }
    Ok(out)
}

impl Shared {
    async fn put(&self, key: &str, value: &str, lease: i64) -> Result<(), MetadataError> {
        in_time(&self.store, "PUT", key, || {
            let mut c = self.client.clone();
            let opts = PutOptions::new().with_lease(lease);
            async move { c.put(key, value, Some(opts)).await }
        })
        .await?;
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Option<String>, MetadataError> {
        let resp = in_time(&self.store, "GET", key, || {
            let mut c = self.client.clone();
            async move { c.get(key, None).await }
        })
        .await?;
        match resp.kvs().first() {
            None => Ok(None),
            Some(kv) => kv
                .value_str()
                .map(|s| Some(s.to_string()))
                .map_err(|source| {
                    store_err(
                        &self.store,
                        StoreFailure::NotUtf8 {
                            key: key.to_string(),
                            source,
                        },
                    )
                }),
        }
    }

    async fn grant(&self) -> Result<i64, MetadataError> {
        let secs = i64::try_from(self.ttl.as_secs()).unwrap_or(10);
        let resp = in_time(&self.store, "lease grant", "", || {
            let mut c = self.client.clone();
            async move { c.lease_grant(secs, None).await }
        })
        .await?;
        Ok(resp.id())
    }

    /// Writes everything joined so far again under a new lease.
    async fn rejoin(&self) -> Result<(), MetadataError> {
        let lease = self.grant().await?;
        let (name, rpc_meta, desc) = {
            let j = self.joined.lock();
            (j.name.clone(), j.rpc_meta.clone(), j.desc.clone())
        };
        self.put(&self.keys.rpc_meta(&name), &rpc_meta, lease)
            .await?;
        if let Some(desc) = desc {
            self.put(&self.keys.ram(&name), &desc, lease).await?;
        }
        self.joined.lock().lease = lease;
        Ok(())
    }

    /// Renews the lease every third of its TTL until the store drops.
    async fn keep_alive(self: Arc<Self>) {
        let every = self.ttl / 3;
        loop {
            tokio::time::sleep(every).await;
            let lease = self.joined.lock().lease;
            let mut c = self.client.clone();
            let renewed = tokio::time::timeout(OP_TIMEOUT, async {
                let (mut keeper, mut stream) = c.lease_keep_alive(lease).await?;
                keeper.keep_alive().await?;
                stream.message().await
            })
            .await;
            match renewed {
                Ok(Ok(Some(r))) if r.ttl() > 0 => {}
                Ok(Ok(_)) => {
                    tracing::warn!(
                        "etcd {}: lease {lease:x} expired; writing this engine's keys again",
                        self.store
                    );
                    if let Err(e) = self.rejoin().await {
                        tracing::warn!("{e}");
                    }
                }
                Ok(Err(e)) => tracing::warn!("etcd {}: lease renewal failed: {e}", self.store),
                Err(_) => tracing::warn!(
                    "etcd {}: lease renewal timed out after {OP_TIMEOUT:?}",
                    self.store
                ),
            }
        }
    }
}

/// Runs the operation `make` builds, again while it fails, until it succeeds or
/// [`OP_TIMEOUT`] has passed (a dead endpoint of a list fails a call now and then until the
/// client stops choosing it; an etcd restarting answers "unavailable" for a while).
async fn in_time<T, F>(
    store: &str,
    op: &'static str,
    key: &str,
    mut make: impl FnMut() -> F,
) -> Result<T, MetadataError>
where
    F: std::future::Future<Output = Result<T, mooncake_etcd::Error>>,
{
    let deadline = tokio::time::Instant::now() + OP_TIMEOUT;
    let mut pause = Duration::from_millis(20);
    loop {
        let last = match tokio::time::timeout_at(deadline, make()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => EtcdAttempt::Failed(e),
            Err(_) => EtcdAttempt::NoAnswer,
        };
        if tokio::time::Instant::now() + pause >= deadline {
            return Err(store_err(
                store,
                StoreFailure::Deadline {
                    op,
                    key: key.to_string(),
                    limit: OP_TIMEOUT,
                    last,
                },
            ));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

impl EtcdStore {
    /// Connects to the endpoints of `conn` (`etcd://h1:2379,h2:2379`) for the keys of
    /// `config.metadata_cluster_id`.
    pub fn new(conn: &str, config: Config) -> Result<Self, MetadataError> {
        let list = conn.strip_prefix("etcd://").unwrap_or(conn);
        let endpoints = parse_endpoints(list).map_err(|e| store_err(conn, e.into()))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("etcd-client")
            .enable_all()
            .build()
            .map_err(|e| store_err(conn, StoreFailure::Runtime(e)))?;
        let opts = ConnectOptions::new()
            .with_connect_timeout(OP_TIMEOUT)
            .with_timeout(OP_TIMEOUT);
        let client = rt.block_on(in_time(conn, "connect", "", || {
            Client::connect(endpoints.clone(), Some(opts.clone()))
        }))?;
        Ok(Self {
            rt: Some(rt),
            shared: Arc::new(Shared {
                client,
                store: conn.to_string(),
                keys: KeySpace::new(&config.metadata_cluster_id),
                ttl: config.metadata_lease_ttl,
                joined: Mutex::new(Joined::default()),
            }),
            config,
            keeper: Mutex::new(None),
        })
    }

    fn block_on<T>(&self, fut: impl std::future::Future<Output = T>) -> Result<T, MetadataError> {
        match &self.rt {
            Some(rt) => Ok(rt.block_on(fut)),
            None => Err(store_err(&self.shared.store, StoreFailure::Closed)),
        }
    }
}

impl MetadataStore for EtcdStore {
    fn fetch(&self, id: &SegmentId) -> Result<SegmentDesc, MetadataError> {
        let s = &self.shared;
        let body = self
            .block_on(s.get(&s.keys.ram(id.name())))??
            .ok_or_else(|| MetadataError::UnknownSegment {
                segment: id.to_string(),
                store: s.store.clone(),
            })?;
        stored_desc(id, &body, || self.rpc_address(id).ok())
    }

    fn publish(&self, desc: &SegmentDesc) -> Result<(), MetadataError> {
        let s = &self.shared;
        let value = format!("{}\n", desc.encode());
        let lease = s.joined.lock().lease;
        self.block_on(s.put(&s.keys.ram(&desc.name), &value, lease))??;
        s.joined.lock().desc = Some(value);
        Ok(())
    }

    fn rpc_address(&self, id: &SegmentId) -> Result<HostPort, MetadataError> {
        let s = &self.shared;
        let key = s.keys.rpc_meta(id.name());
        let body = self
            .block_on(s.get(&key))??
            .ok_or_else(|| MetadataError::UnknownSegment {
                segment: id.to_string(),
                store: s.store.clone(),
            })?;
        RpcMeta::decode(&body)
            .map(|m| m.host_port())
            .map_err(|source| store_err(&s.store, StoreFailure::UnusableValue { key, source }))
    }

    fn join(&self, name: &str, rpc: &RpcMeta) -> Result<(), MetadataError> {
        let s = &self.shared;
        let key = s.keys.rpc_meta(name);
        let old = self.block_on(s.get(&key))??;
        if let Some(old) = old.as_deref().and_then(|v| RpcMeta::decode(v).ok()) {
            check_old_owner(&s.store, name, &old, rpc, &self.config)?;
        }
        {
            let mut j = s.joined.lock();
            j.name = name.to_string();
            j.rpc_meta = format!("{}\n", rpc.encode());
        }
        self.block_on(s.rejoin())??;
        let back = self.block_on(s.get(&key))??.unwrap_or_default();
        match RpcMeta::decode(&back) {
            Ok(m) if &m == rpc => {}
            found => return Err(store_err(&s.store, StoreFailure::ReadBack { key, found })),
        }
        if let Some(rt) = &self.rt {
            *self.keeper.lock() = Some(rt.spawn(s.clone().keep_alive()));
        }
        s.joined.lock().rpc = Some(rpc.clone());
        local_engine_joined(rpc);
        Ok(())
    }

    fn leave(&self) {
        if let Some(k) = self.keeper.lock().take() {
            k.abort();
        }
        let s = &self.shared;
        let joined = std::mem::take(&mut *s.joined.lock());
        if let Some(rpc) = &joined.rpc {
            local_engine_left(rpc);
        }
        let lease = joined.lease;
        if lease == 0 {
            return;
        }
        // Revoking the lease deletes every key bound to it.
        let revoke = in_time(&s.store, "lease revoke", "", || {
            let mut c = s.client.clone();
            async move { c.lease_revoke(lease).await }
        });
        match self.block_on(revoke) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) | Err(e) => tracing::warn!("{e}"),
        }
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        if let Some(k) = self.keeper.lock().take() {
            k.abort();
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            parse_endpoints("a:1,b:2; c:3").unwrap(),
            ["http://a:1", "http://b:2", "http://c:3"]
        );
        assert!(parse_endpoints("a:1,,b:2").is_err());
        assert!(parse_endpoints("http://a:1").is_err());
        assert!(parse_endpoints("a:notaport").is_err());
    }
}
