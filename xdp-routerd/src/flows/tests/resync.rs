//! Resyncs: a dump replaces what vanished, skips what is current, and the tables are sized
//! once for it.

use super::super::fake::FakeTable;
use super::super::*;
use super::{FakePaths, manager, paths, snat_tcp, snat_tcps, tuple};
use crate::flows::conntrack::tcp_state;

#[test]
fn resync_removes_vanished_connections() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    m.upsert(snat_tcp(), &mut t, &paths());
    let other = CtEntry {
        orig: tuple("10.0.1.3", 1000, "198.51.100.7", 53, 17),
        reply: tuple("198.51.100.7", 53, "203.0.113.1", 1000, 17),
        tcp_state: None,
        ..snat_tcp()
    };
    // As a resync after an overrun does it (`State::resync_remove_absent`, then the writes).
    let dump = vec![other];
    let present = m.tuples_to_check(&dump).expect("one connection offloaded");
    assert_eq!(m.remove_absent(&present, &mut t), 1);
    m.upsert_many(&dump, &mut t, &paths(), false);
    assert_eq!(m.len(), 1);
    assert_eq!(t.v4.len(), 2);
    assert!(t.v4.keys().all(|k| k.proto == 17));
}

#[test]
fn an_entry_is_current_until_anything_but_its_timeout_changes() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    let e = snat_tcp();
    assert!(!m.is_current(&e));
    m.upsert(e.clone(), &mut t, &paths());
    assert!(m.is_current(&e));
    assert!(m.is_current(&CtEntry {
        timeout: Some(7),
        ..e.clone()
    }));
    assert!(!m.is_current(&CtEntry {
        mark: 9,
        ..e.clone()
    }));
    // Only the TCP state differs from what an offloaded connection keeps: no longer current.
    assert!(!m.is_current(&CtEntry {
        tcp_state: Some(tcp_state::FIN_WAIT),
        ..e.clone()
    }));
    // Parked entries count too (a resync need not look their routes up again).
    let broken = FakePaths { wan: 9, ..paths() };
    m.revalidate(m.snapshot(), &mut t, &broken);
    assert_eq!(m.parked_len(), 1);
    assert!(m.is_current(&e));
}

#[test]
fn tables_are_sized_once_for_a_dump_known_by_its_first_part() {
    let mut m = manager();
    // A first part of four connections, one of them IPv6, of a dump of 1,000.
    let mut sample = snat_tcps(3);
    sample.push(CtEntry {
        orig: tuple("fd00:1::2", 40000, "fd00:2::7", 443, 6),
        reply: tuple("fd00:2::7", 443, "fd00:1::2", 40000, 6),
        ..snat_tcp()
    });
    m.reserve_like(&sample, 1000);
    assert!(
        m.conns_v4.0.capacity() >= 750,
        "{}",
        m.conns_v4.0.capacity()
    );
    assert!(
        m.conns_v6.0.capacity() >= 250,
        "{}",
        m.conns_v6.0.capacity()
    );
    // Not twice the dump for either family.
    assert!(
        m.conns_v4.0.capacity() < 1500,
        "{}",
        m.conns_v4.0.capacity()
    );
    assert!(m.conns_v6.0.capacity() < 500, "{}", m.conns_v6.0.capacity());
    // An IPv4-only part leaves the IPv6 table as it is.
    let mut m = manager();
    m.reserve_like(&snat_tcps(4), 1000);
    assert!(m.conns_v4.0.capacity() >= 1000);
    assert_eq!(m.conns_v6.0.capacity(), 0);
}
