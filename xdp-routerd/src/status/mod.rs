//! What `xdp-routerd status` and `xdp-routerd flows` show: the JSON shapes (a stable interface
//! for scripts and tests) and their human-readable rendering.
//!
//! This file holds the JSON shapes; `render` prints `status` and `flows`, `stats` builds and
//! prints the `stats` table, `filter` selects the rows `flows --addr/--port` shows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use xdp_router_common::Reason;

use crate::{
    datapath,
    flows::{
        Skip,
        accounting::Traffic,
        dscp_rewrite::DscpBlocker,
        per_packet::{PerPacketMode, PerPacketRule},
        rule_origin::RulePlace,
        verdict_expiry::{self, ExpiringRule},
    },
    kernel_features::KernelFeatures,
};

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
    /// Rules that must see every packet, and whether they hold every packet in the kernel.
    #[serde(default)]
    pub per_packet: PerPacketStatus,
    /// The optional kernel features the datapath was loaded for.
    #[serde(default = "KernelFeatures::all_available")]
    pub kernel: KernelFeatures,
}

/// Rules in the firewall ruleset that must see every packet (`per_packet_rules`; see
/// [`crate::flows::per_packet`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PerPacketStatus {
    /// `per_packet_rules` from the config.
    pub mode: PerPacketMode,
    /// Every packet goes to the kernel now (`per_packet_rule_in_ruleset`): such a rule holds
    /// flows or the ruleset could not be read (under `hold`), or a change is being read.
    pub held: bool,
    /// Connections held in the kernel because a narrowed rule can match them (at most the
    /// parked ones, see [`crate::flows::Skip::HeldByRule`]).
    #[serde(default)]
    pub held_connections: u64,
    /// A ruleset change has not been read yet (held meanwhile under `hold`).
    pub reading: bool,
    /// The rules found, in ruleset order, each with why it holds no flow where it does not.
    pub rules: Vec<PerPacketRule>,
    /// Why a part of the ruleset could not be read.
    pub unreadable: Vec<String>,
    /// Parts of the ruleset read without all their options (rules behind them are taken as
    /// reachable).
    #[serde(default)]
    pub unproven: Vec<String>,
    /// DSCP rewrites, found in the same read.
    #[serde(default)]
    pub dscp_rewrite: DscpRewriteStatus,
    /// The rules with a match whose answer can change without a ruleset change, each with why
    /// established packets do not reach it where they do not (see
    /// [`crate::flows::verdict_expiry`]).
    #[serde(default)]
    pub expiring: Vec<ExpiringRule>,
}

impl PerPacketStatus {
    /// Why kernel verdicts expire now (see [`verdict_expiry::why_verdicts_expire`]); `None`
    /// when they hold until the ruleset changes, or before the first read.
    pub fn why_verdicts_expire(&self) -> Option<String> {
        verdict_expiry::why_verdicts_expire(&self.expiring, &self.unreadable)
    }
}

/// DSCP rewrites in the ruleset, and whether the fast path applies them (see
/// [`crate::flows::dscp_rewrite`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DscpRewriteStatus {
    /// XDP sets the DSCP the kernel was seen setting (`SETTINGS_F_DSCP_REWRITE`).
    pub fast_path: bool,
    /// The rules that set a DSCP.
    pub setters: Vec<RulePlace>,
    /// Why such a rewrite may differ between packets of one flow, if it may.
    pub blocker: Option<DscpBlocker>,
}

impl DscpRewriteStatus {
    /// `status`'s line: `dscp rewrites: applied by the fast path (inet mangle fwd rule 3)` or
    /// `… left to the kernel: <why>`; `None` when the ruleset sets no DSCP.
    pub fn line(&self) -> Option<String> {
        if self.setters.is_empty() {
            return None;
        }
        let rules: Vec<String> = self.setters.iter().map(ToString::to_string).collect();
        Some(match (&self.blocker, self.fast_path) {
            (_, true) => format!(
                "dscp rewrites: applied by the fast path ({})",
                rules.join(", ")
            ),
            (Some(b), false) => format!(
                "dscp rewrites: left to the kernel, {b} ({})",
                rules.join(", ")
            ),
            (None, false) => format!(
                "dscp rewrites: left to the kernel until the ruleset is read ({})",
                rules.join(", ")
            ),
        })
    }
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
    /// How long a flow direction is forwarded after the kernel last forwarded it, in ms
    /// (`verdict_max_age_ms`); 0 = until the ruleset changes.
    #[serde(default)]
    pub verdict_max_age_ms: u64,
    /// Whether verdicts expire at that age now, or hold until the ruleset changes because no
    /// rule established packets reach can change its answer without one (see
    /// [`crate::flows::verdict_expiry`]).
    #[serde(default = "expire_by_default")]
    pub verdicts_expire: bool,
}

fn expire_by_default() -> bool {
    true
}

impl From<datapath::Ruleset> for RulesetStatus {
    fn from(r: datapath::Ruleset) -> Self {
        RulesetStatus {
            generation: r.generation,
            changes: r.changes,
            armed_interfaces: r.armed_interfaces,
            fib_mark: r.fib_mark,
            verdict_max_age_ms: r.verdict_max_age_ms,
            verdicts_expire: r.verdicts_expire,
        }
    }
}

impl PerPacketStatus {
    /// `status`'s line: `held in the kernel: ip filter FORWARD rule 1 uses hashlimit, …`;
    /// `None` when there is nothing to say (no rule that holds flows, nothing held).
    pub fn line(&self) -> Option<String> {
        let mut what: Vec<String> = self
            .rules
            .iter()
            .filter(|r| r.holds())
            .map(|r| match r.held_connections {
                Some(n) => format!("{r} ({n} held)"),
                None => r.to_string(),
            })
            .collect();
        what.extend(
            self.unreadable
                .iter()
                .map(|u| format!("the ruleset cannot be read ({u})")),
        );
        if what.is_empty() && self.reading && self.held {
            what.push("reading the ruleset after a change".into());
        }
        if what.is_empty() {
            return None;
        }
        Some(match (self.mode, self.held) {
            (PerPacketMode::Ignore, _) => format!(
                "not held (per_packet_rules = \"ignore\"), seeing only the packets the kernel carries: {}",
                what.join(", ")
            ),
            (PerPacketMode::Hold, true) => format!("held in the kernel: {}", what.join(", ")),
            // Every rule that holds flows is narrowed: only the connections they can match.
            (PerPacketMode::Hold, false)
                if self.unreadable.is_empty()
                    && self
                        .rules
                        .iter()
                        .all(|r| !r.holds() || !r.flows.is_every_flow()) =>
            {
                format!(
                    "{} connection(s) held in the kernel, the ones these rules can match: {}",
                    self.held_connections,
                    what.join(", ")
                )
            }
            (PerPacketMode::Hold, false) => {
                format!("to be held in the kernel: {}", what.join(", "))
            }
        })
    }

    /// `status`'s line for the rules that hold no flow, each with why: `not holding flows: ip
    /// filter FORWARD rule 3 uses log (after an established accept at ip filter FORWARD rule
    /// 1)`; and for the parts of the ruleset read without all their options. `None` when there
    /// are neither.
    pub fn not_held_line(&self) -> Option<String> {
        let rules: Vec<String> = self
            .rules
            .iter()
            .filter_map(|r| Some(format!("{r} ({})", r.not_held_because.as_ref()?)))
            .collect();
        let mut parts = Vec::new();
        if !rules.is_empty() {
            parts.push(format!("not holding flows: {}", rules.join(", ")));
        }
        if !self.unproven.is_empty() {
            parts.push(format!("taken as reachable: {}", self.unproven.join(", ")));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
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
    /// `native`, `generic` (XDP), `tc` (the TC fast path instead of XDP), `ports` (a bridge),
    /// `lower` (a PPP device), or `detached` (interface missing).
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
    /// neither XDP nor GRO; packets routed out of it are counted `egress_no_xdp_xmit`, or handed
    /// to the TC fast path where it runs behind XDP (`tc_handoff`).
    #[serde(default)]
    pub xdp_xmit: bool,
    /// Why `xdp_xmit` is false (null when true or the interface is missing).
    #[serde(default)]
    pub no_xdp_xmit_because: Option<String>,
    /// Why the interface runs the datapath it runs (`attach_mode` `tc`, or an XDP mode): the
    /// config setting that chose it, or that it has no link-layer header (always TC). Null
    /// when not attached itself (a bridge's ports, a PPP device's lower device carry the
    /// program).
    #[serde(default)]
    pub datapath_because: Option<String>,
    /// The TC fast path also runs behind native XDP here, for the packets XDP cannot redirect
    /// (routed out of a port without XDP transmit, e.g. one on the TC datapath).
    #[serde(default)]
    pub tc_handoff: bool,
    /// How the TC programs are attached here (the arming program, the TC fast path): `tcx`
    /// (TCX links, Linux 6.6) or `classic tc` (clsact + cls_bpf filters, inert once the daemon
    /// is gone); null when none is.
    #[serde(default)]
    pub tc_hook: Option<String>,
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
    /// Connections found in conntrack at start that the keep-alive took in once they carried
    /// traffic (a TCP one marked "be liberal"), after which the kernel may arm them.
    #[serde(default)]
    pub joined_on_traffic: u64,
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

/// One offloaded flow direction (`flows --json`). Bytes are IP bytes (each packet's datagram
/// length), conntrack's unit.
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
    /// Packets the fast path forwarded (since the connection was first offloaded).
    pub packets: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Conntrack's own counter of this direction (`nf_conntrack_acct`): what the kernel
    /// forwarded, including every packet the fast path passed to it, and nothing the fast path
    /// forwarded. Null when conntrack has no counters (see [`Flows::conntrack_note`]).
    #[serde(default)]
    pub conntrack: Option<Traffic>,
    /// Fast path + conntrack: what `conntrack -L` would show without the fast path.
    #[serde(default)]
    pub total: Traffic,
    /// Milliseconds since the fast path last forwarded a packet of it; null if never.
    pub idle_ms: Option<u64>,
    /// A connection found in conntrack at the daemon's start that has not carried traffic
    /// since: the kernel forwards it until the keep-alive takes it in (a pass after its first
    /// packet; a TCP one is marked "be liberal" then).
    #[serde(default)]
    pub awaiting_traffic: bool,
}

/// `flows --json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Flows {
    pub flows: Vec<FlowRow>,
    /// Why the rows have no conntrack counters (accounting off, dump failed); null when they
    /// have them.
    #[serde(default)]
    pub conntrack_note: Option<String>,
}

mod filter;
mod render;
mod stats;

pub use filter::{AddrFilter, FlowFilter};
pub use stats::{StatsRow, render_stats};

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn status(counters: &[(&str, &str, u64, u64)]) -> Status {
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
            per_packet: PerPacketStatus::default(),
            kernel: KernelFeatures::all_available(),
        }
    }

    #[test]
    fn the_per_packet_line_names_the_rules_and_what_is_done_about_them() {
        use crate::flows::{
            per_packet::PerPacketKind,
            rule_origin::RuleOrigin,
            rule_reach::{EstablishedVerdict, NotHeld},
        };
        let mut p = PerPacketStatus::default();
        assert_eq!(p.line(), None, "nothing found, nothing held");
        p.held = true;
        p.reading = true;
        assert_eq!(
            p.line().as_deref(),
            Some("held in the kernel: reading the ruleset after a change")
        );
        p.reading = false;
        p.rules.push(PerPacketRule {
            origin: RuleOrigin::NftIp,
            table: "filter".into(),
            chain: "FORWARD".into(),
            position: 1,
            kinds: vec![PerPacketKind::Hashlimit],
            flows: Default::default(),
            not_held_because: None,
            held_connections: None,
        });
        assert_eq!(
            p.line().as_deref(),
            Some("held in the kernel: ip filter FORWARD rule 1 uses hashlimit")
        );
        assert_eq!(p.not_held_line(), None);
        // A rule after the established accept is named on the other line, with why.
        p.rules.push(PerPacketRule {
            origin: RuleOrigin::NftIp,
            table: "filter".into(),
            chain: "FORWARD".into(),
            position: 3,
            kinds: vec![PerPacketKind::Log],
            flows: Default::default(),
            not_held_because: Some(NotHeld::AfterVerdict {
                verdict: EstablishedVerdict::Accept,
                at: crate::flows::rule_origin::RulePlace {
                    origin: RuleOrigin::NftIp,
                    table: "filter".into(),
                    chain: "FORWARD".into(),
                    position: 2,
                },
            }),
            held_connections: None,
        });
        assert_eq!(
            p.line().as_deref(),
            Some("held in the kernel: ip filter FORWARD rule 1 uses hashlimit")
        );
        assert_eq!(
            p.not_held_line().as_deref(),
            Some(
                "not holding flows: ip filter FORWARD rule 3 uses log (after an established \
                 accept at ip filter FORWARD rule 2)"
            )
        );
        p.rules.remove(0);
        assert_eq!(p.line(), None, "no rule holds flows");
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(
            json["rules"][0]["not_held_because"]["why"], "after_verdict",
            "{json}"
        );
        // A status without the new fields (an older daemon) still reads, every rule holding.
        let mut old = json.clone();
        old.as_object_mut().unwrap().remove("unproven");
        old["rules"][0]
            .as_object_mut()
            .unwrap()
            .remove("not_held_because");
        let back: PerPacketStatus = serde_json::from_value(old).unwrap();
        assert!(back.rules[0].holds());
        p.rules.clear();
        p.unreadable
            .push("cannot run `nft`: No such file or directory".into());
        assert_eq!(
            p.line().as_deref(),
            Some(
                "held in the kernel: the ruleset cannot be read (cannot run `nft`: No such file or directory)"
            )
        );
        p.mode = PerPacketMode::Ignore;
        p.held = false;
        assert!(
            p.line()
                .unwrap()
                .starts_with("not held (per_packet_rules = \"ignore\")")
        );
        let json = serde_json::to_string(&p).unwrap();
        assert!(json.contains(r#""mode":"ignore""#), "{json}");
    }

    #[test]
    fn the_per_packet_line_says_how_many_connections_each_narrowed_rule_holds() {
        use crate::flows::{
            flow_match::{FlowMatch, FlowTerm, Side},
            per_packet::PerPacketKind,
            rule_origin::RuleOrigin,
        };
        let rule = |position, port, held| PerPacketRule {
            origin: RuleOrigin::NftIp,
            table: "filter".into(),
            chain: "FORWARD".into(),
            position,
            kinds: vec![PerPacketKind::Hashlimit],
            flows: FlowMatch {
                terms: vec![
                    FlowTerm::Proto {
                        protos: vec![17],
                        negated: false,
                    },
                    FlowTerm::Port {
                        side: Side::Destination,
                        ranges: vec![(port, port)],
                        negated: false,
                    },
                ],
            },
            not_held_because: None,
            held_connections: Some(held),
        };
        let p = PerPacketStatus {
            held_connections: 3,
            rules: vec![rule(1, 6111, 1), rule(2, 53, 2)],
            ..PerPacketStatus::default()
        };
        assert_eq!(
            p.line().as_deref(),
            Some(
                "3 connection(s) held in the kernel, the ones these rules can match: ip filter \
                 FORWARD rule 1 uses hashlimit on l4proto udp dport 6111 (1 held), ip filter \
                 FORWARD rule 2 uses hashlimit on l4proto udp dport 53 (2 held)"
            )
        );
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["rules"][1]["held_connections"], 2, "{json}");
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
}
