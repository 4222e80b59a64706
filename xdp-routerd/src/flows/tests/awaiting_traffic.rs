//! Connections found at start: written awaiting traffic (no arming index entries), kept so
//! through rewrites, taken in by the keep-alive.

use xdp_router_common::{FLOW_F_AWAITING_TRAFFIC, FLOW_F_REPLY};

use super::super::fake::FakeTable;
use super::super::*;
use super::{manager, paths, snat_tcp, snat_tcps, tuple};

/// The flags of every IPv4 flow direction with IP protocol `proto`.
fn flags_of(t: &FakeTable, proto: u8) -> Vec<u32> {
    t.v4.iter()
        .filter(|(k, _)| k.proto == proto)
        .map(|(_, v)| v.flags)
        .collect()
}

#[test]
fn connections_found_at_start_stay_unarmable_until_the_keep_alive_takes_them_in() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    let udp = CtEntry {
        orig: tuple("10.0.1.2", 40100, "198.51.100.7", 53, 17),
        reply: tuple("198.51.100.7", 53, "203.0.113.1", 40100, 17),
        tcp_state: None,
        ..snat_tcp()
    };
    let tcp = snat_tcp();
    m.upsert_many(&[tcp.clone(), udp.clone()], &mut t, &paths(), true);
    assert_eq!(m.len(), 2);
    // Every direction carries the flag, and none has an arming index entry: the kernel cannot
    // arm them.
    assert_eq!(t.v4.len(), 4);
    assert!(
        t.v4.values()
            .all(|v| v.flags & FLOW_F_AWAITING_TRAFFIC != 0),
        "{:?}",
        t.v4
    );
    assert!(t.arm_v4.is_empty(), "{:?}", t.arm_v4);
    // The kernel forwarded a few packets of the TCP connection meanwhile (counted in its
    // entries).
    for v in t.v4.values_mut() {
        v.counters.kernel_packets = 3;
    }
    // The keep-alive refreshed (and marked) the TCP one: its flag goes, everything else stays.
    assert_eq!(m.joined_on_traffic(&[tcp.orig], &mut t), 1);
    for (proto, awaiting) in [(6, false), (17, true)] {
        let flags = flags_of(&t, proto);
        assert_eq!(flags.len(), 2);
        assert!(
            flags
                .iter()
                .all(|f| (f & FLOW_F_AWAITING_TRAFFIC != 0) == awaiting),
            "proto {proto}: {flags:?}"
        );
    }
    for v in t.v4.values() {
        assert_eq!(v.counters.kernel_packets, 3, "counts kept");
    }
    assert_eq!(
        t.v4.iter()
            .filter(|(k, v)| k.proto == 6 && v.flags & FLOW_F_REPLY != 0)
            .count(),
        1
    );
    // Now armable: its arming index entries are there, the UDP one's not yet.
    assert_eq!(t.arm_v4.len(), 2);
    assert!(t.arm_v4.keys().all(|a| a.proto == 6));
    // Taken in once: a later pass finds nothing to do; the UDP one's turn comes with its
    // traffic.
    assert_eq!(m.joined_on_traffic(&[tcp.orig], &mut t), 0);
    assert_eq!(m.joined_on_traffic(&[udp.orig], &mut t), 1);
    assert_eq!(t.arm_v4.len(), 4);
}

#[test]
fn a_connection_awaiting_traffic_stays_so_when_rewritten_and_a_new_one_on_its_tuple_does_not() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    let tcp = snat_tcp();
    m.upsert_many(std::slice::from_ref(&tcp), &mut t, &paths(), true);
    // The same connection with another NAT port (its entries rewritten): still awaiting.
    let moved = CtEntry {
        reply: tuple("198.51.100.7", 443, "203.0.113.1", 61500, 6),
        ..tcp.clone()
    };
    assert_eq!(m.upsert(moved, &mut t, &paths()), Upsert::Added);
    let flags = flags_of(&t, 6);
    assert_eq!(flags.len(), 2);
    assert!(
        flags.iter().all(|f| f & FLOW_F_AWAITING_TRAFFIC != 0),
        "{flags:?}"
    );
    assert!(t.arm_v4.is_empty(), "{:?}", t.arm_v4);
    // A new connection on the tuple (another conntrack id) was marked by the event path before
    // it is written: armable at once.
    let anew = CtEntry {
        id: Some(77),
        ..tcp.clone()
    };
    assert_eq!(m.upsert(anew, &mut t, &paths()), Upsert::Added);
    let flags = flags_of(&t, 6);
    assert_eq!(flags.len(), 2);
    assert!(
        flags.iter().all(|f| f & FLOW_F_AWAITING_TRAFFIC == 0),
        "{flags:?}"
    );
    assert_eq!(t.arm_v4.len(), 2);
}

#[test]
fn after_an_overrun_a_resync_writes_armable_connections() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    m.upsert_many(&snat_tcps(2), &mut t, &paths(), false);
    assert!(
        t.v4.values()
            .all(|v| v.flags & FLOW_F_AWAITING_TRAFFIC == 0)
    );
    assert_eq!(t.arm_v4.len(), 4);
}
