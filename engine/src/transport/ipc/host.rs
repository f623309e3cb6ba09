//! Which host and process a segment runs in, so that IPC handles are only ever opened
//! for peers on this host, and dropped once their owner is gone.

use crate::wire::descriptor::SegmentDesc;

/// This process's identity, as advertised in the descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct HostIdentity {
    /// The kernel's boot id (or `MC_HOST_ID`).
    pub host_id: String,
    /// This process.
    pub pid: u32,
    /// This process's pid namespace (`pid:[4026531836]`).
    pub pid_ns: String,
}

impl HostIdentity {
    /// Reads the boot id (unless `host_id` overrides it) and the pid namespace.
    pub fn local(host_id: Option<String>) -> Result<Self, String> {
        let host_id = match host_id {
            Some(h) => h,
            None => std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .map(|s| s.trim().to_string())
                .map_err(|e| {
                    format!("cannot read /proc/sys/kernel/random/boot_id ({e}); set MC_HOST_ID")
                })?,
        };
        let pid_ns = std::fs::read_link("/proc/self/ns/pid")
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        Ok(Self {
            host_id,
            pid: std::process::id(),
            pid_ns,
        })
    }

    /// Adds the identity to the local descriptor.
    pub fn describe(&self, desc: &mut SegmentDesc) {
        desc.host_id = Some(self.host_id.clone());
        desc.pid = Some(self.pid);
        desc.pid_ns = (!self.pid_ns.is_empty()).then(|| self.pid_ns.clone());
    }

    /// Whether `peer` runs on this host: `None` when it does not say (upstream peers).
    pub fn same_host(&self, peer: &SegmentDesc) -> Option<bool> {
        peer.host_id.as_ref().map(|h| *h == self.host_id)
    }

    /// Whether `peer`'s process is known to have exited: it is on this host, in our pid
    /// namespace, and its pid no longer exists. Unknown means alive.
    pub fn peer_gone(&self, peer: &SegmentDesc) -> bool {
        let (Some(pid), Some(ns)) = (peer.pid, peer.pid_ns.as_ref()) else {
            return false;
        };
        if self.same_host(peer) != Some(true) || *ns != self.pid_ns || self.pid_ns.is_empty() {
            return false;
        }
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return false;
        };
        crate::sys::no_such_process(pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_and_liveness() {
        let me = HostIdentity::local(None).unwrap();
        assert!(!me.host_id.is_empty());
        let mut peer = SegmentDesc::default();
        assert_eq!(me.same_host(&peer), None);
        me.describe(&mut peer);
        assert_eq!(me.same_host(&peer), Some(true));
        assert!(!me.peer_gone(&peer), "this process is alive");
        // A child that has exited and been reaped is gone.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        child.wait().unwrap();
        peer.pid = Some(child.id());
        assert!(me.peer_gone(&peer));
        peer.host_id = Some("another-host".into());
        assert_eq!(me.same_host(&peer), Some(false));
        assert!(!me.peer_gone(&peer), "no liveness claims about other hosts");
    }
}
