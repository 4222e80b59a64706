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

use super::per_packet::{NftTables, legacy_entry_chains, save_words};
use crate::flows::{
    dscp_rewrite::{DscpBlocker, DscpRewrites, RulePlace},
    per_packet::RuleOrigin,
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

fn every_base_chain(t: &super::per_packet::NftTable) -> BTreeSet<String> {
    t.entry_chains
        .iter()
        .chain(&t.other_base_chains)
        .cloned()
        .collect()
}

/// `payload` fields that are the same for every packet of a flow (or that a packet the fast
/// path forwards cannot have: ICMP).
fn flow_constant_payload(protocol: &str, field: &str) -> bool {
    match protocol {
        "ip" => matches!(field, "saddr" | "daddr" | "protocol" | "version"),
        "ip6" => matches!(field, "saddr" | "daddr" | "nexthdr" | "version"),
        "tcp" | "udp" | "udplite" | "sctp" | "dccp" | "th" => matches!(field, "sport" | "dport"),
        // A rule on ICMP headers never matches a TCP or UDP packet.
        "icmp" | "icmpv6" | "igmp" => true,
        _ => false,
    }
}

/// `meta` keys that are the same for every packet of a flow (`time`, `day`, `hour` change with
/// the clock, which the verdict age covers).
fn flow_constant_meta(key: &str) -> bool {
    matches!(
        key,
        "iif"
            | "oif"
            | "iifname"
            | "oifname"
            | "iiftype"
            | "oiftype"
            | "iifkind"
            | "oifkind"
            | "iifgroup"
            | "oifgroup"
            | "l4proto"
            | "nfproto"
            | "protocol"
            | "mark"
            | "time"
            | "day"
            | "hour"
            | "ibrname"
            | "obrname"
    )
}

/// Whether a `match` is a TCP flags test that only SYN, FIN or RST segments pass (`tcp flags
/// syn`, `tcp flags & (syn|rst) == syn`): the fast path forwards none of those, and the arming
/// program never learns from a SYN.
fn syn_fin_rst_only(m: &Value) -> bool {
    let left = m.get("left");
    let flags = |v: Option<&Value>| {
        v.and_then(|v| v.get("payload"))
            .is_some_and(|p| p.get("field").and_then(Value::as_str) == Some("flags"))
    };
    let is_flags = flags(left)
        || left
            .and_then(|l| l.get("&"))
            .and_then(Value::as_array)
            .is_some_and(|a| flags(a.first()));
    let op_ok = matches!(m.get("op").and_then(Value::as_str), Some("==" | "in"));
    if !is_flags || !op_ok {
        return false;
    }
    // Every alternative on the right names SYN, FIN or RST.
    let alternatives: Vec<&Value> = match m.get("right") {
        Some(Value::Object(o)) if o.contains_key("set") => o["set"]
            .as_array()
            .map(|a| a.iter().collect())
            .unwrap_or_default(),
        Some(v) => vec![v],
        None => return false,
    };
    !alternatives.is_empty()
        && alternatives.iter().all(|alt| {
            let mut words = Vec::new();
            strings(alt, &mut words);
            words.iter().any(|w| matches!(*w, "syn" | "fin" | "rst"))
        })
}

/// Every string anywhere in `v`.
fn strings<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::String(s) => out.push(s),
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(o) => o.values().for_each(|x| strings(x, out)),
        _ => {}
    }
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

/// DSCP rewrites in an `iptables-save` / `ip6tables-save` listing (pure), in the chains of
/// `legacy_entry_chains` and the user chains they jump to.
pub(super) fn from_legacy_save(listing: &str, origin: RuleOrigin, out: &mut DscpRewrites) {
    use std::collections::BTreeMap;
    // table → chain → (facts, jump target) per rule, in order.
    type Chains = BTreeMap<String, Vec<(RuleFacts, Option<String>)>>;
    let mut tables: BTreeMap<String, Chains> = BTreeMap::new();
    let mut table = String::new();
    for line in listing.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t.trim().to_string();
            continue;
        }
        let Some(rest) = line.strip_prefix("-A ") else {
            continue;
        };
        let words = save_words(rest);
        let Some(chain) = words.first() else { continue };
        let (facts, target) = legacy_rule(&words[1..]);
        tables
            .entry(table.clone())
            .or_default()
            .entry(chain.clone())
            .or_default()
            .push((facts, target));
    }
    for (table, mut chains) in tables {
        let mut seen: BTreeSet<String> = BTreeSet::new();
        let mut todo: Vec<String> = legacy_entry_chains(&table)
            .iter()
            .map(|c| c.to_string())
            .collect();
        while let Some(chain) = todo.pop() {
            if !seen.insert(chain.clone()) {
                continue;
            }
            let rules = chains.remove(&chain).unwrap_or_default();
            for (i, (facts, target)) in rules.into_iter().enumerate() {
                if let Some(t) = target {
                    todo.push(t);
                }
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

/// One legacy rule's words after the chain name: its facts and its jump target.
fn legacy_rule(words: &[String]) -> (RuleFacts, Option<String>) {
    let mut facts = RuleFacts::default();
    let mut target = None;
    let mut i = 0;
    while i < words.len() {
        let w = words[i].as_str();
        let next = words.get(i + 1).map(String::as_str).unwrap_or("");
        match w {
            // `-m tcp` / `-m udp` come with port matches; their flag options are below.
            "-m" | "--match" if matches!(next, "tcp" | "udp") => {}
            "-m" | "--match" => xt_match(next, &mut facts),
            "-j" | "--jump" | "-g" | "--goto" => {
                xt_target(next, &mut facts);
                target = Some(next.to_string());
            }
            // `--syn` and `--tcp-flags MASK COMP` with SYN, FIN or RST in COMP pass only
            // segments the fast path never forwards; negated, they pass the others.
            "--syn" if i > 0 && words[i - 1] == "!" => facts.block("matches TCP flags"),
            "--tcp-flags" => {
                let comp = words.get(i + 2).map(String::as_str).unwrap_or("");
                let negated = i > 0 && words[i - 1] == "!";
                let syn_fin_rst = comp.split(',').any(|f| matches!(f, "SYN" | "FIN" | "RST"));
                if negated || !syn_fin_rst {
                    facts.block("matches TCP flags");
                }
            }
            "--tcp-option" | "-f" | "--fragment" => facts.block(format!("matches {w}")),
            _ => {}
        }
        i += 1;
    }
    (facts, target)
}

#[cfg(test)]
mod tests;
