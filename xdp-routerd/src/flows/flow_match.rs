//! Which connections a firewall rule can match: its flow-constant tests (protocol, ports,
//! addresses) before what it does per packet, so that a rule that must see every packet holds
//! only the connections it can match (see [`super::per_packet`]).
//!
//! A rule's tests are read in the kernel's order; only those before the rule's first per-packet
//! part narrow it (`log tcp dport 22` logs every packet). A test of anything else (an
//! interface, a mark, a named set, a concatenation) narrows nothing: the rule is taken to match
//! whatever it says. The match is checked against every form a packet of the connection can
//! have at a `prerouting`, `forward` or `postrouting` hook, in both directions, before and
//! after NAT (six address/port tuples): a connection is held when any of them can match, so
//! narrowing never lets the fast path carry a packet the rule could have seen.
//!
//! A test with an upper bound on conntrack's own counters (`ct original packets 1-6`,
//! `-m connbytes --connbytes 1:6`, what DPI tools use to see a connection's first packets)
//! narrows it in time: while held, every packet of the connection goes through the kernel and
//! is counted, and once a counter has passed the bound it only grows (the fast path adds
//! nothing to it), so no later packet can match. Such a connection is held until the daemon
//! reads a counter past the bound ([`FlowMatch::past_bound`]).

use std::{fmt, net::IpAddr};

use serde::{Deserialize, Serialize};

use super::{accounting::DirTraffic, conntrack::CtTuple};

/// The packet field a test reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    Source,
    Destination,
}

/// Which of conntrack's counters a bound is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CounterDir {
    Original,
    Reply,
    /// Both directions summed (`ct packets`, `--connbytes-dir both`).
    Both,
}

/// What a counter bound counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CounterUnit {
    Packets,
    Bytes,
}

/// One flow-constant test of a rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FlowTerm {
    /// The IP protocol is one of `protos` (or none of them, `negated`).
    Proto { protos: Vec<u8>, negated: bool },
    /// A TCP or UDP port in one of the inclusive `ranges`.
    Port {
        side: Side,
        ranges: Vec<(u16, u16)>,
        negated: bool,
    },
    /// An address in one of the inclusive `ranges` (a prefix is its first and last address).
    Addr {
        side: Side,
        ranges: Vec<(IpAddr, IpAddr)>,
        negated: bool,
    },
    /// Conntrack's counter is at most `max` (it may match only until the counter passes it).
    CounterAtMost {
        dir: CounterDir,
        unit: CounterUnit,
        max: u64,
    },
}

/// One form of a packet of a connection: source, source port, destination, destination port.
type Packet = (IpAddr, u16, IpAddr, u16);

impl FlowTerm {
    fn test(&self, proto: u8, p: &Packet) -> bool {
        match self {
            FlowTerm::Proto { protos, negated } => protos.contains(&proto) != *negated,
            FlowTerm::Port {
                side,
                ranges,
                negated,
            } => {
                let port = if *side == Side::Source { p.1 } else { p.3 };
                ranges.iter().any(|&(a, b)| (a..=b).contains(&port)) != *negated
            }
            FlowTerm::Addr {
                side,
                ranges,
                negated,
            } => {
                let addr = if *side == Side::Source { p.0 } else { p.2 };
                let inside = ranges.iter().any(|&(a, b)| {
                    a.is_ipv4() == addr.is_ipv4()
                        && ordinal(a) <= ordinal(addr)
                        && ordinal(addr) <= ordinal(b)
                });
                inside != *negated
            }
            // Checked against the counters read, by `past_bound`.
            FlowTerm::CounterAtMost { .. } => true,
        }
    }

    /// Whether the counters `c` (as read; the kernel's can only be higher) are past this
    /// term's bound.
    fn past(&self, c: &DirTraffic) -> bool {
        let FlowTerm::CounterAtMost { dir, unit, max } = self else {
            return false;
        };
        let count = |d: usize| match unit {
            CounterUnit::Packets => c[d].packets,
            CounterUnit::Bytes => c[d].bytes,
        };
        let n = match dir {
            CounterDir::Original => count(0),
            CounterDir::Reply => count(1),
            CounterDir::Both => count(0).saturating_add(count(1)),
        };
        n > *max
    }
}

/// An address as a number (IPv4 and IPv6 are never compared with each other).
fn ordinal(a: IpAddr) -> u128 {
    match a {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The connections a rule can match: all of `terms` hold for one form of one of its packets.
/// No terms: every connection.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FlowMatch {
    pub terms: Vec<FlowTerm>,
}

impl FlowMatch {
    /// Every connection (nothing narrows the rule).
    pub fn is_every_flow(&self) -> bool {
        self.terms.is_empty()
    }

    /// Whether a packet of the connection `orig`/`reply` can match, at any hook, in either
    /// direction, before or after NAT.
    pub fn may_match(&self, orig: &CtTuple, reply: &CtTuple) -> bool {
        let (o, r) = (orig, reply);
        let forms: [Packet; 6] = [
            // Original direction: as it arrives, after DNAT, after SNAT.
            (o.src, o.sport, o.dst, o.dport),
            (o.src, o.sport, r.src, r.sport),
            (r.dst, r.dport, r.src, r.sport),
            // Reply direction: as it arrives, after its reverse SNAT, after its reverse DNAT.
            (r.src, r.sport, r.dst, r.dport),
            (r.src, r.sport, o.src, o.sport),
            (o.dst, o.dport, o.src, o.sport),
        ];
        forms
            .iter()
            .any(|p| self.terms.iter().all(|t| t.test(o.proto, p)))
    }

    /// Whether it has a counter bound: a connection it holds is released once a counter has
    /// passed it.
    pub fn is_bounded(&self) -> bool {
        self.terms
            .iter()
            .any(|t| matches!(t, FlowTerm::CounterAtMost { .. }))
    }

    /// Whether conntrack's counters `c`, as read, are past one of its bounds: no later packet
    /// of the connection can match.
    pub fn past_bound(&self, c: &DirTraffic) -> bool {
        self.terms.iter().any(|t| t.past(c))
    }
}

impl fmt::Display for FlowMatch {
    /// `l4proto tcp dport 22`, `saddr 10.0.0.0-10.255.255.255`, `ct original packets <= 6`:
    /// what narrows the rule.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for t in &self.terms {
            if !first {
                f.write_str(" ")?;
            }
            first = false;
            let not = |negated: bool| if negated { "!= " } else { "" };
            match t {
                FlowTerm::Proto { protos, negated } => {
                    let names: Vec<String> = protos.iter().map(|p| proto_name(*p)).collect();
                    write!(f, "l4proto {}{}", not(*negated), names.join(","))?;
                }
                FlowTerm::Port {
                    side,
                    ranges,
                    negated,
                } => {
                    let field = if *side == Side::Source {
                        "sport"
                    } else {
                        "dport"
                    };
                    write!(f, "{field} {}{}", not(*negated), listed(ranges))?;
                }
                FlowTerm::Addr {
                    side,
                    ranges,
                    negated,
                } => {
                    let field = if *side == Side::Source {
                        "saddr"
                    } else {
                        "daddr"
                    };
                    write!(f, "{field} {}{}", not(*negated), listed(ranges))?;
                }
                FlowTerm::CounterAtMost { dir, unit, max } => {
                    let dir = match dir {
                        CounterDir::Original => "original ",
                        CounterDir::Reply => "reply ",
                        CounterDir::Both => "",
                    };
                    let unit = match unit {
                        CounterUnit::Packets => "packets",
                        CounterUnit::Bytes => "bytes",
                    };
                    write!(f, "ct {dir}{unit} <= {max}")?;
                }
            }
        }
        Ok(())
    }
}

/// `22,1000-2000`: inclusive ranges, a single value as itself.
fn listed<T: PartialEq + fmt::Display>(ranges: &[(T, T)]) -> String {
    let r: Vec<String> = ranges
        .iter()
        .map(|(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    r.join(",")
}

fn proto_name(p: u8) -> String {
    match p {
        6 => "tcp".into(),
        17 => "udp".into(),
        1 => "icmp".into(),
        58 => "icmpv6".into(),
        132 => "sctp".into(),
        136 => "udplite".into(),
        n => n.to_string(),
    }
}

/// The IP protocol number of a name nft or iptables writes (`tcp`, `udp`, a number).
pub fn proto_number(name: &str) -> Option<u8> {
    Some(match name {
        "tcp" => 6,
        "udp" => 17,
        "icmp" => 1,
        "icmpv6" | "ipv6-icmp" => 58,
        "sctp" => 132,
        "udplite" => 136,
        "dccp" => 33,
        "gre" => 47,
        "esp" => 50,
        "ah" => 51,
        n => n.parse().ok()?,
    })
}

/// The inclusive range of addresses of `a/len`; `None` for a length beyond the family's.
pub fn prefix_range(a: IpAddr, len: u8) -> Option<(IpAddr, IpAddr)> {
    match a {
        IpAddr::V4(v) => {
            let len = u32::from(len);
            if len > 32 {
                return None;
            }
            let host = if len == 32 { 0 } else { u32::MAX >> len };
            let first = u32::from(v) & !host;
            Some((IpAddr::V4(first.into()), IpAddr::V4((first | host).into())))
        }
        IpAddr::V6(v) => {
            let len = u32::from(len);
            if len > 128 {
                return None;
            }
            let host = if len == 128 { 0 } else { u128::MAX >> len };
            let first = u128::from(v) & !host;
            Some((IpAddr::V6(first.into()), IpAddr::V6((first | host).into())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flows::tests::tuple as t;

    /// LAN host 192.168.1.10:40000 to 203.0.113.7:<dport> masqueraded behind 198.51.100.2:61000.
    fn nat(dport: u16, proto: u8) -> (CtTuple, CtTuple) {
        (
            t("192.168.1.10", 40000, "203.0.113.7", dport, proto),
            t("203.0.113.7", dport, "198.51.100.2", 61000, proto),
        )
    }

    fn dport(ports: &[(u16, u16)], negated: bool) -> FlowTerm {
        FlowTerm::Port {
            side: Side::Destination,
            ranges: ports.to_vec(),
            negated,
        }
    }

    const TCP: u8 = 6;
    const UDP: u8 = 17;

    #[test]
    fn a_port_test_matches_connections_to_that_port_in_both_directions() {
        let ssh = FlowMatch {
            terms: vec![
                FlowTerm::Proto {
                    protos: vec![TCP],
                    negated: false,
                },
                dport(&[(22, 22)], false),
            ],
        };
        let (o, r) = nat(22, TCP);
        assert!(ssh.may_match(&o, &r));
        // The replies' destination port is the LAN host's port or the NAT port: no match.
        let (o, r) = nat(443, TCP);
        assert!(!ssh.may_match(&o, &r));
        // UDP to port 22 is not TCP.
        let (o, r) = nat(22, UDP);
        assert!(!ssh.may_match(&o, &r));
        // A reply's destination port of 22 (the LAN host's own port 22) can match.
        let o = t("192.168.1.10", 22, "203.0.113.7", 443, TCP);
        let r = t("203.0.113.7", 443, "198.51.100.2", 22, TCP);
        assert!(ssh.may_match(&o, &r));
        assert_eq!(ssh.to_string(), "l4proto tcp dport 22");
    }

    #[test]
    fn every_form_before_and_after_nat_is_tried() {
        // A port forward: WAN client to the router's 8080, DNATed to 192.168.1.20:80.
        let o = t("203.0.113.7", 50000, "198.51.100.2", 8080, TCP);
        let r = t("192.168.1.20", 80, "203.0.113.7", 50000, TCP);
        // A forward-chain rule sees the DNATed destination, a prerouting one the public one.
        for port in [80, 8080] {
            let m = FlowMatch {
                terms: vec![dport(&[(port, port)], false)],
            };
            assert!(m.may_match(&o, &r), "{port}");
        }
        let inside = FlowMatch {
            terms: vec![FlowTerm::Addr {
                side: Side::Destination,
                ranges: vec![prefix_range("192.168.1.0".parse().unwrap(), 24).unwrap()],
                negated: false,
            }],
        };
        assert!(inside.may_match(&o, &r));
        // Masquerade: the source after SNAT is the router's address.
        let (o, r) = nat(443, TCP);
        let wan_source = FlowMatch {
            terms: vec![FlowTerm::Addr {
                side: Side::Source,
                ranges: vec![prefix_range("198.51.100.2".parse().unwrap(), 32).unwrap()],
                negated: false,
            }],
        };
        assert!(wan_source.may_match(&o, &r));
        let elsewhere = FlowMatch {
            terms: vec![FlowTerm::Addr {
                side: Side::Source,
                ranges: vec![prefix_range("10.0.0.0".parse().unwrap(), 8).unwrap()],
                negated: false,
            }],
        };
        assert!(!elsewhere.may_match(&o, &r));
    }

    #[test]
    fn negations_ranges_and_families() {
        let (o, r) = nat(443, TCP);
        // Every form has some destination port other than 22.
        assert!(
            FlowMatch {
                terms: vec![dport(&[(22, 22)], true)]
            }
            .may_match(&o, &r)
        );
        // No form has a destination port outside 0-65535.
        assert!(
            !FlowMatch {
                terms: vec![dport(&[(0, 65535)], true)]
            }
            .may_match(&o, &r)
        );
        assert!(
            FlowMatch {
                terms: vec![dport(&[(400, 500)], false)]
            }
            .may_match(&o, &r)
        );
        let v6 = FlowMatch {
            terms: vec![FlowTerm::Addr {
                side: Side::Source,
                ranges: vec![prefix_range("::".parse().unwrap(), 0).unwrap()],
                negated: false,
            }],
        };
        // An IPv6 range never contains an IPv4 address.
        assert!(!v6.may_match(&o, &r));
        assert!(FlowMatch::default().may_match(&o, &r));
        assert!(FlowMatch::default().is_every_flow());
    }

    #[test]
    fn prefixes_and_protocol_names() {
        assert_eq!(
            prefix_range("10.1.2.3".parse().unwrap(), 8),
            Some((
                "10.0.0.0".parse().unwrap(),
                "10.255.255.255".parse().unwrap()
            ))
        );
        assert_eq!(
            prefix_range("2001:db8::1".parse().unwrap(), 128),
            Some((
                "2001:db8::1".parse().unwrap(),
                "2001:db8::1".parse().unwrap()
            ))
        );
        assert_eq!(prefix_range("10.0.0.0".parse().unwrap(), 33), None);
        assert_eq!(proto_number("udp"), Some(17));
        assert_eq!(proto_number("47"), Some(47));
        assert_eq!(proto_number("all"), None);
    }

    #[test]
    fn a_counter_bound_holds_until_a_counter_read_is_past_it() {
        use crate::flows::accounting::Traffic;
        let first_six = FlowMatch {
            terms: vec![FlowTerm::CounterAtMost {
                dir: CounterDir::Original,
                unit: CounterUnit::Packets,
                max: 6,
            }],
        };
        let (o, r) = nat(443, TCP);
        assert!(first_six.may_match(&o, &r));
        assert!(first_six.is_bounded() && !FlowMatch::default().is_bounded());
        let read = |orig: u64, reply: u64| {
            [
                Traffic {
                    packets: orig,
                    bytes: orig * 100,
                },
                Traffic {
                    packets: reply,
                    bytes: reply * 100,
                },
            ]
        };
        assert!(!first_six.past_bound(&read(6, 50)));
        assert!(first_six.past_bound(&read(7, 0)));
        let both_bytes = FlowMatch {
            terms: vec![FlowTerm::CounterAtMost {
                dir: CounterDir::Both,
                unit: CounterUnit::Bytes,
                max: 1000,
            }],
        };
        assert!(!both_bytes.past_bound(&read(5, 5)));
        assert!(both_bytes.past_bound(&read(6, 5)));
        assert_eq!(first_six.to_string(), "ct original packets <= 6");
    }
}
