//! State transitions against an in-memory datapath ([`FakeDp`], `fake_dp.rs`): links come, go and change
//! MAC; qdiscs and hooks change the interface flags; conntrack events become flows; rtnetlink
//! batches ask for revalidation. The device kinds have a file each: `bridge.rs`, `vlan.rs`,
//! `pppoe.rs`, `vlan_filtering.rs`. (The netns tests cover the same with a real kernel.)

use std::{
    collections::{BTreeMap, HashSet},
    net::IpAddr,
};

use aya::maps::MapError;
use xdp_router_common::{
    ArmKeyV4, ArmKeyV6, FlowKeyV4, FlowKeyV6, FlowV4, FlowV6, IFACE_F_BRIDGE, IFACE_F_BRIDGE_PORT,
    IFACE_F_BRIDGE_VLAN_FILTERING, IFACE_F_INGRESS_HOOK, IFACE_F_L3, IFACE_F_NO_XDP_XMIT,
    IFACE_F_PORT_NOT_FORWARDING, IFACE_F_PPPOE, IFACE_F_PPPOE_LOWER, IFACE_F_SHAPED,
    IFACE_F_VLAN_PARENT,
};

use super::{view::vlans_status, *};
use crate::config::{Role, Shaped};
use crate::sync::{
    bridge::{BridgeKind, BridgeRead, BridgeReads, FdbEvent, PortInfo},
    hooks::{self, Hooks},
    qdisc::Qdisc,
    xdp_xmit::{NETDEV_XDP_ACT_NDO_XMIT, XmitEvent},
};
use crate::{
    datapath::{AttachMode, PppoeBinding, VlanParent},
    flows::{
        FlowTable,
        conntrack::{CtEntry, CtEvent, CtStatus, CtTuple},
        fake::FakeTable,
    },
    paths::{Stale, prefix::Prefix},
    sync::rtnl::RtEvent,
};

mod bridge;
mod fake_dp;
mod l3;
mod pppoe;
mod vlan;
mod vlan_filtering;

use fake_dp::FakeDp;

const WAN: u32 = 2;
const LAN: u32 = 3;
const MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];

fn iface(name: &str, role: Role, shaped: Shaped) -> InterfaceConfig {
    InterfaceConfig {
        name: name.into(),
        role,
        shaped,
        bypass_hooks: false,
        pppoe_device: None,
        datapath: None,
    }
}

/// wan (ifindex 2, shaped = auto) and lan (ifindex 3, shaped = false), attached, with no qdiscs.
fn state() -> State<FakeDp> {
    wan_and_lan("wan", Shaped::Auto, Some(WAN), Some(MAC))
}

/// The WAN `wan` (at `wan_ifindex`, with `wan_mac`) and lan (ifindex 3, shaped = false), every
/// present one attached, with no qdiscs.
fn wan_and_lan(
    wan: &str,
    shaped: Shaped,
    wan_ifindex: Option<u32>,
    wan_mac: Option<[u8; 6]>,
) -> State<FakeDp> {
    let cfgs = [
        iface(wan, Role::Wan, shaped),
        iface("lan", Role::Lan, Shaped::Never),
    ];
    let mut s = State::new(
        FakeDp::default(),
        &cfgs,
        &[wan_ifindex, Some(LAN)],
        XdpModeConfig::Native,
    );
    s.set_kinds_and_xmit(&BridgeReads::new(), all_capable());
    s.apply_qdiscs(Ok(Vec::new()));
    s.attach_all(&[wan_mac, Some(MAC)]).unwrap();
    s
}

/// The kernel reports `NETDEV_XDP_ACT_NDO_XMIT` for ifindexes 1 to 31.
fn all_capable() -> Capabilities {
    Capabilities::new(Some(
        (1..32).map(|i| (i, NETDEV_XDP_ACT_NDO_XMIT)).collect(),
    ))
}

fn flags(s: &State<FakeDp>, ifindex: u32) -> u32 {
    s.dp.attached[&ifindex].1
}

fn root(ifindex: u32, kind: &str) -> Qdisc {
    Qdisc {
        ifindex,
        handle: 0x1_0000,
        parent: 0xffff_ffff,
        kind: kind.into(),
        max_rate: None,
    }
}

/// Answers like the kernel for 10.0.1.0/24 behind lan, everything else behind wan.
struct Routes(u32);

impl crate::flows::PathOracle for Routes {
    fn ingress_for(&self, addr: IpAddr) -> Option<u32> {
        match addr {
            IpAddr::V4(a) if a.octets()[..3] == [10, 0, 1] => Some(LAN),
            _ if addr == "203.0.113.1".parse::<IpAddr>().unwrap() => None,
            _ => Some(self.0),
        }
    }
    fn is_local(&self, addr: IpAddr) -> bool {
        addr == "203.0.113.1".parse::<IpAddr>().unwrap()
    }
}

fn tuple(src: &str, sport: u16, dst: &str, dport: u16) -> CtTuple {
    CtTuple {
        src: src.parse().unwrap(),
        dst: dst.parse().unwrap(),
        proto: 6,
        sport,
        dport,
    }
}

fn snat(sport: u16) -> CtEntry {
    CtEntry {
        id: None,
        orig: tuple("10.0.1.2", sport, "198.51.100.7", 443),
        reply: tuple("198.51.100.7", 443, "203.0.113.1", sport),
        // IPS_SEEN_REPLY | IPS_ASSURED
        status: CtStatus::from_bits_retain(0b110),
        tcp_flags: None,
        tcp_state: Some(3),
        timeout: Some(300),
        mark: 0,
        zone: 0,
        has_helper: false,
    }
}

#[test]
fn start_up_attaches_every_interface_with_its_role() {
    let s = state();
    assert_eq!(flags(&s, WAN), 0);
    assert_eq!(flags(&s, LAN), 0);
    assert_eq!(s.dp.attached[&WAN].0, 1, "slots follow the config order");
    assert_eq!(s.dp.attached[&LAN].0, 2);
}

#[test]
fn shaped_auto_follows_the_root_qdisc_and_a_failed_read() {
    let mut s = state();
    s.apply_qdiscs(Ok(vec![root(WAN, "htb"), root(LAN, "htb")]));
    assert_eq!(flags(&s, WAN), IFACE_F_SHAPED);
    // shaped = false: the shaper is bypassed.
    assert_eq!(flags(&s, LAN), 0);
    s.apply_qdiscs(Ok(vec![root(WAN, "pfifo_fast")]));
    assert_eq!(flags(&s, WAN), 0);
    // A failed read: in doubt the fast path does not send out of it.
    s.apply_qdiscs(Err(std::io::Error::other("EPERM")));
    assert_eq!(flags(&s, WAN), IFACE_F_SHAPED);
    assert_eq!(s.ifaces[0].shaped_by().as_deref(), Some("unknown qdiscs"));
}

#[test]
fn hooks_set_flags_unless_bypassed() {
    let mut s = state();
    let found = hooks::Found {
        devices: BTreeMap::from([(
            "lan".to_string(),
            Hooks {
                ingress: true,
                egress: false,
            },
        )]),
        // Bridge chains do not touch interfaces that are not bridge ports.
        bridge_ports: Hooks {
            ingress: true,
            egress: true,
        },
    };
    s.apply_hooks(&found);
    assert_eq!(flags(&s, LAN), IFACE_F_INGRESS_HOOK);
    s.ifaces[1].cfg.bypass_hooks = true;
    s.ifaces[1].hooks = Hooks::default();
    s.apply_hooks(&found);
    assert_eq!(flags(&s, LAN), 0);
    s.apply_hooks(&hooks::Found::default());
    assert_eq!(flags(&s, LAN), 0);
}

#[test]
fn conntrack_events_become_flows_and_destroy_removes_them() {
    let mut s = state();
    let routes = Routes(WAN);
    let added = s.apply_events(
        vec![CtEvent::New(snat(40000)), CtEvent::Update(snat(40001))],
        &routes,
    );
    assert_eq!(added.len(), 2, "both TCP connections are marked liberal");
    assert_eq!(s.dp.table.v4.len(), 4);
    assert_eq!(s.ct.events, 2);
    // An update of an offloaded connection writes nothing new.
    assert!(
        s.apply_events(vec![CtEvent::Update(snat(40000))], &routes)
            .is_empty()
    );
    s.apply_events(vec![CtEvent::Destroy(snat(40000))], &routes);
    assert_eq!(s.dp.table.v4.len(), 2);
    assert_eq!(s.flows.len(), 1);
}

/// The TCP connections a batch will offload are known before it is applied (they are marked
/// liberal in conntrack first), exactly those, a reused tuple after its DESTROY included.
#[test]
fn a_batch_foresees_the_tcp_connections_it_offloads() {
    let mut s = state();
    let routes = Routes(WAN);
    let batches = [
        vec![CtEvent::New(snat(40000)), CtEvent::Update(snat(40001))],
        vec![CtEvent::Update(snat(40000)), CtEvent::Update(snat(40001))],
        vec![CtEvent::Destroy(snat(40000)), CtEvent::Update(snat(40000))],
        vec![
            CtEvent::Update(snat(40002)),
            CtEvent::Update(snat(40002)),
            CtEvent::Destroy(snat(40001)),
        ],
    ];
    let expected: [&[u16]; 4] = [&[40000, 40001], &[], &[40000], &[40002]];
    for (batch, expected) in batches.into_iter().zip(expected) {
        let foreseen: Vec<u16> = s
            .batch_tcp_to_offload(&batch, &routes)
            .iter()
            .map(|e| e.orig.sport)
            .collect();
        let added: Vec<u16> = s
            .apply_events(batch, &routes)
            .iter()
            .map(|e| e.orig.sport)
            .collect();
        assert_eq!(foreseen, expected);
        assert_eq!(added, expected);
    }
}

#[test]
fn link_gone_detaches_and_revalidation_hands_its_flows_back() {
    let mut s = state();
    let routes = Routes(WAN);
    s.apply_events(vec![CtEvent::New(snat(40000))], &routes);
    let (revalidate, _) = s.apply_rt_events(
        vec![RtEvent::LinkGone {
            ifindex: WAN,
            name: "wan".into(),
        }],
        &BTreeMap::new(),
        &BridgeReads::new(),
    );
    assert!(revalidate.is_all());
    assert!(!s.dp.attached.contains_key(&WAN));
    let State { dp, flows, .. } = &mut s;
    assert_eq!(flows.revalidate(flows.snapshot(), dp, &routes), (1, 0));
    assert!(s.dp.table.v4.is_empty());
}

#[test]
fn a_route_change_revalidates_only_the_flows_with_an_address_inside_it() {
    let mut s = state();
    let routes = Routes(WAN);
    let mut other = snat(40001);
    other.orig.dst = "192.0.2.9".parse().unwrap();
    other.reply.src = other.orig.dst;
    s.apply_events(
        vec![CtEvent::New(snat(40000)), CtEvent::New(other.clone())],
        &routes,
    );
    assert_eq!(s.flows.len(), 2);
    let route = |a: &str, len| RtEvent::RouteChanged(Prefix::new(a.parse().unwrap(), len).unwrap());
    let none = BTreeMap::new();
    // A route to a prefix no flow uses (a BGP table churning elsewhere): nothing to re-check.
    let (stale, _) = s.apply_rt_events(
        vec![route("172.16.0.1", 32), route("172.16.0.0", 16)],
        &none,
        &BridgeReads::new(),
    );
    assert!(!stale.is_empty() && !stale.is_all());
    assert!(s.flows.snapshot_where(|e| stale.touches(e)).is_empty());
    // A route covering the remote end of one connection: that one only.
    let (stale, _) = s.apply_rt_events(vec![route("198.51.100.0", 24)], &none, &BridgeReads::new());
    let picked = s.flows.snapshot_where(|e| stale.touches(e));
    assert_eq!(
        picked.iter().map(|e| e.orig).collect::<Vec<_>>(),
        vec![snat(40000).orig]
    );
    // The default route covers both; so does an address change.
    for ev in [route("0.0.0.0", 0), RtEvent::PathsChanged] {
        let (stale, _) = s.apply_rt_events(vec![ev], &none, &BridgeReads::new());
        assert_eq!(s.flows.snapshot_where(|e| stale.touches(e)).len(), 2);
    }
    // The route moved to an unmanaged interface: revalidating what was picked takes it back.
    let State { dp, flows, .. } = &mut s;
    assert_eq!(flows.revalidate(picked, dp, &Routes(99)), (1, 0));
    assert_eq!(s.flows.len(), 1);
    assert!(s.flows.is_offloaded(&other.orig));
}

#[test]
fn a_new_device_is_attached_shaped_until_its_qdiscs_are_read() {
    let mut s = state();
    let batch = vec![
        RtEvent::LinkGone {
            ifindex: WAN,
            name: "wan".into(),
        },
        RtEvent::LinkUp {
            ifindex: 7,
            name: "wan".into(),
            mac: None,
        },
    ];
    let links = BTreeMap::from([("wan".to_string(), (Some(7), Some([2, 0, 0, 0, 0, 7])))]);
    let (revalidate, reread) = s.apply_rt_events(batch, &links, &BridgeReads::new());
    assert!(revalidate.is_all() && reread);
    assert_eq!(s.dp.attached[&7], (1, IFACE_F_SHAPED, [2, 0, 0, 0, 0, 7]));
    s.apply_qdiscs(Ok(Vec::new()));
    assert_eq!(flags(&s, 7), 0);
    // Flows may now use the new device.
    let routes = Routes(7);
    s.apply_events(vec![CtEvent::New(snat(40000))], &routes);
    assert_eq!(s.flows.len(), 1);
}

#[test]
fn a_mac_change_is_written_without_reattaching() {
    let mut s = state();
    let (revalidate, reread) = s.apply_rt_events(
        vec![RtEvent::LinkUp {
            ifindex: LAN,
            name: "lan".into(),
            mac: Some([2, 0, 0, 0, 0, 9]),
        }],
        &BTreeMap::new(),
        &BridgeReads::new(),
    );
    assert!(revalidate.is_empty() && !reread);
    assert_eq!(s.dp.attached[&LAN].2, [2, 0, 0, 0, 0, 9]);
}

#[test]
fn a_failed_attach_leaves_the_interface_unmanaged_and_is_retried() {
    let mut s = state();
    s.dp.attach_fails.insert(8);
    s.link_gone(WAN);
    assert!(s.link_up(8, "wan", Some(MAC), &BridgeRead::default()));
    assert!(!s.dp.attached.contains_key(&8));
    // No flow may enter or leave through it.
    s.apply_events(vec![CtEvent::New(snat(40000))], &Routes(8));
    assert_eq!(s.flows.len(), 0);
    s.dp.attach_fails.clear();
    assert!(
        s.link_up(8, "wan", Some(MAC), &BridgeRead::default()),
        "the next link notification retries"
    );
    assert!(s.dp.attached.contains_key(&8));
}

#[test]
fn an_overrun_rereads_every_link_and_asks_for_everything() {
    let mut s = state();
    // wan vanished while notifications were lost; lan is still there.
    let links = BTreeMap::from([
        ("wan".to_string(), (None, None)),
        ("lan".to_string(), (Some(LAN), Some(MAC))),
    ]);
    let (revalidate, reread) =
        s.apply_rt_events(vec![RtEvent::Overrun], &links, &BridgeReads::new());
    assert!(revalidate.is_all() && reread);
    assert!(!s.dp.attached.contains_key(&WAN));
    assert!(s.dp.attached.contains_key(&LAN));
}

#[test]
fn route_changes_ask_for_revalidation_and_neighbour_changes_do_not() {
    let mut s = state();
    let none = BTreeMap::new();
    assert_eq!(
        s.apply_rt_events(vec![RtEvent::PathsChanged], &none, &BridgeReads::new()),
        (Stale::all(), false)
    );
    assert_eq!(
        s.apply_rt_events(vec![RtEvent::FibChanged], &none, &BridgeReads::new()),
        (Stale::default(), false)
    );
    assert_eq!(
        s.apply_rt_events(
            vec![RtEvent::QdiscChanged { ifindex: LAN }],
            &none,
            &BridgeReads::new()
        ),
        (Stale::default(), true)
    );
    assert_eq!(
        s.apply_rt_events(
            vec![RtEvent::QdiscChanged { ifindex: 99 }],
            &none,
            &BridgeReads::new()
        ),
        (Stale::default(), false)
    );
}

const BR: u32 = 4;
const BR_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

fn port(name: &str, ifindex: u32, forwarding: bool) -> PortInfo {
    PortInfo {
        name: name.into(),
        ifindex,
        forwarding,
        kind: Some("veth".into()),
    }
}

/// wan (2) and the bridge br (4, LAN) with ports p1 (10, forwarding) and p2 (11, not), all
/// attached, with no qdiscs.
fn bridged() -> State<FakeDp> {
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
    let read = BridgeRead {
        kind: BridgeKind::Bridge,
        link_kind: Some("bridge".into()),
        mac: Some(BR_MAC),
        ports: vec![port("p1", 10, true), port("p2", 11, false)],
        filtering: None,
        vlan: None,
    };
    let reads = BridgeReads::from([("br".to_string(), read)]);
    s.set_kinds_and_xmit(&reads, all_capable());
    s.attach_all(&[Some(MAC), Some(BR_MAC)]).unwrap();
    assert!(s.sync_bridges(&reads));
    s.apply_qdiscs(Ok(Vec::new()));
    s
}

/// An interface missing at start (ppp0 while pppd dials) is attached when it appears.
#[test]
fn an_interface_missing_at_start_is_attached_when_it_appears() {
    let mut s = wan_and_lan("ppp0", Shaped::Never, None, None);
    assert!(s.dp.attached.contains_key(&LAN));
    assert_eq!(s.ifindex_of("ppp0"), None);
    let ppp = BridgeRead {
        link_kind: Some("ppp".into()),
        ..BridgeRead::default()
    };
    assert!(s.link_up(12, "ppp0", None, &ppp));
    assert!(s.dp.attached.contains_key(&12));
    assert_eq!(s.ifindex_of("ppp0"), Some(12));
}
