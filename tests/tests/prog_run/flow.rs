//! The flow lookup and what the kernel did to the flow's armed packet: no flow (another
//! interface, port or protocol), unarmed or stale flows, the kernel's DSCP and TTL rewrites
//! (and their forwarded neighbours), the age of the kernel's verdict, a mark the lookup cannot
//! take, an unmanaged ingress.

use xdp_router_common::{
    FLOW_DSCP_KNOWN, FLOW_DSCP_REWRITTEN, FLOW_TTL_KNOWN, Reason, verdict_tick,
};
use xdp_router_tests::{
    fixture_net::{
        ARMED, Bed, GW_MAC, Setup, WAN_MAC, coarse_monotonic_ns, lan_pkt, routed, v4, v6,
    },
    packet::{
        Transport,
        tcp_flags::{ACK, PSH},
        with_tos,
    },
};

use crate::case::{Case, Expect, forward, good_packets, pass};

/// Flow lookup and arming.
pub fn cases(b: &Bed, c: &mut Vec<Case>) {
    let tcp = Transport::Tcp(ACK | PSH);
    let (client4, client6) = (v4("192.0.2.10"), v6("2001:db8:1::10"));
    let (server4, server6) = (v4("198.18.0.7"), v6("2001:db8:ff::7"));
    let router4 = v4("198.51.100.1");
    let to_wan = (WAN_MAC, GW_MAC);
    let (good4, good6) = good_packets();
    let m4 = || Setup::managed(b, vec![routed(b.lan, &good4, false)]);
    c.push(pass(
        b,
        "no flow v4",
        b.lan,
        good4.frame(),
        Setup::managed(b, vec![]),
        Reason::PassNoFlow,
    ));
    c.push(pass(
        b,
        "no flow v6",
        b.lan,
        good6.frame(),
        Setup::managed(b, vec![]),
        Reason::PassNoFlow,
    ));
    c.push(pass(
        b,
        "flow of the other interface",
        b.lan,
        good4.frame(),
        Setup::managed(b, vec![routed(b.wan, &good4, false)]),
        Reason::PassNoFlow,
    ));
    {
        let mut other_port = good4.clone();
        other_port.sport += 1;
        c.push(pass(
            b,
            "flow of another port",
            b.lan,
            good4.frame(),
            Setup::managed(b, vec![routed(b.lan, &other_port, false)]),
            Reason::PassNoFlow,
        ));
        let mut t = good4.clone();
        t.transport = Transport::Udp;
        c.push(pass(
            b,
            "flow of the other protocol",
            b.lan,
            t.frame(),
            m4(),
            Reason::PassNoFlow,
        ));
    }
    // Arming: a flow direction the kernel has not forwarded under the current ruleset.
    c.push(pass(
        b,
        "unarmed flow v4 (new)",
        b.lan,
        good4.frame(),
        Setup::managed(b, vec![routed(b.lan, &good4, false).armed(0, 0)]),
        Reason::PassNotArmed,
    ));
    c.push(pass(
        b,
        "flow armed under an older ruleset v6",
        b.lan,
        good6.frame(),
        Setup::managed(b, vec![routed(b.lan, &good6, false).armed(ARMED + 1, 0)]),
        Reason::PassNotArmed,
    ));
    // The kernel sent the armed packet out with another DSCP (a forward-path `dscp set`):
    // packets with their own DSCP go to the kernel, so the rule applies to them.
    let cs3 = FLOW_DSCP_KNOWN | 24;
    c.push(pass(
        b,
        "kernel rewrote the dscp v4",
        b.lan,
        good4.frame(),
        Setup::managed(b, vec![routed(b.lan, &good4, false).with_kernel_dscp(cs3)]),
        Reason::PassDscpNotKernels,
    ));
    c.push(pass(
        b,
        "kernel rewrote the traffic class dscp v6",
        b.lan,
        good6.frame(),
        Setup::managed(b, vec![routed(b.lan, &good6, false).with_kernel_dscp(cs3)]),
        Reason::PassDscpNotKernels,
    ));
    {
        // The kernel left the DSCP as it came (0): forwarded.
        let mut case = forward(
            b,
            "v4 tcp snat original, kernel kept the dscp",
            b.lan,
            &lan_pkt(client4, server4, tcp, 100),
            (router4, 61_000),
            (server4, 443),
            false,
            to_wan,
        );
        case.setup.flows = case
            .setup
            .flows
            .into_iter()
            .map(|f| f.with_kernel_dscp(FLOW_DSCP_KNOWN))
            .collect();
        c.push(case);
    }
    // The kernel was seen rewriting this direction's DSCP (the arming packet arrived with
    // another one) and the daemon proved the ruleset's rewrites are the same for every packet
    // of a flow: XDP sets CS3 itself and keeps the ECN bits (ECT(0) here). Without the proof,
    // or without a rewrite seen, the kernel carries the packet.
    let rewritten = cs3 | FLOW_DSCP_REWRITTEN;
    for (family, client, server, new_src) in [
        ("v4", client4, server4, (router4, 61_000)),
        ("v6", client6, server6, (client6, 40_000)),
    ] {
        let p = lan_pkt(client, server, tcp, 100);
        let mut case = forward(
            b,
            &format!("{family} dscp rewrite applied by the fast path"),
            b.lan,
            &p,
            new_src,
            (server, 443),
            false,
            to_wan,
        );
        let ect0 = 0x02;
        case.frame = with_tos(&case.frame, ect0);
        if let Expect::Redirect(_, out) = &mut case.expect {
            *out = with_tos(out, (24 << 2) | ect0);
        }
        case.setup.dscp_rewrite = true;
        case.setup.flows = case
            .setup
            .flows
            .into_iter()
            .map(|f| f.with_kernel_dscp(rewritten))
            .collect();
        let unproven = Setup {
            dscp_rewrite: false,
            ..case.setup.clone()
        };
        c.push(pass(
            b,
            &format!("{family} dscp rewrite seen, not proven per flow"),
            b.lan,
            case.frame.clone(),
            unproven,
            Reason::PassDscpNotKernels,
        ));
        let mut not_seen = case.setup.clone();
        not_seen.flows = not_seen
            .flows
            .into_iter()
            .map(|f| f.with_kernel_dscp(cs3))
            .collect();
        c.push(pass(
            b,
            &format!("{family} dscp differs, proven, no rewrite seen"),
            b.lan,
            case.frame.clone(),
            not_seen,
            Reason::PassDscpNotKernels,
        ));
        c.push(case);
    }
    // The kernel sent the armed packet out with TTL / hop limit 64 although the packets arrive
    // with 64 (a forward-path `ip ttl set 64`): they go to the kernel, so the rule applies.
    let ttl64 = FLOW_TTL_KNOWN | 64;
    c.push(pass(
        b,
        "kernel set the ttl v4",
        b.lan,
        good4.frame(),
        Setup::managed(b, vec![routed(b.lan, &good4, false).with_kernel_ttl(ttl64)]),
        Reason::PassTtlNotKernels,
    ));
    c.push(pass(
        b,
        "kernel set the hop limit v6",
        b.lan,
        good6.frame(),
        Setup::managed(b, vec![routed(b.lan, &good6, false).with_kernel_ttl(ttl64)]),
        Reason::PassTtlNotKernels,
    ));
    for (name, pkt, new_src, new_dst) in [
        (
            "v4 tcp snat original, kernel decremented the ttl",
            &good4,
            (router4, 61_000),
            (server4, 443),
        ),
        (
            "v6 tcp original, kernel decremented the hop limit",
            &good6,
            (client6, 40_000),
            (server6, 443),
        ),
    ] {
        // The kernel sent it out with the TTL one below the packets' (63): forwarded.
        let mut case = forward(b, name, b.lan, pkt, new_src, new_dst, false, to_wan);
        case.setup.flows = case
            .setup
            .flows
            .into_iter()
            .map(|f| f.with_kernel_ttl(FLOW_TTL_KNOWN | u32::from(pkt.ttl - 1)))
            .collect();
        c.push(case);
    }
    // The kernel's verdict on an armed direction expires `verdict_max_age` ticks after the TC
    // program last armed it: an older one sends the packet to the kernel; a recent one, or any
    // age with expiry off, is forwarded. The ages are far from the limits (10 s against 1 s,
    // now against 10 min): the time between building and running a case does not matter.
    let now = verdict_tick(coarse_monotonic_ns());
    let second = verdict_tick(1_000_000_000);
    for (family, pkt) in [("v4", &good4), ("v6", &good6)] {
        let mut setup = Setup::managed(
            b,
            vec![routed(b.lan, pkt, false).armed_at(now.wrapping_sub(10 * second))],
        );
        setup.verdict_max_age = second;
        c.push(pass(
            b,
            &format!("{family} verdict older than the limit"),
            b.lan,
            pkt.frame(),
            setup,
            Reason::PassVerdictExpired,
        ));
    }
    for (name, max_age, armed_at) in [
        ("v4 tcp snat original, verdict recent", 600 * second, now),
        (
            "v4 tcp snat original, verdict old, expiry off",
            0,
            now.wrapping_sub(10 * second),
        ),
    ] {
        let mut case = forward(
            b,
            name,
            b.lan,
            &lan_pkt(client4, server4, tcp, 100),
            (router4, 61_000),
            (server4, 443),
            false,
            to_wan,
        );
        case.setup.verdict_max_age = max_age;
        case.setup.flows = case
            .setup
            .flows
            .into_iter()
            .map(|f| f.armed_at(armed_at))
            .collect();
        c.push(case);
    }
    {
        let mut setup = Setup::managed(b, vec![routed(b.lan, &good4, false).armed(0, 2)]);
        setup.fib_mark = false;
        c.push(pass(
            b,
            "marked flow, lookup cannot take a mark",
            b.lan,
            good4.frame(),
            setup,
            Reason::PassMarkUnsupported,
        ));
    }
    {
        // The ingress interface is not in IFACES: counted in slot 0.
        // Its own MAC is unknown too: nothing it receives is forwarded.
        let mut case = pass(
            b,
            "unmanaged ingress counted in slot 0",
            b.lan,
            good4.frame(),
            m4().without_iface(b.lan),
            Reason::PassDstMacNotOurs,
        );
        case.slot = 0;
        c.push(case);
    }
}
