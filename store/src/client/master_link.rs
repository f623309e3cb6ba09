//! The client's connection to the master: finding it (`host:port`, or the leader named
//! in etcd for `etcd://h1:2379;h2:2379`), the version check of the first call, every
//! RPC under a deadline, heartbeats, and mounting the client's segments again when a
//! master does not know it (restarted, or a standby that took over).
//!
//! The connection lives on a current-thread runtime that the calling thread itself
//! drives: a call writes its request, sleeps in the runtime's poll and reads the reply
//! on one thread, so the master's answer wakes exactly the thread that waits for it.
//! (A runtime thread of its own would add two wake-ups to every call, the fixed cost
//! that bounds the store's small batches.) The heartbeat thread drives it the same way
//! between calls, which also answers the master's HTTP/2 keepalive pings.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tonic::transport::{Channel, Endpoint};
use tonic::{Response, Status};

use super::error::StoreError;
use crate::codes::Code;
use crate::ha;
use crate::rpc::messages::{self as msg, ClientRequest, HelloReply, HelloRequest, MountRequest};
use crate::rpc::{self, coalesce, MasterClient, MAX_MESSAGE_BYTES, PROTOCOL, VERSION};

/// How long connecting to a master may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one RPC may take.
const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// The cluster a client looks for in etcd unless `MC_STORE_CLUSTER_ID` names another
/// (the master's `--cluster_id` default).
const DEFAULT_CLUSTER_ID: &str = "mooncake_cluster";
/// Heartbeats per `client_ttl`: one lost heartbeat never kills a client.
const PINGS_PER_TTL: u32 = 4;
/// The longest gap between heartbeats, whatever the ttl: they also answer the master's
/// keepalive pings (sent after 10 s idle, answered within 5 s) on an idle connection.
const MAX_PING_GAP: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
enum Target {
    Direct(String),
    Etcd {
        endpoints: Vec<String>,
        cluster_id: String,
    },
}

impl Target {
    fn parse(addr: &str) -> Result<Self, StoreError> {
        if let Some(endpoints) = ha::parse_etcd_master(addr) {
            let cluster_id = std::env::var("MC_STORE_CLUSTER_ID")
                .ok()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| DEFAULT_CLUSTER_ID.to_string());
            return Ok(Self::Etcd {
                endpoints,
                cluster_id,
            });
        }
        let addr = addr.trim();
        if addr.is_empty() || addr.contains("://") || !addr.contains(':') {
            return Err(StoreError::new(
                Code::InvalidParams,
                format!("master_server_addr {addr:?}: expected host:port, or etcd://h1:2379;h2:2379 for masters in HA mode"),
            ));
        }
        Ok(Self::Direct(addr.to_string()))
    }
}

struct Conn {
    client: MasterClient<Channel>,
    addr: String,
}

struct Shared {
    target: Target,
    client_id: u128,
    conn: Mutex<Conn>,
    /// The segments this client mounted, to mount again on a master that forgot them.
    segments: Mutex<Vec<msg::Segment>>,
    /// Set by `close` (or drop); the heartbeat thread waits on `stop` and ends.
    closed: Mutex<bool>,
    stop: Condvar,
}

/// The connection to the master.
pub struct MasterLink {
    shared: Arc<Shared>,
    hello: HelloReply,
    rt: Arc<tokio::runtime::Runtime>,
}

fn status_error(addr: &str, s: &Status) -> StoreError {
    use tonic::Code as G;
    match s.code() {
        G::DeadlineExceeded => StoreError::new(
            Code::RpcTimeout,
            format!("the master at {addr} did not answer within {RPC_TIMEOUT:?}"),
        ),
        G::FailedPrecondition => StoreError::new(Code::RpcFail, s.message().to_string()),
        G::InvalidArgument => StoreError::new(Code::InvalidParams, s.message().to_string()),
        _ => StoreError::new(
            Code::RpcFail,
            format!(
                "the master at {addr} failed the call: {} ({:?}); is it a mooncake-rs mooncake_master of the same version? \
                 (upstream's coro_rpc masters are not compatible)",
                s.message(),
                s.code()
            ),
        ),
    }
}

async fn open(addr: &str, client_id: u128) -> Result<(Conn, HelloReply), StoreError> {
    let unreachable = |why: String| {
        StoreError::new(
            Code::RpcFail,
            format!("cannot reach the master at {addr}: {why} (is mooncake_master running there? master_server_addr)"),
        )
    };
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| {
            StoreError::new(
                Code::InvalidParams,
                format!("master_server_addr {addr:?}: {e}"),
            )
        })?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(RPC_TIMEOUT);
    let channel = tokio::time::timeout(
        CONNECT_TIMEOUT,
        endpoint.connect_with_connector(coalesce::Connector),
    )
    .await
    .map_err(|_| unreachable(format!("no connection within {CONNECT_TIMEOUT:?}")))?
    .map_err(|e| unreachable(e.to_string()))?;
    let mut client = MasterClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let hello = HelloRequest {
        client_version: VERSION.to_string(),
        protocol: PROTOCOL,
        client_id: Some(msg::Id::from_u128(client_id)),
    };
    let reply = tokio::time::timeout(RPC_TIMEOUT, client.hello(hello))
        .await
        .map_err(|_| {
            StoreError::new(
                Code::RpcTimeout,
                format!("the master at {addr} accepted the connection but did not answer within {RPC_TIMEOUT:?}; \
                         is it a mooncake-rs mooncake_master? (upstream's coro_rpc masters are not compatible)"),
            )
        })?
        .map_err(|s| status_error(addr, &s))?
        .into_inner();
    let master = format!("the master at {addr}");
    if let Some(why) = rpc::version_mismatch(
        "this client",
        &master,
        &reply.master_version,
        reply.protocol,
    ) {
        return Err(StoreError::new(Code::RpcFail, why));
    }
    Ok((
        Conn {
            client,
            addr: addr.to_string(),
        },
        reply,
    ))
}

async fn resolve(target: &Target) -> Result<String, StoreError> {
    match target {
        Target::Direct(addr) => Ok(addr.clone()),
        Target::Etcd {
            endpoints,
            cluster_id,
        } => match ha::current_leader(endpoints, cluster_id, CONNECT_TIMEOUT).await {
            Ok(Some(leader)) => Ok(leader),
            Ok(None) => Err(StoreError::new(
                Code::RpcFail,
                format!("etcd {endpoints:?} names no leader of cluster {cluster_id:?}: is a mooncake_master --enable_ha running? (MC_STORE_CLUSTER_ID)"),
            )),
            Err(e) => Err(StoreError::new(Code::RpcFail, e.to_string())),
        },
    }
}

/// A failure after which another master may answer: reconnect (and, in HA mode, find
/// the leader again) before the next try.
fn is_connection_failure(s: &Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
    )
}

impl MasterLink {
    /// Connects to the master at `addr` (`host:port` or `etcd://...`) and checks versions.
    pub fn connect(addr: &str, client_id: u128) -> Result<Self, StoreError> {
        let target = Target::parse(addr)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                StoreError::new(
                    Code::InternalError,
                    format!("cannot start the client's RPC runtime: {e}"),
                )
            })?;
        let (conn, hello) = rt.block_on(async {
            let at = resolve(&target).await?;
            open(&at, client_id).await
        })?;
        let shared = Arc::new(Shared {
            target,
            client_id,
            conn: Mutex::new(conn),
            segments: Mutex::new(Vec::new()),
            closed: Mutex::new(false),
            stop: Condvar::new(),
        });
        let rt = Arc::new(rt);
        let every =
            (Duration::from_millis(hello.client_ttl_ms.max(400)) / PINGS_PER_TTL).min(MAX_PING_GAP);
        let (beat_shared, beat_rt) = (Arc::clone(&shared), Arc::clone(&rt));
        std::thread::Builder::new()
            .name("store-heartbeat".into())
            .spawn(move || heartbeat(&beat_shared, &beat_rt, every))
            .map_err(|e| {
                StoreError::new(
                    Code::InternalError,
                    format!("cannot start the client's heartbeat thread: {e}"),
                )
            })?;
        Ok(Self { shared, hello, rt })
    }

    /// This client's id.
    pub fn client_id(&self) -> Option<msg::Id> {
        Some(msg::Id::from_u128(self.shared.client_id))
    }

    /// How long a read's lease lasts.
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.hello.kv_lease_ttl_ms)
    }

    /// Runs one RPC; after a connection failure, reconnects once and tries again.
    pub fn call<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        F: Fn(MasterClient<Channel>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        self.rt.block_on(call(&self.shared, f))
    }

    /// Mounts a segment and remembers it for re-mounting.
    pub fn mount(&self, segment: msg::Segment) -> Result<(), StoreError> {
        let code = self.rt.block_on(async {
            match mount_one(&self.shared, segment.clone()).await {
                Err(_) => {
                    reconnect(&self.shared).await?;
                    mount_one(&self.shared, segment.clone()).await
                }
                ok => ok,
            }
        })?;
        if code != 0 {
            let code = Code::from_value(code).unwrap_or(Code::InternalError);
            return Err(StoreError::new(
                code,
                format!(
                    "the master refused to mount segment {:?}: {code}",
                    segment.name
                ),
            ));
        }
        self.shared.segments.lock().push(segment);
        Ok(())
    }

    /// Unmounts every segment and says goodbye; heartbeats stop.
    pub fn close(&self) -> Result<(), StoreError> {
        self.shared.stop_heartbeats();
        let client_id = self.client_id();
        self.shared.segments.lock().clear();
        self.call(|mut c| async move { c.disconnect(ClientRequest { client_id }).await })
            .map(|_| ())
    }

    /// The master's address now.
    pub fn master_addr(&self) -> String {
        self.shared.conn.lock().addr.clone()
    }
}

/// One try of an RPC under [`RPC_TIMEOUT`]; the status of a failure is kept so the
/// caller can tell a lost connection.
async fn call_once<T, F, Fut>(shared: &Shared, f: &F) -> Result<T, (StoreError, bool)>
where
    F: Fn(MasterClient<Channel>) -> Fut,
    Fut: Future<Output = Result<Response<T>, Status>>,
{
    let (client, addr) = {
        let c = shared.conn.lock();
        (c.client.clone(), c.addr.clone())
    };
    match tokio::time::timeout(RPC_TIMEOUT, f(client)).await {
        Err(_) => Err((
            StoreError::new(
                Code::RpcTimeout,
                format!("the master at {addr} did not answer within {RPC_TIMEOUT:?}"),
            ),
            false,
        )),
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err((status_error(&addr, &s), is_connection_failure(&s))),
    }
}

async fn call<T, F, Fut>(shared: &Shared, f: F) -> Result<T, StoreError>
where
    F: Fn(MasterClient<Channel>) -> Fut,
    Fut: Future<Output = Result<Response<T>, Status>>,
{
    match call_once(shared, &f).await {
        Ok(r) => Ok(r),
        Err((e, true)) => {
            tracing::warn!("store: {e}; reconnecting");
            reconnect(shared).await?;
            call_once(shared, &f).await.map_err(|(e, _)| e)
        }
        Err((e, false)) => Err(e),
    }
}

/// Finds the master again, checks versions, and mounts this client's segments there
/// (a new leader, or a restarted master, knows nothing of them).
async fn reconnect(shared: &Shared) -> Result<(), StoreError> {
    let at = resolve(&shared.target).await?;
    let (conn, _) = open(&at, shared.client_id).await?;
    *shared.conn.lock() = conn;
    remount(shared).await;
    tracing::info!("store: connected to the master at {at}");
    Ok(())
}

async fn remount(shared: &Shared) {
    let segments = shared.segments.lock().clone();
    for seg in segments {
        let name = seg.name.clone();
        match mount_one(shared, seg).await {
            Ok(0) => tracing::info!("store: segment {name} mounted again"),
            Ok(code) => {
                tracing::error!("store: the master refused to mount segment {name} again: {code}")
            }
            Err(e) => tracing::error!("store: cannot mount segment {name} again: {e}"),
        }
    }
}

async fn mount_one(shared: &Shared, segment: msg::Segment) -> Result<i32, StoreError> {
    let client_id = Some(msg::Id::from_u128(shared.client_id));
    let f = move |mut c: MasterClient<Channel>| {
        let req = MountRequest {
            client_id,
            segment: Some(segment.clone()),
        };
        async move { c.mount_segment(req).await }
    };
    call_once(shared, &f)
        .await
        .map(|r| r.code)
        .map_err(|(e, _)| e)
}

impl Drop for MasterLink {
    fn drop(&mut self) {
        self.shared.stop_heartbeats();
    }
}

impl Shared {
    fn stop_heartbeats(&self) {
        *self.closed.lock() = true;
        self.stop.notify_all();
    }

    /// Waits `every`; false once the link is closed.
    fn wait_open(&self, every: Duration) -> bool {
        let mut closed = self.closed.lock();
        if !*closed {
            self.stop.wait_for(&mut closed, every);
        }
        !*closed
    }
}

/// The heartbeat thread: a ping every `every` until the link closes, driving the
/// runtime while it waits for the answer.
fn heartbeat(shared: &Shared, rt: &tokio::runtime::Runtime, every: Duration) {
    let client_id = Some(msg::Id::from_u128(shared.client_id));
    while shared.wait_open(every) {
        rt.block_on(async {
            let reply = call(shared, move |mut c| async move {
                c.ping(ClientRequest { client_id }).await
            })
            .await;
            match reply {
                Ok(r) if r.code == Code::IllegalClient.value() => {
                    tracing::warn!("store: the master does not know this client (restarted or took over); saying hello and mounting its segments again");
                    if let Err(e) = reconnect(shared).await {
                        tracing::warn!("store: {e}");
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("store: heartbeat failed: {e}"),
            }
        });
    }
}
