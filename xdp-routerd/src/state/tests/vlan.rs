//! VLAN devices: attached over their parent, with its transmit judgement and shaping; VLANs
//! over one parent share its slot.

use super::*;

/// A VLAN WAN (`wan` = VLAN 7 over ifindex 20, `eth0`): attached over its parent with the
/// parent's transmit judgement, in doubt about the parent's shaping until its qdiscs are read,
/// and attached again (same parent, new ifindex) when the VLAN device is created again.
#[test]
fn a_vlan_device_is_attached_over_its_parent() {
    use crate::sync::vlan::{VlanLink, VlanRead};
    let cfgs = [iface("wan", Role::Wan, Shaped::Never)];
    let mut s = State::new(
        FakeDp::default(),
        &cfgs,
        &[Some(WAN)],
        XdpModeConfig::Native,
    );
    let vlan = BridgeRead {
        link_kind: Some("vlan".into()),
        vlan: Some(VlanRead {
            link: VlanLink {
                parent: 20,
                vid: 7,
                tpid: 0x8100,
            },
            parent_name: "eth0".into(),
            parent_kind: None,
            parent_mac: Some([2, 0, 0, 0, 0, 0x20]),
        }),
        ..BridgeRead::default()
    };
    s.set_kinds_and_xmit(
        &BridgeReads::from([("wan".to_string(), vlan.clone())]),
        all_capable(),
    );
    s.attach_all(&[Some(MAC)]).unwrap();
    let (vid, tpid, parent) = s.dp.vlans[&WAN].clone();
    assert_eq!(
        (vid, tpid, parent.ifindex, parent.name.as_str()),
        (7, 0x8100, 20, "eth0")
    );
    assert_eq!(parent.mac, [2, 0, 0, 0, 0, 0x20]);
    // Its own slot differs from the VLAN device's; shaped until its qdiscs are known.
    assert_ne!(parent.slot, s.ifaces[0].slot);
    assert_eq!(parent.flags & IFACE_F_SHAPED, IFACE_F_SHAPED);
    // The VLAN device itself: no "cannot transmit" fallback for it (its parent transmits).
    assert!(s.ifaces[0].vlan.is_some());
    // The parent's own flags follow its qdiscs and its XDP transmit judgement.
    s.apply_qdiscs(Ok(Vec::new()));
    assert_eq!(flags(&s, 20), 0);
    s.apply_xmit_event(XmitEvent::Gone { ifindex: 20 });
    assert_eq!(flags(&s, 20), IFACE_F_NO_XDP_XMIT);
    // Re-created (new ifindex): attached again over the same parent, same parent slot.
    assert!(s.link_gone(WAN));
    assert!(s.link_up(30, "wan", Some(MAC), &vlan));
    assert_eq!(s.dp.vlans[&30].2.slot, parent.slot);
    // The status lists the parent with its own counters' slot.
    assert_eq!(s.ifaces[0].parent_slot, parent.slot);
}

/// Two VLANs over one parent (router on a stick): one parent, one stats slot for it.
#[test]
fn vlans_over_one_parent_share_its_slot() {
    use crate::sync::vlan::{VlanLink, VlanRead};
    let cfgs = [
        iface("wan", Role::Wan, Shaped::Never),
        iface("lan", Role::Lan, Shaped::Never),
    ];
    let mut s = State::new(
        FakeDp::default(),
        &cfgs,
        &[Some(WAN), Some(LAN)],
        XdpModeConfig::Native,
    );
    let vlan = |vid| BridgeRead {
        link_kind: Some("vlan".into()),
        vlan: Some(VlanRead {
            link: VlanLink {
                parent: 20,
                vid,
                tpid: 0x8100,
            },
            parent_name: "eth0".into(),
            parent_kind: None,
            parent_mac: Some(MAC),
        }),
        ..BridgeRead::default()
    };
    s.set_kinds_and_xmit(
        &BridgeReads::from([("wan".to_string(), vlan(7)), ("lan".to_string(), vlan(10))]),
        all_capable(),
    );
    s.attach_all(&[Some(MAC), Some(MAC)]).unwrap();
    let (a, b) = (&s.dp.vlans[&WAN].2, &s.dp.vlans[&LAN].2);
    assert_eq!(a.slot, b.slot);
    assert_eq!((s.dp.vlans[&WAN].0, s.dp.vlans[&LAN].0), (7, 10));
    assert_eq!(s.ifaces[0].parent_slot, s.ifaces[1].parent_slot);
}
