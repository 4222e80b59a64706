//! What `xdp-routerd status` and `xdp-routerd flows` show: the JSON shapes (a stable interface
//! for scripts and tests) and their human-readable rendering.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::{IpAddr, SocketAddr},
    str::FromStr,
};

use serde::{Deserialize, Serialize};
use xdp_router_common::Reason;

use crate::{datapath, flows::Skip};

/// `status --json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    /// Whether established flows are forwarded in XDP.
    pub fastpath: bool,
    /// Managed interfaces.
    pub interfaces: Vec<IfaceStatus>,
    /// Offloaded flow directions per family and the capacity of each map.
    pub flows: FlowCounts,
    /// One row per (managed interface, reason); rows are per ingress interface.
    pub counters: Vec<CounterRow>,
    /// Conntrack sync.
    pub conntrack: ConntrackStatus,
    /// The datapath's per-flow cache of FIB answers.
    #[serde(default)]
    pub fib_cache: FibCacheStatus,
    /// Firewall ruleset tracking (arming).
    #[serde(default)]
    pub ruleset: RulesetStatus,
    /// How old these figures are: 0 when built for this request, else the age of the last
    /// status built, answered because the daemon was busy (see
    /// [`crate::state::Shared::status`]).
    #[serde(default)]
    pub age_ms: u64,
}

/// Firewall ruleset tracking: flow directions are forwarded only once the kernel forwarded one
/// of their packets under the current ruleset generation.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RulesetStatus {
    /// Current ruleset generation (starts at 1).
    pub generation: u32,
    /// Ruleset changes seen since start (nftables commits, iptables-legacy changes, lost
    /// notifications), each of which disarmed every flow direction.
    pub changes: u64,
    /// Managed interfaces with the TC egress arming program attached.
    pub armed_interfaces: u32,
    /// `bpf_fib_lookup` takes the packet mark (Linux 6.10): marked flows can be fast-pathed.
    pub fib_mark: bool,
}

impl From<datapath::Ruleset> for RulesetStatus {
    fn from(r: datapath::Ruleset) -> Self {
        RulesetStatus {
            generation: r.generation,
            changes: r.changes,
            armed_interfaces: r.armed_interfaces,
            fib_mark: r.fib_mark,
        }
    }
}

/// The per-flow cache of `bpf_fib_lookup` answers (`fib_cache_ms`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FibCacheStatus {
    /// Longest an answer is reused, in ms; 0 = every packet is looked up.
    pub max_age_ms: u64,
    /// Current generation: answers of older generations are not used.
    pub generation: u32,
    /// Invalidations since start (kernel routing, rule, address, link, neighbour or
    /// forwarding notifications, in bursts of up to 50 ms).
    pub invalidations: u64,
}

impl From<datapath::FibCache> for FibCacheStatus {
    fn from(c: datapath::FibCache) -> Self {
        FibCacheStatus {
            max_age_ms: c.max_age_ms,
            generation: c.generation,
            invalidations: c.invalidations,
        }
    }
}

/// One managed interface.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IfaceStatus {
    pub name: String,
    /// 0 while the interface does not exist.
    pub ifindex: u32,
    pub role: String,
    /// `native`, `generic`, or `detached` (interface missing).
    pub attach_mode: String,
    /// Egress is shaped: the fast path does not send packets out of this interface.
    pub shaped: bool,
    /// The `shaped` setting of the config: `auto`, `true` or `false`.
    #[serde(default)]
    pub shaped_config: String,
    /// Why it is shaped: `config` (`shaped = true`), the kind of the shaping qdisc found in
    /// its egress tree (`auto`, e.g. `htb`), or `unknown qdiscs` (auto, not read yet); null
    /// when not shaped.
    #[serde(default)]
    pub shaped_by: Option<String>,
    /// Kind of the root egress qdisc as last read (null before the first read or when the
    /// kernel reports none).
    #[serde(default)]
    pub egress_qdisc: Option<String>,
    /// The fast path may redirect packets into it: the kernel reports that it transmits XDP
    /// frames (`NETDEV_XDP_ACT_NDO_XMIT`). False for a bridge, or a veth whose peer has
    /// neither XDP nor GRO; packets routed out of it are counted `egress_no_xdp_xmit`.
    #[serde(default)]
    pub xdp_xmit: bool,
    /// Why `xdp_xmit` is false (null when true or the interface is missing).
    #[serde(default)]
    pub no_xdp_xmit_because: Option<String>,
    /// Why the attach mode is generic although native was asked for: the kernel's refusal,
    /// explained (e.g. a veth peer's MTU too large for native XDP).
    #[serde(default)]
    pub generic_because: Option<String>,
    /// For a bridge port: the managed bridge it belongs to (its role, its routing).
    #[serde(default)]
    pub bridge: Option<String>,
    /// For a managed bridge: MAC addresses copied from its FDB (redirect targets).
    #[serde(default)]
    pub fdb_entries: Option<u64>,
    /// For a VLAN device: its VLAN and parent (`VLAN 7 (802.1Q) on eth0`, the program runs
    /// there, or on the ports of a bridge parent: `VLAN 20 (802.1Q) on br-lan`); for a parent
    /// managed only for its VLANs: `parent of eth0.7`. For a PPP device:
    /// its PPPoE session (`PPPoE session 0x0001 over eth0 (peer 52:54:00:12:34:56)`, the
    /// program runs on eth0), or `PPPoE: not accelerated` when it has none; for a device
    /// managed only for a session: `lower device of ppp0`.
    #[serde(default)]
    pub encap: Option<String>,
    /// For a PPP device: its PPPoE session as the fast path uses it (null for other
    /// interfaces).
    #[serde(default)]
    pub pppoe: Option<PppoeStatus>,
    /// For a VLAN-filtering bridge (its own `self` VLANs) and each of its ports: the VLANs as
    /// the fast path uses them; null for everything else (a bridge without VLAN filtering
    /// too).
    #[serde(default)]
    pub bridge_vlans: Option<BridgeVlansStatus>,
    /// Why the fast path carries nothing of it (a VLAN over a VLAN device); null otherwise.
    #[serde(default)]
    pub not_accelerated_because: Option<String>,
}

/// The VLANs of a VLAN-filtering bridge or of one of its ports, as copied to the fast path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgeVlansStatus {
    /// The bridge's tag protocol (`vlan_protocol`): 33024 (0x8100, 802.1Q) or 34984
    /// (0x88a8, 802.1ad); 0 when it could not be read.
    pub tpid: u16,
    /// Its PVID (untagged frames it receives are in this VLAN); null: none (they are
    /// dropped).
    pub pvid: Option<u16>,
    /// Its memberships, by VLAN ID.
    pub vlans: Vec<BridgeVlanStatus>,
}

/// One VLAN membership (a line of `bridge vlan show`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgeVlanStatus {
    pub vid: u16,
    /// It is the PVID.
    pub pvid: bool,
    /// Sent untagged (for the bridge itself: its own IP layer sees the VLAN on the bridge
    /// device, not on a VLAN device over it).
    pub untagged: bool,
}

impl BridgeVlansStatus {
    /// `VLANs 1 (PVID, untagged), 20`, `no VLANs`, with `, no PVID` when it has none.
    pub fn render(&self) -> String {
        let list: Vec<String> = self
            .vlans
            .iter()
            .map(|v| match (v.pvid, v.untagged) {
                (true, true) => format!("{} (PVID, untagged)", v.vid),
                (true, false) => format!("{} (PVID)", v.vid),
                (false, true) => format!("{} (untagged)", v.vid),
                (false, false) => v.vid.to_string(),
            })
            .collect();
        let mut s = if list.is_empty() {
            "no VLANs".to_string()
        } else {
            format!("VLANs {}", list.join(", "))
        };
        if self.pvid.is_none() {
            s.push_str(", no PVID");
        }
        s
    }

    /// `802.1Q` / `802.1ad`.
    pub fn protocol(&self) -> &'static str {
        vlan_protocol_name(self.tpid)
    }
}

/// `802.1Q` / `802.1ad` for a tag protocol (host order).
pub fn vlan_protocol_name(tpid: u16) -> &'static str {
    match tpid {
        0x8100 => "802.1Q",
        0x88a8 => "802.1ad",
        _ => "unknown protocol",
    }
}

/// A managed PPP device's PPPoE session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PppoeStatus {
    /// The session ID (host order, as pppd logs it); null while no session is bound.
    pub session_id: Option<u16>,
    /// The device the session runs over, where the program runs.
    pub lower: Option<String>,
    /// The access concentrator's MAC.
    pub peer_mac: Option<String>,
    /// Why the fast path carries nothing of the PPP device (no session, several sessions
    /// and no `pppoe_device`, PPP compression, ...); null while a session is bound.
    pub not_accelerated_because: Option<String>,
}

/// Flow map occupancy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FlowCounts {
    /// IPv4 flow directions (two per connection).
    pub ipv4: u64,
    /// IPv6 flow directions.
    pub ipv6: u64,
    /// Capacity of each map.
    pub capacity: u32,
}

/// Packets and bytes of one reason on one ingress interface.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CounterRow {
    pub interface: String,
    pub reason: Reason,
    pub packets: u64,
    pub bytes: u64,
}

/// Conntrack sync counters.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ConntrackStatus {
    /// ctnetlink events received.
    pub events: u64,
    /// ctnetlink events received, by type: `new` (a connection was confirmed), `update` (its
    /// state, status or timeout changed) and `destroy`.
    #[serde(default)]
    pub events_by_type: BTreeMap<String, u64>,
    /// Full resyncs from a dump (start, netlink overrun).
    pub resyncs: u64,
    /// Connections currently offloaded.
    pub offloaded: u64,
    /// Connections offloaded since start.
    pub offloaded_total: u64,
    /// Connections taken back from the fast path since start.
    pub removed_total: u64,
    /// Conntrack timeout refreshes sent by the keep-alive.
    pub refreshes: u64,
    /// ctnetlink errors (failed dumps, refreshes, socket errors).
    pub errors: u64,
    /// Conntrack event messages that could not be decoded (skipped; their connections stay
    /// in the kernel).
    #[serde(default)]
    pub decode_errors: u64,
    /// Connections considered but not offloaded, by reason.
    pub skipped: BTreeMap<Skip, u64>,
    /// Duration of the last full resync, in milliseconds.
    pub last_resync_ms: u64,
}

/// One offloaded flow direction (`flows --json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FlowRow {
    pub family: String,
    pub ingress: String,
    pub proto: String,
    pub src: String,
    pub dst: String,
    pub new_src: String,
    pub new_dst: String,
    /// `original` or `reply`.
    pub direction: String,
    pub packets: u64,
    pub bytes: u64,
    /// Milliseconds since the fast path last forwarded a packet of it; null if never.
    pub idle_ms: Option<u64>,
}

/// `flows --json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Flows {
    pub flows: Vec<FlowRow>,
}

impl Status {
    /// Human-readable rendering. Counter rows that are zero are left out.
    pub fn render(&self) -> String {
        let mut s = String::new();
        if self.age_ms > 0 {
            let _ = writeln!(
                s,
                "(the daemon is busy: these figures are {} ms old)",
                self.age_ms
            );
        }
        let _ = writeln!(s, "fast path: {}", if self.fastpath { "on" } else { "off" });
        let _ = writeln!(s, "interfaces:");
        for i in &self.interfaces {
            let qdisc = i
                .egress_qdisc
                .as_deref()
                .map(|q| format!(" qdisc {q}"))
                .unwrap_or_default();
            let shaped = match (&i.shaped_by, i.shaped) {
                (Some(by), true) => format!(" (egress shaped by {by}: not used by the fast path)"),
                (None, true) => " (egress shaped: not used by the fast path)".to_string(),
                (_, false) => String::new(),
            };
            let bridge = match (&i.bridge, i.fdb_entries, &i.bridge_vlans) {
                (Some(b), _, None) => format!(" (port of {b})"),
                (Some(b), _, Some(v)) => format!(" (port of {b}, {})", v.render()),
                (None, Some(n), None) => format!(" (bridge: {n} FDB entries)"),
                (None, Some(n), Some(v)) => format!(
                    " (bridge: {n} FDB entries, VLAN filtering {}, {})",
                    v.protocol(),
                    v.render()
                ),
                (None, None, _) => String::new(),
            };
            let encap = i
                .encap
                .as_deref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "  {:<12} ifindex {:<4} role {:<4} xdp {}{qdisc}{shaped}{bridge}{encap}",
                i.name, i.ifindex, i.role, i.attach_mode,
            );
            if let Some(why) = &i.generic_because {
                let _ = writeln!(s, "    generic XDP because: {why}");
            }
            if let Some(why) = &i.no_xdp_xmit_because {
                let _ = writeln!(s, "    not sent out of by the fast path: {why}");
            }
            if let Some(why) = i
                .pppoe
                .as_ref()
                .and_then(|p| p.not_accelerated_because.as_ref())
            {
                let _ = writeln!(s, "    PPPoE not accelerated: {why}");
            }
            if let Some(why) = &i.not_accelerated_because {
                let _ = writeln!(s, "    not accelerated: {why}");
            }
        }
        let _ = writeln!(
            s,
            "flows: {} IPv4 + {} IPv6 directions (capacity {} each)",
            self.flows.ipv4, self.flows.ipv6, self.flows.capacity
        );
        let c = &self.conntrack;
        let _ = writeln!(
            s,
            "conntrack: {} offloaded now, {} offloaded / {} removed since start, {} events, {} resyncs, {} refreshes, {} errors",
            c.offloaded,
            c.offloaded_total,
            c.removed_total,
            c.events,
            c.resyncs,
            c.refreshes,
            c.errors
        );
        if !c.skipped.is_empty() {
            let list: Vec<String> = c.skipped.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(s, "not offloaded: {}", list.join(" "));
        }
        let r = &self.ruleset;
        let _ = writeln!(
            s,
            "firewall: ruleset generation {}, {} changes since start, arming on {} interfaces{}",
            r.generation,
            r.changes,
            r.armed_interfaces,
            if r.fib_mark {
                ""
            } else {
                " (marked flows stay in the kernel: Linux < 6.10)"
            }
        );
        let f = &self.fib_cache;
        if f.max_age_ms == 0 {
            let _ = writeln!(s, "fib cache: off (every packet is looked up)");
        } else {
            let _ = writeln!(
                s,
                "fib cache: answers kept up to {} ms, generation {}, {} invalidations",
                f.max_age_ms, f.generation, f.invalidations
            );
        }
        let _ = writeln!(
            s,
            "{:<12} {:<22} {:>14} {:>16}",
            "INTERFACE", "REASON", "PACKETS", "BYTES"
        );
        for r in self.counters.iter().filter(|r| r.packets != 0) {
            let _ = writeln!(
                s,
                "{:<12} {:<22} {:>14} {:>16}",
                r.interface, r.reason, r.packets, r.bytes
            );
        }
        s
    }
}

impl Flows {
    /// Human-readable table.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<5} {:<8} {:<4} {:<42} {:<42} {:<8} {:>10} {:>12} {:>8}",
            "FAM",
            "IN",
            "PROTO",
            "SRC -> DST",
            "REWRITTEN SRC -> DST",
            "DIR",
            "PACKETS",
            "BYTES",
            "IDLE"
        );
        for f in &self.flows {
            let idle = f
                .idle_ms
                .map(|ms| format!("{:.1}s", ms as f64 / 1000.0))
                .unwrap_or("-".into());
            let _ = writeln!(
                s,
                "{:<5} {:<8} {:<4} {:<42} {:<42} {:<8} {:>10} {:>12} {:>8}",
                f.family,
                f.ingress,
                f.proto,
                format!("{} -> {}", f.src, f.dst),
                format!("{} -> {}", f.new_src, f.new_dst),
                f.direction,
                f.packets,
                f.bytes,
                idle
            );
        }
        let _ = writeln!(s, "{} flow directions", self.flows.len());
        s
    }
}

/// One row of `xdp-routerd stats`: a (managed interface, reason) counter and, when a previous
/// sample is given (`--watch`), what changed since.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatsRow {
    pub interface: String,
    pub reason: Reason,
    /// True for the reasons that mean "forwarded by the fast path"; the others are fallbacks
    /// (packets handed to the kernel).
    pub forwarded: bool,
    pub packets: u64,
    pub bytes: u64,
    /// Packets since the previous sample (watch mode only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_packets: Option<u64>,
    /// Bytes since the previous sample (watch mode only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_bytes: Option<u64>,
    /// Packets per second over the interval (watch mode only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packets_per_second: Option<f64>,
    /// Bits per second (L2 frame bytes × 8) over the interval (watch mode only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bits_per_second: Option<f64>,
}

impl Status {
    /// The counter rows for `stats`, in interface then reason order. With `prev` (an earlier
    /// snapshot and the seconds between the two) each row also carries its delta and rates. A
    /// counter that went backwards (daemon restarted in between) counts from zero.
    pub fn stats_rows(&self, prev: Option<(&Status, f64)>) -> Vec<StatsRow> {
        self.counters
            .iter()
            .map(|c| {
                let mut row = StatsRow {
                    interface: c.interface.clone(),
                    reason: c.reason,
                    forwarded: c.reason.is_forwarded(),
                    packets: c.packets,
                    bytes: c.bytes,
                    delta_packets: None,
                    delta_bytes: None,
                    packets_per_second: None,
                    bits_per_second: None,
                };
                if let Some((p, secs)) = prev {
                    let before = p
                        .counters
                        .iter()
                        .find(|o| o.interface == c.interface && o.reason == c.reason);
                    let delta = |now: u64, then: u64| if now >= then { now - then } else { now };
                    let dp = delta(c.packets, before.map_or(0, |b| b.packets));
                    let db = delta(c.bytes, before.map_or(0, |b| b.bytes));
                    let secs = secs.max(1e-3);
                    row.delta_packets = Some(dp);
                    row.delta_bytes = Some(db);
                    row.packets_per_second = Some(dp as f64 / secs);
                    row.bits_per_second = Some(db as f64 * 8.0 / secs);
                }
                row
            })
            .collect()
    }
}

/// Renders `stats` rows as a table, like `nstat` for the fast path: per interface, the
/// forwarded counters, then every fallback reason, then the share the fast path carried. Rows
/// whose total is zero are left out unless `zeros`.
pub fn render_stats(rows: &[StatsRow], zeros: bool) -> String {
    let watch = rows.iter().any(|r| r.delta_packets.is_some());
    let mut s = String::new();
    if watch {
        let _ = writeln!(
            s,
            "{:<12} {:<22} {:>14} {:>16} {:>10} {:>10} {:>10}",
            "INTERFACE", "REASON", "PACKETS", "BYTES", "+PACKETS", "PKT/S", "BIT/S"
        );
    } else {
        let _ = writeln!(
            s,
            "{:<12} {:<22} {:>14} {:>16}",
            "INTERFACE", "REASON", "PACKETS", "BYTES"
        );
    }
    let mut interfaces: Vec<&str> = Vec::new();
    for r in rows {
        if !interfaces.contains(&r.interface.as_str()) {
            interfaces.push(&r.interface);
        }
    }
    for iface in interfaces {
        let mine: Vec<&StatsRow> = rows.iter().filter(|r| r.interface == iface).collect();
        // Forwarded first, then the fallbacks, each group in reason order.
        let ordered = mine
            .iter()
            .filter(|r| r.forwarded)
            .chain(mine.iter().filter(|r| !r.forwarded));
        for r in ordered.filter(|r| zeros || r.packets != 0) {
            let label = if r.forwarded {
                r.reason.name().to_string()
            } else {
                format!("pass:{}", r.reason.name())
            };
            if watch {
                let _ = writeln!(
                    s,
                    "{:<12} {:<22} {:>14} {:>16} {:>10} {:>10} {:>10}",
                    r.interface,
                    label,
                    r.packets,
                    r.bytes,
                    r.delta_packets.unwrap_or(0),
                    si(r.packets_per_second.unwrap_or(0.0)),
                    si(r.bits_per_second.unwrap_or(0.0)),
                );
            } else {
                let _ = writeln!(
                    s,
                    "{:<12} {:<22} {:>14} {:>16}",
                    r.interface, label, r.packets, r.bytes
                );
            }
        }
        let total: u64 = mine.iter().map(|r| r.packets).sum();
        let fwd: u64 = mine.iter().filter(|r| r.forwarded).map(|r| r.packets).sum();
        let share = |f: u64, t: u64| {
            if t == 0 {
                "-".to_string()
            } else {
                format!("{:.1}%", f as f64 * 100.0 / t as f64)
            }
        };
        if watch {
            let dt: u64 = mine.iter().map(|r| r.delta_packets.unwrap_or(0)).sum();
            let df: u64 = mine
                .iter()
                .filter(|r| r.forwarded)
                .map(|r| r.delta_packets.unwrap_or(0))
                .sum();
            let _ = writeln!(
                s,
                "{iface}: fast path carried {} of {total} packets received (last interval: {} of {dt})",
                share(fwd, total),
                share(df, dt)
            );
        } else {
            let _ = writeln!(
                s,
                "{iface}: fast path carried {} of {total} packets received",
                share(fwd, total)
            );
        }
    }
    s
}

/// `1234567.0` → `1.23M`: short SI rendering for rates.
fn si(v: f64) -> String {
    const UNITS: [(f64, &str); 3] = [(1e9, "G"), (1e6, "M"), (1e3, "k")];
    for (scale, unit) in UNITS {
        if v >= scale {
            return format!("{:.2}{unit}", v / scale);
        }
    }
    format!("{v:.0}")
}

/// `flows --addr`: an address or a prefix (`10.0.0.7`, `10.0.0.0/24`, `2001:db8::/32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddrFilter {
    net: IpAddr,
    prefix: u8,
}

impl FromStr for AddrFilter {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            format!(
                "{s:?} is not an IP address or prefix (e.g. 192.0.2.7, 10.0.0.0/8, 2001:db8::/32)"
            )
        };
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p.parse::<u8>().map_err(|_| bad())?)),
            None => (s, None),
        };
        let addr = addr.trim_start_matches('[').trim_end_matches(']');
        let net: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        if prefix > max {
            return Err(bad());
        }
        Ok(AddrFilter { net, prefix })
    }
}

impl AddrFilter {
    /// True when `a` is inside the prefix (always false across address families).
    pub fn contains(&self, a: IpAddr) -> bool {
        match (self.net, a) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// `flows --addr/--port`: a flow direction matches when any of its four endpoints (before and
/// after the rewrite) has the address, and any has the port. Both must hold when both are given.
#[derive(Debug, Clone, Copy, Default)]
pub struct FlowFilter {
    /// Address or prefix to look for.
    pub addr: Option<AddrFilter>,
    /// Port to look for.
    pub port: Option<u16>,
}

impl FlowFilter {
    /// Whether `f` passes the filter.
    pub fn matches(&self, f: &FlowRow) -> bool {
        let eps: Vec<SocketAddr> = [&f.src, &f.dst, &f.new_src, &f.new_dst]
            .iter()
            .filter_map(|e| e.parse().ok())
            .collect();
        self.addr
            .is_none_or(|a| eps.iter().any(|e| a.contains(e.ip())))
            && self.port.is_none_or(|p| eps.iter().any(|e| e.port() == p))
    }
}

impl Flows {
    /// Keeps the rows that match `filter`.
    pub fn filtered(mut self, filter: &FlowFilter) -> Flows {
        self.flows.retain(|f| filter.matches(f));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(counters: &[(&str, &str, u64, u64)]) -> Status {
        Status {
            fastpath: true,
            interfaces: vec![],
            flows: FlowCounts {
                ipv4: 0,
                ipv6: 0,
                capacity: 16,
            },
            counters: counters
                .iter()
                .map(|&(i, r, p, b)| CounterRow {
                    interface: i.into(),
                    reason: Reason::from_name(r).unwrap(),
                    packets: p,
                    bytes: b,
                })
                .collect(),
            conntrack: ConntrackStatus::default(),
            fib_cache: FibCacheStatus::default(),
            ruleset: RulesetStatus::default(),
            age_ms: 0,
        }
    }

    #[test]
    fn an_old_status_says_how_old() {
        let mut st = status(&[]);
        assert!(st.render().starts_with("fast path:"));
        st.age_ms = 1250;
        assert!(
            st.render()
                .starts_with("(the daemon is busy: these figures are 1250 ms old)\nfast path:")
        );
    }

    fn ppp0(pppoe: PppoeStatus, encap: Option<&str>) -> IfaceStatus {
        IfaceStatus {
            name: "ppp0".into(),
            ifindex: 12,
            role: "wan".into(),
            attach_mode: "lower".into(),
            shaped: false,
            shaped_config: "auto".into(),
            shaped_by: None,
            egress_qdisc: None,
            xdp_xmit: pppoe.session_id.is_some(),
            no_xdp_xmit_because: None,
            generic_because: None,
            bridge: None,
            fdb_entries: None,
            encap: encap.map(str::to_string),
            pppoe: Some(pppoe),
            bridge_vlans: None,
            not_accelerated_because: None,
        }
    }

    #[test]
    fn a_ppp_device_shows_its_session_or_why_it_has_none() {
        let mut st = status(&[]);
        st.interfaces.push(ppp0(
            PppoeStatus {
                session_id: Some(1),
                lower: Some("eth0".into()),
                peer_mac: Some("52:54:00:12:34:56".into()),
                not_accelerated_because: None,
            },
            Some("PPPoE session 0x0001 over eth0 (peer 52:54:00:12:34:56)"),
        ));
        let text = st.render();
        assert!(
            text.contains("ppp0         ifindex 12   role wan  xdp lower (PPPoE session 0x0001 over eth0 (peer 52:54:00:12:34:56))\n"),
            "{text}"
        );
        assert!(!text.contains("PPPoE not accelerated"), "{text}");
        st.interfaces[0] = ppp0(
            PppoeStatus {
                not_accelerated_because: Some("no PPPoE session in /proc/net/pppoe".into()),
                ..PppoeStatus::default()
            },
            None,
        );
        let text = st.render();
        assert!(
            text.contains("\n    PPPoE not accelerated: no PPPoE session in /proc/net/pppoe\n"),
            "{text}"
        );
        // JSON round trip; an older daemon's status (no `pppoe`) still parses.
        let json = serde_json::to_value(&st).unwrap();
        assert_eq!(
            json["interfaces"][0]["pppoe"]["session_id"],
            serde_json::Value::Null
        );
        let back: Status = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back.interfaces[0].pppoe, st.interfaces[0].pppoe);
        let mut old = json;
        old["interfaces"][0]
            .as_object_mut()
            .unwrap()
            .remove("pppoe");
        let back: Status = serde_json::from_value(old).unwrap();
        assert_eq!(back.interfaces[0].pppoe, None);
    }

    #[test]
    fn reasons_travel_as_their_stable_names_in_json() {
        let mut st = status(&[("wan0", "no_flow", 3, 180)]);
        st.conntrack.skipped.insert(Skip::PathNotManaged, 2);
        let json = serde_json::to_value(&st).unwrap();
        assert_eq!(json["counters"][0]["reason"], "no_flow");
        assert_eq!(json["conntrack"]["skipped"]["path_not_managed"], 2);
        let back: Status = serde_json::from_value(json).unwrap();
        assert_eq!(back.counters[0].reason, Reason::PassNoFlow);
        assert_eq!(back.conntrack.skipped[&Skip::PathNotManaged], 2);
        // A name no reason has is an error, not a silent default.
        let bad =
            serde_json::json!({"interface": "wan0", "reason": "nope", "packets": 0, "bytes": 0});
        assert!(serde_json::from_value::<CounterRow>(bad).is_err());
    }

    #[test]
    fn stats_table_orders_forwarded_first_and_hides_zeros() {
        let s = status(&[
            ("lan0", "no_flow", 5, 500),
            ("lan0", "forwarded_original", 95, 95_000),
            ("lan0", "not_ip", 0, 0),
            ("wan0", "forwarded_reply", 0, 0),
        ]);
        let out = render_stats(&s.stats_rows(None), false);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("INTERFACE"), "{out}");
        assert!(
            lines[1].contains("forwarded_original") && lines[1].contains("95000"),
            "{out}"
        );
        assert!(
            lines[2].contains("pass:no_flow") && lines[2].ends_with(" 500"),
            "{out}"
        );
        assert!(!out.contains("not_ip"), "{out}");
        assert!(
            out.contains("lan0: fast path carried 95.0% of 100 packets"),
            "{out}"
        );
        assert!(
            out.contains("wan0: fast path carried - of 0 packets"),
            "{out}"
        );
        assert!(render_stats(&s.stats_rows(None), true).contains("pass:not_ip"));
    }

    #[test]
    fn stats_rates_come_from_the_previous_sample() {
        let before = status(&[("lan0", "forwarded_original", 100, 10_000)]);
        let after = status(&[("lan0", "forwarded_original", 300, 2_010_000)]);
        let rows = after.stats_rows(Some((&before, 2.0)));
        assert_eq!(rows[0].delta_packets, Some(200));
        assert_eq!(rows[0].delta_bytes, Some(2_000_000));
        assert_eq!(rows[0].packets_per_second, Some(100.0));
        assert_eq!(rows[0].bits_per_second, Some(8_000_000.0));
        let out = render_stats(&rows, false);
        assert!(out.contains("+PACKETS") && out.contains("8.00M"), "{out}");
        assert!(out.contains("(last interval: 100.0% of 200)"), "{out}");
        // A restarted daemon (counter went backwards) counts from zero, never underflows.
        let rows = before.stats_rows(Some((&after, 1.0)));
        assert_eq!(rows[0].delta_packets, Some(100));
        // JSON without a previous sample has no rate fields.
        let json = serde_json::to_value(&before.stats_rows(None)[0]).unwrap();
        assert!(json.get("packets_per_second").is_none(), "{json}");
        assert_eq!(json["forwarded"], true);
    }

    fn flow(src: &str, dst: &str, new_src: &str, new_dst: &str) -> FlowRow {
        FlowRow {
            family: "ipv4".into(),
            ingress: "lan0".into(),
            proto: "tcp".into(),
            src: src.into(),
            dst: dst.into(),
            new_src: new_src.into(),
            new_dst: new_dst.into(),
            direction: "original".into(),
            packets: 1,
            bytes: 1,
            idle_ms: None,
        }
    }

    #[test]
    fn flow_filters_match_any_endpoint() {
        let nat = flow(
            "192.168.1.10:40000",
            "198.51.100.1:443",
            "203.0.113.5:40000",
            "198.51.100.1:443",
        );
        let mut v6 = flow(
            "[2001:db8::10]:5000",
            "[2001:db8:1::1]:53",
            "[2001:db8::10]:5000",
            "[2001:db8:1::1]:53",
        );
        v6.family = "ipv6".into();
        let f = |addr: Option<&str>, port: Option<u16>| FlowFilter {
            addr: addr.map(|a| a.parse().unwrap()),
            port,
        };
        assert!(f(None, None).matches(&nat));
        assert!(f(Some("192.168.1.10"), None).matches(&nat));
        assert!(
            f(Some("203.0.113.0/24"), None).matches(&nat),
            "rewritten source"
        );
        assert!(!f(Some("10.0.0.0/8"), None).matches(&nat));
        assert!(f(Some("0.0.0.0/0"), Some(443)).matches(&nat));
        assert!(!f(Some("192.168.1.10"), Some(80)).matches(&nat));
        assert!(
            !f(Some("0.0.0.0/0"), None).matches(&v6),
            "families never match"
        );
        assert!(f(Some("2001:db8:1::/48"), Some(53)).matches(&v6));
        assert!(f(Some("[2001:db8::10]"), None).matches(&v6));
        let flows = Flows {
            flows: vec![nat, v6],
        }
        .filtered(&f(None, Some(5000)));
        assert_eq!(flows.flows.len(), 1);
        assert_eq!(flows.flows[0].family, "ipv6");
    }

    #[test]
    fn addr_filter_rejects_garbage() {
        for bad in [
            "",
            "10.0.0.1/33",
            "2001:db8::/129",
            "host.example",
            "10.0.0/8",
            "1.2.3.4/x",
        ] {
            let e = bad.parse::<AddrFilter>().unwrap_err();
            assert!(e.contains("not an IP address"), "{bad}: {e}");
        }
    }
}
