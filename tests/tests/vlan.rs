//! 802.1Q VLAN topologies: the router's WAN is VLAN 7 on its Ethernet port (as many ISPs deliver
//! it), and in one test the LAN is VLAN 10 on its port too. This host kernel has no 8021q
//! module, so these tests are `#[ignore]`d here and `cargo xtask test` runs them in a guest
//! that boots Debian's kernel (see xtask/src/guest.rs); by hand: `cargo xtask test
//! --guest-only -- vlan`.
//!
//! What they hold the daemon to: with the VLAN device in the config (`name = "eth0.7"`, as the
//! kernel routes it) the fast path carries established flows both ways, popping and pushing
//! the tag on the parent (XDP counters equal to the datagrams sent, netfilter's ESTABLISHED
//! rule not rising, every byte intact), and stops doing so when switched off (the negative
//! control); with only the parent in the config, tagged frames stay with the kernel.

use std::net::IpAddr;

use xdp_router_tests::{
    netns::Netns,
    testbed::{
        HOST_IF, LAN_HOST_V4, LAN_HOST_V6, LAN_IF, Plan, ROUTER_LAN_V4, ROUTER_LAN_V6,
        ROUTER_WAN_V4, ROUTER_WAN_V6, Testbed, Transfer, UdpEcho, WAN_HOST_V4, WAN_HOST_V6, WAN_IF,
        any_v4, any_v6, assert_encapsulated_wan_left_to_kernel, assert_intact, measure_udp,
        offload_udp_family, ready, route_wan_through, udp_and_tcp_are_intact, udp_socket,
        wan_lan_interfaces, wan_v4, wan_v6,
    },
};

/// The WAN's VLAN id.
const VID: u16 = 7;
/// The LAN's VLAN id (when the LAN is a VLAN too).
const LAN_VID: u16 = 10;

/// `<dev>.7`.
fn vlan_of(dev: &str) -> String {
    format!("{dev}.{VID}")
}

/// Moves `ns`'s addresses from `dev` to a new VLAN device `dev.<vid>` on it. The tag is inserted
/// in software (`txvlan off` on `dev`), so frames carry it in their bytes as on a wire: a veth
/// would otherwise pass it beside the frame (skb metadata), where XDP does not see it.
fn move_onto_vlan(ns: &Netns, dev: &str, vid: u16, v4: IpAddr, v6: IpAddr) {
    let vlan = format!("{dev}.{vid}");
    ns.sh(&format!(
        "ip addr flush dev {dev} scope global
         ip link add link {dev} name {vlan} type vlan id {vid}
         ip addr add {v4}/24 dev {vlan}
         ip addr add {v6}/64 dev {vlan} nodad
         ip link set {vlan} up
         ethtool -K {vlan} tx off rx off gro off gso off tso off >/dev/null 2>&1 || true
         ethtool -K {dev} txvlan off >/dev/null"
    ));
}

/// The test bed with the WAN link (router eth0 ⇄ WAN host eth0) carrying VLAN 7 on both
/// ends, the addresses, routes, NAT and FORWARD rules moved onto eth0.7; with `lan_vlan` the
/// LAN link carries VLAN 10 the same way (router eth1.10 ⇄ LAN host eth0.10).
fn vlan_testbed(tag: &str, lan_vlan: bool) -> Testbed {
    let tb = Testbed::new(tag);
    move_onto_vlan(
        &tb.router,
        WAN_IF,
        VID,
        ROUTER_WAN_V4.into(),
        ROUTER_WAN_V6.into(),
    );
    move_onto_vlan(
        &tb.wan,
        HOST_IF,
        VID,
        WAN_HOST_V4.into(),
        WAN_HOST_V6.into(),
    );
    let host_vlan = vlan_of(HOST_IF);
    tb.wan.sh(&format!(
        "ip -6 route replace default via {ROUTER_WAN_V6} dev {host_vlan}"
    ));
    let wan_vlan = vlan_of(WAN_IF);
    let lan = if lan_vlan {
        move_onto_vlan(
            &tb.router,
            LAN_IF,
            LAN_VID,
            ROUTER_LAN_V4.into(),
            ROUTER_LAN_V6.into(),
        );
        move_onto_vlan(
            &tb.lan,
            HOST_IF,
            LAN_VID,
            LAN_HOST_V4.into(),
            LAN_HOST_V6.into(),
        );
        tb.lan.sh(&format!(
            "ip route replace default via {ROUTER_LAN_V4} dev {HOST_IF}.{LAN_VID}
             ip -6 route replace default via {ROUTER_LAN_V6} dev {HOST_IF}.{LAN_VID}"
        ));
        format!("{LAN_IF}.{LAN_VID}")
    } else {
        LAN_IF.to_string()
    };
    route_wan_through(&tb, &lan, &wan_vlan, &format!("over VLAN {VID}"));
    tb
}

/// UDP over IPv4 and IPv6 and a 2 MiB TCP transfer through the VLAN WAN (and VLAN LAN when
/// `lan` is `eth1.10`): fast-pathed both ways, then the negative control with the fast path
/// off.
fn vlan_traffic_is_fast_pathed(tb: &mut Testbed, lan: &str) {
    let wan_vlan = vlan_of(WAN_IF);
    tb.start_daemon_config(&format!(
        "xdp_mode = \"native\"\n\
         [[interface]]\nname = \"{wan_vlan}\"\nrole = \"wan\"\n\
         [[interface]]\nname = \"{lan}\"\nrole = \"lan\"\n"
    ));
    let st = tb.daemon().status();
    let row = |name: &str| {
        st.interfaces
            .iter()
            .find(|i| i.name == name)
            .unwrap_or_else(|| panic!("no status row for {name}: {:?}", st.interfaces))
    };
    let wan = row(&wan_vlan);
    assert_eq!(
        wan.encap.as_deref(),
        Some(format!("VLAN {VID} (802.1Q) on {WAN_IF}").as_str()),
        "{wan:?}"
    );
    assert_eq!(wan.attach_mode, "native", "{wan:?}");
    assert_eq!(
        row(WAN_IF).encap.as_deref(),
        Some(format!("parent of {wan_vlan}").as_str())
    );

    for (server, sock) in [
        (wan_v4(6200), udp_socket(&tb.lan, any_v4(), 64)),
        (wan_v6(6201), udp_socket(&tb.lan, any_v6(), 64)),
    ] {
        let echo = UdpEcho::start(&tb.wan, server);
        let mut seq = 0;
        offload_udp_family(tb, &sock, server, &mut seq);
        let m = measure_udp(tb, &sock, server, &mut seq, lan, &wan_vlan);
        println!(
            "{server} over VLAN {VID}: {} datagrams each way; XDP forwarded {} original (on \
             {lan}, tagged out of {WAN_IF}), {} reply (tagged on {WAN_IF}, popped); wire \
             packets {} on {LAN_IF}, {} on {WAN_IF}: fast-path share {:.0} % / {:.0} %; \
             FORWARD ESTABLISHED +{}",
            m.sent,
            m.orig,
            m.reply,
            m.wire_lan,
            m.wire_wan,
            100.0 * m.orig as f64 / m.wire_lan.max(1) as f64,
            100.0 * m.reply as f64 / m.wire_wan.max(1) as f64,
            m.established
        );
        assert_eq!(
            (m.orig, m.reply),
            (m.sent, m.sent),
            "every datagram fast-pathed both ways"
        );
        assert!(
            m.wire_wan >= m.sent && m.wire_lan >= m.sent,
            "fewer wire packets than datagrams: GRO on the router's veths?"
        );
        assert!(
            m.established <= 2,
            "netfilter saw {} packets of the offloaded flow",
            m.established
        );

        // Negative control: the fast path off, the same exchange goes through netfilter.
        tb.daemon().set_fastpath(false);
        let off = measure_udp(tb, &sock, server, &mut seq, lan, &wan_vlan);
        tb.daemon().set_fastpath(true);
        println!(
            "{server}, fast path off: XDP forwarded {} original, {} reply; FORWARD \
             ESTABLISHED +{} for {} datagrams each way",
            off.orig, off.reply, off.established, off.sent
        );
        assert_eq!((off.orig, off.reply), (0, 0), "fast path off");
        assert!(
            off.established >= 2 * off.sent,
            "with the fast path off netfilter must see every packet: +{}",
            off.established
        );
        assert_eq!(echo.finish().corrupt, 0);
    }

    // TCP: a 2 MiB transfer, intact and masqueraded; most of it fast-pathed once established.
    let before = tb.snapshot();
    let r = Transfer::start(
        tb,
        wan_v4(6210),
        Plan {
            bytes: 2 << 20,
            rate: None,
        },
    )
    .finish();
    let after = tb.snapshot();
    assert_intact(&r);
    assert_eq!(r.peer.ip(), IpAddr::from(ROUTER_WAN_V4), "not masqueraded");
    let orig = after.packets_since(&before, lan, "forwarded_original");
    let reply = after.packets_since(&before, &wan_vlan, "forwarded_reply");
    let wire = after.rx_lan_since(&before) + after.rx_wan_since(&before);
    println!(
        "TCP 2 MiB over VLAN {VID}: XDP forwarded {orig} original + {reply} reply of {wire} \
         wire packets ({:.0} %), FORWARD ESTABLISHED +{}",
        100.0 * (orig + reply) as f64 / wire.max(1) as f64,
        after.established_since(&before, false)
    );
    assert!(
        orig > 0 && reply > 0,
        "TCP not fast-pathed both ways over the VLAN: {orig} original, {reply} reply"
    );
}

/// The WAN named as the VLAN device (`name = "eth0.7"`): established flows are forwarded by
/// XDP on the parent, the reply's tag popped and the original's pushed.
#[test]
#[ignore = "needs the 8021q module: cargo xtask test runs it in a Debian-kernel guest"]
fn wan_on_vlan_is_fast_pathed() {
    if !ready("wan_on_vlan_is_fast_pathed") {
        return;
    }
    let mut tb = vlan_testbed("vf", false);
    vlan_traffic_is_fast_pathed(&mut tb, LAN_IF);
}

/// LAN and WAN both VLANs (eth1.10, eth0.7): tagged in, tagged out.
#[test]
#[ignore = "needs the 8021q module: cargo xtask test runs it in a Debian-kernel guest"]
fn lan_and_wan_on_vlans_are_fast_pathed() {
    if !ready("lan_and_wan_on_vlans_are_fast_pathed") {
        return;
    }
    let mut tb = vlan_testbed("vl", true);
    vlan_traffic_is_fast_pathed(&mut tb, &format!("{LAN_IF}.{LAN_VID}"));
}

/// The WAN named as the Ethernet port under the VLAN (`name = "eth0"`): tagged frames of a
/// VLAN the daemon does not manage go to the kernel (`vlan_unknown`), and connections whose
/// path leaves through eth0.7 are not offloaded (`path_not_managed`); the kernel carries both.
#[test]
#[ignore = "needs the 8021q module: cargo xtask test runs it in a Debian-kernel guest"]
fn wan_as_vlan_parent_leaves_tagged_frames_to_the_kernel() {
    if !ready("wan_as_vlan_parent_leaves_tagged_frames_to_the_kernel") {
        return;
    }
    let mut tb = vlan_testbed("vp", false);
    tb.start_daemon_config(&wan_lan_interfaces(WAN_IF));
    let (before, after) = udp_and_tcp_are_intact(&tb, 6107, &format!("VLAN {VID}"));
    assert_encapsulated_wan_left_to_kernel(&before, &after, "tagged", "vlan_unknown");
}
