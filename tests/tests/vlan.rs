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
//!
//! The checks that need the same test bed (the WAN on VLAN 7, the LAN untagged or on VLAN 10)
//! share it: one test per bed runs them one after the other (`testbed::check`).

use std::net::IpAddr;

use xdp_router_tests::{
    netns::Netns,
    testbed::{
        HOST_IF, LAN_HOST_V4, LAN_HOST_V6, LAN_IF, ROUTER_LAN_V4, ROUTER_LAN_V6, ROUTER_WAN_V4,
        ROUTER_WAN_V6, Testbed, WAN_HOST_V4, WAN_HOST_V6, WAN_IF,
        assert_encapsulated_wan_left_to_kernel, check, ready, route_wan_through,
        traffic_is_fast_pathed, udp_and_tcp_are_intact, wan_lan_interfaces,
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

/// Moves the LAN link (router eth1 ⇄ LAN host eth0) onto VLAN `vid` on both ends, the LAN
/// host's default routes with it; returns the router's LAN VLAN device (`eth1.<vid>`).
fn lan_onto_vlan(tb: &Testbed, vid: u16) -> String {
    move_onto_vlan(
        &tb.router,
        LAN_IF,
        vid,
        ROUTER_LAN_V4.into(),
        ROUTER_LAN_V6.into(),
    );
    move_onto_vlan(
        &tb.lan,
        HOST_IF,
        vid,
        LAN_HOST_V4.into(),
        LAN_HOST_V6.into(),
    );
    tb.lan.sh(&format!(
        "ip route replace default via {ROUTER_LAN_V4} dev {HOST_IF}.{vid}
         ip -6 route replace default via {ROUTER_LAN_V6} dev {HOST_IF}.{vid}"
    ));
    format!("{LAN_IF}.{vid}")
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
        lan_onto_vlan(&tb, LAN_VID)
    } else {
        LAN_IF.to_string()
    };
    route_wan_through(&tb, &lan, &wan_vlan, &format!("over VLAN {VID}"));
    tb
}

/// UDP over IPv4 and IPv6 and a 2 MiB TCP transfer through the VLAN WAN (and VLAN LAN when
/// `lan` is `eth1.10`): fast-pathed both ways, then the negative control with the fast path
/// off. `datapath` is each interface's setting (WAN, LAN): with `"tc"` the TC fast path runs
/// on the VLAN device itself (the kernel untags before it and tags after the redirect), not
/// on its parent.
fn vlan_traffic_is_fast_pathed(tb: &mut Testbed, lan: &str, datapath: [&str; 2]) {
    let wan_vlan = vlan_of(WAN_IF);
    let [wan_dp, lan_dp] = datapath;
    tb.start_daemon_config(&format!(
        "xdp_mode = \"native\"\n\
         [[interface]]\nname = \"{wan_vlan}\"\nrole = \"wan\"\ndatapath = \"{wan_dp}\"\n\
         [[interface]]\nname = \"{lan}\"\nrole = \"lan\"\ndatapath = \"{lan_dp}\"\n"
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
    let expected = |dp: &str| if dp == "tc" { "tc" } else { "native" };
    assert_eq!(wan.attach_mode, expected(wan_dp), "{wan:?}");
    assert_eq!(row(lan).attach_mode, expected(lan_dp), "{:?}", row(lan));
    assert_eq!(
        row(WAN_IF).encap.as_deref(),
        Some(format!("parent of {wan_vlan}").as_str())
    );
    if wan_dp == "tc" {
        let text = tb.daemon().ctl(&["status"]).expect("status");
        assert!(
            text.contains("datapath tc because: datapath = \"tc\""),
            "status should say why {wan_vlan} runs the TC datapath:\n{text}"
        );
        if let Some(xdp) = tb.xdp_attached() {
            assert!(
                lan_dp != "tc",
                "no XDP program should be attached with datapath = \"tc\" on both: {xdp}"
            );
        }
    }

    traffic_is_fast_pathed(tb, 6200, lan, &wan_vlan, &format!("over VLAN {VID}"));
}

/// The WAN on VLAN 7, the LAN untagged: the checks on that test bed.
#[test]
#[ignore = "needs the 8021q module: cargo xtask test runs it in a Debian-kernel guest"]
fn wan_on_vlan() {
    if !ready("wan_on_vlan") {
        return;
    }
    let mut tb = vlan_testbed("vf", false);
    let tb = &mut tb;
    check(tb, "wan_on_vlan_is_fast_pathed", wan_on_vlan_is_fast_pathed);
    check(
        tb,
        "wan_vlan_on_tc_and_lan_on_xdp_are_fast_pathed",
        wan_vlan_on_tc_and_lan_on_xdp_are_fast_pathed,
    );
    check(
        tb,
        "wan_as_vlan_parent_leaves_tagged_frames_to_the_kernel",
        wan_as_vlan_parent_leaves_tagged_frames_to_the_kernel,
    );
}

/// LAN and WAN both on VLANs (eth1.10, eth0.7): the checks on that test bed.
#[test]
#[ignore = "needs the 8021q module: cargo xtask test runs it in a Debian-kernel guest"]
fn lan_and_wan_on_vlans() {
    if !ready("lan_and_wan_on_vlans") {
        return;
    }
    let mut tb = vlan_testbed("vl", true);
    let tb = &mut tb;
    check(
        tb,
        "lan_and_wan_on_vlans_are_fast_pathed",
        lan_and_wan_on_vlans_are_fast_pathed,
    );
    check(
        tb,
        "lan_and_wan_on_vlans_are_fast_pathed_on_tc",
        lan_and_wan_on_vlans_are_fast_pathed_on_tc,
    );
}

/// The WAN named as the VLAN device (`name = "eth0.7"`): established flows are forwarded by
/// XDP on the parent, the reply's tag popped and the original's pushed.
fn wan_on_vlan_is_fast_pathed(tb: &mut Testbed) {
    vlan_traffic_is_fast_pathed(tb, LAN_IF, ["auto", "auto"]);
}

/// LAN and WAN both VLANs (eth1.10, eth0.7): tagged in, tagged out.
fn lan_and_wan_on_vlans_are_fast_pathed(tb: &mut Testbed) {
    vlan_traffic_is_fast_pathed(tb, &format!("{LAN_IF}.{LAN_VID}"), ["auto", "auto"]);
}

/// LAN and WAN both VLANs on the TC datapath (`datapath = "tc"`, as on a port without native
/// XDP): the TC fast path on eth1.10 and eth0.7 themselves, no program on their parents;
/// untagged in (the kernel pops the tag before), redirected to the other VLAN device (whose
/// transmit path pushes it).
fn lan_and_wan_on_vlans_are_fast_pathed_on_tc(tb: &mut Testbed) {
    vlan_traffic_is_fast_pathed(tb, &format!("{LAN_IF}.{LAN_VID}"), ["tc", "tc"]);
}

/// The WAN VLAN on the TC datapath, the LAN port on native XDP: the LAN's XDP program pushes
/// the WAN's tag and redirects to its parent (which has no program of its own); the TC fast
/// path on eth0.7 redirects replies to the native LAN port.
fn wan_vlan_on_tc_and_lan_on_xdp_are_fast_pathed(tb: &mut Testbed) {
    vlan_traffic_is_fast_pathed(tb, LAN_IF, ["tc", "auto"]);
}

/// A VLAN device on a bridge port: the router's LAN port eth1 is a port of br-lan (managed:
/// the program runs on eth1 as the bridge's port) and carries VLAN 20, whose device eth1.20
/// is the LAN the host is on (tagged). Its frames are eth1.20's, not the bridge's: fast-pathed
/// both ways, tag popped on eth1 and pushed on the way back.
#[test]
#[ignore = "needs the 8021q module: cargo xtask test runs it in a Debian-kernel guest"]
fn vlan_on_a_bridge_port_is_fast_pathed() {
    if !ready("vlan_on_a_bridge_port_is_fast_pathed") {
        return;
    }
    const GUEST_VID: u16 = 20;
    let mut tb = Testbed::new("vb");
    let lan = lan_onto_vlan(&tb, GUEST_VID);
    tb.router.sh(&format!(
        "ip link add br-lan type bridge
         ip link set {LAN_IF} master br-lan
         ip addr add 10.0.9.1/24 dev br-lan
         ip link set br-lan up"
    ));
    route_wan_through(
        &tb,
        &lan,
        WAN_IF,
        &format!("from VLAN {GUEST_VID} on a bridge port"),
    );
    tb.start_daemon_config(&format!(
        "xdp_mode = \"native\"\n\
         [[interface]]\nname = \"{WAN_IF}\"\nrole = \"wan\"\n\
         [[interface]]\nname = \"br-lan\"\nrole = \"lan\"\n\
         [[interface]]\nname = \"{lan}\"\nrole = \"lan\"\n"
    ));
    let st = tb.daemon().status();
    for name in [LAN_IF, lan.as_str(), "br-lan"] {
        let row = st.interfaces.iter().find(|i| i.name == name);
        println!(
            "status: {name}: {:?}",
            row.map(|r| (r.attach_mode.clone(), r.encap.clone()))
        );
    }
    traffic_is_fast_pathed(
        &tb,
        6240,
        &lan,
        WAN_IF,
        &format!("from VLAN {GUEST_VID} on bridge port {LAN_IF}"),
    );
}

/// The WAN named as the Ethernet port under the VLAN (`name = "eth0"`): tagged frames of a
/// VLAN the daemon does not manage go to the kernel (`vlan_unknown`), and connections whose
/// path leaves through eth0.7 are not offloaded (`path_not_managed`); the kernel carries both.
fn wan_as_vlan_parent_leaves_tagged_frames_to_the_kernel(tb: &mut Testbed) {
    tb.start_daemon_config(&wan_lan_interfaces(WAN_IF));
    let (before, after) = udp_and_tcp_are_intact(tb, 6107, &format!("VLAN {VID}"));
    assert_encapsulated_wan_left_to_kernel(&before, &after, "tagged", "vlan_unknown");
}

/// The inner VLAN of a stacked pair (`eth0.7.20`: VLAN 20 in VLAN 7, as some ISPs deliver
/// double-tagged service): XDP on eth0 leaves double-tagged frames to the kernel
/// (`vlan_q_in_q`), which untags them twice, and with `datapath = "auto"` the TC fast path
/// runs on eth0.7.20 itself (native XDP is refused on its parent, a VLAN device); a packet
/// redirected into it gets both tags from the two VLAN devices' transmit paths. The LAN port
/// (native XDP) hands what it routes there to the TC program behind it. The inner VLAN's MTU
/// is 1496, so that a full datagram with both tags fits the veth (1500 and one tag).
#[test]
#[ignore = "needs the 8021q module: cargo xtask test runs it in a Debian-kernel guest"]
fn wan_on_stacked_vlans_is_fast_pathed_on_tc() {
    if !ready("wan_on_stacked_vlans_is_fast_pathed_on_tc") {
        return;
    }
    const INNER: u16 = 20;
    let mut tb = Testbed::new("vs");
    for (ns, dev, v4, v6) in [
        (&tb.router, WAN_IF, ROUTER_WAN_V4, ROUTER_WAN_V6),
        (&tb.wan, HOST_IF, WAN_HOST_V4, WAN_HOST_V6),
    ] {
        move_onto_vlan(ns, dev, VID, v4.into(), v6.into());
        let outer = vlan_of(dev);
        ns.sh(&format!(
            "ip addr flush dev {outer} scope global
             ip link add link {outer} name {outer}.{INNER} mtu 1496 type vlan id {INNER}
             ip addr add {v4}/24 dev {outer}.{INNER}
             ip addr add {v6}/64 dev {outer}.{INNER} nodad
             ip link set {outer}.{INNER} up
             ethtool -K {outer}.{INNER} tx off rx off gro off gso off tso off >/dev/null 2>&1 || true"
        ));
    }
    let wan = format!("{}.{INNER}", vlan_of(WAN_IF));
    tb.wan.sh(&format!(
        "ip -6 route replace default via {ROUTER_WAN_V6} dev {}.{INNER}",
        vlan_of(HOST_IF)
    ));
    route_wan_through(&tb, LAN_IF, &wan, "over VLAN 20 in VLAN 7");
    tb.start_daemon_config(&format!(
        "xdp_mode = \"native\"\n{}",
        wan_lan_interfaces(&wan)
    ));
    let st = tb.daemon().status();
    let (w, lan) = (st.iface(&wan), st.iface(LAN_IF));
    let text = tb.daemon().ctl(&["status"]).expect("status");
    println!(
        "status: {wan}: {} ({:?}); {LAN_IF}: {}, TC hand-over {}",
        w.attach_mode, w.datapath_because, lan.attach_mode, lan.tc_handoff
    );
    assert_eq!(w.attach_mode, "tc", "{w:?}");
    assert!(
        !text.contains("not accelerated"),
        "nothing should be left out:\n{text}"
    );
    assert_eq!((lan.attach_mode.as_str(), lan.tc_handoff), ("native", true));
    traffic_is_fast_pathed(&tb, 6230, LAN_IF, &wan, "over VLAN 20 in VLAN 7");
}
