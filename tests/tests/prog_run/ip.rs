//! IPv4 and IPv6 forwarding, with and without NAT: SNAT originals and reverse-NAT replies
//! over TCP and UDP, a marked flow, a zero UDP checksum and a packet exactly at the egress MTU.

use xdp_router_tests::{
    fixture_net::{
        ARMED, Bed, CLIENT_MAC, GW_MAC, LAN_MAC, MTU_MAC, MTU_PEER_MAC, WAN_MAC, lan_pkt, v4, v6,
        wan_pkt,
    },
    packet::{
        Transport,
        tcp_flags::{ACK, PSH},
        with_zero_udp_checksum,
    },
};

use crate::case::{Case, Expect, forward};

/// Forwarded packets, each with its flow.
pub fn cases(b: &Bed, c: &mut Vec<Case>) {
    let tcp = Transport::Tcp(ACK | PSH);
    let udp = Transport::Udp;
    let (client4, client6) = (v4("192.0.2.10"), v6("2001:db8:1::10"));
    let (server4, server6) = (v4("198.18.0.7"), v6("2001:db8:ff::7"));
    let (router4, router6) = (v4("198.51.100.1"), v6("2001:db8:2::1"));
    let to_wan = (WAN_MAC, GW_MAC);
    let to_lan = (LAN_MAC, CLIENT_MAC);
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
}
