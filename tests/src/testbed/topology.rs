//! The topology: three namespaces (lan host ⇄ router ⇄ wan host) configured like a home
//! router, the daemon started on it as a user would, its temp directory, and the check that a
//! test can run here at all (root, tools).

use std::{
    fs,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
};

use crate::netns::{self, Netns};

use super::{
    addrs::{
        HOST_IF, LAN_HOST_V4, LAN_HOST_V6, LAN_IF, MACVLAN_LAN_IF, ROUTER_LAN_V4, ROUTER_LAN_V6,
        ROUTER_WAN_V4, ROUTER_WAN_V6, WAN_HOST_V4, WAN_HOST_V6, WAN_IF,
    },
    daemon::Daemon,
    status::{Snapshot, established_packets},
};

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

/// True when `tool` is an executable name found on `PATH` or in the sbin directories.
pub fn on_path(tool: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .any(|d| d.join(tool).is_file())
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
    /// `verdict_max_age_ms` of the daemon's config: 0 (verdicts kept until the ruleset
    /// changes) unless a test sets it before starting the daemon. Most tests count exactly
    /// which reason every packet of a short exchange took; with verdicts expiring, one packet
    /// per direction and interval would go to the kernel instead at a moment that depends on
    /// timing. Expiry only ever sends more packets to the kernel; `tests/verdicts.rs` runs
    /// with the shipped default.
    pub verdict_max_age_ms: u64,
    /// The router's device whose received packets are the LAN's wire packets in a
    /// [`Snapshot`]: the LAN veth, unless a test moved the LAN onto another device (a NIC).
    pub lan_wire: String,
    /// The same for the WAN: the WAN veth, unless a test moved the WAN onto another device
    /// (an L3 tunnel).
    pub wan_wire: String,
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
            verdict_max_age_ms: 0,
            lan_wire: LAN_IF.to_string(),
            wan_wire: WAN_IF.to_string(),
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

    /// Makes the kernel refuse native XDP on the router's LAN veth (see
    /// [`refuse_native_xdp_behind`]).
    pub fn refuse_native_xdp_on_the_lan_port(&self) {
        refuse_native_xdp_behind(&self.lan, HOST_IF);
    }

    /// Makes the router's LAN port a macvlan over the LAN veth ([`MACVLAN_LAN_IF`]), a device
    /// without native XDP (the stand-in for Realtek, Wi-Fi and USB NICs) and without XDP
    /// transmit: the LAN addresses move onto it, FORWARD accepts it towards `wan` (IPv4 and
    /// IPv6), and the LAN host's neighbour entries for the router are made (and checked) to
    /// point at it.
    pub fn macvlan_lan_port(&self, wan: &str) {
        self.router.sh(&format!(
            "ip addr flush dev {LAN_IF}
             ip link add {MV} link {LAN_IF} type macvlan mode bridge
             ip addr add {ROUTER_LAN_V4}/24 dev {MV}
             ip addr add {ROUTER_LAN_V6}/64 dev {MV} nodad
             ip link set {MV} up
             sysctl -qw net.ipv4.conf.{LAN_IF}.arp_ignore=1
             ethtool -K {MV} tx off rx off gro off gso off tso off >/dev/null 2>&1 || true
             for t in iptables ip6tables; do $t -w -A FORWARD -i {MV} -o {wan} -j ACCEPT; done",
            MV = MACVLAN_LAN_IF
        ));
        // The LAN host must reach the router through the macvlan: with the kernel's default
        // `arp_ignore = 0` the lower veth answers ARP for the macvlan's address too, with its
        // own MAC, and when its answer came last the host's IPv4 packets entered by the
        // unmanaged veth (set to 1 above; IPv6 neighbour discovery answers per interface
        // already).
        self.lan_host_reaches_the_router_by(MACVLAN_LAN_IF, "the macvlan");
    }

    /// The LAN host's neighbour entries for the router made again (pinging it over IPv4 and
    /// IPv6) and checked to point at the router's device `dev` (`what` names it).
    fn lan_host_reaches_the_router_by(&self, dev: &str, what: &str) {
        self.lan.sh(&format!(
            "ip neigh flush dev {HOST_IF}
             ping -c1 -W2 {ROUTER_LAN_V4} >/dev/null
             for i in 1 2 3 4 5; do ping -6 -c1 -W1 {ROUTER_LAN_V6} >/dev/null && exit 0; done
             echo 'no IPv6 path to {what}' >&2; exit 1"
        ));
        let mac = self.router.sh(&format!("cat /sys/class/net/{dev}/address"));
        let neigh = self
            .lan
            .sh(&format!("ip neigh show {ROUTER_LAN_V4} dev {HOST_IF}"));
        assert!(
            neigh.contains(mac.trim()),
            "the LAN host should resolve {ROUTER_LAN_V4} to {dev}'s MAC {}: {neigh}",
            mac.trim()
        );
    }

    /// Undoes [`Testbed::macvlan_lan_port`]: the macvlan deleted, the LAN addresses back on the
    /// LAN veth, its `arp_ignore` back to the kernel's default, and the LAN host's neighbour
    /// entries for the router made again (and checked) to point at the veth. The FORWARD rules
    /// naming the macvlan stay (they match nothing now).
    pub fn lan_port_back_from_macvlan(&self) {
        self.router.sh(&format!(
            "ip link del {MACVLAN_LAN_IF}
             ip addr add {ROUTER_LAN_V4}/24 dev {LAN_IF}
             ip addr add {ROUTER_LAN_V6}/64 dev {LAN_IF} nodad
             sysctl -qw net.ipv4.conf.{LAN_IF}.arp_ignore=0"
        ));
        self.lan_host_reaches_the_router_by(LAN_IF, "the LAN veth");
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
                 verdict_max_age_ms = {}\n\
                 {config_tail}",
                socket.display(),
                self.verdict_max_age_ms
            ),
        )
        .unwrap_or_else(|e| panic!("write {}: {e}", config.display()));
        Daemon::start(&self.router, &config, &socket, self.dir.path())
    }

    /// The running daemon (panics when [`Testbed::start_daemon`] was not called).
    pub fn daemon(&self) -> &Daemon {
        self.daemon.as_ref().expect("start_daemon() first")
    }

    /// `/metrics` as the daemon serves it at its default address (127.0.0.1:9824) in the router
    /// namespace: the whole HTTP/1.0 answer, whose status line is checked.
    pub fn metrics(&self) -> String {
        use std::io::{Read as _, Write as _};
        let out = self
            .router
            .run(|| -> std::io::Result<String> {
                let mut s = std::net::TcpStream::connect("127.0.0.1:9824")?;
                s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
                let mut out = String::new();
                s.read_to_string(&mut out)?;
                Ok(out)
            })
            .unwrap_or_else(|e| panic!("GET /metrics: {e}"));
        assert!(out.starts_with("HTTP/1.0 200"), "{out}");
        out
    }

    /// Counters from everywhere the tests look: daemon status, router veth rx_packets and the
    /// FORWARD chains' ESTABLISHED rule.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            status: self.daemon().status(),
            rx_lan: self.rx_packets(&self.lan_wire),
            rx_wan: self.rx_packets(&self.wan_wire),
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

/// Makes the kernel refuse native XDP on the router's end of a veth, as a driver refuses what
/// it cannot do: the host's end (`ifname` in `host`) transmits on two queues, the router's end
/// receives on one (`veth_xdp_set`: ENOSPC). Needs two possible CPUs (a veth has as many
/// queues at most).
pub fn refuse_native_xdp_behind(host: &Netns, ifname: &str) {
    host.sh(&format!(
        "ethtool -L {ifname} tx 2 || {{ echo 'cannot give {ifname} two TX queues (a veth has \
         one per possible CPU: this test needs two CPUs)' >&2; exit 1; }}"
    ));
}
