//! The RPC edge of the master: each call takes the state's lock, applies one event at
//! `Instant::now()`, and answers. Nothing here decides anything the state machine does not.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tonic::{Request, Response, Status};

use super::state::{ClientId, Liveness, PutConfig, Replica, SegmentSpec, State};
use crate::codes::Code;
use crate::ha::LeaseFence;
use crate::rpc::messages::{
    self as msg, ClientRequest, CodeReply, CodesReply, CountReply, HelloReply, HelloRequest,
    KeysRequest, MountRequest, PingReply, PutStartRequest, RegexRequest, RemoveRequest,
    ReplicasReply, ReplicasResult, UnmountRequest,
};
use crate::rpc::{self, Master, MAX_BATCH, PROTOCOL, VERSION};

/// Largest compiled `remove_by_regex` pattern: a hostile pattern cannot make the master
/// spend more than this on one automaton.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Counters of calls, for `/metrics`.
#[derive(Debug, Default)]
pub struct CallCounters {
    pub puts: AtomicU64,
    pub puts_failed: AtomicU64,
    pub gets: AtomicU64,
    pub gets_failed: AtomicU64,
    pub exists: AtomicU64,
    pub removes: AtomicU64,
    errors: [AtomicU64; Code::ALL.len()],
}

impl CallCounters {
    fn error(&self, code: Code) {
        if let Some(i) = Code::ALL.iter().position(|&c| c == code) {
            if let Some(slot) = self.errors.get(i) {
                slot.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Errors answered so far, by code.
    pub fn errors(&self) -> Vec<(Code, u64)> {
        Code::ALL
            .iter()
            .zip(self.errors.iter())
            .map(|(&c, n)| (c, n.load(Ordering::Relaxed)))
            .collect()
    }
}

/// What this master is in its cluster: decides whether it answers RPC and the admin
/// routes, and what `/health` says.
#[derive(Debug, Clone)]
pub enum Role {
    /// No `--enable_ha`: serves from the start.
    Alone,
    /// Campaigning on etcd; `leader` is the master last seen leading.
    Standby { leader: Option<String> },
    /// Elected as `address`; serves while `fence` holds.
    Leader { address: String, fence: LeaseFence },
}

/// What the RPC service, the HTTP routes and the sweeper share.
pub struct Shared {
    pub state: Mutex<State>,
    pub calls: CallCounters,
    role: Mutex<Role>,
}

impl Shared {
    pub fn new(state: State) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(state),
            calls: CallCounters::default(),
            role: Mutex::new(Role::Alone),
        })
    }

    pub fn set_role(&self, role: Role) {
        *self.role.lock() = role;
    }

    pub fn role(&self) -> Role {
        self.role.lock().clone()
    }

    /// `Ok` while this master may answer for the cluster; else why not, for the caller.
    pub fn serving(&self) -> Result<(), String> {
        match &*self.role.lock() {
            Role::Alone => Ok(()),
            Role::Leader { fence, .. } if fence.holds() => Ok(()),
            Role::Leader { address, .. } => Err(format!(
                "the master at {address} no longer holds its etcd lease, so no longer leads: ask etcd for the leader"
            )),
            Role::Standby { leader } => Err(match leader {
                Some(l) => format!("this master is a standby; the leader is {l}"),
                None => "this master is a standby and no master leads yet".to_string(),
            }),
        }
    }

    /// Applies the time's decisions (dead clients, stale puts, eviction); returns when
    /// to call again.
    pub fn sweep(&self, now: Instant) -> Duration {
        let mut state = self.state.lock();
        let sweep = state.handle_timeout(now);
        if !sweep.dead_clients.is_empty() {
            tracing::warn!(
                "{} client(s) sent no heartbeat within client_ttl: their segments are unmounted and their objects dropped",
                sweep.dead_clients.len()
            );
        }
        if sweep.evicted > 0 || sweep.discarded_puts > 0 {
            tracing::debug!(
                "sweep: evicted {}, discarded {} unfinished puts, released {}",
                sweep.evicted,
                sweep.discarded_puts,
                sweep.released
            );
        }
        state.poll_timeout().map_or(SWEEP_MAX, |at| {
            at.saturating_duration_since(now)
                .clamp(SWEEP_MIN, SWEEP_MAX)
        })
    }
}

/// Bounds of the sweeper's period: often enough for a prompt `client_ttl`, rarely
/// enough to cost nothing.
const SWEEP_MIN: Duration = Duration::from_millis(10);
const SWEEP_MAX: Duration = Duration::from_millis(200);

/// The tonic service.
pub struct MasterService {
    shared: Arc<Shared>,
}

impl MasterService {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    fn record(&self, code: Code) -> i32 {
        self.shared.calls.error(code);
        code.value()
    }

    fn code_of(&self, r: Result<(), Code>) -> i32 {
        match r {
            Ok(()) => 0,
            Err(c) => self.record(c),
        }
    }
}

fn client_of(id: Option<msg::Id>) -> Result<ClientId, Status> {
    id.map(msg::Id::to_u128)
        .ok_or_else(|| Status::invalid_argument("the request names no client id"))
}

fn check_batch(n: usize) -> Result<(), Status> {
    if n > MAX_BATCH {
        return Err(Status::invalid_argument(format!(
            "a batch of {n} keys is over the limit of {MAX_BATCH}; split it"
        )));
    }
    Ok(())
}

/// The keys of a batch, checked: at most [`MAX_BATCH`], cut exactly, UTF-8.
fn keys_of(req: &KeysRequest) -> Result<Vec<&str>, Status> {
    check_batch(req.len())?;
    req.keys()
        .map_err(|why| Status::invalid_argument(format!("malformed batch of keys: {why}")))
}

fn replicas_msg(replicas: Vec<Replica>) -> Vec<msg::Replica> {
    replicas
        .into_iter()
        .map(|r| msg::Replica {
            segment: r.segment,
            addr: r.addr,
            len: r.len,
        })
        .collect()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[tonic::async_trait]
impl Master for MasterService {
    async fn hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        let req = req.into_inner();
        if let Some(why) = rpc::version_mismatch(
            "this master",
            "the client",
            &req.client_version,
            req.protocol,
        ) {
            return Err(Status::failed_precondition(why));
        }
        let mut state = self.shared.state.lock();
        if let Some(id) = req.client_id {
            state.register_client(Instant::now(), id.to_u128());
        }
        let policy = state.policy();
        Ok(Response::new(HelloReply {
            master_version: VERSION.to_string(),
            protocol: PROTOCOL,
            client_ttl_ms: millis(policy.client_ttl),
            kv_lease_ttl_ms: millis(policy.kv_lease_ttl),
        }))
    }

    async fn ping(&self, req: Request<ClientRequest>) -> Result<Response<PingReply>, Status> {
        let client = client_of(req.into_inner().client_id)?;
        let liveness = self.shared.state.lock().handle_ping(Instant::now(), client);
        let code = match liveness {
            Liveness::Known => 0,
            Liveness::Unknown => Code::IllegalClient.value(),
        };
        Ok(Response::new(PingReply { code }))
    }

    async fn mount_segment(
        &self,
        req: Request<MountRequest>,
    ) -> Result<Response<CodeReply>, Status> {
        let req = req.into_inner();
        let client = client_of(req.client_id)?;
        let seg = req
            .segment
            .ok_or_else(|| Status::invalid_argument("mount names no segment"))?;
        let spec = SegmentSpec {
            id: client_of(seg.id)?,
            name: seg.name,
            base: seg.base,
            size: seg.size,
        };
        let name = spec.name.clone();
        let size = spec.size;
        let r = self
            .shared
            .state
            .lock()
            .mount_segment(Instant::now(), client, spec);
        match r {
            Ok(()) => tracing::info!("segment {name} mounted ({size} bytes)"),
            Err(c) => tracing::warn!("segment {name}: mount refused: {c}"),
        }
        Ok(Response::new(CodeReply {
            code: self.code_of(r),
        }))
    }

    async fn unmount_segment(
        &self,
        req: Request<UnmountRequest>,
    ) -> Result<Response<CodeReply>, Status> {
        let req = req.into_inner();
        let client = client_of(req.client_id)?;
        let id = client_of(req.segment_id)?;
        let r = self
            .shared
            .state
            .lock()
            .unmount_segment(Instant::now(), client, id);
        Ok(Response::new(CodeReply {
            code: self.code_of(r),
        }))
    }

    async fn disconnect(&self, req: Request<ClientRequest>) -> Result<Response<CodeReply>, Status> {
        let client = client_of(req.into_inner().client_id)?;
        self.shared.state.lock().disconnect(Instant::now(), client);
        Ok(Response::new(CodeReply { code: 0 }))
    }

    async fn batch_exist(&self, req: Request<KeysRequest>) -> Result<Response<CodesReply>, Status> {
        let req = req.into_inner();
        let keys = keys_of(&req)?;
        let now = Instant::now();
        let mut state = self.shared.state.lock();
        let codes = keys
            .iter()
            .map(|k| match state.exists(now, k) {
                Ok(true) => 1,
                Ok(false) => 0,
                Err(c) => self.record(c),
            })
            .collect();
        drop(state);
        self.shared
            .calls
            .exists
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        Ok(Response::new(CodesReply { codes }))
    }

    async fn batch_get_replicas(
        &self,
        req: Request<KeysRequest>,
    ) -> Result<Response<ReplicasReply>, Status> {
        let req = req.into_inner();
        let keys = keys_of(&req)?;
        let now = Instant::now();
        let mut state = self.shared.state.lock();
        let mut failed = 0;
        let results = keys
            .iter()
            .map(|k| match state.get_replicas(now, k) {
                Ok(r) => ReplicasResult {
                    code: 0,
                    replicas: replicas_msg(r),
                },
                Err(c) => {
                    failed += 1;
                    ReplicasResult {
                        code: self.record(c),
                        replicas: Vec::new(),
                    }
                }
            })
            .collect();
        drop(state);
        let calls = &self.shared.calls;
        calls.gets.fetch_add(keys.len() as u64, Ordering::Relaxed);
        calls.gets_failed.fetch_add(failed, Ordering::Relaxed);
        Ok(Response::new(ReplicasReply { results }))
    }

    async fn batch_put_start(
        &self,
        req: Request<PutStartRequest>,
    ) -> Result<Response<ReplicasReply>, Status> {
        let req = req.into_inner();
        check_batch(req.items.len())?;
        let client = client_of(req.client_id)?;
        let cfg = req.config.map_or_else(PutConfig::default, |c| PutConfig {
            replica_num: c.replica_num,
            preferred_segment: c.preferred_segment,
            with_soft_pin: c.with_soft_pin,
        });
        let now = Instant::now();
        let mut state = self.shared.state.lock();
        let mut failed = 0;
        let results = req
            .items
            .iter()
            .map(
                |item| match state.put_start(now, client, &item.key, item.len, &cfg) {
                    Ok(r) => ReplicasResult {
                        code: 0,
                        replicas: replicas_msg(r),
                    },
                    Err(c) => {
                        failed += 1;
                        ReplicasResult {
                            code: self.record(c),
                            replicas: Vec::new(),
                        }
                    }
                },
            )
            .collect();
        drop(state);
        let calls = &self.shared.calls;
        calls
            .puts
            .fetch_add(req.items.len() as u64, Ordering::Relaxed);
        calls.puts_failed.fetch_add(failed, Ordering::Relaxed);
        Ok(Response::new(ReplicasReply { results }))
    }

    async fn batch_put_end(
        &self,
        req: Request<KeysRequest>,
    ) -> Result<Response<CodesReply>, Status> {
        self.per_key(req, |state, now, client, key| {
            state.put_end(now, client, key)
        })
    }

    async fn batch_put_revoke(
        &self,
        req: Request<KeysRequest>,
    ) -> Result<Response<CodesReply>, Status> {
        self.per_key(req, |state, now, client, key| {
            state.put_revoke(now, client, key)
        })
    }

    async fn batch_remove(
        &self,
        req: Request<RemoveRequest>,
    ) -> Result<Response<CodesReply>, Status> {
        let req = req.into_inner();
        check_batch(req.keys.len())?;
        let now = Instant::now();
        let mut state = self.shared.state.lock();
        let codes = req
            .keys
            .iter()
            .map(|k| {
                let r = state.remove(now, k, req.force);
                self.code_of(r)
            })
            .collect();
        drop(state);
        self.shared
            .calls
            .removes
            .fetch_add(req.keys.len() as u64, Ordering::Relaxed);
        Ok(Response::new(CodesReply { codes }))
    }

    async fn remove_by_regex(
        &self,
        req: Request<RegexRequest>,
    ) -> Result<Response<CountReply>, Status> {
        let req = req.into_inner();
        let re = match regex::RegexBuilder::new(&req.pattern)
            .size_limit(REGEX_SIZE_LIMIT)
            .build()
        {
            Ok(re) => re,
            Err(e) => {
                tracing::warn!("remove_by_regex: bad pattern: {e}");
                return Ok(Response::new(CountReply {
                    code: self.record(Code::InvalidParams),
                    count: 0,
                }));
            }
        };
        let n = self
            .shared
            .state
            .lock()
            .remove_matching(Instant::now(), |k| re.is_match(k));
        Ok(Response::new(CountReply {
            code: 0,
            count: n as u64,
        }))
    }

    async fn remove_all(
        &self,
        _req: Request<ClientRequest>,
    ) -> Result<Response<CountReply>, Status> {
        let n = self.shared.state.lock().remove_all(Instant::now());
        Ok(Response::new(CountReply {
            code: 0,
            count: n as u64,
        }))
    }
}

impl MasterService {
    fn per_key(
        &self,
        req: Request<KeysRequest>,
        f: impl Fn(&mut State, Instant, ClientId, &str) -> Result<(), Code>,
    ) -> Result<Response<CodesReply>, Status> {
        let req = req.into_inner();
        let keys = keys_of(&req)?;
        let client = client_of(req.client_id)?;
        let now = Instant::now();
        let mut state = self.shared.state.lock();
        let codes = keys
            .iter()
            .map(|k| {
                let r = f(&mut state, now, client, k);
                self.code_of(r)
            })
            .collect();
        Ok(Response::new(CodesReply { codes }))
    }
}
