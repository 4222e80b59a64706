//! What the kernel checks before it forwards (issue 9): packets of an offloaded flow that the
//! kernel would drop or judge INVALID, which the fast path must pass, and their neighbours that
//! the kernel forwards.

use xdp_router_common::Reason;
use xdp_router_tests::{
    fixture_net::{Bed, MTU_MAC, MTU_PEER_MAC, Setup, WAN_MAC, lan_pkt, routed, v4, v6},
    packet::{
        Spec, Transport,
        tcp_flags::{ACK, PSH},
        with_bad_ipv4_checksum, with_bad_l4_checksum, with_eth_dst, with_l4_checksum_ffff,
        with_tcp_doff, with_tcp_flags, with_trailer, with_udp_len,
    },
};

use crate::case::{Case, forward, pass, routed_forward};

/// What the kernel checks before it forwards (issue 9): each case is a packet of an offloaded
/// flow that the kernel would drop or judge INVALID, so the fast path must pass it; and the
/// neighbours of each check that the kernel does forward.
pub fn cases(b: &Bed, c: &mut Vec<Case>) {
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
    // A frame longer than one buffer holds: BPF_PROG_RUN puts what is beyond a page's worth
    // into fragments, as a driver does on a jumbo-MTU port (tests/mtu.rs runs it on one). To
    // the kernel, unread.
    let multi = lan_pkt(client4, server4, Transport::Udp, 5000);
    c.push(pass(
        b,
        "frame in several buffers (jumbo MTU)",
        b.lan,
        multi.frame(),
        with(&multi),
        Reason::PassMultiBuffer,
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
