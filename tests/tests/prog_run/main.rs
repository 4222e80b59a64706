//! BPF_PROG_RUN fixture table for the `xdp_router` program.
//!
//! Each case is: an input frame, the map contents (flows, interfaces, redirect ports, settings),
//! the expected verdict, the expected output frame, and the expected `STATS` delta. The program
//! runs with `Xdp::test_run` on a thread inside a network namespace that holds a real FIB:
//! `bpf_fib_lookup` consults the routes and neighbours of the namespace of the calling thread
//! (through the ingress device given in the `xdp_md` context).
//!
//! The router namespace (`xr-dp-<pid>-<n>`) and the map plumbing are in
//! `xdp_router_tests::fixture_net`, shared with the `prog-cost` benchmark.
//!
//! Run: `cargo test -p xdp-router-tests --test prog_run -- --test-threads=1` (as root).
//!
//! The table is split by subject, one module each: `ip` (forwarding and NAT), `ingress`,
//! `flow` and `route` (what the fast path refuses, and where), `bridge`, `bridge_vlan`, `vlan`,
//! `pppoe`, `kernel_checks`, `checksum_complete` (the TC table on `CHECKSUM_COMPLETE` skbs),
//! `handoff` (from XDP to the TC program behind it, with and without the mark);
//! `case` holds the case type and its constructors, `runner` the check of one case.

mod bridge;
mod bridge_vlan;
mod case;
mod checksum_complete;
mod flow;
mod handoff;
mod ingress;
mod ip;
mod keepalive;
mod kernel_checks;
mod pppoe;
mod route;
mod runner;
mod vlan;

use std::collections::BTreeSet;

use crate::{
    case::{Case, Expect, forward, pass},
    runner::{Prog, assert_all_ok, check_case, hex},
};
use aya::programs::{SchedClassifier, Xdp};
use xdp_router_common::{
    FIB_LOOKUP_DIRECT, FibCache, IFACE_F_BRIDGE, IFACE_F_PPP_CCP, IFACE_F_PPPOE, PROG_NAME, Reason,
    SINGLE_BUFFER_PROG_NAME, TC_PROG_NAME, stats_index,
};
use xdp_router_tests::{
    fixture_net::{
        Bed, GW_MAC, LAN_SLOT, MTU_MAC, MTU_PEER_MAC, Setup, WAN_MAC, XDP_PASS, XDP_REDIRECT,
        build_topology, flow, lan_pkt, load, load_object, object, routed, run, try_run_tc, v4, v6,
        wan_pkt,
    },
    netns::{Netns, require_root},
    packet::{
        Spec, Transport,
        tcp_flags::{ACK, PSH},
        with_pppoe,
    },
};

/// The fixture's router namespace (`xr-<tag>-…`, with its FIB) and the hosts' one behind it,
/// for `test`; `None` (the test skipped, saying why) without root.
fn fixture_namespaces(test: &str, tag: &str) -> Option<(Netns, Netns)> {
    if !require_root(test) {
        return None;
    }
    let router = Netns::new(tag);
    let hosts = Netns::new(&format!("{tag}h"));
    build_topology(&router, &hosts);
    Some((router, hosts))
}

/// Every case of the table.
fn cases(b: &Bed) -> Vec<Case> {
    let mut c = Vec::new();
    ip::cases(b, &mut c);
    ingress::cases(b, &mut c);
    flow::cases(b, &mut c);
    route::cases(b, &mut c);
    bridge::cases(b, &mut c);
    bridge_vlan::cases(b, &mut c);
    vlan::cases(b, &mut c);
    pppoe::cases(b, &mut c);
    kernel_checks::cases(b, &mut c);
    c
}

#[test]
fn fixture_table() {
    xdp_table("prog_run::fixture_table", "dp", PROG_NAME);
}

/// The table on the single-buffer XDP program (`xdp_router_1buf`, what the daemon attaches
/// where the kernel has no multi-buffer XDP): the verifier takes it here too, and it gives
/// every case's answer, except the frame in several buffers, which no driver hands a program
/// loaded without `xdp.frags`.
#[test]
fn fixture_table_single_buffer() {
    xdp_table(
        "prog_run::fixture_table_single_buffer",
        "d1",
        SINGLE_BUFFER_PROG_NAME,
    );
}

/// Runs every case of the table on the XDP program `name` and fails on any case that fails.
fn xdp_table(test: &str, tag: &str, name: &str) {
    let Some((router, _hosts)) = fixture_namespaces(test, tag) else {
        return;
    };
    let results = router.run(|| {
        let bed = Bed::here();
        let (mut ebpf, mut maps) = load();
        if name != PROG_NAME {
            let prog: &mut Xdp = ebpf
                .program_mut(name)
                .expect("program present")
                .try_into()
                .expect("XDP program");
            if let Err(e) = prog.load() {
                panic!("verifier rejected {name}: {e}\n{e:?}");
            }
        }
        let prog: &Xdp = ebpf
            .program(name)
            .expect("program present")
            .try_into()
            .expect("XDP program");
        cases(&bed)
            .iter()
            .filter(|case| name == PROG_NAME || case.reason() != Reason::PassMultiBuffer)
            .map(|case| {
                (
                    case.name.clone(),
                    case.reason(),
                    check_case(Prog::Xdp(prog), &mut maps, case),
                )
            })
            .collect::<Vec<_>>()
    });
    let mut failed = Vec::new();
    for (name, reason, res) in &results {
        match res {
            Ok(()) => println!("ok   {name} ({})", reason.name()),
            Err(e) => {
                println!("FAIL {name} ({})\n    {e}", reason.name());
                failed.push(name.as_str());
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} cases failed: {failed:?}",
        failed.len(),
        results.len()
    );
}

/// What a case of the table becomes on the TC program (`xdp_router_tc`, the same pipeline on
/// skbs): the same verdict, output frame and counters, except where TC differs by design.
/// `None`: the case does not apply to TC.
fn on_tc(case: &Case) -> Option<Case> {
    // A TC redirect goes through the egress device's transmit path: it needs no XDP transmit,
    // so TC forwards what XDP leaves to the kernel here (tests/tc.rs checks it with traffic).
    if case.reason() == Reason::PassEgressNoXdpXmit {
        return None;
    }
    // The `TX_PORTS` devmap is XDP's redirect table; TC redirects to any managed egress
    // device (`egress::redirect_to` checks it in `IFACES`), so the cases about a device left
    // out of it do not apply.
    if case.reason() == Reason::PassEgressNotManaged
        && (case.name.contains("TX_PORTS") || case.name.contains("not a redirect target"))
    {
        return None;
    }
    // From TC a packet routed into a PPPoE device goes into the PPP device itself
    // (`pppoe::lower`): the kernel's PPP and PPPoE code encapsulates it, and the lower
    // device's qdisc and hooks apply there, so neither the session header nor the lower
    // device's checks are the program's on that path. BPF_PROG_RUN returns only the frame
    // the redirect would strip; the guest tests send real traffic that way
    // (`pppoe::tc_lan::a_tc_lan_port_sends_into_a_session_on_xdp`).
    if into_pppoe(case) {
        return None;
    }
    // An skb is one packet however many buffers hold it: the TC pipeline reads its headers
    // (pulled into the head) and leaves a segment that long to the kernel for its checksum.
    if case.reason() == Reason::PassMultiBuffer {
        return Some(Case {
            expect: Expect::Pass(Reason::PassL4ChecksumTooLong),
            ..case.clone()
        });
    }
    // Where the XDP program pushes a VLAN tag, the TC program sets it in the skb's metadata
    // (`bpf_skb_vlan_push`), which BPF_PROG_RUN does not return: the frame it sends is `want`
    // without its tag. Out of a VLAN device over a parent that is not a bridge, it goes to the
    // VLAN device itself, untagged, whose transmit path tags it. (The kernel takes every
    // received tag into skb metadata before TC ingress, so a real skb never arrives with its
    // tag in its bytes; these skbs, built from the frame's bytes, do, and such a tag is
    // rewritten in place as on XDP.) A received session header comes off an untagged frame
    // (`Packet::pop_session`: the same frame as on XDP); no other bytes are pushed or popped
    // on skbs: a PPPoE header pushed, or a tag in the frame's bytes popped or pushed.
    if let Expect::Redirect(reason, want) = &case.expect {
        let sent = match to_vlan_device(&case.setup, want) {
            Some(untagged) => untagged,
            None if !is_tagged(&case.frame) && is_tagged(want) => untag(want),
            None => want.clone(),
        };
        let session_popped = !is_tagged(&case.frame) && l2_len(&case.frame) == 22;
        let expect =
            if l2_len(&case.frame) == l2_len(&sent) || session_popped && l2_len(&sent) == 14 {
                Expect::Redirect(*reason, sent)
            } else {
                Expect::Pass(Reason::PassNotOnTc)
            };
        return Some(Case {
            expect,
            ..case.clone()
        });
    }
    Some(case.clone())
}

/// Whether `case` is a packet from an Ethernet port routed into a managed PPPoE device: it
/// leaves as a session frame on XDP, or XDP leaves it to the kernel because of the session's
/// lower device (named so by `lower_egress_cases`) or CCP.
fn into_pppoe(case: &Case) -> bool {
    let session_frame = |f: &[u8]| inner_ethertype(f).1 == Some(0x8864);
    let has_session = case
        .setup
        .ifaces
        .iter()
        .any(|(_, i)| i.flags & IFACE_F_PPPOE != 0);
    if !has_session || session_frame(&case.frame) {
        return false;
    }
    match &case.expect {
        Expect::Redirect(_, want) => session_frame(want),
        Expect::Pass(Reason::PassPppoeCcp) => true,
        Expect::Pass(
            Reason::PassEgressShaped | Reason::PassEgressHook | Reason::PassEgressNotManaged,
        ) => case.name.starts_with("pppoe egress: lower device"),
        Expect::Pass(_) => false,
    }
}

/// Whether `frame` has a VLAN tag after its MACs.
fn is_tagged(frame: &[u8]) -> bool {
    matches!(frame.get(12..14), Some([0x81, 0x00] | [0x88, 0xa8]))
}

/// `frame` without the VLAN tag after its MACs.
fn untag(frame: &[u8]) -> Vec<u8> {
    [&frame[..12], &frame[16..]].concat()
}

/// `want` without its VLAN tag when it leaves tagged for a managed VLAN device (per
/// `setup`'s `VLANS`) whose parent is not a bridge, as the TC program sends it (to the VLAN
/// device); `None` for any other frame.
fn to_vlan_device(setup: &Setup, want: &[u8]) -> Option<Vec<u8>> {
    if !is_tagged(want) {
        return None;
    }
    let tpid = u16::from_be_bytes([want[12], want[13]]);
    let vid = u16::from_be_bytes([*want.get(14)?, *want.get(15)?]) & 0x0fff;
    let is_bridge = |ifindex: u32| {
        setup
            .ifaces
            .iter()
            .any(|(i, info)| *i == ifindex && info.flags & IFACE_F_BRIDGE != 0)
    };
    setup
        .vlans
        .iter()
        .any(|(k, _)| k.vid == vid && k.tpid_be == tpid.to_be() && !is_bridge(k.parent_ifindex))
        .then(|| untag(want))
}

/// Length of a frame's Ethernet header with its VLAN tags and PPPoE session header.
fn l2_len(frame: &[u8]) -> usize {
    match inner_ethertype(frame) {
        (at, Some(0x8864)) => at + 2 + 8,
        (at, _) => at + 2,
    }
}

/// The offset of `frame`'s EtherType after any VLAN tags, and that EtherType (`None`: the
/// frame ends before it).
fn inner_ethertype(frame: &[u8]) -> (usize, Option<u16>) {
    let mut at = 12;
    while let Some(&[a, b]) = frame.get(at..at + 2) {
        match u16::from_be_bytes([a, b]) {
            0x8100 | 0x88a8 => at += 4,
            t => return (at, Some(t)),
        }
    }
    (at, None)
}

/// The whole fixture table on the TC program (see [`on_tc`] for where TC differs): one
/// pipeline for both contexts, so the same packets get the same answers. The skbs are linear
/// and without checksum state (CHECKSUM_NONE), so the checksum helpers compute what the XDP
/// path's direct update does; `tests/tc.rs` covers CHECKSUM_PARTIAL and GSO with traffic.
#[test]
fn fixture_table_on_tc() {
    let Some((router, _hosts)) = fixture_namespaces("prog_run::fixture_table_on_tc", "dpt") else {
        return;
    };
    let (results, skipped) = router.run(|| {
        let bed = Bed::here();
        let (mut ebpf, mut maps) = load();
        let prog = load_tc(&mut ebpf);
        let all = cases(&bed);
        let tc = tc_cases(prog, &all);
        let results = tc
            .iter()
            .map(|case| {
                (
                    format!("{} ({})", case.name, case.reason().name()),
                    check_case(Prog::Tc(prog), &mut maps, case),
                )
            })
            .collect::<Vec<_>>();
        (results, all.len() - tc.len())
    });
    println!("{} cases on TC, {skipped} not applicable", results.len());
    assert_all_ok(&results);
}

/// The TC program of `ebpf`, loaded (through the verifier).
fn load_tc(ebpf: &mut aya::Ebpf) -> &mut SchedClassifier {
    let prog: &mut SchedClassifier = ebpf
        .program_mut(TC_PROG_NAME)
        .expect("TC program present")
        .try_into()
        .expect("SchedClassifier program");
    prog.load()
        .unwrap_or_else(|e| panic!("verifier rejected {TC_PROG_NAME}: {e}\n{e:?}"));
    prog
}

/// The cases of `all` as they apply on TC ([`on_tc`]). BPF_PROG_RUN builds no skb from some
/// malformed frames (shorter than the headers their EtherType promises) nor from frames longer
/// than a page holds: those cases are the XDP table's only.
fn tc_cases(prog: &SchedClassifier, all: &[Case]) -> Vec<Case> {
    all.iter()
        .filter_map(on_tc)
        .filter(|c| try_run_tc(prog, &c.frame, c.ingress).is_ok())
        .collect()
}

/// `GLOBAL_FIB_FLAGS`: by default the FIB lookup honours policy rules (`ip rule`); loaded with
/// `FIB_LOOKUP_DIRECT` it looks up the main table only, as documented. The client 192.0.2.10
/// is policy-routed (table 100) to a gateway without neighbour entry: the kernel routes a
/// forwarded packet before SNAT, so the rule matches the received source, not the translated
/// 198.51.100.77.
#[test]
fn fib_flags_direct_skips_policy_rules() {
    let Some((router, _hosts)) =
        fixture_namespaces("prog_run::fib_flags_direct_skips_policy_rules", "dpr")
    else {
        return;
    };
    router.sh("set -e
        ip rule add from 192.0.2.10 lookup 100 pref 100
        ip route add default via 198.51.100.253 dev wan0 table 100");
    let results = router.run(|| {
        let bed = Bed::here();
        let p = lan_pkt(
            v4("192.0.2.10"),
            v4("198.18.0.7"),
            Transport::Tcp(ACK | PSH),
            100,
        );
        let nat_src = (v4("198.51.100.77"), 61_000);
        let dst = (p.dst, p.dport);
        let full = pass(
            &bed,
            "policy rule honoured (default flags)",
            bed.lan,
            p.frame(),
            Setup::managed(&bed, vec![flow(bed.lan, &p, nat_src, dst, false)]),
            Reason::PassNoNeighbour,
        );
        let direct = forward(
            &bed,
            "policy rule skipped (FIB_LOOKUP_DIRECT)",
            bed.lan,
            &p,
            nat_src,
            dst,
            false,
            (WAN_MAC, GW_MAC),
        );
        let object = object();
        [(0, full), (FIB_LOOKUP_DIRECT, direct)]
            .iter()
            .map(|(flags, case)| {
                let (ebpf, mut maps) = load_object(&object, *flags);
                let prog: &Xdp = ebpf
                    .program(PROG_NAME)
                    .expect("program present")
                    .try_into()
                    .expect("XDP program");
                (
                    case.name.clone(),
                    check_case(Prog::Xdp(prog), &mut maps, case),
                )
            })
            .collect::<Vec<_>>()
    });
    assert_all_ok(&results);
}

/// CCP seen on a PPPoE session stops its fast path: the peer's compressed datagram (or CCP
/// Configure-Ack) is passed and marks the PPP device (`IFACE_F_PPP_CCP`), after which the
/// session's IP datagrams, which were forwarded before, are passed too. Negative control: the
/// same IP datagram after a frame that is not CCP (LCP) is still forwarded.
#[test]
fn ccp_seen_on_a_session_stops_its_fast_path() {
    let Some((router, _hosts)) =
        fixture_namespaces("prog_run::ccp_seen_on_a_session_stops_its_fast_path", "dpc")
    else {
        return;
    };
    let results = router.run(|| {
        let b = Bed::here();
        let (server4, router4, client4) = (v4("198.18.0.7"), v4("198.51.100.1"), v4("192.0.2.10"));
        let r4 = Spec {
            eth_src: MTU_PEER_MAC,
            eth_dst: MTU_MAC,
            ..wan_pkt(server4, router4, 61_000, Transport::Tcp(ACK | PSH))
        };
        let setup = Setup::managed(
            &b,
            vec![flow(b.wan, &r4, (server4, 443), (client4, 40_000), true)],
        )
        .with_pppoe(b.wan, b.mtu, 0x1234, MTU_PEER_MAC, true);
        let ip = with_pppoe(&r4.frame(), 0x1234);
        let with_proto = |bytes: &[u8]| {
            let mut f = ip.clone();
            f[20..20 + bytes.len()].copy_from_slice(bytes);
            f
        };
        let (ebpf, mut maps) = load();
        let prog: &Xdp = ebpf
            .program(PROG_NAME)
            .expect("program present")
            .try_into()
            .expect("XDP program");
        let mut results = Vec::new();
        for (name, first, want_flag, want_verdict) in [
            (
                "after LCP (control)",
                with_proto(&[0xc0, 0x21, 0x09]),
                false,
                XDP_REDIRECT,
            ),
            (
                "after a compressed datagram",
                with_proto(&[0x00, 0xfd]),
                true,
                XDP_PASS,
            ),
            (
                "after a CCP Configure-Ack",
                with_proto(&[0x80, 0xfd, 0x02]),
                true,
                XDP_PASS,
            ),
        ] {
            maps.apply(&setup);
            let (v0, _) = run(prog, &first, b.mtu);
            let flags = maps.ifaces.get(&b.wan, 0).expect("ppp entry").flags;
            let (v1, _) = run(prog, &ip, b.mtu);
            let ok =
                v0 == XDP_PASS && (flags & IFACE_F_PPP_CCP != 0) == want_flag && v1 == want_verdict;
            results.push((
                format!("IP datagram {name}"),
                if ok {
                    Ok(())
                } else {
                    Err(format!(
                        "first frame verdict {v0}, IFACE_F_PPP_CCP {}, then IP datagram \
                         verdict {v1} (want {want_verdict})",
                        flags & IFACE_F_PPP_CCP != 0
                    ))
                },
            ));
        }
        results
    });
    assert_all_ok(&results);
}

/// The table names every reason at least once (checked without running anything), except
/// those only the TC program gives (see [`TC_ONLY`]).
/// Reasons the XDP program never gives: the TC program's (`tests/tc.rs` runs it).
const TC_ONLY: [Reason; 1] = [Reason::PassNotOnTc];

#[test]
fn table_covers_every_reason() {
    let bed = Bed {
        lan: 11,
        wan: 12,
        mtu: 13,
        sub: 14,
    };
    let covered: BTreeSet<u32> = cases(&bed).iter().map(|c| c.reason() as u32).collect();
    let missing: Vec<_> = Reason::ALL
        .iter()
        .filter(|r| !covered.contains(&(**r as u32)) && !TC_ONLY.contains(r))
        .collect();
    assert!(missing.is_empty(), "reasons without a case: {missing:?}");
}

/// The per-flow FIB cache: a flow's cached `bpf_fib_lookup` answer is used while its
/// generation, age, length and TOS / flow information match, and each of those (and the
/// switch that turns the cache off) makes the next packet look the FIB up again. To tell the
/// two apart, the cached answer is poisoned with a next-hop MAC the FIB does not have: a packet
/// that used the cache leaves with it, one that looked up the FIB leaves with the real one.
#[test]
fn fib_cache_is_used_only_while_valid() {
    let Some((router, _hosts)) =
        fixture_namespaces("prog_run::fib_cache_is_used_only_while_valid", "dpc")
    else {
        return;
    };
    const POISON: [u8; 6] = [0x02, 0xba, 0xd0, 0x00, 0x00, 0x01];
    type Tweak = fn(&mut Setup, &mut FibCache);
    let tweaks: [(&str, bool, Tweak); 8] = [
        ("valid answer is used", true, |_, _| {}),
        ("generation bumped", false, |s, _| s.fib_generation += 1),
        ("entry being rewritten (generation 0)", false, |_, c| {
            c.generation = 0
        }),
        ("older than fib_cache_ns", false, |s, c| {
            c.filled_ns = c.filled_ns.saturating_sub(s.fib_cache_ns + 1_000_000)
        }),
        ("packet longer than max_len", false, |_, c| c.max_len -= 1),
        ("other TOS / flow information", false, |_, c| {
            c.tos_flowinfo ^= 0x04
        }),
        ("cache off (fib_cache_ns 0)", false, |s, _| {
            s.fib_cache_ns = 0
        }),
        ("cache off (generation 0)", false, |s, _| {
            s.fib_generation = 0
        }),
    ];
    let results = router.run(move || {
        let bed = Bed::here();
        let (ebpf, mut maps) = load();
        let prog: &Xdp = ebpf
            .program(PROG_NAME)
            .expect("program present")
            .try_into()
            .expect("XDP program");
        let mut results = Vec::new();
        let udp = Transport::Udp;
        let packets = [
            lan_pkt(v4("192.0.2.10"), v4("198.18.0.7"), udp, 64),
            lan_pkt(v6("2001:db8:1::10"), v6("2001:db8:ff::7"), udp, 64),
        ];
        for p in &packets {
            let family = if p.src.is_ipv4() { "v4" } else { "v6" };
            let f = routed(bed.lan, p, false);
            let keep = ((p.src, p.sport), (p.dst, p.dport));
            let real = p.forwarded(WAN_MAC, GW_MAC, keep.0, keep.1).frame();
            let poisoned = p.forwarded(WAN_MAC, POISON, keep.0, keep.1).frame();
            for (what, uses_cache, tweak) in &tweaks {
                let name = format!("{family}: {what}");
                let mut setup = Setup::managed(&bed, vec![f]);
                maps.apply(&setup);
                let res = (|| -> Result<(), String> {
                    let (verdict, out) = run(prog, &p.frame(), bed.lan);
                    if verdict != XDP_REDIRECT || out != real {
                        return Err(format!("first packet: verdict {verdict}, {}", hex(&out)));
                    }
                    let filled = maps.fib_cache(&f);
                    if filled.generation != setup.fib_generation || filled.dmac != GW_MAC {
                        return Err(format!("first packet did not fill the cache: {filled:?}"));
                    }
                    let mut edited = filled;
                    edited.dmac = POISON;
                    tweak(&mut setup, &mut edited);
                    maps.set_fib_cache(&f, edited);
                    maps.write_settings(&setup);
                    let (verdict, out) = run(prog, &p.frame(), bed.lan);
                    let want = if *uses_cache { &poisoned } else { &real };
                    if verdict != XDP_REDIRECT || &out != want {
                        return Err(format!(
                            "second packet: verdict {verdict}\n      got  {}\n      want {}",
                            hex(&out),
                            hex(want)
                        ));
                    }
                    let after = maps.fib_cache(&f);
                    let enabled = setup.fib_generation != 0 && setup.fib_cache_ns != 0;
                    if !*uses_cache
                        && enabled
                        && (after.dmac != GW_MAC || after.generation != setup.fib_generation)
                    {
                        return Err(format!("the lookup did not refill the cache: {after:?}"));
                    }
                    Ok(())
                })();
                results.push((name, res));
            }
        }

        // The MTU check survives the cache: a small packet fills it, a packet of the same flow
        // over the egress MTU (1280) must still go to the kernel (which sends the ICMP).
        let mut small = lan_pkt(
            v4("192.0.2.10"),
            v4("203.0.113.130"),
            Transport::Tcp(ACK),
            100,
        );
        small.dport = 8080;
        let big = Spec {
            payload_len: 1300,
            ..small.clone()
        };
        let f = routed(bed.lan, &small, false);
        maps.apply(&Setup::managed(&bed, vec![f]));
        let res = (|| -> Result<(), String> {
            let (verdict, _) = run(prog, &small.frame(), bed.lan);
            if verdict != XDP_REDIRECT {
                return Err(format!("small packet: verdict {verdict}"));
            }
            let idx = stats_index(LAN_SLOT, Reason::PassFragNeeded) as usize;
            let before = maps.stats()[idx].packets;
            let (verdict, out) = run(prog, &big.frame(), bed.lan);
            if verdict != XDP_PASS || out != big.frame() {
                return Err(format!(
                    "big packet: verdict {verdict}, want XDP_PASS unchanged"
                ));
            }
            if maps.stats()[idx].packets != before + 1 {
                return Err("big packet not counted as frag_needed".into());
            }
            let (verdict, _) = run(prog, &small.frame(), bed.lan);
            if verdict != XDP_REDIRECT {
                return Err(format!("small packet again: verdict {verdict}"));
            }
            Ok(())
        })();
        results.push((
            "v4: cached flow, packet over the egress MTU".to_owned(),
            res,
        ));
        results
    });
    assert_all_ok(&results);
}
