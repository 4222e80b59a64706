//! A WAN reached through a tunnel device, as in the kernel flowtable selftest's tunnel cases:
//! the router's WAN addresses live on a VXLAN device (`vxlan0`, VNI 42) over its Ethernet port,
//! whose underlay is 192.168.77.0/24. Whichever way the user names the WAN, every byte arrives
//! intact both ways and nothing is counted as forwarded that did not leave the router.
//!
//! ```text
//!  lan host ⇄ eth1 router eth0 (192.168.77.1) ⇄ eth0 wan host (192.168.77.2)
//!                     vxlan0 (10.0.2.1)  ~~~~~~~~~~  vxlan0 (10.0.2.2)
//! ```

use xdp_router_tests::{
    netns::Netns,
    testbed::{
        HOST_IF, LAN_IF, ROUTER_WAN_V4, ROUTER_WAN_V6, Testbed, WAN_HOST_V4, WAN_HOST_V6, WAN_IF,
        ready, route_wan_through, traffic_is_fast_pathed, udp_and_tcp_are_intact,
        wan_lan_interfaces,
    },
};

const TUNNEL: &str = "vxlan0";

/// Moves `ns`'s WAN addresses from `dev` onto a VXLAN device over it, with `underlay` (the
/// last octet of 192.168.77.x) on `dev` and the peer's underlay as the remote.
fn move_onto_vxlan(ns: &Netns, dev: &str, underlay: u8, peer: u8, v4: &str, v6: &str) {
    ns.sh(&format!(
        "ip addr flush dev {dev} scope global
         ip addr add 192.168.77.{underlay}/24 dev {dev}
         ip link add {TUNNEL} type vxlan id 42 local 192.168.77.{underlay} remote 192.168.77.{peer} dstport 4789 dev {dev}
         ip addr add {v4}/24 dev {TUNNEL}
         ip addr add {v6}/64 dev {TUNNEL} nodad
         ip link set {TUNNEL} up
         ethtool -K {TUNNEL} tx off rx off gro off gso off tso off >/dev/null 2>&1 || true"
    ));
}

/// The test bed with the WAN addresses, routes, NAT and FORWARD rules moved onto vxlan0.
fn tunnel_testbed(tag: &str) -> Testbed {
    let tb = Testbed::new(tag);
    move_onto_vxlan(
        &tb.router,
        WAN_IF,
        1,
        2,
        &ROUTER_WAN_V4.to_string(),
        &ROUTER_WAN_V6.to_string(),
    );
    move_onto_vxlan(
        &tb.wan,
        HOST_IF,
        2,
        1,
        &WAN_HOST_V4.to_string(),
        &WAN_HOST_V6.to_string(),
    );
    tb.wan.sh(&format!(
        "ip -6 route replace default via {ROUTER_WAN_V6} dev {TUNNEL}"
    ));
    route_wan_through(&tb, LAN_IF, TUNNEL, &format!("through {TUNNEL}"));
    tb
}

/// The WAN named as the Ethernet port under the tunnel (`name = "eth0"`): connections whose
/// path leaves through vxlan0, which the daemon does not manage, are not offloaded
/// (`path_not_managed`), the tunnel's UDP goes to the kernel (it is addressed to the router),
/// and nothing is counted as forwarded.
#[test]
fn wan_under_a_tunnel_is_left_to_the_kernel() {
    if !ready("tunnel::wan_under_a_tunnel_is_left_to_the_kernel") {
        return;
    }
    let mut tb = tunnel_testbed("tu");
    tb.start_daemon_config(&wan_lan_interfaces(WAN_IF));
    let (before, after) = udp_and_tcp_are_intact(&tb, 6301, "a VXLAN tunnel");
    let d =
        |iface: &str, reason: &str| after.packets(iface, reason) - before.packets(iface, reason);
    let forwarded = d(LAN_IF, "forwarded_original") + d(WAN_IF, "forwarded_reply");
    let skipped = after
        .conntrack
        .skipped
        .get("path_not_managed")
        .copied()
        .unwrap_or(0);
    println!(
        "WAN under {TUNNEL}: forwarded by XDP {forwarded}; connections skipped as \
         path_not_managed {skipped}"
    );
    assert_eq!(
        forwarded, 0,
        "packets counted as forwarded although the tunnel's path is not managed"
    );
    assert!(
        skipped > 0,
        "connections through {TUNNEL} should be skipped as path_not_managed: {:?}",
        after.conntrack
    );
}

/// The WAN named as the tunnel device (`name = "vxlan0"`) with `datapath = "xdp"`: a VXLAN
/// device has no native XDP, so the program runs in generic (skb) mode there, and it cannot
/// transmit XDP frames. LAN →
/// WAN packets go to the kernel (`egress_no_xdp_xmit`), and so do replies received on vxlan0
/// (`generic_xdp`): the kernel validated their checksum in software while decapsulating, a
/// rewrite in generic XDP would leave that state stale, and the LAN host's stack would drop
/// them (before this, 199 of 200 replies redirected from vxlan0 into the LAN veth were lost
/// as UDP checksum errors at the LAN host, although their bytes were right).
#[test]
fn wan_as_a_tunnel_device_is_left_to_the_kernel() {
    if !ready("tunnel::wan_as_a_tunnel_device_is_left_to_the_kernel") {
        return;
    }
    let mut tb = tunnel_testbed("tv");
    tb.start_daemon_config(&format!(
        "datapath = \"xdp\"\n{}",
        wan_lan_interfaces(TUNNEL)
    ));
    let (before, after) = udp_and_tcp_are_intact(&tb, 6303, "a VXLAN tunnel");
    let d =
        |iface: &str, reason: &str| after.packets(iface, reason) - before.packets(iface, reason);
    let (orig, no_xmit, reply, generic) = (
        d(LAN_IF, "forwarded_original"),
        d(LAN_IF, "egress_no_xdp_xmit"),
        d(TUNNEL, "forwarded_reply"),
        d(TUNNEL, "generic_xdp"),
    );
    let vx = after.interfaces.iter().find(|i| i.name == TUNNEL);
    println!(
        "WAN as {TUNNEL} (attached {:?}): LAN → WAN forwarded by XDP {orig}, to the kernel as \
         egress_no_xdp_xmit {no_xmit}; WAN → LAN forwarded by XDP {reply}, to the kernel as \
         generic_xdp {generic}",
        vx.map(|i| &i.attach_mode)
    );
    assert_eq!(
        vx.map(|i| i.attach_mode.as_str()),
        Some("generic"),
        "{:?}",
        after.interfaces
    );
    assert_eq!(
        (orig, reply),
        (0, 0),
        "nothing may be forwarded into or out of {TUNNEL} by XDP"
    );
    assert!(
        no_xmit > 0 && generic > 0,
        "LAN packets should be counted egress_no_xdp_xmit and WAN packets generic_xdp: \
         {after:?}"
    );
}

/// The WAN named as the tunnel device with the default `datapath = "auto"`: vxlan0 refuses
/// native XDP, so the TC fast path runs on it (on the decapsulated skbs, with the kernel's
/// checksum state, which generic XDP could not keep right), and behind native XDP on the LAN
/// veth for the packets routed into vxlan0 (no XDP transmit there). UDP both ways and TCP are
/// fast-pathed through the tunnel, intact, with the fast path off left to netfilter (the
/// negative control in `traffic_is_fast_pathed`).
#[test]
fn wan_as_a_tunnel_device_runs_the_tc_fast_path() {
    if !ready("tunnel::wan_as_a_tunnel_device_runs_the_tc_fast_path") {
        return;
    }
    let mut tb = tunnel_testbed("tw");
    tb.start_daemon_config(&wan_lan_interfaces(TUNNEL));
    let st = tb.daemon().status();
    let mode = |name: &str| {
        let i = st.iface(name);
        (i.attach_mode.clone(), i.tc_handoff)
    };
    println!(
        "{TUNNEL}: {:?}; {LAN_IF}: {:?} (mode, TC hand-over)",
        mode(TUNNEL),
        mode(LAN_IF)
    );
    assert_eq!(mode(TUNNEL), ("tc".into(), false), "{st:?}");
    assert_eq!(mode(LAN_IF), ("native".into(), true), "{st:?}");
    traffic_is_fast_pathed(&tb, 6305, LAN_IF, TUNNEL, "through a VXLAN WAN on TC");
}
