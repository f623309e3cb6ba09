//! Upstream's variables kept for compatibility: deprecated names honoured with a warning
//! while the new one is unset, and variables accepted that have no effect here.

use super::env::Env;
use super::{ConfigError, HcaFilter};

/// Variables accepted only for compatibility: they tune upstream's bounded
/// queues, which this engine replaces with backpressure.
const NO_EFFECT: &[&str] = &[
    "MC_TCP_ENABLE_CONNECTION_POOL",
    "MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER",
    "MC_TCP_MAX_PENDING_ADMISSIONS_PER_PEER",
    "MC_TCP_ADMISSION_TIMEOUT_MS",
];

/// Logs each variable of [`NO_EFFECT`] that is set.
pub(super) fn note_no_effect(get: &impl Fn(&str) -> Option<String>) {
    for var in NO_EFFECT {
        if get(var).is_some() {
            tracing::info!(
                "{var} is accepted for compatibility but has no effect: this engine queues any number of requests per peer and applies backpressure instead of rejecting"
            );
        }
    }
}

/// `MC_TCP_LANES_PER_PEER`, or the deprecated `MC_TCP_MAX_CONNECTIONS_PER_PEER` when it is
/// unset, with the name of the variable it came from.
pub(super) fn lanes_per_peer<F: Fn(&str) -> Option<String>>(
    env: &Env<'_, F>,
) -> Result<Option<(&'static str, usize)>, ConfigError> {
    Ok(
        match env.int::<usize>("MC_TCP_LANES_PER_PEER", "1 to 16")? {
            Some(n) => Some(("MC_TCP_LANES_PER_PEER", n)),
            None => {
                let old = env.int::<usize>("MC_TCP_MAX_CONNECTIONS_PER_PEER", "1 to 16")?;
                if old.is_some() {
                    tracing::warn!(
                        "MC_TCP_MAX_CONNECTIONS_PER_PEER is deprecated; use MC_TCP_LANES_PER_PEER"
                    );
                }
                old.map(|n| ("MC_TCP_MAX_CONNECTIONS_PER_PEER", n))
            }
        },
    )
}

/// `MC_TE_FILTERS`, or the legacy `MOONCAKE_RDMA_DEVICES` when it is unset, and the
/// warning to give. An explicit `MC_TE_FILTERS`, even empty (every HCA), wins.
pub fn hca_filter(get: &dyn Fn(&str) -> Option<String>) -> (Option<HcaFilter>, Option<String>) {
    let names = |v: &str| -> Vec<String> {
        v.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    };
    match (get("MC_TE_FILTERS"), get("MOONCAKE_RDMA_DEVICES")) {
        (Some(new), Some(old)) => (
            Some(HcaFilter {
                var: "MC_TE_FILTERS",
                names: names(&new),
            }),
            Some(format!(
                "MOONCAKE_RDMA_DEVICES={old:?} is deprecated and MC_TE_FILTERS replaces it: MC_TE_FILTERS={new:?} and MOONCAKE_RDMA_DEVICES are both set, MC_TE_FILTERS wins; unset MOONCAKE_RDMA_DEVICES"
            )),
        ),
        (Some(new), None) => (
            Some(HcaFilter {
                var: "MC_TE_FILTERS",
                names: names(&new),
            }),
            None,
        ),
        (None, Some(old)) => (
            Some(HcaFilter {
                var: "MOONCAKE_RDMA_DEVICES",
                names: names(&old),
            }),
            Some(format!(
                "MOONCAKE_RDMA_DEVICES={old:?} is deprecated and MC_TE_FILTERS replaces it (the old name is honoured only while MC_TE_FILTERS is unset); set MC_TE_FILTERS={old:?} instead"
            )),
        ),
        (None, None) => (None, None),
    }
}
