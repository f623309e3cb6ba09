//! The TCP transport's variables: framing and timeouts, lanes and their budget, caller
//! connections, runs of writes, same-host congestion control, idle links and the bind
//! address.

use std::net::IpAddr;
use std::time::Duration;

use super::env::{nonzero, Env};
use super::{Config, ConfigError};

/// Every `MC_TCP_*` variable of the client and the data port, in the order they are
/// checked (the first bad one is the error).
pub(super) fn read<F: Fn(&str) -> Option<String>>(
    env: &Env<'_, F>,
    c: &mut Config,
) -> Result<(), ConfigError> {
    read_framing(env, c)?;
    read_lanes(env, c)?;
    read_links(env, c)
}

/// Slice size, protocol version and the status timeout.
fn read_framing<F: Fn(&str) -> Option<String>>(
    env: &Env<'_, F>,
    c: &mut Config,
) -> Result<(), ConfigError> {
    if let Some(n) = env.int::<usize>("MC_TCP_SLICE_SIZE", "bytes, at least 4096")? {
        if n < 4096 {
            return Err(env.error("MC_TCP_SLICE_SIZE", "bytes, at least 4096"));
        }
        c.tcp_slice_size = n;
    }
    if let Some(v) = env.int::<u32>("MC_TCP_PROTO", "1 or 2")? {
        if !(1..=2).contains(&v) {
            return Err(env.error("MC_TCP_PROTO", "1 or 2"));
        }
        c.tcp_proto = Some(v);
    }
    if let Some(s) = env.int::<u64>("MC_TCP_STATUS_TIMEOUT_SEC", "whole seconds, at least 1")? {
        c.tcp_status_timeout = Duration::from_secs(nonzero("MC_TCP_STATUS_TIMEOUT_SEC", s)?);
    }
    Ok(())
}

/// Lanes per peer and over all peers, stripes, pipeline depth, spinning and caller
/// connections.
fn read_lanes<F: Fn(&str) -> Option<String>>(
    env: &Env<'_, F>,
    c: &mut Config,
) -> Result<(), ConfigError> {
    let lanes = super::compat::lanes_per_peer(env)?;
    if let Some((var, n)) = lanes {
        if !(1..=16).contains(&n) {
            return Err(env.error(var, "1 to 16"));
        }
        c.tcp_lanes_per_peer = n;
    }
    if let Some(n) = env.int::<usize>("MC_TCP_LANE_BUDGET", "1 to 1024")? {
        if !(1..=1024).contains(&n) {
            return Err(env.error("MC_TCP_LANE_BUDGET", "1 to 1024"));
        }
        c.tcp_lane_budget = n;
    }
    if let Some(n) = env.int::<u64>("MC_TCP_STRIPE_SIZE", "bytes, at least 65536")? {
        if n < 65536 {
            return Err(env.error("MC_TCP_STRIPE_SIZE", "bytes, at least 65536"));
        }
        c.tcp_stripe_size = n;
    }
    if let Some(n) = env.int::<usize>("MC_TCP_PIPELINE_DEPTH", "1 to 1024")? {
        if !(1..=1024).contains(&n) {
            return Err(env.error("MC_TCP_PIPELINE_DEPTH", "1 to 1024"));
        }
        c.tcp_pipeline_depth = n;
    }
    if let Some(us) = env.int::<u64>("MC_TCP_SPIN_US", "0 to 1000 microseconds")? {
        if us > 1000 {
            return Err(env.error("MC_TCP_SPIN_US", "0 to 1000 microseconds"));
        }
        c.tcp_spin = Duration::from_micros(us);
    }
    if let Some(n) = env.int::<usize>("MC_TCP_CALLER_CONNS", "0 to 64")? {
        if n > 64 {
            return Err(env.error("MC_TCP_CALLER_CONNS", "0 to 64"));
        }
        c.tcp_caller_conns = n;
    }
    Ok(())
}

/// Runs of writes, same-host congestion control, idle links and the bind address.
fn read_links<F: Fn(&str) -> Option<String>>(
    env: &Env<'_, F>,
    c: &mut Config,
) -> Result<(), ConfigError> {
    let get = env.get;
    c.tcp_write_runs = env.switch(
        "MC_TCP_WRITE_RUNS",
        c.tcp_write_runs,
        "1/true/yes/on or 0/false/no/off",
    )?;
    if let Some(v) = get("MC_TCP_SAME_HOST_CC") {
        c.tcp_same_host_cc =
            congestion_control(&v).ok_or_else(|| env.error("MC_TCP_SAME_HOST_CC", CC_EXPECTED))?;
    }
    if let Some(s) = env.int::<u64>("MC_TCP_LINK_IDLE_SEC", "whole seconds, at least 1")? {
        c.tcp_link_idle_timeout = Duration::from_secs(nonzero("MC_TCP_LINK_IDLE_SEC", s)?);
    }
    if let Some(v) = get("MC_TCP_BIND_ADDRESS") {
        let ip = v.trim().parse::<IpAddr>().map_err(|_| ConfigError {
            var: "MC_TCP_BIND_ADDRESS",
            value: v.clone(),
            expected: "an IPv4 or IPv6 address".into(),
        })?;
        c.tcp_bind_address = Some(ip);
    }
    Ok(())
}

const CC_EXPECTED: &str =
    "system, or the name of a congestion control the kernel has (reno, cubic, bbr, ...)";

/// `MC_TCP_SAME_HOST_CC`'s value: `Some(None)` for `system`, `Some(Some(name))` for a
/// name the kernel could have (at most 15 letters, digits, `_` or `-`), else `None`.
fn congestion_control(v: &str) -> Option<Option<String>> {
    let v = v.trim();
    if v.eq_ignore_ascii_case("system") {
        return Some(None);
    }
    let name_like = !v.is_empty()
        && v.len() < 16
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    name_like.then(|| Some(v.to_owned()))
}
