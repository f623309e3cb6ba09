//! `peer`: reach a running engine at `host:port` (its handshake port): a probe, its
//! segment descriptor, and a connection to the data port it advertises. Each step is
//! bounded by the run's budget; the first that fails says why and stops.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use transfer_engine::metadata::handshake;
use transfer_engine::wire::descriptor::{probe_reply_ok, SegmentDesc};
use transfer_engine::wire::handshake::MessageType;
use transfer_engine::wire::session::HostPort;
use transfer_engine::Config;

use crate::host::Inputs;
use crate::report::Check;

/// The peer check for `peer`.
pub fn check(inp: &Inputs, config: &Config, peer: &str) -> Check {
    let started = Instant::now();
    let hp = match HostPort::parse(peer, config.handshake_port) {
        Ok(hp) => hp,
        Err(e) => {
            return Check::fail(
                "peer",
                format!("{peer:?} is not HOST:PORT: {e}"),
                "pass the engine's handshake address, e.g. --peer 10.0.0.2:15123 (engine.get_rpc_port() says the port)",
            )
        }
    };
    let mut cfg = config.clone();
    let half = inp.budget / 2;
    cfg.handshake_timeout = half;
    cfg.handshake_connect_timeout = half.min(Duration::from_secs(1));
    let unreachable_fix = format!(
        "is an engine running there, and is {} its handshake port (engine.get_rpc_port(); upstream picks one in MC_MIN_RPC_PORT..MC_MAX_RPC_PORT, default 15000-17000)? check firewalls between the hosts",
        hp.port
    );
    let reply = match handshake::request(&hp, MessageType::Probe, "{}", &cfg) {
        Ok(r) => r,
        Err(e) => {
            return Check::fail("peer", format!("probe of {peer}: {e}"), unreachable_fix)
                .with_data(json!({"peer": peer, "step": "probe", "error": e.to_string()}))
        }
    };
    if !probe_reply_ok(&reply) {
        return Check::fail(
            "peer",
            format!("{peer} answered the probe with {reply:?}, not a transfer engine's reply"),
            unreachable_fix,
        )
        .with_data(json!({"peer": peer, "step": "probe", "reply": reply}));
    }
    let raw = match handshake::request(&hp, MessageType::Metadata, "{}", &cfg) {
        Ok(r) => r,
        Err(e) => {
            return Check::fail(
                "peer",
                format!("{peer} answers probes but its descriptor could not be fetched: {e}"),
                "the peer may be overloaded or older than upstream 0.3.12; MC_HANDSHAKE_TIMEOUT bounds this",
            )
            .with_data(json!({"peer": peer, "step": "descriptor", "error": e.to_string()}))
        }
    };
    let desc =
        match SegmentDesc::decode(&raw) {
            Ok(d) => d,
            Err(e) => return Check::fail(
                "peer",
                format!("{peer} sent a descriptor this engine cannot read: {e}"),
                "the peer speaks another version of the protocol: compare `pip show` on both sides",
            )
            .with_data(json!({"peer": peer, "step": "descriptor", "error": e.to_string()})),
        };
    let extra: Value = serde_json::from_str(&raw).unwrap_or(Value::Null);
    let devices: Vec<String> = extra
        .get("devices")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|d| d.get("name").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    // Peer bytes: lengths that overflow when added are saturated, not trusted.
    let total: u64 = desc
        .buffers
        .iter()
        .fold(0u64, |acc, b| acc.saturating_add(b.length));
    let mut saw = format!(
        "{peer} answers: segment {:?} serves {} with {} buffer(s), {} bytes in all",
        desc.name,
        desc.protocol.join(" + "),
        desc.buffers.len(),
        total
    );
    if !devices.is_empty() {
        saw.push_str(&format!("; RDMA devices {}", devices.join(", ")));
    }
    let data_host = desc
        .tcp_data_host
        .clone()
        .unwrap_or_else(|| hp.host.clone());
    let mut data = json!({
        "peer": peer, "segment": desc.name, "protocols": desc.protocol,
        "buffers": desc.buffers.len(), "bytes": total, "rdma_devices": devices,
        "tcp_data": if desc.tcp_data_port > 0 { Some(format!("{data_host}:{}", desc.tcp_data_port)) } else { None },
        "tcp_proto_version": desc.tcp_proto_version,
    });
    if desc.tcp_data_port > 0 {
        let left = inp
            .budget
            .saturating_sub(started.elapsed())
            .max(Duration::from_millis(200));
        match connect(
            &data_host,
            desc.tcp_data_port,
            left.min(Duration::from_secs(1)),
        ) {
            Ok(()) => saw.push_str(&format!(
                "; TCP data port {data_host}:{} accepts connections",
                desc.tcp_data_port
            )),
            Err(e) => {
                data["step"] = json!("tcp_data");
                return Check::fail(
                    "peer",
                    format!("{saw}; but its TCP data port {data_host}:{} refuses: {e}", desc.tcp_data_port),
                    "the data port must be reachable from here too: open it in the firewall, or set MC_TCP_BIND_ADDRESS on the peer to an address this host can reach",
                )
                .with_data(data);
            }
        }
    }
    if desc.buffers.is_empty() {
        return Check::warn(
            "peer",
            format!("{saw}; it has registered no memory yet"),
            "transfers to it fail until it calls register_memory",
        )
        .with_data(data);
    }
    Check::ok("peer", saw).with_data(data)
}

fn connect(host: &str, port: u16, timeout: Duration) -> Result<(), String> {
    let addrs: Vec<_> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .collect();
    let mut last = format!("{host} resolves to no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(_) => return Ok(()),
            Err(e) => last = format!("{a}: {e}"),
        }
    }
    Err(last)
}
