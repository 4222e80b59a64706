//! Reads the firewall ruleset for DSCP rewrites (see [`crate::flows::dscp_rewrite`]): which
//! rules set a DSCP, and the first rule that could make such a rewrite differ between packets
//! of one flow. Pure: parses the same `nft -t -j list ruleset` and legacy save output that
//! [`super::per_packet::read`] fetches.
//!
//! Chains considered: those established forwarded packets traverse (as for per-packet rules),
//! and every base chain of the `netdev` and `bridge` families (a device's ingress chain sees
//! packets before routing). A match qualifies as flow-constant only from a fixed list; anything
//! else, and anything unknown, blocks.

use std::collections::BTreeSet;

use serde_json::Value;

use super::ruleset_listing::{
    NftTable, NftTables, flow_constant_meta, flow_constant_payload, legacy_tcp_test, legacy_walk,
    syn_fin_rst_only,
};
use crate::flows::{
    dscp_rewrite::{DscpBlocker, DscpRewrites},
    rule_origin::{RuleOrigin, RulePlace},
};

/// What one rule does as far as DSCP rewrites go.
#[derive(Debug, Default, PartialEq, Eq)]
struct RuleFacts {
    /// It sets a DSCP.
    sets_dscp: bool,
    /// Why it could differ between packets of one flow (the first reason found).
    blocker: Option<String>,
}

impl RuleFacts {
    fn block(&mut self, what: impl Into<String>) {
        if self.blocker.is_none() {
            self.blocker = Some(what.into());
        }
    }
}

/// Collects `facts` of one rule into `out` at `place`.
fn record(out: &mut DscpRewrites, place: RulePlace, facts: RuleFacts) {
    if let Some(what) = facts.blocker
        && out.blocker.is_none()
    {
        out.blocker = Some(DscpBlocker {
            place: place.clone(),
            what,
        });
    }
    if facts.sets_dscp {
        out.setters.push(place);
    }
}

/// DSCP rewrites in parsed nftables `tables` (see [`super::per_packet::nft_tables`]).
pub(super) fn from_nft(tables: &NftTables, out: &mut DscpRewrites) {
    for ((family, table), t) in tables {
        let (origin, entries) = match family.as_str() {
            "ip" => (RuleOrigin::NftIp, t.entry_chains.clone()),
            "ip6" => (RuleOrigin::NftIp6, t.entry_chains.clone()),
            "inet" => (RuleOrigin::NftInet, t.entry_chains.clone()),
            "netdev" => (RuleOrigin::NftNetdev, every_base_chain(t)),
            "bridge" => (RuleOrigin::NftBridge, every_base_chain(t)),
            _ => continue,
        };
        for chain in t.reachable(&entries) {
            for (i, expr) in t.chains.get(&chain).into_iter().flatten().enumerate() {
                let mut facts = RuleFacts::default();
                nft_rule(expr, &mut facts);
                let place = RulePlace {
                    origin,
                    table: table.clone(),
                    chain: chain.clone(),
                    position: i as u32 + 1,
                };
                record(out, place, facts);
            }
        }
    }
}

fn every_base_chain(t: &NftTable) -> BTreeSet<String> {
    t.entry_chains
        .iter()
        .chain(&t.other_base_chains)
        .cloned()
        .collect()
}

/// Walks one nftables rule (its `expr`) for DSCP setters and per-packet expressions.
fn nft_rule(v: &Value, facts: &mut RuleFacts) {
    match v {
        Value::Array(a) => a.iter().for_each(|x| nft_rule(x, facts)),
        Value::Object(o) => {
            for (k, inner) in o {
                match k.as_str() {
                    "match" if syn_fin_rst_only(inner) => {}
                    "mangle" => {
                        let key = inner.get("key");
                        let dscp = key
                            .and_then(|k| k.get("payload"))
                            .and_then(|p| p.get("field"))
                            .and_then(Value::as_str)
                            == Some("dscp");
                        if dscp {
                            facts.sets_dscp = true;
                            if !matches!(
                                inner.get("value"),
                                Some(Value::String(_) | Value::Number(_))
                            ) {
                                facts.block("sets the DSCP from an expression");
                            }
                        }
                        // The field written is not matched; what it is set from counts.
                        if let Some(value) = inner.get("value") {
                            nft_rule(value, facts);
                        }
                    }
                    "payload" => {
                        let p = |f: &str| inner.get(f).and_then(Value::as_str).unwrap_or("");
                        if !flow_constant_payload(p("protocol"), p("field")) {
                            facts.block(format!("matches {} {}", p("protocol"), p("field")));
                        }
                    }
                    "meta" => {
                        let key = inner.get("key").and_then(Value::as_str).unwrap_or("");
                        if !flow_constant_meta(key) {
                            facts.block(format!("matches meta {key}"));
                        }
                    }
                    "ct" => {
                        let key = inner.get("key").and_then(Value::as_str).unwrap_or("");
                        if matches!(key, "bytes" | "packets" | "avgpkt" | "expiration") {
                            facts.block(format!("matches ct {key}"));
                        }
                    }
                    "xt" => {
                        let name = inner.get("name").and_then(Value::as_str).unwrap_or("");
                        match inner.get("type").and_then(Value::as_str) {
                            Some("target") => xt_target(name, facts),
                            _ => xt_match(name, facts),
                        }
                    }
                    "exthdr" | "tcp option" | "ip option" | "sctp chunk" | "numgen" | "jhash"
                    | "symhash" | "osf" | "socket" | "ipsec" | "raw" | "inner" => {
                        facts.block(format!("matches {k}"));
                    }
                    _ => nft_rule(inner, facts),
                }
            }
        }
        _ => {}
    }
}

/// An iptables target (`-j NAME`; iptables-nft's `xt` target).
fn xt_target(name: &str, facts: &mut RuleFacts) {
    match name {
        // Always a constant (`--set-dscp`, `--set-dscp-class`).
        "DSCP" => facts.sets_dscp = true,
        // `--set-tos value/mask` keeps the bits outside the mask: not a constant DSCP.
        "TOS" => {
            facts.sets_dscp = true;
            facts.block("uses TOS");
        }
        _ => {}
    }
}

/// An iptables match (`-m NAME`; iptables-nft's `xt` match).
fn xt_match(name: &str, facts: &mut RuleFacts) {
    let constant = matches!(
        name,
        "conntrack"
            | "state"
            | "set"
            | "multiport"
            | "iprange"
            | "comment"
            | "mark"
            | "connmark"
            | "addrtype"
            | "time"
            | "icmp"
            | "icmp6"
    );
    if !constant {
        facts.block(format!("matches {name}"));
    }
}

/// DSCP rewrites in an `iptables-save` / `ip6tables-save` listing (pure), in the chains
/// established forwarded packets traverse (see [`super::per_packet::legacy_walk`]).
pub(super) fn from_legacy_save(listing: &str, origin: RuleOrigin, out: &mut DscpRewrites) {
    for rule in legacy_walk(listing, legacy_rule) {
        let place = RulePlace {
            origin,
            table: rule.table,
            chain: rule.chain,
            position: rule.position,
        };
        record(out, place, rule.found);
    }
}

/// One legacy rule's words after the chain name: its facts and its jump target.
fn legacy_rule(words: &[String]) -> (RuleFacts, Option<String>) {
    let mut facts = RuleFacts::default();
    let mut target = None;
    for pair in words.windows(2) {
        let next = pair[1].as_str();
        match pair[0].as_str() {
            // `-m tcp` / `-m udp` come with port matches; their flag options are below.
            "-m" | "--match" if matches!(next, "tcp" | "udp") => {}
            "-m" | "--match" => xt_match(next, &mut facts),
            "-j" | "--jump" | "-g" | "--goto" => {
                xt_target(next, &mut facts);
                target = Some(next.to_string());
            }
            _ => {}
        }
    }
    if let Some(test) = legacy_tcp_test(words) {
        facts.block(format!("matches {test}"));
    }
    (facts, target)
}

#[cfg(test)]
mod tests;
