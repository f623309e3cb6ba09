//! Rate-limited log lines for bounds that a hostile peer can make bite
//! thousands of times a second: one line per interval, with the count of the
//! lines left out since the last one, so the log stays readable and the
//! flood stays visible.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Lets one line through per interval.
#[derive(Debug)]
pub struct LogThrottle {
    every: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl LogThrottle {
    /// At most one line per `every`.
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            state: Mutex::new((None, 0)),
        }
    }

    /// One line a second: the interval every bound of the engine uses.
    pub fn per_second() -> Self {
        Self::new(Duration::from_secs(1))
    }

    /// `Some(left_out)` when a line may be written now (`left_out` lines
    /// were suppressed since the previous one); `None` to stay quiet.
    pub fn allow(&self) -> Option<u64> {
        let mut st = self.state.lock();
        let now = Instant::now();
        match st.0 {
            Some(last) if now.duration_since(last) < self.every => {
                st.1 += 1;
                None
            }
            _ => {
                st.0 = Some(now);
                Some(std::mem::take(&mut st.1))
            }
        }
    }
}

/// Messages that are said once per process (a configuration warning re-read on every
/// `initialize`): true the first time `msg` is seen. Past 4096 distinct messages every
/// message counts as new, so a flood of distinct ones stays visible and bounded.
pub fn first_time(msg: &str) -> bool {
    static SEEN: Mutex<Option<std::collections::HashSet<String>>> = Mutex::new(None);
    let mut seen = SEEN.lock();
    let set = seen.get_or_insert_with(Default::default);
    if set.len() >= 4096 {
        return true;
    }
    set.insert(msg.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_then_the_count_of_the_rest() {
        let t = LogThrottle::new(Duration::from_secs(3600));
        assert_eq!(t.allow(), Some(0));
        assert_eq!(t.allow(), None);
        assert_eq!(t.allow(), None);
        // Pretend the interval passed.
        t.state.lock().0 = Instant::now().checked_sub(Duration::from_secs(7200));
        assert_eq!(t.allow(), Some(2));
    }

    #[test]
    fn first_time_is_true_once_per_message() {
        assert!(first_time("log_throttle test message a"));
        assert!(!first_time("log_throttle test message a"));
        assert!(first_time("log_throttle test message b"));
    }
}
