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

use std::{collections::BTreeSet, net::IpAddr};

use aya::programs::Xdp;
use xdp_router_common::{
    FIB_LOOKUP_DIRECT, FLOW_DSCP_KNOWN, FLOW_TTL_KNOWN, FibCache, IFACE_F_BRIDGE,
    IFACE_F_EGRESS_HOOK, IFACE_F_GENERIC_XDP, IFACE_F_INGRESS_HOOK, IFACE_F_NO_XDP_XMIT,
    IFACE_F_PORT_NOT_FORWARDING, IFACE_F_PPP_CCP, IFACE_F_SHAPED, IFACE_F_VLAN_PARENT, PROG_NAME,
    Reason, stats_index,
};
use xdp_router_tests::{
    fixture_net::{
        ARMED, Bed, CLIENT_MAC, GW_MAC, LAN_MAC, LAN_SLOT, MTU_MAC, MTU_PEER_MAC, MTU_SLOT, Maps,
        Setup, WAN_MAC, WAN_SLOT, XDP_PASS, XDP_REDIRECT, build_topology, coarse_monotonic_ns,
        flow, lan_pkt, load, load_object, routed, run, v4, v6, wan_pkt,
    },
    netns::{Netns, require_root},
    packet::{
        ETH_LEN, Spec, Transport, arp_request, fix_ipv4_checksum, icmpv4_echo, icmpv6_echo,
        tcp_flags::{ACK, FIN, PSH, RST, SYN},
        verify_checksums, with_bad_ipv4_checksum, with_bad_l4_checksum, with_eth_dst,
        with_ipv4_frag, with_ipv4_options, with_ipv6_ext, with_l4_checksum_ffff, with_pppoe,
        with_tag, with_tcp_doff, with_tcp_flags, with_trailer, with_udp_len, with_vlan_tag,
        with_zero_udp_checksum,
    },
};
use xdp_routerd::datapath::EBPF_OBJECT;

// ---------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Expect {
    /// XDP_PASS, frame unchanged, counted under this reason.
    Pass(Reason),
    /// XDP_REDIRECT with exactly this output frame, counted under this reason; `Setup::flows[0]`
    /// is the flow that must count the packet.
    Redirect(Reason, Vec<u8>),
}

#[derive(Clone, Debug)]
struct Case {
    name: String,
    ingress: u32,
    /// STATS slot the packet must be counted in.
    slot: u32,
    frame: Vec<u8>,
    setup: Setup,
    expect: Expect,
}

impl Case {
    fn reason(&self) -> Reason {
        match &self.expect {
            Expect::Pass(r) | Expect::Redirect(r, _) => *r,
        }
    }
}

fn slot_of(bed: &Bed, ingress: u32) -> u32 {
    match ingress {
        i if i == bed.lan => LAN_SLOT,
        i if i == bed.wan => WAN_SLOT,
        i if i == bed.mtu => MTU_SLOT,
        _ => 0,
    }
}

fn pass(bed: &Bed, name: &str, ingress: u32, frame: Vec<u8>, setup: Setup, r: Reason) -> Case {
    Case {
        name: name.to_owned(),
        ingress,
        slot: slot_of(bed, ingress),
        frame,
        setup,
        expect: Expect::Pass(r),
    }
}

/// A forwarding case: `pkt` arrives on `ingress`, its flow translates it to `new_src` →
/// `new_dst`, and it must leave with `egress_macs` (router MAC, next-hop MAC) and TTL - 1.
#[expect(clippy::too_many_arguments, reason = "one row of the fixture table")]
fn forward(
    bed: &Bed,
    name: &str,
    ingress: u32,
    pkt: &Spec,
    new_src: (IpAddr, u16),
    new_dst: (IpAddr, u16),
    reply: bool,
    (smac, dmac): ([u8; 6], [u8; 6]),
) -> Case {
    let out = pkt.forwarded(smac, dmac, new_src, new_dst).frame();
    let reason = if reply {
        Reason::ForwardedReply
    } else {
        Reason::ForwardedOriginal
    };
    Case {
        name: name.to_owned(),
        ingress,
        slot: slot_of(bed, ingress),
        frame: pkt.frame(),
        setup: Setup::managed(bed, vec![flow(ingress, pkt, new_src, new_dst, reply)]),
        expect: Expect::Redirect(reason, out),
    }
}

/// Every case of the table.
fn cases(bed: &Bed) -> Vec<Case> {
    let b = bed;
    let tcp = Transport::Tcp(ACK | PSH);
    let udp = Transport::Udp;
    let (client4, client6) = (v4("192.0.2.10"), v6("2001:db8:1::10"));
    let (server4, server6) = (v4("198.18.0.7"), v6("2001:db8:ff::7"));
    let (router4, router6) = (v4("198.51.100.1"), v6("2001:db8:2::1"));
    let to_wan = (WAN_MAC, GW_MAC);
    let to_lan = (LAN_MAC, CLIENT_MAC);
    let mut c = Vec::new();

    // --- Forwarded -----------------------------------------------------------------------
    let p = lan_pkt(client4, server4, tcp, 100);
    c.push(forward(
        b,
        "v4 tcp snat original",
        b.lan,
        &p,
        (router4, 61_000),
        (server4, 443),
        false,
        to_wan,
    ));
    {
        // Armed with a packet mark: looked up with BPF_FIB_LOOKUP_MARK (no fwmark rule here,
        // so the same answer).
        let mut case = forward(
            b,
            "v4 tcp snat original, marked",
            b.lan,
            &p,
            (router4, 61_000),
            (server4, 443),
            false,
            to_wan,
        );
        case.setup.flows = case
            .setup
            .flows
            .into_iter()
            .map(|f| f.armed(ARMED, 0x2a))
            .collect();
        c.push(case);
    }
    let p = wan_pkt(server4, router4, 61_000, tcp);
    c.push(forward(
        b,
        "v4 tcp reverse nat reply",
        b.wan,
        &p,
        (server4, 443),
        (client4, 40_000),
        true,
        to_lan,
    ));
    let p = lan_pkt(client4, server4, udp, 64);
    c.push(forward(
        b,
        "v4 udp snat original",
        b.lan,
        &p,
        (router4, 61_001),
        (server4, 443),
        false,
        to_wan,
    ));
    let p = wan_pkt(server4, router4, 61_001, udp);
    c.push(forward(
        b,
        "v4 udp reverse nat reply",
        b.wan,
        &p,
        (server4, 443),
        (client4, 40_000),
        true,
        to_lan,
    ));
    let p = lan_pkt(client4, server4, tcp, 100);
    c.push(forward(
        b,
        "v4 tcp routed, no nat",
        b.lan,
        &p,
        (client4, 40_000),
        (server4, 443),
        false,
        to_wan,
    ));
    {
        // UDP over IPv4 without checksum (0): after SNAT it must still be 0, not a bogus value.
        let p = lan_pkt(client4, server4, udp, 64);
        let mut case = forward(
            b,
            "v4 udp zero checksum stays zero",
            b.lan,
            &p,
            (router4, 61_002),
            (server4, 443),
            false,
            to_wan,
        );
        case.frame = with_zero_udp_checksum(&case.frame);
        if let Expect::Redirect(_, out) = &mut case.expect {
            *out = with_zero_udp_checksum(out);
        }
        c.push(case);
    }
    {
        // Exactly the egress MTU (1280) still fits.
        let mut p = lan_pkt(client4, v4("203.0.113.130"), tcp, 1280 - 40);
        p.dport = 8080;
        c.push(forward(
            b,
            "v4 tcp at egress mtu",
            b.lan,
            &p,
            (p.src, p.sport),
            (p.dst, p.dport),
            false,
            (MTU_MAC, MTU_PEER_MAC),
        ));
    }
    let p = lan_pkt(client6, server6, tcp, 100);
    c.push(forward(
        b,
        "v6 tcp routed original",
        b.lan,
        &p,
        (client6, 40_000),
        (server6, 443),
        false,
        to_wan,
    ));
    let p = wan_pkt(server6, client6, 40_000, udp);
    c.push(forward(
        b,
        "v6 udp routed reply",
        b.wan,
        &p,
        (server6, 443),
        (client6, 40_000),
        true,
        to_lan,
    ));
    let p = lan_pkt(client6, server6, tcp, 100);
    c.push(forward(
        b,
        "v6 tcp snat original",
        b.lan,
        &p,
        (router6, 61_000),
        (server6, 443),
        false,
        to_wan,
    ));
    let p = wan_pkt(server6, router6, 61_000, tcp);
    c.push(forward(
        b,
        "v6 tcp reverse nat reply",
        b.wan,
        &p,
        (server6, 443),
        (client6, 40_000),
        true,
        to_lan,
    ));
    let p = lan_pkt(client6, server6, udp, 80);
    c.push(forward(
        b,
        "v6 udp snat original",
        b.lan,
        &p,
        (router6, 61_003),
        (server6, 443),
        false,
        to_wan,
    ));
    let p = wan_pkt(server6, router6, 61_003, udp);
    c.push(forward(
        b,
        "v6 udp reverse nat reply",
        b.wan,
        &p,
        (server6, 443),
        (client6, 40_000),
        true,
        to_lan,
    ));

    // --- Passed, with the flow that would otherwise forward them present ------------------
    let good4 = lan_pkt(client4, server4, tcp, 100);
    let good6 = lan_pkt(client6, server6, tcp, 100);
    let flows4 = || vec![routed(b.lan, &good4, false)];
    let flows6 = || vec![routed(b.lan, &good6, false)];
    let m4 = || Setup::managed(b, flows4());
    let m6 = || Setup::managed(b, flows6());

    let mut off = m4();
    off.fastpath = false;
    c.push(pass(
        b,
        "fast path disabled",
        b.lan,
        good4.frame(),
        off,
        Reason::PassDisabled,
    ));

    c.push(pass(
        b,
        "arp",
        b.lan,
        arp_request(CLIENT_MAC, [192, 0, 2, 10], [192, 0, 2, 1]),
        m4(),
        Reason::PassNotIp,
    ));
    c.push(pass(
        b,
        "vlan tagged ipv4, no vlan device managed",
        b.lan,
        with_vlan_tag(&good4.frame(), 7),
        m4(),
        Reason::PassVlanUnknown,
    ));

    {
        let f = good4.frame();
        c.push(pass(
            b,
            "truncated ipv4 header",
            b.lan,
            f[..ETH_LEN + 10].to_vec(),
            m4(),
            Reason::PassMalformed,
        ));
        c.push(pass(
            b,
            "ipv4 total length beyond frame",
            b.lan,
            f[..f.len() - 1].to_vec(),
            m4(),
            Reason::PassMalformed,
        ));
        let mut short = f[..ETH_LEN + 30].to_vec();
        short[ETH_LEN + 2..ETH_LEN + 4].copy_from_slice(&30u16.to_be_bytes());
        fix_ipv4_checksum(&mut short);
        c.push(pass(
            b,
            "tcp header truncated",
            b.lan,
            short,
            m4(),
            Reason::PassMalformed,
        ));
        let mut ihl = f.clone();
        ihl[ETH_LEN] = 0x44;
        c.push(pass(
            b,
            "ipv4 ihl below 5",
            b.lan,
            ihl,
            m4(),
            Reason::PassMalformed,
        ));
        let mut ver = f.clone();
        ver[ETH_LEN] = 0x65;
        c.push(pass(
            b,
            "ipv4 ethertype with version 6",
            b.lan,
            ver,
            m4(),
            Reason::PassMalformed,
        ));
        let f6 = good6.frame();
        c.push(pass(
            b,
            "truncated ipv6 header",
            b.lan,
            f6[..ETH_LEN + 39].to_vec(),
            m6(),
            Reason::PassMalformed,
        ));
        c.push(pass(
            b,
            "ipv6 payload beyond frame",
            b.lan,
            f6[..f6.len() - 1].to_vec(),
            m6(),
            Reason::PassMalformed,
        ));
    }

    c.push(pass(
        b,
        "ipv4 options",
        b.lan,
        with_ipv4_options(&good4.frame(), &[1, 1, 1, 0]),
        m4(),
        Reason::PassIpv4Options,
    ));
    c.push(pass(
        b,
        "ipv4 more fragments",
        b.lan,
        with_ipv4_frag(&good4.frame(), 0x2000),
        m4(),
        Reason::PassIpv4Fragment,
    ));
    c.push(pass(
        b,
        "ipv4 fragment offset",
        b.lan,
        with_ipv4_frag(&good4.frame(), 0x0010),
        m4(),
        Reason::PassIpv4Fragment,
    ));

    // Fragment header (44) and destination options (60, PadN) before TCP.
    c.push(pass(
        b,
        "ipv6 fragment header",
        b.lan,
        with_ipv6_ext(&good6.frame(), 44, &[0, 0, 0, 1, 0, 0, 0x12, 0x34]),
        m6(),
        Reason::PassIpv6ExtHeader,
    ));
    c.push(pass(
        b,
        "ipv6 destination options",
        b.lan,
        with_ipv6_ext(&good6.frame(), 60, &[0, 0, 1, 4, 0, 0, 0, 0]),
        m6(),
        Reason::PassIpv6ExtHeader,
    ));

    {
        let mut t = good4.clone();
        t.ttl = 1;
        c.push(pass(
            b,
            "ipv4 ttl 1",
            b.lan,
            t.frame(),
            Setup::managed(b, vec![routed(b.lan, &t, false)]),
            Reason::PassTtlExpired,
        ));
        let mut t = good6.clone();
        t.ttl = 1;
        c.push(pass(
            b,
            "ipv6 hop limit 1",
            b.lan,
            t.frame(),
            Setup::managed(b, vec![routed(b.lan, &t, false)]),
            Reason::PassTtlExpired,
        ));
    }

    c.push(pass(
        b,
        "icmpv4",
        b.lan,
        icmpv4_echo(CLIENT_MAC, LAN_MAC, [192, 0, 2, 10], [198, 18, 0, 7]),
        m4(),
        Reason::PassNotTcpUdp,
    ));
    {
        let (IpAddr::V6(s), IpAddr::V6(d)) = (client6, server6) else {
            unreachable!()
        };
        c.push(pass(
            b,
            "icmpv6",
            b.lan,
            icmpv6_echo(CLIENT_MAC, LAN_MAC, s.octets(), d.octets()),
            m6(),
            Reason::PassNotTcpUdp,
        ));
    }

    for (name, flags) in [
        ("tcp syn", SYN),
        ("tcp syn ack", SYN | ACK),
        ("tcp fin", FIN | ACK),
        ("tcp rst", RST),
    ] {
        let mut t = good4.clone();
        t.transport = Transport::Tcp(flags);
        c.push(pass(
            b,
            name,
            b.lan,
            t.frame(),
            Setup::managed(b, vec![routed(b.lan, &t, false)]),
            Reason::PassTcpControl,
        ));
    }
    {
        let mut t = good6.clone();
        t.transport = Transport::Tcp(SYN);
        c.push(pass(
            b,
            "ipv6 tcp syn",
            b.lan,
            t.frame(),
            Setup::managed(b, vec![routed(b.lan, &t, false)]),
            Reason::PassTcpControl,
        ));
    }

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
            Setup::managed(b, flows4()).without_iface(b.lan),
            Reason::PassDstMacNotOurs,
        );
        case.slot = 0;
        c.push(case);
    }

    // FIB answers, each with a routed flow towards the destination in question.
    let to = |dst: &str| {
        let mut p = good4.clone();
        p.dst = v4(dst);
        let s = Setup::managed(b, vec![routed(b.lan, &p, false)]);
        (p.frame(), s)
    };
    let to6 = |dst: &str| {
        let mut p = good6.clone();
        p.dst = v6(dst);
        let s = Setup::managed(b, vec![routed(b.lan, &p, false)]);
        (p.frame(), s)
    };
    let (f, s) = to("203.0.113.7");
    c.push(pass(
        b,
        "blackhole route",
        b.lan,
        f,
        s,
        Reason::PassFibNotForwardable,
    ));
    let (f, s) = to("203.0.113.70");
    c.push(pass(
        b,
        "unreachable route",
        b.lan,
        f,
        s,
        Reason::PassFibNotForwardable,
    ));
    let (f, s) = to("198.51.100.1");
    c.push(pass(
        b,
        "local destination",
        b.lan,
        f,
        s,
        Reason::PassFibNotForwardable,
    ));
    let (f, s) = to6("2001:db8:dead::1");
    c.push(pass(
        b,
        "ipv6 blackhole route",
        b.lan,
        f,
        s,
        Reason::PassFibNotForwardable,
    ));
    {
        // The flow's *translated* destination decides: the packet is to a routable server,
        // but the flow rewrites it into the blackhole.
        let s = Setup::managed(
            b,
            vec![flow(
                b.lan,
                &good4,
                (client4, 40_000),
                (v4("203.0.113.8"), 443),
                false,
            )],
        );
        c.push(pass(
            b,
            "translated destination blackholed",
            b.lan,
            good4.frame(),
            s,
            Reason::PassFibNotForwardable,
        ));
    }
    let (f, s) = to("203.0.113.200");
    c.push(pass(
        b,
        "no neighbour",
        b.lan,
        f,
        s,
        Reason::PassNoNeighbour,
    ));
    let (f, s) = to6("2001:db8:beef::1");
    c.push(pass(
        b,
        "ipv6 no neighbour",
        b.lan,
        f,
        s,
        Reason::PassNoNeighbour,
    ));
    {
        let mut p = lan_pkt(client4, v4("203.0.113.130"), tcp, 1300);
        p.dport = 8080;
        c.push(pass(
            b,
            "frag needed",
            b.lan,
            p.frame(),
            Setup::managed(b, vec![routed(b.lan, &p, false)]),
            Reason::PassFragNeeded,
        ));
        let mut p = lan_pkt(client6, v6("2001:db8:3::2"), udp, 1300);
        p.dport = 8080;
        c.push(pass(
            b,
            "ipv6 packet too big",
            b.lan,
            p.frame(),
            Setup::managed(b, vec![routed(b.lan, &p, false)]),
            Reason::PassFragNeeded,
        ));
    }

    c.push(pass(
        b,
        "egress not in IFACES",
        b.lan,
        good4.frame(),
        m4().without_iface(b.wan),
        Reason::PassEgressNotManaged,
    ));
    c.push(pass(
        b,
        "egress not in TX_PORTS",
        b.lan,
        good4.frame(),
        m4().without_tx_port(b.wan),
        Reason::PassEgressNotManaged,
    ));
    c.push(pass(
        b,
        "ipv6 egress not in IFACES",
        b.lan,
        good6.frame(),
        m6().without_iface(b.wan),
        Reason::PassEgressNotManaged,
    ));
    c.push(pass(
        b,
        "ingress interface with a netdev/tc ingress hook",
        b.lan,
        good4.frame(),
        m4().with_iface_flags(b.lan, IFACE_F_INGRESS_HOOK),
        Reason::PassIngressHook,
    ));
    c.push(pass(
        b,
        "ingress interface attached in generic (skb) mode",
        b.lan,
        good4.frame(),
        m4().with_iface_flags(b.lan, IFACE_F_GENERIC_XDP),
        Reason::PassGenericXdp,
    ));
    c.push(pass(
        b,
        "ipv6 egress with a netdev/tc egress hook",
        b.lan,
        good6.frame(),
        m6().with_iface_flags(b.wan, IFACE_F_EGRESS_HOOK),
        Reason::PassEgressHook,
    ));
    c.push(pass(
        b,
        "egress shaped",
        b.lan,
        good4.frame(),
        m4().with_iface_flags(b.wan, IFACE_F_SHAPED),
        Reason::PassEgressShaped,
    ));
    c.push(pass(
        b,
        "ipv6 egress shaped",
        b.lan,
        good6.frame(),
        m6().with_iface_flags(b.wan, IFACE_F_SHAPED),
        Reason::PassEgressShaped,
    ));
    c.push(pass(
        b,
        "egress cannot transmit XDP frames",
        b.lan,
        good4.frame(),
        m4().with_iface_flags(b.wan, IFACE_F_NO_XDP_XMIT),
        Reason::PassEgressNoXdpXmit,
    ));
    c.push(pass(
        b,
        "ipv6 egress cannot transmit XDP frames",
        b.lan,
        good6.frame(),
        m6().with_iface_flags(b.wan, IFACE_F_NO_XDP_XMIT),
        Reason::PassEgressNoXdpXmit,
    ));

    bridge_cases(b, &good4, m4(), &mut c);
    bridge_vlan_cases(b, &mut c);
    vlan_cases(b, &mut c);
    pppoe_cases(b, &mut c);
    kernel_checks(b, &mut c);
    c
}

/// A forwarding case whose frames carry VLAN tags or PPPoE headers: `pkt` arrives as `input`
/// on `ingress` (counted in `slot`), its flow direction is keyed on `flow_iif` (the VLAN or
/// PPP device the frame belongs to), and it must leave as `output` of the forwarded packet.
#[expect(clippy::too_many_arguments, reason = "one row of the fixture table")]
fn encap_forward(
    name: &str,
    (ingress, slot, flow_iif): (u32, u32, u32),
    pkt: &Spec,
    new_src: (IpAddr, u16),
    new_dst: (IpAddr, u16),
    reply: bool,
    (smac, dmac): ([u8; 6], [u8; 6]),
    setup: impl Fn(Setup) -> Setup,
    input: impl Fn(&[u8]) -> Vec<u8>,
    output: impl Fn(&[u8]) -> Vec<u8>,
    bed: &Bed,
) -> Case {
    let out = pkt.forwarded(smac, dmac, new_src, new_dst).frame();
    let reason = if reply {
        Reason::ForwardedReply
    } else {
        Reason::ForwardedOriginal
    };
    Case {
        name: name.to_owned(),
        ingress,
        slot,
        frame: input(&pkt.frame()),
        setup: setup(Setup::managed(
            bed,
            vec![flow(flow_iif, pkt, new_src, new_dst, reply)],
        )),
        expect: Expect::Redirect(reason, output(&out)),
    }
}

/// 802.1Q / 802.1ad VLANs. `mtu0` stands in for the VLAN parent (the "trunk": this kernel
/// has no 8021q module, and the datapath only needs ifindexes, routes and neighbours): the
/// WAN (`wan0`) is VLAN 7 on it and, for tagged-to-tagged, the LAN (`lan0`) VLAN 10. Every
/// forwarded frame's bytes are compared whole (MACs, tag, TTL, NAT, checksums verified).
fn vlan_cases(b: &Bed, c: &mut Vec<Case>) {
    let tcp = Transport::Tcp(ACK | PSH);
    let (client4, client6) = (v4("192.0.2.10"), v6("2001:db8:1::10"));
    let (server4, server6) = (v4("198.18.0.7"), v6("2001:db8:ff::7"));
    let (router4, router6) = (v4("198.51.100.1"), v6("2001:db8:2::1"));
    let to_wan = (WAN_MAC, GW_MAC);
    let to_lan = (LAN_MAC, CLIENT_MAC);
    let wan7 = |s: Setup| s.with_vlan(b.wan, b.mtu, 7, 0x8100, true);
    let both = |s: Setup| {
        s.with_vlan(b.wan, b.mtu, 7, 0x8100, true)
            .with_vlan(b.lan, b.mtu, 10, 0x8100, true)
    };
    let same = |f: &[u8]| f.to_vec();
    let tag7 = |f: &[u8]| with_vlan_tag(f, 7);

    // Tagged in (WAN VLAN 7), untagged out (LAN): reply direction, reverse NAT.
    let r4 = wan_pkt(server4, router4, 61_000, tcp);
    c.push(encap_forward(
        "vlan: tagged in, untagged out (v4 reply)",
        (b.mtu, WAN_SLOT, b.wan),
        &r4,
        (server4, 443),
        (client4, 40_000),
        true,
        to_lan,
        wan7,
        tag7,
        same,
        b,
    ));
    c.push(encap_forward(
        "vlan: tagged in with priority 5, untagged out (v4 reply)",
        (b.mtu, WAN_SLOT, b.wan),
        &r4,
        (server4, 443),
        (client4, 40_000),
        true,
        to_lan,
        wan7,
        |f| with_tag(f, 0x8100, 0xa000 | 7),
        same,
        b,
    ));
    let r6 = wan_pkt(server6, router6, 61_000, Transport::Udp);
    c.push(encap_forward(
        "vlan: tagged in, untagged out (v6 udp reply)",
        (b.mtu, WAN_SLOT, b.wan),
        &r6,
        (server6, 443),
        (client6, 40_000),
        true,
        to_lan,
        wan7,
        tag7,
        same,
        b,
    ));
    // Untagged in (LAN), tagged out (WAN VLAN 7): original direction, SNAT.
    let o4 = lan_pkt(client4, server4, tcp, 100);
    c.push(encap_forward(
        "vlan: untagged in, tagged out (v4 snat original)",
        (b.lan, LAN_SLOT, b.lan),
        &o4,
        (router4, 61_000),
        (server4, 443),
        false,
        to_wan,
        wan7,
        same,
        tag7,
        b,
    ));
    let o6 = lan_pkt(client6, server6, Transport::Udp, 64);
    c.push(encap_forward(
        "vlan: untagged in, tagged out (v6 udp snat original)",
        (b.lan, LAN_SLOT, b.lan),
        &o6,
        (router6, 61_000),
        (server6, 443),
        false,
        to_wan,
        wan7,
        same,
        tag7,
        b,
    ));
    // Tagged in (LAN VLAN 10), tagged out (WAN VLAN 7), both on the same parent.
    c.push(encap_forward(
        "vlan: tagged in, tagged out (v4 snat original, router on a stick)",
        (b.mtu, LAN_SLOT, b.lan),
        &o4,
        (router4, 61_000),
        (server4, 443),
        false,
        to_wan,
        both,
        |f| with_vlan_tag(f, 10),
        tag7,
        b,
    ));
    c.push(encap_forward(
        "vlan: tagged in, tagged out (v4 reply)",
        (b.mtu, WAN_SLOT, b.wan),
        &r4,
        (server4, 443),
        (client4, 40_000),
        true,
        to_lan,
        both,
        tag7,
        |f| with_vlan_tag(f, 10),
        b,
    ));
    // A bridged LAN (the LAN a bridge with the LAN's own ifindex, its port, the client behind
    // it) and a VLAN WAN: from the port, tagged out of the parent.
    c.push(encap_forward(
        "vlan: from a bridge port, tagged out (v4 snat original)",
        (b.lan, LAN_SLOT, b.lan),
        &o4,
        (router4, 61_000),
        (server4, 443),
        false,
        to_wan,
        |s| {
            wan7(s)
                .with_bridge_port(b.lan, b.lan)
                .with_fdb(b.lan, CLIENT_MAC, b.lan)
        },
        same,
        tag7,
        b,
    ));
    // A VLAN device over a bridge port (`eth1.20`, eth1 in a bridge; here `mtu0` a port of a
    // bridge `sub0` and `lan0` VLAN 10 on it): its tagged frames are its own, not the bridge's
    // (they are not addressed to the bridge), and it sends tagged out of the port.
    let on_port = |s: Setup| {
        s.with_vlan(b.lan, b.mtu, 10, 0x8100, false)
            .with_bridge_port(b.mtu, b.sub)
    };
    c.push(encap_forward(
        "vlan on a bridge port: tagged in, out to the WAN (v4 snat original)",
        (b.mtu, LAN_SLOT, b.lan),
        &o4,
        (router4, 61_000),
        (server4, 443),
        false,
        to_wan,
        on_port,
        |f| with_vlan_tag(f, 10),
        same,
        b,
    ));
    c.push(encap_forward(
        "vlan on a bridge port: in from the WAN, tagged out of the port (v4 reply)",
        (b.wan, WAN_SLOT, b.wan),
        &r4,
        (server4, 443),
        (client4, 40_000),
        true,
        to_lan,
        on_port,
        same,
        |f| with_vlan_tag(f, 10),
        b,
    ));
    c.push(pass(
        b,
        "vlan on a bridge port: another VLAN's tag, not to the bridge's MAC",
        b.mtu,
        with_vlan_tag(&o4.frame(), 11),
        on_port(Setup::managed(
            b,
            vec![flow(b.lan, &o4, (router4, 61_000), (server4, 443), false)],
        )),
        Reason::PassBridged,
    ));
    // 802.1ad, when the VLAN device is one.
    c.push(encap_forward(
        "vlan: 802.1ad tagged in, 802.1ad tagged out",
        (b.mtu, LAN_SLOT, b.lan),
        &o4,
        (router4, 61_000),
        (server4, 443),
        false,
        to_wan,
        |s| {
            s.with_vlan(b.wan, b.mtu, 7, 0x88a8, true)
                .with_vlan(b.lan, b.mtu, 10, 0x88a8, true)
        },
        |f| with_tag(f, 0x88a8, 10),
        |f| with_tag(f, 0x88a8, 7),
        b,
    ));

    // Passed to the kernel untouched.
    let reply_flow = |s: Setup| {
        wan7(Setup {
            flows: vec![flow(b.wan, &r4, (server4, 443), (client4, 40_000), true)],
            ..s
        })
    };
    let m = || reply_flow(Setup::managed(b, Vec::new()));
    let r4f = r4.frame();
    c.push(pass(
        b,
        "vlan: Q-in-Q (two tags)",
        b.mtu,
        with_vlan_tag(&with_vlan_tag(&r4f, 100), 7),
        m(),
        Reason::PassVlanQinQ,
    ));
    c.push(pass(
        b,
        "vlan: 802.1ad outer tag over 802.1Q",
        b.mtu,
        with_tag(&with_vlan_tag(&r4f, 100), 0x88a8, 7),
        m(),
        Reason::PassVlanQinQ,
    ));
    c.push(pass(
        b,
        "vlan: unknown VLAN ID",
        b.mtu,
        with_vlan_tag(&r4f, 8),
        m(),
        Reason::PassVlanUnknown,
    ));
    c.push(pass(
        b,
        "vlan: 802.1ad tag where the VLAN device is 802.1Q",
        b.mtu,
        with_tag(&r4f, 0x88a8, 7),
        m(),
        Reason::PassVlanUnknown,
    ));
    c.push(pass(
        b,
        "vlan: priority-tagged (VLAN ID 0)",
        b.mtu,
        with_tag(&r4f, 0x8100, 0xa000),
        m(),
        Reason::PassVlanPriorityTagged,
    ));
    c.push(pass(
        b,
        "vlan: untagged frame on a parent managed only for its VLANs",
        b.mtu,
        r4f.clone(),
        m(),
        Reason::PassVlanParentUntagged,
    ));
    c.push(pass(
        b,
        "vlan: tag of a VLAN of another parent",
        b.lan,
        with_vlan_tag(&r4f, 7),
        m(),
        Reason::PassVlanUnknown,
    ));
    let mut tagged_pass = |name: &str, setup: Setup, r: Reason| {
        let mut case = pass(b, name, b.mtu, with_vlan_tag(&r4f, 7), setup, r);
        // Known VLAN: counted as the VLAN device's.
        case.slot = WAN_SLOT;
        c.push(case);
    };
    tagged_pass(
        "vlan: tagged, to another MAC than the VLAN device's",
        m().with_iface_mac(b.wan, [2, 0, 0, 0, 0, 0x99]),
        Reason::PassDstMacNotOurs,
    );
    tagged_pass(
        "vlan: tagged, ingress hook on the VLAN device",
        m().with_iface_flags(b.wan, IFACE_F_INGRESS_HOOK),
        Reason::PassIngressHook,
    );
    tagged_pass(
        "vlan: tagged, no flow keyed on the VLAN device",
        Setup {
            flows: vec![flow(b.mtu, &r4, (server4, 443), (client4, 40_000), true)],
            ..m()
        },
        Reason::PassNoFlow,
    );
    // Egress through the VLAN device: its own and its parent's egress must allow a redirect.
    let orig = |s: Setup| {
        wan7(Setup {
            flows: vec![flow(b.lan, &o4, (router4, 61_000), (server4, 443), false)],
            ..s
        })
    };
    let o = || orig(Setup::managed(b, Vec::new()));
    let o4f = o4.frame();
    c.extend(lower_egress_cases(
        b,
        "vlan egress",
        ("VLAN device", "parent"),
        o,
        &o4f,
    ));
    // The FIB routes out of the parent itself, which is managed only for its VLANs.
    let to_parent = lan_pkt(client4, v4("203.0.113.130"), tcp, 100);
    c.push(pass(
        b,
        "vlan: routed out of a parent managed only for its VLANs",
        b.lan,
        to_parent.frame(),
        wan7(Setup::managed(b, vec![routed(b.lan, &to_parent, false)])),
        Reason::PassEgressNotManaged,
    ));
}

/// Egress through a device that transmits through another (`wan0`, a VLAN or PPP device, over
/// `mtu0`, its parent or lower device; `names` says which): the device's own egress and the
/// other's must both allow a redirect. `setup` routes `frame` (from the LAN) out of `wan0`.
fn lower_egress_cases(
    b: &Bed,
    prefix: &str,
    (device, lower): (&str, &str),
    setup: impl Fn() -> Setup,
    frame: &[u8],
) -> Vec<Case> {
    [
        (
            format!("{device} shaped"),
            setup().with_iface_flags(b.wan, IFACE_F_SHAPED),
            Reason::PassEgressShaped,
        ),
        (
            format!("{lower} shaped"),
            setup().with_iface_flags(b.mtu, IFACE_F_SHAPED),
            Reason::PassEgressShaped,
        ),
        (
            format!("egress hook on the {device}"),
            setup().with_iface_flags(b.wan, IFACE_F_EGRESS_HOOK),
            Reason::PassEgressHook,
        ),
        (
            format!("{lower} cannot transmit XDP frames"),
            setup().with_iface_flags(b.mtu, IFACE_F_NO_XDP_XMIT),
            Reason::PassEgressNoXdpXmit,
        ),
        (
            format!("{lower} not managed"),
            setup().without_iface(b.mtu),
            Reason::PassEgressNotManaged,
        ),
        (
            format!("{lower} not a redirect target"),
            setup().without_tx_port(b.mtu),
            Reason::PassEgressNotManaged,
        ),
    ]
    .into_iter()
    .map(|(what, setup, r)| {
        pass(
            b,
            &format!("{prefix}: {what}"),
            b.lan,
            frame.to_vec(),
            setup,
            r,
        )
    })
    .collect()
}

/// PPPoE WAN. `wan0` stands in for the PPP device (`ppp0`: this kernel has no pppoe module,
/// and the datapath only needs its ifindex and routes), `mtu0` for the Ethernet port the
/// session runs over, `MTU_PEER_MAC` for the access concentrator; `sub0` stands in for a VLAN
/// device between them (PPPoE over VLAN 7). The session ID's two bytes differ, so a byte-order
/// mistake shows. Every forwarded frame's bytes are compared whole.
fn pppoe_cases(b: &Bed, c: &mut Vec<Case>) {
    const SID: u16 = 0x1234;
    const PEER: [u8; 6] = MTU_PEER_MAC;
    const SUB_SLOT: u32 = 4;
    let tcp = Transport::Tcp(ACK | PSH);
    let (client4, client6) = (v4("192.0.2.10"), v6("2001:db8:1::10"));
    let (server4, server6) = (v4("198.18.0.7"), v6("2001:db8:ff::7"));
    let (router4, router6) = (v4("198.51.100.1"), v6("2001:db8:2::1"));
    let to_peer = (MTU_MAC, PEER);
    let to_lan = (LAN_MAC, CLIENT_MAC);
    let session = |s: Setup| s.with_pppoe(b.wan, b.mtu, SID, PEER, true);
    let over_vlan = |s: Setup| {
        s.with_iface(b.sub, SUB_SLOT, MTU_MAC)
            .with_vlan(b.sub, b.mtu, 7, 0x8100, true)
            .with_pppoe(b.wan, b.sub, SID, PEER, true)
    };
    let same = |f: &[u8]| f.to_vec();
    let ses = |f: &[u8]| with_pppoe(f, SID);
    let ses7 = |f: &[u8]| with_vlan_tag(&with_pppoe(f, SID), 7);
    // What the access concentrator sends: from its MAC to the lower device's.
    let from_peer = |p: Spec| Spec {
        eth_src: PEER,
        eth_dst: MTU_MAC,
        ..p
    };

    // Session in (decapsulated), untagged out to the LAN: reply direction, reverse NAT.
    let r4 = from_peer(wan_pkt(server4, router4, 61_000, tcp));
    let r6 = from_peer(wan_pkt(server6, router6, 61_000, Transport::Udp));
    for (name, pkt, client) in [
        ("pppoe: session in, out to the LAN (v4 reply)", &r4, client4),
        (
            "pppoe: session in, out to the LAN (v6 udp reply)",
            &r6,
            client6,
        ),
    ] {
        let server = pkt.src;
        c.push(encap_forward(
            name,
            (b.mtu, WAN_SLOT, b.wan),
            pkt,
            (server, 443),
            (client, 40_000),
            true,
            to_lan,
            session,
            ses,
            same,
            b,
        ));
    }
    c.push(encap_forward(
        "pppoe: session in with Ethernet padding after the payload (trimmed)",
        (b.mtu, WAN_SLOT, b.wan),
        &r4,
        (server4, 443),
        (client4, 40_000),
        true,
        to_lan,
        session,
        |f| with_trailer(&with_pppoe(f, SID), &[0; 10]),
        same,
        b,
    ));
    // From the LAN, encapsulated into the session: original direction, SNAT.
    let o4 = lan_pkt(client4, server4, tcp, 100);
    let o6 = lan_pkt(client6, server6, Transport::Udp, 64);
    for (name, pkt, router) in [
        (
            "pppoe: LAN in, session out (v4 snat original)",
            &o4,
            router4,
        ),
        (
            "pppoe: LAN in, session out (v6 udp snat original)",
            &o6,
            router6,
        ),
    ] {
        let server = pkt.dst;
        c.push(encap_forward(
            name,
            (b.lan, LAN_SLOT, b.lan),
            pkt,
            (router, 61_000),
            (server, 443),
            false,
            to_peer,
            session,
            same,
            ses,
            b,
        ));
    }
    // A next hop the kernel has no neighbour entry for: a PPP device needs none (the FIB
    // answers "no neighbour" with the egress and the MTU check done).
    let far = v4("203.0.113.200");
    let o4_far = lan_pkt(client4, far, tcp, 100);
    c.push(encap_forward(
        "pppoe: session out, next hop without a neighbour entry",
        (b.lan, LAN_SLOT, b.lan),
        &o4_far,
        (router4, 61_000),
        (far, 443),
        false,
        to_peer,
        session,
        same,
        ses,
        b,
    ));
    // PPPoE over VLAN 7: tag and session header popped together, and pushed together.
    c.push(encap_forward(
        "pppoe over vlan: tagged session in, out to the LAN (v4 reply)",
        (b.mtu, WAN_SLOT, b.wan),
        &r4,
        (server4, 443),
        (client4, 40_000),
        true,
        to_lan,
        over_vlan,
        ses7,
        same,
        b,
    ));
    c.push(encap_forward(
        "pppoe over vlan: LAN in, tagged session out (v6 udp snat original)",
        (b.lan, LAN_SLOT, b.lan),
        &o6,
        (router6, 61_000),
        (server6, 443),
        false,
        to_peer,
        over_vlan,
        same,
        ses7,
        b,
    ));

    // Passed to the kernel untouched.
    let reply_flow = |s: Setup| {
        session(Setup {
            flows: vec![flow(b.wan, &r4, (server4, 443), (client4, 40_000), true)],
            ..s
        })
    };
    let m = || reply_flow(Setup::managed(b, Vec::new()));
    let r4s = with_pppoe(&r4.frame(), SID);
    let patched = |at: usize, bytes: &[u8]| {
        let mut f = r4s.clone();
        f[at..at + bytes.len()].copy_from_slice(bytes);
        f
    };
    let on_lower =
        |name: &str, frame: Vec<u8>, setup: Setup, r: Reason| pass(b, name, b.mtu, frame, setup, r);
    c.push(on_lower(
        "pppoe: unknown session ID",
        with_pppoe(&r4.frame(), SID + 1),
        m(),
        Reason::PassPppoeUnknownSession,
    ));
    c.push(on_lower(
        "pppoe: the session's ID from another MAC than the peer's",
        with_pppoe(
            &Spec {
                eth_src: GW_MAC,
                ..r4.clone()
            }
            .frame(),
            SID,
        ),
        m(),
        Reason::PassPppoeUnknownSession,
    ));
    c.push(pass(
        b,
        "pppoe: the session's ID on another device",
        b.lan,
        with_eth_dst(&r4s, LAN_MAC),
        m(),
        Reason::PassPppoeUnknownSession,
    ));
    // Offsets in the session frame: 14 version/type, 15 code, 18 length, 20 PPP protocol.
    c.push(on_lower(
        "pppoe: LCP on the session",
        patched(20, &0xc021u16.to_be_bytes()),
        m(),
        Reason::PassPppoeNotIp,
    ));
    let mut ccp_pass = |name: &str, frame: Vec<u8>, setup: Setup| {
        c.push(on_lower(name, frame, setup, Reason::PassPppoeCcp))
    };
    // CCP runs on the session (compression, MPPE): see `ccp_seen_on_a_session_stops_its_fast_path`.
    ccp_pass(
        "pppoe: compressed datagram from the peer",
        patched(20, &0x00fdu16.to_be_bytes()),
        m(),
    );
    ccp_pass(
        "pppoe: CCP Configure-Ack from the peer",
        patched(20, &[0x80, 0xfd, 0x02]),
        m(),
    );
    ccp_pass(
        "pppoe: IP datagram on a session where CCP was seen",
        r4s.clone(),
        m().with_iface_flags(b.wan, IFACE_F_PPP_CCP),
    );
    c.push(on_lower(
        "pppoe: CCP Configure-Request from the peer (our pppd may reject it)",
        patched(20, &[0x80, 0xfd, 0x01]),
        m(),
        Reason::PassPppoeNotIp,
    ));
    let longer = u16::from_be_bytes([r4s[18], r4s[19]]) + 1;
    c.push(on_lower(
        "pppoe: length beyond the frame",
        patched(18, &longer.to_be_bytes()),
        m(),
        Reason::PassMalformed,
    ));
    c.push(on_lower(
        "pppoe: discovery code on a session frame",
        patched(15, &[0xa7]),
        m(),
        Reason::PassMalformed,
    ));
    c.push(on_lower(
        "pppoe: discovery (PADT) on a lower device managed only for its session",
        patched(12, &[0x88, 0x63, 0x11, 0xa7]),
        m(),
        Reason::PassPppoeLowerOther,
    ));
    c.push(on_lower(
        "pppoe: plain IPv4 on a lower device managed only for its session",
        r4.frame(),
        m(),
        Reason::PassPppoeLowerOther,
    ));
    c.push(on_lower(
        "pppoe: session frame to another MAC than the lower device's",
        with_eth_dst(&r4s, [2, 0, 0, 0, 0, 0x99]),
        m(),
        Reason::PassDstMacNotOurs,
    ));
    let mut session_pass = |name: &str, setup: Setup, r: Reason| {
        let mut case = on_lower(name, r4s.clone(), setup, r);
        // A managed session's frame: counted as the PPP device's.
        case.slot = WAN_SLOT;
        c.push(case);
    };
    session_pass(
        "pppoe: ingress hook on the PPP device",
        m().with_iface_flags(b.wan, IFACE_F_INGRESS_HOOK),
        Reason::PassIngressHook,
    );
    session_pass(
        "pppoe: no flow keyed on the PPP device",
        Setup {
            flows: vec![flow(b.mtu, &r4, (server4, 443), (client4, 40_000), true)],
            ..m()
        },
        Reason::PassNoFlow,
    );
    // Egress through the PPP device: its own and its lower device's egress must allow a
    // redirect.
    let o = || {
        session(Setup::managed(
            b,
            vec![flow(b.lan, &o4, (router4, 61_000), (server4, 443), false)],
        ))
    };
    let o4f = o4.frame();
    c.extend(lower_egress_cases(
        b,
        "pppoe egress",
        ("PPP device", "lower device"),
        o,
        &o4f,
    ));
    for (name, setup, r) in [
        (
            "pppoe egress: CCP seen on the session",
            o().with_iface_flags(b.wan, IFACE_F_PPP_CCP),
            Reason::PassPppoeCcp,
        ),
        (
            "pppoe egress: lower device is a bridge port",
            o().with_bridge_port(b.mtu, b.lan),
            Reason::PassEgressNotManaged,
        ),
    ] {
        c.push(pass(b, name, b.lan, o4f.clone(), setup, r));
    }
    // The MTU check is the PPP device's (the kernel's `ip_forward` checks ppp0's 1492): here
    // `mtu0` (MTU 1280) stands in for the PPP device, over `wan0`.
    let big = lan_pkt(client4, v4("203.0.113.130"), tcp, 1300);
    c.push(pass(
        b,
        "pppoe: datagram over the PPP device's MTU",
        b.lan,
        big.frame(),
        Setup::managed(b, vec![routed(b.lan, &big, false)])
            .with_pppoe(b.mtu, b.wan, SID, PEER, false),
        Reason::PassFragNeeded,
    ));
    let fits = lan_pkt(client4, v4("203.0.113.130"), tcp, 1200);
    c.push(encap_forward(
        "pppoe: datagram within the PPP device's MTU",
        (b.lan, LAN_SLOT, b.lan),
        &fits,
        (client4, 40_000),
        (v4("203.0.113.130"), 443),
        false,
        (WAN_MAC, PEER),
        |s| s.with_pppoe(b.mtu, b.wan, SID, PEER, false),
        same,
        ses,
        b,
    ));
    // The FIB routes out of the lower device itself, which is managed only for the session.
    let to_lower = lan_pkt(client4, v4("203.0.113.130"), tcp, 100);
    c.push(pass(
        b,
        "pppoe: routed out of a lower device managed only for its session",
        b.lan,
        to_lower.frame(),
        session(Setup::managed(b, vec![routed(b.lan, &to_lower, false)])),
        Reason::PassEgressNotManaged,
    ));
    // A PPP device without a session (pppd redialling): not PPPoE, cannot transmit.
    c.push(pass(
        b,
        "pppoe: PPP device without a session",
        b.lan,
        o4f.clone(),
        Setup::managed(
            b,
            vec![flow(b.lan, &o4, (router4, 61_000), (server4, 443), false)],
        )
        .with_iface_flags(b.wan, IFACE_F_NO_XDP_XMIT)
        .without_tx_port(b.wan),
        Reason::PassEgressNoXdpXmit,
    ));
    // Without the session the same unresolved next hop is the kernel's to resolve.
    c.push(pass(
        b,
        "pppoe: next hop without a neighbour entry on a device that is not PPPoE",
        b.lan,
        o4_far.frame(),
        Setup::managed(b, vec![routed(b.lan, &o4_far, false)]),
        Reason::PassNoNeighbour,
    ));
}

/// Bridged LAN: the ingress as a bridge port (here a port of a bridge with the LAN's own
/// ifindex, so the flow keyed on it matches), and the egress as a bridge whose FDB points at
/// another interface.
fn bridge_cases(b: &Bed, good4: &Spec, m4: Setup, c: &mut Vec<Case>) {
    let port = m4.clone().with_bridge_port(b.lan, b.lan);
    let learned = port.clone().with_fdb(b.lan, CLIENT_MAC, b.lan);
    c.push(pass(
        b,
        "bridge port: frame to another host's MAC",
        b.lan,
        with_eth_dst(&good4.frame(), [2, 0, 0, 0, 0, 0x99]),
        learned.clone(),
        Reason::PassBridged,
    ));
    c.push(pass(
        b,
        "bridge port: broadcast",
        b.lan,
        with_eth_dst(&good4.frame(), [0xff; 6]),
        learned.clone(),
        Reason::PassBridged,
    ));
    c.push(pass(
        b,
        "bridge port not in the STP forwarding state",
        b.lan,
        good4.frame(),
        learned
            .clone()
            .with_iface_flags(b.lan, IFACE_F_PORT_NOT_FORWARDING),
        Reason::PassBridgePortNotForwarding,
    ));
    c.push(pass(
        b,
        "bridge port: source MAC not in the FDB",
        b.lan,
        good4.frame(),
        port.clone(),
        Reason::PassBridgeLearning,
    ));
    c.push(pass(
        b,
        "bridge port: source MAC behind another port",
        b.lan,
        good4.frame(),
        port.with_fdb(b.lan, CLIENT_MAC, b.mtu),
        Reason::PassBridgeLearning,
    ));
    let mut from_port = routed_forward(
        b,
        "bridge port: routed as the bridge",
        good4,
        |f| f.to_vec(),
        |f| f.to_vec(),
    );
    from_port.setup = learned;
    c.push(from_port);
    // Egress through a bridge: FIB says WAN; the WAN is a bridge whose FDB has the gateway's MAC
    // behind the MTU interface (a port of it).
    let bridged_wan = m4
        .clone()
        .with_iface_flags(b.wan, IFACE_F_BRIDGE | IFACE_F_NO_XDP_XMIT)
        .with_bridge_port(b.mtu, b.wan);
    c.push(pass(
        b,
        "egress bridge: destination MAC not in the FDB",
        b.lan,
        good4.frame(),
        bridged_wan.clone(),
        Reason::PassBridgeFdbMiss,
    ));
    c.push(pass(
        b,
        "egress bridge: FDB port shaped",
        b.lan,
        good4.frame(),
        bridged_wan
            .clone()
            .with_fdb(b.wan, GW_MAC, b.mtu)
            .with_iface_flags(b.mtu, IFACE_F_SHAPED),
        Reason::PassEgressShaped,
    ));
    c.push(pass(
        b,
        "egress bridge: FDB port not forwarding",
        b.lan,
        good4.frame(),
        bridged_wan
            .clone()
            .with_fdb(b.wan, GW_MAC, b.mtu)
            .with_iface_flags(b.mtu, IFACE_F_PORT_NOT_FORWARDING),
        Reason::PassBridgePortNotForwarding,
    ));
    c.push(pass(
        b,
        "egress bridge: FDB names an interface that is not its port",
        b.lan,
        good4.frame(),
        bridged_wan.clone().with_fdb(b.wan, GW_MAC, b.lan),
        Reason::PassEgressNotManaged,
    ));
    let mut via_fdb = routed_forward(
        b,
        "egress bridge: redirected to the FDB's port",
        good4,
        |f| f.to_vec(),
        |f| f.to_vec(),
    );
    via_fdb.setup = bridged_wan.with_fdb(b.wan, GW_MAC, b.mtu);
    c.push(via_fdb);
}

/// VLAN-filtering bridges and VLAN devices over bridges. `mtu0` stands in for the bridge's
/// port (this kernel has no bridge VLAN filtering; the datapath only needs ifindexes, routes
/// and neighbours). Either the LAN (`lan0`) is the bridge itself, whose own entry for VLAN 1
/// is untagged (its IP layer sees VLAN 1 on it), or the LAN is VLAN device 20 over a bridge
/// `sub0` (`br-lan.20`, the OpenWrt DSA layout). Every forwarded frame's bytes are compared.
fn bridge_vlan_cases(b: &Bed, c: &mut Vec<Case>) {
    const SUB_SLOT: u32 = 4;
    let tcp = Transport::Tcp(ACK | PSH);
    let (client4, client6) = (v4("192.0.2.10"), v6("2001:db8:1::10"));
    let (server4, server6) = (v4("198.18.0.7"), v6("2001:db8:ff::7"));
    let (router4, router6) = (v4("198.51.100.1"), v6("2001:db8:2::1"));
    let to_wan = (WAN_MAC, GW_MAC);
    let to_lan = (LAN_MAC, CLIENT_MAC);
    let same = |f: &[u8]| f.to_vec();
    let o4 = lan_pkt(client4, server4, tcp, 100);
    let r4 = wan_pkt(server4, router4, 61_000, tcp);
    let r6 = wan_pkt(server6, router6, 61_000, Transport::Udp);
    let orig4 = || {
        Setup::managed(
            b,
            vec![flow(b.lan, &o4, (router4, 61_000), (server4, 443), false)],
        )
    };

    // The LAN is the bridge (lan0) on VLAN 1, untagged in its own entry and on its port
    // (mtu0, PVID 1), which also carries VLAN 20 tagged. The client is in VLAN 1.
    let bridge = |port_vlans: &'static [(u16, bool)]| {
        move |s: Setup| {
            s.with_iface_flags(b.lan, IFACE_F_BRIDGE | IFACE_F_NO_XDP_XMIT)
                .with_bridge_port(b.mtu, b.lan)
                .with_iface_mac(b.mtu, LAN_MAC)
                .with_vlan_filtering(b.lan, 1, &[(1, true)])
                .with_vlan_filtering(b.mtu, 1, port_vlans)
                .with_fdb_vlan(b.lan, CLIENT_MAC, 1, b.mtu)
        }
    };
    let access = bridge(&[(1, true), (20, false)]);
    let trunk = bridge(&[(1, false), (20, false)]);
    c.push(encap_forward(
        "vlan-filtering bridge: untagged in (PVID), out to the WAN (v4 snat original)",
        (b.mtu, MTU_SLOT, b.lan),
        &o4,
        (router4, 61_000),
        (server4, 443),
        false,
        to_wan,
        access,
        same,
        same,
        b,
    ));
    c.push(encap_forward(
        "vlan-filtering bridge: tagged in (VLAN 1), untagged out to the WAN (v4 snat original)",
        (b.mtu, MTU_SLOT, b.lan),
        &o4,
        (router4, 61_000),
        (server4, 443),
        false,
        to_wan,
        access,
        |f| with_vlan_tag(f, 1),
        same,
        b,
    ));
    c.push(encap_forward(
        "vlan-filtering bridge: in from the WAN, untagged out of the port (v4 reply)",
        (b.wan, WAN_SLOT, b.wan),
        &r4,
        (server4, 443),
        (client4, 40_000),
        true,
        to_lan,
        access,
        same,
        same,
        b,
    ));
    c.push(encap_forward(
        "vlan-filtering bridge: in from the WAN, tagged out of a trunk port (v6 udp reply)",
        (b.wan, WAN_SLOT, b.wan),
        &r6,
        (server6, 443),
        (client6, 40_000),
        true,
        to_lan,
        trunk,
        same,
        |f| with_vlan_tag(f, 1),
        b,
    ));
    let frame = o4.frame();
    let refused: [(&str, Vec<u8>, Setup, Reason); 8] = [
        (
            "vlan-filtering bridge: untagged in on a port without a PVID",
            frame.clone(),
            orig4()
                .with_iface_flags(b.lan, IFACE_F_BRIDGE)
                .with_bridge_port(b.mtu, b.lan)
                .with_iface_mac(b.mtu, LAN_MAC)
                .with_vlan_filtering(b.lan, 1, &[(1, true)])
                .with_vlan_filtering(b.mtu, 0, &[(1, false)])
                .with_fdb_vlan(b.lan, CLIENT_MAC, 1, b.mtu),
            Reason::PassBridgeVlanFiltered,
        ),
        (
            "vlan-filtering bridge: a VLAN the port is not in",
            with_vlan_tag(&frame, 30),
            access(orig4()),
            Reason::PassBridgeVlanFiltered,
        ),
        (
            "vlan-filtering bridge: a VLAN the port is in and the bridge is not",
            with_vlan_tag(&frame, 20),
            access(orig4()).with_fdb_vlan(b.lan, CLIENT_MAC, 20, b.mtu),
            Reason::PassBridgeVlanFiltered,
        ),
        (
            "vlan-filtering bridge: a tag of the other protocol (802.1ad)",
            with_tag(&frame, 0x88a8, 1),
            access(orig4()),
            Reason::PassVlanUnknown,
        ),
        (
            "vlan-filtering bridge: the source is in the FDB in another VLAN",
            frame.clone(),
            orig4()
                .with_iface_flags(b.lan, IFACE_F_BRIDGE)
                .with_bridge_port(b.mtu, b.lan)
                .with_iface_mac(b.mtu, LAN_MAC)
                .with_vlan_filtering(b.lan, 1, &[(1, true)])
                .with_vlan_filtering(b.mtu, 1, &[(1, true), (20, false)])
                .with_fdb_vlan(b.lan, CLIENT_MAC, 20, b.mtu),
            Reason::PassBridgeLearning,
        ),
        (
            "vlan-filtering bridge: priority-tagged in",
            with_tag(&frame, 0x8100, 0xa000),
            access(orig4()),
            Reason::PassVlanPriorityTagged,
        ),
        (
            "vlan-filtering bridge: Q-in-Q in",
            with_vlan_tag(&with_vlan_tag(&frame, 5), 1),
            access(orig4()),
            Reason::PassVlanQinQ,
        ),
        (
            "vlan-filtering bridge managed only for its VLAN devices: untagged in",
            frame.clone(),
            access(orig4()).with_iface_flags(b.mtu, IFACE_F_VLAN_PARENT),
            Reason::PassVlanParentUntagged,
        ),
    ];
    for (name, frame, setup, reason) in refused {
        c.push(pass(b, name, b.mtu, frame, setup, reason));
    }
    // Out of the bridge: the reply arrives on the WAN, the FIB says lan0.
    let reply4 = || {
        Setup::managed(
            b,
            vec![flow(b.wan, &r4, (server4, 443), (client4, 40_000), true)],
        )
    };
    let base = || {
        reply4()
            .with_iface_flags(b.lan, IFACE_F_BRIDGE | IFACE_F_NO_XDP_XMIT)
            .with_bridge_port(b.mtu, b.lan)
            .with_iface_mac(b.mtu, LAN_MAC)
    };
    // (what; the bridge's PVID and VLANs; the port's; the VLAN of the FDB entry; the reason)
    type Row = (
        &'static str,
        u16,
        &'static [(u16, bool)],
        u16,
        &'static [(u16, bool)],
        u16,
        Reason,
    );
    let out_refused: [Row; 4] = [
        (
            "the FDB has the host in another VLAN only",
            1,
            &[(1, true)],
            1,
            &[(1, true), (20, false)],
            20,
            Reason::PassBridgeFdbMiss,
        ),
        (
            "the FDB's port is not in the VLAN",
            1,
            &[(1, true)],
            20,
            &[(20, true)],
            1,
            Reason::PassBridgeVlanFiltered,
        ),
        (
            "the bridge has no PVID",
            0,
            &[(1, true)],
            1,
            &[(1, true)],
            1,
            Reason::PassBridgeVlanFiltered,
        ),
        (
            "the bridge is not in its PVID's VLAN",
            1,
            &[(20, true)],
            1,
            &[(1, true)],
            1,
            Reason::PassBridgeVlanFiltered,
        ),
    ];
    for (what, bpvid, bvlans, ppvid, pvlans, fdb_vid, reason) in out_refused {
        let setup = base()
            .with_vlan_filtering(b.lan, bpvid, bvlans)
            .with_vlan_filtering(b.mtu, ppvid, pvlans)
            .with_fdb_vlan(b.lan, CLIENT_MAC, fdb_vid, b.mtu);
        let name = format!("vlan-filtering bridge egress: {what}");
        c.push(pass(b, &name, b.wan, r4.frame(), setup, reason));
    }
    c.push(pass(
        b,
        "vlan-filtering bridge egress: managed only for its VLAN devices",
        b.wan,
        r4.frame(),
        base()
            .with_iface_flags(b.lan, IFACE_F_VLAN_PARENT)
            .with_vlan_filtering(b.lan, 1, &[(1, true)])
            .with_vlan_filtering(b.mtu, 1, &[(1, true)])
            .with_fdb_vlan(b.lan, CLIENT_MAC, 1, b.mtu),
        Reason::PassEgressNotManaged,
    ));

    // The LAN is VLAN device 20 (lan0) over the bridge sub0, which is in VLAN 20 tagged and
    // managed only for its VLAN devices; the port mtu0 carries VLAN 20 tagged (`trunk`) or
    // untagged as its PVID (`access`).
    let over = |pvid: u16, untagged: bool, filtering: bool| {
        move |s: Setup| {
            let s = s
                .with_iface(b.sub, SUB_SLOT, LAN_MAC)
                .with_iface_flags(
                    b.sub,
                    IFACE_F_BRIDGE | IFACE_F_NO_XDP_XMIT | IFACE_F_VLAN_PARENT,
                )
                .with_vlan(b.lan, b.sub, 20, 0x8100, false)
                .with_bridge_port(b.mtu, b.sub)
                .with_iface_mac(b.mtu, LAN_MAC)
                .with_iface_flags(b.mtu, IFACE_F_VLAN_PARENT);
            if filtering {
                s.with_vlan_filtering(b.sub, 0, &[(20, false)])
                    .with_vlan_filtering(b.mtu, pvid, &[(20, untagged)])
                    .with_fdb_vlan(b.sub, CLIENT_MAC, 20, b.mtu)
            } else {
                s.with_fdb(b.sub, CLIENT_MAC, b.mtu)
            }
        }
    };
    for (what, setup, wire) in [
        ("a trunk port", over(0, false, true), true),
        ("an access port (PVID 20)", over(20, true, true), false),
        (
            "a bridge without VLAN filtering",
            over(0, false, false),
            true,
        ),
    ] {
        let on_wire = move |f: &[u8]| {
            if wire {
                with_vlan_tag(f, 20)
            } else {
                f.to_vec()
            }
        };
        c.push(encap_forward(
            &format!(
                "vlan over a bridge, {what}: in from the port, out to the WAN (v4 snat original)"
            ),
            (b.mtu, LAN_SLOT, b.lan),
            &o4,
            (router4, 61_000),
            (server4, 443),
            false,
            to_wan,
            setup,
            on_wire,
            same,
            b,
        ));
        c.push(encap_forward(
            &format!("vlan over a bridge, {what}: in from the WAN, out of the port (v4 reply)"),
            (b.wan, WAN_SLOT, b.wan),
            &r4,
            (server4, 443),
            (client4, 40_000),
            true,
            to_lan,
            setup,
            same,
            on_wire,
            b,
        ));
    }
    let trunk20 = over(0, false, true);
    c.push(pass(
        b,
        "vlan over a bridge: a VLAN of the bridge with no managed VLAN device",
        b.mtu,
        with_vlan_tag(&frame, 21),
        trunk20(orig4())
            .with_vlan_filtering(b.sub, 0, &[(21, false)])
            .with_vlan_filtering(b.mtu, 0, &[(21, false)])
            .with_fdb_vlan(b.sub, CLIENT_MAC, 21, b.mtu),
        Reason::PassVlanUnknown,
    ));
    c.push(pass(
        b,
        "vlan over a bridge managed only for it: untagged in, for the bridge itself",
        b.mtu,
        frame.clone(),
        over(0, false, false)(orig4()),
        Reason::PassVlanParentUntagged,
    ));
    c.push(pass(
        b,
        "vlan over a bridge: tagged out, the port not in the VLAN",
        b.wan,
        r4.frame(),
        reply4()
            .with_iface(b.sub, SUB_SLOT, LAN_MAC)
            .with_iface_flags(b.sub, IFACE_F_BRIDGE | IFACE_F_VLAN_PARENT)
            .with_vlan(b.lan, b.sub, 20, 0x8100, false)
            .with_bridge_port(b.mtu, b.sub)
            .with_vlan_filtering(b.sub, 0, &[(20, false)])
            .with_vlan_filtering(b.mtu, 0, &[(21, false)])
            .with_fdb_vlan(b.sub, CLIENT_MAC, 20, b.mtu),
        Reason::PassBridgeVlanFiltered,
    ));
}

/// A forwarding case of a flow that routes `pkt` without NAT, with the input and expected
/// output frames changed by `input` and `output`.
fn routed_forward(
    b: &Bed,
    name: &str,
    pkt: &Spec,
    input: impl Fn(&[u8]) -> Vec<u8>,
    output: impl Fn(&[u8]) -> Vec<u8>,
) -> Case {
    let mut case = forward(
        b,
        name,
        b.lan,
        pkt,
        (pkt.src, pkt.sport),
        (pkt.dst, pkt.dport),
        false,
        (WAN_MAC, GW_MAC),
    );
    case.frame = input(&case.frame);
    if let Expect::Redirect(_, out) = &mut case.expect {
        *out = output(out);
    }
    case
}

/// What the kernel checks before it forwards (issue 9): each case is a packet of an offloaded
/// flow that the kernel would drop or judge INVALID, so the fast path must pass it; and the
/// neighbours of each check that the kernel does forward.
fn kernel_checks(b: &Bed, c: &mut Vec<Case>) {
    let tcp = Transport::Tcp(ACK | PSH);
    let (client4, client6) = (v4("192.0.2.10"), v6("2001:db8:1::10"));
    let (server4, server6) = (v4("198.18.0.7"), v6("2001:db8:ff::7"));
    let p4 = lan_pkt(client4, server4, tcp, 100);
    let u4 = lan_pkt(client4, server4, Transport::Udp, 100);
    let p6 = lan_pkt(client6, server6, tcp, 100);
    let u6 = lan_pkt(client6, server6, Transport::Udp, 100);
    let with = |p: &Spec| Setup::managed(b, vec![routed(b.lan, p, false)]);
    let same = |f: &[u8]| f.to_vec();

    // 1. IPv4 header checksum (ip_rcv_core).
    c.push(pass(
        b,
        "ipv4 bad header checksum",
        b.lan,
        with_bad_ipv4_checksum(&p4.frame()),
        with(&p4),
        Reason::PassIpv4Checksum,
    ));

    // 2. Only frames addressed to the ingress interface (PACKET_HOST) are forwarded.
    for (name, mac, p) in [
        ("dst mac broadcast", [0xff; 6], &p4),
        ("dst mac ipv4 multicast", [0x01, 0x00, 0x5e, 0, 0, 1], &p4),
        ("dst mac zero", [0; 6], &p4),
        ("dst mac another host", [0x02, 0, 0, 0, 0x01, 0x99], &p4),
        ("dst mac the router's other interface", WAN_MAC, &p4),
        ("ipv6 dst mac multicast", [0x33, 0x33, 0, 0, 0, 1], &p6),
        (
            "ipv6 dst mac another host",
            [0x02, 0, 0, 0, 0x01, 0x99],
            &p6,
        ),
    ] {
        c.push(pass(
            b,
            name,
            b.lan,
            with_eth_dst(&p.frame(), mac),
            with(p),
            Reason::PassDstMacNotOurs,
        ));
    }
    c.push(routed_forward(
        b,
        "frame to the interface's changed MAC",
        &p4,
        |f| with_eth_dst(f, [0x02, 0, 0, 0, 0x01, 0x42]),
        same,
    ));
    if let Some(last) = c.last_mut() {
        last.setup = last
            .setup
            .clone()
            .with_iface_mac(b.lan, [0x02, 0, 0, 0, 0x01, 0x42]);
    }

    // 3. Bytes after the IP datagram are trimmed, not forwarded.
    let small = lan_pkt(client4, server4, Transport::Tcp(ACK), 0);
    c.push(routed_forward(
        b,
        "v4 tcp ack padded to 60 bytes",
        &small,
        |f| with_trailer(f, &[0; 6]),
        same,
    ));
    c.push(routed_forward(
        b,
        "v4 udp with trailing garbage",
        &u4,
        |f| with_trailer(f, &[0xa5; 100]),
        same,
    ));
    c.push(routed_forward(
        b,
        "v6 tcp with trailing garbage",
        &p6,
        |f| with_trailer(f, &[0xa5; 33]),
        same,
    ));
    {
        // The datagram fits the 1280-byte egress MTU, the frame with its trailer would not.
        let mut p = lan_pkt(client4, v4("203.0.113.130"), tcp, 1280 - 40);
        p.dport = 8080;
        let mut case = forward(
            b,
            "v4 at egress mtu with trailer beyond it",
            b.lan,
            &p,
            (p.src, p.sport),
            (p.dst, p.dport),
            false,
            (MTU_MAC, MTU_PEER_MAC),
        );
        case.frame = with_trailer(&case.frame, &[0x5a; 40]);
        c.push(case);
    }

    // 4. What conntrack marks INVALID: checksums (nf_conntrack_checksum = 1), TCP header length
    // and flags, UDP length.
    for (name, p) in [
        ("v4 tcp bad checksum", &p4),
        ("v4 udp bad checksum", &u4),
        ("v6 tcp bad checksum", &p6),
        ("v6 udp bad checksum", &u6),
    ] {
        c.push(pass(
            b,
            name,
            b.lan,
            with_bad_l4_checksum(&p.frame()),
            with(p),
            Reason::PassL4Checksum,
        ));
    }
    for (name, len) in [("odd", 101), ("one byte", 1), ("1400 bytes", 1400)] {
        // Every length class of the checksum loops verifies a correct segment.
        let p = lan_pkt(client4, server4, Transport::Udp, len);
        c.push(routed_forward(
            b,
            &format!("v4 udp {name} payload verified"),
            &p,
            same,
            same,
        ));
        let p = lan_pkt(client6, server6, tcp, len + 3);
        c.push(routed_forward(
            b,
            &format!("v6 tcp {name} + 3 payload verified"),
            &p,
            same,
            same,
        ));
    }
    {
        // With nf_conntrack_checksum = 0 conntrack forwards it, and so does the fast path.
        let mut case = routed_forward(
            b,
            "v4 tcp bad checksum, checksums not verified",
            &p4,
            with_bad_l4_checksum,
            with_bad_l4_checksum,
        );
        case.setup = case.setup.without_l4_checksum();
        c.push(case);
    }
    c.push(pass(
        b,
        "tcp data offset 4",
        b.lan,
        with_tcp_doff(&p4.frame(), 4),
        with(&p4),
        Reason::PassMalformed,
    ));
    c.push(pass(
        b,
        "tcp data offset past the segment",
        b.lan,
        with_tcp_doff(&small.frame(), 6),
        with(&small),
        Reason::PassMalformed,
    ));
    c.push(pass(
        b,
        "ipv6 tcp data offset past the segment",
        b.lan,
        with_tcp_doff(&lan_pkt(client6, server6, tcp, 0).frame(), 15),
        with(&lan_pkt(client6, server6, tcp, 0)),
        Reason::PassMalformed,
    ));
    for (name, flags) in [("tcp psh without ack", PSH), ("tcp no flags", 0)] {
        c.push(pass(
            b,
            name,
            b.lan,
            with_tcp_flags(&p4.frame(), flags),
            with(&p4),
            Reason::PassTcpNoAck,
        ));
    }
    c.push(pass(
        b,
        "ipv6 tcp urg without ack",
        b.lan,
        with_tcp_flags(&p6.frame(), 0x20),
        with(&p6),
        Reason::PassTcpNoAck,
    ));
    c.push(routed_forward(
        b,
        "tcp ack urg ece cwr",
        &p4,
        |f| with_tcp_flags(f, ACK | 0x20 | 0x40 | 0x80),
        |f| with_tcp_flags(f, ACK | 0x20 | 0x40 | 0x80),
    ));
    let ulen = |p: &Spec| (p.payload_len + 8) as u16;
    for (name, p, len) in [
        ("udp length shorter than payload", &u4, ulen(&u4) - 1),
        ("udp length longer than payload", &u4, ulen(&u4) + 1),
        ("ipv6 udp length shorter than payload", &u6, ulen(&u6) - 2),
    ] {
        c.push(pass(
            b,
            name,
            b.lan,
            with_udp_len(&p.frame(), len),
            with(p),
            Reason::PassMalformed,
        ));
    }
    // A segment longer than the fast path verifies (jumbo frames).
    let jumbo = lan_pkt(client4, server4, Transport::Udp, 3064);
    c.push(pass(
        b,
        "segment longer than the checksum loops",
        b.lan,
        jumbo.frame(),
        with(&jumbo),
        Reason::PassL4ChecksumTooLong,
    ));
    let fits = lan_pkt(client4, server4, Transport::Udp, 3063);
    c.push(routed_forward(
        b,
        "longest verified segment",
        &fits,
        same,
        same,
    ));

    // 5. A checksum field of 0xffff (a valid zero) leaves as it came, as the kernel forwards it.
    c.push(routed_forward(
        b,
        "v6 tcp checksum 0xffff kept",
        &p6,
        with_l4_checksum_ffff,
        with_l4_checksum_ffff,
    ));
    c.push(routed_forward(
        b,
        "v4 tcp checksum 0xffff kept",
        &p4,
        with_l4_checksum_ffff,
        with_l4_checksum_ffff,
    ));
}

fn hex(b: &[u8]) -> String {
    b.chunks(16)
        .map(|c| {
            c.iter()
                .map(|x| format!("{x:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n      ")
}

/// Runs one case; returns what went wrong, if anything.
fn check_case(prog: &Xdp, maps: &mut Maps, case: &Case) -> Result<(), String> {
    maps.apply(&case.setup);
    let before = maps.stats();
    let flows_before: Vec<_> = case.setup.flows.iter().map(|f| maps.counters(f)).collect();
    let t0 = coarse_monotonic_ns();
    let (verdict, out) = run(prog, &case.frame, case.ingress);
    let t1 = coarse_monotonic_ns();

    let mut errs = Vec::new();
    match &case.expect {
        Expect::Pass(_) => {
            if verdict != XDP_PASS {
                errs.push(format!("verdict {verdict}, want XDP_PASS"));
            }
            if out != case.frame {
                errs.push(format!(
                    "passed frame was modified:\n  in  {}\n  out {}",
                    hex(&case.frame),
                    hex(&out)
                ));
            }
        }
        Expect::Redirect(_, want) => {
            if verdict != XDP_REDIRECT {
                errs.push(format!("verdict {verdict}, want XDP_REDIRECT"));
            }
            if &out != want {
                errs.push(format!(
                    "output frame differs:\n  got  {}\n  want {}",
                    hex(&out),
                    hex(want)
                ));
            }
            // A frame that came in with a wrong checksum (checksums not verified) leaves with it.
            if verify_checksums(&case.frame).is_ok()
                && let Err(e) = verify_checksums(&out)
            {
                errs.push(format!("output checksums: {e}"));
            }
        }
    }

    // STATS: exactly one entry moved, by one packet of the length sent (forwarded: trimmed to
    // the IP datagram) or received (passed).
    let sent = match &case.expect {
        Expect::Pass(_) => case.frame.len(),
        Expect::Redirect(_, want) => want.len(),
    } as u64;
    let after = maps.stats();
    let want_idx = stats_index(case.slot, case.reason()) as usize;
    for (i, (a, b)) in before.iter().zip(&after).enumerate() {
        let delta = (b.packets - a.packets, b.bytes - a.bytes);
        let want = if i == want_idx { (1, sent) } else { (0, 0) };
        if delta != want {
            let (slot, reason) = (
                i as u32 / Reason::COUNT,
                Reason::from_u32(i as u32 % Reason::COUNT),
            );
            errs.push(format!(
                "STATS[slot {slot}, {reason:?}] moved by {delta:?}, want {want:?}"
            ));
        }
    }

    // Flow counters: only the forwarding flow counts, with a fresh timestamp.
    for (n, (f, old)) in case.setup.flows.iter().zip(&flows_before).enumerate() {
        let now = maps.counters(f);
        let forwarded = n == 0 && matches!(case.expect, Expect::Redirect(..));
        if forwarded {
            if now.packets != old.packets + 1 || now.bytes != old.bytes + sent {
                errs.push(format!(
                    "flow counters {now:?}, want +1 packet +{sent} bytes over {old:?}"
                ));
            }
            if !(t0..=t1).contains(&now.last_seen_ns) {
                errs.push(format!(
                    "flow last_seen_ns {} not within the run [{t0}, {t1}]",
                    now.last_seen_ns
                ));
            }
        } else if now != *old {
            errs.push(format!(
                "flow {n} counters changed on a passed packet: {old:?} -> {now:?}"
            ));
        }
    }

    // A second packet of a forwarded flow advances the counters again.
    if let (Expect::Redirect(_, want), Some(f)) = (&case.expect, case.setup.flows.first()) {
        let first = maps.counters(f);
        let (verdict, out) = run(prog, &case.frame, case.ingress);
        let second = maps.counters(f);
        if verdict != XDP_REDIRECT || &out != want {
            errs.push("second run differs from the first".to_owned());
        }
        if second.packets != first.packets + 1
            || second.bytes != first.bytes + sent
            || second.last_seen_ns < first.last_seen_ns
        {
            errs.push(format!(
                "counters did not advance on the second packet: {first:?} -> {second:?}"
            ));
        }
    }

    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("\n    "))
    }
}

#[test]
fn fixture_table() {
    if !require_root("prog_run::fixture_table") {
        return;
    }
    let router = Netns::new("dp");
    let hosts = Netns::new("dph");
    build_topology(&router, &hosts);
    let results = router.run(|| {
        let bed = Bed::here();
        let (ebpf, mut maps) = load();
        let prog: &Xdp = ebpf
            .program(PROG_NAME)
            .expect("program present")
            .try_into()
            .expect("XDP program");
        cases(&bed)
            .iter()
            .map(|case| {
                (
                    case.name.clone(),
                    case.reason(),
                    check_case(prog, &mut maps, case),
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

/// `GLOBAL_FIB_FLAGS`: by default the FIB lookup honours policy rules (`ip rule`); loaded with
/// `FIB_LOOKUP_DIRECT` it looks up the main table only, as documented. The client 192.0.2.10
/// is policy-routed (table 100) to a gateway without neighbour entry: the kernel routes a
/// forwarded packet before SNAT, so the rule matches the received source, not the translated
/// 198.51.100.77.
#[test]
fn fib_flags_direct_skips_policy_rules() {
    if !require_root("prog_run::fib_flags_direct_skips_policy_rules") {
        return;
    }
    let router = Netns::new("dpr");
    let hosts = Netns::new("dprh");
    build_topology(&router, &hosts);
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
        [(0, full), (FIB_LOOKUP_DIRECT, direct)]
            .iter()
            .map(|(flags, case)| {
                let (ebpf, mut maps) = load_object(EBPF_OBJECT, *flags);
                let prog: &Xdp = ebpf
                    .program(PROG_NAME)
                    .expect("program present")
                    .try_into()
                    .expect("XDP program");
                (case.name.clone(), check_case(prog, &mut maps, case))
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
    if !require_root("prog_run::ccp_seen_on_a_session_stops_its_fast_path") {
        return;
    }
    let router = Netns::new("dpc");
    let hosts = Netns::new("dpch");
    build_topology(&router, &hosts);
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

/// Prints one line per named check and fails with the names of those that failed.
fn assert_all_ok(results: &[(String, Result<(), String>)]) {
    let failed: Vec<_> = results
        .iter()
        .filter_map(|(name, res)| match res {
            Ok(()) => {
                println!("ok   {name}");
                None
            }
            Err(e) => {
                println!("FAIL {name}\n    {e}");
                Some(name)
            }
        })
        .collect();
    assert!(failed.is_empty(), "failed: {failed:?}");
}

/// The table names every reason at least once (checked without running anything).
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
        .filter(|r| !covered.contains(&(**r as u32)))
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
    if !require_root("prog_run::fib_cache_is_used_only_while_valid") {
        return;
    }
    let router = Netns::new("dpc");
    let hosts = Netns::new("dpch");
    build_topology(&router, &hosts);
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
