//! nftables rules (the `expr` arrays of `nft -j list ruleset`) as the walk and the hold see
//! them: what each element tests, what it does per packet, and where the rule's verdict sends
//! a packet.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::{Judged, Parts, RuleFacts, judge, xt_options::XtOptions};
use crate::{
    flows::{per_packet::PerPacketKind, rule_origin::RuleOrigin, verdict_expiry::ExpiringMatch},
    sync::{
        ct_state,
        ruleset_listing::{
            NftTable, NftTables, jump_targets, nft_content_match, set_refs, xt_content_match,
        },
        ruleset_walk::{Action, Branch, Match, WalkRule},
    },
};

/// The per-packet and expiring rules of `tables` (`xt`: the options of iptables-nft's
/// conntrack matches), in (table, chain, position) order.
pub(super) fn per_packet_rules(tables: &NftTables, xt: &XtOptions) -> Judged {
    let mut out = Judged::default();
    for ((family, table), t) in tables {
        let origin = match family.as_str() {
            "ip" => RuleOrigin::NftIp,
            "ip6" => RuleOrigin::NftIp6,
            "inet" => RuleOrigin::NftInet,
            // bridge and netdev chains are `ingress_hook` / `egress_hook` (sync::hooks); arp
            // carries no IP.
            _ => continue,
        };
        // Chains a packet may reach before conntrack saw it: their state tests prove nothing.
        let early = t.reachable(&t.before_conntrack);
        let chains: BTreeMap<String, Vec<RuleFacts>> = t
            .chains
            .iter()
            .map(|(chain, rules)| {
                let ct_known = !early.contains(chain);
                let facts = rules
                    .iter()
                    .enumerate()
                    .map(|(i, expr)| nft_rule(expr, t, xt.rule(family, table, chain, i), ct_known))
                    .collect();
                (chain.clone(), facts)
            })
            .collect();
        let base: Vec<String> = t.entry_chains.iter().cloned().collect();
        out.extend(judge(origin, table, &chains, &base));
    }
    out
}

/// One rule of `table`; `save` is its `iptables-nft-save` words when iptables-nft wrote it
/// and both listings agree (see [`XtOptions`]); `ct_known`: conntrack has seen the packet
/// (else a state test is `Maybe`).
fn nft_rule(expr: &Value, table: &NftTable, save: Option<&[String]>, ct_known: bool) -> RuleFacts {
    let mut parts = Parts::default();
    let known = |m: Match| if ct_known { m } else { Match::Maybe };
    let mut branches: Option<Vec<Branch>> = None;
    // The conntrack matches of `save`, in order, for the `xt` conntrack matches of `expr`.
    let save_parts = save.and_then(super::save_rules::parts).unwrap_or_default();
    let mut save_ct = save_parts.iter().filter_map(|p| p.conntrack_match());
    // The options of its connbytes matches, in order.
    let mut save_connbytes = save_parts.iter().filter_map(|p| match p {
        super::save_rules::SavePart::Match("connbytes", options) => Some(*options),
        _ => None,
    });
    for e in expr.as_array().into_iter().flatten() {
        let mut expiring = BTreeSet::new();
        expiring_matches(e, table, &mut expiring);
        parts.expiring(expiring);
        let kinds = element_kinds(e);
        let Some((key, inner)) = e.as_object().and_then(|o| o.iter().next()) else {
            parts.push(Match::Maybe, kinds);
            continue;
        };
        let verdict = match key.as_str() {
            "counter" => {
                parts.push(Match::All, kinds);
                continue;
            }
            "match" => {
                parts.narrow(super::flow_tests::nft_match(inner));
                let test = ct_state::nft_match(inner).map_or(Match::Maybe, known);
                parts.push(test, kinds);
                continue;
            }
            "xt" => {
                let name = inner.get("name").and_then(Value::as_str).unwrap_or("");
                match inner.get("type").and_then(Value::as_str) {
                    Some("match") => {
                        if name == "connbytes" {
                            parts.narrow(
                                save_connbytes
                                    .next()
                                    .and_then(super::flow_tests::save_connbytes_bound),
                            );
                        }
                        let test = match name {
                            "conntrack" | "state" => save_ct
                                .next()
                                .and_then(|(n, opts)| ct_state::iptables_match(n, opts))
                                .map_or(Match::Maybe, known),
                            "comment" => Match::All,
                            _ => Match::Maybe,
                        };
                        parts.push(test, kinds);
                        continue;
                    }
                    Some("target") => {
                        parts.push(Match::All, kinds);
                        // REJECT ends the packet; LOG, MARK, … let it go on.
                        (name == "REJECT").then_some(Action::Drop)
                    }
                    _ => {
                        parts.push(Match::Maybe, kinds);
                        continue;
                    }
                }
            }
            "vmap" => {
                parts.push(Match::All, kinds);
                branches = Some(vmap_branches(inner, &parts.test, table, ct_known));
                break;
            }
            _ => match verdict(e) {
                Some(a) => Some(a),
                None => {
                    parts.push(Match::Maybe, kinds);
                    continue;
                }
            },
        };
        if let Some(action) = verdict {
            branches = Some(vec![Branch {
                test: parts.test.clone(),
                action,
            }]);
            break;
        }
    }
    let mut walk = WalkRule {
        branches: branches.unwrap_or_else(|| {
            vec![Branch {
                test: parts.test.clone(),
                action: Action::Continue,
            }]
        }),
    };
    leave_no_chain_out(expr, table, &mut walk);
    let mut facts = parts.into_facts(walk);
    facts.drops_what_it_logs = drops_what_it_logs(expr);
    facts
}

/// Whether the rule is `[tests…] log … drop|reject` (counters anywhere), every test before
/// the log the same for all packets of a connection's direction
/// ([`super::flow_tests::is_flow_constant`]): every packet it logs is dropped, so a direction
/// the kernel forwards never reaches its log. Firewalld's IPv6 reverse-path filter with
/// `LogDenied` on is one: `meta nfproto ipv6 fib saddr . mark . iif oif missing log drop`.
/// A `limit` or `quota` before the drop is not: a packet over it goes on, logged or not.
fn drops_what_it_logs(expr: &Value) -> bool {
    let mut logged = false;
    for e in expr.as_array().into_iter().flatten() {
        let Some((key, inner)) = e.as_object().and_then(|o| o.iter().next()) else {
            return false;
        };
        match key.as_str() {
            "counter" => {}
            "log" => logged = true,
            "match" if !logged && super::flow_tests::is_flow_constant(inner) => {}
            "drop" | "reject" => return logged,
            _ => return false,
        }
    }
    false
}

/// The action of a verdict statement (`{"accept": null}`, `{"jump": {"target": "x"}}`,
/// `{"reject": …}`), if `e` is one.
fn verdict(e: &Value) -> Option<Action> {
    let (key, inner) = e.as_object()?.iter().next()?;
    let target = || {
        inner
            .get("target")
            .and_then(Value::as_str)
            .map(String::from)
    };
    Some(match key.as_str() {
        "accept" => Action::Accept,
        "drop" | "reject" => Action::Drop,
        "return" => Action::Return,
        "jump" => Action::Jump(target()?),
        "goto" => Action::Goto(target()?),
        _ => return None,
    })
}

/// The branches of a `vmap` statement after the rule's other tests (`before`): one per element
/// of a map on `ct state` (what the element's key does with an established packet) or of an
/// anonymous map on anything else (`Maybe`); a named map's listed targets (`Maybe`), or any
/// chain of the table when it is listed without elements. `ct_known` as for [`nft_rule`].
fn vmap_branches(vmap: &Value, before: &Match, table: &NftTable, ct_known: bool) -> Vec<Branch> {
    let branch = |test: Match, v: &Value| Branch {
        test: before.clone().and(test),
        action: verdict(v).unwrap_or(Action::Continue),
    };
    if let Some(elems) = ct_state::nft_vmap(vmap) {
        return elems
            .into_iter()
            .map(|(t, v)| branch(if ct_known { t } else { Match::Maybe }, v))
            .collect();
    }
    match vmap.get("data") {
        Some(Value::String(name)) => {
            let map = name.strip_prefix('@').and_then(|n| table.verdict_map(n));
            match map {
                Some(Some(targets)) => targets
                    .iter()
                    .map(|t| Branch {
                        test: Match::Maybe,
                        action: Action::Jump(t.clone()),
                    })
                    .collect(),
                _ => vec![Branch {
                    test: Match::Maybe,
                    action: Action::AnyChain,
                }],
            }
        }
        Some(data) => data
            .get("set")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|e| e.as_array()?.get(1))
            .map(|v| branch(Match::Maybe, v))
            .collect(),
        None => vec![],
    }
}

/// Adds a `Maybe` jump for every chain `expr` names (or reaches through a named verdict map)
/// that `walk` does not lead to yet, so no chain a rule can send packets to is left out of
/// the walk, whatever form the rule takes.
fn leave_no_chain_out(expr: &Value, table: &NftTable, walk: &mut WalkRule) {
    let covered: BTreeSet<&String> = walk
        .branches
        .iter()
        .filter_map(|b| match &b.action {
            Action::Jump(t) | Action::Goto(t) => Some(t),
            _ => None,
        })
        .collect();
    let any = walk.branches.iter().any(|b| b.action == Action::AnyChain);
    let mut named = BTreeSet::new();
    jump_targets(expr, &mut named);
    let mut refs = BTreeSet::new();
    set_refs(expr, &mut refs);
    let mut extra = Vec::new();
    for r in &refs {
        match table.verdict_map(r) {
            Some(Some(targets)) => named.extend(targets.iter().cloned()),
            Some(None) if !any => extra.push(Action::AnyChain),
            _ => {}
        }
    }
    extra.extend(
        named
            .iter()
            .filter(|t| !covered.contains(t))
            .map(|t| Action::Jump(t.clone())),
    );
    walk.branches.extend(extra.into_iter().map(|action| Branch {
        test: Match::Maybe,
        action,
    }));
}

/// What one element of a rule does per packet.
fn element_kinds(e: &Value) -> BTreeSet<PerPacketKind> {
    let mut kinds = BTreeSet::new();
    nft_kinds(e, &mut kinds);
    if nft_content_match(e).is_some() {
        kinds.insert(PerPacketKind::ContentMatch);
    }
    kinds
}

/// The per-packet statements and expressions anywhere in `v` (libnftables-json(5) names):
/// `limit`, `quota`, `log`, `queue`, `dup`, `meter`, a `set`/`map` statement (an object with
/// an `op`: `add @s`, `update @s`), `ct count`, `numgen`, a `ct` expression on
/// `bytes`/`packets`/`avgpkt`, and iptables-nft's `xt` matches and targets.
fn nft_kinds(v: &Value, out: &mut BTreeSet<PerPacketKind>) {
    match v {
        Value::Object(o) => {
            for (k, inner) in o {
                let kind = match k.as_str() {
                    "limit" => Some(PerPacketKind::Limit),
                    "quota" => Some(PerPacketKind::Quota),
                    "log" => Some(PerPacketKind::Log),
                    "queue" => Some(PerPacketKind::Queue),
                    "dup" => Some(PerPacketKind::Dup),
                    "meter" => Some(PerPacketKind::Meter),
                    "ct count" => Some(PerPacketKind::Connlimit),
                    "numgen" => Some(PerPacketKind::Statistic),
                    // `{"set": {"op": "update", …}}`; not an anonymous set (`{"set": [...]}`)
                    // or a map lookup (`{"map": {"key": …, "data": …}}`).
                    "set" | "map" if inner.get("op").is_some() => Some(PerPacketKind::SetUpdate),
                    "ct" => match inner.get("key").and_then(Value::as_str) {
                        Some("bytes" | "packets" | "avgpkt") => Some(PerPacketKind::Connbytes),
                        _ => None,
                    },
                    "xt" => inner.get("name").and_then(Value::as_str).and_then(|name| {
                        let is_match = inner.get("type").and_then(Value::as_str) == Some("match");
                        if is_match && xt_content_match(name) {
                            Some(PerPacketKind::ContentMatch)
                        } else {
                            PerPacketKind::of_xtables(name)
                        }
                    }),
                    _ => None,
                };
                match kind {
                    // A meter's or set update's own statement (`limit rate …`) is part of it.
                    Some(k @ (PerPacketKind::Meter | PerPacketKind::SetUpdate)) => {
                        out.insert(k);
                    }
                    Some(k) => {
                        out.insert(k);
                        nft_kinds(inner, out);
                    }
                    None => nft_kinds(inner, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| nft_kinds(x, out)),
        _ => {}
    }
}

/// The matches anywhere in `v` whose answer can change without a ruleset change: iptables-nft's
/// `xt` matches (`set`, `time`, `rpfilter`, `addrtype`), `meta hour` / `day` / `time`, `fib`,
/// and a lookup in a set or map of `table` whose elements expire (`@name`).
fn expiring_matches(v: &Value, table: &NftTable, out: &mut BTreeSet<ExpiringMatch>) {
    match v {
        Value::String(s)
            if s.strip_prefix('@')
                .is_some_and(|name| table.expiring_sets.contains(name)) =>
        {
            out.insert(ExpiringMatch::ExpiringSet);
        }
        Value::Object(o) => {
            for (k, inner) in o {
                let found = match k.as_str() {
                    "xt" if inner.get("type").and_then(Value::as_str) == Some("match") => inner
                        .get("name")
                        .and_then(Value::as_str)
                        .and_then(ExpiringMatch::of_xtables),
                    "meta" => match inner.get("key").and_then(Value::as_str) {
                        Some("hour" | "day" | "time") => Some(ExpiringMatch::Time),
                        _ => None,
                    },
                    "fib" => Some(ExpiringMatch::RouteLookup),
                    _ => None,
                };
                out.extend(found);
                expiring_matches(inner, table, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| expiring_matches(x, table, out)),
        _ => {}
    }
}
