//! What a run measured, as the human line and the JSON line scripts parse.

use std::time::Duration;

/// Per-batch latencies of a run, sorted once.
pub struct Latencies(Vec<Duration>);

impl Latencies {
    /// Sorts `samples`.
    pub fn new(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        Self(samples)
    }

    /// The `p` quantile (0 to 1) in microseconds, nearest rank; 0 without samples.
    pub fn quantile_us(&self, p: f64) -> f64 {
        let last = self.0.len().saturating_sub(1);
        let i = ((last as f64) * p.clamp(0.0, 1.0)).round() as usize;
        self.0
            .get(i.min(last))
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    }

    /// The mean in microseconds; 0 without samples.
    pub fn mean_us(&self) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        let total: f64 = self.0.iter().map(Duration::as_secs_f64).sum();
        total / self.0.len() as f64 * 1e6
    }
}

/// What the initiator process spent during the timed part (`getrusage`): CPU seconds and
/// context switches, the cost per request that wall-clock figures hide.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    pub user_s: f64,
    pub system_s: f64,
    /// Sleeps (a thread blocked and was woken again).
    pub voluntary_switches: i64,
    /// Preemptions.
    pub involuntary_switches: i64,
}

impl Usage {
    /// The process's usage so far.
    pub fn now() -> Self {
        // SAFETY: a zeroed rusage is a valid output buffer for getrusage.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: RUSAGE_SELF with a valid pointer to a rusage.
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
            return Self::default();
        }
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        Self {
            user_s: secs(ru.ru_utime),
            system_s: secs(ru.ru_stime),
            voluntary_switches: ru.ru_nvcsw,
            involuntary_switches: ru.ru_nivcsw,
        }
    }

    /// What was spent from `earlier` to `self`.
    pub fn since(&self, earlier: &Usage) -> Usage {
        Usage {
            user_s: self.user_s - earlier.user_s,
            system_s: self.system_s - earlier.system_s,
            voluntary_switches: self.voluntary_switches - earlier.voluntary_switches,
            involuntary_switches: self.involuntary_switches - earlier.involuntary_switches,
        }
    }
}

/// Everything the JSON line reports.
pub struct Summary<'a> {
    pub workload: &'a str,
    pub operation: &'a str,
    pub block_size: u64,
    pub batch_size: usize,
    pub threads: usize,
    pub targets: usize,
    pub elapsed_s: f64,
    pub batches: u64,
    pub latencies: &'a Latencies,
    pub usage: Usage,
}

impl Summary<'_> {
    /// Requests completed.
    pub fn requests(&self) -> u64 {
        self.batches * self.batch_size as u64
    }

    /// Bytes moved.
    pub fn bytes(&self) -> u64 {
        self.requests() * self.block_size
    }

    /// One JSON object: the run's shape, GB/s (10^9 B/s), requests/s, and per-batch
    /// latency percentiles (`latency_*_us`; with `--batch_size=1` those are per request).
    pub fn json(&self) -> serde_json::Value {
        let secs = self.elapsed_s.max(f64::MIN_POSITIVE);
        let l = self.latencies;
        let per_request = |v: f64| v / self.requests().max(1) as f64;
        let u = self.usage;
        serde_json::json!({
            "workload": self.workload,
            "operation": self.operation,
            "block_size": self.block_size,
            "batch_size": self.batch_size,
            "threads": self.threads,
            "targets": self.targets,
            "duration_s": self.elapsed_s,
            "batches": self.batches,
            "requests": self.requests(),
            "bytes": self.bytes(),
            "gb_per_s": self.bytes() as f64 / secs / 1e9,
            "requests_per_s": self.requests() as f64 / secs,
            "latency_p50_us": l.quantile_us(0.5),
            "latency_p90_us": l.quantile_us(0.9),
            "latency_p99_us": l.quantile_us(0.99),
            "latency_p999_us": l.quantile_us(0.999),
            "latency_max_us": l.quantile_us(1.0),
            "latency_mean_us": l.mean_us(),
            "cpu_user_s": u.user_s,
            "cpu_system_s": u.system_s,
            "cpu_us_per_request": per_request((u.user_s + u.system_s) * 1e6),
            "sleeps_per_request": per_request(u.voluntary_switches as f64),
            "preemptions_per_request": per_request(u.involuntary_switches as f64),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank_over_sorted_samples() {
        let l = Latencies::new((1..=100).rev().map(Duration::from_micros).collect());
        assert_eq!(l.quantile_us(0.5), 51.0);
        assert_eq!(l.quantile_us(0.99), 99.0);
        assert_eq!(l.quantile_us(1.0), 100.0);
        assert_eq!(l.quantile_us(0.0), 1.0);
        assert!((l.mean_us() - 50.5).abs() < 1e-9);
        let empty = Latencies::new(Vec::new());
        assert_eq!((empty.quantile_us(0.5), empty.mean_us()), (0.0, 0.0));
    }

    #[test]
    fn usage_counts_forward() {
        let a = Usage::now();
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        let d = Usage::now().since(&a);
        assert!(d.user_s + d.system_s > 0.0, "{d:?}");
        assert!(d.voluntary_switches >= 0 && d.involuntary_switches >= 0);
    }

    #[test]
    fn the_json_line_has_the_keys_scripts_read() {
        let l = Latencies::new(vec![Duration::from_micros(10); 4]);
        let s = Summary {
            workload: "serving",
            operation: "write",
            block_size: 32768,
            batch_size: 32,
            threads: 10,
            targets: 4,
            elapsed_s: 2.0,
            batches: 1000,
            latencies: &l,
            usage: Usage {
                user_s: 1.0,
                system_s: 0.6,
                voluntary_switches: 64_000,
                involuntary_switches: 320,
            },
        };
        let j = s.json();
        assert!((j["cpu_us_per_request"].as_f64().unwrap() - 50.0).abs() < 1e-9);
        assert_eq!(j["sleeps_per_request"], 2.0);
        assert_eq!(j["preemptions_per_request"], 0.01);
        assert_eq!(j["requests"], 32_000);
        assert_eq!(j["bytes"], 32_000u64 * 32768);
        assert!((j["gb_per_s"].as_f64().unwrap() - 0.524288).abs() < 1e-9);
        assert_eq!(j["targets"], 4);
        assert_eq!(j["workload"], "serving");
        for key in [
            "latency_p50_us",
            "latency_p90_us",
            "latency_p99_us",
            "latency_p999_us",
            "latency_max_us",
            "latency_mean_us",
        ] {
            assert_eq!(j[key], 10.0, "{key}");
        }
    }
}
