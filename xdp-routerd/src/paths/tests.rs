//! Batched route resolution against an in-memory routing table.

use std::{collections::HashSet, net::IpAddr};

use super::*;
use crate::flows::conntrack::{CtStatus, CtTuple};

/// LAN 10.0.1.0/24 on ifindex 3, everything else via WAN ifindex 2; mark 7 leaves by WAN2
/// (ifindex 5); 10.0.9.0/24 is unreachable; the router's own addresses are local. Counts
/// queries and batches.
#[derive(Default)]
struct FakeKernel {
    queries: Vec<RouteQuery>,
    batches: usize,
    /// Forwarding queries fail (as when the source fails rp_filter).
    forward_fails: bool,
}

const LOCAL: [&str; 2] = ["203.0.113.1", "10.0.1.1"];

impl FakeKernel {
    fn route(&self, q: &RouteQuery) -> Option<RouteInfo> {
        let unicast = |oif| {
            Some(RouteInfo {
                kind: RouteType::Unicast,
                oif: Some(oif),
            })
        };
        if LOCAL.iter().any(|l| l.parse::<IpAddr>().unwrap() == q.dst) {
            return Some(RouteInfo {
                kind: RouteType::Local,
                oif: Some(1),
            });
        }
        let IpAddr::V4(dst) = q.dst else {
            return unicast(2);
        };
        let o = dst.octets();
        match ([o[0], o[1], o[2]], q.from) {
            ([10, 0, 9], _) => None,
            (_, Some(_)) if self.forward_fails => None,
            ([10, 0, 1], _) => unicast(3),
            (_, Some((_, _, 7))) => unicast(5),
            _ => unicast(2),
        }
    }
}

impl RouteSource for FakeKernel {
    async fn lookup_all(&mut self, queries: &[RouteQuery]) -> Vec<Option<RouteInfo>> {
        self.batches += 1;
        self.queries.extend_from_slice(queries);
        queries.iter().map(|q| self.route(q)).collect()
    }
}

/// The same kernel asked one query at a time: what the daemon did before batching.
struct Direct<'a>(&'a FakeKernel);

impl PathOracle for Direct<'_> {
    fn ingress_for(&self, addr: IpAddr) -> Option<u32> {
        match self.0.route(&RouteQuery {
            dst: addr,
            from: None,
        }) {
            Some(RouteInfo {
                kind: RouteType::Unicast,
                oif,
            }) => oif,
            _ => None,
        }
    }
    fn is_local(&self, addr: IpAddr) -> bool {
        matches!(
            self.0.route(&RouteQuery {
                dst: addr,
                from: None
            }),
            Some(RouteInfo {
                kind: RouteType::Local,
                ..
            })
        )
    }
    fn forward_egress(&self, src: IpAddr, dst: IpAddr, iif: u32, mark: u32) -> Option<u32> {
        match self.0.route(&RouteQuery {
            dst,
            from: Some((src, iif, mark)),
        }) {
            Some(RouteInfo {
                kind: RouteType::Unicast,
                oif,
            }) => oif,
            Some(_) => None,
            None => self.ingress_for(dst),
        }
    }
}

fn tuple(src: &str, sport: u16, dst: &str, dport: u16) -> CtTuple {
    CtTuple {
        src: src.parse().unwrap(),
        dst: dst.parse().unwrap(),
        proto: 6,
        sport,
        dport,
    }
}

/// LAN `src`:`sport` -> `dst`:443, masqueraded to 203.0.113.1, established.
fn snat(src: &str, sport: u16, dst: &str, mark: u32) -> CtEntry {
    CtEntry {
        id: None,
        orig: tuple(src, sport, dst, 443),
        reply: tuple(dst, 443, "203.0.113.1", sport),
        // IPS_SEEN_REPLY | IPS_ASSURED
        status: CtStatus::from_bits_retain(0b110),
        tcp_flags: None,
        tcp_state: Some(3),
        timeout: Some(300),
        mark,
        zone: 0,
        has_helper: false,
    }
}

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

fn entries() -> Vec<CtEntry> {
    let mut v = Vec::new();
    for host in 2..12 {
        for port in 0..20 {
            let mark = if port % 5 == 0 { 7 } else { 0 };
            v.push(snat(
                &format!("10.0.1.{host}"),
                40000 + port,
                "198.51.100.7",
                mark,
            ));
        }
    }
    // Unreachable destination, a source behind no route, and a connection to the router itself.
    v.push(snat("10.0.1.2", 1, "10.0.9.9", 0));
    v.push(snat("10.0.9.2", 2, "198.51.100.7", 0));
    let mut to_router = snat("10.0.1.2", 3, "10.0.1.1", 0);
    to_router.reply.dst = "10.0.1.2".parse().unwrap();
    v.push(to_router);
    v
}

#[test]
fn resolved_answers_equal_one_query_at_a_time() {
    for forward_fails in [false, true] {
        let mut kernel = FakeKernel {
            forward_fails,
            ..FakeKernel::default()
        };
        let entries = entries();
        let resolved = block_on(resolve(&mut kernel, &entries));
        let direct = Direct(&kernel);
        for e in &entries {
            let ingress = resolved.ingress_for(e.orig.src);
            assert_eq!(ingress, direct.ingress_for(e.orig.src), "{e:?}");
            if let Some(iif) = ingress {
                assert_eq!(
                    resolved.forward_egress(e.orig.src, e.reply.src, iif, e.mark),
                    direct.forward_egress(e.orig.src, e.reply.src, iif, e.mark),
                    "{e:?}"
                );
            }
            if e.reply.dst != e.orig.src {
                assert_eq!(resolved.is_local(e.reply.dst), direct.is_local(e.reply.dst));
            }
        }
        assert_eq!(resolved.missed(), 0, "every question was looked up");
    }
}

#[test]
fn a_flow_managers_questions_are_all_answered_in_three_batches() {
    let mut kernel = FakeKernel::default();
    let entries = entries();
    let resolved = block_on(resolve(&mut kernel, &entries));
    let mut m = crate::flows::FlowManager::new();
    m.set_managed([(2, "wan".into()), (3, "lan".into()), (5, "wan2".into())].into());
    let mut table = crate::flows::fake::FakeTable::default();
    for e in entries.clone() {
        m.upsert(e, &mut table, &resolved);
    }
    assert_eq!(resolved.missed(), 0);
    // 200 LAN connections offloaded; the unreachable ones and the one to the router are not.
    assert_eq!(m.len(), 200);
    assert!(kernel.batches <= 3, "{} batches", kernel.batches);
}

#[test]
fn each_distinct_query_is_asked_once() {
    let mut kernel = FakeKernel::default();
    let entries = entries();
    block_on(resolve(&mut kernel, &entries));
    let distinct: HashSet<_> = kernel.queries.iter().collect();
    assert_eq!(distinct.len(), kernel.queries.len(), "no query asked twice");
    // 10 LAN hosts + 10.0.9.2 + NAT address + forwarding queries for (host, mark) pairs + ...:
    // far fewer than three per connection.
    assert!(
        kernel.queries.len() < entries.len(),
        "{} queries for {} connections",
        kernel.queries.len(),
        entries.len()
    );
}

#[test]
fn entries_conntrack_does_not_let_us_offload_ask_nothing() {
    let mut kernel = FakeKernel::default();
    let mut e = snat("10.0.1.2", 40000, "198.51.100.7", 0);
    e.status = CtStatus::from_bits_retain(0);
    let resolved = block_on(resolve(&mut kernel, [&e]));
    assert!(resolved.is_empty());
    assert_eq!(kernel.batches, 0);
}

#[test]
fn a_question_not_looked_up_is_counted_and_answered_no_route() {
    let resolved = ResolvedPaths::default();
    assert_eq!(resolved.ingress_for("10.0.1.2".parse().unwrap()), None);
    assert!(!resolved.is_local("203.0.113.1".parse().unwrap()));
    assert_eq!(resolved.missed(), 2);
}

#[test]
fn stale_touches_entries_by_every_address_resolve_asks_about() {
    let e = snat("10.0.1.2", 40000, "198.51.100.7", 0);
    let prefix = |a: &str, len| Prefix::new(a.parse().unwrap(), len).unwrap();
    let touched = |p| {
        let mut s = Stale::default();
        s.add_prefix(p);
        s.touches(&e)
    };
    // The source, the NAT address and the remote end (the reply's source).
    assert!(touched(prefix("10.0.1.0", 24)));
    assert!(touched(prefix(&e.reply.dst.to_string(), 32)));
    assert!(touched(prefix("198.51.100.7", 32)));
    assert!(touched(prefix("0.0.0.0", 0)));
    // Other prefixes, and the other family's default route, do not.
    assert!(!touched(prefix("198.51.100.8", 32)));
    assert!(!touched(prefix("172.16.0.0", 12)));
    assert!(!touched(prefix("::", 0)));
    // Named connections, and everything.
    let mut s = Stale::default();
    assert!(s.is_empty() && !s.touches(&e));
    s.add_conns([e.orig]);
    assert!(s.touches(&e) && !s.is_all());
    let mut all = Stale::default();
    all.merge(Stale::all());
    all.add_prefix(prefix("172.16.0.0", 12));
    assert!(all.is_all() && all.touches(&e));
}
