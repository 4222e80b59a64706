//! PPPoE sessions: decapsulated in, encapsulated out (also over a VLAN), the session frames
//! passed to the kernel, and egress through the PPP device's lower device.

use xdp_router_common::{IFACE_F_INGRESS_HOOK, IFACE_F_NO_XDP_XMIT, IFACE_F_PPP_CCP, Reason};
use xdp_router_tests::{
    fixture_net::{
        Bed, CLIENT_MAC, GW_MAC, LAN_MAC, LAN_SLOT, MTU_MAC, MTU_PEER_MAC, Setup, WAN_MAC,
        WAN_SLOT, flow, lan_pkt, routed, v4, v6, wan_pkt,
    },
    packet::{
        Spec, Transport,
        tcp_flags::{ACK, PSH},
        with_eth_dst, with_pppoe, with_trailer, with_vlan_tag,
    },
};

use crate::case::{Case, encap_forward, lower_egress_cases, pass};

/// PPPoE WAN. `wan0` stands in for the PPP device (`ppp0`: this kernel has no pppoe module,
/// and the datapath only needs its ifindex and routes), `mtu0` for the Ethernet port the
/// session runs over, `MTU_PEER_MAC` for the access concentrator; `sub0` stands in for a VLAN
/// device between them (PPPoE over VLAN 7). The session ID's two bytes differ, so a byte-order
/// mistake shows. Every forwarded frame's bytes are compared whole.
pub fn cases(b: &Bed, c: &mut Vec<Case>) {
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
