//! 802.1Q / 802.1ad VLAN devices: tagged and untagged in and out, router on a stick, VLANs on
//! bridge ports, the tags passed to the kernel, and egress through a VLAN device's parent.

use xdp_router_common::{IFACE_F_INGRESS_HOOK, Reason};
use xdp_router_tests::{
    fixture_net::{
        Bed, CLIENT_MAC, GW_MAC, LAN_MAC, LAN_SLOT, Setup, WAN_MAC, WAN_SLOT, flow, lan_pkt,
        routed, v4, v6, wan_pkt,
    },
    packet::{
        Transport,
        tcp_flags::{ACK, PSH},
        with_tag, with_vlan_tag,
    },
};

use crate::case::{Case, encap_forward, lower_egress_cases, pass};

/// 802.1Q / 802.1ad VLANs. `mtu0` stands in for the VLAN parent (the "trunk": this kernel
/// has no 8021q module, and the datapath only needs ifindexes, routes and neighbours): the
/// WAN (`wan0`) is VLAN 7 on it and, for tagged-to-tagged, the LAN (`lan0`) VLAN 10. Every
/// forwarded frame's bytes are compared whole (MACs, tag, TTL, NAT, checksums verified).
pub fn cases(b: &Bed, c: &mut Vec<Case>) {
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
