//! The bounds on what peers can make this engine spend: handshake and data connections,
//! their deadlines, queued notifications and device staging memory.

use std::time::Duration;

use super::env::{nonzero, Env};
use super::{Config, ConfigError};

/// The bounds on what peers can make this engine spend.
pub(super) fn read<F: Fn(&str) -> Option<String>>(
    env: &Env<'_, F>,
    c: &mut Config,
) -> Result<(), ConfigError> {
    let secs = |var: &'static str| -> Result<Option<Duration>, ConfigError> {
        match env.int::<u64>(var, "whole seconds, at least 1")? {
            Some(s) => Ok(Some(Duration::from_secs(nonzero(var, s)?))),
            None => Ok(None),
        }
    };
    let count = |var: &'static str| -> Result<Option<usize>, ConfigError> {
        match env.int::<usize>(var, "a count, at least 1")? {
            Some(n) => Ok(Some(nonzero(var, n)?)),
            None => Ok(None),
        }
    };
    if let Some(d) = secs("MC_HANDSHAKE_SERVER_TIMEOUT")? {
        c.handshake_server_timeout = d;
    }
    if let Some(d) = secs("MC_HANDSHAKE_TIMEOUT")? {
        c.handshake_timeout = d;
    }
    if let Some(n) = count("MC_HANDSHAKE_MAX_CONNECTIONS")? {
        c.handshake_max_connections = n;
    }
    if let Some(n) = count("MC_HANDSHAKE_MAX_CONNECTIONS_PER_IP")? {
        c.handshake_max_connections_per_ip = n;
    }
    if let Some(n) = count("MC_TCP_SERVER_MAX_CONNECTIONS")? {
        c.tcp_server_max_connections = n;
    }
    if let Some(n) = count("MC_TCP_SERVER_MAX_CONNECTIONS_PER_IP")? {
        c.tcp_server_max_connections_per_ip = n;
    }
    if let Some(d) = secs("MC_TCP_SERVER_IDLE_TIMEOUT")? {
        c.tcp_server_idle_timeout = d;
    }
    if let Some(n) = env.int::<usize>("MC_NOTIFY_QUEUE_BYTES", "bytes, at least 4096")? {
        if n < 4096 {
            return Err(env.error("MC_NOTIFY_QUEUE_BYTES", "bytes, at least 4096"));
        }
        c.notify_queue_bytes = n;
    }
    // One stager is two 2 MiB chunks: less than 4 MiB could stage nothing.
    let staging = "MiB, 4 to 65536 (one stager is 4 MiB)";
    if let Some(mb) = env.int::<usize>("MC_TCP_STAGING_BUDGET_MB", staging)? {
        if !(4..=65536).contains(&mb) {
            return Err(env.error("MC_TCP_STAGING_BUDGET_MB", staging));
        }
        c.tcp_staging_budget = mb << 20;
    }
    Ok(())
}
