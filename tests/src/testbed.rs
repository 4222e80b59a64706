//! End-to-end test bed: a home router in network namespaces with xdp-routerd started on it as a
//! user would start it, plus the traffic, counter and capture helpers the e2e tests assert with.
//!
//! ```text
//!  lan host eth0 ⇄ eth1 router eth0 ⇄ eth0 wan host
//!  10.0.1.2        10.0.1.1  10.0.2.1    10.0.2.2
//!  fd00:1::2       fd00:1::1 fd00:2::1   fd00:2::2
//! ```
//! The router runs iptables like a home router (MASQUERADE on the WAN, FORWARD policy DROP,
//! ESTABLISHED,RELATED and LAN→WAN accepted) and the same FORWARD policy in ip6tables without
//! NAT. Hosts keep GRO on (so frames the router XDP_REDIRECTs into their veth are accepted);
//! router veths have GRO/GSO/TSO off so every counter counts wire packets; checksum offload is
//! off everywhere so rewritten packets carry real checksums.

use std::{
    ffi::CString,
    fs,
    io::{self, Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    thread::{JoinHandle, sleep},
    time::{Duration, Instant},
};

use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use xdp_router_testbed::{
    checksum::internet_checksum,
    daemon::{self as shared, Stop},
};

use crate::netns::{self, Netns};

/// The router's LAN interface (as in the example config).
pub const LAN_IF: &str = "eth1";
/// The router's WAN interface (as in the example config).
pub const WAN_IF: &str = "eth0";
/// The only interface of each host.
pub const HOST_IF: &str = "eth0";

/// LAN host.
pub const LAN_HOST_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 2);
/// Router, LAN side.
pub const ROUTER_LAN_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 1);
/// Router, WAN side (the MASQUERADE address).
pub const ROUTER_WAN_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 1);
/// WAN host.
pub const WAN_HOST_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
/// LAN host, IPv6.
pub const LAN_HOST_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 1, 0, 0, 0, 0, 0, 2);
/// Router, LAN side, IPv6.
pub const ROUTER_LAN_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 1, 0, 0, 0, 0, 0, 1);
/// Router, WAN side, IPv6 (no NAT for IPv6).
pub const ROUTER_WAN_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 2, 0, 0, 0, 0, 0, 1);
/// WAN host, IPv6.
pub const WAN_HOST_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 2, 0, 0, 0, 0, 0, 2);

/// Commands the e2e tests run.
const TOOLS: &[&str] = &[
    "ip",
    "iptables",
    "ip6tables",
    "ethtool",
    "sysctl",
    "conntrack",
    "ping",
    "nft",
    "tc",
];

/// True when the e2e test `test` can run here (root, tools present); otherwise a loud skip (a
/// panic when `CI` is set).
pub fn ready(test: &str) -> bool {
    if !netns::require_root(test) {
        return false;
    }
    for tool in TOOLS {
        if !on_path(tool) {
            return netns::skip(test, &format!("`{tool}` not found (cargo xtask setup)"));
        }
    }
    true
}

fn on_path(tool: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .any(|d| d.join(tool).is_file())
}

/// The daemon binary: `$XDP_ROUTERD_BIN` (set by `cargo xtask test`), else the newer of
/// `target/release/xdp-routerd` and `target/debug/xdp-routerd`.
pub fn daemon_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("XDP_ROUTERD_BIN") {
        return PathBuf::from(p);
    }
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target");
    ["release", "debug"]
        .iter()
        .map(|p| target.join(p).join("xdp-routerd"))
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p)
        .unwrap_or_else(|| {
            panic!(
                "no xdp-routerd binary in {}/{{release,debug}}: run `cargo build --release -p \
                 xdp-routerd` (cargo xtask test does) or set XDP_ROUTERD_BIN",
                target.display()
            )
        })
}

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `/tmp/xr-e2e-<pid>-<seq>`.
    pub fn new() -> TempDir {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "xr-e2e-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
        TempDir(p)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Default for TempDir {
    fn default() -> TempDir {
        TempDir::new()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// lan host ⇄ router ⇄ wan host, configured; optionally with the daemon running on the router.
pub struct Testbed {
    // Field order is drop order: the daemon stops before its namespace disappears.
    /// The daemon, once [`Testbed::start_daemon`] ran.
    pub daemon: Option<Daemon>,
    /// The LAN host.
    pub lan: Netns,
    /// The router (runs xdp-routerd).
    pub router: Netns,
    /// The WAN host.
    pub wan: Netns,
    /// Config, control socket and daemon log.
    pub dir: TempDir,
}

impl Testbed {
    /// Builds and configures the three namespaces and checks that the router forwards (IPv4
    /// and IPv6 ping from the LAN host to the WAN host).
    pub fn new(tag: &str) -> Testbed {
        let tb = Testbed {
            daemon: None,
            lan: Netns::new(&format!("{tag}l")),
            router: Netns::new(&format!("{tag}r")),
            wan: Netns::new(&format!("{tag}w")),
            dir: TempDir::new(),
        };
        tb.router.sh(&format!(
            "ip link add {LAN_IF} type veth peer name {HOST_IF} netns {lan}
             ip link add {WAN_IF} type veth peer name {HOST_IF} netns {wan}",
            lan = tb.lan.name(),
            wan = tb.wan.name()
        ));
        for (host, v4, v6, gw4, gw6) in [
            (
                &tb.lan,
                LAN_HOST_V4,
                LAN_HOST_V6,
                ROUTER_LAN_V4,
                ROUTER_LAN_V6,
            ),
            (
                &tb.wan,
                WAN_HOST_V4,
                WAN_HOST_V6,
                ROUTER_WAN_V4,
                ROUTER_WAN_V6,
            ),
        ] {
            let v4_route = if host.name() == tb.lan.name() {
                // The WAN host gets no IPv4 route to the LAN: replies only work through NAT.
                format!("ip route add default via {gw4}")
            } else {
                String::new()
            };
            host.sh(&format!(
                "ip addr add {v4}/24 dev {HOST_IF}
                 ip addr add {v6}/64 dev {HOST_IF} nodad
                 ip link set {HOST_IF} up
                 ethtool -K {HOST_IF} tx off rx off gro on >/dev/null
                 {v4_route}
                 ip -6 route add default via {gw6}"
            ));
        }
        tb.router.sh(&format!(
            "sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1
             ip addr add {ROUTER_LAN_V4}/24 dev {LAN_IF}
             ip addr add {ROUTER_WAN_V4}/24 dev {WAN_IF}
             ip addr add {ROUTER_LAN_V6}/64 dev {LAN_IF} nodad
             ip addr add {ROUTER_WAN_V6}/64 dev {WAN_IF} nodad
             for i in {LAN_IF} {WAN_IF}; do
               ip link set $i up
               ethtool -K $i tx off rx off gro off gso off tso off >/dev/null
             done
             iptables -w -t nat -A POSTROUTING -o {WAN_IF} -j MASQUERADE
             for t in iptables ip6tables; do
               $t -w -P FORWARD DROP
               $t -w -A FORWARD -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
               $t -w -A FORWARD -i {LAN_IF} -o {WAN_IF} -j ACCEPT
             done"
        ));
        tb.lan.sh(&format!(
            "ping -c1 -W2 {WAN_HOST_V4} >/dev/null
             for i in 1 2 3 4 5; do ping -6 -c1 -W1 {WAN_HOST_V6} >/dev/null && exit 0; done
             echo 'no IPv6 path LAN -> WAN' >&2; exit 1"
        ));
        tb
    }

    /// Writes a config to the temp dir, starts `xdp-routerd run` in the router namespace, waits
    /// until `status --json` answers, and checks both interfaces are attached natively.
    pub fn start_daemon(&mut self) -> &Daemon {
        self.start_daemon_with("")
    }

    /// [`Testbed::start_daemon`] with `extra` top-level config lines (e.g. `fib_cache_ms = 0\n`).
    pub fn start_daemon_with(&mut self, extra: &str) -> &Daemon {
        self.start_daemon_with_lan(extra, "")
    }

    /// [`Testbed::start_daemon_with`], plus `lan_extra` lines in the LAN interface's table
    /// (e.g. `bypass_hooks = true\n`).
    pub fn start_daemon_with_lan(&mut self, extra: &str, lan_extra: &str) -> &Daemon {
        let daemon = self.spawn_daemon(&format!(
            "xdp_mode = \"native\"\n\
             {extra}\
             [[interface]]\nname = \"{WAN_IF}\"\nrole = \"wan\"\n\
             [[interface]]\nname = \"{LAN_IF}\"\nrole = \"lan\"\n{lan_extra}"
        ));
        let st = daemon.status();
        for ifname in [LAN_IF, WAN_IF] {
            let i = st
                .interfaces
                .iter()
                .find(|i| i.name == ifname)
                .unwrap_or_else(|| panic!("status lists no interface {ifname}: {st:?}"));
            assert_eq!(
                i.attach_mode,
                "native",
                "{ifname} should be attached in native (driver) mode; log:\n{}",
                daemon.log_tail()
            );
        }
        self.daemon.insert(daemon)
    }

    /// Starts the daemon with `config` (top-level settings and `[[interface]]` tables) after
    /// the test bed's own settings, for topologies other than the plain eth1/eth0 pair (VLAN
    /// devices, bridges); checks no attach mode.
    pub fn start_daemon_config(&mut self, config: &str) -> &Daemon {
        let daemon = self.spawn_daemon(config);
        self.daemon.insert(daemon)
    }

    fn spawn_daemon(&self, config_tail: &str) -> Daemon {
        let socket = self.dir.path().join("control.sock");
        let config = self.dir.path().join("xdp-routerd.toml");
        fs::write(
            &config,
            format!(
                "control_socket = \"{}\"\n\
                 flow_capacity = 4096\n\
                 keepalive_interval_ms = 2000\n\
                 log_level = \"debug\"\n\
                 {config_tail}",
                socket.display()
            ),
        )
        .unwrap_or_else(|e| panic!("write {}: {e}", config.display()));
        Daemon::start(&self.router, &config, &socket, self.dir.path())
    }

    /// The running daemon (panics when [`Testbed::start_daemon`] was not called).
    pub fn daemon(&self) -> &Daemon {
        self.daemon.as_ref().expect("start_daemon() first")
    }

    /// Counters from everywhere the tests look: daemon status, router veth rx_packets and the
    /// FORWARD chains' ESTABLISHED rule.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            status: self.daemon().status(),
            rx_lan: self.rx_packets(LAN_IF),
            rx_wan: self.rx_packets(WAN_IF),
            established_v4: established_packets(&self.router, "iptables"),
            established_v6: established_packets(&self.router, "ip6tables"),
        }
    }

    /// Packets received by a router interface (sysfs; wire packets since GRO is off there).
    pub fn rx_packets(&self, ifname: &str) -> u64 {
        let path = format!("/sys/class/net/{ifname}/statistics/rx_packets");
        let s = self.router.exec_ok("cat", &[&path]);
        s.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{path}: {s:?}: {e}"))
    }

    /// Whether any XDP program is still attached in the router namespace, per `ip -d link` and
    /// `bpftool net` (the text that shows it, or None).
    pub fn xdp_attached(&self) -> Option<String> {
        let links = self.router.exec_ok("ip", &["-d", "link", "show"]);
        let from_ip: Vec<&str> = links
            .lines()
            .filter(|l| l.contains("xdp") || l.contains("prog/"))
            .collect();
        let bpftool = self.router.exec_ok("bpftool", &["net", "show"]);
        let mut in_xdp = false;
        let mut from_bpftool = Vec::new();
        for l in bpftool.lines() {
            if l.ends_with(':') {
                in_xdp = l.starts_with("xdp");
            } else if in_xdp && !l.trim().is_empty() {
                from_bpftool.push(l);
            }
        }
        if from_ip.is_empty() && from_bpftool.is_empty() {
            None
        } else {
            Some(format!(
                "ip -d link: {from_ip:?}; bpftool net: {from_bpftool:?}"
            ))
        }
    }
}

/// Packet count of the FORWARD chain's `ESTABLISHED,RELATED` rule (`iptables -vnxL FORWARD`).
pub fn established_packets(ns: &Netns, iptables: &str) -> u64 {
    let out = ns.exec_ok(iptables, &["-w", "-vnxL", "FORWARD"]);
    parse_established(&out).unwrap_or_else(|| panic!("no ESTABLISHED rule in {iptables}:\n{out}"))
}

/// The pkts column of the first rule mentioning ESTABLISHED in `iptables -vnxL` output.
pub fn parse_established(listing: &str) -> Option<u64> {
    listing
        .lines()
        .find(|l| l.contains("ESTABLISHED"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// Every packet the FORWARD chain counted: the policy counter plus every rule's
/// (`iptables -vnxL FORWARD`).
pub fn forward_total(ns: &Netns, iptables: &str) -> u64 {
    let out = ns.exec_ok(iptables, &["-w", "-vnxL", "FORWARD"]);
    parse_forward_total(&out).unwrap_or_else(|| panic!("cannot parse {iptables} -vnxL:\n{out}"))
}

/// Sum of the policy counter and every rule's pkts column in `iptables -vnxL CHAIN` output.
pub fn parse_forward_total(listing: &str) -> Option<u64> {
    let mut lines = listing.lines();
    let header = lines.next()?;
    let policy: u64 = header
        .split_once("policy ")?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    let rules: u64 = lines
        .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Some(policy + rules)
}

/// Share of `wire` packets that the fast path forwarded (0 when nothing was received).
pub fn fastpath_fraction(forwarded: u64, wire: u64) -> f64 {
    if wire == 0 {
        0.0
    } else {
        forwarded as f64 / wire as f64
    }
}

/// `status --json`, the fields the tests use (the daemon's contract).
#[derive(Debug, Clone, Deserialize)]
pub struct Status {
    /// Fast path switched on.
    pub fastpath: bool,
    /// Managed interfaces.
    pub interfaces: Vec<IfaceStatus>,
    /// Flow map occupancy.
    pub flows: FlowCounts,
    /// One row per (ingress interface, reason).
    pub counters: Vec<CounterRow>,
    /// Conntrack sync state (offloaded connections, withdrawals, skips).
    pub conntrack: ConntrackSummary,
    /// The per-flow FIB cache.
    pub fib_cache: FibCacheSummary,
    /// Firewall ruleset tracking.
    pub ruleset: RulesetSummary,
}

/// The `ruleset` object of `status --json`.
#[derive(Debug, Clone, Deserialize)]
pub struct RulesetSummary {
    /// Current ruleset generation.
    pub generation: u32,
    /// Ruleset changes seen since start.
    pub changes: u64,
    /// Interfaces with the arming program attached.
    pub armed_interfaces: u32,
}

/// The `fib_cache` object of `status --json`.
#[derive(Debug, Clone, Deserialize)]
pub struct FibCacheSummary {
    /// `fib_cache_ms` (0 = off).
    pub max_age_ms: u64,
    /// Current generation.
    pub generation: u32,
    /// Invalidations since start.
    pub invalidations: u64,
}

/// The `conntrack` object of `status --json`, the fields the tests use.
#[derive(Debug, Clone, Deserialize)]
pub struct ConntrackSummary {
    /// Connections currently offloaded.
    pub offloaded: u64,
    /// Connections offloaded since start.
    pub offloaded_total: u64,
    /// Connections taken back from the fast path since start.
    pub removed_total: u64,
    /// Connections considered but not offloaded (or withdrawn), by reason.
    pub skipped: std::collections::BTreeMap<String, u64>,
}

/// One managed interface in `status --json`.
#[derive(Debug, Clone, Deserialize)]
pub struct IfaceStatus {
    /// Interface name.
    pub name: String,
    /// Its current ifindex (0 while it does not exist).
    pub ifindex: u32,
    /// `native`, `generic`, … (`detached` while it does not exist).
    pub attach_mode: String,
    /// Egress shaped: the fast path does not send out of it.
    #[serde(default)]
    pub shaped: bool,
    /// The kernel reports that it transmits XDP frames (redirect target).
    #[serde(default)]
    pub xdp_xmit: bool,
    /// Why `xdp_xmit` is false.
    #[serde(default)]
    pub no_xdp_xmit_because: Option<String>,
    /// Why it runs generic XDP although native was asked for.
    #[serde(default)]
    pub generic_because: Option<String>,
    /// For a bridge port: its bridge.
    #[serde(default)]
    pub bridge: Option<String>,
    /// For a bridge: FDB entries copied.
    #[serde(default)]
    pub fdb_entries: Option<u64>,
    /// For a VLAN device: `VLAN 7 (802.1Q) on eth0`; for a parent managed only for its
    /// VLANs: `parent of eth0.7`.
    #[serde(default)]
    pub encap: Option<String>,
    /// For a PPP device: its PPPoE session.
    #[serde(default)]
    pub pppoe: Option<PppoeStatus>,
}

/// The `pppoe` object of a PPP device in `status --json`, the fields the tests use.
#[derive(Debug, Clone, Deserialize)]
pub struct PppoeStatus {
    /// The bound session's ID; null while none is bound.
    pub session_id: Option<u16>,
    /// Why the fast path carries nothing of the PPP device; null while a session is bound.
    pub not_accelerated_because: Option<String>,
}

/// Flow map occupancy in `status --json`.
#[derive(Debug, Clone, Deserialize)]
pub struct FlowCounts {
    /// IPv4 flow entries.
    pub ipv4: u64,
    /// IPv6 flow entries.
    pub ipv6: u64,
}

/// One counter row in `status --json`.
#[derive(Debug, Clone, Deserialize)]
pub struct CounterRow {
    /// Ingress interface.
    pub interface: String,
    /// `Reason::name()`.
    pub reason: String,
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

impl Status {
    /// Packets counted under `reason` on ingress interface `iface`; panics when the row is
    /// missing (a renamed reason must not read as zero).
    pub fn packets(&self, iface: &str, reason: &str) -> u64 {
        self.counters
            .iter()
            .find(|r| r.interface == iface && r.reason == reason)
            .map(|r| r.packets)
            .unwrap_or_else(|| panic!("status has no counter row ({iface}, {reason}): {self:?}"))
    }

    /// Fast-path forwarded packets (both directions) that entered on `iface`.
    pub fn forwarded(&self, iface: &str) -> u64 {
        self.packets(iface, "forwarded_original") + self.packets(iface, "forwarded_reply")
    }
}

/// Counters at one instant (see [`Testbed::snapshot`]).
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The daemon's status.
    pub status: Status,
    /// rx_packets of the router's LAN interface.
    pub rx_lan: u64,
    /// rx_packets of the router's WAN interface.
    pub rx_wan: u64,
    /// iptables FORWARD ESTABLISHED rule packets.
    pub established_v4: u64,
    /// ip6tables FORWARD ESTABLISHED rule packets.
    pub established_v6: u64,
}

impl Snapshot {
    /// Increase of a daemon counter since `earlier`.
    pub fn packets_since(&self, earlier: &Snapshot, iface: &str, reason: &str) -> u64 {
        self.status
            .packets(iface, reason)
            .saturating_sub(earlier.status.packets(iface, reason))
    }

    /// Increase of fast-path forwarded packets (both directions, both interfaces).
    pub fn forwarded_since(&self, earlier: &Snapshot) -> u64 {
        [LAN_IF, WAN_IF]
            .iter()
            .map(|i| {
                self.status
                    .forwarded(i)
                    .saturating_sub(earlier.status.forwarded(i))
            })
            .sum()
    }

    /// Increase of the router's LAN rx_packets.
    pub fn rx_lan_since(&self, earlier: &Snapshot) -> u64 {
        self.rx_lan.saturating_sub(earlier.rx_lan)
    }

    /// Increase of the router's WAN rx_packets.
    pub fn rx_wan_since(&self, earlier: &Snapshot) -> u64 {
        self.rx_wan.saturating_sub(earlier.rx_wan)
    }

    /// Increase of the FORWARD ESTABLISHED rule (IPv4 or IPv6).
    pub fn established_since(&self, earlier: &Snapshot, v6: bool) -> u64 {
        if v6 {
            self.established_v6.saturating_sub(earlier.established_v6)
        } else {
            self.established_v4.saturating_sub(earlier.established_v4)
        }
    }
}

/// xdp-routerd running in the router namespace (the shared [`shared::Daemon`], with calls that
/// panic with the failure); SIGTERM on drop (and its log printed when the test is failing).
pub struct Daemon(shared::Daemon);

impl Daemon {
    /// Starts `xdp-routerd run` in `router` with `config`, its control socket at `socket` and its
    /// log in `dir`, and waits until `status` answers.
    pub fn start(router: &Netns, config: &Path, socket: &Path, dir: &Path) -> Daemon {
        let bin = daemon_binary();
        let log = dir.join("xdp-routerd.log");
        let mut d = shared::Daemon::spawn(
            router.command(&bin.to_string_lossy()),
            &bin,
            config,
            socket,
            &log,
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        if let Err(e) = d.wait_answering(Duration::from_secs(20)) {
            panic!("{e:#}");
        }
        Daemon(d)
    }

    /// Runs `xdp-routerd ARGS --socket S`; Ok(stdout) or Err(one line + stderr).
    pub fn ctl(&self, args: &[&str]) -> Result<String, String> {
        self.0.cli(args).map_err(|e| format!("{e:#}"))
    }

    /// `status --json`, parsed.
    pub fn try_status(&self) -> Result<Status, String> {
        let out = self.ctl(&["status", "--json"])?;
        serde_json::from_str(&out).map_err(|e| format!("status --json: {e}: {out}"))
    }

    /// `status --json`, parsed; panics (with the log) when the daemon does not answer.
    pub fn status(&self) -> Status {
        self.try_status()
            .unwrap_or_else(|e| panic!("{e}; daemon log:\n{}", self.log_tail()))
    }

    /// `flows --json`, raw (for failure messages).
    pub fn flows_json(&self) -> String {
        self.ctl(&["flows", "--json"]).unwrap_or_else(|e| e)
    }

    /// `fastpath on|off`; panics when it fails or `status` does not reflect it.
    pub fn set_fastpath(&self, on: bool) {
        let word = if on { "on" } else { "off" };
        if let Err(e) = self.ctl(&["fastpath", word]) {
            panic!("{e}; daemon log:\n{}", self.log_tail());
        }
        assert_eq!(self.status().fastpath, on, "status after `fastpath {word}`");
    }

    /// Waits up to `timeout` until `cond(status)` holds; returns the last status and whether
    /// it held.
    pub fn wait_status(&self, timeout: Duration, cond: impl Fn(&Status) -> bool) -> (Status, bool) {
        let deadline = Instant::now() + timeout;
        loop {
            let st = self.status();
            if cond(&st) {
                return (st, true);
            }
            if Instant::now() > deadline {
                return (st, false);
            }
            sleep(Duration::from_millis(50));
        }
    }

    /// Stops (SIGSTOP, `true`) or continues (SIGCONT) the daemon: while stopped it reads no
    /// events, as a daemon far behind on a busy machine.
    pub fn pause(&self, stop: bool) {
        let sig = if stop { libc::SIGSTOP } else { libc::SIGCONT };
        if let Err(e) = self.0.signal(sig) {
            panic!("{e:#}");
        }
    }

    /// SIGKILL (no cleanup chance: the kernel must detach when its link fds close).
    pub fn kill9(&mut self) {
        self.0.kill();
    }

    /// SIGTERM and wait (5 s, then SIGKILL); returns whether it exited with status 0.
    pub fn stop(&mut self) -> bool {
        matches!(
            self.0.terminate(),
            Ok(Stop::Exited(st) | Stop::ExitedBefore(st)) if st.success()
        )
    }

    /// The last 6000 bytes of the daemon's log.
    pub fn log_tail(&self) -> String {
        self.0.log_tail(6000)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let clean = self.stop();
        if std::thread::panicking() {
            eprintln!(
                "---- xdp-routerd log (stopped cleanly: {clean}) ----\n{}\n---- end of log ----",
                self.log_tail()
            );
        }
    }
}

/// Deterministic pseudo-random bytes (xorshift64*), so data corruption cannot hide in a
/// repeating pattern.
pub struct Pattern(u64);

impl Pattern {
    /// A stream seeded with `seed` (any value).
    pub fn new(seed: u64) -> Pattern {
        Pattern(seed | 1)
    }

    /// Fills `buf` with the next bytes of the stream.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            let v = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// What one end of a TCP transfer saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Side {
    /// Bytes sent or received.
    pub bytes: u64,
    /// SHA-256 of those bytes.
    pub sha256: [u8; 32],
}

/// How the sender sends.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Total bytes (the sender stops earlier when [`Transfer::stop`] is called).
    pub bytes: u64,
    /// Bytes per second, or as fast as possible.
    pub rate: Option<u64>,
}

/// A TCP transfer from a LAN-host client to a WAN-host server, running on threads.
pub struct Transfer {
    sender: JoinHandle<io::Result<Side>>,
    receiver: JoinHandle<io::Result<Side>>,
    stop: Arc<AtomicBool>,
    /// The server's view of the client's address (the router's WAN address under NAT).
    pub peer: SocketAddr,
}

/// What [`Transfer::finish`] returns.
#[derive(Debug)]
pub struct TransferResult {
    /// The client's side.
    pub sent: Side,
    /// The server's side.
    pub received: Side,
    /// The client address the server saw.
    pub peer: SocketAddr,
}

impl Transfer {
    /// Starts a server on `server` in the WAN namespace and a client in the LAN namespace
    /// that sends `plan.bytes` of [`Pattern`] data, then closes.
    pub fn start(tb: &Testbed, server: SocketAddr, plan: Plan) -> Transfer {
        let listener = tb
            .wan
            .run(move || TcpListener::bind(server))
            .unwrap_or_else(|e| panic!("bind {server} in the WAN host: {e}"));
        let client = tb
            .lan
            .run(move || TcpStream::connect_timeout(&server, Duration::from_secs(5)))
            .unwrap_or_else(|e| panic!("connect to {server} from the LAN host: {e}"));
        let (conn, peer) = listener
            .accept()
            .unwrap_or_else(|e| panic!("accept on {server}: {e}"));
        let receiver = std::thread::spawn(move || receive_all(conn));
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let sender = std::thread::spawn(move || send_all(client, plan, &stop2));
        Transfer {
            sender,
            receiver,
            stop,
            peer,
        }
    }

    /// Makes the sender stop early (it still closes the connection cleanly).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// True when the sender has finished.
    pub fn sender_done(&self) -> bool {
        self.sender.is_finished()
    }

    /// Waits for both ends; panics with the I/O errors of both when either failed.
    pub fn finish(self) -> TransferResult {
        let sent = self.sender.join().expect("sender thread panicked");
        let received = self.receiver.join().expect("receiver thread panicked");
        match (sent, received) {
            (Ok(sent), Ok(received)) => TransferResult {
                sent,
                received,
                peer: self.peer,
            },
            (s, r) => panic!(
                "TCP transfer failed: sender (LAN host): {}; receiver (WAN host): {}",
                s.map_or_else(|e| e.to_string(), |s| format!("ok, {} bytes", s.bytes)),
                r.map_or_else(|e| e.to_string(), |r| format!("ok, {} bytes", r.bytes)),
            ),
        }
    }
}

/// Sends per `plan`, then shuts down the write side and waits for the server's close.
fn send_all(mut s: TcpStream, plan: Plan, stop: &AtomicBool) -> io::Result<Side> {
    s.set_write_timeout(Some(Duration::from_secs(20)))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    let mut pattern = Pattern::new(plan.bytes ^ 0x5eed);
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut sent = 0u64;
    let t0 = Instant::now();
    while sent < plan.bytes && !stop.load(Ordering::SeqCst) {
        let n = (plan.bytes - sent).min(buf.len() as u64) as usize;
        pattern.fill(&mut buf[..n]);
        s.write_all(&buf[..n])
            .map_err(|e| io::Error::new(e.kind(), format!("write after {sent} bytes: {e}")))?;
        hash.update(&buf[..n]);
        sent += n as u64;
        if let Some(rate) = plan.rate {
            let due = Duration::from_secs_f64(sent as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(t0.elapsed()) {
                sleep(wait);
            }
        }
    }
    s.shutdown(Shutdown::Write)?;
    // The server closes after reading everything: EOF here is the clean end of the connection.
    let mut rest = Vec::new();
    s.read_to_end(&mut rest)?;
    Ok(Side {
        bytes: sent,
        sha256: hash.finalize().into(),
    })
}

/// Reads to EOF, hashing, then closes.
fn receive_all(mut s: TcpStream) -> io::Result<Side> {
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut bytes = 0u64;
    loop {
        let n = s
            .read(&mut buf)
            .map_err(|e| io::Error::new(e.kind(), format!("read after {bytes} bytes: {e}")))?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        bytes += n as u64;
    }
    s.shutdown(Shutdown::Both)?;
    Ok(Side {
        bytes,
        sha256: hash.finalize().into(),
    })
}

/// Datagram payload for sequence number `seq`: the number, then [`Pattern`] bytes seeded by it.
pub fn udp_payload(seq: u64, len: usize) -> Vec<u8> {
    let mut p = vec![0u8; len.max(8)];
    p[..8].copy_from_slice(&seq.to_be_bytes());
    Pattern::new(seq.wrapping_mul(0x9e37_79b9_7f4a_7c15)).fill(&mut p[8..]);
    p
}

/// A UDP echo server in the WAN host: checks every datagram against [`udp_payload`] and sends it
/// back unchanged to its source.
pub struct UdpEcho {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<io::Result<EchoStats>>>,
}

/// What the echo server saw.
#[derive(Debug, Default, Clone)]
pub struct EchoStats {
    /// Datagrams received.
    pub received: u64,
    /// Datagrams whose contents did not match their sequence number.
    pub corrupt: u64,
    /// Distinct source addresses.
    pub peers: Vec<SocketAddr>,
}

impl UdpEcho {
    /// Binds `addr` in `ns` and serves until [`UdpEcho::finish`]; replies leave with TTL / hop
    /// limit 64.
    pub fn start(ns: &Netns, addr: SocketAddr) -> UdpEcho {
        let sock = udp_socket(ns, addr, 64);
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            sock.set_read_timeout(Some(Duration::from_millis(100)))?;
            let mut st = EchoStats::default();
            let mut buf = [0u8; 2048];
            while !stop2.load(Ordering::SeqCst) {
                let (n, from) = match sock.recv_from(&mut buf) {
                    Ok(x) => x,
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) =>
                    {
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let data = &buf[..n];
                st.received += 1;
                let seq = data
                    .get(..8)
                    .map(|b| u64::from_be_bytes(b.try_into().unwrap_or_default()));
                if seq.is_none_or(|seq| udp_payload(seq, n) != data) {
                    st.corrupt += 1;
                }
                if !st.peers.contains(&from) {
                    st.peers.push(from);
                }
                sock.send_to(data, from)?;
            }
            Ok(st)
        });
        UdpEcho {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the server and returns what it saw.
    pub fn finish(mut self) -> EchoStats {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .take()
            .expect("finish once")
            .join()
            .expect("echo thread panicked")
            .unwrap_or_else(|e| panic!("UDP echo server failed: {e}"))
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// What a ping-pong run saw at the client.
#[derive(Debug, Default, Clone)]
pub struct PingPong {
    /// Datagrams sent.
    pub sent: u64,
    /// Replies equal to what was sent, from the expected source.
    pub good: u64,
    /// Replies that did not come back within a second.
    pub lost: u64,
    /// Replies with different contents.
    pub corrupt: u64,
    /// Reply sources other than the server's address.
    pub wrong_source: Vec<SocketAddr>,
}

/// Sends `count` datagrams of `len` bytes from `sock` to `server`, one every `interval`, each
/// waiting (1 s at most) for its echo; sequence numbers start at `first_seq`.
pub fn ping_pong(
    sock: &UdpSocket,
    server: SocketAddr,
    first_seq: u64,
    count: u64,
    len: usize,
    interval: Duration,
) -> PingPong {
    sock.set_read_timeout(Some(Duration::from_secs(1)))
        .expect("set_read_timeout");
    let mut r = PingPong::default();
    let mut buf = [0u8; 2048];
    let t0 = Instant::now();
    for i in 0..count {
        let seq = first_seq + i;
        let payload = udp_payload(seq, len);
        sock.send_to(&payload, server)
            .unwrap_or_else(|e| panic!("send to {server}: {e}"));
        r.sent += 1;
        // Skip stale replies (of earlier, lost, datagrams) until ours arrives or time runs out.
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            match sock.recv_from(&mut buf) {
                Ok((n, from)) => {
                    if buf.get(..8) != Some(&seq.to_be_bytes()[..]) && Instant::now() < deadline {
                        continue;
                    }
                    if from != server {
                        r.wrong_source.push(from);
                    } else if buf[..n] != payload[..] {
                        r.corrupt += 1;
                    } else {
                        r.good += 1;
                    }
                    break;
                }
                Err(_) => {
                    r.lost += 1;
                    break;
                }
            }
        }
        let due = interval * u32::try_from(i + 1).unwrap_or(u32::MAX);
        if let Some(wait) = due.checked_sub(t0.elapsed()) {
            sleep(wait);
        }
    }
    r
}

/// A UDP socket bound in `ns` to `addr` (port 0 for any) with the IP TTL / hop limit set.
pub fn udp_socket(ns: &Netns, addr: SocketAddr, ttl: u32) -> UdpSocket {
    let sock = ns
        .run(move || UdpSocket::bind(addr))
        .unwrap_or_else(|e| panic!("bind UDP {addr}: {e}"));
    match addr {
        SocketAddr::V4(_) => sock.set_ttl(ttl).expect("IP_TTL"),
        SocketAddr::V6(_) => set_hop_limit(&sock, ttl),
    }
    sock
}

fn set_hop_limit(sock: &UdpSocket, hops: u32) {
    let v = hops as libc::c_int;
    // SAFETY: valid socket fd; option value is a c_int of the right size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_UNICAST_HOPS,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "IPV6_UNICAST_HOPS: {}", io::Error::last_os_error());
}

/// An AF_PACKET socket capturing every frame of one interface of a namespace.
pub struct Capture {
    fd: OwnedFd,
}

impl Capture {
    /// Opens the capture on `ifname` in `ns`.
    pub fn open(ns: &Netns, ifname: &str) -> Capture {
        let name = CString::new(ifname).expect("interface name");
        let fd = ns.run(move || -> io::Result<OwnedFd> {
            let proto = (libc::ETH_P_ALL as u16).to_be();
            // SAFETY: plain socket(2) call; the fd is owned right away.
            let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto.into()) };
            if raw < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `raw` is a fresh fd that nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            // SAFETY: `name` is a valid NUL-terminated string.
            let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
            if ifindex == 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: sockaddr_ll is plain data; zeroed is a valid value.
            let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = proto;
            sll.sll_ifindex = ifindex as i32;
            // SAFETY: valid fd and a sockaddr_ll of the size passed.
            let rc = unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&sll as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                )
            };
            if rc < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(fd)
        });
        let fd = fd.unwrap_or_else(|e| panic!("AF_PACKET capture on {ifname}: {e}"));
        Capture { fd }
    }

    /// Sends `frame` (a whole Ethernet frame, as built) out of the interface.
    pub fn send(&self, frame: &[u8]) {
        // SAFETY: valid fd bound to the interface; buffer valid for its length.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        assert_eq!(
            n,
            frame.len() as isize,
            "AF_PACKET send: {}",
            io::Error::last_os_error()
        );
    }

    /// The next frame received on (not sent from) the interface, or None after `timeout`.
    pub fn next_incoming(&self, timeout: Duration) -> Option<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 65536];
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let tv = libc::timeval {
                tv_sec: left.as_secs() as libc::time_t,
                tv_usec: left.subsec_micros().max(1) as libc::suseconds_t,
            };
            // SAFETY: valid fd; option value is a timeval of the right size.
            unsafe {
                libc::setsockopt(
                    self.fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    (&tv as *const libc::timeval).cast(),
                    std::mem::size_of::<libc::timeval>() as libc::socklen_t,
                )
            };
            // SAFETY: sockaddr_ll is plain data; zeroed is a valid value.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut from_len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: buffer and address pointers are valid for the lengths passed.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut from_len,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) {
                    return None;
                }
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                panic!("AF_PACKET recvfrom: {e}");
            }
            if from.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            return Some(buf[..n as usize].to_vec());
        }
    }
}

/// A UDP datagram parsed from an Ethernet frame, with its checksums verified independently of
/// the project's own checksum code.
#[derive(Debug, Clone)]
pub struct UdpFrame {
    /// Source address.
    pub src: SocketAddr,
    /// Destination address.
    pub dst: SocketAddr,
    /// IPv4 TTL or IPv6 hop limit.
    pub ttl: u8,
    /// IPv4 header checksum verifies (always true for IPv6, which has none).
    pub ip_checksum_ok: bool,
    /// The UDP checksum is present and verifies over the pseudo-header.
    pub udp_checksum_ok: bool,
    /// The UDP payload.
    pub payload: Vec<u8>,
}

/// Parses an Ethernet frame carrying IPv4 or IPv6 UDP (no options/extension headers); None for
/// anything else.
pub fn parse_udp_frame(frame: &[u8]) -> Option<UdpFrame> {
    let ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let ip = frame.get(14..)?;
    let (src_ip, dst_ip, ttl, ip_ok, l4, pseudo): (IpAddr, IpAddr, u8, bool, &[u8], Vec<u8>) =
        match ethertype {
            0x0800 => {
                let ihl = usize::from(ip.first()? & 0x0f) * 4;
                let tot = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
                if ip.first()? >> 4 != 4 || ihl != 20 || *ip.get(9)? != 17 || tot > ip.len() {
                    return None;
                }
                let hdr = ip.get(..20)?;
                let ip_ok = internet_checksum(&[hdr]) == 0;
                let src: [u8; 4] = hdr[12..16].try_into().ok()?;
                let dst: [u8; 4] = hdr[16..20].try_into().ok()?;
                let l4 = ip.get(20..tot)?;
                let mut pseudo = Vec::with_capacity(12);
                pseudo.extend_from_slice(&src);
                pseudo.extend_from_slice(&dst);
                pseudo.extend_from_slice(&[0, 17]);
                pseudo.extend_from_slice(&(l4.len() as u16).to_be_bytes());
                (src.into(), dst.into(), hdr[8], ip_ok, l4, pseudo)
            }
            0x86dd => {
                let hdr = ip.get(..40)?;
                if hdr[0] >> 4 != 6 || hdr[6] != 17 {
                    return None;
                }
                let plen = usize::from(u16::from_be_bytes([hdr[4], hdr[5]]));
                let src: [u8; 16] = hdr[8..24].try_into().ok()?;
                let dst: [u8; 16] = hdr[24..40].try_into().ok()?;
                let l4 = ip.get(40..40 + plen)?;
                let mut pseudo = Vec::with_capacity(40);
                pseudo.extend_from_slice(&src);
                pseudo.extend_from_slice(&dst);
                pseudo.extend_from_slice(&(l4.len() as u32).to_be_bytes());
                pseudo.extend_from_slice(&[0, 0, 0, 17]);
                (src.into(), dst.into(), hdr[7], true, l4, pseudo)
            }
            _ => return None,
        };
    if l4.len() < 8 || usize::from(u16::from_be_bytes([l4[4], l4[5]])) != l4.len() {
        return None;
    }
    let sport = u16::from_be_bytes([l4[0], l4[1]]);
    let dport = u16::from_be_bytes([l4[2], l4[3]]);
    let stored = u16::from_be_bytes([l4[6], l4[7]]);
    let udp_ok = stored != 0 && internet_checksum(&[&pseudo, l4]) == 0;
    Some(UdpFrame {
        src: SocketAddr::new(src_ip, sport),
        dst: SocketAddr::new(dst_ip, dport),
        ttl,
        ip_checksum_ok: ip_ok,
        udp_checksum_ok: udp_ok,
        payload: l4[8..].to_vec(),
    })
}

/// Polls `cond` every 50 ms for up to `timeout`; returns whether it became true.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        sleep(Duration::from_millis(50));
    }
}

/// A full-size TCP segment on the wire (MTU 1500 + Ethernet header): a transfer of N bytes
/// needs at least N / this wire packets (fewer would mean GRO merged them and counters lie).
pub const MAX_FRAME: u64 = 1514;

/// LAN→WAN TCP transfer of `bytes` to `server`: the data arrives intact, the WAN host sees
/// `peer` as the client, and ≥ 90 % of the LAN wire packets were forwarded by the fast path.
/// Returns the counters before and after, for further checks.
pub fn bulk_is_fast_pathed(
    tb: &Testbed,
    server: SocketAddr,
    peer: IpAddr,
    bytes: u64,
) -> (Snapshot, Snapshot) {
    let before = tb.snapshot();
    let r = Transfer::start(tb, server, Plan { bytes, rate: None }).finish();
    let after = tb.snapshot();
    assert_intact(&r);
    assert_eq!(
        r.peer.ip(),
        peer,
        "the WAN host saw {} as the client",
        r.peer
    );
    let wire = after.rx_lan_since(&before);
    let fwd = after.packets_since(&before, LAN_IF, "forwarded_original");
    let frac = fastpath_fraction(fwd, wire);
    eprintln!(
        "TCP {server}: {wire} packets in on {LAN_IF}, {fwd} fast-pathed ({:.1} %)",
        frac * 100.0
    );
    assert!(
        wire >= bytes / MAX_FRAME,
        "only {wire} packets received on {LAN_IF} for {bytes} bytes: GRO on the router veth?"
    );
    assert!(
        frac >= 0.9,
        "only {fwd} of {wire} LAN packets ({:.1} %) were forwarded by the fast path (want ≥ 90 %)",
        frac * 100.0
    );
    (before, after)
}

/// The WAN host's IPv4 address with `port`.
pub fn wan_v4(port: u16) -> SocketAddr {
    SocketAddr::new(WAN_HOST_V4.into(), port)
}

/// The WAN host's IPv6 address with `port`.
pub fn wan_v6(port: u16) -> SocketAddr {
    SocketAddr::new(WAN_HOST_V6.into(), port)
}

/// Any IPv4 address, any port (a client's bind address).
pub fn any_v4() -> SocketAddr {
    SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), 0)
}

/// Any IPv6 address, any port (a client's bind address).
pub fn any_v6() -> SocketAddr {
    SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), 0)
}

/// The data arrived whole: same byte count and SHA-256 at both ends.
pub fn assert_intact(r: &TransferResult) {
    assert_eq!(
        r.received.bytes, r.sent.bytes,
        "receiver got {} bytes, sender sent {}",
        r.received.bytes, r.sent.bytes
    );
    assert_eq!(
        r.received.sha256,
        r.sent.sha256,
        "SHA-256 differs: sent {} received {}",
        hex(&r.sent.sha256),
        hex(&r.received.sha256)
    );
}

/// Lowercase hex of a digest (for messages).
pub fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Datagram size of [`offload_udp`] / [`udp_is_fast_pathed`].
pub const PING_DGRAM: usize = 200;
/// Interval of their ping-pong (50 datagrams per second).
pub const PING_TICK: Duration = Duration::from_millis(20);

/// Ping-pongs on `sock` until the daemon has offloaded exactly this one UDP connection (both
/// directions), 8 s at most: conntrack marks UDP ASSURED only after 2 s with replies. Every
/// datagram must come back while it waits.
pub fn offload_udp(tb: &Testbed, sock: &UdpSocket, server: SocketAddr, seq: &mut u64) {
    ping_until(tb, sock, server, seq, |st| {
        st.conntrack.offloaded == 1 && st.flows.ipv4 + st.flows.ipv6 == 2
    });
}

/// Ping-pongs on `sock` until `done` holds for the daemon's status, 8 s at most; every
/// datagram must come back while it waits.
fn ping_until(
    tb: &Testbed,
    sock: &UdpSocket,
    server: SocketAddr,
    seq: &mut u64,
    done: impl Fn(&Status) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(8);
    loop {
        let pp = ping_pong(sock, server, *seq, 10, PING_DGRAM, PING_TICK);
        *seq += pp.sent;
        assert_eq!(
            (pp.good, pp.lost, pp.corrupt),
            (pp.sent, 0, 0),
            "before offload: {pp:?}"
        );
        let st = tb.daemon().status();
        if done(&st) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "UDP to {server} not offloaded within 8 s: {:?} {:?}\nconntrack:\n{}\nflows: {}\n{}",
            st.flows,
            st.conntrack,
            tb.router.exec_ok("conntrack", &["-L", "-p", "udp"]),
            tb.daemon().flows_json(),
            tb.daemon().log_tail()
        );
    }
}

/// Sends 20 datagrams on the offloaded connection and checks the fast path forwarded every one
/// of them, both ways: the datagrams arrive at the router on `orig_if`, the replies on
/// `reply_if`.
pub fn udp_is_fast_pathed(
    tb: &Testbed,
    sock: &UdpSocket,
    server: SocketAddr,
    seq: &mut u64,
    orig_if: &str,
    reply_if: &str,
) {
    // A newly (re-)offloaded direction is armed by its first packet the kernel forwards.
    let arm = ping_pong(sock, server, *seq, 1, PING_DGRAM, PING_TICK);
    *seq += arm.sent;
    assert_eq!((arm.good, arm.lost), (arm.sent, 0), "arming: {arm:?}");
    let before = tb.snapshot();
    let pp = ping_pong(sock, server, *seq, 20, PING_DGRAM, PING_TICK);
    *seq += pp.sent;
    let after = tb.snapshot();
    let orig = after.packets_since(&before, orig_if, "forwarded_original");
    let reply = after.packets_since(&before, reply_if, "forwarded_reply");
    eprintln!(
        "offloaded UDP: {} sent, {} good; fast path {orig} original, {reply} reply",
        pp.sent, pp.good
    );
    assert_eq!((pp.good, pp.lost), (pp.sent, 0), "offloaded: {pp:?}");
    assert_eq!(
        (orig, reply),
        (pp.sent, pp.sent),
        "the fast path should forward all {} datagrams each way while offloaded",
        pp.sent
    );
}

/// The config's `[[interface]]` tables for `wan` (role wan) and [`LAN_IF`] (role lan), for
/// [`Testbed::start_daemon_config`].
pub fn wan_lan_interfaces(wan: &str) -> String {
    format!(
        "[[interface]]\nname = \"{wan}\"\nrole = \"wan\"\n\
         [[interface]]\nname = \"{LAN_IF}\"\nrole = \"lan\"\n"
    )
}

/// Moves the router's MASQUERADE and its `lan` → WAN FORWARD accept from [`WAN_IF`] onto
/// `wan`, a device that encapsulates over it (a VLAN, a tunnel), and checks that the LAN host
/// reaches the WAN host over IPv4 and IPv6 (`what` names the path when it does not).
pub fn route_wan_through(tb: &Testbed, lan: &str, wan: &str, what: &str) {
    tb.router.sh(&format!(
        "iptables -w -t nat -D POSTROUTING -o {WAN_IF} -j MASQUERADE
         iptables -w -t nat -A POSTROUTING -o {wan} -j MASQUERADE
         for t in iptables ip6tables; do
           $t -w -A FORWARD -i {lan} -o {wan} -j ACCEPT
         done"
    ));
    tb.lan.sh(&format!(
        "for i in 1 2 3 4 5; do ping -c1 -W1 {WAN_HOST_V4} >/dev/null && break; done
         for i in 1 2 3 4 5; do ping -6 -c1 -W1 {WAN_HOST_V6} >/dev/null && exit 0; done
         echo 'no path LAN -> WAN {what}' >&2; exit 1"
    ));
}

/// With the Ethernet port under an encapsulation (VLAN, PPPoE) managed as the WAN and the
/// encapsulating device not: between `before` and `after`, `frames` (e.g. "tagged") were counted
/// under `reason` (`not_ip`, `vlan_unknown`) on [`WAN_IF`], connections were skipped as
/// `path_not_managed`, and no packet was counted as forwarded.
pub fn assert_encapsulated_wan_left_to_kernel(
    before: &Status,
    after: &Status,
    frames: &str,
    reason: &str,
) {
    let d =
        |iface: &str, reason: &str| after.packets(iface, reason) - before.packets(iface, reason);
    let passed = d(WAN_IF, reason);
    let forwarded = d(LAN_IF, "forwarded_original") + d(WAN_IF, "forwarded_reply");
    let not_managed = after
        .conntrack
        .skipped
        .get("path_not_managed")
        .copied()
        .unwrap_or(0);
    eprintln!(
        "{frames} frames passed on {WAN_IF} ({reason}): {passed}; connections not offloaded \
         (path_not_managed): {not_managed}; packets forwarded by XDP: {forwarded}"
    );
    assert!(
        passed > 0,
        "no {frames} frame counted {reason} on {WAN_IF}: {after:?}"
    );
    assert!(
        not_managed > 0,
        "no connection skipped as path_not_managed: {after:?}"
    );
    assert_eq!(
        forwarded, 0,
        "packets counted as forwarded although the {frames} path is not managed"
    );
}

/// UDP exchanges (warm-up, a pause for the daemon to offload the flow, then 200 more) and a
/// 2 MiB TCP transfer from the LAN host to the WAN host on `port` and `port + 1`: every datagram
/// answered intact, the transfer intact and masqueraded to the router's WAN address. Returns
/// the daemon's status before and after. For topologies other than the plain one (`what` names
/// it in failures), where the fast path may not carry everything but nothing may break.
pub fn udp_and_tcp_are_intact(tb: &Testbed, port: u16, what: &str) -> (Status, Status) {
    let before = tb.daemon().status();
    let server = wan_v4(port);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, SocketAddr::from(([0, 0, 0, 0], 0)), 64);
    let warmup = ping_pong(&sock, server, 0, 5, 200, Duration::from_millis(100));
    sleep(Duration::from_millis(2500));
    let run = ping_pong(&sock, server, 5, 200, 200, Duration::from_millis(2));
    let stats = echo.finish();
    assert!(
        warmup.good == warmup.sent && run.good == run.sent && stats.corrupt == 0,
        "UDP over {what}: warm-up {warmup:?}, run {run:?}, server {stats:?}"
    );
    let r = Transfer::start(
        tb,
        wan_v4(port + 1),
        Plan {
            bytes: 2 << 20,
            rate: None,
        },
    )
    .finish();
    assert_intact(&r);
    assert_eq!(
        r.peer.ip(),
        IpAddr::from(ROUTER_WAN_V4),
        "TCP over {what}: not masqueraded to the router's WAN address"
    );
    (before, tb.daemon().status())
}

/// Ping-pongs from `sock` until the daemon has the connection to `server` offloaded (both
/// directions in the flow map of its family; 8 s at most).
pub fn offload_udp_family(tb: &Testbed, sock: &UdpSocket, server: SocketAddr, seq: &mut u64) {
    let v6 = server.is_ipv6();
    ping_until(tb, sock, server, seq, |st| {
        (if v6 { st.flows.ipv6 } else { st.flows.ipv4 }) >= 2
    });
}

/// What one measured exchange did.
pub struct Measured {
    pub sent: u64,
    /// XDP forwarded, original direction (counted on the LAN ingress).
    pub orig: u64,
    /// XDP forwarded, reply direction (counted on the WAN device the flow enters by).
    pub reply: u64,
    /// Packets on the router's LAN and WAN wires (rx_packets; GRO is off on them).
    pub wire_lan: u64,
    pub wire_wan: u64,
    /// FORWARD ESTABLISHED rule increase.
    pub established: u64,
}

/// 50 datagrams each way on the connection of `sock` (armed first), every one answered intact;
/// the XDP counters of the original direction on `lan` and of the reply on `wan` (the device
/// the kernel sees the replies arrive on: a VLAN or PPP device).
pub fn measure_udp(
    tb: &Testbed,
    sock: &UdpSocket,
    server: SocketAddr,
    seq: &mut u64,
    lan: &str,
    wan: &str,
) -> Measured {
    // A newly offloaded direction is armed by its first packet the kernel forwards.
    let arm = ping_pong(sock, server, *seq, 2, PING_DGRAM, PING_TICK);
    *seq += arm.sent;
    let before = tb.snapshot();
    let pp = ping_pong(sock, server, *seq, 50, PING_DGRAM, PING_TICK);
    *seq += pp.sent;
    let after = tb.snapshot();
    assert_eq!(
        (pp.good, pp.lost, pp.corrupt),
        (pp.sent, 0, 0),
        "every datagram must come back intact: {pp:?}"
    );
    Measured {
        sent: pp.sent,
        orig: after.packets_since(&before, lan, "forwarded_original"),
        reply: after.packets_since(&before, wan, "forwarded_reply"),
        wire_lan: after.rx_lan_since(&before),
        wire_wan: after.rx_wan_since(&before),
        established: after.established_since(&before, server.is_ipv6()),
    }
}

/// UDP over IPv4 and IPv6 (servers on `port` and `port + 1`) and a 2 MiB TCP transfer over
/// IPv4 (`port + 3`) from the LAN host to the WAN host through a WAN that encapsulates (a VLAN,
/// a PPPoE session; `what` names it in the printed lines): the LAN side's packets are counted
/// on `lan` (where XDP runs: the LAN device or bridge port), the replies on `wan` (the device
/// the kernel sees them arrive on). Every datagram is fast-pathed both ways with netfilter's
/// ESTABLISHED rule not rising, then the negative control (fast path off) sends the same
/// exchange through netfilter; TCP arrives intact, masqueraded, fast-pathed both ways.
pub fn traffic_is_fast_pathed(tb: &Testbed, port: u16, lan: &str, wan: &str, what: &str) {
    for (server, sock) in [
        (wan_v4(port), udp_socket(&tb.lan, any_v4(), 64)),
        (wan_v6(port + 1), udp_socket(&tb.lan, any_v6(), 64)),
    ] {
        let echo = UdpEcho::start(&tb.wan, server);
        let mut seq = 0;
        offload_udp_family(tb, &sock, server, &mut seq);
        let m = measure_udp(tb, &sock, server, &mut seq, lan, wan);
        println!(
            "{server} {what}: {} datagrams each way; XDP forwarded {} original (on {lan}), {} \
             reply (on {wan}); wire packets {} on {LAN_IF}, {} on {WAN_IF}: fast-path share \
             {:.0} % / {:.0} %; FORWARD ESTABLISHED +{}",
            m.sent,
            m.orig,
            m.reply,
            m.wire_lan,
            m.wire_wan,
            100.0 * m.orig as f64 / m.wire_lan.max(1) as f64,
            100.0 * m.reply as f64 / m.wire_wan.max(1) as f64,
            m.established
        );
        assert_eq!(
            (m.orig, m.reply),
            (m.sent, m.sent),
            "every datagram fast-pathed both ways"
        );
        assert!(
            m.wire_wan >= m.sent && m.wire_lan >= m.sent,
            "fewer wire packets than datagrams: GRO on the router's veths?"
        );
        assert!(
            m.established <= 2,
            "netfilter saw {} packets of the offloaded flow",
            m.established
        );

        // Negative control: the fast path off, the same exchange goes through netfilter.
        tb.daemon().set_fastpath(false);
        let off = measure_udp(tb, &sock, server, &mut seq, lan, wan);
        tb.daemon().set_fastpath(true);
        println!(
            "{server} {what}, fast path off: XDP forwarded {} original, {} reply; FORWARD \
             ESTABLISHED +{} for {} datagrams each way",
            off.orig, off.reply, off.established, off.sent
        );
        assert_eq!((off.orig, off.reply), (0, 0), "fast path off");
        assert!(
            off.established >= 2 * off.sent,
            "with the fast path off netfilter must see every packet: +{}",
            off.established
        );
        assert_eq!(echo.finish().corrupt, 0);
    }

    // TCP: a 2 MiB transfer, intact and masqueraded; most of it fast-pathed once established.
    let before = tb.snapshot();
    let r = Transfer::start(
        tb,
        wan_v4(port + 3),
        Plan {
            bytes: 2 << 20,
            rate: None,
        },
    )
    .finish();
    let after = tb.snapshot();
    assert_intact(&r);
    assert_eq!(r.peer.ip(), IpAddr::from(ROUTER_WAN_V4), "not masqueraded");
    let orig = after.packets_since(&before, lan, "forwarded_original");
    let reply = after.packets_since(&before, wan, "forwarded_reply");
    let wire = after.rx_lan_since(&before) + after.rx_wan_since(&before);
    println!(
        "TCP 2 MiB {what}: XDP forwarded {orig} original + {reply} reply of {wire} \
         wire packets ({:.0} %), FORWARD ESTABLISHED +{}",
        100.0 * (orig + reply) as f64 / wire.max(1) as f64,
        after.established_since(&before, false)
    );
    assert!(
        orig > 0 && reply > 0,
        "TCP not fast-pathed both ways {what}: {orig} original, {reply} reply"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn established_counter_is_parsed_from_iptables_listing() {
        let listing = "Chain FORWARD (policy DROP 3 packets, 180 bytes)
    pkts      bytes target     prot opt in     out     source               destination
   12345  9876543 ACCEPT     all  --  *      *       0.0.0.0/0            0.0.0.0/0            ctstate RELATED,ESTABLISHED
       7      420 ACCEPT     all  --  eth1   eth0    0.0.0.0/0            0.0.0.0/0
";
        assert_eq!(parse_established(listing), Some(12345));
        assert_eq!(parse_established("Chain FORWARD (policy ACCEPT)\n"), None);
        assert_eq!(parse_forward_total(listing), Some(3 + 12345 + 7));
    }

    #[test]
    fn fraction_handles_zero_wire_packets() {
        assert_eq!(fastpath_fraction(0, 0), 0.0);
        assert!((fastpath_fraction(9, 10) - 0.9).abs() < 1e-9);
    }

    /// A captured-by-hand IPv4 UDP frame (checksums computed by the kernel) parses and verifies;
    /// flipping a payload bit breaks the UDP checksum, flipping the TTL breaks the IP checksum.
    #[test]
    fn udp_frame_checksums_are_verified() {
        // 10.0.2.1:40000 -> 10.0.2.2:9999, TTL 63, payload "hello".
        let mut f = vec![0u8; 14];
        f[12] = 0x08;
        let mut ip = vec![
            0x45, 0, 0, 33, 0x12, 0x34, 0x40, 0, 63, 17, 0, 0, 10, 0, 2, 1, 10, 0, 2, 2,
        ];
        let c = internet_checksum(&[&ip]);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let mut udp = vec![0x9c, 0x40, 0x27, 0x0f, 0, 13, 0, 0];
        udp.extend_from_slice(b"hello");
        let pseudo = [10, 0, 2, 1, 10, 0, 2, 2, 0, 17, 0, 13];
        let c = internet_checksum(&[&pseudo, &udp]);
        udp[6..8].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&udp);

        let p = parse_udp_frame(&f).expect("parses");
        assert!(p.ip_checksum_ok && p.udp_checksum_ok, "{p:?}");
        assert_eq!(p.ttl, 63);
        assert_eq!(p.src, "10.0.2.1:40000".parse().unwrap());
        assert_eq!(p.dst, "10.0.2.2:9999".parse().unwrap());
        assert_eq!(p.payload, b"hello");

        let mut bad = f.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(!parse_udp_frame(&bad).unwrap().udp_checksum_ok);
        let mut bad = f.clone();
        bad[14 + 8] = 62;
        assert!(!parse_udp_frame(&bad).unwrap().ip_checksum_ok);
    }

    #[test]
    fn udp_payload_is_deterministic_and_distinct() {
        assert_eq!(udp_payload(7, 100), udp_payload(7, 100));
        assert_ne!(udp_payload(7, 100), udp_payload(8, 100));
        assert_eq!(&udp_payload(7, 100)[..8], &7u64.to_be_bytes());
    }
}
