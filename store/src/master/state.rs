//! The master's state machine: segments, objects, leases, eviction and client liveness,
//! decided from events and the time alone.
//!
//! Like quinn-proto's `Connection`, [`State`] does no I/O, starts no threads and reads no
//! clock: every event carries its `now`, so every rule (lease expiry, soft-pin expiry,
//! dead clients, stale puts, eviction) is tested on synthetic time. The RPC service
//! drives it: getters (`stats`, `segments`, `keys`, `query`), `handle_ping` and the
//! mutators for the clients' calls, then `handle_timeout(now)` whenever
//! `poll_timeout()` says (and at least every few hundred milliseconds, since eviction
//! above the watermark follows the fill ratio, not the time).
//!
//! An object's life: `put_start` reserves space (pending: invisible to readers),
//! `put_end` commits it (readable), and it leaves by `remove`, eviction or the loss of
//! its last replica's segment. A pending put that is revoked frees its space at once; one
//! that is discarded (too old, its writer dead, a segment gone) frees its key at once but
//! its space only after `put_release_timeout`, because a slow writer may still be
//! writing into it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::alloc::SegmentAllocator;
use crate::codes::Code;

/// A client, as it names itself (chosen at random).
pub type ClientId = u128;
/// A mounted segment, as its client names it (chosen at random).
pub type SegmentId = u128;
/// The longest key; longer or empty keys are [`Code::InvalidParams`].
pub const MAX_KEY_BYTES: usize = 4096;

/// The rules the master applies; `mooncake_master`'s flags set them.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Above this fill ratio (used / capacity over all segments) `handle_timeout` evicts.
    pub high_watermark: f64,
    /// Share of committed objects evicted per round.
    pub eviction_ratio: f64,
    /// A `get_replicas` grants a lease until now + ttl.
    pub kv_lease_ttl: Duration,
    /// A soft pin lasts this long after the last put or get.
    pub soft_pin_ttl: Duration,
    /// Soft-pinned objects are evicted, but only after all unpinned ones.
    pub allow_evict_soft_pinned: bool,
    /// A client with no ping, mount or other call for this long is dead.
    pub client_ttl: Duration,
    /// An uncommitted put older than this is discarded (its key is free again).
    pub put_discard_timeout: Duration,
    /// ... but its space is only reused after this (a slow writer may still write).
    pub put_release_timeout: Duration,
}

impl Default for Policy {
    /// Upstream's defaults.
    fn default() -> Self {
        Self {
            high_watermark: 0.90,
            eviction_ratio: 0.05,
            kv_lease_ttl: Duration::from_secs(10),
            soft_pin_ttl: Duration::from_secs(30 * 60),
            allow_evict_soft_pinned: true,
            client_ttl: Duration::from_secs(10),
            put_discard_timeout: Duration::from_secs(30),
            put_release_timeout: Duration::from_secs(600),
        }
    }
}

/// A segment a client mounts: `size` bytes at `base` in the memory of the transfer
/// engine named `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentSpec {
    pub id: SegmentId,
    /// The owner's transfer-engine segment name.
    pub name: String,
    pub base: u64,
    pub size: u64,
}

/// How a put wants its replicas placed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PutConfig {
    /// How many replicas, each in its own segment; 0 is treated as 1.
    pub replica_num: u32,
    /// The segment name to place the first replica in when it has room; "" for none.
    pub preferred_segment: String,
    /// Evict this object only after every unpinned one (for `soft_pin_ttl`).
    pub with_soft_pin: bool,
}

/// Where one copy of an object lies: `len` bytes at absolute address `addr` of the
/// transfer-engine segment `segment`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    pub segment: String,
    pub addr: u64,
    pub len: u64,
}

/// What a ping learns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// The master knows the client; its segments are mounted.
    Known,
    /// The master does not know the client (it restarted, or declared the client dead):
    /// the client must mount its segments again.
    Unknown,
}

/// Counters for metrics and `/health`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Committed objects.
    pub objects: u64,
    pub pending_puts: u64,
    /// Committed value bytes, counted once per object.
    pub object_bytes: u64,
    pub capacity: u64,
    /// Allocated bytes, pending and quarantined puts included.
    pub used: u64,
    pub segments: u64,
    pub clients: u64,
    pub evicted_total: u64,
    pub discarded_puts_total: u64,
    pub dead_clients_total: u64,
}

/// One mounted segment, for `/get_all_segments`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentView {
    pub name: String,
    pub id: SegmentId,
    pub client: ClientId,
    pub base: u64,
    pub size: u64,
    pub used: u64,
}

/// One object, for `/query_key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectView {
    pub key: String,
    pub size: u64,
    pub replicas: Vec<Replica>,
    pub committed: bool,
    pub leased: bool,
    pub soft_pinned: bool,
}

/// What one `handle_timeout` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use]
pub struct Sweep {
    /// Clients declared dead, their segments unmounted.
    pub dead_clients: Vec<ClientId>,
    /// Pending puts discarded (too old, or their writer or a segment gone).
    pub discarded_puts: usize,
    /// Discarded puts whose quarantined space was freed.
    pub released: usize,
    pub evicted: usize,
}

/// The master's handle on one mount. Never reused, so a quarantined range that names a
/// segment unmounted since is never mistaken for space of a later mount with the same
/// [`SegmentId`].
type Mount = u64;

/// One allocation: the space of one replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Loc {
    mount: Mount,
    addr: u64,
}

#[derive(Debug)]
struct Segment {
    id: SegmentId,
    name: String,
    client: ClientId,
    alloc: SegmentAllocator,
}

#[derive(Debug)]
struct Client {
    last_seen: Instant,
}

#[derive(Debug)]
struct Object {
    size: u64,
    replicas: Vec<Loc>,
    phase: Phase,
}

#[derive(Debug)]
enum Phase {
    Pending(Pending),
    Committed(Committed),
}

#[derive(Debug)]
struct Pending {
    client: ClientId,
    started: Instant,
    /// Tells apart puts started at the same instant in the pending and quarantine maps.
    seq: u64,
    soft_pin: bool,
}

#[derive(Debug)]
struct Committed {
    /// Position in the LRU order: larger is more recent.
    tick: u64,
    last_access: Instant,
    leased_at: Option<Instant>,
    soft_pin: bool,
}

/// The master's state. See the module documentation for the order of calls.
#[derive(Debug)]
pub struct State {
    policy: Policy,
    clients: HashMap<ClientId, Client>,
    segments: HashMap<Mount, Segment>,
    mounts: HashMap<SegmentId, Mount>,
    next_mount: Mount,
    /// Keys are shared with the indexes below, so a key's bytes are stored once.
    objects: HashMap<Arc<str>, Object>,
    /// Committed objects without a soft pin, least recently used first.
    lru_plain: BTreeMap<u64, Arc<str>>,
    /// Committed objects put with a soft pin (expired or not), least recently used first.
    lru_pinned: BTreeMap<u64, Arc<str>>,
    next_tick: u64,
    /// Pending puts by (start, seq): the oldest are discarded first.
    pending: BTreeMap<(Instant, u64), Arc<str>>,
    /// Space of discarded puts by (start, seq), freed at start + put_release_timeout.
    quarantine: BTreeMap<(Instant, u64), Vec<Loc>>,
    next_seq: u64,
    object_bytes: u64,
    /// The latest `now` seen, for the getters' "leased" and "soft pinned".
    clock: Option<Instant>,
    evicted_total: u64,
    discarded_puts_total: u64,
    dead_clients_total: u64,
}

impl State {
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            clients: HashMap::new(),
            segments: HashMap::new(),
            mounts: HashMap::new(),
            next_mount: 0,
            objects: HashMap::new(),
            lru_plain: BTreeMap::new(),
            lru_pinned: BTreeMap::new(),
            next_tick: 0,
            pending: BTreeMap::new(),
            quarantine: BTreeMap::new(),
            next_seq: 0,
            object_bytes: 0,
            clock: None,
            evicted_total: 0,
            discarded_puts_total: 0,
            dead_clients_total: 0,
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    // ---- getters ----

    pub fn stats(&self) -> Stats {
        Stats {
            objects: self.committed_count() as u64,
            pending_puts: self.pending.len() as u64,
            object_bytes: self.object_bytes,
            capacity: self.capacity(),
            used: self.used(),
            segments: self.segments.len() as u64,
            clients: self.clients.len() as u64,
            evicted_total: self.evicted_total,
            discarded_puts_total: self.discarded_puts_total,
            dead_clients_total: self.dead_clients_total,
        }
    }

    /// Every mounted segment, sorted by name (then id).
    pub fn segments(&self) -> Vec<SegmentView> {
        let mut v: Vec<SegmentView> = self
            .segments
            .values()
            .map(|s| SegmentView {
                name: s.name.clone(),
                id: s.id,
                client: s.client,
                base: s.alloc.base(),
                size: s.alloc.size(),
                used: s.alloc.used(),
            })
            .collect();
        v.sort_by(|a, b| (&a.name, a.id).cmp(&(&b.name, b.id)));
        v
    }

    /// The committed keys, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .lru_plain
            .values()
            .chain(self.lru_pinned.values())
            .map(|k| k.to_string())
            .collect();
        v.sort_unstable();
        v
    }

    /// A committed or pending object. "Leased" and "soft pinned" are as of the latest
    /// `now` any event carried.
    pub fn query(&self, key: &str) -> Option<ObjectView> {
        let obj = self.objects.get(key)?;
        let (committed, leased, soft_pinned) = match (&obj.phase, self.clock) {
            (Phase::Committed(c), Some(now)) => {
                (true, self.is_leased(c, now), self.is_pinned(c, now))
            }
            (Phase::Committed(_), None) => (true, false, false),
            (Phase::Pending(_), _) => (false, false, false),
        };
        Some(ObjectView {
            key: key.to_string(),
            size: obj.size,
            replicas: self.replica_views(&obj.replicas, obj.size),
            committed,
            leased,
            soft_pinned,
        })
    }

    pub fn is_known(&self, client: ClientId) -> bool {
        self.clients.contains_key(&client)
    }

    /// Whether the fill ratio is above the high watermark, so that `handle_timeout`
    /// evicts: the driver may call it again at once rather than on its next tick.
    pub fn over_watermark(&self) -> bool {
        let capacity = self.capacity();
        capacity > 0 && self.used() as f64 / capacity as f64 > self.policy.high_watermark
    }

    // ---- events ----

    /// A heartbeat. `Unknown` tells the client to mount its segments again; the ping
    /// does not register it (only a mount does).
    pub fn handle_ping(&mut self, now: Instant, client: ClientId) -> Liveness {
        self.observe(now);
        if self.touch_client(now, client) {
            Liveness::Known
        } else {
            Liveness::Unknown
        }
    }

    /// A client said hello: it is known (and alive) from now on, with or without a
    /// segment of its own (a client that lends no memory still puts and gets).
    pub fn register_client(&mut self, now: Instant, client: ClientId) {
        self.clients
            .entry(client)
            .and_modify(|c| c.last_seen = now)
            .or_insert(Client { last_seen: now });
    }

    /// Mounts a segment and registers its client. Mounting the same id with the same
    /// geometry again is a no-op. A segment of the same transfer-engine name whose range
    /// overlaps the new one but belongs to another client is stale (that engine's memory
    /// now belongs to the new client: its process restarted) and is unmounted first.
    pub fn mount_segment(
        &mut self,
        now: Instant,
        client: ClientId,
        spec: SegmentSpec,
    ) -> Result<(), Code> {
        self.observe(now);
        self.touch_client(now, client);
        let Some(end) = spec.base.checked_add(spec.size) else {
            return Err(Code::InvalidParams);
        };
        if spec.size == 0 || spec.name.is_empty() {
            return Err(Code::InvalidParams);
        }
        if let Some(seg) = self.mounts.get(&spec.id).and_then(|m| self.segments.get(m)) {
            let same = seg.client == client
                && seg.name == spec.name
                && seg.alloc.base() == spec.base
                && seg.alloc.size() == spec.size;
            return if same {
                Ok(())
            } else {
                Err(Code::InvalidParams)
            };
        }
        let overlapping: Vec<(Mount, ClientId)> = self
            .segments
            .iter()
            .filter(|(_, s)| {
                s.name == spec.name
                    && s.alloc.base() < end
                    && spec.base < s.alloc.base() + s.alloc.size()
            })
            .map(|(&m, s)| (m, s.client))
            .collect();
        if overlapping.iter().any(|&(_, c)| c == client) {
            // The same memory twice would hand out every byte twice.
            return Err(Code::InvalidParams);
        }
        if !overlapping.is_empty() {
            tracing::warn!(
                "segment {:?} mounted again by another client: the old mount is stale, its replicas are dropped",
                spec.name
            );
            let stale: Vec<Mount> = overlapping.into_iter().map(|(m, _)| m).collect();
            let _ = self.drop_segments(now, &stale);
        }
        self.clients
            .entry(client)
            .or_insert(Client { last_seen: now });
        let mount = self.next_mount;
        self.next_mount += 1;
        self.mounts.insert(spec.id, mount);
        self.segments.insert(
            mount,
            Segment {
                id: spec.id,
                name: spec.name,
                client,
                alloc: SegmentAllocator::new(spec.base, spec.size),
            },
        );
        Ok(())
    }

    /// Unmounts one of the client's segments: its replicas are dropped, objects left with
    /// none are removed, pending puts with a replica there are discarded.
    pub fn unmount_segment(
        &mut self,
        now: Instant,
        client: ClientId,
        id: SegmentId,
    ) -> Result<(), Code> {
        self.observe(now);
        self.touch_client(now, client);
        let mount = self
            .mounts
            .get(&id)
            .copied()
            .filter(|m| self.segments.get(m).is_some_and(|s| s.client == client))
            .ok_or(Code::InvalidParams)?;
        let _ = self.drop_segments(now, &[mount]);
        Ok(())
    }

    /// A graceful close: the client's pending puts are revoked (their space freed at
    /// once: the writer says it stopped), its segments unmounted, the client forgotten.
    pub fn disconnect(&mut self, now: Instant, client: ClientId) {
        self.observe(now);
        let _ = self.drop_client(now, client, true);
    }

    /// Whether a committed object has this key.
    pub fn exists(&mut self, now: Instant, key: &str) -> Result<bool, Code> {
        self.observe(now);
        check_key(key)?;
        Ok(matches!(
            self.objects.get(key).map(|o| &o.phase),
            Some(Phase::Committed(_))
        ))
    }

    /// The committed object's replicas. Grants (or extends) a lease until
    /// now + `kv_lease_ttl`, so that the object is neither removed nor evicted while the
    /// reader reads, and marks the object used (LRU).
    pub fn get_replicas(&mut self, now: Instant, key: &str) -> Result<Vec<Replica>, Code> {
        self.observe(now);
        check_key(key)?;
        let tick = self.bump_tick();
        let obj = self.objects.get_mut(key).ok_or(Code::ObjectNotFound)?;
        let Phase::Committed(c) = &mut obj.phase else {
            return Err(Code::ReplicaIsNotReady);
        };
        c.leased_at = Some(c.leased_at.map_or(now, |t| t.max(now)));
        c.last_access = c.last_access.max(now);
        let old = std::mem::replace(&mut c.tick, tick);
        let lru = if c.soft_pin {
            &mut self.lru_pinned
        } else {
            &mut self.lru_plain
        };
        if let Some(k) = lru.remove(&old) {
            lru.insert(tick, k);
        }
        let (replicas, size) = (obj.replicas.clone(), obj.size);
        Ok(self.replica_views(&replicas, size))
    }

    /// Reserves space for a new object and returns where to write it. See the crate's
    /// design notes: the preferred segment first when it has room, then the segments with
    /// the most free space; eviction (LRU, unpinned first, never leased or pending) when
    /// not even one replica fits; as many replicas as fit, at least one.
    pub fn put_start(
        &mut self,
        now: Instant,
        client: ClientId,
        key: &str,
        len: u64,
        cfg: &PutConfig,
    ) -> Result<Vec<Replica>, Code> {
        self.observe(now);
        check_key(key)?;
        if len == 0 {
            return Err(Code::InvalidParams);
        }
        if !self.touch_client(now, client) {
            return Err(Code::IllegalClient);
        }
        if self.objects.contains_key(key) {
            return Err(Code::ObjectAlreadyExists);
        }
        let want = (cfg.replica_num.max(1) as usize).min(self.segments.len());
        // Evicting cannot make room for an object larger than every segment.
        if !self.segments.values().any(|s| s.alloc.could_fit(len)) {
            return Err(Code::NoAvailableHandle);
        }
        self.make_room(now, len)?;
        let replicas = self.place(len, want, &cfg.preferred_segment);
        if replicas.is_empty() {
            return Err(Code::NoAvailableHandle);
        }
        let key: Arc<str> = Arc::from(key);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.pending.insert((now, seq), key.clone());
        let views = self.replica_views(&replicas, len);
        self.objects.insert(
            key,
            Object {
                size: len,
                replicas,
                phase: Phase::Pending(Pending {
                    client,
                    started: now,
                    seq,
                    soft_pin: cfg.with_soft_pin,
                }),
            },
        );
        Ok(views)
    }

    /// Commits the client's pending put: the object becomes readable.
    pub fn put_end(&mut self, now: Instant, client: ClientId, key: &str) -> Result<(), Code> {
        self.observe(now);
        check_key(key)?;
        self.touch_client(now, client);
        let tick = self.bump_tick();
        let obj = self.objects.get_mut(key).ok_or(Code::ObjectNotFound)?;
        let Phase::Pending(p) = &obj.phase else {
            return Err(Code::InvalidWrite);
        };
        if p.client != client {
            return Err(Code::InvalidWrite);
        }
        let Some(key) = self.pending.remove(&(p.started, p.seq)) else {
            return Err(Code::InternalError);
        };
        let soft_pin = p.soft_pin;
        obj.phase = Phase::Committed(Committed {
            tick,
            last_access: now,
            leased_at: None,
            soft_pin,
        });
        self.object_bytes += obj.size;
        self.lru_mut(soft_pin).insert(tick, key);
        Ok(())
    }

    /// Abandons the client's pending put; its space is free at once (the writer says it
    /// stopped writing).
    pub fn put_revoke(&mut self, now: Instant, client: ClientId, key: &str) -> Result<(), Code> {
        self.observe(now);
        check_key(key)?;
        self.touch_client(now, client);
        let obj = self.objects.get(key).ok_or(Code::ObjectNotFound)?;
        match &obj.phase {
            Phase::Pending(p) if p.client == client => {}
            _ => return Err(Code::InvalidWrite),
        }
        if let Some((obj, _)) = self.take_pending(key) {
            self.free_locs(&obj.replicas);
        }
        Ok(())
    }

    /// Removes a committed object; a leased one only with `force`.
    pub fn remove(&mut self, now: Instant, key: &str, force: bool) -> Result<(), Code> {
        self.observe(now);
        check_key(key)?;
        let obj = self.objects.get(key).ok_or(Code::ObjectNotFound)?;
        match &obj.phase {
            Phase::Pending(_) => return Err(Code::ReplicaIsNotReady),
            Phase::Committed(c) if !force && self.is_leased(c, now) => {
                return Err(Code::ObjectHasLease)
            }
            Phase::Committed(_) => {}
        }
        self.remove_committed(key);
        Ok(())
    }

    /// Removes every committed, unleased object whose key matches; returns how many.
    pub fn remove_matching(&mut self, now: Instant, pred: impl Fn(&str) -> bool) -> usize {
        self.observe(now);
        let doomed: Vec<Arc<str>> = self
            .lru_plain
            .values()
            .chain(self.lru_pinned.values())
            .filter(|k| {
                let k: &str = k;
                pred(k)
            })
            .filter(|k| !self.committed(k).is_some_and(|c| self.is_leased(c, now)))
            .cloned()
            .collect();
        for key in &doomed {
            self.remove_committed(key);
        }
        doomed.len()
    }

    /// Removes every committed, unleased object; returns how many.
    pub fn remove_all(&mut self, now: Instant) -> usize {
        self.remove_matching(now, |_| true)
    }

    /// Applies the time: dead clients, stale puts, quarantine releases, then one round of
    /// eviction when above the watermark.
    pub fn handle_timeout(&mut self, now: Instant) -> Sweep {
        self.observe(now);
        let mut sweep = Sweep::default();
        let mut dead: Vec<ClientId> = self
            .clients
            .iter()
            .filter(|(_, c)| now.saturating_duration_since(c.last_seen) >= self.policy.client_ttl)
            .map(|(&id, _)| id)
            .collect();
        dead.sort_unstable();
        for &client in &dead {
            sweep.discarded_puts += self.drop_client(now, client, false);
        }
        self.dead_clients_total += dead.len() as u64;
        sweep.dead_clients = dead;
        sweep.discarded_puts += self.discard_stale_puts(now);
        sweep.released = self.release_quarantine(now);
        if self.over_watermark() {
            sweep.evicted = self.evict_round(now);
        }
        sweep
    }

    /// The earliest instant at which `handle_timeout` has time-driven work: a client's
    /// TTL, a pending put's discard, a quarantine's release. Eviction is not time-driven
    /// (see [`State::over_watermark`]).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let p = &self.policy;
        let client = self
            .clients
            .values()
            .filter_map(|c| c.last_seen.checked_add(p.client_ttl))
            .min();
        let discard = self
            .pending
            .keys()
            .next()
            .and_then(|(t, _)| t.checked_add(p.put_discard_timeout));
        let release = self
            .quarantine
            .keys()
            .next()
            .and_then(|(t, _)| t.checked_add(p.put_release_timeout));
        [client, discard, release].into_iter().flatten().min()
    }

    // ---- internals: time and liveness ----

    fn observe(&mut self, now: Instant) {
        self.clock = Some(self.clock.map_or(now, |c| c.max(now)));
    }

    /// Refreshes a known client's liveness; `false` for an unknown one.
    fn touch_client(&mut self, now: Instant, client: ClientId) -> bool {
        match self.clients.get_mut(&client) {
            Some(c) => {
                c.last_seen = c.last_seen.max(now);
                true
            }
            None => false,
        }
    }

    fn bump_tick(&mut self) -> u64 {
        let t = self.next_tick;
        self.next_tick += 1;
        t
    }

    fn is_leased(&self, c: &Committed, now: Instant) -> bool {
        c.leased_at
            .is_some_and(|t| now.saturating_duration_since(t) < self.policy.kv_lease_ttl)
    }

    fn is_pinned(&self, c: &Committed, now: Instant) -> bool {
        c.soft_pin && now.saturating_duration_since(c.last_access) < self.policy.soft_pin_ttl
    }

    fn committed(&self, key: &str) -> Option<&Committed> {
        match &self.objects.get(key)?.phase {
            Phase::Committed(c) => Some(c),
            Phase::Pending(_) => None,
        }
    }

    fn committed_count(&self) -> usize {
        self.lru_plain.len() + self.lru_pinned.len()
    }

    fn capacity(&self) -> u64 {
        self.segments.values().map(|s| s.alloc.size()).sum()
    }

    fn used(&self) -> u64 {
        self.segments.values().map(|s| s.alloc.used()).sum()
    }

    fn lru_mut(&mut self, soft_pin: bool) -> &mut BTreeMap<u64, Arc<str>> {
        if soft_pin {
            &mut self.lru_pinned
        } else {
            &mut self.lru_plain
        }
    }

    fn replica_views(&self, locs: &[Loc], len: u64) -> Vec<Replica> {
        locs.iter()
            .filter_map(|l| {
                let seg = self.segments.get(&l.mount)?;
                Some(Replica {
                    segment: seg.name.clone(),
                    addr: l.addr,
                    len,
                })
            })
            .collect()
    }

    // ---- internals: space ----

    /// Allocates up to `want` replicas of `len` bytes in distinct segments: the
    /// preferred one first, then by most free space (name and id break ties, so placement
    /// is deterministic). A segment too fragmented for `len` is passed over.
    fn place(&mut self, len: u64, want: usize, preferred: &str) -> Vec<Loc> {
        let mut ranked: Vec<_> = self
            .segments
            .iter()
            .map(|(&m, s)| {
                let not_preferred = s.name != preferred;
                let free = std::cmp::Reverse(s.alloc.free_bytes());
                ((not_preferred, free, s.name.as_str(), s.id), m)
            })
            .collect();
        ranked.sort_unstable();
        let order: Vec<Mount> = ranked.into_iter().map(|(_, m)| m).collect();
        let mut locs = Vec::with_capacity(want);
        for mount in order {
            if locs.len() == want {
                break;
            }
            let Some(seg) = self.segments.get_mut(&mount) else {
                continue;
            };
            if let Some(addr) = seg.alloc.allocate(len) {
                locs.push(Loc { mount, addr });
            }
        }
        locs
    }

    fn fits_somewhere(&self, len: u64) -> bool {
        self.segments.values().any(|s| s.alloc.fits(len))
    }

    /// Evicts, in eviction order, until one replica of `len` bytes fits.
    fn make_room(&mut self, now: Instant, len: u64) -> Result<(), Code> {
        // Victims come in small batches: most puts need one or two, and each batch walk
        // skips the leased objects again.
        const BATCH: usize = 16;
        while !self.fits_somewhere(len) {
            let victims = self.victims(now, BATCH);
            if victims.is_empty() {
                return Err(Code::NoAvailableHandle);
            }
            for key in victims {
                self.evict(&key);
                if self.fits_somewhere(len) {
                    break;
                }
            }
        }
        Ok(())
    }

    fn free_locs(&mut self, locs: &[Loc]) {
        for l in locs {
            // A segment unmounted since took its allocations with it.
            if let Some(seg) = self.segments.get_mut(&l.mount) {
                seg.alloc.free(l.addr);
            }
        }
    }

    // ---- internals: removing things ----

    /// Removes a pending put from the object map and the pending index.
    fn take_pending(&mut self, key: &str) -> Option<(Object, (Instant, u64))> {
        let Phase::Pending(p) = &self.objects.get(key)?.phase else {
            return None;
        };
        let at = (p.started, p.seq);
        self.pending.remove(&at);
        let obj = self.objects.remove(key)?;
        Some((obj, at))
    }

    /// Discards a pending put: its key is free at once, its space quarantined until the
    /// put's start + `put_release_timeout` (a slow writer may still be writing).
    fn discard_put(&mut self, now: Instant, key: &str) {
        let Some((obj, at)) = self.take_pending(key) else {
            return;
        };
        self.discarded_puts_total += 1;
        let due = now.saturating_duration_since(at.0) >= self.policy.put_release_timeout;
        if due {
            self.free_locs(&obj.replicas);
        } else if !obj.replicas.is_empty() {
            self.quarantine.insert(at, obj.replicas);
        }
    }

    /// Removes a committed object and frees its replicas.
    fn remove_committed(&mut self, key: &str) {
        let Some(obj) = self.objects.remove(key) else {
            return;
        };
        if let Phase::Committed(c) = &obj.phase {
            self.lru_mut(c.soft_pin).remove(&c.tick);
            self.object_bytes -= obj.size;
        }
        self.free_locs(&obj.replicas);
    }

    fn evict(&mut self, key: &str) {
        self.remove_committed(key);
        self.evicted_total += 1;
    }

    /// Forgets a client: its pending puts revoked (`graceful`) or discarded, its segments
    /// unmounted. Returns how many puts were discarded.
    fn drop_client(&mut self, now: Instant, client: ClientId, graceful: bool) -> usize {
        if self.clients.remove(&client).is_none() {
            return 0;
        }
        let own: Vec<Arc<str>> = self
            .pending
            .values()
            .filter(|k| {
                matches!(self.objects.get(&***k).map(|o| &o.phase),
                    Some(Phase::Pending(p)) if p.client == client)
            })
            .cloned()
            .collect();
        let mut discarded = 0;
        for key in &own {
            if graceful {
                if let Some((obj, _)) = self.take_pending(key) {
                    self.free_locs(&obj.replicas);
                }
            } else {
                self.discard_put(now, key);
                discarded += 1;
            }
        }
        let mounts: Vec<Mount> = self
            .segments
            .iter()
            .filter(|(_, s)| s.client == client)
            .map(|(&m, _)| m)
            .collect();
        discarded + self.drop_segments(now, &mounts)
    }

    /// Unmounts segments: their replicas are dropped, committed objects left with none
    /// removed, pending puts with a replica there discarded. Returns how many puts were
    /// discarded.
    fn drop_segments(&mut self, now: Instant, mounts: &[Mount]) -> usize {
        let mut gone = HashSet::new();
        let mut held_space = false;
        for m in mounts {
            if let Some(seg) = self.segments.remove(m) {
                self.mounts.remove(&seg.id);
                held_space |= seg.alloc.used() > 0;
                gone.insert(*m);
            }
        }
        // A segment with nothing allocated holds no replica: skip the scan over every
        // object (rare anyway: a client leaving).
        if !held_space {
            return 0;
        }
        let hit: Vec<Arc<str>> = self
            .objects
            .iter()
            .filter(|(_, o)| o.replicas.iter().any(|l| gone.contains(&l.mount)))
            .map(|(k, _)| k.clone())
            .collect();
        let mut discarded = 0;
        for key in &hit {
            let Some(obj) = self.objects.get_mut(key) else {
                continue;
            };
            obj.replicas.retain(|l| !gone.contains(&l.mount));
            match &obj.phase {
                Phase::Pending(_) => {
                    self.discard_put(now, key);
                    discarded += 1;
                }
                Phase::Committed(_) if obj.replicas.is_empty() => self.remove_committed(key),
                Phase::Committed(_) => {}
            }
        }
        discarded
    }

    /// Discards the pending puts older than `put_discard_timeout`.
    fn discard_stale_puts(&mut self, now: Instant) -> usize {
        let mut n = 0;
        while let Some((&(started, _), key)) = self.pending.first_key_value() {
            if now.saturating_duration_since(started) < self.policy.put_discard_timeout {
                break;
            }
            let key = key.clone();
            self.discard_put(now, &key);
            n += 1;
        }
        n
    }

    /// Frees quarantined space past its release time.
    fn release_quarantine(&mut self, now: Instant) -> usize {
        let mut n = 0;
        while let Some(entry) = self.quarantine.first_entry() {
            let started = entry.key().0;
            if now.saturating_duration_since(started) < self.policy.put_release_timeout {
                break;
            }
            let locs = entry.remove();
            self.free_locs(&locs);
            n += 1;
        }
        n
    }

    // ---- internals: eviction ----

    /// One watermark round: `ceil(eviction_ratio * committed)` objects, at least one.
    fn evict_round(&mut self, now: Instant) -> usize {
        let committed = self.committed_count();
        if committed == 0 {
            return 0;
        }
        let want = ((self.policy.eviction_ratio * committed as f64).ceil() as usize).max(1);
        let victims = self.victims(now, want);
        for key in &victims {
            self.evict(key);
        }
        victims.len()
    }

    /// Up to `want` keys in eviction order: least recently used first among the unpinned
    /// (no soft pin, or one that expired), then, when allowed, among the soft-pinned.
    /// Leased objects are skipped; pending puts are never in the LRU maps.
    fn victims(&self, now: Instant, want: usize) -> Vec<Arc<str>> {
        let mut out = Vec::new();
        // Soft pins expire in LRU order (expiry is last access + ttl), so the expired
        // ones are a prefix of the pinned map; it merges with the plain map by tick.
        let mut expired_len = 0;
        let mut expired = self
            .lru_pinned
            .iter()
            .take_while(|(_, k)| !self.committed(k).is_some_and(|c| self.is_pinned(c, now)))
            .inspect(|_| expired_len += 1)
            .peekable();
        let mut plain = self.lru_plain.iter().peekable();
        while out.len() < want {
            let next = match (plain.peek(), expired.peek()) {
                (Some(a), Some(b)) if a.0 > b.0 => expired.next(),
                (Some(_), _) => plain.next(),
                (None, _) => expired.next(),
            };
            let Some((_, key)) = next else {
                break;
            };
            if !self.committed(key).is_some_and(|c| self.is_leased(c, now)) {
                out.push(key.clone());
            }
        }
        drop(expired);
        if out.len() < want && self.policy.allow_evict_soft_pinned {
            let pinned = self
                .lru_pinned
                .values()
                .skip(expired_len)
                .filter(|k| !self.committed(k).is_some_and(|c| self.is_leased(c, now)));
            out.extend(pinned.take(want - out.len()).cloned());
        }
        out
    }
}

fn check_key(key: &str) -> Result<(), Code> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        Err(Code::InvalidParams)
    } else {
        Ok(())
    }
}

#[cfg(test)]
impl State {
    /// Panics unless the books agree: allocations match the replicas and quarantine, no
    /// two overlap, every committed object has a replica in a mounted segment, and the
    /// indexes match the objects.
    fn check_invariants(&self) {
        let mut by_mount: HashMap<Mount, Vec<(u64, u64)>> = HashMap::new();
        let mut committed = 0;
        let mut bytes = 0;
        for (key, obj) in &self.objects {
            for l in &obj.replicas {
                let seg = &self.segments[&l.mount];
                let len = seg.alloc.len_at(l.addr).unwrap();
                assert!(len >= obj.size, "{key}: allocation shorter than the object");
                by_mount.entry(l.mount).or_default().push((l.addr, len));
            }
            let mounts: HashSet<Mount> = obj.replicas.iter().map(|l| l.mount).collect();
            assert_eq!(
                mounts.len(),
                obj.replicas.len(),
                "{key}: two replicas in one segment"
            );
            match &obj.phase {
                Phase::Committed(c) => {
                    committed += 1;
                    bytes += obj.size;
                    assert!(!obj.replicas.is_empty(), "{key}: committed with no replica");
                    let lru = if c.soft_pin {
                        &self.lru_pinned
                    } else {
                        &self.lru_plain
                    };
                    assert_eq!(lru.get(&c.tick).map(|k| &**k), Some(&**key));
                }
                Phase::Pending(p) => {
                    assert_eq!(
                        self.pending.get(&(p.started, p.seq)).map(|k| &**k),
                        Some(&**key)
                    );
                    assert!(
                        self.clients.contains_key(&p.client),
                        "{key}: writer forgotten"
                    );
                }
            }
        }
        for locs in self.quarantine.values() {
            for l in locs {
                if let Some(seg) = self.segments.get(&l.mount) {
                    let len = seg.alloc.len_at(l.addr).unwrap();
                    by_mount.entry(l.mount).or_default().push((l.addr, len));
                }
            }
        }
        assert_eq!(committed, self.committed_count());
        assert_eq!(self.pending.len() + committed, self.objects.len());
        assert_eq!(bytes, self.object_bytes);
        let mut used = 0;
        for (m, seg) in &self.segments {
            let mut allocs = by_mount.remove(m).unwrap_or_default();
            allocs.sort_unstable();
            assert_eq!(
                allocs.len(),
                seg.alloc.allocations(),
                "{}: leaked allocation",
                seg.name
            );
            let base = seg.alloc.base();
            let mut end = base;
            for (addr, len) in &allocs {
                assert!(*addr >= end, "{}: overlap at {addr:#x}", seg.name);
                end = addr + len;
            }
            assert!(end <= base + seg.alloc.size());
            assert_eq!(allocs.iter().map(|a| a.1).sum::<u64>(), seg.alloc.used());
            assert!(self.clients.contains_key(&seg.client));
            assert_eq!(self.mounts.get(&seg.id), Some(m));
            used += seg.alloc.used();
        }
        assert_eq!(self.mounts.len(), self.segments.len());
        assert_eq!(self.stats().used, used);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use proptest::prelude::*;

    const A: ClientId = 0xA;
    const B: ClientId = 0xB;
    const KIB: u64 = 1024;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn spec(id: SegmentId, name: &str, base: u64, size: u64) -> SegmentSpec {
        SegmentSpec {
            id,
            name: name.into(),
            base,
            size,
        }
    }

    fn cfg(replicas: u32, preferred: &str) -> PutConfig {
        PutConfig {
            replica_num: replicas,
            preferred_segment: preferred.into(),
            with_soft_pin: false,
        }
    }

    fn pinned() -> PutConfig {
        PutConfig {
            with_soft_pin: true,
            ..PutConfig::default()
        }
    }

    /// A master with client A owning `segments` segments "a0", "a1", ... of `size` bytes.
    fn master(t0: Instant, segments: u128, size: u64) -> State {
        let mut st = State::new(Policy::default());
        for i in 0..segments {
            let base = 0x10_0000 * (i as u64 + 1);
            st.mount_segment(t0, A, spec(i + 1, &format!("a{i}"), base, size))
                .unwrap();
        }
        st
    }

    fn put(st: &mut State, now: Instant, key: &str, len: u64, cfg: &PutConfig) -> Vec<Replica> {
        let r = st.put_start(now, A, key, len, cfg).unwrap();
        st.put_end(now, A, key).unwrap();
        st.check_invariants();
        r
    }

    #[test]
    fn defaults_are_upstreams() {
        let p = Policy::default();
        assert_eq!(p.high_watermark, 0.90);
        assert_eq!(p.eviction_ratio, 0.05);
        assert_eq!(p.kv_lease_ttl, secs(10));
        assert_eq!(p.soft_pin_ttl, secs(1800));
        assert!(p.allow_evict_soft_pinned);
        assert_eq!(p.client_ttl, secs(10));
        assert_eq!(p.put_discard_timeout, secs(30));
        assert_eq!(p.put_release_timeout, secs(600));
    }

    #[test]
    fn put_then_get_returns_absolute_addresses() {
        let t0 = Instant::now();
        let mut st = master(t0, 1, 64 * KIB);
        let r = st
            .put_start(t0, A, "k", 100, &PutConfig::default())
            .unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].segment, "a0");
        assert_eq!(r[0].len, 100);
        assert!(r[0].addr >= 0x10_0000 && r[0].addr + 100 <= 0x10_0000 + 64 * KIB);
        assert_eq!(st.get_replicas(t0, "k"), Err(Code::ReplicaIsNotReady));
        assert_eq!(st.exists(t0, "k"), Ok(false));
        assert!(!st.query("k").unwrap().committed);
        st.put_end(t0, A, "k").unwrap();
        assert_eq!(st.exists(t0, "k"), Ok(true));
        assert_eq!(st.get_replicas(t0, "k").unwrap(), r);
        assert_eq!(st.keys(), vec!["k".to_string()]);
        let s = st.stats();
        assert_eq!((s.objects, s.pending_puts, s.object_bytes), (1, 0, 100));
        assert_eq!(
            (s.capacity, s.used, s.segments, s.clients),
            (64 * KIB, 128, 1, 1)
        );
        st.check_invariants();
    }

    #[test]
    fn preferred_segment_is_honoured_then_ignored_when_full() {
        let t0 = Instant::now();
        let mut st = master(t0, 3, 4 * KIB);
        // The most free space first: all equal, so by name.
        assert_eq!(put(&mut st, t0, "x", 1000, &cfg(1, ""))[0].segment, "a0");
        assert_eq!(put(&mut st, t0, "y", 1000, &cfg(1, ""))[0].segment, "a1");
        assert_eq!(put(&mut st, t0, "p", 3000, &cfg(1, "a0"))[0].segment, "a0");
        // a0 has 1 KiB left: the preferred segment is passed over.
        assert_eq!(put(&mut st, t0, "q", 2000, &cfg(1, "a0"))[0].segment, "a2");
        // An unknown preferred name changes nothing.
        assert_eq!(put(&mut st, t0, "r", 100, &cfg(1, "nope"))[0].segment, "a1");
    }

    #[test]
    fn replicas_go_to_distinct_segments_and_cap_at_their_number() {
        let t0 = Instant::now();
        let mut st = master(t0, 3, 4 * KIB);
        let r = put(&mut st, t0, "k", 500, &cfg(2, "a2"));
        assert_eq!(
            r.iter().map(|r| r.segment.as_str()).collect::<Vec<_>>(),
            ["a2", "a0"]
        );
        let r = put(&mut st, t0, "many", 500, &cfg(9, ""));
        let mut names: Vec<&str> = r.iter().map(|r| r.segment.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["a0", "a1", "a2"]);
        // Free now: a0 3072, a1 3584, a2 3072. Most free first: a1, then a0 (by name).
        let r = put(&mut st, t0, "fill", 3000, &cfg(2, ""));
        assert_eq!(
            r.iter().map(|r| r.segment.as_str()).collect::<Vec<_>>(),
            ["a1", "a0"]
        );
        // Only a2 still has room for 2000 bytes: one replica rather than none.
        let r = put(&mut st, t0, "two", 2000, &cfg(2, ""));
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].segment, "a2");
    }

    #[test]
    fn no_room_is_no_available_handle() {
        let t0 = Instant::now();
        let mut st = State::new(Policy::default());
        st.handle_ping(t0, A);
        st.mount_segment(t0, A, spec(1, "a0", 0, 4 * KIB)).unwrap();
        // Larger than any segment: nothing is evicted for it.
        put(&mut st, t0, "old", 4 * KIB, &PutConfig::default());
        assert_eq!(
            st.put_start(t0, A, "huge", 4 * KIB + 1, &PutConfig::default()),
            Err(Code::NoAvailableHandle)
        );
        assert!(st.exists(t0, "old").unwrap());
        // Full of a leased object: not evictable.
        st.get_replicas(t0, "old").unwrap();
        assert_eq!(
            st.put_start(t0, A, "k", 64, &PutConfig::default()),
            Err(Code::NoAvailableHandle)
        );
        // Pending puts are never evicted either.
        st.remove(t0, "old", true).unwrap();
        st.put_start(t0, A, "p", 4 * KIB, &PutConfig::default())
            .unwrap();
        assert_eq!(
            st.put_start(t0, A, "k", 64, &PutConfig::default()),
            Err(Code::NoAvailableHandle)
        );
        assert_eq!(Code::NoAvailableHandle.value(), -200);
        // And with no segment at all.
        let mut empty = State::new(Policy::default());
        empty.mount_segment(t0, B, spec(9, "b", 0, 64)).unwrap();
        empty.unmount_segment(t0, B, 9).unwrap();
        assert_eq!(
            empty.put_start(t0, B, "k", 1, &PutConfig::default()),
            Err(Code::NoAvailableHandle)
        );
        st.check_invariants();
    }

    #[test]
    fn synchronous_eviction_keeps_the_newest_objects() {
        let t0 = Instant::now();
        let mut st = master(t0, 2, 64 * KIB);
        // 3x capacity in 1 KiB objects, one per second.
        for i in 0..384u64 {
            put(
                &mut st,
                t0 + secs(i),
                &format!("k{i:03}"),
                KIB,
                &PutConfig::default(),
            );
        }
        let keys = st.keys();
        assert_eq!(keys.len(), 128, "the pool holds 128 objects");
        let expected: Vec<String> = (256..384).map(|i| format!("k{i:03}")).collect();
        assert_eq!(keys, expected);
        assert_eq!(st.stats().evicted_total, 256);
    }

    #[test]
    fn a_get_refreshes_the_lru_order() {
        let t0 = Instant::now();
        let mut st = master(t0, 1, 4 * KIB);
        for (i, k) in ["a", "b", "c", "d"].iter().enumerate() {
            put(&mut st, t0 + secs(i as u64), k, KIB, &PutConfig::default());
        }
        // Past the lease, so that "a" is evictable again but more recent than "b".
        st.get_replicas(t0 + secs(5), "a").unwrap();
        let later = t0 + secs(60);
        put(&mut st, later, "e", KIB, &PutConfig::default());
        assert_eq!(st.keys(), ["a", "c", "d", "e"]);
    }

    #[test]
    fn a_lease_blocks_remove_and_eviction_until_it_expires() {
        let t0 = Instant::now();
        let mut st = master(t0, 1, 2 * KIB);
        put(&mut st, t0, "leased", KIB, &PutConfig::default());
        put(&mut st, t0, "other", KIB, &PutConfig::default());
        st.get_replicas(t0, "leased").unwrap();
        assert!(st.query("leased").unwrap().leased);
        assert_eq!(
            st.remove(t0 + secs(9), "leased", false),
            Err(Code::ObjectHasLease)
        );
        // Full: the unleased object goes although it is more recent.
        put(&mut st, t0 + secs(1), "new", KIB, &PutConfig::default());
        assert_eq!(st.keys(), ["leased", "new"]);
        // The lease is extended by a later get.
        st.get_replicas(t0 + secs(8), "leased").unwrap();
        assert_eq!(
            st.remove(t0 + secs(17), "leased", false),
            Err(Code::ObjectHasLease)
        );
        assert_eq!(st.remove_all(t0 + secs(17)), 1, "only the unleased one");
        assert_eq!(st.remove(t0 + secs(18), "leased", false), Ok(()));
        assert_eq!(
            st.remove(t0 + secs(18), "leased", false),
            Err(Code::ObjectNotFound)
        );
        // force ignores the lease.
        put(&mut st, t0 + secs(20), "f", KIB, &PutConfig::default());
        st.get_replicas(t0 + secs(20), "f").unwrap();
        assert_eq!(st.remove(t0 + secs(20), "f", true), Ok(()));
        st.check_invariants();
    }

    #[test]
    fn soft_pinned_objects_are_evicted_last() {
        let t0 = Instant::now();
        let mut st = master(t0, 1, 4 * KIB);
        put(&mut st, t0, "pin0", KIB, &pinned());
        put(&mut st, t0 + secs(1), "plain1", KIB, &PutConfig::default());
        put(&mut st, t0 + secs(2), "pin2", KIB, &pinned());
        put(&mut st, t0 + secs(3), "plain3", KIB, &PutConfig::default());
        assert!(st.query("pin0").unwrap().soft_pinned);
        put(&mut st, t0 + secs(4), "n4", KIB, &PutConfig::default());
        put(&mut st, t0 + secs(5), "n5", KIB, &PutConfig::default());
        assert_eq!(st.keys(), ["n4", "n5", "pin0", "pin2"]);
        // Newer plain objects go before older pinned ones.
        put(&mut st, t0 + secs(6), "n6", KIB, &PutConfig::default());
        put(&mut st, t0 + secs(7), "n7", KIB, &PutConfig::default());
        assert_eq!(st.keys(), ["n6", "n7", "pin0", "pin2"]);
        // With the plain ones leased, the least recently used pin goes.
        st.get_replicas(t0 + secs(8), "n6").unwrap();
        st.get_replicas(t0 + secs(8), "n7").unwrap();
        put(&mut st, t0 + secs(8), "n8", KIB, &PutConfig::default());
        assert_eq!(st.keys(), ["n6", "n7", "n8", "pin2"]);
    }

    #[test]
    fn a_soft_pin_expires_and_may_be_unevictable() {
        let t0 = Instant::now();
        let mut st = State::new(Policy {
            allow_evict_soft_pinned: false,
            ..Policy::default()
        });
        st.mount_segment(t0, A, spec(1, "a0", 0, 2 * KIB)).unwrap();
        put(&mut st, t0, "pin", KIB, &pinned());
        put(&mut st, t0, "pin2", KIB, &pinned());
        assert_eq!(
            st.put_start(t0 + secs(1), A, "k", KIB, &PutConfig::default()),
            Err(Code::NoAvailableHandle)
        );
        // "pin2" is read (pin refreshed); "pin" is not and its pin runs out.
        let later = t0 + secs(1000);
        st.get_replicas(later, "pin2").unwrap();
        let expired = t0 + secs(1800);
        assert_eq!(st.handle_ping(expired, A), Liveness::Known);
        assert!(!st.query("pin").unwrap().soft_pinned);
        assert!(st.query("pin2").unwrap().soft_pinned);
        put(&mut st, expired, "k", KIB, &PutConfig::default());
        assert_eq!(st.keys(), ["k", "pin2"]);
    }

    #[test]
    fn watermark_eviction_runs_in_handle_timeout() {
        let t0 = Instant::now();
        let mut st = master(t0, 1, 100 * KIB);
        for i in 0..90u64 {
            put(
                &mut st,
                t0 + secs(i),
                &format!("k{i:02}"),
                KIB,
                &PutConfig::default(),
            );
        }
        // 90 KiB of 100: at the watermark, not above it.
        let now = t0 + secs(100);
        st.handle_ping(now, A);
        assert!(!st.over_watermark());
        assert_eq!(st.handle_timeout(now).evicted, 0);
        put(&mut st, now, "k90", KIB, &PutConfig::default());
        assert!(st.over_watermark());
        // ceil(0.05 * 91) = 5, the least recently used.
        let sweep = st.handle_timeout(now);
        assert_eq!(sweep.evicted, 5);
        assert_eq!(st.keys().first().map(String::as_str), Some("k05"));
        assert!(!st.over_watermark());
        assert_eq!(st.handle_timeout(now).evicted, 0);
        assert_eq!(st.stats().evicted_total, 5);
    }

    #[test]
    fn a_dead_clients_objects_are_gone_and_its_puts_discarded() {
        let t0 = Instant::now();
        let mut st = master(t0, 1, 64 * KIB);
        st.mount_segment(t0, B, spec(20, "b0", 0x90_0000, 64 * KIB))
            .unwrap();
        // On A's segment only, on both, on B's only.
        put(&mut st, t0, "on_a", KIB, &cfg(1, "a0"));
        put(&mut st, t0, "both", KIB, &cfg(2, ""));
        put(&mut st, t0, "on_b", KIB, &cfg(1, "b0"));
        // A's pending put in B's segment; B's pending put in A's segment.
        st.put_start(t0, A, "a_writes", KIB, &cfg(1, "b0")).unwrap();
        st.put_start(t0, B, "b_writes", KIB, &cfg(1, "a0")).unwrap();
        let used_b = st.segments().iter().find(|s| s.name == "b0").unwrap().used;
        // B keeps pinging; A falls silent.
        let now = t0 + secs(10);
        assert_eq!(st.handle_ping(now - secs(1), B), Liveness::Known);
        assert_eq!(st.poll_timeout(), Some(t0 + secs(10)));
        let sweep = st.handle_timeout(now);
        assert_eq!(sweep.dead_clients, vec![A]);
        assert_eq!(
            sweep.discarded_puts, 2,
            "A's own put and B's put into A's segment"
        );
        assert_eq!(st.get_replicas(now, "on_a"), Err(Code::ObjectNotFound));
        assert_eq!(st.get_replicas(now, "both").unwrap().len(), 1);
        assert!(st.exists(now, "on_b").unwrap());
        assert_eq!(st.put_end(now, B, "b_writes"), Err(Code::ObjectNotFound));
        assert!(st.query("a_writes").is_none());
        // A may still be writing into B's segment: that space stays reserved.
        let b = st.segments();
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].used, used_b);
        assert!(!st.is_known(A));
        assert_eq!(st.handle_ping(now, A), Liveness::Unknown);
        assert_eq!(
            st.put_start(now, A, "x", 1, &PutConfig::default()),
            Err(Code::IllegalClient)
        );
        let s = st.stats();
        assert_eq!(
            (s.dead_clients_total, s.discarded_puts_total, s.clients),
            (1, 2, 1)
        );
        st.check_invariants();
        let sweep = st.handle_timeout(t0 + secs(600));
        assert_eq!(sweep.released, 1);
        assert!(sweep.dead_clients.contains(&B), "B stopped pinging too");
        assert_eq!(st.stats().segments, 0);
    }

    #[test]
    fn a_discarded_put_frees_its_key_at_once_and_its_space_at_release() {
        let t0 = Instant::now();
        let mut st = master(t0, 1, 4 * KIB);
        st.put_start(t0, A, "slow", 4 * KIB, &PutConfig::default())
            .unwrap();
        assert_eq!(st.poll_timeout(), Some(t0 + secs(10)));
        // A stays alive (a ping and a sweep every 5 s) but never ends the put.
        fn ping_until(st: &mut State, now: &mut Instant, until: Instant) {
            while *now < until {
                *now += secs(5);
                assert_eq!(st.handle_ping(*now, A), Liveness::Known);
                let _ = st.handle_timeout(*now);
            }
        }
        let mut now = t0;
        ping_until(&mut st, &mut now, t0 + secs(25));
        assert_eq!(st.stats().pending_puts, 1);
        ping_until(&mut st, &mut now, t0 + secs(30));
        assert_eq!(st.stats().pending_puts, 0);
        assert_eq!(st.stats().discarded_puts_total, 1);
        assert_eq!(st.put_end(now, A, "slow"), Err(Code::ObjectNotFound));
        // The key is free again, but the space is not.
        assert_eq!(
            st.put_start(now, A, "slow", 64, &PutConfig::default()),
            Err(Code::NoAvailableHandle)
        );
        assert_eq!(st.stats().used, 4 * KIB);
        ping_until(&mut st, &mut now, t0 + secs(595));
        assert_eq!(st.stats().used, 4 * KIB, "not before the release timeout");
        assert_eq!(st.poll_timeout(), Some(t0 + secs(600)));
        st.handle_ping(t0 + secs(600), A);
        let sweep = st.handle_timeout(t0 + secs(600));
        assert_eq!(sweep.released, 1);
        assert_eq!(st.stats().used, 0);
        put(
            &mut st,
            t0 + secs(600),
            "slow",
            4 * KIB,
            &PutConfig::default(),
        );
    }

    #[test]
    fn revoke_frees_at_once_and_only_the_writer_ends_or_revokes() {
        let t0 = Instant::now();
        let mut st = master(t0, 1, 4 * KIB);
        st.mount_segment(t0, B, spec(20, "b0", 0x90_0000, 64))
            .unwrap();
        st.put_start(t0, A, "k", 4 * KIB, &cfg(1, "a0")).unwrap();
        assert_eq!(st.put_end(t0, B, "k"), Err(Code::InvalidWrite));
        assert_eq!(st.put_revoke(t0, B, "k"), Err(Code::InvalidWrite));
        assert_eq!(st.put_end(t0, 0xC, "k"), Err(Code::InvalidWrite));
        assert_eq!(st.put_revoke(t0, A, "k"), Ok(()));
        assert_eq!(st.stats().used, 0);
        assert_eq!(st.put_revoke(t0, A, "k"), Err(Code::ObjectNotFound));
        assert_eq!(st.put_end(t0, A, "k"), Err(Code::ObjectNotFound));
        put(&mut st, t0, "k", 4 * KIB, &cfg(1, "a0"));
        assert_eq!(st.put_end(t0, A, "k"), Err(Code::InvalidWrite), "twice");
        assert_eq!(st.put_revoke(t0, A, "k"), Err(Code::InvalidWrite));
        assert_eq!(Code::InvalidWrite.value(), -700);
    }

    #[test]
    fn a_second_put_of_a_key_is_refused() {
        let t0 = Instant::now();
        let mut st = master(t0, 1, 4 * KIB);
        st.put_start(t0, A, "k", 10, &PutConfig::default()).unwrap();
        let again = st.put_start(t0, A, "k", 10, &PutConfig::default());
        assert_eq!(again, Err(Code::ObjectAlreadyExists));
        assert_eq!(st.remove(t0, "k", true), Err(Code::ReplicaIsNotReady));
        st.put_end(t0, A, "k").unwrap();
        let again = st.put_start(t0, A, "k", 10, &PutConfig::default());
        assert_eq!(again, Err(Code::ObjectAlreadyExists));
        st.check_invariants();
    }

    #[test]
    fn bad_keys_and_lengths_are_invalid_params() {
        let t0 = Instant::now();
        let mut st = master(t0, 1, 4 * KIB);
        let long = "x".repeat(MAX_KEY_BYTES + 1);
        let max = "x".repeat(MAX_KEY_BYTES);
        for key in ["", long.as_str()] {
            let c = PutConfig::default();
            assert_eq!(st.put_start(t0, A, key, 1, &c), Err(Code::InvalidParams));
            assert_eq!(st.put_end(t0, A, key), Err(Code::InvalidParams));
            assert_eq!(st.put_revoke(t0, A, key), Err(Code::InvalidParams));
            assert_eq!(st.exists(t0, key), Err(Code::InvalidParams));
            assert_eq!(st.get_replicas(t0, key), Err(Code::InvalidParams));
            assert_eq!(st.remove(t0, key, true), Err(Code::InvalidParams));
        }
        let zero = st.put_start(t0, A, "k", 0, &PutConfig::default());
        assert_eq!(zero, Err(Code::InvalidParams));
        put(&mut st, t0, &max, 1, &PutConfig::default());
        // A bad key is reported before an unknown client.
        let c = PutConfig::default();
        assert_eq!(st.put_start(t0, 0xC, "", 1, &c), Err(Code::InvalidParams));
        assert_eq!(st.put_start(t0, 0xC, "k", 1, &c), Err(Code::IllegalClient));
    }

    #[test]
    fn mounting_is_idempotent_and_checked() {
        let t0 = Instant::now();
        let mut st = State::new(Policy::default());
        let s = spec(1, "a0", 0x1000, 4 * KIB);
        st.mount_segment(t0, A, s.clone()).unwrap();
        put(&mut st, t0, "k", 100, &PutConfig::default());
        st.mount_segment(t0, A, s.clone()).unwrap();
        assert!(
            st.exists(t0, "k").unwrap(),
            "a repeated mount keeps the objects"
        );
        assert_eq!(st.segments().len(), 1);
        let bad = [
            spec(1, "a0", 0x1000, 8 * KIB),
            spec(1, "a0", 0x2000, 4 * KIB),
            spec(1, "other", 0x1000, 4 * KIB),
            spec(2, "a0", 0x10_0000, 0),
            spec(2, "", 0x10_0000, 64),
            spec(2, "a0", u64::MAX - 10, 64),
            // The same memory under another id.
            spec(2, "a0", 0x1800, 4 * KIB),
        ];
        for b in bad {
            assert_eq!(
                st.mount_segment(t0, A, b.clone()),
                Err(Code::InvalidParams),
                "{b:?}"
            );
        }
        assert_eq!(st.mount_segment(t0, B, s.clone()), Err(Code::InvalidParams));
        // Several segments per client, of the same name too.
        st.mount_segment(t0, A, spec(2, "a0", 0x10_0000, 4 * KIB))
            .unwrap();
        st.mount_segment(t0, A, spec(3, "a1", 0x1000, 4 * KIB))
            .unwrap();
        let views = st.segments();
        assert_eq!(views.iter().map(|v| v.id).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(views[0].used, 128);
        assert_eq!(views[0].client, A);
        assert_eq!(st.stats().capacity, 12 * KIB);
        assert_eq!(st.unmount_segment(t0, B, 1), Err(Code::InvalidParams));
        assert_eq!(st.unmount_segment(t0, A, 99), Err(Code::InvalidParams));
        st.check_invariants();
    }

    #[test]
    fn a_restarted_engine_replaces_its_stale_segment() {
        let t0 = Instant::now();
        let mut st = State::new(Policy::default());
        st.mount_segment(t0, A, spec(1, "host:1", 0x1000, 4 * KIB))
            .unwrap();
        put(&mut st, t0, "old", 100, &PutConfig::default());
        // Another client (the restarted process) mounts the same engine's memory.
        st.mount_segment(t0, B, spec(2, "host:1", 0x1000, 4 * KIB))
            .unwrap();
        assert_eq!(
            st.exists(t0, "old"),
            Ok(false),
            "its bytes are no longer there"
        );
        assert_eq!(st.segments().len(), 1);
        // Disjoint memory of one engine name is fine (two stores sharing one engine).
        st.mount_segment(t0, A, spec(3, "host:1", 0x9000, 4 * KIB))
            .unwrap();
        assert_eq!(st.segments().len(), 2);
        st.check_invariants();
    }

    #[test]
    fn unmount_drops_replicas_and_orphaned_objects() {
        let t0 = Instant::now();
        let mut st = master(t0, 2, 4 * KIB);
        put(&mut st, t0, "one", 100, &cfg(1, "a0"));
        put(&mut st, t0, "two", 100, &cfg(2, ""));
        st.put_start(t0, A, "pending", 100, &cfg(2, "")).unwrap();
        st.unmount_segment(t0, A, 1).unwrap();
        assert_eq!(st.exists(t0, "one"), Ok(false));
        let r = st.get_replicas(t0, "two").unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].segment, "a1");
        assert_eq!(st.put_end(t0, A, "pending"), Err(Code::ObjectNotFound));
        assert!(st.is_known(A), "a client with no segment is still a client");
        assert_eq!(st.stats().discarded_puts_total, 1);
        st.check_invariants();
    }

    #[test]
    fn disconnect_revokes_and_forgets() {
        let t0 = Instant::now();
        let mut st = master(t0, 1, 4 * KIB);
        st.mount_segment(t0, B, spec(20, "b0", 0x90_0000, 4 * KIB))
            .unwrap();
        put(&mut st, t0, "k", 100, &cfg(1, "a0"));
        st.put_start(t0, A, "p", 100, &cfg(1, "b0")).unwrap();
        st.disconnect(t0, A);
        assert!(!st.is_known(A));
        assert_eq!(st.exists(t0, "k"), Ok(false));
        assert_eq!(
            st.stats().used,
            0,
            "a graceful close frees its puts at once"
        );
        assert_eq!(st.handle_ping(t0, A), Liveness::Unknown);
        assert!(!st.is_known(A), "a ping does not register");
        st.disconnect(t0, A);
        st.check_invariants();
    }

    #[test]
    fn pings_keep_a_client_alive() {
        let t0 = Instant::now();
        let mut st = master(t0, 1, 4 * KIB);
        assert_eq!(st.handle_ping(t0, 0xC), Liveness::Unknown);
        for i in 1..10 {
            let now = t0 + secs(9 * i);
            assert_eq!(st.handle_ping(now, A), Liveness::Known);
            assert!(st.handle_timeout(now).dead_clients.is_empty());
        }
        assert_eq!(st.handle_timeout(t0 + secs(91)).dead_clients, vec![A]);
        assert_eq!(st.poll_timeout(), None);
        assert_eq!(st.stats().clients, 0);
    }

    #[test]
    fn remove_matching_skips_leased_and_pending() {
        let t0 = Instant::now();
        let mut st = master(t0, 1, 64 * KIB);
        for k in ["a/1", "a/2", "a/3", "b/1"] {
            put(&mut st, t0, k, 10, &PutConfig::default());
        }
        st.put_start(t0, A, "a/pending", 10, &PutConfig::default())
            .unwrap();
        st.get_replicas(t0, "a/2").unwrap();
        assert_eq!(st.remove_matching(t0, |k| k.starts_with("a/")), 2);
        assert_eq!(st.keys(), ["a/2", "b/1"]);
        assert!(st.query("a/pending").is_some());
        let v = st.query("a/2").unwrap();
        assert_eq!(
            (v.key.as_str(), v.size, v.committed, v.leased),
            ("a/2", 10, true, true)
        );
        assert_eq!(st.remove_all(t0 + secs(10)), 2);
        st.check_invariants();
    }

    /// 200,000 puts into a pool that holds half of them: every put past the pool's size
    /// evicts exactly what it needs, and a sweep evicts `eviction_ratio` of the rest.
    #[test]
    fn a_pool_filled_twice_over_keeps_its_size() {
        const PUTS: u64 = 200_000;
        let t0 = Instant::now();
        let mut st = master(t0, 4, PUTS / 2 * 64 / 4);
        for i in 0..PUTS {
            let key = format!("key-{i:08}");
            let now = t0 + Duration::from_micros(i);
            st.put_start(now, A, &key, 64, &PutConfig::default())
                .unwrap();
            st.put_end(now, A, &key).unwrap();
        }
        let s = st.stats();
        assert_eq!((s.objects, s.evicted_total), (PUTS / 2, PUTS / 2));
        let sweep = st.handle_timeout(t0 + secs(5));
        assert_eq!(sweep.evicted as u64, PUTS / 2 / 20);
    }

    // ---- random operation sequences ----

    #[derive(Debug, Clone)]
    enum Op {
        Mount {
            client: u8,
            seg: u8,
            size: u64,
        },
        Unmount {
            client: u8,
            seg: u8,
        },
        Disconnect(u8),
        Ping(u8),
        PutStart {
            client: u8,
            key: u8,
            len: u64,
            replicas: u32,
            preferred: u8,
            pin: bool,
        },
        PutEnd {
            client: u8,
            key: u8,
        },
        Revoke {
            client: u8,
            key: u8,
        },
        Get(u8),
        Remove {
            key: u8,
            force: bool,
        },
        RemoveAll,
        Advance(u64),
        Timeout,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => (0u8..3, 0u8..6, 1u64..20_000)
                .prop_map(|(client, seg, size)| Op::Mount { client, seg, size }),
            1 => (0u8..3, 0u8..6).prop_map(|(client, seg)| Op::Unmount { client, seg }),
            1 => (0u8..3).prop_map(Op::Disconnect),
            2 => (0u8..3).prop_map(Op::Ping),
            8 => (0u8..3, 0u8..24, 1u64..6000, 0u32..4, 0u8..7, any::<bool>()).prop_map(
                |(client, key, len, replicas, preferred, pin)| Op::PutStart {
                    client, key, len, replicas, preferred, pin,
                }
            ),
            6 => (0u8..3, 0u8..24).prop_map(|(client, key)| Op::PutEnd { client, key }),
            1 => (0u8..3, 0u8..24).prop_map(|(client, key)| Op::Revoke { client, key }),
            4 => (0u8..24).prop_map(Op::Get),
            2 => (0u8..24, any::<bool>()).prop_map(|(key, force)| Op::Remove { key, force }),
            1 => Just(Op::RemoveAll),
            3 => (0u64..40_000).prop_map(Op::Advance),
            3 => Just(Op::Timeout),
        ]
    }

    fn apply(st: &mut State, now: &mut Instant, op: Op) {
        let client = |c: u8| c as ClientId + 1;
        // Segment ids are per client, so two clients never claim one id.
        let seg_id = |c: u8, s: u8| (c as SegmentId) << 8 | s as SegmentId;
        let key = |k: u8| format!("k{k}");
        let t = *now;
        match op {
            Op::Mount {
                client: c,
                seg,
                size,
            } => {
                let name = format!("c{c}s{}", seg % 3);
                let base = 0x1_0000 * (seg as u64 + 1);
                let _ = st.mount_segment(t, client(c), spec(seg_id(c, seg), &name, base, size));
            }
            Op::Unmount { client: c, seg } => {
                let _ = st.unmount_segment(t, client(c), seg_id(c, seg));
            }
            Op::Disconnect(c) => st.disconnect(t, client(c)),
            Op::Ping(c) => {
                let _ = st.handle_ping(t, client(c));
            }
            Op::PutStart {
                client: c,
                key: k,
                len,
                replicas,
                preferred,
                pin,
            } => {
                let cfg = PutConfig {
                    replica_num: replicas,
                    preferred_segment: format!("c{}s{}", preferred % 3, preferred / 3),
                    with_soft_pin: pin,
                };
                if let Ok(r) = st.put_start(t, client(c), &key(k), len, &cfg) {
                    assert!(!r.is_empty() && r.len() <= replicas.max(1) as usize);
                    assert!(r.iter().all(|r| r.len == len));
                }
            }
            Op::PutEnd { client: c, key: k } => {
                let _ = st.put_end(t, client(c), &key(k));
            }
            Op::Revoke { client: c, key: k } => {
                let _ = st.put_revoke(t, client(c), &key(k));
            }
            Op::Get(k) => {
                if let Ok(r) = st.get_replicas(t, &key(k)) {
                    assert!(!r.is_empty());
                }
            }
            Op::Remove { key: k, force } => {
                let _ = st.remove(t, &key(k), force);
            }
            Op::RemoveAll => {
                let _ = st.remove_all(t);
            }
            Op::Advance(ms) => *now += Duration::from_millis(ms),
            Op::Timeout => {
                let next = st.poll_timeout();
                let sweep = st.handle_timeout(t);
                if next.is_some_and(|n| n > t) {
                    assert!(sweep.dead_clients.is_empty());
                    assert_eq!((sweep.discarded_puts, sweep.released), (0, 0));
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn random_operations_keep_the_invariants(
            ops in proptest::collection::vec(op(), 1..120),
        ) {
            let mut now = Instant::now();
            let mut st = State::new(Policy {
                high_watermark: 0.5,
                eviction_ratio: 0.2,
                kv_lease_ttl: secs(5),
                soft_pin_ttl: secs(60),
                client_ttl: secs(60),
                put_discard_timeout: secs(30),
                put_release_timeout: secs(90),
                ..Policy::default()
            });
            for op in ops {
                apply(&mut st, &mut now, op);
                st.check_invariants();
            }
            // Everyone leaves: nothing remains allocated or indexed.
            let _ = st.handle_timeout(now + secs(3600));
            let s = st.stats();
            prop_assert_eq!((s.objects, s.pending_puts, s.used, s.segments, s.clients), (0, 0, 0, 0, 0));
            prop_assert!(st.quarantine.is_empty() || st.poll_timeout().is_some());
        }
    }

    #[test]
    fn a_client_without_a_segment_puts_after_hello() {
        let t0 = Instant::now();
        let mut st = State::new(Policy::default());
        assert_eq!(
            st.put_start(t0, 7, "k", 10, &PutConfig::default()),
            Err(Code::IllegalClient)
        );
        st.register_client(t0, 7);
        st.mount_segment(
            t0,
            8,
            SegmentSpec {
                id: 1,
                name: "holder".into(),
                base: 1 << 20,
                size: 1 << 20,
            },
        )
        .unwrap();
        let r = st.put_start(t0, 7, "k", 10, &PutConfig::default()).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].segment, "holder");
        st.put_end(t0, 7, "k").unwrap();
        assert_eq!(st.exists(t0, "k"), Ok(true));
        assert_eq!(st.handle_ping(t0, 7), Liveness::Known);
    }
}
