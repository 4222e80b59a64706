//! Connections held in the kernel by a narrowed rule that must see every packet.

use super::super::fake::FakeTable;
use super::super::flow_match::{FlowMatch, FlowTerm, Side};
use super::super::*;
use super::{manager, paths, snat_tcp, tuple};

/// What `tcp dport 22` in a forward chain narrows a rule to.
fn ssh() -> FlowMatch {
    FlowMatch {
        terms: vec![
            FlowTerm::Proto {
                protos: vec![6],
                negated: false,
            },
            FlowTerm::Port {
                side: Side::Destination,
                ranges: vec![(22, 22)],
                negated: false,
            },
        ],
    }
}

/// LAN 10.0.1.3:41000 -> 198.51.100.9:22, masqueraded to 203.0.113.1:62000.
fn ssh_conn() -> CtEntry {
    CtEntry {
        orig: tuple("10.0.1.3", 41000, "198.51.100.9", 22, 6),
        reply: tuple("198.51.100.9", 22, "203.0.113.1", 62000, 6),
        ..snat_tcp()
    }
}

#[test]
fn a_narrowed_rule_holds_only_the_connections_it_can_match() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    assert_eq!(m.upsert(snat_tcp(), &mut t, &paths()), Upsert::Added);
    assert_eq!(m.upsert(ssh_conn(), &mut t, &paths()), Upsert::Added);
    assert_eq!(t.v4.len(), 4);

    // The rule arrives: the SSH connection is taken back at once, the HTTPS one stays.
    let released = m.set_held(vec![ssh()], &mut t);
    assert!(released.is_empty());
    assert_eq!(t.v4.len(), 2);
    assert!(m.is_offloaded(&snat_tcp().orig));
    assert!(!m.is_offloaded(&ssh_conn().orig));
    assert_eq!(m.held_counts().total, 1);
    assert_eq!(m.stats().skipped.get(&Skip::HeldByRule), Some(&1));
    // A new event for it (or a new SSH connection) is not offloaded while the rule exists.
    assert_eq!(
        m.upsert(ssh_conn(), &mut t, &paths()),
        Upsert::Skipped(Skip::HeldByRule)
    );
    assert!(!m.would_add(&ssh_conn(), &paths()));
    let every_flow = FlowMatch::default();
    let counts = m.held_counts();
    assert_eq!((counts.of(&ssh()), counts.of(&every_flow)), (1, 0));
    // The same set again changes nothing.
    assert!(m.set_held(vec![ssh()], &mut t).is_empty());

    // The rule goes: the parked SSH connection is handed to a revalidation, which offloads it.
    let released = m.set_held(vec![], &mut t);
    assert_eq!(released, vec![ssh_conn().orig]);
    assert_eq!(m.held_counts().total, 0);
    let snapshot = m.snapshot_of(&released, |_| true);
    assert_eq!(m.revalidate(snapshot, &mut t, &paths()), (0, 1));
    assert!(m.is_offloaded(&ssh_conn().orig));
    assert_eq!(t.v4.len(), 4);
}

#[test]
fn a_rule_matching_every_form_after_nat_holds_the_connection() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    // `ip saddr 203.0.113.1` in postrouting sees the masqueraded source.
    let wan_source = FlowMatch {
        terms: vec![FlowTerm::Addr {
            side: Side::Source,
            ranges: vec![(
                "203.0.113.1".parse().unwrap(),
                "203.0.113.1".parse().unwrap(),
            )],
            negated: false,
        }],
    };
    m.set_held(vec![wan_source], &mut t);
    assert_eq!(
        m.upsert(snat_tcp(), &mut t, &paths()),
        Upsert::Skipped(Skip::HeldByRule)
    );
    assert!(t.v4.is_empty());
}

#[test]
fn a_counter_bound_releases_a_connection_once_a_counter_read_is_past_it() {
    use super::super::accounting::Traffic;
    use super::super::flow_match::{CounterDir, CounterUnit};
    let (mut m, mut t) = (manager(), FakeTable::default());
    let first_six = FlowMatch {
        terms: vec![FlowTerm::CounterAtMost {
            dir: CounterDir::Original,
            unit: CounterUnit::Packets,
            max: 6,
        }],
    };
    m.set_held(vec![first_six], &mut t);
    assert!(m.held_until_counted().is_empty(), "nothing held yet");
    assert_eq!(
        m.upsert(snat_tcp(), &mut t, &paths()),
        Upsert::Skipped(Skip::HeldByRule)
    );
    assert_eq!(m.held_until_counted(), vec![(snat_tcp().orig, 0)]);
    let read = |packets| {
        [
            Traffic {
                packets,
                bytes: packets * 60,
            },
            Traffic::default(),
        ]
    };
    // Six packets: the rule can still match the next one.
    assert!(m.counters_read(vec![(snat_tcp().orig, read(6))]).is_empty());
    assert_eq!(m.held_counts().total, 1);
    // Seven: released, and offloaded by the revalidation that follows.
    let released = m.counters_read(vec![(snat_tcp().orig, read(7))]);
    assert_eq!(released, vec![snat_tcp().orig]);
    assert_eq!(m.held_counts().total, 0);
    let snapshot = m.snapshot_of(&released, |_| true);
    assert_eq!(m.revalidate(snapshot, &mut t, &paths()), (0, 1));
    assert!(m.is_offloaded(&snat_tcp().orig));

    // A connection also held by a rule without a bound has no counters to wait for.
    m.set_held(vec![ssh(), FlowMatch::default()], &mut t);
    assert!(m.held_until_counted().is_empty());
}

#[test]
fn held_connections_are_counted_per_rule_and_once_in_all() {
    let (mut m, mut t) = (manager(), FakeTable::default());
    assert_eq!(m.upsert(snat_tcp(), &mut t, &paths()), Upsert::Added);
    assert_eq!(m.upsert(ssh_conn(), &mut t, &paths()), Upsert::Added);
    // One rule narrowed to SSH, one that can match every TCP connection.
    let tcp = FlowMatch {
        terms: vec![FlowTerm::Proto {
            protos: vec![6],
            negated: false,
        }],
    };
    m.set_held(vec![ssh(), tcp.clone()], &mut t);
    let counts = m.held_counts();
    assert_eq!(counts.total, 2, "each connection once");
    assert_eq!(counts.of(&ssh()), 1);
    assert_eq!(counts.of(&tcp), 2);
    assert_eq!(counts.of(&FlowMatch::default()), 0, "not in the list");
}
