//! A PPPoE WAN, as most DSL and much fiber is delivered: the WAN host runs an access
//! concentrator (`pppoe-server`, rp-pppoe), the router dials it with pppd's kernel-mode PPPoE
//! plugin, and ppp0 (MTU 1492) carries the router's WAN address. This host kernel has no pppoe
//! module, so these tests are `#[ignore]`d here and `cargo xtask test` runs them in a guest
//! that boots Debian's kernel (see xtask/src/guest.rs).
//!
//! What they hold the daemon to: with the PPP device in the config (`name = "ppp0"`, as the
//! kernel routes it) the fast path carries established flows both ways, removing and adding
//! the PPPoE and PPP headers on the Ethernet port under the session (XDP counters equal to the
//! datagrams sent, netfilter's ESTABLISHED rule not rising, every byte intact), and stops
//! doing so when switched off (the negative control); with only the Ethernet port in the
//! config, session frames stay with the kernel; with CCP (MPPE) negotiated, the TC fast path
//! on the PPP device carries it, or with XDP the kernel does (ccp.rs).
//!
//! A test bed with its PPPoE session takes tens of seconds to build in the guest, so the
//! checks that need the same one share it: one test per bed (the session over the port, over
//! VLAN 7, with MPPE) runs its checks one after the other (`testbed::check`: each with a daemon
//! of its own, and named when it fails), those that change the bed (a redial, a macvlan LAN
//! port, a bridged LAN) last or undoing what they changed.

use xdp_router_tests::testbed::{
    LAN_IF, ROUTER_LAN_V4, ROUTER_LAN_V6, Testbed, UdpEcho, WAN_HOST_V4, WAN_HOST_V6, WAN_IF,
    any_v4, assert_encapsulated_wan_left_to_kernel, check, measure_udp, offload_udp_family, ready,
    traffic_is_fast_pathed, udp_and_tcp_are_intact, udp_socket, wait_until, wan_lan_interfaces,
    wan_v4,
};

use bed::{Ccp, PPP_IF, Session, Under, WAN_BRIDGE, pppoe_testbed, promptly};

mod bed;
mod ccp;
mod differential;
mod tc_lan;
mod unpaired;

/// With the PPP device as the WAN in the config (`name = "ppp0"`), the daemon finds the
/// session (its ID, the access concentrator's MAC, the device under it, `lower`) in
/// /proc/net/pppoe; UDP over IPv4 and IPv6 and a 2 MiB TCP transfer are forwarded by XDP on
/// eth0 both ways, and the negative control (fast path off) sends the same exchanges through
/// netfilter. `datapath` is the PPP device's setting; `tc_because`, when the TC fast path is to
/// run on ppp0 itself (the kernel's PPPoE code removes and adds the session headers) and
/// nothing on the lower device, what `status` gives as the reason.
fn ppp_traffic_is_fast_pathed(
    tb: &mut Testbed,
    lower: &str,
    lan: &str,
    datapath: &str,
    tc_because: Option<&str>,
) {
    tb.start_daemon_config(&format!(
        "xdp_mode = \"native\"\n\
         [[interface]]\nname = \"{PPP_IF}\"\nrole = \"wan\"\ndatapath = \"{datapath}\"\n\
         [[interface]]\nname = \"{lan}\"\nrole = \"lan\"\n"
    ));
    let st = tb.daemon().status();
    let ppp = st
        .interfaces
        .iter()
        .find(|i| i.name == PPP_IF)
        .unwrap_or_else(|| panic!("no status row for {PPP_IF}: {:?}", st.interfaces));
    println!(
        "status: {PPP_IF}: {} ({:?})",
        ppp.attach_mode, ppp.datapath_because
    );
    if let Some(because) = tc_because {
        assert_eq!(ppp.attach_mode, "tc", "{ppp:?}");
        assert!(
            ppp.datapath_because
                .as_deref()
                .is_some_and(|w| w.contains(because)),
            "{ppp:?}"
        );
        if let Some(xdp) = tb.xdp_attached() {
            assert!(
                !xdp.contains(&format!("{lower}(")),
                "no XDP program should run on the session's lower device {lower}: {xdp}"
            );
        }
    } else {
        assert_eq!(ppp.attach_mode, "lower", "{ppp:?}");
    }
    let encap = |name: &str| {
        st.interfaces
            .iter()
            .find(|i| i.name == name)
            .and_then(|i| i.encap.clone())
    };
    println!(
        "status: {PPP_IF}: {:?}; {lower}: {:?}",
        encap(PPP_IF),
        encap(lower)
    );
    let want = format!("PPPoE session 0x0001 over {lower} (peer ");
    assert!(
        encap(PPP_IF).is_some_and(|e| e.starts_with(&want)),
        "{PPP_IF}: {:?}, want {want}…",
        encap(PPP_IF)
    );

    traffic_is_fast_pathed(tb, 6207, LAN_IF, PPP_IF, &format!("over PPPoE ({lower})"));
}

/// PPPoE straight over the Ethernet port (DSL, much fiber), one session for these checks, in
/// this order: the PPP device as the WAN (XDP on the port, then `datapath = "tc"`), the port
/// as the WAN, a LAN port on TC, a macvlan LAN port, then (the macvlan gone) a redial (the
/// last two change the bed).
#[test]
#[ignore = "needs the pppoe module: cargo xtask test runs it in a Debian-kernel guest"]
fn session_over_the_port() {
    if !ready("session_over_the_port") {
        return;
    }
    let (mut tb, mut session) = pppoe_testbed("pp", Under::Port, Ccp::Off);
    let tb = &mut tb;
    check(
        tb,
        "wan_as_ppp_device_is_fast_pathed",
        wan_as_ppp_device_is_fast_pathed,
    );
    check(
        tb,
        "wan_as_ppp_device_is_fast_pathed_on_tc",
        wan_as_ppp_device_is_fast_pathed_on_tc,
    );
    check(
        tb,
        "wan_as_pppoe_ethernet_leaves_session_frames_to_the_kernel",
        wan_as_pppoe_ethernet_leaves_session_frames_to_the_kernel,
    );
    check(
        tb,
        "tc_lan::a_tc_lan_port_sends_into_a_session_on_xdp",
        tc_lan::a_tc_lan_port_sends_into_a_session_on_xdp,
    );
    check(
        tb,
        "tc_lan::a_session_on_xdp_sends_into_a_port_without_xdp_transmit",
        |tb| {
            tb.macvlan_lan_port(PPP_IF);
            tc_lan::a_session_on_xdp_sends_into_a_port_without_xdp_transmit(tb);
        },
    );
    // Last: the new session's PPP devices have no global IPv6 addresses.
    check(tb, "a_redialled_session_is_followed", |tb| {
        tb.lan_port_back_from_macvlan();
        a_redialled_session_is_followed(tb, &mut session);
    });
}

/// PPPoE over VLAN 7 on the Ethernet port (many fiber ISPs), one session for these checks, in
/// this order: the PPP device as the WAN, the differentials (XDP, TC), then with a macvlan LAN
/// port the differential and the session into it, then (the macvlan gone) the manual's home
/// router with a bridged LAN.
#[test]
#[ignore = "needs the pppoe and 8021q modules: cargo xtask test runs it in a Debian-kernel guest"]
fn session_over_vlan_7() {
    if !ready("session_over_vlan_7") {
        return;
    }
    let (mut tb, _session) = pppoe_testbed("pv", Under::Vlan(7), Ccp::Off);
    let tb = &mut tb;
    check(
        tb,
        "wan_as_ppp_device_over_vlan_is_fast_pathed",
        wan_as_ppp_device_over_vlan_is_fast_pathed,
    );
    check(
        tb,
        "differential::fast_path_sends_what_the_kernel_sends_over_pppoe",
        differential::fast_path_sends_what_the_kernel_sends_over_pppoe,
    );
    check(
        tb,
        "differential::fast_path_sends_what_the_kernel_sends_over_pppoe_on_tc",
        differential::fast_path_sends_what_the_kernel_sends_over_pppoe_on_tc,
    );
    check(
        tb,
        "differential::fast_path_sends_what_the_kernel_sends_from_pppoe_into_a_port_without_xdp_transmit",
        |tb| {
            tb.macvlan_lan_port(PPP_IF);
            differential::fast_path_sends_what_the_kernel_sends_from_pppoe_into_a_port_without_xdp_transmit(tb);
        },
    );
    check(
        tb,
        "tc_lan::a_session_over_vlan_on_xdp_sends_into_a_port_without_xdp_transmit",
        tc_lan::a_session_over_vlan_on_xdp_sends_into_a_port_without_xdp_transmit,
    );
    check(
        tb,
        "home_router_bridged_lan_and_ppp_over_vlan_is_fast_pathed",
        |tb| {
            tb.lan_port_back_from_macvlan();
            home_router_bridged_lan_and_ppp_over_vlan_is_fast_pathed(tb);
        },
    );
}

/// PPPoE straight over the Ethernet port (DSL, much fiber).
fn wan_as_ppp_device_is_fast_pathed(tb: &mut Testbed) {
    ppp_traffic_is_fast_pathed(tb, WAN_IF, LAN_IF, "auto", None);
}

/// PPPoE on the TC datapath (`datapath = "tc"` on ppp0, as where the Ethernet port has no
/// native XDP: a Realtek port): the TC fast path on ppp0 itself, between the kernel's PPPoE
/// decapsulation and encapsulation; the LAN port native XDP, handing what it routes into
/// ppp0 to the TC program behind it.
fn wan_as_ppp_device_is_fast_pathed_on_tc(tb: &mut Testbed) {
    ppp_traffic_is_fast_pathed(tb, WAN_IF, LAN_IF, "tc", Some("datapath = \"tc\""));
}

/// PPPoE over VLAN 7 on the Ethernet port (many fiber ISPs): tag and session header popped
/// and pushed together on eth0; the VLAN device needs no entry in the config.
fn wan_as_ppp_device_over_vlan_is_fast_pathed(tb: &mut Testbed) {
    ppp_traffic_is_fast_pathed(tb, &format!("{WAN_IF}.7"), LAN_IF, "auto", None);
}

/// PPPoE over a bridge the WAN port is in (`br-wan`): XDP cannot take the session's frames
/// there (a bridge's frames are its ports'), so with the default `datapath = "auto"` the TC
/// fast path runs on ppp0 itself, between the kernel's PPPoE code and its IP layer, and
/// nothing on the bridge or the port. The only check on its test bed.
#[test]
#[ignore = "needs the pppoe module: cargo xtask test runs it in a Debian-kernel guest"]
fn wan_as_ppp_device_over_a_bridge_is_fast_pathed_on_tc() {
    if !ready("wan_as_ppp_device_over_a_bridge_is_fast_pathed_on_tc") {
        return;
    }
    let (mut tb, _session) = pppoe_testbed("pb", Under::Bridge, Ccp::Off);
    ppp_traffic_is_fast_pathed(
        &mut tb,
        WAN_BRIDGE,
        LAN_IF,
        "auto",
        Some("its session runs over br-wan, a bridge device"),
    );
}

/// pppd redials (its session ends, a new one comes up on a new ppp0): the daemon takes the old
/// session out of the datapath when ppp0 goes, binds the new one, and a connection over it is
/// fast-pathed again, both ways.
fn a_redialled_session_is_followed(tb: &mut Testbed, session: &mut Session) {
    tb.start_daemon_config(&format!(
        "xdp_mode = \"native\"\n{}",
        wan_lan_interfaces(PPP_IF)
    ));
    let ppp_status = |tb: &Testbed| {
        tb.daemon()
            .status()
            .interfaces
            .into_iter()
            .find(|i| i.name == PPP_IF)
            .and_then(|i| i.encap)
    };
    let tb = &*tb;
    let before = ppp_status(tb);
    let ifindex_before = tb
        .router
        .exec_ok("cat", &[&format!("/sys/class/net/{PPP_IF}/ifindex")]);
    session.redial(tb);
    let ifindex_after = tb
        .router
        .exec_ok("cat", &[&format!("/sys/class/net/{PPP_IF}/ifindex")]);
    assert_ne!(
        ifindex_before, ifindex_after,
        "pppd kept its ppp0: no redial"
    );
    // Bound again: the session line is back (after ppp0 went, it was gone).
    let bound = wait_until(promptly(), || {
        ppp_status(tb).is_some_and(|e| e.starts_with("PPPoE session 0x"))
    });
    let after = ppp_status(tb);
    println!(
        "redial: {PPP_IF} ifindex {} -> {}; before: {before:?}; after: {after:?}",
        ifindex_before.trim(),
        ifindex_after.trim()
    );
    assert!(
        bound,
        "the new session was not bound within 10 s: {after:?}"
    );

    let server = wan_v4(6227);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    let echo = UdpEcho::start(&tb.wan, server);
    let mut seq = 0;
    offload_udp_family(tb, &sock, server, &mut seq);
    let m = measure_udp(tb, &sock, server, &mut seq, LAN_IF, PPP_IF);
    println!(
        "{server} over the redialled session: {} datagrams each way; XDP forwarded {} \
         original, {} reply; FORWARD ESTABLISHED +{}",
        m.sent, m.orig, m.reply, m.established
    );
    assert_eq!(
        (m.orig, m.reply),
        (m.sent, m.sent),
        "every datagram fast-pathed both ways over the new session"
    );
    assert_eq!(echo.finish().corrupt, 0);
}

/// The manual's home router (docs/manual/src/real-router.md): the LAN a bridge (`br-lan`, the
/// LAN host behind its port eth1), the WAN PPPoE over VLAN 7, the config naming `br-lan` and
/// `ppp0` only. From the port into
/// the tagged session and back, both families, counted on the port (where XDP runs) and on
/// ppp0.
fn home_router_bridged_lan_and_ppp_over_vlan_is_fast_pathed(tb: &mut Testbed) {
    // The LAN port becomes br-lan's; the router's LAN addresses and MAC move to the bridge.
    tb.router.sh(&format!(
        "mac=$(cat /sys/class/net/{LAN_IF}/address)
         ip link add br-lan type bridge
         ip link set br-lan address $mac
         ip addr flush dev {LAN_IF} scope global
         ip link set {LAN_IF} master br-lan
         ip addr add {ROUTER_LAN_V4}/24 dev br-lan
         ip addr add {ROUTER_LAN_V6}/64 dev br-lan nodad
         ip link set br-lan up
         for t in iptables ip6tables; do
           $t -w -A FORWARD -i br-lan -o {PPP_IF} -j ACCEPT
         done"
    ));
    tb.lan.sh(&format!(
        "for i in 1 2 3 4 5; do ping -c1 -W1 {WAN_HOST_V4} >/dev/null && break; done
         for i in 1 2 3 4 5; do ping -6 -c1 -W1 {WAN_HOST_V6} >/dev/null && exit 0; done
         echo 'no path LAN -> WAN through br-lan' >&2; exit 1"
    ));
    ppp_traffic_is_fast_pathed(tb, &format!("{WAN_IF}.7"), "br-lan", "auto", None);
}

/// The WAN named as the Ethernet port under the session (`name = "eth0"`): session frames of
/// a PPP device the daemon does not manage go to the kernel (`pppoe_unknown_session`), and
/// connections whose path leaves through ppp0 are not offloaded (`path_not_managed`); the
/// kernel carries both.
fn wan_as_pppoe_ethernet_leaves_session_frames_to_the_kernel(tb: &mut Testbed) {
    tb.start_daemon_config(&wan_lan_interfaces(WAN_IF));
    let (before, after) = udp_and_tcp_are_intact(tb, 6217, "PPPoE (Ethernet port managed)");
    assert_encapsulated_wan_left_to_kernel(
        &before,
        &after,
        "PPPoE session",
        "pppoe_unknown_session",
    );
}
