//! VLAN-filtering bridges and VLAN devices over bridges (the OpenWrt DSA layout): tagged and
//! untagged ports, PVIDs, and the frames the bridge's VLAN filter refuses.

use xdp_router_common::{IFACE_F_BRIDGE, IFACE_F_NO_XDP_XMIT, IFACE_F_VLAN_PARENT, Reason};
use xdp_router_tests::{
    fixture_net::{
        Bed, CLIENT_MAC, GW_MAC, LAN_MAC, LAN_SLOT, MTU_SLOT, Setup, WAN_MAC, WAN_SLOT, flow,
        lan_pkt, v4, v6, wan_pkt,
    },
    packet::{
        Transport,
        tcp_flags::{ACK, PSH},
        with_tag, with_vlan_tag,
    },
};

use crate::case::{Case, encap_forward, pass};

/// VLAN-filtering bridges and VLAN devices over bridges. `mtu0` stands in for the bridge's
/// port (this kernel has no bridge VLAN filtering; the datapath only needs ifindexes, routes
/// and neighbours). Either the LAN (`lan0`) is the bridge itself, whose own entry for VLAN 1
/// is untagged (its IP layer sees VLAN 1 on it), or the LAN is VLAN device 20 over a bridge
/// `sub0` (`br-lan.20`, the OpenWrt DSA layout). Every forwarded frame's bytes are compared.
pub fn cases(b: &Bed, c: &mut Vec<Case>) {
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
