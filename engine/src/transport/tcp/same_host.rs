//! The congestion control of data connections within one host (`MC_TCP_SAME_HOST_CC`).
//!
//! Over loopback there is no network to share and no loss to react to; what a congestion
//! control costs there is CPU. bbr, a common system default, paces every connection
//! through a timer of its own. Which one moves more depends on the host: see
//! `config::same_host_cc_for_cpus` for the default and the measurements behind it.
//! Connections to other hosts keep the system's.

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};

use socket2::SockRef;

use crate::net;

/// Set once a refusal was logged: one line per process is enough to say why.
static REFUSAL_LOGGED: AtomicBool = AtomicBool::new(false);

/// Gives `stream` the congestion control `cc` if it joins two addresses of this host
/// (`None`: the system's stays). A kernel that refuses the name (not built in, or not
/// allowed to this user: `net.ipv4.tcp_allowed_congestion_control`) leaves the system's,
/// said once per process.
pub(super) fn tune(stream: &TcpStream, cc: Option<&str>) {
    let Some(cc) = cc else {
        return;
    };
    if !net::same_host(stream) {
        return;
    }
    if let Err(e) = SockRef::from(stream).set_tcp_congestion(cc.as_bytes()) {
        if !REFUSAL_LOGGED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "same-host data connections keep the system's congestion control: the kernel refused {cc:?} ({e}); set MC_TCP_SAME_HOST_CC to one it allows (net.ipv4.tcp_allowed_congestion_control), or to system"
            );
        }
    }
}
