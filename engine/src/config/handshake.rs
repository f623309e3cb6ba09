//! The handshake listener and calls: the RPC port range, the default handshake port, the
//! listener's backlog, connect timeout and largest frame.

use std::time::Duration;

use super::env::{nonzero, Env};
use super::{Config, ConfigError};

/// `MC_MIN_RPC_PORT` / `MC_MAX_RPC_PORT` (and their misspelt aliases) and the
/// `MC_HANDSHAKE_*` variables of the listener and of connecting.
pub(super) fn read<F: Fn(&str) -> Option<String>>(
    env: &Env<'_, F>,
    c: &mut Config,
) -> Result<(), ConfigError> {
    let min = env.first_int::<u16>(&["MC_MIN_RPC_PORT", "MC_MIN_PRC_PORT"], "a port number")?;
    let max = env.first_int::<u16>(&["MC_MAX_RPC_PORT", "MC_MAX_PRC_PORT"], "a port number")?;
    if let Some((var, p)) = min {
        c.min_rpc_port = check_rpc_port(var, p)?;
    }
    if let Some((var, p)) = max {
        c.max_rpc_port = check_rpc_port(var, p)?;
    }
    if c.min_rpc_port > c.max_rpc_port {
        return Err(ConfigError {
            var: "MC_MIN_RPC_PORT",
            value: c.min_rpc_port.to_string(),
            expected: format!("at most MC_MAX_RPC_PORT ({})", c.max_rpc_port),
        });
    }
    if let Some(p) = env.int::<u16>("MC_HANDSHAKE_PORT", "a port number 1-65535")? {
        c.handshake_port = nonzero("MC_HANDSHAKE_PORT", p)?;
    }
    if let Some(b) = env.int::<i32>("MC_HANDSHAKE_LISTEN_BACKLOG", "a positive integer")? {
        c.handshake_listen_backlog = b.max(1);
    }
    if let Some(s) = env.int::<u64>("MC_HANDSHAKE_CONNECT_TIMEOUT", "whole seconds")? {
        c.handshake_connect_timeout =
            Duration::from_secs(nonzero("MC_HANDSHAKE_CONNECT_TIMEOUT", s)?);
    }
    if let Some(n) = env.int::<u64>("MC_HANDSHAKE_MAX_LENGTH", "bytes, 1 to 134217728")? {
        if !(1..=128 << 20).contains(&n) {
            return Err(env.error("MC_HANDSHAKE_MAX_LENGTH", "bytes, 1 to 134217728 (128 MiB)"));
        }
        c.handshake_max_length = n;
    }
    Ok(())
}

fn check_rpc_port(var: &'static str, p: u16) -> Result<u16, ConfigError> {
    if p < 1024 || (32768..=60999).contains(&p) {
        return Err(ConfigError {
            var,
            value: p.to_string(),
            expected: "a port in 1024-32767 or 61000-65535 (the kernel's ephemeral range 32768-60999 is refused)".into(),
        });
    }
    Ok(p)
}
