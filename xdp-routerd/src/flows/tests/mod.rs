//! FlowManager against in-memory fakes of the maps and the routing.

use std::{
    collections::{BTreeMap, HashSet},
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use xdp_router_common::{FLOW_F_REPLY, HOST_SLOT_FIRST, HOST_SLOT_NONE, checksum};

use super::conntrack::CtStatus;
use super::*;

use super::fake::FakeTable;
use super::stored::{Stored, TupleV4};
use super::upsert::OncePerInterval;

/// LAN 10.0.1.0/24 and fd00:1::/64 on ifindex 3, everything else via WAN ifindex 2.
struct FakePaths {
    local: HashSet<IpAddr>,
    wan: u32,
}

impl PathOracle for FakePaths {
    fn ingress_for(&self, addr: IpAddr) -> Option<u32> {
        if self.local.contains(&addr) {
            return None;
        }
        match addr {
            IpAddr::V4(a) if a.octets()[..3] == [10, 0, 1] => Some(3),
            IpAddr::V6(a) if a.segments()[..4] == [0xfd00, 1, 0, 0] => Some(3),
            _ => Some(self.wan),
        }
    }
    fn is_local(&self, addr: IpAddr) -> bool {
        self.local.contains(&addr)
    }
}

fn paths() -> FakePaths {
    FakePaths {
        local: ["203.0.113.1", "10.0.1.1", "fd00:1::1"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect(),
        wan: 2,
    }
}

fn managed() -> BTreeMap<u32, String> {
    BTreeMap::from([(2, "eth0".to_string()), (3, "eth1".to_string())])
}

const IPS_SEEN_REPLY: u32 = 1 << 1;
const IPS_ASSURED: u32 = 1 << 2;
const TCP_ESTABLISHED: u8 = 3;

pub(super) fn tuple(src: &str, sport: u16, dst: &str, dport: u16, proto: u8) -> CtTuple {
    CtTuple {
        src: src.parse().unwrap(),
        dst: dst.parse().unwrap(),
        proto,
        sport,
        dport,
    }
}

/// LAN 10.0.1.2:40000 -> 198.51.100.7:443, masqueraded to 203.0.113.1:61000.
fn snat_tcp() -> CtEntry {
    CtEntry {
        id: Some(1),
        orig: tuple("10.0.1.2", 40000, "198.51.100.7", 443, 6),
        reply: tuple("198.51.100.7", 443, "203.0.113.1", 61000, 6),
        status: CtStatus::from_bits_retain(IPS_SEEN_REPLY | IPS_ASSURED),
        tcp_flags: None,
        tcp_state: Some(TCP_ESTABLISHED),
        timeout: Some(300),
        mark: 0,
        zone: 0,
        has_helper: false,
    }
}

fn manager() -> FlowManager {
    let mut m = FlowManager::new();
    m.set_managed(managed());
    m
}

#[test]
fn snat_connection_gets_both_directions_with_correct_rewrite() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    assert_eq!(m.upsert(snat_tcp(), &mut t, &paths()), Upsert::Added);
    assert_eq!(t.v4.len(), 2);
    assert_eq!(m.directions(), (2, 0));
    let ip = |s: &str| u32::from_ne_bytes(s.parse::<Ipv4Addr>().unwrap().octets());

    let orig_key = FlowKeyV4 {
        ifindex: 3,
        src_be: ip("10.0.1.2"),
        dst_be: ip("198.51.100.7"),
        sport_be: 40000u16.to_be(),
        dport_be: 443u16.to_be(),
        proto: 6,
        _pad: [0; 3],
    };
    let v = t.v4[&orig_key];
    assert_eq!(v.new_src_be, ip("203.0.113.1"));
    assert_eq!(v.new_sport_be, 61000u16.to_be());
    assert_eq!(v.new_dst_be, ip("198.51.100.7"));
    assert_eq!(v.new_dport_be, 443u16.to_be());
    assert_eq!(v.flags, 0);

    let reply_key = FlowKeyV4 {
        ifindex: 2,
        src_be: ip("198.51.100.7"),
        dst_be: ip("203.0.113.1"),
        sport_be: 443u16.to_be(),
        dport_be: 61000u16.to_be(),
        proto: 6,
        _pad: [0; 3],
    };
    let r = t.v4[&reply_key];
    assert_eq!(r.new_dst_be, ip("10.0.1.2"));
    assert_eq!(r.new_dport_be, 40000u16.to_be());
    assert_eq!(r.flags, FLOW_F_REPLY);

    // Applying both diffs in turn is the identity (the reply undoes the original's rewrite).
    assert_eq!(
        checksum::apply(checksum::apply(0x1234, v.l4_csum_diff), r.l4_csum_diff),
        0x1234
    );
    assert_eq!(
        checksum::apply(checksum::apply(0xbeef, v.l3_csum_diff), r.l3_csum_diff),
        0xbeef
    );
}

/// Each direction is written unarmed and indexed by its tuple as the kernel sends it out (after
/// NAT), so the TC egress program can arm it; removal drops the index too.
#[test]
fn directions_start_unarmed_and_are_indexed_by_their_translated_tuple() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    assert_eq!(m.upsert(snat_tcp(), &mut t, &paths()), Upsert::Added);
    assert_eq!(t.arm_v4.len(), 2);
    for (arm, key) in &t.arm_v4 {
        let v = t.v4[key];
        assert_eq!(v.armed_generation, 0);
        assert_eq!(v.fib_mark, 0);
        assert_eq!(
            (
                arm.src_be,
                arm.dst_be,
                arm.sport_be,
                arm.dport_be,
                arm.proto
            ),
            (
                v.new_src_be,
                v.new_dst_be,
                v.new_sport_be,
                v.new_dport_be,
                key.proto
            )
        );
    }
    // The original direction leaves masqueraded: 203.0.113.1:61000 -> 198.51.100.7:443.
    let ip = |s: &str| u32::from_ne_bytes(s.parse::<Ipv4Addr>().unwrap().octets());
    let out = ArmKeyV4 {
        src_be: ip("203.0.113.1"),
        dst_be: ip("198.51.100.7"),
        sport_be: 61000u16.to_be(),
        dport_be: 443u16.to_be(),
        proto: 6,
        _pad: [0; 3],
    };
    assert_eq!(t.arm_v4[&out].ifindex, 3);
    assert!(m.forget(&snat_tcp().orig, &mut t));
    assert!(t.arm_v4.is_empty() && t.v4.is_empty());
}

/// Policy routing: the replies' ingress is the original direction's egress as the kernel routes
/// it (source, ingress interface and connection mark), not the plain route to the peer.
#[test]
fn reply_ingress_follows_the_original_directions_policy_route() {
    struct MarkPaths(FakePaths);
    impl PathOracle for MarkPaths {
        fn ingress_for(&self, addr: IpAddr) -> Option<u32> {
            self.0.ingress_for(addr)
        }
        fn is_local(&self, addr: IpAddr) -> bool {
            self.0.is_local(addr)
        }
        fn forward_egress(&self, src: IpAddr, dst: IpAddr, iif: u32, mark: u32) -> Option<u32> {
            // `ip rule fwmark 2 table 2` with a second WAN on ifindex 4.
            assert_eq!((src, iif), ("10.0.1.2".parse().unwrap(), 3));
            if mark == 2 {
                Some(4)
            } else {
                self.ingress_for(dst)
            }
        }
    }
    let mut m = FlowManager::new();
    m.set_managed(BTreeMap::from([
        (2, "eth0".to_string()),
        (3, "eth1".to_string()),
        (4, "eth2".to_string()),
    ]));
    let mut t = FakeTable::default();
    let marked = CtEntry {
        mark: 2,
        ..snat_tcp()
    };
    assert_eq!(m.upsert(marked, &mut t, &MarkPaths(paths())), Upsert::Added);
    let ingresses: HashSet<u32> = t.v4.keys().map(|k| k.ifindex).collect();
    assert_eq!(ingresses, HashSet::from([3, 4]));
}

#[test]
fn routed_ipv6_has_no_rewrite() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    let e = CtEntry {
        orig: tuple("fd00:1::2", 5000, "fd00:2::2", 5201, 6),
        reply: tuple("fd00:2::2", 5201, "fd00:1::2", 5000, 6),
        ..snat_tcp()
    };
    assert_eq!(m.upsert(e, &mut t, &paths()), Upsert::Added);
    assert_eq!(t.v6.len(), 2);
    assert_eq!(m.directions(), (0, 2));
    for (k, v) in &t.v6 {
        // Nothing rewritten: the new tuple is the packet's own.
        assert_eq!(
            (v.new_src_be, v.new_dst_be, v.new_sport_be, v.new_dport_be),
            (k.src_be, k.dst_be, k.sport_be, k.dport_be)
        );
        assert_eq!(checksum::apply(0x4321, v.l4_csum_diff), 0x4321);
    }
}

#[test]
fn not_established_is_skipped_and_removes_existing() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    assert_eq!(m.upsert(snat_tcp(), &mut t, &paths()), Upsert::Added);
    // FIN seen by the kernel: conntrack moves to FIN_WAIT (4).
    let closing = CtEntry {
        tcp_state: Some(4),
        ..snat_tcp()
    };
    assert_eq!(
        m.upsert(closing, &mut t, &paths()),
        Upsert::Skipped(Skip::NotEstablished)
    );
    assert!(t.v4.is_empty());
    assert!(m.is_empty());
    assert_eq!(m.stats().removed_total, 1);
}

#[test]
fn would_add_tells_what_upsert_will_write() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    assert!(m.would_add(&snat_tcp(), &paths()));
    assert!(t.v4.is_empty(), "asking writes nothing");
    assert_eq!(m.upsert(snat_tcp(), &mut t, &paths()), Upsert::Added);
    assert!(!m.would_add(&snat_tcp(), &paths()), "already offloaded");
    let closing = CtEntry {
        tcp_state: Some(4),
        ..snat_tcp()
    };
    assert!(!m.would_add(&closing, &paths()));
    let p = FakePaths { wan: 9, ..paths() };
    assert!(!m.would_add(&snat_tcp(), &p), "path not managed");
    // Parked while its path is not managed; offloadable again once it is.
    let mut t2 = FakeTable::default();
    let mut m2 = manager();
    m2.upsert(snat_tcp(), &mut t2, &p);
    let snapshot = m2.snapshot();
    assert!(m2.parked_tcp_to_offload(&snapshot, &p).is_empty());
    assert_eq!(m2.parked_tcp_to_offload(&snapshot, &paths()), [snat_tcp()]);
    // Offloaded ones are not parked.
    assert!(m.parked_tcp_to_offload(&m.snapshot(), &paths()).is_empty());
}

#[test]
fn update_with_same_path_keeps_counters() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    m.upsert(snat_tcp(), &mut t, &paths());
    for v in t.v4.values_mut() {
        v.counters.packets = 7;
    }
    assert_eq!(m.upsert(snat_tcp(), &mut t, &paths()), Upsert::Unchanged);
    assert!(t.v4.values().all(|v| v.counters.packets == 7));
}

#[test]
fn counters_survive_rewrites_and_entries_count_for_the_lan_host() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    m.set_managed(BTreeMap::from([
        (2, "eth0".to_string()),
        (3, "eth1".to_string()),
        (4, "eth2".to_string()),
    ]));
    m.set_lan([3].into());
    m.set_host_limit(8);
    let host: IpAddr = "10.0.1.2".parse().unwrap();
    let forward = |t: &mut FakeTable, packets: u64| {
        for v in t.v4.values_mut() {
            v.counters.packets += packets;
            v.counters.bytes += 1500 * packets;
        }
    };
    let fastpath = |m: &FlowManager, t: &FakeTable| {
        let conn = m.conns().next().expect("offloaded");
        let live = map_entries::read_traffic(t, &conn.keys);
        [0, 1].map(|i| conn.carried[i] + live[i])
    };
    let traffic = |packets: u64| accounting::Traffic {
        packets,
        bytes: 1500 * packets,
    };
    // The LAN client sends the original direction and receives the reply; the WAN end is no
    // LAN host.
    let host_slots = |t: &FakeTable| {
        let mut s: Vec<(bool, [u32; 2])> =
            t.v4.values()
                .map(|v| (v.flags & FLOW_F_REPLY != 0, v.host_slots))
                .collect();
        s.sort();
        s
    };
    let counted_for_host = vec![
        (false, [HOST_SLOT_FIRST, HOST_SLOT_NONE]),
        (true, [HOST_SLOT_NONE, HOST_SLOT_FIRST]),
    ];
    assert_eq!(m.upsert(snat_tcp(), &mut t, &paths()), Upsert::Added);
    assert_eq!(host_slots(&t), counted_for_host);
    assert_eq!(
        m.ledger().slots().collect::<Vec<_>>(),
        [(host, HOST_SLOT_FIRST)]
    );
    forward(&mut t, 10);
    // The WAN moves to eth2: new entries, counting from 0 for the same host; the old ones'
    // counts are carried.
    let moved = FakePaths { wan: 4, ..paths() };
    assert_eq!(m.upsert(snat_tcp(), &mut t, &moved), Upsert::Added);
    assert!(t.v4.values().all(|v| v.counters.packets == 0));
    assert_eq!(host_slots(&t), counted_for_host);
    forward(&mut t, 5);
    assert_eq!(fastpath(&m, &t), [traffic(15), traffic(15)]);
    // Conntrack destroys it: nothing is carried any more; the host keeps its slot.
    m.forget(&snat_tcp().orig, &mut t);
    assert_eq!(m.ledger().carried(&snat_tcp().orig), [traffic(0); 2]);
    assert_eq!(m.ledger().slots().count(), 1);
}

#[test]
fn unmanaged_or_local_endpoints_are_not_offloaded() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    // WAN is ifindex 9, not managed.
    let p = FakePaths { wan: 9, ..paths() };
    assert_eq!(
        m.upsert(snat_tcp(), &mut t, &p),
        Upsert::Skipped(Skip::PathNotManaged)
    );
    // A connection to the router itself.
    let to_router = CtEntry {
        orig: tuple("10.0.1.2", 40000, "10.0.1.1", 22, 6),
        reply: tuple("10.0.1.1", 22, "10.0.1.2", 40000, 6),
        ..snat_tcp()
    };
    assert_eq!(
        m.upsert(to_router, &mut t, &paths()),
        Upsert::Skipped(Skip::PathNotManaged)
    );
    assert!(t.v4.is_empty());
}

#[test]
fn route_change_revalidation_takes_flows_back() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    m.upsert(snat_tcp(), &mut t, &paths());
    assert_eq!(m.revalidate(m.snapshot(), &mut t, &paths()), (0, 0));
    assert_eq!(t.v4.len(), 2);
    // The default route now points out of an unmanaged interface.
    assert_eq!(
        m.revalidate(m.snapshot(), &mut t, &FakePaths { wan: 9, ..paths() }),
        (1, 0)
    );
    assert!(t.v4.is_empty());
}

#[test]
fn the_addresses_in_use_follow_offloads_and_removals() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let used = |m: &FlowManager, first: &str, last: &str| m.uses_addresses_in(ip(first), ip(last));
    assert!(!used(&m, "0.0.0.0", "255.255.255.255"));
    m.upsert(snat_tcp(), &mut t, &paths());
    // Source, NAT address and remote end; nothing else.
    for a in ["10.0.1.2", "203.0.113.1", "198.51.100.7"] {
        assert!(used(&m, a, a), "{a}");
    }
    assert!(used(&m, "198.51.100.0", "198.51.100.255"));
    assert!(!used(&m, "198.51.100.8", "198.51.100.255"));
    assert!(!used(&m, "172.16.0.0", "172.31.255.255"));
    assert!(!used(&m, "::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"));
    // Upserting it again does not count it twice.
    m.upsert(snat_tcp(), &mut t, &paths());
    // Taken back by a routing change (parked: not counted), then gone.
    assert_eq!(
        m.revalidate(m.snapshot(), &mut t, &FakePaths { wan: 9, ..paths() }),
        (1, 0)
    );
    assert!(!used(&m, "0.0.0.0", "255.255.255.255"));
    m.revalidate(m.snapshot(), &mut t, &paths());
    assert!(used(&m, "10.0.1.2", "10.0.1.2"));
    assert!(m.forget(&snat_tcp().orig, &mut t));
    assert!(!used(&m, "0.0.0.0", "255.255.255.255"));
}

#[test]
fn route_restored_brings_the_connection_back() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    m.upsert(snat_tcp(), &mut t, &paths());
    let broken = FakePaths { wan: 9, ..paths() };
    assert_eq!(m.revalidate(m.snapshot(), &mut t, &broken), (1, 0));
    assert_eq!(m.parked_len(), 1);
    // Another routing change that does not help: still parked.
    assert_eq!(m.revalidate(m.snapshot(), &mut t, &broken), (0, 0));
    assert!(t.v4.is_empty());
    // The route is back: offloaded again without any conntrack event.
    assert_eq!(m.revalidate(m.snapshot(), &mut t, &paths()), (0, 1));
    assert_eq!(t.v4.len(), 2);
    assert_eq!(m.parked_len(), 0);
}

#[test]
fn destroyed_or_closing_connections_are_not_parked() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    m.upsert(snat_tcp(), &mut t, &FakePaths { wan: 9, ..paths() });
    assert_eq!(m.parked_len(), 1);
    // FIN seen: no longer a candidate.
    m.upsert(
        CtEntry {
            tcp_state: Some(4),
            ..snat_tcp()
        },
        &mut t,
        &paths(),
    );
    assert_eq!(m.parked_len(), 0);
    m.upsert(snat_tcp(), &mut t, &FakePaths { wan: 9, ..paths() });
    assert!(!m.forget(&snat_tcp().orig, &mut t));
    assert_eq!(m.parked_len(), 0);
    assert_eq!(m.revalidate(m.snapshot(), &mut t, &paths()), (0, 0));
    assert!(t.v4.is_empty());
}

#[test]
fn masquerade_address_removed_takes_flows_back() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    m.upsert(snat_tcp(), &mut t, &paths());
    let mut p = paths();
    p.local.remove(&"203.0.113.1".parse().unwrap());
    assert_eq!(m.revalidate(m.snapshot(), &mut t, &p), (1, 0));
    assert!(t.v4.is_empty());
}

#[test]
fn full_table_leaves_connection_in_kernel_without_half_entries() {
    let (mut m, mut t) = (
        manager(),
        FakeTable {
            capacity: 1,
            ..Default::default()
        },
    );
    assert_eq!(
        m.upsert(snat_tcp(), &mut t, &paths()),
        Upsert::Skipped(Skip::TableFull)
    );
    assert!(t.v4.is_empty());
    assert_eq!(m.stats().skipped.get(&Skip::TableFull), Some(&1));
}

#[test]
fn keepalive_reports_only_connections_with_new_traffic() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    m.upsert(snat_tcp(), &mut t, &paths());
    let other = CtEntry {
        orig: tuple("10.0.1.3", 40001, "198.51.100.7", 443, 6),
        reply: tuple("198.51.100.7", 443, "203.0.113.1", 61001, 6),
        ..snat_tcp()
    };
    m.upsert(other, &mut t, &paths());
    assert!(m.active_since_last_pass(&mut t, 100).is_empty());
    let key = |orig: bool| {
        *t.v4
            .iter()
            .find(|(k, v)| {
                (v.flags & FLOW_F_REPLY == 0) == orig
                    && (k.sport_be == 40000u16.to_be() || k.dport_be == 61000u16.to_be())
            })
            .expect("direction of the first connection")
            .0
    };
    let (orig_key, reply_key) = (key(true), key(false));
    // Only the reply direction carries traffic: the connection is found by its original tuple.
    t.forward_v4(&reply_key, 150);
    t.forward_v4(&reply_key, 160);
    let active = m.active_since_last_pass(&mut t, 200);
    assert_eq!(
        active,
        vec![Active {
            orig: snat_tcp().orig,
            zone: 0
        }]
    );
    // Both directions, several packets: reported once.
    for now in [210, 220, 230] {
        t.forward_v4(&orig_key, now);
        t.forward_v4(&reply_key, now);
    }
    assert_eq!(m.active_since_last_pass(&mut t, 300).len(), 1);
    assert!(
        m.active_since_last_pass(&mut t, 400).is_empty(),
        "no new traffic since the last pass"
    );
    // Recorded, then taken back from the fast path before the pass: not reported.
    t.forward_v4(&orig_key, 450);
    m.forget(&snat_tcp().orig, &mut t);
    assert!(m.active_since_last_pass(&mut t, 500).is_empty());
}

#[test]
fn kept_connection_state_is_compact_and_round_trips() {
    // 48 bytes before the "awaiting traffic" flag of connections found at start (+4 with
    // alignment: 4 MiB at a million connections).
    assert!(std::mem::size_of::<(TupleV4, Stored<TupleV4>)>() <= 52);
    let (mut m, mut t) = (manager(), FakeTable::default());
    let v6 = CtEntry {
        orig: tuple("fd00:1::2", 40000, "2001:db8::7", 443, 6),
        reply: tuple("2001:db8::7", 443, "fd00:1::2", 40000, 6),
        mark: 7,
        zone: 3,
        ..snat_tcp()
    };
    for e in [snat_tcp(), v6.clone()] {
        assert_eq!(m.upsert(e.clone(), &mut t, &paths()), Upsert::Added);
        let got = m
            .conns()
            .find(|c| c.entry.orig == e.orig)
            .expect("offloaded");
        assert_eq!(got.entry.reply, e.reply);
        assert_eq!((got.entry.mark, got.entry.zone), (e.mark, e.zone));
        assert_eq!(got.entry.status, e.status);
        assert!(got.entry.offload_decision().is_ok());
        assert_eq!(m.upsert(e, &mut t, &paths()), Upsert::Unchanged);
    }
    assert_eq!(m.directions(), (2, 2));
}

#[test]
fn full_table_is_reported_once_per_interval() {
    let mut log = OncePerInterval::default();
    let t0 = Instant::now();
    assert_eq!(log.note(t0), Some(1), "the first one at once");
    assert_eq!(log.note(t0 + Duration::from_secs(1)), None);
    assert_eq!(log.note(t0 + Duration::from_secs(59)), None);
    assert_eq!(
        log.note(t0 + TABLE_FULL_LOG_INTERVAL),
        Some(3),
        "then the ones since, together"
    );
    assert_eq!(log.note(t0 + TABLE_FULL_LOG_INTERVAL * 2), Some(1));
}

#[test]
fn revalidation_leaves_entries_that_changed_since_the_snapshot_alone() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    m.upsert(snat_tcp(), &mut t, &paths());
    let snapshot = m.snapshot();
    // Destroyed while its routes were being looked up: not brought back.
    m.forget(&snat_tcp().orig, &mut t);
    assert_eq!(m.revalidate(snapshot.clone(), &mut t, &paths()), (0, 0));
    assert!(t.v4.is_empty());
    // Updated meanwhile (new mark): its own event was applied with fresh answers.
    let mut marked = snat_tcp();
    marked.mark = 3;
    m.upsert(marked, &mut t, &paths());
    let broken = FakePaths { wan: 9, ..paths() };
    assert_eq!(m.revalidate(snapshot, &mut t, &broken), (0, 0));
    assert_eq!(t.v4.len(), 2);
}

#[test]
fn a_later_connection_on_the_same_tuple_gets_fresh_unarmed_entries() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    assert_eq!(m.upsert(snat_tcp(), &mut t, &paths()), Upsert::Added);
    // The datapath armed the earlier connection's directions and counted its packets; its
    // closing events were lost (overrun), so its flow is still there.
    for v in t.v4.values_mut() {
        v.armed_generation = 1;
        v.counters.packets = 7;
    }
    // The client reuses the ports: a new conntrack entry (another CTA_ID) on the same tuples.
    let next = CtEntry {
        id: Some(2),
        ..snat_tcp()
    };
    assert!(!m.is_current(&next), "a resync must not skip it");
    assert!(
        m.would_add(&next, &paths()),
        "it is offloaded anew, so marked liberal first"
    );
    assert_eq!(m.upsert(next.clone(), &mut t, &paths()), Upsert::Added);
    assert_eq!(t.v4.len(), 2);
    assert!(
        t.v4.values()
            .all(|v| v.armed_generation == 0 && v.counters.packets == 0),
        "fresh entries, to be armed by the new connection's own packets: {:?}",
        t.v4.values().collect::<Vec<_>>()
    );
    // Its own updates (same id) and entries without an id leave them alone.
    assert_eq!(m.upsert(next.clone(), &mut t, &paths()), Upsert::Unchanged);
    assert!(m.is_current(&next));
    let no_id = CtEntry { id: None, ..next };
    assert_eq!(m.upsert(no_id, &mut t, &paths()), Upsert::Unchanged);
}

/// `n` masqueraded TCP connections from distinct LAN ports.
fn snat_tcps(n: u16) -> Vec<CtEntry> {
    (0..n)
        .map(|i| CtEntry {
            orig: tuple("10.0.1.2", 40000 + i, "198.51.100.7", 443, 6),
            reply: tuple("198.51.100.7", 443, "203.0.113.1", 61000 + i, 6),
            ..snat_tcp()
        })
        .collect()
}

#[test]
fn upsert_many_writes_what_upsert_writes() {
    let mut entries = snat_tcps(3);
    // Not established: skipped, as one by one.
    entries.push(CtEntry {
        orig: tuple("10.0.1.9", 40000, "198.51.100.7", 443, 6),
        reply: tuple("198.51.100.7", 443, "203.0.113.1", 61999, 6),
        tcp_state: Some(1),
        ..snat_tcp()
    });
    // A repeated tuple, as the first.
    entries.push(entries[0].clone());
    let (mut one, mut t1) = (manager(), FakeTable::default());
    for e in &entries {
        one.upsert(e.clone(), &mut t1, &paths());
    }
    let (mut many, mut t2) = (manager(), FakeTable::default());
    many.upsert_many(&entries, &mut t2, &paths(), false);
    assert_eq!(many.len(), 3);
    assert_eq!(t2.v4, t1.v4);
    assert_eq!(t2.arm_v4, t1.arm_v4);
    assert_eq!(many.stats().offloaded_total, one.stats().offloaded_total);
    assert_eq!(many.stats().skipped, one.stats().skipped);
    // Applying the same dump again changes nothing.
    many.upsert_many(&entries, &mut t2, &paths(), false);
    assert_eq!(t2.v4, t1.v4);
    assert_eq!(many.stats().offloaded_total, 3);
}

#[test]
fn upsert_many_into_a_full_table_falls_back_to_one_by_one() {
    let (mut m, mut t) = (
        manager(),
        FakeTable {
            capacity: 5,
            ..Default::default()
        },
    );
    m.upsert_many(&snat_tcps(4), &mut t, &paths(), false);
    // Two connections fit (four directions); the others stay in the kernel, no half entries.
    assert_eq!(m.len(), 2);
    assert_eq!(t.v4.len(), 4);
    assert_eq!(t.arm_v4.len(), 4);
    assert_eq!(m.stats().skipped.get(&Skip::TableFull), Some(&2));
    assert_eq!(m.stats().offloaded_total, 2);
}

#[test]
fn kernel_forwarded_names_the_connections_with_an_armed_direction() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    let conns = snat_tcps(4);
    let before = t.kernel_forwarded_packets();
    for e in &conns {
        assert_eq!(m.upsert(e.clone(), &mut t, &paths()), Upsert::Added);
    }
    let reads = t.reads.get();
    assert!(
        !armed::kernel_forwarded_since(&t, before),
        "written, no packet forwarded by the kernel yet"
    );
    assert_eq!(
        t.reads.get(),
        reads,
        "the kernel forwarded nothing since the write: no entry is read"
    );
    assert!(armed::kernel_forwarded_since(&t, None));
    assert!(
        m.kernel_forwarded(&conns, &t).is_empty(),
        "the same answer from the entries when the count could not be read"
    );
    assert!(t.reads.get() > reads);
    // The kernel forwarded the reply direction of the second and the original of the fourth.
    let armed: Vec<FlowKeyV4> =
        t.v4.keys()
            .filter(|k| {
                let (sport, dport) = (u16::from_be(k.sport_be), u16::from_be(k.dport_be));
                (sport, dport) == (443, 61001) || (sport, dport) == (40003, 443)
            })
            .copied()
            .collect();
    assert_eq!(armed.len(), 2);
    for k in &armed {
        t.kernel_forwards_v4(k, 99);
    }
    for since in [before, None] {
        assert!(armed::kernel_forwarded_since(&t, since));
    }
    let forwarded: Vec<u16> = m
        .kernel_forwarded(&conns, &t)
        .iter()
        .map(|e| e.orig.sport)
        .collect();
    assert_eq!(forwarded, vec![40001, 40003]);
    // A connection not offloaded (never, or no more) is not named.
    m.forget(&conns[1].orig, &mut t);
    let other = CtEntry {
        orig: tuple("10.0.1.9", 1, "198.51.100.7", 443, 6),
        ..conns[3].clone()
    };
    let forwarded: Vec<u16> = m
        .kernel_forwarded([&conns[1], &conns[3], &other], &t)
        .iter()
        .map(|e| e.orig.sport)
        .collect();
    assert_eq!(forwarded, vec![40003]);
}

mod awaiting_traffic;
mod held;
mod resync;
