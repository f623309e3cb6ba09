//! Log set-up: `tracing` to stderr, level from `MC_LOG_LEVEL` (or `RUST_LOG`).
//!
//! `RUST_LOG` takes `tracing`'s target directives (`warn`, `transfer_engine=debug,info`);
//! span and field filters are not supported (they would pull a regex engine into the wheel).

use crate::config::LogLevel;
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Installs a stderr subscriber once per process; later calls do nothing.
pub fn init(level: LogLevel) {
    let filter = filter_from(std::env::var("RUST_LOG").ok().as_deref(), level);
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(filter)
        .try_init();
}

/// `RUST_LOG`'s directives when set and valid, else `level`; a `RUST_LOG` that does not
/// parse is reported on stderr rather than ignored in silence.
fn filter_from(rust_log: Option<&str>, level: LogLevel) -> Targets {
    let fallback = || {
        Targets::new().with_default(match level {
            LogLevel::Trace => Level::TRACE,
            LogLevel::Debug => Level::DEBUG,
            LogLevel::Info => Level::INFO,
            LogLevel::Warning => Level::WARN,
            LogLevel::Error => Level::ERROR,
        })
    };
    match rust_log.map(str::trim) {
        None | Some("") => fallback(),
        Some(directives) => directives.parse().unwrap_or_else(|e| {
            eprintln!(
                "mooncake: RUST_LOG={directives:?} is not a list of `target=level` directives \
                 ({e}); logging at MC_LOG_LEVEL's {} instead",
                level.directive()
            );
            fallback()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mc_log_level_applies_without_rust_log() {
        let f = filter_from(None, LogLevel::Warning);
        assert!(f.would_enable("transfer_engine::x", &Level::WARN));
        assert!(!f.would_enable("transfer_engine::x", &Level::INFO));
    }

    #[test]
    fn rust_log_directives_win_over_mc_log_level() {
        let f = filter_from(Some("transfer_engine=debug,error"), LogLevel::Warning);
        assert!(f.would_enable("transfer_engine::x", &Level::DEBUG));
        assert!(!f.would_enable("tonic", &Level::WARN));
        assert!(f.would_enable("tonic", &Level::ERROR));
    }

    #[test]
    fn bad_rust_log_falls_back_to_mc_log_level() {
        let f = filter_from(Some("a=[x]{"), LogLevel::Info);
        assert!(f.would_enable("transfer_engine::x", &Level::INFO));
        assert!(!f.would_enable("transfer_engine::x", &Level::DEBUG));
    }
}
