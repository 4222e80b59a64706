//! VLAN-filtering bridges, their VLANs and the VLAN devices over them.

use super::*;
use crate::sync::{
    bridge::{VlanFiltering, VlanMember, VlanTable},
    vlan::{VlanLink, VlanRead},
};

const F: u32 = IFACE_F_BRIDGE_VLAN_FILTERING;
const P1: u32 = 10;
const P2: u32 = 11;

/// `(vid, pvid, untagged)`s as a VLAN table.
fn table(vlans: &[(u16, bool, bool)]) -> VlanTable {
    vlans
        .iter()
        .map(|&(vid, pvid, untagged)| (vid, VlanMember { pvid, untagged }))
        .collect()
}

/// br (4) as read: ports p1 (10) and p2 (11), both forwarding; VLAN filtering (802.1Q)
/// with these tables when `filtering`.
fn br_read(filtering: Option<(VlanTable, VlanTable, VlanTable)>) -> BridgeRead {
    BridgeRead {
        kind: BridgeKind::Bridge,
        link_kind: Some("bridge".into()),
        mac: Some(BR_MAC),
        ports: vec![port("p1", P1, true), port("p2", P2, true)],
        filtering: filtering.map(|(own, p1, p2)| VlanFiltering {
            tpid: 0x8100,
            own,
            ports: BTreeMap::from([(P1, p1), (P2, p2)]),
        }),
        vlan: None,
    }
}

/// The OpenWrt DSA start: br untagged in VLAN 1 (its PVID), p1 untagged in 1 (PVID) and
/// tagged in 20, p2 untagged in 20 (PVID).
fn dsa_tables() -> (VlanTable, VlanTable, VlanTable) {
    (
        table(&[(1, true, true)]),
        table(&[(1, true, true), (20, false, false)]),
        table(&[(20, true, true)]),
    )
}

fn reads(name: &str, read: BridgeRead) -> BridgeReads {
    BridgeReads::from([(name.to_string(), read)])
}

/// wan (2) and br (4, LAN) as `read`, attached, ports synced, no qdiscs.
fn with_bridge(read: BridgeRead) -> State<FakeDp> {
    let cfgs = [
        iface("wan", Role::Wan, Shaped::Auto),
        iface("br", Role::Lan, Shaped::Auto),
    ];
    let mut s = State::new(
        FakeDp::default(),
        &cfgs,
        &[Some(WAN), Some(BR)],
        XdpModeConfig::Native,
    );
    let r = reads("br", read);
    s.set_kinds_and_xmit(&r, all_capable());
    s.attach_all(&[Some(MAC), Some(BR_MAC)]).unwrap();
    s.sync_bridges(&r);
    s.apply_qdiscs(Ok(Vec::new()));
    s
}

/// A bridge link notification (`bridge vlan add/del`, a `vlan_filtering` toggle) with the
/// bridge read again.
fn notify(s: &mut State<FakeDp>, read: BridgeRead) {
    let batch = vec![RtEvent::LinkUp {
        ifindex: P1,
        name: "p1".into(),
        mac: None,
    }];
    s.apply_rt_events(batch, &BTreeMap::new(), &reads("br", read));
}

#[test]
fn a_vlan_filtering_bridge_is_managed_with_its_vlans() {
    let s = with_bridge(br_read(Some(dsa_tables())));
    assert_eq!(s.ifaces[1].mode, Some(AttachMode::Ports));
    assert_eq!(flags(&s, BR), F);
    assert_eq!(s.dp.attached[&P1], (3, IFACE_F_BRIDGE_PORT | F, BR_MAC));
    assert_eq!(flags(&s, P2), IFACE_F_BRIDGE_PORT | F);
    assert_eq!(
        s.dp.bridge_vlans,
        BTreeMap::from([
            ((BR, 1), true),
            ((P1, 1), true),
            ((P1, 20), false),
            ((P2, 20), true)
        ])
    );
    assert_eq!(
        s.dp.pvids,
        BTreeMap::from([(BR, (0x8100, 1)), (P1, (0x8100, 1)), (P2, (0x8100, 20))])
    );
    // A new port is attached strict (filtering, no PVID, no VLAN) and its PVID written
    // before its memberships.
    let log = &s.dp.vlan_log;
    let at = |e: &str| log.iter().position(|l| l == e).unwrap();
    assert!(at("pvid 11 20") < at("+11/20u"), "{log:?}");
    // The status text.
    assert_eq!(
        vlans_status(&s.ifaces[1].bridge.as_ref().unwrap().vlans).render(),
        "VLANs 1 (PVID, untagged)"
    );
    let p1 = &s.ifaces[1].bridge.as_ref().unwrap().ports[&P1];
    assert_eq!(
        vlans_status(&p1.vlans).render(),
        "VLANs 1 (PVID, untagged), 20"
    );
}

#[test]
fn vlan_changes_are_applied_by_diff_narrowing_first() {
    let mut s = with_bridge(br_read(Some(dsa_tables())));
    s.dp.vlan_log.clear();
    // `bridge vlan del dev p1 vid 1; bridge vlan add dev p1 vid 20 pvid untagged;
    // bridge vlan add dev p1 vid 30`.
    let (own, _, p2) = dsa_tables();
    let p1 = table(&[(20, true, true), (30, false, false)]);
    notify(&mut s, br_read(Some((own, p1, p2))));
    assert_eq!(
        s.dp.vlan_log,
        ["-10/1", "+10/20u", "pvid 10 20", "+10/30"],
        "only p1 changes, narrowing first"
    );
    assert_eq!(s.dp.pvids[&P1], (0x8100, 20));
    // The same read again: nothing written.
    s.dp.vlan_log.clear();
    let (own, _, p2) = dsa_tables();
    let p1 = table(&[(20, true, true), (30, false, false)]);
    notify(&mut s, br_read(Some((own, p1, p2))));
    assert!(s.dp.vlan_log.is_empty(), "{:?}", s.dp.vlan_log);
}

#[test]
fn vlan_filtering_is_followed_on_and_off_live() {
    let mut s = with_bridge(br_read(None));
    assert_eq!(flags(&s, BR), 0);
    assert_eq!(flags(&s, P1), IFACE_F_BRIDGE_PORT);
    assert!(s.dp.bridge_vlans.is_empty() && s.dp.pvids.is_empty());
    // `ip link set br type bridge vlan_filtering 1`: every entry is flagged (strict: no
    // PVID, no VLAN yet) before a VLAN is written.
    notify(&mut s, br_read(Some(dsa_tables())));
    assert_eq!(flags(&s, BR), F);
    assert_eq!(flags(&s, P1), IFACE_F_BRIDGE_PORT | F);
    assert_eq!(s.dp.bridge_vlans.len(), 4);
    let log = s.dp.vlan_log.clone();
    let at = |e: &str| log.iter().position(|l| l == e).unwrap();
    assert!(at("flags 4 filtering") < at("pvid 4 1"), "{log:?}");
    assert!(at("flags 10 filtering") < at("+10/1u"), "{log:?}");
    assert!(at("flags 11 filtering") < at("pvid 11 20"), "{log:?}");
    // Off again: the flag goes first, then the VLANs and PVIDs.
    s.dp.vlan_log.clear();
    notify(&mut s, br_read(None));
    assert_eq!(flags(&s, BR), 0);
    assert_eq!(flags(&s, P2), IFACE_F_BRIDGE_PORT);
    assert!(s.dp.bridge_vlans.is_empty());
    assert!(
        s.dp.pvids.values().all(|p| *p == (0, 0)),
        "{:?}",
        s.dp.pvids
    );
    let log = s.dp.vlan_log.clone();
    let at = |e: &str| log.iter().position(|l| l == e).unwrap();
    assert!(at("flags 10 plain") < at("-10/1"), "{log:?}");
    assert!(at("flags 4 plain") < at("pvid 4 0"), "{log:?}");
}

#[test]
fn fdb_entries_are_per_vlan_and_go_with_the_bridge_as_do_its_vlans() {
    let mut s = with_bridge(br_read(Some(dsa_tables())));
    let mac = [2, 0, 0, 0, 0, 0x42];
    for (vid, port) in [(1, P1), (20, P2)] {
        s.apply_fdb(FdbEvent::Learned {
            bridge: BR,
            mac,
            vid,
            port,
        });
    }
    s.apply_fdb(FdbEvent::Forgotten {
        bridge: BR,
        mac,
        vid: 20,
    });
    assert_eq!(s.dp.fdb, BTreeMap::from([((BR, mac, 1), P1)]));
    assert!(s.link_gone(BR));
    assert!(s.dp.fdb.is_empty());
    assert!(s.dp.bridge_vlans.is_empty() && s.dp.pvids.is_empty());
}

/// A VLAN device over `br` (ifindex 4, MAC `BR_MAC`) with VLAN ID `vid`.
fn vlan_over_br(name: &str, vid: u16) -> BridgeRead {
    BridgeRead {
        link_kind: Some("vlan".into()),
        vlan: Some(VlanRead {
            link: VlanLink {
                parent: BR,
                vid,
                tpid: 0x8100,
            },
            parent_name: name.into(),
            parent_kind: Some("bridge".into()),
            parent_mac: Some(BR_MAC),
        }),
        ..BridgeRead::default()
    }
}

#[test]
fn a_vlan_device_over_a_configured_bridge_tags_through_its_ports() {
    // The VLAN device first in the config: the bridge's own entry replaces the one its
    // VLAN device registered.
    let cfgs = [
        iface("br.20", Role::Lan, Shaped::Never),
        iface("br", Role::Lan, Shaped::Never),
    ];
    let mut s = State::new(
        FakeDp::default(),
        &cfgs,
        &[Some(7), Some(BR)],
        XdpModeConfig::Native,
    );
    let r = BridgeReads::from([
        ("br.20".to_string(), vlan_over_br("br", 20)),
        ("br".to_string(), br_read(Some(dsa_tables()))),
    ]);
    s.set_kinds_and_xmit(&r, all_capable());
    s.attach_all(&[Some(BR_MAC), Some(BR_MAC)]).unwrap();
    s.sync_bridges(&r);
    assert!(s.has_bridges());
    assert_eq!(s.ifaces[0].mode, Some(AttachMode::Ports));
    let (vid, _, parent) = &s.dp.vlans[&7];
    assert_eq!((*vid, parent.ifindex), (20, BR));
    // The bridge is managed once, as configured: no parent bridge of its own.
    assert!(s.parent_bridges.is_empty());
    assert_eq!(flags(&s, BR) & (IFACE_F_VLAN_PARENT | F), F);
    assert!(s.dp.attached.contains_key(&P1) && s.dp.attached.contains_key(&P2));
}

/// The OpenWrt DSA config: `br-lan.1` (7) and `br-lan.2` (8) over the filtering bridge
/// `br-lan` (4), which is not in the config, with lan1 (10) untagged in 1 and lan2 (11)
/// untagged in 2; the bridge tagged in both.
fn dsa() -> State<FakeDp> {
    let cfgs = [
        iface("wan", Role::Wan, Shaped::Never),
        iface("br-lan.1", Role::Lan, Shaped::Never),
        iface("br-lan.2", Role::Lan, Shaped::Never),
    ];
    let mut s = State::new(
        FakeDp::default(),
        &cfgs,
        &[Some(WAN), Some(7), Some(8)],
        XdpModeConfig::Native,
    );
    let mut bridge = br_read(Some((
        table(&[(1, false, false), (2, false, false)]),
        table(&[(1, true, true)]),
        table(&[(2, true, true)]),
    )));
    bridge.ports = vec![port("lan1", P1, true), port("lan2", P2, true)];
    let r = BridgeReads::from([
        ("br-lan.1".to_string(), vlan_over_br("br-lan", 1)),
        ("br-lan.2".to_string(), vlan_over_br("br-lan", 2)),
        ("br-lan".to_string(), bridge),
    ]);
    s.set_kinds_and_xmit(&r, all_capable());
    s.attach_all(&[Some(MAC), Some(BR_MAC), Some(BR_MAC)])
        .unwrap();
    assert!(s.has_bridges());
    s.sync_bridges(&r);
    s.apply_qdiscs(Ok(Vec::new()));
    s
}

#[test]
fn a_bridge_under_configured_vlan_devices_is_managed_for_them() {
    let mut s = dsa();
    assert_eq!(s.ifaces[1].mode, Some(AttachMode::Ports));
    // The bridge: managed only as a VLAN parent, filtering, no redirect target.
    let pb = &s.parent_bridges[&BR];
    assert_eq!(pb.name, "br-lan");
    assert_eq!(
        flags(&s, BR),
        IFACE_F_BRIDGE | IFACE_F_VLAN_PARENT | F | IFACE_F_NO_XDP_XMIT
    );
    assert_eq!(s.dp.attached[&BR].0, s.ifaces[1].parent_slot);
    // Its ports: attached natively, filtering, with their VLANs; VLAN parents' ports (what
    // they receive for the bridge itself goes to the kernel).
    assert_eq!(flags(&s, P1), IFACE_F_BRIDGE_PORT | F | IFACE_F_VLAN_PARENT);
    assert_eq!(s.dp.attached[&P2].2, BR_MAC);
    assert_eq!(
        s.dp.bridge_vlans,
        BTreeMap::from([
            ((BR, 1), false),
            ((BR, 2), false),
            ((P1, 1), true),
            ((P2, 2), true)
        ])
    );
    assert_eq!(s.dp.pvids[&BR], (0x8100, 0));
    // Its FDB is copied, its ports' qdiscs and hooks followed.
    let mac = [2, 0, 0, 0, 0, 0x42];
    s.apply_fdb(FdbEvent::Learned {
        bridge: BR,
        mac,
        vid: 2,
        port: P2,
    });
    assert_eq!(s.dp.fdb.len(), 1);
    assert!(s.has_egress_of(P1));
    assert!(s.hook_names().contains(&"lan2".to_string()));
    s.apply_qdiscs(Ok(vec![root(P2, "htb")]));
    assert_eq!(
        flags(&s, P2),
        IFACE_F_BRIDGE_PORT | F | IFACE_F_VLAN_PARENT | IFACE_F_SHAPED
    );
    s.apply_hooks(&hooks::Found {
        devices: BTreeMap::new(),
        bridge_ports: Hooks {
            ingress: true,
            egress: false,
        },
    });
    assert_eq!(
        flags(&s, P1),
        IFACE_F_BRIDGE_PORT | F | IFACE_F_VLAN_PARENT | IFACE_F_INGRESS_HOOK
    );
    // Filtering switched off: the bridge's own entry and its ports' follow.
    let mut plain = br_read(None);
    plain.ports = vec![port("lan1", P1, true), port("lan2", P2, true)];
    let r = BridgeReads::from([("br-lan".to_string(), plain)]);
    s.sync_bridges(&r);
    assert_eq!(flags(&s, BR) & F, 0);
    assert_eq!(flags(&s, P1) & F, 0);
    assert!(s.dp.bridge_vlans.is_empty());
}

#[test]
fn a_parent_bridge_goes_with_its_last_vlan_device() {
    let mut s = dsa();
    s.apply_fdb(FdbEvent::Learned {
        bridge: BR,
        mac: MAC,
        vid: 1,
        port: P1,
    });
    assert!(s.link_gone(7));
    assert!(
        s.parent_bridges.contains_key(&BR),
        "br-lan.2 is still over it"
    );
    assert!(s.dp.attached.contains_key(&P1));
    assert!(s.link_gone(8));
    assert!(s.parent_bridges.is_empty());
    for i in [BR, P1, P2] {
        assert!(!s.dp.attached.contains_key(&i), "{i} still attached");
    }
    assert!(s.dp.fdb.is_empty() && s.dp.bridge_vlans.is_empty());
    // br-lan.1 comes back: the bridge and its ports are managed again.
    let mut bridge = br_read(Some(dsa_tables()));
    bridge.ports = vec![port("lan1", P1, true)];
    let r = BridgeReads::from([
        ("br-lan.1".to_string(), vlan_over_br("br-lan", 1)),
        ("br-lan".to_string(), bridge),
    ]);
    let batch = vec![RtEvent::LinkUp {
        ifindex: 9,
        name: "br-lan.1".into(),
        mac: Some(BR_MAC),
    }];
    let (_, reread) = s.apply_rt_events(batch, &BTreeMap::new(), &r);
    assert!(reread, "the new port's qdiscs must be read");
    assert!(s.parent_bridges.contains_key(&BR));
    assert_eq!(
        flags(&s, P1),
        IFACE_F_BRIDGE_PORT | F | IFACE_F_VLAN_PARENT | IFACE_F_SHAPED
    );
}

/// A VLAN over a VLAN device (stacked VLANs) is carried only by the TC fast path on itself:
/// attached otherwise, its status says it is left to the kernel.
#[test]
fn a_vlan_over_a_vlan_device_is_carried_on_tc_only() {
    let mut m = state().ifaces.remove(0);
    m.set_vlan(Some(VlanRead {
        link: VlanLink {
            parent: 20,
            vid: 30,
            tpid: 0x8100,
        },
        parent_name: "eth0.7".into(),
        parent_kind: Some("vlan".into()),
        parent_mac: Some(MAC),
    }));
    assert_eq!(
        m.not_accelerated_because().as_deref(),
        Some(
            "a VLAN over the VLAN device eth0.7 (stacked VLANs), not on the TC fast path: left \
             to the kernel"
        )
    );
    // On the TC fast path on itself, it is carried.
    m.mode = Some(AttachMode::Tc);
    assert_eq!(m.not_accelerated_because(), None);
}
