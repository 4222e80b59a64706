//! The keep-alive's active record (`flow::first_in_pass` in the eBPF crate): a flow direction
//! the fast path forwards is recorded in the active map once per keep-alive pass, so that the
//! daemon refreshes its conntrack entry. The clock is CLOCK_MONOTONIC_COARSE on both sides
//! (`last_seen_ns`, `Settings::active_since_ns`), which advances once per tick: a packet
//! forwarded just before the pass started, in the pass's own tick, carries the pass's start as
//! its `last_seen_ns`, and must not count as "already recorded in this pass".

use aya::maps::{HashMap, MapData};
use aya::programs::Xdp;
use xdp_router_common::{FlowKeyV4, FlowV4, MAP_ACTIVE_V4, PROG_NAME};
use xdp_router_tests::fixture_net::{
    Bed, FlowEntry, Maps, Setup, XDP_REDIRECT, coarse_monotonic_ns, load, routed, run, take,
};

use crate::{case, fixture_namespaces};

/// Writes the pass start into `SETTINGS`, the flow's `last_seen_ns`, and empties the active
/// map, as the daemon's pass and an earlier packet would have left them.
fn prepare(
    maps: &mut Maps,
    active: &mut HashMap<MapData, FlowKeyV4, u8>,
    flow: &FlowKeyV4,
    pass_start: u64,
    last_seen: u64,
) {
    let mut s = maps.settings.get(&0, 0).expect("settings");
    s.active_since_ns = pass_start;
    maps.settings.set(0, s, 0).expect("write settings");
    let mut v: FlowV4 = maps.flows_v4.get(flow, 0).expect("flow v4 present");
    v.counters.last_seen_ns = last_seen;
    maps.flows_v4.insert(flow, v, 0).expect("rewrite flow v4");
    let keys: Vec<_> = active.keys().map(|k| k.expect("active key")).collect();
    for k in keys {
        active.remove(&k).expect("remove active entry");
    }
}

/// A forwarded packet of a flow last seen before the pass started, or in the pass's own tick
/// (the packet before it raced the pass's start), records the connection; one last seen after
/// the pass started (already recorded in this pass) does not. The second case failed with a
/// strict comparison: with a packet every 50 ms and a pass every 2 s, their timers in phase
/// left a connection unrecorded pass after pass until conntrack dropped it (CI, 2026-12-07).
#[test]
fn a_packet_in_the_passs_own_tick_still_records_the_connection() {
    let Some((router, _hosts)) = fixture_namespaces(
        "prog_run::a_packet_in_the_passs_own_tick_still_records_the_connection",
        "dpk",
    ) else {
        return;
    };
    let errs = router.run(|| {
        let b = Bed::here();
        let (mut ebpf, mut maps) = load();
        let mut active: HashMap<MapData, FlowKeyV4, u8> = take(&mut ebpf, MAP_ACTIVE_V4);
        let (good4, _) = case::good_packets();
        let flow = routed(b.lan, &good4, false);
        maps.apply(&Setup::managed(&b, vec![flow]));
        let FlowEntry::V4(key, _) = flow else {
            unreachable!("good4 is IPv4")
        };
        let xdp: &Xdp = ebpf
            .program(PROG_NAME)
            .expect("program present")
            .try_into()
            .expect("XDP program");
        // A pass that started 10 s ago: the run's own clock is after it.
        let start = coarse_monotonic_ns() - 10_000_000_000;
        let mut errs = Vec::new();
        for (name, last_seen, recorded) in [
            ("last seen before the pass", start - 4_000_000, true),
            ("last seen in the pass's own tick", start, true),
            ("last seen after the pass started", start + 4_000_000, false),
        ] {
            prepare(&mut maps, &mut active, &key, start, last_seen);
            let (verdict, _) = run(xdp, &good4.frame(), b.lan);
            let n = active.keys().count();
            if verdict != XDP_REDIRECT || (n == 1) != recorded || n > 1 {
                errs.push(format!(
                    "{name}: verdict {verdict}, {n} active entries; want XDP_REDIRECT and {}",
                    if recorded { "1" } else { "none" }
                ));
            }
        }
        errs
    });
    assert!(errs.is_empty(), "{errs:#?}");
}
