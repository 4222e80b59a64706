//! Managed bridges: ports attached and detached with their flags, hooks on bridge ports, the
//! FDB copy, and XDP transmit judgements of the interfaces and the ports.

use super::*;

#[test]
fn a_bridge_is_managed_through_its_ports() {
    let mut s = bridged();
    assert_eq!(s.ifaces[1].mode, Some(AttachMode::Ports));
    // Ports get the bridge's MAC and stats slots after the configured interfaces'.
    assert_eq!(s.dp.attached[&10], (3, IFACE_F_BRIDGE_PORT, BR_MAC));
    assert_eq!(
        s.dp.attached[&11],
        (4, IFACE_F_BRIDGE_PORT | IFACE_F_PORT_NOT_FORWARDING, BR_MAC)
    );
    // p2 starts forwarding, p1 leaves, p3 joins; the bridge's MAC changes.
    let mac = [2, 0, 0, 0, 0, 0xc];
    let read = BridgeRead {
        kind: BridgeKind::Bridge,
        link_kind: Some("bridge".into()),
        mac: Some(mac),
        ports: vec![port("p2", 11, true), port("p3", 12, true)],
        filtering: None,
        vlan: None,
    };
    let reads = BridgeReads::from([("br".to_string(), read)]);
    let batch = vec![RtEvent::LinkGone {
        ifindex: 10,
        name: "p1".into(),
    }];
    let (_, reread) = s.apply_rt_events(batch, &BTreeMap::new(), &reads);
    assert!(reread, "a new port's qdiscs must be read");
    assert!(!s.dp.attached.contains_key(&10));
    assert_eq!(s.dp.attached[&11], (4, IFACE_F_BRIDGE_PORT, mac));
    // A new port counts as shaped until its qdiscs are read; slots are never reused.
    assert_eq!(
        s.dp.attached[&12],
        (5, IFACE_F_BRIDGE_PORT | IFACE_F_SHAPED, mac)
    );
    s.apply_qdiscs(Ok(Vec::new()));
    assert_eq!(flags(&s, 12), IFACE_F_BRIDGE_PORT);
    // A qdisc change on a port is followed like one on a managed interface.
    let qdisc_on = |ifindex| vec![RtEvent::QdiscChanged { ifindex }];
    let none = BTreeMap::new();
    assert_eq!(
        s.apply_rt_events(qdisc_on(12), &none, &BridgeReads::new()),
        (Stale::default(), true)
    );
    s.apply_qdiscs(Ok(vec![root(12, "htb")]));
    assert_eq!(flags(&s, 12), IFACE_F_BRIDGE_PORT | IFACE_F_SHAPED);
    assert_eq!(
        s.apply_rt_events(qdisc_on(99), &none, &BridgeReads::new()),
        (Stale::default(), false)
    );
}

#[test]
fn bridge_family_chains_hook_the_ports_not_the_wan() {
    let mut s = bridged();
    let found = hooks::Found {
        devices: BTreeMap::new(),
        bridge_ports: Hooks {
            ingress: true,
            egress: false,
        },
    };
    s.apply_hooks(&found);
    assert_eq!(flags(&s, 10), IFACE_F_BRIDGE_PORT | IFACE_F_INGRESS_HOOK);
    assert_eq!(
        flags(&s, 11),
        IFACE_F_BRIDGE_PORT | IFACE_F_PORT_NOT_FORWARDING | IFACE_F_INGRESS_HOOK
    );
    assert_eq!(flags(&s, WAN), 0);
    // The chain is deleted.
    s.apply_hooks(&hooks::Found::default());
    assert_eq!(flags(&s, 10), IFACE_F_BRIDGE_PORT);
}

#[test]
fn bridge_fdb_is_copied_and_cleared_with_the_bridge() {
    let mut s = bridged();
    let mac = [2, 0, 0, 0, 0, 0x42];
    let learned = |bridge| FdbEvent::Learned {
        bridge,
        mac,
        vid: 0,
        port: 11,
    };
    let batch = vec![RtEvent::Fdb(learned(BR)), RtEvent::Fdb(learned(99))];
    s.apply_rt_events(batch, &BTreeMap::new(), &BridgeReads::new());
    // Only the managed bridge's entries are copied.
    assert_eq!(s.dp.fdb, BTreeMap::from([((BR, mac, 0), 11)]));
    s.apply_fdb(FdbEvent::Forgotten {
        bridge: BR,
        mac,
        vid: 0,
    });
    assert!(s.dp.fdb.is_empty());
    s.apply_fdb(learned(BR));
    // The bridge goes: its ports are detached and its FDB copy forgotten.
    assert!(s.link_gone(BR));
    assert!(s.dp.fdb.is_empty());
    assert_eq!(s.dp.attached.keys().copied().collect::<Vec<_>>(), [WAN]);
}

#[test]
fn an_fdb_reload_after_an_overrun_replaces_stale_entries() {
    let mut s = bridged();
    let (moved, gone, kept) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 3]);
    let learned = |mac, port| FdbEvent::Learned {
        bridge: BR,
        mac,
        vid: 0,
        port,
    };
    for ev in [learned(moved, 10), learned(gone, 10), learned(kept, 11)] {
        s.apply_fdb(ev);
    }
    // Notifications lost in an overrun: `moved` went to port 11, `gone` aged out. The dump
    // says so (an unmanaged bridge's entry in it is ignored).
    let other = FdbEvent::Learned {
        bridge: 99,
        mac: kept,
        vid: 0,
        port: 10,
    };
    s.reload_fdb(vec![learned(moved, 11), learned(kept, 11), other]);
    assert_eq!(
        s.dp.fdb,
        BTreeMap::from([((BR, moved, 0), 11), ((BR, kept, 0), 11)])
    );
}

#[test]
fn xdp_features_changes_flip_no_xdp_xmit() {
    let mut s = bridged();
    assert_eq!(flags(&s, WAN), 0);
    // wan's veth peer loses XDP and GRO; p1 too.
    for ifindex in [WAN, 10] {
        s.apply_xmit_event(XmitEvent::Features {
            ifindex,
            xdp_features: 0x23,
        });
    }
    assert_eq!(flags(&s, WAN), IFACE_F_NO_XDP_XMIT);
    assert_eq!(flags(&s, 10), IFACE_F_BRIDGE_PORT | IFACE_F_NO_XDP_XMIT);
    s.apply_xmit_event(XmitEvent::Features {
        ifindex: WAN,
        xdp_features: NETDEV_XDP_ACT_NDO_XMIT,
    });
    assert_eq!(flags(&s, WAN), 0);
    // A device the kernel has not reported is not redirected to.
    s.apply_xmit_event(XmitEvent::Gone { ifindex: WAN });
    assert_eq!(flags(&s, WAN), IFACE_F_NO_XDP_XMIT);
}

#[test]
fn without_the_netdev_family_xmit_is_judged_by_the_link_kind_read_outside_the_lock() {
    let cfgs = [iface("wan", Role::Wan, Shaped::Never)];
    let mut s = State::new(
        FakeDp::default(),
        &cfgs,
        &[Some(WAN)],
        XdpModeConfig::Native,
    );
    let ppp = BridgeRead {
        link_kind: Some("ppp".into()),
        ..BridgeRead::default()
    };
    s.set_kinds_and_xmit(
        &BridgeReads::from([("wan".to_string(), ppp.clone())]),
        Capabilities::new(None),
    );
    s.attach_all(&[Some(MAC)]).unwrap();
    assert_eq!(flags(&s, WAN), IFACE_F_NO_XDP_XMIT);
    // The device is replaced by a plain Ethernet one: assumed to transmit.
    assert!(s.link_up(8, "wan", Some(MAC), &BridgeRead::default()));
    assert_eq!(flags(&s, 8), 0);
    assert!(s.link_up(9, "wan", Some(MAC), &ppp));
    assert_eq!(flags(&s, 9), IFACE_F_NO_XDP_XMIT);
}
