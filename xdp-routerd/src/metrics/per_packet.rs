//! Firewall rules that must see every packet (`per_packet_rules`): how many of each kind the
//! ruleset has, and whether they hold every packet in the kernel. The packets held are counted
//! with the other fallbacks (`xdp_router_fallback_packets_total{reason="per_packet_rule_in_ruleset"}`).

use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;

use super::family::gauges;
use crate::{
    flows::per_packet::{PerPacketRule, count_by_kind},
    status::Status,
};

/// Encodes this subsystem's families of one status snapshot.
pub(super) fn encode(s: &Status, enc: &mut DescriptorEncoder) -> Result<(), fmt::Error> {
    let p = &s.per_packet;
    gauges(
        enc,
        "ruleset_per_packet_rules",
        "Firewall rules that must see every packet, by what they do (limit, hashlimit, quota, queue, log, ...), in chains that forwarded packets traverse.",
        None,
        count_by_kind(&p.rules)
            .into_iter()
            .map(|(k, n)| (vec![("kind", k.name().to_string())], n)),
    )?;
    let holding: Vec<PerPacketRule> = p.rules.iter().filter(|r| r.holds()).cloned().collect();
    gauges(
        enc,
        "ruleset_per_packet_rules_holding",
        "Of those, the rules a packet of an established connection can reach, which hold flows in the kernel (the others come after an established accept or match another conntrack state), by kind.",
        None,
        count_by_kind(&holding)
            .into_iter()
            .map(|(k, n)| (vec![("kind", k.name().to_string())], n)),
    )?;
    gauges(
        enc,
        "ruleset_unreadable",
        "1 while a part of the firewall ruleset cannot be read (nft missing, a legacy table that cannot be listed): it may hold such rules.",
        None,
        [(vec![], u64::from(!p.unreadable.is_empty()))],
    )?;
    gauges(
        enc,
        "ruleset_per_packet_hold",
        "1 while every packet goes through the kernel because of such rules (per_packet_rules = \"hold\"), or while a ruleset change is being read.",
        None,
        [(vec![], u64::from(p.held))],
    )?;
    gauges(
        enc,
        "ruleset_per_packet_held_connections",
        "Connections kept in the kernel because a rule that must see every packet, narrowed by its protocol, port or address tests, can match them (the rest are offloaded).",
        None,
        [(vec![], p.held_connections)],
    )?;
    gauges(
        enc,
        "ruleset_per_packet_rule_held_connections",
        "Of those, the connections each narrowed rule can match, by the rule's place (a connection two rules can match counts for both).",
        None,
        p.rules
            .iter()
            .filter_map(|r| Some((vec![("rule", r.place().to_string())], r.held_connections?))),
    )?;
    gauges(
        enc,
        "ruleset_dscp_rewrite_rules",
        "Firewall rules that set a DSCP, in chains that forwarded packets traverse.",
        None,
        [(vec![], p.dscp_rewrite.setters.len() as u64)],
    )?;
    gauges(
        enc,
        "dscp_rewrite_fast_path",
        "1 while the fast path applies the DSCP rewrites the kernel makes (every rewrite is a constant on flow-constant matches); 0: flows whose DSCP the kernel rewrites stay in the kernel.",
        None,
        [(vec![], u64::from(p.dscp_rewrite.fast_path))],
    )?;
    Ok(())
}
