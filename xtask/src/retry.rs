//! One retry policy for every network call of xtask (GitHub, the package index): a failure
//! worth another try (server error, throttling, no answer) is tried again after a delay that
//! doubles, a fixed number of times; any other failure returns at once.

use std::future::Future;
use std::time::Duration;

use crate::phase::fmt_duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// The delay before the second attempt; it doubles each time.
    pub first_delay: Duration,
    /// Attempts in all, the first included.
    pub attempts: u32,
}

impl Policy {
    /// What every call to GitHub and the package index uses: 5 attempts over about 30 s.
    pub const NETWORK: Policy = Policy {
        first_delay: Duration::from_secs(2),
        attempts: 5,
    };

    /// Runs `f(attempt)` (from 1) until it succeeds, fails for good, or the attempts are spent.
    /// `transient` says why a failure is worth another try, or `None` when it is not; each
    /// retry prints `<what>: <why>; retrying in <delay>`.
    pub async fn run<T, E, F, Fut>(
        &self,
        what: &str,
        mut f: F,
        transient: impl Fn(&E) -> Option<String>,
    ) -> Result<T, E>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut delay = self.first_delay;
        let mut attempt = 1;
        loop {
            let e = match f(attempt).await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let why = match transient(&e) {
                Some(why) if attempt < self.attempts => why,
                _ => return Err(e),
            };
            eprintln!("    {what}: {why}; retrying in {}", fmt_duration(delay));
            tokio::time::sleep(delay).await;
            delay = delay.saturating_mul(2);
            attempt += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(
        policy: Policy,
        outcomes: &[Result<u32, &'static str>],
    ) -> (Result<u32, &'static str>, u32) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut calls = 0;
        let result = rt.block_on(policy.run(
            "test",
            |attempt| {
                calls += 1;
                assert_eq!(attempt, calls);
                let outcome = outcomes[(attempt - 1) as usize];
                async move { outcome }
            },
            |e: &&str| (*e == "503").then(|| "HTTP 503".to_owned()),
        ));
        (result, calls)
    }

    #[test]
    fn transient_failures_are_retried_until_the_attempts_are_spent() {
        let quick = Policy {
            first_delay: Duration::from_millis(1),
            attempts: 3,
        };
        assert_eq!(run(quick, &[Err("503"), Ok(7)]), (Ok(7), 2));
        assert_eq!(
            run(quick, &[Err("503"), Err("503"), Err("503")]),
            (Err("503"), 3)
        );
        // Not transient: returned at once.
        assert_eq!(run(quick, &[Err("404"), Ok(7)]), (Err("404"), 1));
    }
}
