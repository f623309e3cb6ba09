//! Moving objects' bytes: a put writes every replica the master placed, a get reads one
//! replica, both with the transfer engine (one batch per target segment, all waited
//! for before the call returns) or, for a replica in this client's own segment, a copy.
//! This module holds the store's only `unsafe`: handing caller addresses to the engine.

use std::collections::HashMap;
use std::time::Instant;

use transfer_engine::memory::MemSpan;
use transfer_engine::{OpCode, Request, TaskStatus};

use super::{check_key, closed, code_of, fill, Open, StoreClient, StoreError};
use crate::codes::Code;
use crate::master::state::{PutConfig, Replica};
use crate::rpc::messages::{KeysRequest, PutItem, PutStartRequest};
use crate::rpc::MAX_BATCH;

/// A run of caller memory: `len` bytes at `addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub addr: u64,
    pub len: u64,
}

impl Piece {
    pub fn new(addr: u64, len: u64) -> Self {
        Self { addr, len }
    }
}

fn total(pieces: &[Piece]) -> Option<u64> {
    pieces
        .iter()
        .try_fold(0u64, |acc, p| acc.checked_add(p.len))
}

/// One replica to write or read for one key.
struct Job {
    key: usize,
    replica: Replica,
    /// The caller's memory, in object order, exactly the replica's length in all.
    pieces: Vec<Piece>,
}

/// Cuts `pieces` to their first `len` bytes.
fn truncate(pieces: &[Piece], mut len: u64) -> Vec<Piece> {
    let mut out = Vec::with_capacity(pieces.len());
    for p in pieces {
        if len == 0 {
            break;
        }
        let n = p.len.min(len);
        if n > 0 {
            out.push(Piece::new(p.addr, n));
        }
        len -= n;
    }
    out
}

impl Open {
    /// The range of this client's own segment, if it has one.
    fn own_range(&self) -> Option<(u64, u64)> {
        self.segment.as_ref().map(|s| (s.addr(), s.len() as u64))
    }

    /// Runs `jobs` (`op` is from the caller's point of view: `Write` puts) and returns,
    /// per key index, the first failure. Every transfer has finished or been drained
    /// when this returns.
    ///
    /// # Safety
    /// Every piece is valid (for `Read`, writable) for the duration of the call.
    unsafe fn execute(&self, op: OpCode, jobs: &[Job], keys: usize) -> Vec<Option<StoreError>> {
        let mut failed: Vec<Option<StoreError>> = (0..keys).map(|_| None).collect();
        let mut fail = |key: usize, e: StoreError| {
            if let Some(slot) = failed.get_mut(key) {
                slot.get_or_insert(e);
            }
        };
        let mut groups: HashMap<&str, (Vec<Request>, Vec<usize>)> = HashMap::new();
        for job in jobs {
            let mut at = job.replica.addr;
            if job.replica.segment == self.name {
                // SAFETY: as this function's contract.
                if let Err(e) = unsafe { self.copy_locally(op, job) } {
                    fail(job.key, e);
                }
                continue;
            }
            let (reqs, owners) = groups.entry(job.replica.segment.as_str()).or_default();
            for p in &job.pieces {
                reqs.push(Request::new(op, p.addr, at, p.len));
                owners.push(job.key);
                at = at.saturating_add(p.len);
            }
        }
        let single = groups.len() == 1;
        let mut batches = Vec::with_capacity(groups.len());
        for (segment, (reqs, owners)) in &groups {
            // SAFETY: the pieces are valid for the call (this function's contract), and
            // every batch is waited for (drained on a timeout) below before returning.
            let submitted = unsafe {
                if single {
                    self.engine.submit_to_wait(segment, reqs)
                } else {
                    self.engine.submit(segment, reqs)
                }
            };
            match submitted {
                Ok(batch) => batches.push((segment, batch, owners)),
                Err(e) => {
                    for &k in owners {
                        fail(
                            k,
                            StoreError::new(
                                Code::TransferFail,
                                format!("cannot reach segment {segment}: {e}"),
                            ),
                        );
                    }
                }
            }
        }
        for (segment, batch, owners) in batches {
            let waited = batch.wait();
            for (i, &k) in owners.iter().enumerate() {
                match batch.task(i) {
                    Some(TaskStatus::Completed) => {}
                    Some(TaskStatus::Failed(e)) => fail(
                        k,
                        StoreError::new(
                            Code::TransferFail,
                            format!("transfer with segment {segment} failed: {e}"),
                        ),
                    ),
                    _ => fail(
                        k,
                        StoreError::new(
                            Code::TransferFail,
                            format!(
                                "transfer with segment {segment} did not finish: {}",
                                waited
                                    .as_ref()
                                    .err()
                                    .map_or("canceled".to_string(), |e| e.to_string())
                            ),
                        ),
                    ),
                }
            }
        }
        failed
    }

    /// A replica in this client's own segment: a copy, after checking that the master's
    /// address lies inside the segment.
    ///
    /// # Safety
    /// As [`execute`](Self::execute).
    unsafe fn copy_locally(&self, op: OpCode, job: &Job) -> Result<(), StoreError> {
        let (base, size) = self.own_range().ok_or_else(|| {
            StoreError::new(
                Code::InternalError,
                "the master placed a replica in this client's segment, which it never mounted",
            )
        })?;
        let len = total(&job.pieces).unwrap_or(u64::MAX);
        let inside = job.replica.addr >= base
            && job
                .replica
                .addr
                .checked_add(len)
                .is_some_and(|end| end <= base + size);
        if !inside {
            return Err(StoreError::new(
                Code::InternalError,
                format!(
                    "the master named {:#x}+{len}, outside this client's segment {base:#x}+{size}",
                    job.replica.addr
                ),
            ));
        }
        let mut at = job.replica.addr;
        for p in &job.pieces {
            let n = usize::try_from(p.len).unwrap_or(usize::MAX);
            // SAFETY: the piece is valid by the contract; the segment range was checked
            // above and is this client's own registered memory.
            let (caller, segment) = unsafe { (MemSpan::new(p.addr, n), MemSpan::new(at, n)) };
            let copied = match op {
                OpCode::Write => segment.copy_from(&caller),
                OpCode::Read => caller.copy_from(&segment),
            };
            copied.map_err(|e| StoreError::new(Code::InternalError, format!("local copy: {e}")))?;
            at += p.len;
        }
        Ok(())
    }

    /// Puts each key from its pieces.
    ///
    /// # Safety
    /// Every piece is valid for reads for the duration of the call.
    unsafe fn put(
        &self,
        keys: &[String],
        sources: &[Vec<Piece>],
        cfg: &PutConfig,
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        if keys.len() != sources.len() {
            return Err(StoreError::new(
                Code::InvalidParams,
                format!("{} keys but {} buffer lists", keys.len(), sources.len()),
            ));
        }
        let mut out = Vec::with_capacity(keys.len());
        for (chunk, chunk_sources) in keys.chunks(MAX_BATCH).zip(sources.chunks(MAX_BATCH)) {
            // SAFETY: as this function's contract.
            out.extend(unsafe { self.put_chunk(chunk, chunk_sources, cfg) }?);
        }
        Ok(out)
    }

    unsafe fn put_chunk(
        &self,
        keys: &[String],
        sources: &[Vec<Piece>],
        cfg: &PutConfig,
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let mut out: Vec<Result<(), StoreError>> = Vec::with_capacity(keys.len());
        let mut items = Vec::new();
        let mut pos = Vec::new();
        for (key, pieces) in keys.iter().zip(sources) {
            let checked = check_key(key).and_then(|()| match total(pieces) {
                Some(0) | None => Err(StoreError::new(
                    Code::InvalidParams,
                    format!("{key:?}: a value of 0 bytes (or of more than 2^64) cannot be put"),
                )),
                Some(len) => Ok(len),
            });
            match checked {
                Ok(len) => {
                    pos.push(out.len());
                    out.push(Ok(()));
                    items.push(PutItem {
                        key: key.clone(),
                        len,
                    });
                }
                Err(e) => out.push(Err(e)),
            }
        }
        if items.is_empty() {
            return Ok(out);
        }
        let req = PutStartRequest {
            client_id: self.link.client_id(),
            items,
            config: Some(cfg.to_msg()),
        };
        let reply = self.link.call(|mut c| {
            let req = req.clone();
            async move { c.batch_put_start(req).await }
        })?;
        if reply.results.len() != req.items.len() {
            return Err(StoreError::new(
                Code::RpcFail,
                format!(
                    "the master answered {} placements for {} keys",
                    reply.results.len(),
                    req.items.len()
                ),
            ));
        }
        let mut jobs = Vec::new();
        let mut started = Vec::new();
        for (i, (r, item)) in reply.results.into_iter().zip(&req.items).enumerate() {
            let at = pos.get(i).copied().unwrap_or(usize::MAX);
            if r.code != 0 {
                if let Some(slot) = out.get_mut(at) {
                    *slot = Err(StoreError::from_code(code_of(r.code), &item.key));
                }
                continue;
            }
            started.push(i);
            let pieces = sources.get(at).cloned().unwrap_or_default();
            for rep in r.replicas {
                if rep.len != item.len {
                    if let Some(slot) = out.get_mut(at) {
                        *slot = Err(StoreError::new(
                            Code::InternalError,
                            format!(
                                "{:?}: the master placed {} bytes for a {}-byte value",
                                item.key, rep.len, item.len
                            ),
                        ));
                    }
                    continue;
                }
                jobs.push(Job {
                    key: i,
                    replica: Replica {
                        segment: rep.segment,
                        addr: rep.addr,
                        len: rep.len,
                    },
                    pieces: pieces.clone(),
                });
            }
        }
        // SAFETY: as this function's contract.
        let failed = unsafe { self.execute(OpCode::Write, &jobs, req.items.len()) };
        let mut commit = Vec::new();
        let mut revoke = Vec::new();
        for &i in &started {
            let at = pos.get(i).copied().unwrap_or(usize::MAX);
            let key = req
                .items
                .get(i)
                .map(|it| it.key.clone())
                .unwrap_or_default();
            let transfer_failed = failed.get(i).cloned().flatten();
            let already_failed = out.get(at).is_some_and(|r| r.is_err());
            match (transfer_failed, already_failed) {
                (None, false) => commit.push((at, key)),
                (Some(e), _) => {
                    if let Some(slot) = out.get_mut(at) {
                        *slot = Err(e);
                    }
                    revoke.push(key);
                }
                (None, true) => revoke.push(key),
            }
        }
        if !revoke.is_empty() {
            let req = KeysRequest::new(self.link.client_id(), revoke.iter().map(String::as_str));
            if let Err(e) = self.link.call(|mut c| {
                let req = req.clone();
                async move { c.batch_put_revoke(req).await }
            }) {
                tracing::warn!("store: revoking {} failed puts: {e} (the master discards them after put_start_discard_timeout_sec)", req.len());
            }
        }
        if !commit.is_empty() {
            let keys: Vec<&str> = commit.iter().map(|(_, k)| k.as_str()).collect();
            let req = KeysRequest::new(self.link.client_id(), keys.iter().copied());
            let reply = self.link.call(|mut c| {
                let req = req.clone();
                async move { c.batch_put_end(req).await }
            })?;
            let ends = reply.codes.iter().zip(&keys).map(|(&v, k)| match v {
                0 => Ok(()),
                v => Err(StoreError::from_code(code_of(v), k)),
            });
            let slots: Vec<usize> = commit.iter().map(|(at, _)| *at).collect();
            fill(&mut out, &slots, ends, &keys)?;
        }
        Ok(out)
    }

    /// Gets each key into the memory `dest(key index, object size)` names; returns the
    /// bytes read per key.
    ///
    /// # Safety
    /// The pieces `dest` returns are valid for writes for the duration of the call.
    unsafe fn get(
        &self,
        keys: &[String],
        dest: &mut dyn FnMut(usize, u64) -> Result<Vec<Piece>, StoreError>,
    ) -> Result<Vec<Result<u64, StoreError>>, StoreError> {
        let asked = Instant::now();
        let found = self.replicas(keys)?;
        let lease_ends = asked + self.link.lease_ttl();
        let mut out: Vec<Result<u64, StoreError>> = Vec::with_capacity(keys.len());
        let mut jobs = Vec::new();
        for (i, r) in found.into_iter().enumerate() {
            let replicas = match r {
                Ok(r) => r,
                Err(e) => {
                    out.push(Err(e));
                    continue;
                }
            };
            let own = replicas
                .iter()
                .position(|r| r.segment == self.name)
                .unwrap_or(0);
            let Some(replica) = replicas.into_iter().nth(own) else {
                out.push(Err(StoreError::new(Code::ObjectNotFound, "no replica")));
                continue;
            };
            let size = replica.len;
            match dest(i, size) {
                Ok(pieces) => {
                    out.push(Ok(size));
                    jobs.push(Job {
                        key: i,
                        replica,
                        pieces: truncate(&pieces, size),
                    });
                }
                Err(e) => out.push(Err(e)),
            }
        }
        // SAFETY: as this function's contract.
        let failed = unsafe { self.execute(OpCode::Read, &jobs, keys.len()) };
        let late = Instant::now() > lease_ends;
        for job in &jobs {
            if let Some(slot) = out.get_mut(job.key) {
                if let Some(Some(e)) = failed.get(job.key) {
                    *slot = Err(e.clone());
                } else if late {
                    *slot = Err(StoreError::new(
                        Code::LeaseExpired,
                        format!(
                            "{:?}: the read outlasted its lease ({:?}): the bytes may have changed under it",
                            keys.get(job.key).map(String::as_str).unwrap_or(""),
                            self.link.lease_ttl()
                        ),
                    ));
                }
            }
        }
        Ok(out)
    }
}

/// A place in the staging buffer, freed when dropped.
struct Staged<'a> {
    open: &'a Open,
    addr: u64,
}

impl Drop for Staged<'_> {
    fn drop(&mut self) {
        if let Some(s) = &self.open.staging {
            s.alloc.lock().free(self.addr);
        }
    }
}

impl Open {
    fn stage(&self, len: u64) -> Option<Staged<'_>> {
        let addr = self.staging.as_ref()?.alloc.lock().allocate(len)?;
        Some(Staged { open: self, addr })
    }
}

fn buffer_overflow(key: &str, size: u64, capacity: u64) -> StoreError {
    StoreError::new(
        Code::BufferOverflow,
        format!(
            "{key:?}: the object has {size} bytes, the buffer only {capacity}: nothing was read"
        ),
    )
}

impl StoreClient {
    /// Puts each key, gathering its value from its pieces (several buffers: K and V).
    ///
    /// # Safety
    /// Every piece is valid for reads until this returns.
    pub unsafe fn batch_put_from(
        &self,
        keys: &[String],
        sources: &[Vec<Piece>],
        cfg: &PutConfig,
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let open = self.open.read();
        let open = open.as_ref().ok_or_else(closed)?;
        // SAFETY: as this function's contract.
        unsafe { open.put(keys, sources, cfg) }
    }

    /// Gets each key into its pieces, in order; returns the bytes read. An object larger
    /// than its pieces is `BUFFER_OVERFLOW` and nothing is written.
    ///
    /// # Safety
    /// Every piece is valid for writes until this returns.
    pub unsafe fn batch_get_into(
        &self,
        keys: &[String],
        dests: &[Vec<Piece>],
    ) -> Result<Vec<Result<u64, StoreError>>, StoreError> {
        if keys.len() != dests.len() {
            return Err(StoreError::new(
                Code::InvalidParams,
                format!("{} keys but {} buffer lists", keys.len(), dests.len()),
            ));
        }
        let open = self.open.read();
        let open = open.as_ref().ok_or_else(closed)?;
        let mut dest = |i: usize, size: u64| {
            let pieces = dests.get(i).cloned().unwrap_or_default();
            let capacity = total(&pieces).unwrap_or(u64::MAX);
            if size > capacity {
                let key = keys.get(i).map(String::as_str).unwrap_or("");
                return Err(buffer_overflow(key, size, capacity));
            }
            Ok(pieces)
        };
        // SAFETY: as this function's contract.
        unsafe { open.get(keys, &mut dest) }
    }

    /// Puts `parts` concatenated under `key` (copied through the staging buffer when it
    /// has room).
    pub fn put_parts(&self, key: &str, parts: &[&[u8]], cfg: &PutConfig) -> Result<(), StoreError> {
        let open = self.open.read();
        let open = open.as_ref().ok_or_else(closed)?;
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let keys = [key.to_string()];
        let staged = open.stage(len);
        let pieces = match &staged {
            Some(s) => {
                let mut at = s.addr;
                for p in parts {
                    // SAFETY: the staging range [s.addr, s.addr+len) is ours, allocated above.
                    let span = unsafe { MemSpan::new(at, p.len()) };
                    span.write_from(p)
                        .map_err(|e| StoreError::new(Code::InternalError, e.to_string()))?;
                    at += p.len() as u64;
                }
                vec![Piece::new(s.addr, len)]
            }
            None => parts
                .iter()
                .filter(|p| !p.is_empty())
                .map(|p| Piece::new(p.as_ptr() as u64, p.len() as u64))
                .collect(),
        };
        // SAFETY: the pieces are the staging range or the borrowed parts, both alive
        // until this returns.
        let mut r = unsafe { open.put(&keys, &[pieces], cfg) }?;
        r.pop().unwrap_or(Ok(()))
    }

    /// Gets each key's whole value as bytes.
    pub fn batch_get_bytes(
        &self,
        keys: &[String],
    ) -> Result<Vec<Result<Vec<u8>, StoreError>>, StoreError> {
        let open = self.open.read();
        let open = open.as_ref().ok_or_else(closed)?;
        let mut bufs: Vec<Vec<u8>> = keys.iter().map(|_| Vec::new()).collect();
        let mut dest = |i: usize, size: u64| {
            let n = usize::try_from(size).map_err(|_| {
                StoreError::new(
                    Code::InvalidParams,
                    format!("an object of {size} bytes does not fit in memory"),
                )
            })?;
            let buf = bufs
                .get_mut(i)
                .ok_or_else(|| StoreError::new(Code::InternalError, "key index"))?;
            buf.try_reserve_exact(n).map_err(|_| {
                StoreError::new(
                    Code::InternalError,
                    format!("cannot allocate {n} bytes for the value"),
                )
            })?;
            buf.resize(n, 0);
            Ok(vec![Piece::new(buf.as_mut_ptr() as u64, size)])
        };
        // SAFETY: each piece is the heap buffer of one `Vec` in `bufs`, sized above and
        // neither moved nor dropped until after this call.
        let got = unsafe { open.get(keys, &mut dest) }?;
        Ok(got
            .into_iter()
            .zip(bufs)
            .map(|(r, buf)| r.map(|_| buf))
            .collect())
    }
}
