//! Rules that must see every packet: what the firewall ruleset holds that the fast path cannot
//! follow, and whether flows stay in the kernel because of it.
//!
//! Arming assumes a flow's verdict changes only with the ruleset. Some matches and targets keep
//! state per packet instead: a rate limit (`limit`, `hashlimit`, meters) or a quota counts the
//! packets it sees, `connbytes` reads conntrack's counters (which miss what XDP forwards),
//! `statistic` / `numgen` pick every n-th packet, `recent` and sets updated from the packet
//! path remember when an address was last seen, `NFQUEUE` / `queue` hand every packet to a
//! program (an IDS), `LOG` / `NFLOG` / `log` record it, `TEE` / `dup` copy it, and a match on
//! a packet's length, TCP flags, DSCP, TTL or payload gives each packet its own verdict. In a chain that
//! established forwarded packets traverse (the `prerouting`, `forward` and `postrouting` hooks
//! of the raw, mangle, filter and security tables; nat chains see only a connection's first
//! packet), such a rule would see a fast-pathed flow's first packet and nothing after it. The
//! daemon finds them (`sync::per_packet` reads the ruleset) and, unless the config says
//! `per_packet_rules = "ignore"`, keeps every flow in the kernel while one that a packet of an
//! established connection can reach exists ([`super::rule_reach`]: a rule after
//! `ct state established,related accept`, or one that matches `ct state new` only, holds
//! nothing). A rule whose tests before what it does per packet include flow-constant ones
//! (protocol, ports, addresses: [`super::flow_match`]) holds only the connections those tests
//! can match ([`held_flows`]); one without holds every flow ([`hold`]).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{
    dscp_rewrite::DscpRewrites,
    flow_match::FlowMatch,
    rule_origin::{RuleOrigin, RulePlace},
    rule_reach::NotHeld,
    verdict_expiry::ExpiringRule,
};

/// What a rule does per packet that XDP cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PerPacketKind {
    /// `-m limit`, nft `limit`: a token bucket over the packets it sees.
    Limit,
    /// `-m hashlimit`: token buckets per address/port.
    Hashlimit,
    /// `-m quota`, nft `quota`: a byte budget.
    Quota,
    /// `-m connbytes`, nft `ct bytes` / `ct packets` / `ct avgpkt`: conntrack's counters, which
    /// do not include fast-path packets.
    Connbytes,
    /// `-m connlimit`, nft `ct count`.
    Connlimit,
    /// `-m statistic`, nft `numgen`: every n-th or a random share of packets.
    Statistic,
    /// `-m recent`: when an address was last seen.
    Recent,
    /// `-j NFQUEUE`, nft `queue`: every packet to a user-space program.
    Queue,
    /// `-j LOG`, `-j NFLOG`, nft `log`: a log line or an NFLOG message per packet.
    Log,
    /// nft `meter`: a dynamic set with a statement per element.
    Meter,
    /// nft `add @set` / `update @set` (and maps): a set updated from the packet path.
    SetUpdate,
    /// `-j TEE`, nft `dup`: a copy of every packet.
    Dup,
    /// A match on what can differ between two packets of one flow: a length (`-m length`,
    /// `meta length`), TCP flags other than a SYN/FIN/RST test, the DSCP, TTL or another
    /// header field, options, payload bytes (`-m string`, `-m u32`): its verdict can change
    /// from one packet to the next, which arming (one kernel verdict per direction) cannot
    /// follow.
    ContentMatch,
}

impl PerPacketKind {
    /// Every kind (the metrics export one series each).
    pub const ALL: [PerPacketKind; 13] = [
        PerPacketKind::Limit,
        PerPacketKind::Hashlimit,
        PerPacketKind::Quota,
        PerPacketKind::Connbytes,
        PerPacketKind::Connlimit,
        PerPacketKind::Statistic,
        PerPacketKind::Recent,
        PerPacketKind::Queue,
        PerPacketKind::Log,
        PerPacketKind::Meter,
        PerPacketKind::SetUpdate,
        PerPacketKind::Dup,
        PerPacketKind::ContentMatch,
    ];

    /// Stable name for status, logs and the metrics' `kind` label.
    pub fn name(self) -> &'static str {
        match self {
            PerPacketKind::Limit => "limit",
            PerPacketKind::Hashlimit => "hashlimit",
            PerPacketKind::Quota => "quota",
            PerPacketKind::Connbytes => "connbytes",
            PerPacketKind::Connlimit => "connlimit",
            PerPacketKind::Statistic => "statistic",
            PerPacketKind::Recent => "recent",
            PerPacketKind::Queue => "queue",
            PerPacketKind::Log => "log",
            PerPacketKind::Meter => "meter",
            PerPacketKind::SetUpdate => "set_update",
            PerPacketKind::Dup => "dup",
            PerPacketKind::ContentMatch => "content_match",
        }
    }

    /// The kind of an iptables match or target (`-m NAME`, `-j NAME`; the `xt` expressions of
    /// iptables-nft), if it is one.
    pub fn of_xtables(name: &str) -> Option<PerPacketKind> {
        Some(match name {
            "limit" => PerPacketKind::Limit,
            "hashlimit" => PerPacketKind::Hashlimit,
            "quota" | "quota2" => PerPacketKind::Quota,
            "connbytes" => PerPacketKind::Connbytes,
            "connlimit" => PerPacketKind::Connlimit,
            "statistic" => PerPacketKind::Statistic,
            "recent" => PerPacketKind::Recent,
            "NFQUEUE" | "QUEUE" => PerPacketKind::Queue,
            "LOG" | "NFLOG" | "ULOG" => PerPacketKind::Log,
            "TEE" => PerPacketKind::Dup,
            _ => return None,
        })
    }
}

impl fmt::Display for PerPacketKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One rule that must see every packet, where an admin finds it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PerPacketRule {
    pub origin: RuleOrigin,
    /// The table (`filter`, `mangle`, an nftables table's name).
    pub table: String,
    /// The chain (`FORWARD`, or a chain jumped to from one that established packets
    /// traverse).
    pub chain: String,
    /// 1-based position in the chain, as `iptables -L --line-numbers` counts (nftables: the
    /// n-th rule of the chain as `nft list chain` lists it).
    pub position: u32,
    /// What it does per packet (at least one, sorted, no duplicates).
    pub kinds: Vec<PerPacketKind>,
    /// Why no packet of an established connection reaches what it does per packet; `None`: one
    /// may, and the rule holds flows (what every rule did before this was read).
    #[serde(default)]
    pub not_held_because: Option<NotHeld>,
    /// The connections it can do something per packet for (every one when nothing narrows
    /// it).
    #[serde(default, skip_serializing_if = "FlowMatch::is_every_flow")]
    pub flows: FlowMatch,
    /// In `status` only: how many connections it holds in the kernel now, for a narrowed rule
    /// that holds flows while the others are offloaded (`None` in a read of the ruleset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_connections: Option<u64>,
}

impl PerPacketRule {
    /// Where it is: `ip filter FORWARD rule 1`.
    pub fn place(&self) -> RulePlace {
        RulePlace {
            origin: self.origin,
            table: self.table.clone(),
            chain: self.chain.clone(),
            position: self.position,
        }
    }

    /// Whether it holds flows in the kernel.
    pub fn holds(&self) -> bool {
        self.not_held_because.is_none()
    }
}

impl fmt::Display for PerPacketRule {
    /// `ip filter FORWARD rule 1 uses hashlimit`, `… uses log on l4proto tcp dport 22`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kinds: Vec<&str> = self.kinds.iter().map(|k| k.name()).collect();
        write!(f, "{} uses {}", self.place(), kinds.join(" and "))?;
        if !self.flows.is_every_flow() {
            write!(f, " on {}", self.flows)?;
        }
        Ok(())
    }
}

/// What one read of the ruleset found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PerPacketRules {
    /// The rules that must see every packet, in ruleset order.
    pub rules: Vec<PerPacketRule>,
    /// Why a part of the ruleset could not be read (one line each: `nft` missing, a legacy
    /// table iptables-legacy-save cannot list, output that does not parse). A ruleset that
    /// cannot be read may hold such rules: it holds flows like one that does.
    pub unreadable: Vec<String>,
    /// The DSCP rewrites found in the same read (see [`super::dscp_rewrite`]).
    pub dscp: DscpRewrites,
    /// Parts of the ruleset read without all their options (one line each: iptables-nft's
    /// conntrack matches when `iptables-nft-save` cannot list them): the rules behind them are
    /// taken as reachable.
    pub unproven: Vec<String>,
    /// The rules with a match whose answer can change without a ruleset change, found by the
    /// same walk (see [`super::verdict_expiry`]).
    #[serde(default)]
    pub expiring: Vec<ExpiringRule>,
}

/// `per_packet_rules` in the config: what the daemon does about such rules.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PerPacketMode {
    /// Keep the connections such a rule can match in the kernel (every flow for a rule that
    /// nothing narrows, or while the ruleset cannot be read): the rules see every packet of
    /// them, as without the fast path.
    #[default]
    Hold,
    /// Fast-path flows anyway: such rules see only the packets the kernel still carries (a
    /// connection's first packets, and one per direction after each ruleset change and each
    /// verdict age), as with the kernel's own flowtable offload. Listed in `status`, nothing
    /// held.
    Ignore,
}

impl PerPacketMode {
    /// As written in the config.
    pub fn name(self) -> &'static str {
        match self {
            PerPacketMode::Hold => "hold",
            PerPacketMode::Ignore => "ignore",
        }
    }
}

/// Whether the datapath must send every packet to the kernel, for `found` under `mode`: a rule
/// that nothing narrows holds flows, or the ruleset could not be read.
pub fn hold(mode: PerPacketMode, found: &PerPacketRules) -> bool {
    mode == PerPacketMode::Hold
        && (found
            .rules
            .iter()
            .any(|r| r.holds() && r.flows.is_every_flow())
            || !found.unreadable.is_empty())
}

/// The connections the narrowed rules that hold flows can match, for `found` under `mode`
/// (none when [`hold`] holds everything anyway): each such connection stays in the kernel.
pub fn held_flows(mode: PerPacketMode, found: &PerPacketRules) -> Vec<FlowMatch> {
    if mode != PerPacketMode::Hold || hold(mode, found) {
        return vec![];
    }
    let mut held: Vec<FlowMatch> = found
        .rules
        .iter()
        .filter(|r| r.holds())
        .map(|r| r.flows.clone())
        .collect();
    held.sort();
    held.dedup();
    held
}

/// How many of `rules` use each kind, for every kind (zeros included).
pub fn count_by_kind(rules: &[PerPacketRule]) -> Vec<(PerPacketKind, u64)> {
    PerPacketKind::ALL
        .iter()
        .map(|k| {
            let n = rules.iter().filter(|r| r.kinds.contains(k)).count();
            (*k, n as u64)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flows::rule_reach::CtState;

    fn rule(kinds: Vec<PerPacketKind>) -> PerPacketRule {
        PerPacketRule {
            origin: RuleOrigin::NftIp,
            table: "filter".into(),
            chain: "FORWARD".into(),
            position: 1,
            kinds,
            not_held_because: None,
            flows: FlowMatch::default(),
            held_connections: None,
        }
    }

    #[test]
    fn held_while_a_rule_exists_or_the_ruleset_is_unreadable_unless_ignored() {
        let none = PerPacketRules::default();
        let one = PerPacketRules {
            rules: vec![rule(vec![PerPacketKind::Hashlimit])],
            ..Default::default()
        };
        let blind = PerPacketRules {
            rules: vec![],
            unreadable: vec!["nft: not found".into()],
            ..Default::default()
        };
        assert!(!hold(PerPacketMode::Hold, &none));
        assert!(hold(PerPacketMode::Hold, &one));
        assert!(hold(PerPacketMode::Hold, &blind));
        for f in [&none, &one, &blind] {
            assert!(!hold(PerPacketMode::Ignore, f));
        }
        // A rule no established packet reaches holds nothing.
        let mut unreached = one.clone();
        unreached.rules[0].not_held_because = Some(NotHeld::CtState {
            states: [CtState::New].into_iter().collect(),
        });
        assert!(!hold(PerPacketMode::Hold, &unreached));
        unreached.rules.push(rule(vec![PerPacketKind::Log]));
        assert!(hold(PerPacketMode::Hold, &unreached));
    }

    /// A status written before rules carried `not_held_because` reads as "holds".
    #[test]
    fn a_rule_without_the_reason_field_holds() {
        let old = r#"{"origin": "nft_ip", "table": "filter", "chain": "FORWARD",
                      "position": 3, "kinds": ["log"]}"#;
        let r: PerPacketRule = serde_json::from_str(old).unwrap();
        assert!(r.holds());
        assert_eq!(r.to_string(), "ip filter FORWARD rule 3 uses log");
    }

    #[test]
    fn a_rule_reads_as_an_admin_finds_it() {
        assert_eq!(
            rule(vec![PerPacketKind::Hashlimit]).to_string(),
            "ip filter FORWARD rule 1 uses hashlimit"
        );
        let mut r = rule(vec![PerPacketKind::Limit, PerPacketKind::Log]);
        r.origin = RuleOrigin::LegacyIpv6;
        r.position = 4;
        assert_eq!(
            r.to_string(),
            "ip6tables-legacy filter FORWARD rule 4 uses limit and log"
        );
    }

    #[test]
    fn every_kind_is_counted_and_names_are_unique() {
        let rules = [
            rule(vec![PerPacketKind::Limit, PerPacketKind::Log]),
            rule(vec![PerPacketKind::Log]),
        ];
        let counts = count_by_kind(&rules);
        assert_eq!(counts.len(), PerPacketKind::ALL.len());
        let get = |k| counts.iter().find(|(c, _)| *c == k).unwrap().1;
        assert_eq!(get(PerPacketKind::Log), 2);
        assert_eq!(get(PerPacketKind::Limit), 1);
        assert_eq!(get(PerPacketKind::Quota), 0);
        let mut names: Vec<_> = PerPacketKind::ALL.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), PerPacketKind::ALL.len());
        assert_eq!(
            PerPacketKind::of_xtables("NFQUEUE"),
            Some(PerPacketKind::Queue)
        );
        assert_eq!(PerPacketKind::of_xtables("conntrack"), None);
    }
}
