//! A PPP device that carries no PPPoE session: PPP over a pseudo-terminal here (as pptp-linux
//! and PPP-over-SSH VPNs run it; L2TP and serial or mobile modems are other such channels).
//! /proc/net/pppoe has nothing for it, so there are no session frames for XDP to take; with
//! `datapath = "auto"` the TC fast path runs on the PPP device itself, between the kernel's
//! PPP layer and its IP layer, whatever carries its frames.

use std::process::Child;

use xdp_router_tests::testbed::{
    HOST_IF, LAN_IF, ROUTER_WAN_V4, TempDir, Testbed, WAN_HOST_V4, WAN_IF, ready,
    traffic_is_fast_pathed, wan_lan_interfaces,
};

use super::bed::{PPP_IF, end, ppp0_up, spawn, wan_over_ppp0};

/// pppd in the router, running its peer (pppd in the WAN host) over a pseudo-terminal; ended
/// by PID on drop, which hangs the link up and so ends the peer too.
struct PtyLink {
    pppd: Child,
    _dir: TempDir,
}

impl Drop for PtyLink {
    fn drop(&mut self) {
        end(&mut self.pppd);
    }
}

/// The test bed with its WAN moved onto PPP over a pseudo-terminal: the router's ppp0 has
/// 10.0.2.1, the WAN host's PPP device 10.0.2.2, no Ethernet under either.
fn pty_testbed(tag: &str) -> (Testbed, PtyLink) {
    let mut tb = Testbed::new(tag);
    tb.router
        .sh(&format!("ip addr flush dev {WAN_IF} scope global"));
    tb.wan
        .sh(&format!("ip addr flush dev {HOST_IF} scope global"));
    let common = "noauth local nodefaultroute lcp-echo-interval 0 novj noccp +ipv6";
    let peer = format!(
        "ip netns exec {} pppd notty nodetach {common} {WAN_HOST_V4}:{}",
        tb.wan.name(),
        ROUTER_WAN_V4
    );
    let dir = TempDir::new();
    let log = dir.path().join("pppd.log").to_string_lossy().into_owned();
    let mut args = vec!["nodetach", "unit", "0", "pty", peer.as_str()];
    args.extend(common.split(' '));
    let local = format!("{}:{WAN_HOST_V4}", ROUTER_WAN_V4);
    args.extend([local.as_str(), "debug", "logfile", log.as_str()]);
    let link = PtyLink {
        pppd: spawn(&tb.router, "pppd", &args),
        _dir: dir,
    };
    assert!(
        ppp0_up(&tb),
        "no PPP link over the pseudo-terminal within 60 s: pppd's log:\n{}",
        std::fs::read_to_string(&log).unwrap_or_else(|e| e.to_string())
    );
    wan_over_ppp0(&tb);
    // Its packets are counted where they arrive: on ppp0, no Ethernet port carries them.
    tb.wan_wire = PPP_IF.into();
    (tb, link)
}

/// No PPPoE session for ppp0: with the default `datapath = "auto"` the TC fast path runs on it
/// (status: `tc`, because no session is paired with it), nothing is left out (no `PPPoE not
/// accelerated` line), and the LAN port (native XDP) hands what it routes into ppp0 to the TC
/// program behind it, which sends it into ppp0, whose PPP layer frames it onto the
/// pseudo-terminal. UDP v4/v6 both ways and TCP: fast-pathed, intact, and with the fast path
/// off all through netfilter. (Before, such a device was not accelerated at all.)
#[test]
#[ignore = "needs the ppp_async module: cargo xtask test runs it in a Debian-kernel guest"]
fn a_ppp_device_without_pppoe_is_fast_pathed_on_tc() {
    if !ready("a_ppp_device_without_pppoe_is_fast_pathed_on_tc") {
        return;
    }
    let (mut tb, _link) = pty_testbed("pq");
    tb.start_daemon_config(&format!(
        "xdp_mode = \"native\"\n{}",
        wan_lan_interfaces(PPP_IF)
    ));
    let st = tb.daemon().status();
    let (ppp, lan) = (st.iface(PPP_IF), st.iface(LAN_IF));
    println!(
        "status: {PPP_IF}: {} ({:?}); PPPoE: {:?}; {LAN_IF}: {}, TC hand-over {}",
        ppp.attach_mode, ppp.datapath_because, ppp.pppoe, lan.attach_mode, lan.tc_handoff
    );
    assert_eq!(ppp.attach_mode, "tc", "{:?}", st.interfaces);
    assert!(
        ppp.datapath_because
            .as_deref()
            .is_some_and(|w| w.contains("no PPPoE session is paired with it")),
        "status should say why: {:?}",
        ppp.datapath_because
    );
    assert_eq!(
        ppp.pppoe
            .as_ref()
            .and_then(|p| p.not_accelerated_because.clone()),
        None,
        "nothing should be left out"
    );
    assert_eq!(
        (lan.attach_mode.as_str(), lan.tc_handoff),
        ("native", true),
        "{lan:?}"
    );
    traffic_is_fast_pathed(&tb, 6509, LAN_IF, PPP_IF, "over PPP without PPPoE on TC");
}
