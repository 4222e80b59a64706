//! The FIB's answer and the egress interface: blackhole, unreachable and local routes, no
//! neighbour, fragmentation needed, and egress interfaces that cannot take a redirect (not
//! managed, hooks, generic XDP, shaped, no XDP transmit).

use xdp_router_common::{
    IFACE_F_EGRESS_HOOK, IFACE_F_GENERIC_XDP, IFACE_F_INGRESS_HOOK, IFACE_F_NO_XDP_XMIT,
    IFACE_F_SHAPED, Reason,
};
use xdp_router_tests::{
    fixture_net::{Bed, Setup, flow, lan_pkt, routed, v4, v6},
    packet::{
        Transport,
        tcp_flags::{ACK, PSH},
    },
};

use crate::case::{Case, good_packets, pass};

/// FIB answers and egress checks.
pub fn cases(b: &Bed, c: &mut Vec<Case>) {
    let tcp = Transport::Tcp(ACK | PSH);
    let udp = Transport::Udp;
    let (client4, client6) = (v4("192.0.2.10"), v6("2001:db8:1::10"));
    let (good4, good6) = good_packets();
    let m4 = || Setup::managed(b, vec![routed(b.lan, &good4, false)]);
    let m6 = || Setup::managed(b, vec![routed(b.lan, &good6, false)]);
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
}
