//! What the tests read off the router: `status --json` (the fields the tests use), counter
//! snapshots, and the FORWARD chain's packet counters.

use serde::Deserialize;
use xdp_routerd::kernel_features::{Feature, KernelFeatures};

use crate::netns::{Netns, degraded};

use super::addrs::{LAN_IF, WAN_IF};

/// Packet count of the FORWARD path's `ESTABLISHED,RELATED` rule (`iptables -vnxL`): in
/// FORWARD itself, or in a chain FORWARD jumps to (ufw's `ufw-before-forward`).
pub fn established_packets(ns: &Netns, iptables: &str) -> u64 {
    find_established(ns, iptables, "FORWARD", 2).unwrap_or_else(|| {
        let out = ns.exec_ok(iptables, &["-w", "-vnxL", "FORWARD"]);
        panic!("no ESTABLISHED rule on the FORWARD path of {iptables}:\n{out}")
    })
}

/// The first `ESTABLISHED` rule's packets in `chain` or, `depth` jumps deep, the chains its
/// rules jump to, in rule order.
fn find_established(ns: &Netns, iptables: &str, chain: &str, depth: u32) -> Option<u64> {
    let out = ns.exec(iptables, &["-w", "-vnxL", chain]);
    if !out.status.success() {
        return None;
    }
    let listing = String::from_utf8_lossy(&out.stdout);
    if let Some(n) = parse_established(&listing) {
        return Some(n);
    }
    if depth == 0 {
        return None;
    }
    rule_targets(&listing)
        .into_iter()
        .find_map(|t| find_established(ns, iptables, t, depth - 1))
}

/// The target column of every rule in `iptables -vnxL CHAIN` output, but the verdicts.
pub fn rule_targets(listing: &str) -> Vec<&str> {
    listing
        .lines()
        .skip(2)
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|t| !matches!(*t, "ACCEPT" | "DROP" | "REJECT" | "RETURN" | "LOG"))
        .collect()
}

/// Packets the rule at `position` (1-based) of `chain` in `table` counted
/// (`iptables -t TABLE -vnxL CHAIN --line-numbers`).
pub fn rule_packets(ns: &Netns, iptables: &str, table: &str, chain: &str, position: u32) -> u64 {
    let out = ns.exec_ok(
        iptables,
        &["-w", "-t", table, "-vnxL", chain, "--line-numbers"],
    );
    parse_rule_packets(&out, position)
        .unwrap_or_else(|| panic!("no rule {position} in {iptables} -t {table} {chain}:\n{out}"))
}

/// The pkts column of rule `position` in `iptables -vnxL CHAIN --line-numbers` output.
pub fn parse_rule_packets(listing: &str, position: u32) -> Option<u64> {
    listing.lines().skip(2).find_map(|l| {
        let mut cols = l.split_whitespace();
        let num: u32 = cols.next()?.parse().ok()?;
        (num == position).then(|| cols.next()?.parse().ok())?
    })
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
    /// Rules that must see every packet.
    #[serde(default)]
    pub per_packet: PerPacketSummary,
    /// The optional kernel features the datapath was loaded for.
    #[serde(default = "KernelFeatures::all_available")]
    pub kernel: KernelFeatures,
}

/// The `per_packet` object of `status --json`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PerPacketSummary {
    /// `per_packet_rules`: `hold` or `ignore`.
    pub mode: String,
    /// Every packet goes to the kernel now.
    pub held: bool,
    /// Connections a narrowed rule holds in the kernel.
    #[serde(default)]
    pub held_connections: u64,
    /// A ruleset change has not been read yet.
    pub reading: bool,
    /// The rules found, with what they do per packet (`kinds`: `hashlimit`, `quota`, …).
    pub rules: Vec<PerPacketRuleSummary>,
    /// Why a part of the ruleset could not be read.
    pub unreadable: Vec<String>,
}

/// One rule of [`PerPacketSummary::rules`].
#[derive(Debug, Clone, Deserialize)]
pub struct PerPacketRuleSummary {
    /// `nft_ip`, `nft_ip6`, `nft_inet`, `legacy_ipv4`, …
    #[serde(default)]
    pub origin: String,
    /// Table (`filter`).
    pub table: String,
    /// Chain (`FORWARD`).
    pub chain: String,
    /// 1-based position in the chain.
    pub position: u32,
    /// What it does per packet.
    pub kinds: Vec<String>,
    /// Why it holds no flow (`{"why": "after_verdict", …}`); null while it holds flows.
    #[serde(default)]
    pub not_held_because: Option<serde_json::Value>,
    /// The connections it can match (`{"terms": […]}`), absent when it can match every one.
    #[serde(default)]
    pub flows: Option<serde_json::Value>,
    /// How many connections it holds in the kernel (a narrowed rule while the others are
    /// offloaded).
    #[serde(default)]
    pub held_connections: Option<u64>,
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
    /// `verdict_max_age_ms` (0 = verdicts kept until the ruleset changes).
    pub verdict_max_age_ms: u64,
    /// Whether verdicts expire at that age now (a rule established packets reach can change
    /// its answer without a ruleset change), or hold until the ruleset changes.
    pub verdicts_expire: bool,
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
    /// TCP connections found at start that the keep-alive marked "be liberal" once they
    /// carried traffic.
    #[serde(default)]
    pub joined_on_traffic: u64,
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
    /// Why it runs the datapath it runs (the config setting, and for `auto` what decided).
    #[serde(default)]
    pub datapath_because: Option<String>,
    /// The TC fast path runs behind native XDP here (hand-over to ports without XDP transmit).
    #[serde(default)]
    pub tc_handoff: bool,
    /// How its TC programs are attached: `tcx` or `classic tc` (null when it has none).
    #[serde(default)]
    pub tc_hook: Option<String>,
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
    /// The row of the managed interface `name`; panics (naming the rows there are) when
    /// `status` lists none.
    pub fn iface(&self, name: &str) -> &IfaceStatus {
        self.interfaces
            .iter()
            .find(|i| i.name == name)
            .unwrap_or_else(|| panic!("status lists no interface {name}: {:?}", self.interfaces))
    }

    /// Packets counted under `reason` on ingress interface `iface`; panics when the row is
    /// missing (a renamed reason must not read as zero).
    pub fn packets(&self, iface: &str, reason: &str) -> u64 {
        self.counters
            .iter()
            .find(|r| r.interface == iface && r.reason == reason)
            .map(|r| r.packets)
            .unwrap_or_else(|| panic!("status has no counter row ({iface}, {reason}): {self:?}"))
    }

    /// Says (a `DEGRADED` note, see [`degraded`]) that `test` checks the hand-over to the TC
    /// program behind XDP without its mark, where this kernel has no XDP metadata and some
    /// interface runs the hand-over.
    pub fn note_unmarked_handoff(&self, test: &str) {
        if !self.kernel.usable(Feature::XdpMetadata) && self.interfaces.iter().any(|i| i.tc_handoff)
        {
            degraded(
                test,
                "this kernel refuses XDP metadata to XDP programs: the hand-over from XDP to \
                 the TC program behind it runs without its mark (checked here)",
            );
        }
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
    /// rx_packets of the router's LAN wire device ([`Testbed::lan_wire`]).
    pub rx_lan: u64,
    /// rx_packets of the router's WAN wire device ([`Testbed::wan_wire`]).
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

    /// Every daemon counter that grew since `earlier`, as `interface/reason +N` (for failure
    /// messages: where the packets went).
    pub fn grown_since(&self, earlier: &Snapshot) -> String {
        let grown: Vec<String> = self
            .status
            .counters
            .iter()
            .filter_map(|r| {
                let before = earlier
                    .status
                    .counters
                    .iter()
                    .find(|e| e.interface == r.interface && e.reason == r.reason)
                    .map_or(0, |e| e.packets);
                let n = r.packets.saturating_sub(before);
                (n > 0).then(|| format!("{}/{} +{n}", r.interface, r.reason))
            })
            .collect();
        grown.join(", ")
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
    fn rule_counters_and_jump_targets_are_parsed() {
        let ufw = "Chain FORWARD (policy DROP 0 packets, 0 bytes)
num      pkts      bytes target     prot opt in     out     source               destination
1          10       1000 ufw-before-logging-forward  all  --  *      *       0.0.0.0/0            0.0.0.0/0
2          10       1000 ufw-before-forward  all  --  *      *       0.0.0.0/0            0.0.0.0/0
3           0          0 LOG        all  --  *      *       0.0.0.0/0            0.0.0.0/0            LOG flags 0 level 4 prefix \"drop: \"
";
        assert_eq!(parse_rule_packets(ufw, 2), Some(10));
        assert_eq!(parse_rule_packets(ufw, 3), Some(0));
        assert_eq!(parse_rule_packets(ufw, 4), None);
        let plain = ufw
            .replace("num ", "")
            .replace("\n1 ", "\n")
            .replace("\n2 ", "\n")
            .replace("\n3 ", "\n");
        assert_eq!(
            rule_targets(&plain),
            vec!["ufw-before-logging-forward", "ufw-before-forward"]
        );
    }

    #[test]
    fn fraction_handles_zero_wire_packets() {
        assert_eq!(fastpath_fraction(0, 0), 0.0);
        assert!((fastpath_fraction(9, 10) - 0.9).abs() < 1e-9);
    }
}
