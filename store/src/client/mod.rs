//! The store's client, as `mooncake.store.MooncakeDistributedStore` uses it: mounts a
//! segment of this process's memory in the cluster pool through the transfer engine,
//! asks the master where objects go and where they are, and moves their bytes with the
//! engine (a local copy when the replica is in this client's own segment).
//!
//! The caller-memory rule of the engine holds for every call: when a call returns,
//! success or failure, no byte moves to or from the caller's buffers any more.

#[allow(
    unsafe_code,
    reason = "the one module that hands caller addresses to the engine"
)]
mod data;
pub mod error;
mod master_link;

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use transfer_engine::{HostBuffer, TransferEngine};

pub use data::Piece;
pub use error::StoreError;
use master_link::MasterLink;

use crate::codes::Code;
use crate::master::alloc::SegmentAllocator;
use crate::master::state::{PutConfig, Replica, MAX_KEY_BYTES};
use crate::rpc::messages::{self as msg, ClientRequest, KeysRequest, RegexRequest, RemoveRequest};
use crate::rpc::MAX_BATCH;

/// Where memory registered by the store says it lives.
const HOST_LOCATION: &str = "cpu:0";

/// What `setup` is given besides the engine.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Bytes of this process's memory lent to the cluster pool (0: lend none).
    pub global_segment_size: u64,
    /// Bytes of registered memory for the copying calls (`put`, `get`).
    pub local_buffer_size: u64,
    /// `host:port`, or `etcd://h1:2379;h2:2379` for masters in HA mode.
    pub master_server_addr: String,
}

/// The registered staging memory of the copying calls.
struct Staging {
    buf: HostBuffer,
    alloc: Mutex<SegmentAllocator>,
}

struct Open {
    engine: Arc<TransferEngine>,
    link: MasterLink,
    /// This client's segment name: its engine's session id.
    name: String,
    /// The memory mounted as this client's segment.
    segment: Option<HostBuffer>,
    staging: Option<Staging>,
    /// Regions the caller registered (`register_buffer`): addr -> len.
    registered: Mutex<BTreeMap<u64, u64>>,
}

/// A store client; `close` ends it, and every later call fails with the reason.
pub struct StoreClient {
    open: RwLock<Option<Open>>,
}

fn random_id() -> Result<u128, StoreError> {
    let mut b = [0u8; 16];
    getrandom::getrandom(&mut b).map_err(|e| {
        StoreError::new(
            Code::InternalError,
            format!("no random id from the OS: {e}"),
        )
    })?;
    Ok(u128::from_le_bytes(b))
}

fn alloc_registered(
    engine: &TransferEngine,
    len: u64,
    what: &str,
) -> Result<Option<HostBuffer>, StoreError> {
    if len == 0 {
        return Ok(None);
    }
    let size = usize::try_from(len).map_err(|_| {
        StoreError::new(
            Code::InvalidParams,
            format!("{what} {len} is too large for this host"),
        )
    })?;
    let buf = HostBuffer::try_new(size).ok_or_else(|| {
        StoreError::new(
            Code::InternalError,
            format!("cannot allocate {what} of {len} bytes: out of memory (lower {what})"),
        )
    })?;
    engine
        .register_memory(buf.addr(), len, HOST_LOCATION)
        .map_err(|e| {
            StoreError::new(
                Code::InternalError,
                format!("cannot register {what} with the transfer engine: {e}"),
            )
        })?;
    Ok(Some(buf))
}

fn closed() -> StoreError {
    StoreError::new(
        Code::UnavailableInCurrentStatus,
        "the store is closed (close() was called) or was never set up: call setup() first",
    )
}

/// Checks a key as the master will, so that a bad key fails without a round trip.
pub fn check_key(key: &str) -> Result<(), StoreError> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(StoreError::new(
            Code::InvalidParams,
            format!(
                "key of {} bytes: keys must be 1 to {MAX_KEY_BYTES} bytes",
                key.len()
            ),
        ));
    }
    Ok(())
}

fn code_of(v: i32) -> Code {
    Code::from_value(v).unwrap_or(Code::InternalError)
}

impl StoreClient {
    /// Connects to the master, mounts `global_segment_size` bytes of new memory as this
    /// client's segment (registered with `engine`), and keeps a staging buffer of
    /// `local_buffer_size` bytes. The engine may be shared with the caller.
    pub fn setup(engine: Arc<TransferEngine>, cfg: &ClientConfig) -> Result<Self, StoreError> {
        let client_id = random_id()?;
        let link = MasterLink::connect(&cfg.master_server_addr, client_id)?;
        let name = engine.session_id().to_string();
        let staging =
            alloc_registered(&engine, cfg.local_buffer_size, "local_buffer_size")?.map(|buf| {
                Staging {
                    alloc: Mutex::new(SegmentAllocator::new(buf.addr(), buf.len() as u64)),
                    buf,
                }
            });
        let segment =
            match alloc_registered(&engine, cfg.global_segment_size, "global_segment_size") {
                Ok(s) => s,
                Err(e) => {
                    unregister(&engine, staging.as_ref().map(|s| &s.buf));
                    return Err(e);
                }
            };
        if let Some(seg) = &segment {
            let mounted = random_id().and_then(|id| {
                link.mount(msg::Segment {
                    id: Some(msg::Id::from_u128(id)),
                    name: name.clone(),
                    base: seg.addr(),
                    size: seg.len() as u64,
                })
            });
            if let Err(e) = mounted {
                unregister(&engine, Some(seg));
                unregister(&engine, staging.as_ref().map(|s| &s.buf));
                return Err(e);
            }
        }
        tracing::info!(
            "store: client {name} set up with master {} ({} bytes mounted)",
            link.master_addr(),
            cfg.global_segment_size
        );
        Ok(Self {
            open: RwLock::new(Some(Open {
                engine,
                link,
                name,
                segment,
                staging,
                registered: Mutex::new(BTreeMap::new()),
            })),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&Open) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let open = self.open.read();
        let open = open.as_ref().ok_or_else(closed)?;
        f(open)
    }

    /// This client's segment name (`preferred_segment` for its own segment).
    pub fn hostname(&self) -> Result<String, StoreError> {
        self.with(|o| Ok(o.name.clone()))
    }

    /// The engine the store moves bytes with.
    pub fn engine(&self) -> Result<Arc<TransferEngine>, StoreError> {
        self.with(|o| Ok(Arc::clone(&o.engine)))
    }

    /// Registers caller memory for the zero-copy calls.
    pub fn register_buffer(&self, addr: u64, len: u64) -> Result<(), StoreError> {
        self.with(|o| {
            if addr == 0 || len == 0 {
                return Err(StoreError::new(
                    Code::InvalidParams,
                    format!("register_buffer({addr:#x}, {len}): a null address or zero length"),
                ));
            }
            o.engine.register_memory(addr, len, "*").map_err(|e| {
                StoreError::new(Code::InvalidParams, format!("register_buffer: {e}"))
            })?;
            o.registered.lock().insert(addr, len);
            Ok(())
        })
    }

    /// Unregisters memory of [`register_buffer`](Self::register_buffer); once this
    /// returns, no engine thread touches it.
    pub fn unregister_buffer(&self, addr: u64) -> Result<(), StoreError> {
        self.with(|o| {
            if o.registered.lock().remove(&addr).is_none() {
                return Err(StoreError::new(
                    Code::InvalidParams,
                    format!("unregister_buffer({addr:#x}): not registered through this store"),
                ));
            }
            o.engine.unregister_memory(addr).map_err(|e| {
                StoreError::new(Code::InternalError, format!("unregister_buffer: {e}"))
            })
        })
    }

    /// Per key: 1 exists, 0 does not, or the error.
    pub fn batch_exist(
        &self,
        keys: &[String],
    ) -> Result<Vec<Result<bool, StoreError>>, StoreError> {
        self.with(|o| {
            let mut out = Vec::with_capacity(keys.len());
            for chunk in keys.chunks(MAX_BATCH) {
                let (valid, pos) = valid_keys(chunk, &mut out, Err);
                if valid.is_empty() {
                    continue;
                }
                let req = KeysRequest::new(o.link.client_id(), valid.iter().copied());
                let reply = o.link.call(|mut c| {
                    let req = req.clone();
                    async move { c.batch_exist(req).await }
                })?;
                fill(
                    &mut out,
                    &pos,
                    reply.codes.iter().map(|&v| match v {
                        1 => Ok(true),
                        0 => Ok(false),
                        v => Err(StoreError::new(
                            code_of(v),
                            format!("is_exist: {}", code_of(v)),
                        )),
                    }),
                    &valid,
                )?;
            }
            Ok(out)
        })
    }

    /// Where each key's committed replicas are (and a lease on them).
    pub fn batch_replicas(
        &self,
        keys: &[String],
    ) -> Result<Vec<Result<Vec<Replica>, StoreError>>, StoreError> {
        self.with(|o| o.replicas(keys))
    }

    /// Removes keys (`force`: even when a reader holds a lease).
    pub fn batch_remove(
        &self,
        keys: &[String],
        force: bool,
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        self.with(|o| {
            let mut out = Vec::with_capacity(keys.len());
            for chunk in keys.chunks(MAX_BATCH) {
                let (valid, pos) = valid_keys(chunk, &mut out, Err);
                if valid.is_empty() {
                    continue;
                }
                let req = RemoveRequest {
                    client_id: o.link.client_id(),
                    keys: valid.iter().map(|k| k.to_string()).collect(),
                    force,
                };
                let reply = o.link.call(|mut c| {
                    let req = req.clone();
                    async move { c.batch_remove(req).await }
                })?;
                let results = reply.codes.iter().zip(&valid).map(|(&v, k)| match v {
                    0 => Ok(()),
                    v => Err(StoreError::from_code(code_of(v), k)),
                });
                fill(&mut out, &pos, results, &valid)?;
            }
            Ok(out)
        })
    }

    /// Removes every unleased object whose key matches `pattern`; returns how many.
    pub fn remove_by_regex(&self, pattern: &str) -> Result<u64, StoreError> {
        self.with(|o| {
            let req = RegexRequest {
                client_id: o.link.client_id(),
                pattern: pattern.to_string(),
            };
            let reply = o.link.call(|mut c| {
                let req = req.clone();
                async move { c.remove_by_regex(req).await }
            })?;
            match reply.code {
                0 => Ok(reply.count),
                v => Err(StoreError::new(
                    code_of(v),
                    format!("remove_by_regex({pattern:?}): not a valid regular expression"),
                )),
            }
        })
    }

    /// Removes every unleased object; returns how many.
    pub fn remove_all(&self) -> Result<u64, StoreError> {
        self.with(|o| {
            let client_id = o.link.client_id();
            let reply = o
                .link
                .call(|mut c| async move { c.remove_all(ClientRequest { client_id }).await })?;
            Ok(reply.count)
        })
    }

    /// Unmounts this client's segment, says goodbye to the master and frees the memory
    /// (after the engine lets go of it). Later calls fail with
    /// `UNAVAILABLE_IN_CURRENT_STATUS`; a second `close` is a no-op.
    pub fn close(&self) -> Result<(), StoreError> {
        let Some(open) = self.open.write().take() else {
            return Ok(());
        };
        let goodbye = open.link.close();
        unregister(&open.engine, open.segment.as_ref());
        unregister(&open.engine, open.staging.as_ref().map(|s| &s.buf));
        for (&addr, _) in open.registered.lock().iter() {
            let _ = open.engine.unregister_memory(addr);
        }
        goodbye
    }

    /// Whether [`close`](Self::close) ran.
    pub fn is_closed(&self) -> bool {
        self.open.read().is_none()
    }
}

impl Drop for StoreClient {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::debug!("store: close on drop: {e}");
        }
    }
}

fn unregister(engine: &TransferEngine, buf: Option<&HostBuffer>) {
    if let Some(buf) = buf {
        if let Err(e) = engine.unregister_memory(buf.addr()) {
            tracing::warn!("store: cannot unregister {:#x}: {e}", buf.addr());
        }
    }
}

/// Splits a chunk of keys into those worth sending and, for the others, their error
/// (pushed to `out` at once). Returns the keys to send and their positions in `out`.
fn valid_keys<'k, T>(
    chunk: &'k [String],
    out: &mut Vec<Result<T, StoreError>>,
    bad: impl Fn(StoreError) -> Result<T, StoreError>,
) -> (Vec<&'k str>, Vec<usize>) {
    let mut valid = Vec::with_capacity(chunk.len());
    let mut pos = Vec::with_capacity(chunk.len());
    for key in chunk {
        match check_key(key) {
            Ok(()) => {
                pos.push(out.len());
                out.push(Err(StoreError::new(Code::InternalError, "not answered")));
                valid.push(key.as_str());
            }
            Err(e) => out.push(bad(e)),
        }
    }
    (valid, pos)
}

/// Puts the master's answers at their keys' positions; an answer of the wrong length is
/// the master's fault, and fails the call.
fn fill<T>(
    out: &mut [Result<T, StoreError>],
    pos: &[usize],
    results: impl ExactSizeIterator<Item = Result<T, StoreError>>,
    keys: &[&str],
) -> Result<(), StoreError> {
    if results.len() != keys.len() {
        return Err(StoreError::new(
            Code::RpcFail,
            format!(
                "the master answered {} results for {} keys",
                results.len(),
                keys.len()
            ),
        ));
    }
    for (&p, r) in pos.iter().zip(results) {
        if let Some(slot) = out.get_mut(p) {
            *slot = r;
        }
    }
    Ok(())
}

impl Open {
    fn replicas(
        &self,
        keys: &[String],
    ) -> Result<Vec<Result<Vec<Replica>, StoreError>>, StoreError> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(MAX_BATCH) {
            let (valid, pos) = valid_keys(chunk, &mut out, Err);
            if valid.is_empty() {
                continue;
            }
            let req = KeysRequest::new(self.link.client_id(), valid.iter().copied());
            let reply = self.link.call(|mut c| {
                let req = req.clone();
                async move { c.batch_get_replicas(req).await }
            })?;
            let results = reply.results.into_iter().zip(&valid).map(|(r, k)| {
                if r.code != 0 {
                    return Err(StoreError::from_code(code_of(r.code), k));
                }
                if r.replicas.is_empty() {
                    return Err(StoreError::from_code(Code::ObjectNotFound, k));
                }
                Ok(r.replicas
                    .into_iter()
                    .map(|r| Replica {
                        segment: r.segment,
                        addr: r.addr,
                        len: r.len,
                    })
                    .collect())
            });
            let results: Vec<_> = results.collect();
            fill(&mut out, &pos, results.into_iter(), &valid)?;
        }
        Ok(out)
    }
}

impl PutConfig {
    /// The wire form.
    pub(crate) fn to_msg(&self) -> msg::PutConfig {
        msg::PutConfig {
            replica_num: self.replica_num,
            preferred_segment: self.preferred_segment.clone(),
            with_soft_pin: self.with_soft_pin,
        }
    }
}
