//! Several "hosts" on one machine: network namespaces joined through a bridge that lives in
//! a namespace of its own, so that no address or interface the tests make is visible
//! outside them and no traffic leaves them. Each host has one interface (`eth<subnet>`) per
//! subnet it is on, addressed `10.200.<subnet>.<host + 1>/24`; the same addresses serve every
//! [`Net`], since each has its own bridge. A host's link can be cut (its bridge port set
//! down, as a pulled cable: the host's own interface keeps its address and routes), restored,
//! and shaped with `tbf` in both directions.
//!
//! Everything made is removed when the [`Net`] is dropped (a failing test unwinds through
//! it), and namespaces left by a process that died (killed, interrupted) are removed by the
//! next [`Net::new`]: their names carry the creating process's id.
//!
//! Needs root (`ip netns`); [`Net::new`] returns an error saying so where namespaces
//! cannot be made, and the tests fail with it rather than skip.

#![allow(
    clippy::expect_used,
    reason = "test support: a piped handle is there, a bad host index is a bug in the test"
)]

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The prefix of every namespace this module makes: `<PREFIX><pid>-<n>-<role>`.
pub const PREFIX: &str = "mce2e-";

/// One subnet's bridge and the hosts on it.
#[derive(Debug, Clone)]
pub struct HostSpec {
    /// The subnets (0, 1, ...) the host has an interface on.
    pub subnets: Vec<u8>,
}

/// Namespaces joined by bridges: see the module's doc.
pub struct Net {
    bridge_ns: String,
    hosts: Vec<Host>,
}

/// One host of a [`Net`].
#[derive(Debug, Clone)]
pub struct Host {
    /// Its namespace's name.
    pub ns: String,
    index: usize,
    subnets: Vec<u8>,
}

impl Host {
    /// Its address on `subnet` (which it must be on).
    pub fn addr_on(&self, subnet: u8) -> Ipv4Addr {
        assert!(
            self.subnets.contains(&subnet),
            "host {} is not on subnet {subnet}",
            self.ns
        );
        Ipv4Addr::new(10, 200, subnet, self.index as u8 + 1)
    }

    /// Its address on its first subnet.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr_on(self.subnets[0])
    }

    /// A command that runs `program` inside this host (`ip netns exec`, which execs it:
    /// the child's pid is the program's).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.arg("netns").arg("exec").arg(&self.ns).arg(program);
        cmd
    }
}

/// Runs `ip`/`tc` with `args`; `Err` holds the command and its stderr.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `{program}` ({e}): is iproute2 installed?"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "`{program} {}` failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

/// Namespaces named by [`PREFIX`] whose creating process is gone.
fn remove_leftovers() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let pid = rest.split('-').next().unwrap_or("");
        if !pid.is_empty() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run("ip", &["netns", "del", &name]);
            let _ = std::fs::remove_dir_all(format!("/etc/netns/{name}"));
        }
    }
}

impl Net {
    /// Makes one host per spec, each bridged to the others on the subnets it shares with
    /// them. `Err` says why (not root, no `ip netns`), and what was made is removed.
    pub fn new(specs: &[HostSpec]) -> Result<Self, String> {
        static SERIAL: AtomicUsize = AtomicUsize::new(0);
        remove_leftovers();
        let n = SERIAL.fetch_add(1, Ordering::Relaxed);
        let base = format!("{PREFIX}{}-{n}", std::process::id());
        let bridge_ns = format!("{base}-br");
        run("ip", &["netns", "add", &bridge_ns]).map_err(|e| {
            format!(
                "cannot make a network namespace (these tests need root and `ip netns`; \
                 CI runs them as root): {e}"
            )
        })?;
        let mut net = Self {
            bridge_ns,
            hosts: Vec::new(),
        };
        net.build(&base, specs)?;
        Ok(net)
    }

    fn build(&mut self, base: &str, specs: &[HostSpec]) -> Result<(), String> {
        let br = self.bridge_ns.clone();
        let mut subnets: Vec<u8> = specs.iter().flat_map(|s| s.subnets.clone()).collect();
        subnets.sort_unstable();
        subnets.dedup();
        for s in &subnets {
            let name = format!("br{s}");
            run("ip", &["-n", &br, "link", "add", &name, "type", "bridge"])?;
            run("ip", &["-n", &br, "link", "set", &name, "up"])?;
        }
        for (i, spec) in specs.iter().enumerate() {
            let ns = format!("{base}-h{i}");
            run("ip", &["netns", "add", &ns])?;
            self.hosts.push(Host {
                ns: ns.clone(),
                index: i,
                subnets: spec.subnets.clone(),
            });
            run("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
            for s in &spec.subnets {
                let port = Self::port(i, *s);
                let eth = format!("eth{s}");
                run(
                    "ip",
                    &[
                        "-n", &br, "link", "add", &port, "type", "veth", "peer", "name", &eth,
                        "netns", &ns,
                    ],
                )?;
                run(
                    "ip",
                    &["-n", &br, "link", "set", &port, "master", &format!("br{s}")],
                )?;
                run("ip", &["-n", &br, "link", "set", &port, "up"])?;
                let addr = format!("10.200.{s}.{}/24", i + 1);
                run("ip", &["-n", &ns, "addr", "add", &addr, "dev", &eth])?;
                run("ip", &["-n", &ns, "link", "set", &eth, "up"])?;
            }
        }
        Ok(())
    }

    /// The bridge-side name of host `i`'s interface on `subnet`.
    fn port(i: usize, subnet: u8) -> String {
        format!("p{i}s{subnet}")
    }

    /// Host `i`.
    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    /// Cuts host `i`'s links (every subnet): its bridge ports go down, so nothing it sends
    /// arrives and nothing reaches it; its own interfaces keep their addresses.
    pub fn cut(&self, i: usize) -> Result<(), String> {
        self.set_ports(i, "down")
    }

    /// Restores what [`cut`](Self::cut) cut.
    pub fn restore(&self, i: usize) -> Result<(), String> {
        self.set_ports(i, "up")
    }

    fn set_ports(&self, i: usize, state: &str) -> Result<(), String> {
        for s in &self.hosts[i].subnets {
            run(
                "ip",
                &[
                    "-n",
                    &self.bridge_ns,
                    "link",
                    "set",
                    &Self::port(i, *s),
                    state,
                ],
            )?;
        }
        Ok(())
    }

    /// Shapes host `i`'s links to `kbit` kbit/s each way (`tbf`: on its own interfaces for
    /// what it sends, on its bridge ports for what it receives).
    pub fn shape(&self, i: usize, kbit: u64) -> Result<(), String> {
        let rate = format!("{kbit}kbit");
        // A burst of at least one tick's worth (and 64 KiB, for TSO segments); a queue of
        // 100 ms' worth, so the sender is held back rather than its packets dropped.
        let burst = (kbit * 1000 / 8 / 100).max(64 << 10).to_string();
        let queue = (kbit * 1000 / 8 / 10).max(128 << 10).to_string();
        let h = &self.hosts[i];
        for s in &h.subnets {
            for (ns, dev) in [
                (h.ns.as_str(), format!("eth{s}")),
                (self.bridge_ns.as_str(), Self::port(i, *s)),
            ] {
                run(
                    "tc",
                    &[
                        "-n", ns, "qdisc", "replace", "dev", &dev, "root", "tbf", "rate", &rate,
                        "burst", &burst, "limit", &queue,
                    ],
                )?;
            }
        }
        Ok(())
    }

    /// Gives host `i` its own `/etc/hosts` (`ip netns exec` mounts `/etc/netns/<ns>/hosts`
    /// over it): `entries` of (address, name), so that one name resolves to different
    /// addresses on different hosts, as on a multi-homed host's subnets. Removed on drop.
    pub fn hosts_file(&self, i: usize, entries: &[(Ipv4Addr, &str)]) -> Result<(), String> {
        let dir = format!("/etc/netns/{}", self.hosts[i].ns);
        let mut text = String::from("127.0.0.1 localhost\n");
        for (addr, name) in entries {
            text.push_str(&format!("{addr} {name}\n"));
        }
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(format!("{dir}/hosts"), text))
            .map_err(|e| format!("cannot write {dir}/hosts: {e}"))
    }

    /// Makes `addr` on `subnet` a silent host as seen from host `i`: a permanent neighbour
    /// entry with a MAC no interface has, so what `i` sends there leaves and is lost (no
    /// ARP failure tells it so), as to a host that went silent.
    pub fn silent_neighbour(&self, i: usize, subnet: u8, addr: Ipv4Addr) -> Result<(), String> {
        let h = &self.hosts[i];
        let dev = format!("eth{subnet}");
        let a = addr.to_string();
        run(
            "ip",
            &[
                "-n",
                &h.ns,
                "neigh",
                "replace",
                &a,
                "lladdr",
                "02:00:00:00:00:fe",
                "dev",
                &dev,
                "nud",
                "permanent",
            ],
        )
    }

    /// Removes what [`shape`](Self::shape) set.
    pub fn unshape(&self, i: usize) -> Result<(), String> {
        let h = &self.hosts[i];
        for s in &h.subnets {
            for (ns, dev) in [
                (h.ns.as_str(), format!("eth{s}")),
                (self.bridge_ns.as_str(), Self::port(i, *s)),
            ] {
                run("tc", &["-n", ns, "qdisc", "del", "dev", &dev, "root"])?;
            }
        }
        Ok(())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace deletes the interfaces in it, and with each veth its peer.
        for h in &self.hosts {
            let _ = run("ip", &["netns", "del", &h.ns]);
            let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", h.ns));
        }
        let _ = run("ip", &["netns", "del", &self.bridge_ns]);
    }
}

/// Bytes received so far on interface `dev` of the namespace that process `pid` is in
/// (`/proc/<pid>/net/dev`: cheap enough to poll while a transfer runs).
pub fn rx_bytes(pid: u32, dev: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?;
    text.lines().find_map(|l| {
        let (name, rest) = l.split_once(':')?;
        if name.trim() != dev {
            return None;
        }
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// Polls [`rx_bytes`] until it has grown by `by` bytes from `from`, or `limit` passes.
pub fn wait_rx(pid: u32, dev: &str, from: u64, by: u64, limit: Duration) -> Option<u64> {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let Some(n) = rx_bytes(pid, dev) {
            if n >= from + by {
                return Some(n);
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    None
}

/// An engine of `e2e-test-child netns-peer` running inside a [`Host`] (see that role's doc
/// for its commands), killed when dropped.
pub struct Peer {
    child: crate::KillOnDrop,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    stderr: crate::Collected,
    serial: usize,
    /// Its session id (`address:port`).
    pub session: String,
    /// Its registered buffer's address (in its process).
    pub buffer: u64,
}

impl Peer {
    /// Starts `binary netns-peer` in `host`, its engine on `local_hostname`, with `size`
    /// bytes holding `pattern(seed)`, and the environment `envs` (`MC_*` settings).
    /// `envs` may set `NETNS_FILL`: how many bytes to fill (the rest stays zero).
    pub fn spawn(
        binary: &str,
        host: &Host,
        local_hostname: &str,
        size: u64,
        seed: u64,
        envs: &[(&str, &str)],
    ) -> Self {
        let (size, seed) = (size.to_string(), seed.to_string());
        let mut all = vec![
            ("NETNS_HOST", local_hostname),
            ("NETNS_SIZE", size.as_str()),
            ("NETNS_SEED", seed.as_str()),
        ];
        all.extend_from_slice(envs);
        Self::spawn_role(binary, host, "netns-peer", &all)
    }

    /// Starts `binary ROLE` in `host` with the environment `envs`: any role that prints a
    /// hello line with its `session` (and `buffer`, if it has one), then answers tagged
    /// commands as `netns-peer` does.
    pub fn spawn_role(binary: &str, host: &Host, role: &str, envs: &[(&str, &str)]) -> Self {
        use std::process::Stdio;
        let mut cmd = host.command(binary);
        cmd.arg(role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = crate::KillOnDrop(
            cmd.spawn()
                .unwrap_or_else(|e| panic!("cannot start {binary} in {}: {e}", host.ns)),
        );
        let stdin = child.0.stdin.take().expect("piped stdin");
        let stdout = child.0.stdout.take().expect("piped stdout");
        let (stderr, _) = crate::Collected::spawn(child.0.stderr.take().expect("piped stderr"));
        let lines = crate::line_channel(stdout);
        let mut p = Self {
            child,
            stdin,
            lines,
            stderr,
            serial: 0,
            session: String::new(),
            buffer: 0,
        };
        let hello = p.next(crate::CHILD_DEADLINE, "its hello line");
        p.session = hello["session"].as_str().unwrap_or_default().to_string();
        p.buffer = hello["buffer"].as_u64().unwrap_or_default();
        p
    }

    /// The child's pid (that of the program in the namespace: `ip netns exec` execs it).
    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }

    fn next(&mut self, limit: Duration, what: &str) -> serde_json::Value {
        let line = self.lines.recv_timeout(limit).unwrap_or_else(|e| {
            panic!(
                "netns-peer gave no {what} within {limit:?} ({e}); stderr:\n{}",
                self.stderr.tail(40)
            )
        });
        serde_json::from_str(&line).unwrap_or_else(|e| {
            panic!(
                "netns-peer printed {line:?}, not JSON ({e}); stderr:\n{}",
                self.stderr.tail(40)
            )
        })
    }

    /// Sends `command` (without its tag) and returns the tag its reply will carry.
    pub fn send(&mut self, command: &str) -> String {
        use std::io::Write;
        self.serial += 1;
        let tag = format!("c{}", self.serial);
        writeln!(self.stdin, "{tag} {command}")
            .and_then(|()| self.stdin.flush())
            .unwrap_or_else(|e| panic!("netns-peer's stdin: {e}\n{}", self.stderr.tail(40)));
        tag
    }

    /// Waits up to `limit` for the reply tagged `tag`, which must be the next one (use
    /// [`wait_any`](Self::wait_any) while several commands are out).
    pub fn wait(&mut self, tag: &str, limit: Duration) -> serde_json::Value {
        let v = self.next(limit, &format!("reply to {tag}"));
        assert_eq!(v["tag"], tag, "reply {v} while waiting for {tag}");
        v
    }

    /// The next reply, whatever its tag.
    pub fn wait_any(&mut self, limit: Duration) -> serde_json::Value {
        self.next(limit, "reply")
    }

    /// [`send`](Self::send) then [`wait`](Self::wait).
    pub fn call(&mut self, command: &str, limit: Duration) -> serde_json::Value {
        let tag = self.send(command);
        self.wait(&tag, limit)
    }

    /// The tail of its log.
    pub fn stderr_tail(&self, n: usize) -> String {
        self.stderr.tail(n)
    }
}
