//! What recording metrics costs one single-request batch, the 4 KiB latency benchmark's
//! case: a recorder built and set, the request and the batch finished, against the same
//! batch without a recorder. Prints nanoseconds per batch (`docs/benchmarks.md`).
//!
//! `cargo run --release -p transfer-engine --example metrics_cost`

use std::time::{Duration, Instant};

use transfer_engine::metrics::{Metrics, RequestInfo};
use transfer_engine::task::BatchState;

const ROUNDS: u32 = 1_000_000;

fn run(metrics: Option<&Metrics>) -> Duration {
    let peer = metrics.map(|m| m.peer("127.0.0.1:12345"));
    let t0 = Instant::now();
    for _ in 0..ROUNDS {
        let batch = BatchState::new(&[1], Duration::from_secs(5));
        if let (Some(m), Some(peer)) = (metrics, &peer) {
            let infos = [RequestInfo {
                transport: 0,
                read: false,
                len: 4096,
            }];
            batch.set_recorder(m.recorder(peer.clone(), ["tcp"].into_iter(), infos));
        }
        batch.slice_done(0, Ok(()));
        std::hint::black_box(&batch);
    }
    t0.elapsed()
}

fn main() {
    let metrics = Metrics::new(&["tcp"]);
    // Warm up, then alternate to share whatever noise the machine has.
    run(None);
    run(Some(&metrics));
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        off.push(run(None));
        on.push(run(Some(&metrics)));
    }
    let per = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_nanos() as f64 / f64::from(ROUNDS)
    };
    let (off, on) = (per(&mut off), per(&mut on));
    println!(
        "batch without metrics {off:.0} ns, with {on:.0} ns: metrics cost {:.0} ns per single-request batch",
        on - off
    );
}
