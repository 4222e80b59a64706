//! PPP devices and their PPPoE sessions: bound, rebound and unbound over their lower device
//! (managed for the session only unless configured), CCP, VLAN lower devices, ambiguous reads.

use super::*;

/// ppp0 (ifindex 12) and lan, with `wan_eth0` also managing eth0 (ifindex 20) as a WAN of its
/// own; ppp0 is attached (registered, no session yet).
fn with_ppp0(wan_eth0: bool) -> State<FakeDp> {
    let mut cfgs = vec![
        iface("ppp0", Role::Wan, Shaped::Never),
        iface("lan", Role::Lan, Shaped::Never),
    ];
    let mut ifindexes = vec![Some(12), Some(LAN)];
    if wan_eth0 {
        cfgs.push(iface("eth0", Role::Wan, Shaped::Never));
        ifindexes.push(Some(20));
    }
    let mut s = State::new(FakeDp::default(), &cfgs, &ifindexes, XdpModeConfig::Native);
    let ppp = BridgeRead {
        link_kind: Some("ppp".into()),
        ..BridgeRead::default()
    };
    s.set_kinds_and_xmit(
        &BridgeReads::from([("ppp0".to_string(), ppp)]),
        all_capable(),
    );
    s.apply_qdiscs(Ok(Vec::new()));
    let macs = [None, Some(MAC), Some([2, 0, 0, 0, 0, 0x20])];
    s.attach_all(&macs[..cfgs.len()]).unwrap();
    s
}

/// What a read of /proc/net/pppoe finds for ppp0: `sid` (as held) over eth0 (ifindex 20).
fn session_over_eth0(sid_be: u16) -> crate::sync::pppoe::PppoeReads {
    use crate::sync::pppoe::{LowerRead, Session, SessionRead};
    BTreeMap::from([(
        "ppp0".to_string(),
        Ok(SessionRead {
            session: Session {
                sid_be,
                peer: [0x52, 0x54, 0, 0x12, 0x34, 0x56],
                lower: "eth0".into(),
            },
            lower: LowerRead {
                ifindex: 20,
                kind: None,
                mac: Some([2, 0, 0, 0, 0, 0x20]),
                vlan: None,
            },
            ccp: false,
        }),
    )])
}

fn no_session() -> crate::sync::pppoe::PppoeReads {
    BTreeMap::from([(
        "ppp0".to_string(),
        Err(crate::sync::pppoe::Unpaired::NoSession),
    )])
}

/// ppp0 is registered without XDP; its session binds it over eth0, which is managed only for
/// it (IFACE_F_PPPOE_LOWER, its own slot, shaped until its qdiscs are read); a new session ID
/// rebinds it over the same lower device; the session gone, eth0 is let go.
#[test]
fn a_ppp_device_follows_its_pppoe_session() {
    let mut s = with_ppp0(false);
    assert_eq!(s.ifaces[0].mode, Some(AttachMode::Lower));
    assert!(s.dp.ppp.contains_key(&12));
    assert_eq!(flags(&s, 12) & IFACE_F_PPPOE, 0, "no session yet");
    assert_eq!(s.pppoe_devices(), vec![("ppp0".to_string(), None)]);
    assert!(
        s.ifaces[0]
            .pppoe_status()
            .unwrap()
            .not_accelerated_because
            .is_some()
    );

    assert!(
        s.apply_pppoe(&session_over_eth0(0x0100)),
        "a new lower device"
    );
    assert_eq!(s.dp.pppoe, BTreeMap::from([((20, 0x0100), 12)]));
    assert_eq!(flags(&s, 12) & IFACE_F_PPPOE, IFACE_F_PPPOE);
    let (slot, lower_flags, mac) = s.dp.attached[&20];
    assert_eq!(mac, [2, 0, 0, 0, 0, 0x20]);
    assert!(slot > 2, "a slot of its own");
    assert_eq!(lower_flags, IFACE_F_PPPOE_LOWER | IFACE_F_SHAPED);
    assert!(s.hook_names().contains(&"eth0".to_string()));
    // Its qdiscs read: its flags follow them (the datapath keeps IFACE_F_PPPOE_LOWER).
    s.apply_qdiscs(Ok(vec![root(20, "cake")]));
    assert_eq!(flags(&s, 20), IFACE_F_PPPOE_LOWER | IFACE_F_SHAPED);
    s.apply_qdiscs(Ok(Vec::new()));
    assert_eq!(flags(&s, 20), IFACE_F_PPPOE_LOWER);
    // Its XDP transmit judgement too.
    s.apply_xmit_event(XmitEvent::Gone { ifindex: 20 });
    assert_eq!(flags(&s, 20), IFACE_F_PPPOE_LOWER | IFACE_F_NO_XDP_XMIT);
    s.apply_xmit_event(XmitEvent::Features {
        ifindex: 20,
        xdp_features: NETDEV_XDP_ACT_NDO_XMIT,
    });
    assert_eq!(flags(&s, 20), IFACE_F_PPPOE_LOWER);
    let st = s.ifaces[0].pppoe_status().unwrap();
    assert_eq!(st.lower.as_deref(), Some("eth0"));
    assert_eq!(st.session_id, Some(u16::from_be(0x0100)));
    assert_eq!(st.not_accelerated_because, None);
    if cfg!(target_endian = "little") {
        assert_eq!(
            s.ifaces[0].pppoe_encap().as_deref(),
            Some("PPPoE session 0x0001 over eth0 (peer 52:54:00:12:34:56)")
        );
    }

    // The same read again changes nothing.
    assert!(!s.apply_pppoe(&session_over_eth0(0x0100)));
    // pppd set the session up again: the old key goes, the new one comes, same lower.
    assert!(!s.apply_pppoe(&session_over_eth0(0x0200)));
    assert_eq!(s.dp.pppoe, BTreeMap::from([((20, 0x0200), 12)]));
    assert_eq!(s.dp.attached[&20].0, slot);

    // Gone: nothing decapsulated any more, eth0 no longer managed.
    assert!(!s.apply_pppoe(&no_session()));
    assert!(s.dp.pppoe.is_empty());
    assert!(!s.dp.attached.contains_key(&20));
    assert_eq!(flags(&s, 12) & IFACE_F_PPPOE, 0);
    assert_eq!(
        s.ifaces[0]
            .pppoe_status()
            .unwrap()
            .not_accelerated_because
            .as_deref(),
        Some("no PPPoE session in /proc/net/pppoe")
    );
    assert_eq!(s.ifaces[0].pppoe_encap(), None);

    // Back, then ppp0 goes: its session and lower device go with it; it comes back unbound.
    s.apply_pppoe(&session_over_eth0(0x0300));
    assert!(s.link_gone(12));
    assert!(s.dp.pppoe.is_empty());
    assert!(!s.dp.attached.contains_key(&20));
    assert!(s.pppoe_devices().is_empty());
    let ppp = BridgeRead {
        link_kind: Some("ppp".into()),
        ..BridgeRead::default()
    };
    assert!(s.link_up(13, "ppp0", None, &ppp));
    assert_eq!(s.ifaces[0].pppoe.as_ref().unwrap().bound, None);
    assert!(s.apply_pppoe(&session_over_eth0(0x0300)));
    assert_eq!(s.dp.pppoe, BTreeMap::from([((20, 0x0300), 13)]));
}

/// CCP found running on a bound PPP device (`SIOCGPPPCSTATS`): the session is bound again,
/// with `ccp` for the datapath (which binds it on TC, where the kernel's PPP layer sees every
/// packet, or refuses it); the same read again changes nothing.
#[test]
fn a_ppp_device_on_which_ccp_runs_is_bound_again_with_ccp() {
    let mut s = with_ppp0(false);
    s.apply_pppoe(&session_over_eth0(0x0100));
    assert_eq!(s.dp.ppp[&12].as_ref().map(|b| b.ccp), Some(false));
    let mut ccp = session_over_eth0(0x0100);
    if let Some(Ok(read)) = ccp.get_mut("ppp0") {
        read.ccp = true;
    }
    s.apply_pppoe(&ccp);
    assert_eq!(s.dp.ppp[&12].as_ref().map(|b| b.ccp), Some(true));
    assert!(
        s.ifaces[0]
            .pppoe_status()
            .unwrap()
            .not_accelerated_because
            .is_none()
    );
    let bound = s.dp.ppp[&12].clone();
    assert!(!s.apply_pppoe(&ccp));
    assert_eq!(s.dp.ppp[&12], bound);
}

/// A lower device that is in the config stays what it is: no IFACE_F_PPPOE_LOWER, its own
/// slot and flags, and it stays managed when the session goes.
#[test]
fn a_configured_lower_device_is_not_managed_for_the_session() {
    let mut s = with_ppp0(true);
    let before = s.dp.attached[&20];
    assert!(
        !s.apply_pppoe(&session_over_eth0(0x0100)),
        "eth0 is read already"
    );
    assert_eq!(s.dp.attached[&20], before);
    assert_eq!(s.dp.ppp[&12].as_ref().unwrap().lower.slot, 0);
    assert_eq!(s.dp.pppoe.len(), 1);
    s.apply_pppoe(&no_session());
    assert_eq!(s.dp.attached[&20], before);
}

/// PPPoE over a VLAN device that is not in the config (eth0.7 over eth0): registered as a VLAN
/// device over its parent, for the session only.
#[test]
fn a_vlan_lower_device_is_registered_over_its_parent() {
    use crate::sync::vlan::{VlanLink, VlanRead};
    let mut s = with_ppp0(false);
    let mut found = session_over_eth0(0x0100);
    if let Some(Ok(r)) = found.get_mut("ppp0") {
        r.session.lower = "eth0.7".into();
        r.lower.ifindex = 21;
        r.lower.kind = Some("vlan".into());
        r.lower.vlan = Some(VlanRead {
            link: VlanLink {
                parent: 20,
                vid: 7,
                tpid: 0x8100,
            },
            parent_name: "eth0".into(),
            parent_kind: None,
            parent_mac: Some([2, 0, 0, 0, 0, 0x20]),
        });
    }
    assert!(s.apply_pppoe(&found));
    assert_eq!(s.dp.pppoe, BTreeMap::from([((21, 0x0100), 12)]));
    let (vid, _, parent) = &s.dp.vlans[&21];
    assert_eq!((*vid, parent.ifindex), (7, 20));
    assert_eq!(
        s.dp.attached[&21].1 & IFACE_F_PPPOE_LOWER,
        IFACE_F_PPPOE_LOWER
    );
    assert!(s.dp.attached.contains_key(&20));
    let names = s.hook_names();
    assert!(names.contains(&"eth0.7".to_string()) && names.contains(&"eth0".to_string()));
    // Both get their own slots, and flags from their own qdiscs (a VLAN device cannot
    // transmit XDP frames itself: its parent does).
    s.apply_qdiscs(Ok(vec![root(20, "htb")]));
    assert_eq!(flags(&s, 20), IFACE_F_SHAPED);
    assert_ne!(s.dp.attached[&20].0, s.dp.attached[&21].0);
}

/// A session that cannot be told apart is not bound, and says why.
#[test]
fn an_ambiguous_session_is_not_bound() {
    use crate::sync::pppoe::Unpaired;
    let mut s = with_ppp0(false);
    let several = BTreeMap::from([("ppp0".to_string(), Err(Unpaired::Several(2)))]);
    assert!(!s.apply_pppoe(&several));
    assert!(s.dp.pppoe.is_empty());
    let why = s.ifaces[0]
        .pppoe_status()
        .unwrap()
        .not_accelerated_because
        .unwrap();
    assert!(why.contains("pppoe_device"), "{why}");
}

/// Where the datapath runs TC on a PPP device without a paired session (L2TP, PPTP, a serial
/// modem: nothing in /proc/net/pppoe), ppp0 is carried on TC and its status says nothing is
/// left out; a session found later binds it over its lower device instead, and when that goes
/// the device is carried on TC again.
#[test]
fn a_ppp_device_without_a_pppoe_session_is_carried_on_tc() {
    let mut s = with_ppp0(false);
    s.dp.unpaired_ppp_on_tc = true;
    let not_accelerated =
        |s: &State<FakeDp>| s.ifaces[0].pppoe_status().unwrap().not_accelerated_because;
    assert!(!s.apply_pppoe(&no_session()));
    assert_eq!(flags(&s, 12) & IFACE_F_L3, IFACE_F_L3, "on TC, as wg0");
    assert!(s.ifaces[0].pppoe.as_ref().unwrap().unpaired_on_tc);
    assert_eq!(not_accelerated(&s), None);
    let why = |s: &State<FakeDp>| s.dp.unpaired_why.get(&12).cloned();
    assert_eq!(
        why(&s).as_deref(),
        Some("no PPPoE session in /proc/net/pppoe")
    );
    // The same read changes nothing; another unpaired one only the reason status gives.
    assert!(!s.apply_pppoe(&no_session()));
    assert_eq!(flags(&s, 12) & IFACE_F_L3, IFACE_F_L3);
    let several = BTreeMap::from([(
        "ppp0".to_string(),
        Err(crate::sync::pppoe::Unpaired::Several(2)),
    )]);
    assert!(!s.apply_pppoe(&several));
    assert_eq!(flags(&s, 12) & IFACE_F_L3, IFACE_F_L3);
    assert!(s.ifaces[0].pppoe.as_ref().unwrap().unpaired_on_tc);
    assert!(
        why(&s).is_some_and(|w| w.starts_with("2 PPPoE sessions")),
        "{:?}",
        why(&s)
    );

    // A session: bound over eth0, no longer on TC by itself.
    assert!(s.apply_pppoe(&session_over_eth0(0x0100)));
    assert_eq!(flags(&s, 12) & (IFACE_F_L3 | IFACE_F_PPPOE), IFACE_F_PPPOE);
    assert!(!s.ifaces[0].pppoe.as_ref().unwrap().unpaired_on_tc);
    assert_eq!(why(&s), None);

    // Gone again: on TC again, eth0 let go.
    assert!(!s.apply_pppoe(&no_session()));
    assert_eq!(flags(&s, 12) & (IFACE_F_L3 | IFACE_F_PPPOE), IFACE_F_L3);
    assert!(!s.dp.attached.contains_key(&20));
    assert_eq!(not_accelerated(&s), None);

    // Where the datapath does not (`datapath = "xdp"`, no TC): unbound, and status says why.
    s.dp.unpaired_ppp_on_tc = false;
    s.apply_pppoe(&session_over_eth0(0x0200));
    assert!(!s.apply_pppoe(&no_session()));
    assert_eq!(flags(&s, 12) & (IFACE_F_L3 | IFACE_F_PPPOE), 0);
    assert_eq!(
        not_accelerated(&s).as_deref(),
        Some("no PPPoE session in /proc/net/pppoe")
    );
}
