//! A batch's way from [`TransferEngine::submit`](super::TransferEngine::submit) to the
//! transports: the peer's descriptor, requests outside its buffers failed at once, a
//! transport chosen per request, the batch made, each request cut into slices of that
//! transport's stripe, and the slices posted.

use std::sync::Arc;
use std::time::Duration;

use super::{Batch, EngineError, Inner, Request, Segment, SubmitOptions};
use crate::error::TransferError;
use crate::memory::Region;
use crate::metrics::RequestInfo;
use crate::task::BatchState;
use crate::transport::{Slice, Transport};
use crate::wire::descriptor::SegmentDesc;
use crate::wire::session::SegmentId;
use crate::wire::tcp::OpCode;

/// Where one request goes: its local region and device, and the transport that moves it
/// (an index into the batch's transports; 0, the peer's own, for requests that move
/// nothing).
struct Route {
    region: Option<Arc<Region>>,
    device: Option<u32>,
    which: usize,
}

/// A segment of a submit and the transport that reaches it.
struct Reached {
    seg: Arc<Segment>,
    /// Its descriptor was fetched just now (not cached).
    fetched: bool,
    transport: Arc<dyn Transport>,
}

/// Per transport of a batch, its stripe of host memory and of device memory.
struct Stripes(Vec<[u64; 2]>);

impl Stripes {
    fn of(transports: &[Arc<dyn Transport>]) -> Self {
        Self(
            transports
                .iter()
                .map(|t| [false, true].map(|device| t.slice_size_for(device).max(1)))
                .collect(),
        )
    }

    fn get(&self, which: usize, device: bool) -> u64 {
        self.0[which][usize::from(device)]
    }
}

impl Inner {
    pub(super) fn submit(
        &self,
        id: &SegmentId,
        requests: &[Request],
        options: &SubmitOptions,
    ) -> Result<Batch, EngineError> {
        let Reached {
            seg,
            fetched,
            transport,
        } = self.segment_reached(id)?;
        let unknown = self.outside_buffers(id, &seg, fetched, requests)?;
        let desc = Arc::clone(&seg.desc.read());
        let mut transports: Vec<Arc<dyn Transport>> = vec![transport];
        let routes = self.routes(&desc, requests, &unknown, &mut transports);
        let nic = options.nic.as_deref().filter(|n| !n.is_empty());
        if let Some(unknown) = nic.and_then(|name| crate::transport::unknown_nic(name, &transports))
        {
            return Err(unknown.into());
        }
        let stripes = Stripes::of(&transports);
        let batch = self.new_batch(&seg, requests, &unknown, &routes, &transports, &stripes);
        if options.caller_waits {
            batch.set_caller_waits();
        }
        if let Some(name) = nic {
            batch.set_nic_hint(name);
        }
        for &i in &unknown {
            let r = &requests[i];
            batch.task_failed(
                i,
                TransferError::AddressRejected {
                    peer: id.to_string(),
                    addr: r.remote,
                    len: r.len,
                },
            );
        }
        let slices = cut_slices(
            requests,
            &unknown,
            routes,
            &stripes,
            transports.len(),
            &batch,
        );
        // The peer's own transport (index 0) last: if it fails, what others took is
        // drained before the error returns, so the caller's memory is free again.
        for (t, group) in transports.iter().zip(slices).rev() {
            if !group.is_empty() {
                if let Err(e) = t.post(id, &desc, group) {
                    batch.cancel_and_drain();
                    return Err(e.into());
                }
            }
        }
        Ok(batch)
    }

    /// The segment, whether its descriptor was fetched just now, and the transport that
    /// reaches it; a cached descriptor whose peer is unreachable is fetched again.
    fn segment_reached(&self, id: &SegmentId) -> Result<Reached, EngineError> {
        let (mut seg, mut fetched) = self.open_segment(id)?;
        let mut transport = self.transport_for(id, &seg.desc.read())?;
        if !fetched {
            let why = transport.unreachable(id, &seg.desc.read());
            if let Some(why) = why {
                // The peer may have restarted on new ports: look it up again.
                tracing::info!(
                    "segment {id} was unreachable ({why}); fetching its descriptor again"
                );
                self.segments.write().remove(id.name());
                (seg, fetched) = self.open_segment(id)?;
                transport = self.transport_for(id, &seg.desc.read())?;
            }
        }
        Ok(Reached {
            seg,
            fetched,
            transport,
        })
    }

    /// The indices, in order, of the requests whose remote range is in none of the peer's
    /// buffers (after one fetch of a cached descriptor, which may be older than them).
    fn outside_buffers(
        &self,
        id: &SegmentId,
        seg: &Segment,
        fetched: bool,
        requests: &[Request],
    ) -> Result<Vec<usize>, EngineError> {
        let mut unknown = Vec::new();
        {
            let desc = seg.desc.read();
            for (i, r) in requests.iter().enumerate() {
                if r.len > 0 && desc.find_buffer(r.remote, r.len).is_none() {
                    unknown.push(i);
                }
            }
        }
        if !unknown.is_empty() && !fetched {
            // The peer may have registered memory since we cached its descriptor.
            self.refresh_segment(id, seg)?;
            let desc = seg.desc.read();
            unknown.retain(|&i| {
                let r = &requests[i];
                desc.find_buffer(r.remote, r.len).is_none()
            });
        }
        Ok(unknown)
    }

    /// Per request: its local region and device, and the transport that moves it (one
    /// that takes this request, e.g. same-host GPU IPC, else the peer's transport, the
    /// first of `transports`, to which the others chosen are added).
    fn routes(
        &self,
        desc: &SegmentDesc,
        requests: &[Request],
        unknown: &[usize],
        transports: &mut Vec<Arc<dyn Transport>>,
    ) -> Vec<Route> {
        let gpu = crate::device::runtime()
            .ok()
            .filter(|rt| rt.device_count() > 0);
        requests
            .iter()
            .enumerate()
            .map(|(i, r)| {
                if r.len == 0 || unknown.binary_search(&i).is_ok() {
                    return Route {
                        region: None,
                        device: None,
                        which: 0,
                    };
                }
                let region = self.memory.find(r.local, r.len);
                let local_device = match &region {
                    Some(region) => region.device.map(|(_, d)| d),
                    None => gpu.as_ref().and_then(|rt| rt.device_of(r.local)),
                };
                let taker = desc.find_buffer(r.remote, r.len).and_then(|b| {
                    self.transports
                        .iter()
                        .find(|t| t.takes(desc, local_device, b))
                        .or_else(|| {
                            // The peer's transport cannot move this one (RDMA and memory
                            // no HCA registered): the next one that reaches the peer.
                            let first = transports.first()?;
                            if !first.declines(region.as_deref(), b) {
                                return None;
                            }
                            self.transports.iter().find(|t| {
                                !Arc::ptr_eq(t, first)
                                    && t.reaches(desc)
                                    && !t.declines(region.as_deref(), b)
                            })
                        })
                });
                let which = match taker {
                    None => 0,
                    Some(t) => match transports.iter().position(|u| Arc::ptr_eq(u, t)) {
                        Some(k) => k,
                        None => {
                            transports.push(t.clone());
                            transports.len() - 1
                        }
                    },
                };
                Route {
                    region,
                    device: local_device,
                    which,
                }
            })
            .collect()
    }

    /// The batch of `requests`, counting a slice per stripe of each (one for a request
    /// that fails at once, none for an empty one), its deadline from their bytes, and its
    /// metrics recorder.
    fn new_batch(
        &self,
        seg: &Segment,
        requests: &[Request],
        unknown: &[usize],
        routes: &[Route],
        transports: &[Arc<dyn Transport>],
        stripes: &Stripes,
    ) -> Batch {
        let counts: Vec<u32> = requests
            .iter()
            .enumerate()
            .map(|(i, r)| {
                if r.len == 0 || unknown.binary_search(&i).is_ok() {
                    u32::from(r.len > 0)
                } else {
                    let route = &routes[i];
                    r.len
                        .div_ceil(stripes.get(route.which, route.device.is_some()))
                        as u32
                }
            })
            .collect();
        let bytes: u64 = requests.iter().map(|r| r.len).sum();
        let budget = self.config.transfer_timeout + Duration::from_nanos(bytes);
        let batch = BatchState::new(&counts, budget);
        // `bench-no-metrics` (a build for the metrics-overhead A/B only) records nothing.
        if cfg!(not(feature = "bench-no-metrics")) {
            let infos = requests.iter().zip(routes).map(|(r, route)| RequestInfo {
                transport: u8::try_from(route.which).unwrap_or(u8::MAX),
                read: r.op == OpCode::Read,
                len: r.len,
            });
            batch.set_recorder(self.metrics.recorder(
                seg.peer_metrics.clone(),
                transports.iter().map(|t| t.protocol()),
                infos,
            ));
        }
        batch
    }
}

/// The slices of `requests` for each of `transports` transports, each request cut into
/// its transport's stripe for its memory; empty requests and those in `unknown` give none.
fn cut_slices(
    requests: &[Request],
    unknown: &[usize],
    routes: Vec<Route>,
    stripes: &Stripes,
    transports: usize,
    batch: &Batch,
) -> Vec<Vec<Slice>> {
    let mut slices: Vec<Vec<Slice>> = (0..transports).map(|_| Vec::new()).collect();
    for (i, (r, route)) in requests.iter().zip(routes).enumerate() {
        if r.len == 0 || unknown.binary_search(&i).is_ok() {
            continue;
        }
        let Route {
            region,
            device: local_device,
            which,
        } = route;
        let stripe = stripes.get(which, local_device.is_some());
        let mut off = 0;
        while off < r.len {
            let n = stripe.min(r.len - off);
            slices[which].push(Slice {
                local_device,
                local_region: region.clone(),
                op: r.op,
                local: r.local + off,
                remote: r.remote + off,
                len: n,
                batch: batch.clone(),
                task: i,
                retries: 0,
            });
            off += n;
        }
    }
    slices
}
