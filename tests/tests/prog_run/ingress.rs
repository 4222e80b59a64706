//! Packets refused on arrival, with the flow that would otherwise forward them present: fast
//! path off, held for a rule that must see every packet, not IP, malformed headers, IPv4
//! options and fragments, IPv6 extension headers, TTL 1, not TCP or UDP, and TCP control
//! segments.

use std::net::IpAddr;

use xdp_router_common::Reason;
use xdp_router_tests::{
    fixture_net::{Bed, CLIENT_MAC, LAN_MAC, Setup, routed, v6},
    packet::{
        ETH_LEN, Transport, arp_request, fix_ipv4_checksum, icmpv4_echo, icmpv6_echo,
        tcp_flags::{ACK, FIN, RST, SYN},
        with_ipv4_frag, with_ipv4_options, with_ipv6_ext, with_vlan_tag,
    },
};

use crate::case::{Case, good_packets, pass};

/// Refused on arrival.
pub fn cases(b: &Bed, c: &mut Vec<Case>) {
    let (client6, server6) = (v6("2001:db8:1::10"), v6("2001:db8:ff::7"));
    let (good4, good6) = good_packets();
    let m4 = || Setup::managed(b, vec![routed(b.lan, &good4, false)]);
    let m6 = || Setup::managed(b, vec![routed(b.lan, &good6, false)]);
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
    // A rule that must see every packet (hashlimit, quota, NFQUEUE, …) holds everything in
    // the kernel: the flow that would forward it is there and armed, IPv4 and IPv6 alike.
    for (name, pkt, setup) in [
        ("held for a per-packet rule, ipv4", &good4, m4()),
        ("held for a per-packet rule, ipv6", &good6, m6()),
    ] {
        c.push(pass(
            b,
            name,
            b.lan,
            pkt.frame(),
            Setup {
                hold_all: true,
                ..setup
            },
            Reason::PassPerPacketRule,
        ));
    }

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
}
