//! Devices without a link-layer header (WireGuard `wg0`, tun): the TC fast path on them.

use super::*;

/// Registered as a device without a link-layer header (`IFACE_F_L3`), never an XDP redirect
/// target, on the TC datapath; connections routed through it are offloaded; the same when it
/// comes back under a new ifindex.
#[test]
fn an_interface_without_an_ethernet_address_gets_the_tc_fast_path() {
    let mut s = wan_and_lan("wg0", Shaped::Never, Some(WAN), None);
    assert!(s.dp.attached.contains_key(&LAN));
    // Registered as a device without a link-layer header, never an XDP redirect target.
    let flags = s.dp.attached.get(&WAN).map(|a| a.1).unwrap_or_default();
    assert_eq!(
        flags & (IFACE_F_L3 | IFACE_F_NO_XDP_XMIT),
        IFACE_F_L3 | IFACE_F_NO_XDP_XMIT,
        "{:?}",
        s.dp.attached
    );
    assert_eq!(s.ifaces[0].mode, Some(AttachMode::Tc));
    // Connections routed through it are offloaded.
    s.apply_events(vec![CtEvent::New(snat(40000))], &Routes(WAN));
    assert_eq!(s.flows.len(), 1);
    // The same when it comes back under a new ifindex.
    s.link_gone(WAN);
    assert!(!s.dp.attached.contains_key(&WAN));
    assert!(s.link_up(9, "wg0", None, &BridgeRead::default()));
    assert!(s.dp.attached.contains_key(&9));
    assert_eq!(s.ifindex_of("wg0"), Some(9));
}
