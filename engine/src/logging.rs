//! Log set-up: `tracing` to stderr, level from `MC_LOG_LEVEL` (or `RUST_LOG`).

use crate::config::LogLevel;

/// Installs a stderr subscriber once per process; later calls do nothing.
pub fn init(level: LogLevel) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level.directive()));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
