//! A LAN port on the TC path (a Wi-Fi or e1000e port; here a veth with `datapath = "tc"`, or a
//! macvlan, which has neither native XDP nor XDP transmit) beside a PPPoE session that XDP
//! carries on the native WAN port, the common home router: both ways on the fast path. Checks
//! of `session_over_the_port` and `session_over_vlan_7` (main.rs), on their test beds.

use xdp_router_tests::testbed::{
    LAN_IF, MACVLAN_LAN_IF, Testbed, WAN_IF, download, interfaces_config, traffic_is_fast_pathed,
    wan_v4,
};

use super::bed::PPP_IF;

/// A LAN port on the TC path (as a Wi-Fi or e1000e port is; here `datapath = "tc"` on the LAN
/// veth) beside a session that XDP carries on the native WAN port: the TC program redirects
/// what it routes into the session into ppp0 itself, whose PPPoE code encapsulates it and
/// sends it out of eth0, and XDP on eth0 forwards the replies into the LAN port (a veth, which
/// takes XDP frames). Both ways fast-pathed; with the fast path off the kernel carries both.
pub(super) fn a_tc_lan_port_sends_into_a_session_on_xdp(tb: &mut Testbed) {
    tb.start_daemon_config(&format!(
        "xdp_mode = \"native\"\n\
         [[interface]]\nname = \"{PPP_IF}\"\nrole = \"wan\"\n\
         [[interface]]\nname = \"{LAN_IF}\"\nrole = \"lan\"\ndatapath = \"tc\"\n"
    ));
    let st = tb.daemon().status();
    println!(
        "status: {PPP_IF}: {}, {LAN_IF}: {}",
        st.iface(PPP_IF).attach_mode,
        st.iface(LAN_IF).attach_mode
    );
    assert_eq!(st.iface(PPP_IF).attach_mode, "lower", "{:?}", st.interfaces);
    assert_eq!(st.iface(LAN_IF).attach_mode, "tc", "{:?}", st.interfaces);
    traffic_is_fast_pathed(
        tb,
        6209,
        LAN_IF,
        PPP_IF,
        "from a TC LAN port into PPPoE on XDP",
    );
}

/// A session that XDP carries on the native WAN port (`ppp0` over the test bed's port or VLAN)
/// beside a LAN port with neither native XDP nor XDP transmit (a macvlan, as a Wi-Fi or Realtek
/// port is; the caller made it with `Testbed::macvlan_lan_port`), with
/// the default `datapath = "auto"`: the macvlan runs TC, and eth0 keeps native XDP with the TC
/// program behind it. Upload: TC on the macvlan sends into ppp0. Download: XDP on eth0 cannot
/// redirect into the macvlan, so it hands the session frame to the TC program on eth0, which
/// takes the session header off the skb and redirects it through the macvlan's transmit path;
/// counted `forwarded_reply` on ppp0. (Before, the kernel took those as `not_on_tc_yet`.) With
/// the fast path off the kernel carries both ways. Then a 4 MiB download, intact and mostly
/// fast-pathed.
fn session_on_xdp_into_a_macvlan(tb: &mut Testbed, port: u16) {
    tb.start_daemon_config(&format!(
        "xdp_mode = \"native\"\n{}",
        interfaces_config(PPP_IF, MACVLAN_LAN_IF)
    ));
    let st = tb.daemon().status();
    let (ppp, mv) = (st.iface(PPP_IF), st.iface(MACVLAN_LAN_IF));
    println!(
        "status: {PPP_IF}: {} ({:?}), {MACVLAN_LAN_IF}: {} ({:?}), XDP transmit {}",
        ppp.attach_mode, ppp.encap, mv.attach_mode, mv.datapath_because, mv.xdp_xmit
    );
    assert_eq!(ppp.attach_mode, "lower", "{:?}", st.interfaces);
    assert_eq!(mv.attach_mode, "tc", "{:?}", st.interfaces);
    assert!(!mv.xdp_xmit, "a macvlan has no XDP transmit: {mv:?}");
    let text = tb.daemon().ctl(&["status"]).expect("status");
    assert!(
        text.contains("tc hand-over"),
        "{WAN_IF} should run the TC program behind XDP:\n{text}"
    );
    traffic_is_fast_pathed(
        tb,
        port,
        MACVLAN_LAN_IF,
        PPP_IF,
        "between a macvlan LAN port on TC and PPPoE on XDP",
    );
    // A download, what a Wi-Fi client mostly does over a PPPoE line: the bulk of it arrives
    // as session frames that XDP hands over, and arrives intact.
    let before = tb.snapshot();
    let (sent, received) = download(tb, wan_v4(port + 5), 4 << 20);
    let after = tb.snapshot();
    assert_eq!(received, sent, "download bytes and SHA-256");
    let reply = after.packets_since(&before, PPP_IF, "forwarded_reply");
    let wire = after.rx_wan_since(&before);
    println!(
        "TCP download 4 MiB into {MACVLAN_LAN_IF}: fast path forwarded {reply} of {wire} WAN \
         wire packets ({:.0} %); counted: {}",
        100.0 * reply as f64 / wire.max(1) as f64,
        after.grown_since(&before)
    );
    assert!(
        2 * reply >= wire,
        "most of the download should be fast-pathed: {reply} of {wire} wire packets"
    );
}

/// [`session_on_xdp_into_a_macvlan`] over the WAN port itself.
pub(super) fn a_session_on_xdp_sends_into_a_port_without_xdp_transmit(tb: &mut Testbed) {
    session_on_xdp_into_a_macvlan(tb, 6309);
}

/// [`session_on_xdp_into_a_macvlan`] over VLAN 7 on the WAN port: on TC the tag is skb
/// metadata, which goes with the session header.
pub(super) fn a_session_over_vlan_on_xdp_sends_into_a_port_without_xdp_transmit(tb: &mut Testbed) {
    session_on_xdp_into_a_macvlan(tb, 6409);
}
