//! A rule's flow-constant tests as [`FlowTerm`]s (see [`crate::flows::flow_match`]): nftables
//! `match` expressions on `meta l4proto`, `ip protocol`, addresses and TCP/UDP ports, and
//! iptables' `-p`, `-s`, `-d` and `-m tcp`/`-m udp` port options. Anything else gives no term
//! (the rule is not narrowed by it).

use std::net::IpAddr;

use serde_json::Value;

use crate::flows::flow_match::{
    CounterDir, CounterUnit, FlowTerm, Side, prefix_range, proto_number,
};

const TCP: u8 = 6;
const UDP: u8 = 17;

/// Whether the nftables `match` `m` gives the same answer for every packet of a connection's
/// direction while the ruleset and the routes stay: its left side is an address, port or
/// protocol field, the address family, an interface, a route lookup (`fib`, whose answer the
/// fast path's verdict expiry re-asks), or a concatenation of those.
pub(super) fn is_flow_constant(m: &Value) -> bool {
    m.get("left").is_some_and(constant_expr)
}

fn constant_expr(v: &Value) -> bool {
    let Some((key, inner)) = v.as_object().and_then(|o| o.iter().next()) else {
        return false;
    };
    let field = |name: &str| inner.get(name).and_then(Value::as_str);
    match key.as_str() {
        "payload" => matches!(
            field("field"),
            Some("saddr" | "daddr" | "sport" | "dport" | "protocol" | "nexthdr")
        ),
        "meta" => matches!(
            field("key"),
            Some("nfproto" | "l4proto" | "protocol" | "iifname" | "oifname" | "iif" | "oif")
        ),
        "fib" => true,
        "concat" => inner
            .as_array()
            .is_some_and(|a| a.iter().all(constant_expr)),
        _ => false,
    }
}

/// The terms of one nftables `match` expression (the object inside `{"match": …}`), an
/// upper bound on conntrack's counters among them ([`nft_counter_bound`]); empty when it is
/// not a test this reads.
pub(super) fn nft_match(m: &Value) -> Vec<FlowTerm> {
    if let Some(bound) = nft_counter_bound(m) {
        return vec![bound];
    }
    let negated = match m.get("op").and_then(Value::as_str) {
        Some("==" | "in") => false,
        Some("!=") => true,
        _ => return vec![],
    };
    let (Some(left), Some(right)) = (m.get("left"), m.get("right")) else {
        return vec![];
    };
    let values: Vec<&Value> = match right.get("set").and_then(Value::as_array) {
        Some(set) => set.iter().collect(),
        None => vec![right],
    };
    if let Some(key) = left
        .get("meta")
        .and_then(|x| x.get("key"))
        .and_then(Value::as_str)
    {
        return match key {
            "l4proto" => protos(&values, negated).into_iter().collect(),
            _ => vec![],
        };
    }
    let Some(payload) = left.get("payload") else {
        return vec![];
    };
    let protocol = payload.get("protocol").and_then(Value::as_str);
    let field = payload.get("field").and_then(Value::as_str);
    match (protocol, field) {
        (Some("ip"), Some("protocol")) => protos(&values, negated).into_iter().collect(),
        (Some(l4 @ ("tcp" | "udp" | "th")), Some(f @ ("sport" | "dport"))) => {
            let Some(ranges) = values.iter().map(|v| port_range(v)).collect() else {
                return vec![];
            };
            let side = if f == "sport" {
                Side::Source
            } else {
                Side::Destination
            };
            let port = FlowTerm::Port {
                side,
                ranges,
                negated,
            };
            // `tcp dport` tests a TCP header: the packet is TCP whatever the comparison.
            match l4 {
                "tcp" => vec![proto_is(TCP), port],
                "udp" => vec![proto_is(UDP), port],
                _ => vec![port],
            }
        }
        (Some("ip" | "ip6"), Some(f @ ("saddr" | "daddr"))) => {
            let Some(ranges) = values.iter().map(|v| addr_range(v)).collect() else {
                return vec![];
            };
            let side = if f == "saddr" {
                Side::Source
            } else {
                Side::Destination
            };
            vec![FlowTerm::Addr {
                side,
                ranges,
                negated,
            }]
        }
        _ => vec![],
    }
}

/// The upper bound an nftables `match` on `ct [original|reply] packets|bytes` puts on the
/// counter: it narrows a rule in time, holding a connection (whose verdict may change with the
/// counter) only until a counter is past the bound (see [`crate::flows::flow_match`]) (`< 10`, `<= 1000`, `1-6`, `{ 1-6, 9 }`); `None` for any other test, or one without
/// an upper bound (`> 100`, `!= 3`).
fn nft_counter_bound(m: &Value) -> Option<FlowTerm> {
    let ct = m.get("left")?.get("ct")?;
    let unit = match ct.get("key")?.as_str()? {
        "packets" => CounterUnit::Packets,
        "bytes" => CounterUnit::Bytes,
        _ => return None,
    };
    let dir = match ct.get("dir").and_then(Value::as_str) {
        None => CounterDir::Both,
        Some("original") => CounterDir::Original,
        Some("reply") => CounterDir::Reply,
        Some(_) => return None,
    };
    let right = m.get("right")?;
    let highest = |v: &Value| match v.get("range").and_then(Value::as_array) {
        Some(r) if r.len() == 2 => r[1].as_u64(),
        Some(_) => None,
        None => v.as_u64(),
    };
    let max = match m.get("op")?.as_str()? {
        "<" => right.as_u64()?.checked_sub(1)?,
        "<=" => right.as_u64()?,
        "==" | "in" => match right.get("set").and_then(Value::as_array) {
            Some(set) => set
                .iter()
                .map(highest)
                .collect::<Option<Vec<u64>>>()?
                .into_iter()
                .max()?,
            None => highest(right)?,
        },
        _ => return None,
    };
    Some(FlowTerm::CounterAtMost { dir, unit, max })
}

/// The upper bound of `-m connbytes` options (`--connbytes 1:6 --connbytes-dir original
/// --connbytes-mode packets`); `None` when negated, open-ended (`--connbytes 10`) or on
/// `avgpkt`.
pub(super) fn save_connbytes_bound(options: &[String]) -> Option<FlowTerm> {
    let mut range = None;
    let (mut dir, mut unit) = (None, None);
    let mut words = options.iter().map(String::as_str);
    while let Some(w) = words.next() {
        match w {
            "!" => return None,
            "--connbytes" => range = words.next(),
            "--connbytes-dir" => {
                dir = Some(match words.next()? {
                    "original" => CounterDir::Original,
                    "reply" => CounterDir::Reply,
                    "both" => CounterDir::Both,
                    _ => return None,
                })
            }
            "--connbytes-mode" => {
                unit = Some(match words.next()? {
                    "packets" => CounterUnit::Packets,
                    "bytes" => CounterUnit::Bytes,
                    _ => return None,
                })
            }
            _ => return None,
        }
    }
    let max = range?.split_once(':')?.1.parse().ok()?;
    Some(FlowTerm::CounterAtMost {
        dir: dir?,
        unit: unit?,
        max,
    })
}

fn proto_is(p: u8) -> FlowTerm {
    FlowTerm::Proto {
        protos: vec![p],
        negated: false,
    }
}

fn protos(values: &[&Value], negated: bool) -> Option<FlowTerm> {
    let protos = values
        .iter()
        .map(|v| match v {
            Value::String(s) => proto_number(s),
            Value::Number(n) => n.as_u64().and_then(|n| u8::try_from(n).ok()),
            _ => None,
        })
        .collect::<Option<Vec<u8>>>()?;
    Some(FlowTerm::Proto { protos, negated })
}

/// A port (`22`), a range (`{"range": [1000, 2000]}`).
fn port_range(v: &Value) -> Option<(u16, u16)> {
    let port = |v: &Value| v.as_u64().and_then(|n| u16::try_from(n).ok());
    match v.get("range").and_then(Value::as_array) {
        Some(r) if r.len() == 2 => Some((port(&r[0])?, port(&r[1])?)),
        Some(_) => None,
        None => port(v).map(|p| (p, p)),
    }
}

/// An address, a prefix (`{"prefix": {"addr": …, "len": 8}}`) or a range.
fn addr_range(v: &Value) -> Option<(IpAddr, IpAddr)> {
    let addr = |v: &Value| v.as_str()?.parse::<IpAddr>().ok();
    if let Some(p) = v.get("prefix") {
        let len = u8::try_from(p.get("len")?.as_u64()?).ok()?;
        return prefix_range(addr(p.get("addr")?)?, len);
    }
    if let Some(r) = v.get("range").and_then(Value::as_array) {
        return match r.as_slice() {
            [a, b] => Some((addr(a)?, addr(b)?)),
            _ => None,
        };
    }
    let a = addr(v)?;
    Some((a, a))
}

/// The terms of the words before an iptables rule's first match (`-s`, `-d`, `-p`, each
/// possibly after `!`).
pub(super) fn save_lead(lead: &[String]) -> Vec<FlowTerm> {
    let mut out = Vec::new();
    let mut negated = false;
    let mut i = 0;
    while i < lead.len() {
        let word = lead[i].as_str();
        if word == "!" {
            negated = true;
            i += 1;
            continue;
        }
        if matches!(word, "-f" | "--fragment") {
            negated = false;
            i += 1;
            continue;
        }
        let value = lead.get(i + 1).map(String::as_str);
        let term = match (word, value) {
            ("-p" | "--protocol", Some(p)) => proto_number(p).map(|p| FlowTerm::Proto {
                protos: vec![p],
                negated,
            }),
            ("-s" | "--source", Some(a)) => save_addr(a).map(|r| FlowTerm::Addr {
                side: Side::Source,
                ranges: vec![r],
                negated,
            }),
            ("-d" | "--destination", Some(a)) => save_addr(a).map(|r| FlowTerm::Addr {
                side: Side::Destination,
                ranges: vec![r],
                negated,
            }),
            _ => None,
        };
        out.extend(term);
        negated = false;
        i += if value.is_some() { 2 } else { 1 };
    }
    out
}

/// `10.0.0.0/8`, `192.168.1.5/32`, `2001:db8::/32`, an address alone.
fn save_addr(a: &str) -> Option<(IpAddr, IpAddr)> {
    match a.split_once('/') {
        Some((addr, len)) => prefix_range(addr.parse().ok()?, len.parse().ok()?),
        None => {
            let a: IpAddr = a.parse().ok()?;
            Some((a, a))
        }
    }
}

/// The port terms of `-m tcp` / `-m udp` options (`--dport 22`, `! --sport 1000:2000`).
pub(super) fn save_ports(name: &str, options: &[String]) -> Vec<FlowTerm> {
    if !matches!(name, "tcp" | "udp") {
        return vec![];
    }
    let mut out = Vec::new();
    let mut negated = false;
    for (i, word) in options.iter().enumerate() {
        let side = match word.as_str() {
            "!" => {
                negated = true;
                continue;
            }
            "--dport" | "--destination-port" => Side::Destination,
            "--sport" | "--source-port" => Side::Source,
            _ => {
                negated = false;
                continue;
            }
        };
        let range = options.get(i + 1).and_then(|v| match v.split_once(':') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => v.parse().ok().map(|p| (p, p)),
        });
        if let Some(range) = range {
            out.push(FlowTerm::Port {
                side,
                ranges: vec![range],
                negated,
            });
        }
        negated = false;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::ruleset_listing::save_words;

    fn m(json: &str) -> Vec<FlowTerm> {
        nft_match(&serde_json::from_str(json).unwrap())
    }

    #[test]
    fn nft_tests_on_ports_addresses_and_protocols() {
        let dport = m(
            r#"{"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 22}"#,
        );
        assert_eq!(
            dport,
            vec![
                proto_is(TCP),
                FlowTerm::Port {
                    side: Side::Destination,
                    ranges: vec![(22, 22)],
                    negated: false
                }
            ]
        );
        let not_range = m(
            r#"{"op": "!=", "left": {"payload": {"protocol": "udp", "field": "sport"}}, "right": {"range": [1000, 2000]}}"#,
        );
        assert_eq!(
            not_range[1],
            FlowTerm::Port {
                side: Side::Source,
                ranges: vec![(1000, 2000)],
                negated: true
            }
        );
        let set = m(
            r#"{"op": "==", "left": {"payload": {"protocol": "th", "field": "dport"}}, "right": {"set": [53, {"range": [100, 200]}]}}"#,
        );
        assert_eq!(
            set,
            vec![FlowTerm::Port {
                side: Side::Destination,
                ranges: vec![(53, 53), (100, 200)],
                negated: false
            }]
        );
        let saddr = m(
            r#"{"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": {"prefix": {"addr": "10.0.0.0", "len": 8}}}"#,
        );
        assert_eq!(
            saddr,
            vec![FlowTerm::Addr {
                side: Side::Source,
                ranges: vec![(
                    "10.0.0.0".parse().unwrap(),
                    "10.255.255.255".parse().unwrap()
                )],
                negated: false
            }]
        );
        let l4 = m(
            r#"{"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": {"set": ["tcp", "udp"]}}"#,
        );
        assert_eq!(
            l4,
            vec![FlowTerm::Proto {
                protos: vec![TCP, UDP],
                negated: false
            }]
        );
        // Not narrowed: a named set, an interface, a length, another operator.
        assert!(m(r#"{"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "@blocklist"}"#).is_empty());
        assert!(
            m(r#"{"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "eth0"}"#).is_empty()
        );
        assert!(m(r#"{"op": "==", "left": {"meta": {"key": "length"}}, "right": 100}"#).is_empty());
        assert!(m(r#"{"op": "<", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 1024}"#).is_empty());
    }

    #[test]
    fn iptables_lead_and_port_options() {
        let lead = save_words("! -s 10.0.0.0/8 -d 192.168.1.5/32 -i eth0 -p tcp");
        assert_eq!(
            save_lead(&lead),
            vec![
                FlowTerm::Addr {
                    side: Side::Source,
                    ranges: vec![(
                        "10.0.0.0".parse().unwrap(),
                        "10.255.255.255".parse().unwrap()
                    )],
                    negated: true
                },
                FlowTerm::Addr {
                    side: Side::Destination,
                    ranges: vec![(
                        "192.168.1.5".parse().unwrap(),
                        "192.168.1.5".parse().unwrap()
                    )],
                    negated: false
                },
                proto_is(TCP),
            ]
        );
        let opts = save_words("! --sport 1000:2000 --dport 22 --tcp-flags SYN SYN");
        assert_eq!(
            save_ports("tcp", &opts),
            vec![
                FlowTerm::Port {
                    side: Side::Source,
                    ranges: vec![(1000, 2000)],
                    negated: true
                },
                FlowTerm::Port {
                    side: Side::Destination,
                    ranges: vec![(22, 22)],
                    negated: false
                },
            ]
        );
        assert!(save_ports("multiport", &save_words("--dports 22,80")).is_empty());
    }

    #[test]
    fn upper_bounds_on_conntrack_counters() {
        let bound = |json: &str| nft_counter_bound(&serde_json::from_str(json).unwrap());
        let at_most = |dir, unit, max| Some(FlowTerm::CounterAtMost { dir, unit, max });
        use CounterDir::*;
        use CounterUnit::*;
        assert_eq!(
            bound(
                r#"{"op": "==", "left": {"ct": {"key": "packets", "dir": "original"}}, "right": {"range": [1, 6]}}"#
            ),
            at_most(Original, Packets, 6)
        );
        assert_eq!(
            bound(r#"{"op": "<", "left": {"ct": {"key": "packets"}}, "right": 10}"#),
            at_most(Both, Packets, 9)
        );
        assert_eq!(
            bound(
                r#"{"op": "<=", "left": {"ct": {"key": "bytes", "dir": "reply"}}, "right": 1000}"#
            ),
            at_most(Reply, Bytes, 1000)
        );
        assert_eq!(
            bound(r#"{"op": ">", "left": {"ct": {"key": "packets"}}, "right": 10}"#),
            None
        );
        assert_eq!(
            bound(r#"{"op": "<", "left": {"ct": {"key": "avgpkt"}}, "right": 10}"#),
            None
        );
        let save = |s: &str| save_connbytes_bound(&save_words(s));
        assert_eq!(
            save("--connbytes 1:6 --connbytes-dir original --connbytes-mode packets"),
            at_most(Original, Packets, 6)
        );
        assert_eq!(
            save("--connbytes 0:1000 --connbytes-dir both --connbytes-mode bytes"),
            at_most(Both, Bytes, 1000)
        );
        assert_eq!(
            save("--connbytes 10 --connbytes-dir original --connbytes-mode packets"),
            None
        );
        assert_eq!(
            save("! --connbytes 1:6 --connbytes-dir original --connbytes-mode packets"),
            None
        );
        assert_eq!(
            save("--connbytes 1:6 --connbytes-dir original --connbytes-mode avgpkt"),
            None
        );
    }
}
