//! The firewall ruleset as listed by `nft -t -j list ruleset` and `iptables-save`: tables,
//! chains and rules, which chains established forwarded packets traverse, and which matches
//! are the same for every packet of a flow. Pure; shared by the readers of rules that must
//! see every packet ([`super::per_packet`]) and of DSCP rewrites ([`super::dscp_rewrite`]).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// The nftables hooks whose chains see every packet of an established forwarded connection.
const FORWARD_PATH_HOOKS: [&str; 4] = ["prerouting", "forward", "postrouting", "ingress"];

/// `NF_IP_PRI_CONNTRACK` (uapi/linux/netfilter_ipv4.h; the same for IPv6): a prerouting chain
/// of this priority or lower may run before conntrack has looked the packet up, when `ct
/// state` still reads `invalid` (nft_ct_get_eval, conntrack_mt).
const PRI_CONNTRACK: i64 = -200;

/// The tables of an nftables JSON listing, by (family, table).
pub(super) type NftTables = BTreeMap<(String, String), NftTable>;

/// The tables of the output of `nft -j list ruleset`; `Err` says why the text is not an
/// nftables JSON listing.
pub(super) fn nft_tables(text: &str) -> Result<NftTables, String> {
    let doc: Value =
        serde_json::from_str(text).map_err(|e| format!("nft -j list ruleset: not JSON: {e}"))?;
    let items = doc
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or("nft -j list ruleset: no \"nftables\" array")?;
    // (family, table) → chains in order, with their rules; verdict maps' jump targets.
    let mut tables: BTreeMap<(String, String), NftTable> = BTreeMap::new();
    let key = |o: &Value| {
        let s = |k: &str| o.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        (s("family"), s("table"))
    };
    for item in items {
        if let Some(c) = item.get("chain") {
            let name = c.get("name").and_then(Value::as_str).unwrap_or("");
            let hook = c.get("hook").and_then(Value::as_str);
            let nat = c.get("type").and_then(Value::as_str) == Some("nat");
            let t = tables.entry(key(c)).or_default();
            if hook.is_some_and(|h| FORWARD_PATH_HOOKS.contains(&h)) && !nat {
                t.entry_chains.insert(name.to_string());
                let prio = c.get("prio").and_then(Value::as_i64);
                let early = match hook {
                    Some("ingress") => true,
                    Some("prerouting") => prio.is_none_or(|p| p <= PRI_CONNTRACK),
                    _ => false,
                };
                if early {
                    t.before_conntrack.insert(name.to_string());
                }
            } else if hook.is_some() && !nat {
                t.other_base_chains.insert(name.to_string());
            }
            t.chains.entry(name.to_string()).or_default();
        } else if let Some(r) = item.get("rule") {
            let chain = r.get("chain").and_then(Value::as_str).unwrap_or("");
            let expr = r.get("expr").cloned().unwrap_or(Value::Null);
            tables
                .entry(key(r))
                .or_default()
                .chains
                .entry(chain.to_string())
                .or_default()
                .push(expr);
        } else if let Some(set) = item.get("set").or_else(|| item.get("map"))
            && elements_expire(set)
        {
            let name = set.get("name").and_then(Value::as_str).unwrap_or("");
            tables
                .entry(key(set))
                .or_default()
                .expiring_sets
                .insert(name.to_string());
        }
        if let Some(m) = item.get("map")
            && m.get("map").and_then(Value::as_str) == Some("verdict")
        {
            let name = m.get("name").and_then(Value::as_str).unwrap_or("");
            // `nft -t` (terse) lists no elements: where such a map sends packets is unknown.
            let targets = m.get("elem").map(|elem| {
                let mut targets = BTreeSet::new();
                jump_targets(elem, &mut targets);
                targets
            });
            tables
                .entry(key(m))
                .or_default()
                .verdict_maps
                .insert(name.to_string(), targets);
        }
    }
    Ok(tables)
}

/// One nftables table as far as reachability goes.
#[derive(Default)]
pub(super) struct NftTable {
    /// Base chains at a forward-path hook (not nat).
    pub(super) entry_chains: BTreeSet<String>,
    /// Base chains at other hooks (not nat): `input`, `output`, a netdev `egress`, …
    pub(super) other_base_chains: BTreeSet<String>,
    /// The entry chains that may run before conntrack (`ingress`; `prerouting` at
    /// [`PRI_CONNTRACK`] or lower, as the `raw` table): `ct state` tests there prove nothing.
    pub(super) before_conntrack: BTreeSet<String>,
    /// Every chain's rules (their `expr` arrays), in order.
    pub(super) chains: BTreeMap<String, Vec<Value>>,
    /// Named verdict maps → the chains their elements jump or go to; `None` when the listing
    /// has no elements (terse): any chain of the table.
    verdict_maps: BTreeMap<String, Option<BTreeSet<String>>>,
    /// Named sets and maps whose elements expire or come from the packet path (`flags
    /// timeout`, `flags dynamic`, a default `timeout`): membership changes with no commit.
    pub(super) expiring_sets: BTreeSet<String>,
}

/// Whether the elements of the set or map listed as `set` expire or come from the packet path.
fn elements_expire(set: &Value) -> bool {
    let flag = |f: &Value| matches!(f.as_str(), Some("timeout" | "dynamic"));
    let flags = match set.get("flags") {
        Some(Value::Array(a)) => a.iter().any(flag),
        Some(f) => flag(f),
        None => false,
    };
    flags || set.get("timeout").is_some()
}

impl NftTable {
    /// Where the named verdict map `name` sends packets: `Some(None)` when it is listed without
    /// its elements (any chain of the table); `None` when the table has no such verdict map.
    pub(super) fn verdict_map(&self, name: &str) -> Option<Option<&BTreeSet<String>>> {
        self.verdict_maps.get(name).map(Option::as_ref)
    }

    /// The chains `from` and every chain reachable from them, in name order.
    pub(super) fn reachable(&self, from: &BTreeSet<String>) -> BTreeSet<String> {
        let mut seen: BTreeSet<String> = BTreeSet::new();
        let mut todo: Vec<String> = from.iter().cloned().collect();
        while let Some(chain) = todo.pop() {
            if !seen.insert(chain.clone()) {
                continue;
            }
            let mut next = BTreeSet::new();
            for expr in self.chains.get(&chain).into_iter().flatten() {
                jump_targets(expr, &mut next);
                // `vmap @name`: the chains the map's elements name.
                let mut refs = BTreeSet::new();
                set_refs(expr, &mut refs);
                for r in refs {
                    match self.verdict_maps.get(&r) {
                        Some(Some(targets)) => next.extend(targets.iter().cloned()),
                        Some(None) => next.extend(self.chains.keys().cloned()),
                        None => {}
                    }
                }
            }
            todo.extend(next.into_iter().filter(|c| !seen.contains(c)));
        }
        seen
    }
}

/// Every `jump`/`goto` target anywhere in `v`.
pub(super) fn jump_targets(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(o) => {
            for (k, inner) in o {
                if (k == "jump" || k == "goto")
                    && let Some(t) = inner.get("target").and_then(Value::as_str)
                {
                    out.insert(t.to_string());
                }
                jump_targets(inner, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| jump_targets(x, out)),
        _ => {}
    }
}

/// Every named set or map referenced (`"@name"`) anywhere in `v`.
pub(super) fn set_refs(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::String(s) => {
            if let Some(name) = s.strip_prefix('@') {
                out.insert(name.to_string());
            }
        }
        Value::Object(o) => o.values().for_each(|x| set_refs(x, out)),
        Value::Array(a) => a.iter().for_each(|x| set_refs(x, out)),
        _ => {}
    }
}

/// The chains of `table` that established forwarded packets traverse, as the kernel's
/// iptables hooks run them (legacy tables: `nat` sees first packets only).
pub(super) fn legacy_entry_chains(table: &str) -> &'static [&'static str] {
    match table {
        "raw" => &["PREROUTING"],
        "mangle" => &["PREROUTING", "FORWARD", "POSTROUTING"],
        "filter" | "security" => &["FORWARD"],
        _ => &[],
    }
}

/// Splits an `iptables-save` rule line into words, as the shell would (`"in "` is one word).
pub(super) fn save_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let (mut quoted, mut escaped, mut any) = (false, false, false);
    for c in line.chars() {
        if escaped {
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == '"' {
            quoted = !quoted;
            any = true;
        } else if c.is_whitespace() && !quoted {
            if any || !cur.is_empty() {
                words.push(std::mem::take(&mut cur));
            }
            any = false;
        } else {
            cur.push(c);
        }
    }
    if any || !cur.is_empty() {
        words.push(cur);
    }
    words
}

/// One rule of an `iptables-save` listing, where it is and what a walk found in it.
pub(super) struct LegacyRule<T> {
    pub(super) table: String,
    pub(super) chain: String,
    /// 1-based position in the chain.
    pub(super) position: u32,
    pub(super) found: T,
}

/// The chains of one table of an `iptables-save` listing: each chain's rules (their words
/// after the chain name), in order, by chain name; chains without rules too.
pub(super) type SaveChains = BTreeMap<String, Vec<Vec<String>>>;

/// The tables of an `iptables-save` / `ip6tables-save` listing, by name (`filter`).
pub(super) fn save_tables(listing: &str) -> BTreeMap<String, SaveChains> {
    let mut tables: BTreeMap<String, SaveChains> = BTreeMap::new();
    let mut table = String::new();
    for line in listing.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t.trim().to_string();
            tables.entry(table.clone()).or_default();
        } else if let Some(decl) = line.strip_prefix(':') {
            // `:FORWARD DROP [0:0]`, `:ufw-user-forward - [0:0]`.
            if let Some(chain) = decl.split_whitespace().next() {
                tables
                    .entry(table.clone())
                    .or_default()
                    .entry(chain.to_string())
                    .or_default();
            }
        } else if let Some(rest) = line.strip_prefix("-A ") {
            let words = save_words(rest);
            if let Some((chain, words)) = words.split_first() {
                tables
                    .entry(table.clone())
                    .or_default()
                    .entry(chain.clone())
                    .or_default()
                    .push(words.to_vec());
            }
        }
    }
    tables
}

/// The rules of an `iptables-save` / `ip6tables-save` listing that established forwarded
/// packets traverse: those of [`legacy_entry_chains`] and of the user chains they jump or go
/// to, in the order they are reached. `judge` reads a rule's words after the chain name and
/// returns what it finds and the rule's jump target, if any.
pub(super) fn legacy_walk<T>(
    listing: &str,
    judge: impl Fn(&[String]) -> (T, Option<String>),
) -> Vec<LegacyRule<T>> {
    let mut out = Vec::new();
    for (table, chains) in save_tables(listing) {
        let mut chains: BTreeMap<String, Vec<(T, Option<String>)>> = chains
            .into_iter()
            .map(|(name, rules)| (name, rules.iter().map(|w| judge(w)).collect()))
            .collect();
        let mut todo: Vec<String> = legacy_entry_chains(&table)
            .iter()
            .map(|c| c.to_string())
            .collect();
        // Each chain is taken out when reached, so it is walked once. A built-in target (ACCEPT,
        // LOG) has no rules here.
        while let Some(chain) = todo.pop() {
            let Some(rules) = chains.remove(&chain) else {
                continue;
            };
            for (i, (found, target)) in rules.into_iter().enumerate() {
                todo.extend(target);
                out.push(LegacyRule {
                    table: table.clone(),
                    chain: chain.clone(),
                    position: i as u32 + 1,
                    found,
                });
            }
        }
    }
    out
}

/// `payload` fields that are the same for every packet of a flow (or that a packet the fast
/// path forwards cannot have: ICMP).
pub(super) fn flow_constant_payload(protocol: &str, field: &str) -> bool {
    match protocol {
        "ip" => matches!(field, "saddr" | "daddr" | "protocol" | "version"),
        "ip6" => matches!(field, "saddr" | "daddr" | "nexthdr" | "version"),
        "tcp" | "udp" | "udplite" | "sctp" | "dccp" | "th" => matches!(field, "sport" | "dport"),
        // The hosts' MACs, the frame's type and VLAN (a bridge or netdev chain).
        "ether" => matches!(field, "saddr" | "daddr" | "type"),
        "vlan" => matches!(field, "id" | "type"),
        // A rule on ICMP headers never matches a TCP or UDP packet.
        "icmp" | "icmpv6" | "igmp" => true,
        _ => false,
    }
}

/// `meta` keys that are the same for every packet of a flow (`time`, `day`, `hour` change with
/// the clock, which the verdict age covers).
pub(super) fn flow_constant_meta(key: &str) -> bool {
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
pub(super) fn syn_fin_rst_only(m: &Value) -> bool {
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

/// The first match in one nftables rule (its `expr`) on something that can differ between two
/// packets of a flow the fast path forwards — a length, TCP flags other than a SYN/FIN/RST
/// test, the DSCP, TTL or another header field, header options, raw payload — as `meta
/// length`, `tcp flags`, …; in a match's left side or a verdict map's key. Matches on
/// addresses, ports, protocols, interfaces, MACs, marks, conntrack state, set membership and
/// time are not.
pub(super) fn nft_content_match(v: &Value) -> Option<String> {
    match v {
        Value::Array(a) => a.iter().find_map(nft_content_match),
        Value::Object(o) => o.iter().find_map(|(k, inner)| match k.as_str() {
            "match" if syn_fin_rst_only(inner) => None,
            "match" => inner.get("left").and_then(content_expr),
            "vmap" | "map" => inner.get("key").and_then(content_expr),
            // Statements write, they do not match (`ip dscp set`, `tcp option maxseg size set`).
            "mangle" => None,
            _ => nft_content_match(inner),
        }),
        _ => None,
    }
}

/// What a matched expression reads, if it differs between packets of a flow.
fn content_expr(e: &Value) -> Option<String> {
    let o = e.as_object()?;
    let (k, inner) = o.iter().next()?;
    let s = |f: &str| inner.get(f).and_then(Value::as_str).unwrap_or("");
    match k.as_str() {
        "payload" if inner.get("base").is_some() => Some("raw payload".into()),
        "payload" if !flow_constant_payload(s("protocol"), s("field")) => {
            Some(format!("{} {}", s("protocol"), s("field")))
        }
        "meta" if matches!(s("key"), "length" | "cpu") => Some(format!("meta {}", s("key"))),
        "exthdr" | "tcp option" | "ip option" | "sctp chunk" => Some(k.clone()),
        // A binary operation (`tcp flags & (syn | ack)`): what it reads is its first operand.
        "&" | "|" | "^" | "<<" | ">>" => inner
            .as_array()
            .and_then(|a| a.first())
            .and_then(content_expr),
        // A concatenation (`ip saddr . meta length`).
        "concat" => inner.as_array()?.iter().find_map(content_expr),
        _ => None,
    }
}

/// iptables matches on what can differ between packets of a flow (see [`nft_content_match`]).
pub(super) fn xt_content_match(name: &str) -> bool {
    matches!(
        name,
        "length" | "string" | "u32" | "bpf" | "tos" | "dscp" | "ttl" | "hl" | "ecn" | "ipv6header"
    )
}

/// The first per-packet TCP test in an iptables rule's words: `--tcp-flags MASK COMP` without
/// SYN, FIN or RST in COMP, or negated (a SYN/FIN/RST test passes only segments the fast path
/// never forwards), `! --syn`, `--tcp-option`, `-f` (fragments).
pub(super) fn legacy_tcp_test(words: &[String]) -> Option<&'static str> {
    for (i, w) in words.iter().enumerate() {
        let negated = i > 0 && words[i - 1] == "!";
        match w.as_str() {
            "--syn" if negated => return Some("TCP flags"),
            "--tcp-flags" => {
                let comp = words.get(i + 2).map(String::as_str).unwrap_or("");
                let syn_fin_rst = comp.split(',').any(|f| matches!(f, "SYN" | "FIN" | "RST"));
                if negated || !syn_fin_rst {
                    return Some("TCP flags");
                }
            }
            "--tcp-option" => return Some("TCP options"),
            "-f" | "--fragment" => return Some("fragments"),
            _ => {}
        }
    }
    None
}
