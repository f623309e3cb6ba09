//! Defaults that follow the CPUs this process may run on (lanes, lane budget, caller
//! connections, spinning, the waiter's looks, same-host congestion control), each with the
//! measurements it rests on.

use std::time::Duration;

/// CPUs this process may run on (its affinity mask and cgroup quota).
pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get())
}

pub(super) fn default_lanes() -> usize {
    lanes_for_cpus(available_cpus())
}

/// How long TCP threads spin before sleeping, for a process that may run on `cpus` CPUs:
/// 50 µs from 2 CPUs on, as a sleeping thread's wake-up (tens of µs, 35-40 µs on the
/// 2-core VM when it lands on the other, halted, CPU) is most of a small request's time;
/// none on one CPU, where a spinning thread takes the CPU the thread it waits for needs.
/// On 2 CPUs a lone request's two threads are the caller and the peer's connection thread
/// (`PeerLink::send_lone`), one per CPU; there, 4 KiB p99 went from 166-177 µs to 19-39 µs.
pub fn spin_for_cpus(cpus: usize) -> Duration {
    if cpus >= 2 {
        Duration::from_micros(50)
    } else {
        Duration::ZERO
    }
}

/// Caller connections per peer for a process that may run on `cpus` CPUs: two per lane,
/// 16 at most, from 8 CPUs on, none below. On the 16-CPU host, callers sending their own
/// batches moved the serving shape 30-37% faster than the lanes, and 10 callers to one
/// peer over 8 connections left two on the lanes, 13% slower than with 16; 32 were no
/// faster than 16 (26.1-30.3 GB/s with 4 peers against 26.0-28.0), and each is a thread on
/// the peer, whose connections from one address are capped
/// (`MC_TCP_SERVER_MAX_CONNECTIONS_PER_IP`). On the 2-core VM the same made it 15-30%
/// slower with a p99 ten times as long: there, the callers outnumber the CPUs and one
/// sending a whole batch holds a CPU another caller's statuses wait for.
pub fn caller_conns_for_cpus(cpus: usize) -> usize {
    if cpus >= 8 {
        (2 * lanes_for_cpus(cpus)).min(16)
    } else {
        0
    }
}

/// The default congestion control of same-host data connections: `reno` below 8 CPUs,
/// the system's from 8 on. reno does not pace; bbr, a common system default, paces each
/// connection through a timer of its own. On the 2-CPU VM, with reno, batches of 64 KiB
/// and 4 MiB moved 1.02-1.72x as much (64 KiB reads least) and the serving shape
/// 1.3-1.6x. On the 16-CPU GPU host the serving shape with 4 peers moved 0.89-0.99x as
/// much in 7 rounds of 7, whether or not the caller connections had reno, and batches
/// gained only where reno's build ran after the other in a round (docs/benchmarks.md,
/// session 16). From 8 CPUs on callers send their own batches; on the 2-CPU VM, with
/// caller connections turned on, reno slowed them too.
pub fn same_host_cc_for_cpus(cpus: usize) -> Option<String> {
    (cpus < 8).then(|| "reno".to_owned())
}

/// Times a caller waiting for its batch looks for completion, yielding in between, before
/// it sleeps: 64 from 8 CPUs on (a sleep and its wake-up cost more than a small request);
/// none below, where each yield hands the CPU to no purpose while the lane and the peer's
/// thread need both CPUs of 2: on the 2-core VM the looks made 4 KiB single requests 71-75
/// µs at p50 against 18-20 µs without them (docs/benchmarks.md, issue 12).
pub fn waiter_looks_for_cpus(cpus: usize) -> u32 {
    if cpus >= 8 {
        64
    } else {
        0
    }
}

/// Lanes per peer for a process that may run on `cpus` CPUs (its affinity mask and cgroup
/// quota, as `available_parallelism` counts them, so a process bound to one NUMA node with
/// `numactl --cpunodebind` or `taskset` counts that node's CPUs): one per CPU, up to 16
/// (`MC_TCP_LANES_PER_PEER`'s most). A lane's copies of cold memory wait on the memory
/// more than they use their CPU, so lanes up to the CPUs still add throughput. On the
/// 16-CPU host 4 MiB writes moved 12.0-12.1 GB/s over 4 lanes, 20.6-21.4 over 8,
/// 26.4-28.1 over 12 and 26.2-28.8 over 16 (reads alike); on 8 of its CPUs, 8 lanes moved
/// 4 MiB batches 1.5x as fast as 4 and 64 KiB reads 1.25x, and 6 lanes left 64 KiB writes
/// 20% slower than 4 or 8 (a batch's groups did not divide evenly among them). On 2 CPUs
/// it is 2, as before (docs/benchmarks.md, issue 12). The hosts measured have one NUMA node.
pub fn lanes_for_cpus(cpus: usize) -> usize {
    cpus.clamp(1, 16)
}

/// Lanes over all peers for a process that may run on `cpus` CPUs: one per CPU, and never
/// fewer than one peer's lanes ([`lanes_for_cpus`]). So one peer gets all its lanes, and
/// several peers share the CPUs instead of each adding its own threads.
pub fn lane_budget_for_cpus(cpus: usize) -> usize {
    cpus.max(lanes_for_cpus(cpus))
}
