//! 802.1Q VLAN topologies: the router's WAN is VLAN 7 on its Ethernet port (as many ISPs deliver
//! it). This host kernel has no 8021q module, so these tests are `#[ignore]`d here and
//! `cargo xtask test` runs them in a guest that boots Debian's kernel (see xtask/src/guest.rs);
//! by hand: `cargo xtask test --guest-only -- vlan`.
//!
//! What they hold the daemon to, whichever way the user names the WAN in the config: every
//! byte arrives intact both ways, and no packet is counted as forwarded by the fast path unless
//! it really left the router.

use std::net::IpAddr;

use xdp_router_tests::{
    netns::Netns,
    testbed::{
        HOST_IF, LAN_IF, ROUTER_WAN_V4, ROUTER_WAN_V6, Testbed, WAN_HOST_V4, WAN_HOST_V6, WAN_IF,
        assert_encapsulated_wan_left_to_kernel, ready, udp_and_tcp_are_intact, wan_lan_interfaces,
    },
};

/// The WAN's VLAN id.
const VID: u16 = 7;

/// `<dev>.7`.
fn vlan_of(dev: &str) -> String {
    format!("{dev}.{VID}")
}

/// Moves `ns`'s addresses from `dev` to a new VLAN device `dev.7` on it. The tag is inserted
/// in software (`txvlan off` on `dev`), so frames carry it in their bytes as on a wire: a veth
/// would otherwise pass it beside the frame (skb metadata), where XDP does not see it.
fn move_onto_vlan(ns: &Netns, dev: &str, v4: IpAddr, v6: IpAddr) {
    let vlan = vlan_of(dev);
    ns.sh(&format!(
        "ip addr flush dev {dev} scope global
         ip link add link {dev} name {vlan} type vlan id {VID}
         ip addr add {v4}/24 dev {vlan}
         ip addr add {v6}/64 dev {vlan} nodad
         ip link set {vlan} up
         ethtool -K {vlan} tx off rx off gro off gso off tso off >/dev/null 2>&1 || true
         ethtool -K {dev} txvlan off >/dev/null"
    ));
}

/// The test bed with the WAN link (router eth0 ⇄ WAN host eth0) carrying VLAN 7 on both
/// ends, the addresses, routes, NAT and FORWARD rules moved onto eth0.7.
fn vlan_wan_testbed(tag: &str) -> Testbed {
    let tb = Testbed::new(tag);
    move_onto_vlan(
        &tb.router,
        WAN_IF,
        ROUTER_WAN_V4.into(),
        ROUTER_WAN_V6.into(),
    );
    move_onto_vlan(&tb.wan, HOST_IF, WAN_HOST_V4.into(), WAN_HOST_V6.into());
    let host_vlan = vlan_of(HOST_IF);
    tb.wan.sh(&format!(
        "ip -6 route replace default via {ROUTER_WAN_V6} dev {host_vlan}"
    ));
    let wan_vlan = vlan_of(WAN_IF);
    tb.router.sh(&format!(
        "iptables -w -t nat -D POSTROUTING -o {WAN_IF} -j MASQUERADE
         iptables -w -t nat -A POSTROUTING -o {wan_vlan} -j MASQUERADE
         for t in iptables ip6tables; do
           $t -w -A FORWARD -i {LAN_IF} -o {wan_vlan} -j ACCEPT
         done"
    ));
    tb.lan.sh(&format!(
        "for i in 1 2 3 4 5; do ping -c1 -W1 {WAN_HOST_V4} >/dev/null && break; done
         for i in 1 2 3 4 5; do ping -6 -c1 -W1 {WAN_HOST_V6} >/dev/null && exit 0; done
         echo 'no path LAN -> WAN over VLAN {VID}' >&2; exit 1"
    ));
    tb
}

/// The WAN named as the VLAN device (`name = "eth0.7"`): a VLAN device cannot transmit XDP
/// frames, so the fast path must hand LAN → WAN packets to the kernel (`egress_no_xdp_xmit`)
/// instead of redirecting them into it, where they would be dropped.
#[test]
#[ignore = "needs the 8021q module: cargo xtask test runs it in a Debian-kernel guest"]
fn wan_as_vlan_device_is_never_a_redirect_target() {
    if !ready("wan_as_vlan_device_is_never_a_redirect_target") {
        return;
    }
    let mut tb = vlan_wan_testbed("vd");
    let wan_vlan = vlan_of(WAN_IF);
    tb.start_daemon_config(&wan_lan_interfaces(&wan_vlan));
    let (before, after) = udp_and_tcp_are_intact(&tb, 6107, &format!("VLAN {VID}"));
    let fwd =
        after.packets(LAN_IF, "forwarded_original") - before.packets(LAN_IF, "forwarded_original");
    let no_xmit =
        after.packets(LAN_IF, "egress_no_xdp_xmit") - before.packets(LAN_IF, "egress_no_xdp_xmit");
    eprintln!(
        "{LAN_IF} → {wan_vlan}: forwarded by XDP {fwd}, handed to the kernel (egress_no_xdp_xmit) {no_xmit}"
    );
    assert_eq!(
        fwd, 0,
        "packets counted as redirected into {wan_vlan}, which cannot transmit XDP frames"
    );
    assert!(
        no_xmit > 0,
        "no LAN packet was counted egress_no_xdp_xmit: {after:?}"
    );
}

/// The WAN named as the Ethernet port under the VLAN (`name = "eth0"`): tagged frames are not
/// parsed by the fast path (`not_ip`), and connections whose path leaves through eth0.7, which
/// the daemon does not manage, are not offloaded (`path_not_managed`); the kernel carries both.
#[test]
#[ignore = "needs the 8021q module: cargo xtask test runs it in a Debian-kernel guest"]
fn wan_as_vlan_parent_leaves_tagged_frames_to_the_kernel() {
    if !ready("wan_as_vlan_parent_leaves_tagged_frames_to_the_kernel") {
        return;
    }
    let mut tb = vlan_wan_testbed("vp");
    tb.start_daemon_config(&wan_lan_interfaces(WAN_IF));
    let (before, after) = udp_and_tcp_are_intact(&tb, 6107, &format!("VLAN {VID}"));
    assert_encapsulated_wan_left_to_kernel(&before, &after, "tagged");
}
