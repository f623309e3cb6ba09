//! An in-process FAKE of an RDMA fabric, for unit tests only: no verbs, no kernel, no
//! device. HCAs made from one [`FakeFabric`] reach each other inside this process.
//!
//! It keeps what the transport relies on: a registration table keyed by remote key with
//! bounds, the RC queue pair states (RESET, RTS, ERROR), signaled completions, flush of
//! outstanding requests when a queue pair goes to ERROR, and an error completion putting
//! its queue pair in ERROR. A request runs (a `memcpy` between the two registered ranges)
//! when the HCA that posted it is polled, so a test can [stall](FakeFabric::stall) an HCA
//! to keep requests in flight. Errors can be injected: the next completions of an HCA
//! ([`fail_next`](FakeFabric::fail_next)), or a whole HCA failing
//! ([`fail_nic`](FakeFabric::fail_nic)).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

use super::backend::{
    BackendError, Completion, FailedCompletion, Gid, MrKeys, Nic, PortInfo, QueuePair, RdmaOp,
    RemoteQp, WcStatus, WorkRequest,
};
use crate::memory::Lease;
use crate::verbs::ffi;

/// A fabric of fake HCAs in this process.
#[derive(Debug, Clone, Default)]
pub struct FakeFabric {
    state: Arc<Mutex<Fabric>>,
}

#[derive(Debug, Default)]
struct Fabric {
    nics: Vec<NicState>,
    /// (HCA index, key) → registration; lkey and rkey are the same number here.
    mrs: HashMap<(usize, u32), Mr>,
    qps: HashMap<u32, Qp>,
    next_key: u32,
    next_qp: u32,
}

#[derive(Debug)]
struct NicState {
    name: String,
    gid: Gid,
    cq: VecDeque<Completion>,
    stalled: bool,
    failed: bool,
    inject: VecDeque<WcStatus>,
    executed: u64,
}

/// A registration: the lease keeps its range lent memory until it is deregistered.
#[derive(Debug)]
struct Mr {
    lease: Lease,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QpState {
    Reset,
    Rts,
    Error,
}

#[derive(Debug)]
struct Qp {
    nic: usize,
    state: QpState,
    max_wr: usize,
    remote: Option<(usize, u32)>,
    queue: VecDeque<WorkRequest>,
}

impl FakeFabric {
    /// An empty fabric.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new HCA on this fabric; its GID is `fe80::<n>` (n = its number, from 1).
    pub fn nic(&self, name: &str) -> Arc<FakeNic> {
        let mut f = self.state.lock();
        let idx = f.nics.len();
        let mut gid = [0u8; 16];
        gid[0] = 0xfe;
        gid[1] = 0x80;
        gid[14..].copy_from_slice(&((idx + 1) as u16).to_be_bytes());
        f.nics.push(NicState {
            name: name.to_string(),
            gid,
            cq: VecDeque::new(),
            stalled: false,
            failed: false,
            inject: VecDeque::new(),
            executed: 0,
        });
        Arc::new(FakeNic {
            fabric: self.state.clone(),
            idx,
            name: name.to_string(),
            gid,
        })
    }

    fn index(f: &Fabric, name: &str) -> Option<usize> {
        f.nics.iter().position(|n| n.name == name)
    }

    /// While stalled, requests posted on `nic` stay outstanding (in flight).
    pub fn stall(&self, nic: &str, stalled: bool) {
        let mut f = self.state.lock();
        if let Some(i) = Self::index(&f, nic) {
            if let Some(n) = f.nics.get_mut(i) {
                n.stalled = stalled;
            }
        }
    }

    /// The next requests posted on `nic` end with these statuses (after a check of keys).
    pub fn fail_next(&self, nic: &str, statuses: &[WcStatus]) {
        let mut f = self.state.lock();
        if let Some(i) = Self::index(&f, nic) {
            if let Some(n) = f.nics.get_mut(i) {
                n.inject.extend(statuses.iter().cloned());
            }
        }
    }

    /// The whole HCA fails: every request from or to it ends with "retry exceeded".
    pub fn fail_nic(&self, nic: &str, failed: bool) {
        let mut f = self.state.lock();
        if let Some(i) = Self::index(&f, nic) {
            if let Some(n) = f.nics.get_mut(i) {
                n.failed = failed;
            }
        }
    }

    /// Requests that ran (successfully) from `nic`.
    pub fn executed(&self, nic: &str) -> u64 {
        let f = self.state.lock();
        Self::index(&f, nic)
            .and_then(|i| f.nics.get(i))
            .map_or(0, |n| n.executed)
    }

    /// Requests posted on `nic` and not yet run (in flight).
    pub fn queued(&self, nic: &str) -> usize {
        let f = self.state.lock();
        let Some(i) = Self::index(&f, nic) else {
            return 0;
        };
        f.qps
            .values()
            .filter(|q| q.nic == i)
            .map(|q| q.queue.len())
            .sum()
    }

    /// Registrations alive on the fabric.
    pub fn registrations(&self) -> usize {
        self.state.lock().mrs.len()
    }

    /// Queue pairs not in ERROR on the fabric.
    pub fn live_qps(&self) -> usize {
        self.state
            .lock()
            .qps
            .values()
            .filter(|q| q.state != QpState::Error)
            .count()
    }
}

/// One fake HCA.
#[derive(Debug)]
pub struct FakeNic {
    fabric: Arc<Mutex<Fabric>>,
    idx: usize,
    name: String,
    gid: Gid,
}

impl Nic for FakeNic {
    fn name(&self) -> &str {
        &self.name
    }

    fn port(&self) -> PortInfo {
        PortInfo {
            lid: 0,
            gid: self.gid,
            gid_index: 1,
            mtu: 4096,
        }
    }

    fn register(&self, lease: Lease) -> Result<MrKeys, BackendError> {
        let mut f = self.fabric.lock();
        if f.nics.get(self.idx).is_some_and(|n| n.failed) {
            return Err(BackendError(format!("ibv_reg_mr on {}: EIO", self.name)));
        }
        f.next_key += 1;
        let key = f.next_key;
        f.mrs.insert((self.idx, key), Mr { lease });
        Ok(MrKeys {
            lkey: key,
            rkey: key,
            handle: u64::from(key),
        })
    }

    fn deregister(&self, keys: MrKeys) {
        self.fabric.lock().mrs.remove(&(self.idx, keys.rkey));
    }

    fn create_qp(&self, max_wr: u32) -> Result<Arc<dyn QueuePair>, BackendError> {
        let mut f = self.fabric.lock();
        f.next_qp += 1;
        let num = f.next_qp;
        f.qps.insert(
            num,
            Qp {
                nic: self.idx,
                state: QpState::Reset,
                max_wr: max_wr as usize,
                remote: None,
                queue: VecDeque::new(),
            },
        );
        Ok(Arc::new(FakeQp {
            fabric: self.fabric.clone(),
            num,
        }))
    }

    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> Result<(), BackendError> {
        let mut f = self.fabric.lock();
        run_queued(&mut f, self.idx);
        let Some(nic) = f.nics.get_mut(self.idx) else {
            return Ok(());
        };
        while out.len() < max {
            match nic.cq.pop_front() {
                Some(c) => out.push(c),
                None => break,
            }
        }
        Ok(())
    }
}

/// Runs the requests queued on the HCA's queue pairs, unless it is stalled.
fn run_queued(f: &mut Fabric, nic: usize) {
    if f.nics.get(nic).is_none_or(|n| n.stalled) {
        return;
    }
    let mine: Vec<u32> = f
        .qps
        .iter()
        .filter(|(_, q)| q.nic == nic && !q.queue.is_empty())
        .map(|(n, _)| *n)
        .collect();
    for num in mine {
        while let Some(wr) = f.qps.get_mut(&num).and_then(|q| q.queue.pop_front()) {
            let status = execute(f, nic, num, &wr);
            let ok = status == WcStatus::Success;
            if let Some(n) = f.nics.get_mut(nic) {
                n.executed += u64::from(ok);
                n.cq.push_back(Completion {
                    wr_id: wr.wr_id,
                    status,
                });
            }
            if !ok {
                // An error completion puts the queue pair in ERROR; the rest flush.
                qp_error(f, num);
                break;
            }
        }
    }
}

/// A failure completion with status `raw` and no vendor error.
fn failure(raw: u32) -> WcStatus {
    WcStatus::Other(FailedCompletion {
        status: crate::verbs::WcStatus::from_raw(raw),
        raw,
        vendor_err: 0,
    })
}

fn execute(f: &mut Fabric, nic: usize, qp: u32, wr: &WorkRequest) -> WcStatus {
    let Some(q) = f.qps.get(&qp) else {
        return WcStatus::Flushed;
    };
    let Some((rnic, rqp)) = q.remote else {
        // Not connected: what an HCA reports for a queue pair never brought up.
        return failure(ffi::IBV_WC_GENERAL_ERR);
    };
    let failed = |i: usize| f.nics.get(i).is_none_or(|n| n.failed);
    if failed(nic) || failed(rnic) {
        return WcStatus::RetryExceeded;
    }
    // The responder must be an RTS queue pair connected back to this one.
    let answered = f
        .qps
        .get(&rqp)
        .is_some_and(|r| r.nic == rnic && r.state == QpState::Rts && r.remote == Some((nic, qp)));
    if !answered {
        return WcStatus::RetryExceeded;
    }
    let len = u64::from(wr.len);
    let inside = |m: Option<&Mr>, addr: u64| {
        m.is_some_and(|m| {
            let (start, end) = (m.lease.addr(), m.lease.addr() + m.lease.len());
            addr >= start && addr.saturating_add(len) <= end
        })
    };
    if !inside(f.mrs.get(&(nic, wr.lkey)), wr.local) {
        return failure(ffi::IBV_WC_LOC_PROT_ERR);
    }
    if !inside(f.mrs.get(&(rnic, wr.rkey)), wr.remote) {
        return WcStatus::RemoteAccess;
    }
    if let Some(n) = f.nics.get_mut(nic) {
        if let Some(injected) = n.inject.pop_front() {
            return injected;
        }
    }
    let (src, dst) = match wr.op {
        RdmaOp::Write => (wr.local, wr.remote),
        RdmaOp::Read => (wr.remote, wr.local),
    };
    // SAFETY: both ranges lie inside live registrations of this process (checked above
    // under the fabric lock, which deregistration takes, and still held); each holds the
    // `Lease` of its region, which keeps the range lent memory (mapped, never freed)
    // while it lives. No Rust reference covers registered memory. `copy` allows the two
    // ranges to overlap (a loopback write).
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, wr.len as usize) };
    WcStatus::Success
}

fn qp_error(f: &mut Fabric, qp: u32) {
    let Some(q) = f.qps.get_mut(&qp) else {
        return;
    };
    q.state = QpState::Error;
    let flushed: Vec<WorkRequest> = q.queue.drain(..).collect();
    let nic = q.nic;
    if let Some(n) = f.nics.get_mut(nic) {
        n.cq.extend(flushed.into_iter().map(|wr| Completion {
            wr_id: wr.wr_id,
            status: WcStatus::Flushed,
        }));
    }
}

/// One fake RC queue pair.
#[derive(Debug)]
pub struct FakeQp {
    fabric: Arc<Mutex<Fabric>>,
    num: u32,
}

impl QueuePair for FakeQp {
    fn qp_num(&self) -> u32 {
        self.num
    }

    fn connect(&self, remote: &RemoteQp) -> Result<(), BackendError> {
        let mut f = self.fabric.lock();
        let rnic = f
            .nics
            .iter()
            .position(|n| n.gid == remote.gid)
            .ok_or_else(|| BackendError("modify_qp(RTR): no port with that GID".into()))?;
        let q = f
            .qps
            .get_mut(&self.num)
            .ok_or_else(|| BackendError("modify_qp: destroyed".into()))?;
        if q.state != QpState::Reset {
            return Err(BackendError(format!(
                "modify_qp(INIT): queue pair {} is not in RESET",
                self.num
            )));
        }
        q.remote = Some((rnic, remote.qp_num));
        q.state = QpState::Rts;
        Ok(())
    }

    fn post(&self, wr: &WorkRequest) -> Result<(), BackendError> {
        let mut f = self.fabric.lock();
        let q = f
            .qps
            .get_mut(&self.num)
            .ok_or_else(|| BackendError("ibv_post_send: destroyed".into()))?;
        match q.state {
            QpState::Reset => return Err(BackendError("ibv_post_send: EINVAL (RESET)".into())),
            QpState::Error => {
                let nic = q.nic;
                if let Some(n) = f.nics.get_mut(nic) {
                    n.cq.push_back(Completion {
                        wr_id: wr.wr_id,
                        status: WcStatus::Flushed,
                    });
                }
                return Ok(());
            }
            QpState::Rts => {}
        }
        if q.queue.len() >= q.max_wr {
            return Err(BackendError(
                "ibv_post_send: ENOMEM (send queue full)".into(),
            ));
        }
        q.queue.push_back(*wr);
        Ok(())
    }

    fn to_error(&self) {
        qp_error(&mut self.fabric.lock(), self.num);
    }
}

impl Drop for FakeQp {
    fn drop(&mut self) {
        let mut f = self.fabric.lock();
        qp_error(&mut f, self.num);
        f.qps.remove(&self.num);
    }
}
