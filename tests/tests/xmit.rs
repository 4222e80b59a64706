//! Egress devices that cannot transmit XDP frames. A frame redirected into such a device is
//! dropped (a bridge has no `ndo_xdp_xmit`; a veth whose peer has neither an XDP program nor
//! GRO drops it), so the fast path must leave packets routed out of them to the kernel
//! (`egress_no_xdp_xmit`), follow the kernel's reports live (the `netdev` family's
//! notifications), and say why in `status`. Run as root with one test thread
//! (`cargo xtask test`).

use std::time::Duration;

use xdp_router_tests::testbed::{
    LAN_IF, PING_DGRAM, PING_TICK, Testbed, UdpEcho, WAN_IF, any_v4, offload_udp, ping_pong, ready,
    udp_is_fast_pathed, udp_socket, wan_v4,
};

/// A LAN host whose interface has neither XDP nor GRO: the router's LAN veth cannot transmit
/// XDP frames. Replies from the WAN go through the kernel (counted `egress_no_xdp_xmit`, every
/// one delivered) while the LAN→WAN direction is still fast-pathed; once the host turns GRO on
/// the kernel reports the veth capable and the replies are fast-pathed too.
///
/// Negative control: without the check (flag never set) the replies are redirected into the
/// veth and dropped, so `lost` is non-zero and this test fails.
#[test]
fn veth_peer_without_xdp_or_gro_is_no_redirect_target() {
    if !ready("xmit::veth_peer_without_xdp_or_gro_is_no_redirect_target") {
        return;
    }
    let mut tb = Testbed::new("xm");
    tb.lan.sh("ethtool -K eth0 gro off >/dev/null");
    tb.start_daemon();
    let st = tb.daemon().status();
    let lan = st.interfaces.iter().find(|i| i.name == LAN_IF).unwrap();
    let wan = st.interfaces.iter().find(|i| i.name == WAN_IF).unwrap();
    println!(
        "{LAN_IF}: xdp_xmit {} ({:?}); {WAN_IF}: xdp_xmit {}",
        lan.xdp_xmit, lan.no_xdp_xmit_because, wan.xdp_xmit
    );
    assert!(
        !lan.xdp_xmit && wan.xdp_xmit,
        "{LAN_IF} (peer without XDP and GRO) must not be a redirect target, {WAN_IF} must: {st:?}"
    );
    assert!(
        lan.no_xdp_xmit_because
            .as_deref()
            .is_some_and(|w| w.contains("NETDEV_XDP_ACT_NDO_XMIT")),
        "status should say why: {:?}",
        lan.no_xdp_xmit_because
    );

    let server = wan_v4(9999);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    let mut seq = 0;
    offload_udp(&tb, &sock, server, &mut seq);
    // Arm both directions (the kernel forwards their next packets).
    let arm = ping_pong(&sock, server, seq, 2, PING_DGRAM, PING_TICK);
    seq += arm.sent;
    let before = tb.snapshot();
    let pp = ping_pong(&sock, server, seq, 30, PING_DGRAM, PING_TICK);
    seq += pp.sent;
    let after = tb.snapshot();
    let orig = after.packets_since(&before, LAN_IF, "forwarded_original");
    let reply = after.packets_since(&before, WAN_IF, "forwarded_reply");
    let no_xmit = after.packets_since(&before, WAN_IF, "egress_no_xdp_xmit");
    let wire_wan = after.rx_wan_since(&before);
    println!(
        "peer without XDP/GRO: {} sent, {} echoed, {} lost; fast path {orig} original, {reply} \
         reply; {no_xmit} replies to the kernel as egress_no_xdp_xmit ({wire_wan} packets on \
         the WAN wire)",
        pp.sent, pp.good, pp.lost
    );
    assert_eq!(
        (pp.good, pp.lost, pp.corrupt),
        (pp.sent, 0, 0),
        "every reply must arrive: {pp:?}"
    );
    assert_eq!(orig, pp.sent, "LAN→WAN is still fast-pathed");
    assert_eq!(reply, 0, "no reply may be redirected into {LAN_IF}");
    assert_eq!(
        no_xmit, pp.sent,
        "every reply goes to the kernel as egress_no_xdp_xmit"
    );

    // GRO on the host's side: the kernel reports the router's veth capable (a netdev
    // notification), and the daemon makes it a redirect target again.
    tb.lan.sh("ethtool -K eth0 gro on >/dev/null");
    let (st, ok) = tb.daemon().wait_status(Duration::from_secs(3), |s| {
        s.interfaces.iter().any(|i| i.name == LAN_IF && i.xdp_xmit)
    });
    assert!(
        ok,
        "{LAN_IF} should become a redirect target once its peer has GRO: {st:?}\n{}",
        tb.daemon().log_tail()
    );
    udp_is_fast_pathed(&tb, &sock, server, &mut seq, LAN_IF, WAN_IF);
    let seen = echo.finish();
    assert_eq!(seen.corrupt, 0);
}

/// A LAN port whose veth peer transmits on more queues than it receives on: the kernel refuses
/// native XDP (ENOSPC, its message only reaches a tracepoint; the test bed's way to make a
/// driver refuse) and, with `datapath = "xdp"`, the daemon falls back to
/// generic XDP saying why, in the log and in `status` (with the default `auto` it takes the TC
/// fast path instead: `tc::auto_datapath_takes_tc_where_native_xdp_is_refused`).
#[test]
fn native_attach_refusal_is_explained() {
    if !ready("xmit::native_attach_refusal_is_explained") {
        return;
    }
    let mut tb = Testbed::new("mt");
    tb.refuse_native_xdp_on_the_lan_port();
    let daemon = tb.start_daemon_config(&format!(
        "datapath = \"xdp\"\n\
         xdp_mode = \"native\"\n\
         [[interface]]\nname = \"{WAN_IF}\"\nrole = \"wan\"\n\
         [[interface]]\nname = \"{LAN_IF}\"\nrole = \"lan\"\n"
    ));
    let st = daemon.status();
    let lan = st.interfaces.iter().find(|i| i.name == LAN_IF).unwrap();
    println!(
        "{LAN_IF}: {} XDP because {:?}",
        lan.attach_mode, lan.generic_because
    );
    assert_eq!(lan.attach_mode, "generic", "{st:?}");
    assert!(
        lan.generic_because
            .as_deref()
            .is_some_and(|w| w.contains("fewer RX queues")),
        "status should say why native XDP was refused: {:?}",
        lan.generic_because
    );
    let log = daemon.log_tail();
    assert!(
        log.contains("native XDP attach failed: fewer RX queues"),
        "the warning should say why:\n{log}"
    );
    let wan = st.interfaces.iter().find(|i| i.name == WAN_IF).unwrap();
    assert_eq!(wan.attach_mode, "native");
    assert_eq!(wan.generic_because, None);
}
