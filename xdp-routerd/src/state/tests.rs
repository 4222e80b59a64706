//! State transitions against an in-memory datapath: links come, go and change MAC; qdiscs and
//! hooks change the interface flags; conntrack events become flows; rtnetlink batches ask for
//! revalidation. (The netns tests cover the same with a real kernel.)

use std::{
    collections::{BTreeMap, HashSet},
    net::IpAddr,
};

use aya::maps::MapError;
use xdp_router_common::{
    ArmKeyV4, ArmKeyV6, FlowKeyV4, FlowKeyV6, FlowV4, FlowV6, IFACE_F_BRIDGE, IFACE_F_BRIDGE_PORT,
    IFACE_F_BRIDGE_VLAN_FILTERING, IFACE_F_INGRESS_HOOK, IFACE_F_NO_XDP_XMIT,
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
    flows::{FlowTable, fake::FakeTable},
    paths::Stale,
    sync::{
        conntrack::{CtEntry, CtEvent, CtStatus, CtTuple},
        rtnl::{Prefix, RtEvent},
    },
};

/// The datapath in memory: the flow maps plus what is attached with which flags and MAC.
#[derive(Default)]
struct FakeDp {
    table: FakeTable,
    /// ifindex → (slot, flags, mac).
    attached: BTreeMap<u32, (u32, u32, [u8; 6])>,
    attach_fails: HashSet<u32>,
    /// (bridge, MAC, VLAN) → port.
    fdb: BTreeMap<(u32, [u8; 6], u16), u32>,
    /// `BRIDGE_VLANS`: (ifindex, VLAN) → untagged.
    bridge_vlans: BTreeMap<(u32, u16), bool>,
    /// Tag protocol and PVID written into a filtering bridge's or port's entry.
    pvids: BTreeMap<u32, (u16, u16)>,
    /// The VLAN writes in order (`-10/20`: VLAN 20 of ifindex 10 removed, `+10/20u`: added or
    /// changed, untagged, `pvid 10 1`: PVID 1 written), for the tests of their order.
    vlan_log: Vec<String>,
    /// VLAN device ifindex → (VLAN ID, tag protocol, parent).
    vlans: BTreeMap<u32, (u16, u16, VlanParent)>,
    /// Registered PPP devices → the session bound to them.
    ppp: BTreeMap<u32, Option<PppoeBinding>>,
    /// The `PPPOE` map: (lower ifindex, session ID as held) → PPP device.
    pppoe: BTreeMap<(u32, u16), u32>,
}

impl FakeDp {
    /// As the datapath: a lower device managed only for sessions goes with the last one.
    fn release_lower(&mut self, lower: u32) {
        let in_use = self
            .ppp
            .values()
            .flatten()
            .any(|b| b.lower.ifindex == lower);
        if !in_use
            && self
                .attached
                .get(&lower)
                .is_some_and(|a| a.1 & IFACE_F_PPPOE_LOWER != 0)
        {
            self.attached.remove(&lower);
            self.vlans.remove(&lower);
        }
    }
}

impl FlowTable for FakeDp {
    fn insert_v4(&mut self, key: &FlowKeyV4, value: &FlowV4) -> Result<(), MapError> {
        self.table.insert_v4(key, value)
    }
    fn insert_v6(&mut self, key: &FlowKeyV6, value: &FlowV6) -> Result<(), MapError> {
        self.table.insert_v6(key, value)
    }
    fn remove_v4(&mut self, key: &FlowKeyV4) {
        self.table.remove_v4(key)
    }
    fn remove_v6(&mut self, key: &FlowKeyV6) {
        self.table.remove_v6(key)
    }
    fn get_v4(&self, key: &FlowKeyV4) -> Option<FlowV4> {
        self.table.get_v4(key)
    }
    fn get_v6(&self, key: &FlowKeyV6) -> Option<FlowV6> {
        self.table.get_v6(key)
    }
    fn insert_arm_v4(&mut self, arm: &ArmKeyV4, flow: &FlowKeyV4) -> Result<(), MapError> {
        self.table.insert_arm_v4(arm, flow)
    }
    fn insert_arm_v6(&mut self, arm: &ArmKeyV6, flow: &FlowKeyV6) -> Result<(), MapError> {
        self.table.insert_arm_v6(arm, flow)
    }
    fn remove_arm_v4(&mut self, arm: &ArmKeyV4) {
        self.table.remove_arm_v4(arm)
    }
    fn remove_arm_v6(&mut self, arm: &ArmKeyV6) {
        self.table.remove_arm_v6(arm)
    }
    fn take_active(&mut self, now_ns: u64) -> (Vec<FlowKeyV4>, Vec<FlowKeyV6>) {
        self.table.take_active(now_ns)
    }
}

impl Ports for FakeDp {
    fn attach(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
        _mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode> {
        if self.attach_fails.contains(&ifindex) {
            anyhow::bail!("{name}: cannot attach");
        }
        self.attached.insert(ifindex, (slot, flags, mac));
        Ok(AttachMode::Native)
    }
    fn detach(&mut self, ifindex: u32) {
        self.attached.remove(&ifindex);
        self.bridge_vlans.retain(|(i, _), _| *i != ifindex);
        self.pvids.remove(&ifindex);
        // As the datapath: a parent managed only for its VLANs goes with the last one.
        if let Some((_, _, parent)) = self.vlans.remove(&ifindex) {
            let in_use = self.vlans.values().any(|v| v.2.ifindex == parent.ifindex);
            if !in_use
                && self
                    .attached
                    .get(&parent.ifindex)
                    .is_some_and(|a| a.1 & IFACE_F_VLAN_PARENT != 0)
            {
                self.detach(parent.ifindex);
            }
        }
        if let Some(Some(b)) = self.ppp.remove(&ifindex) {
            self.pppoe.remove(&(b.lower.ifindex, b.sid_be));
            self.release_lower(b.lower.ifindex);
        }
    }
    fn set_iface_flags(&mut self, ifindex: u32, slot: u32, flags: u32) -> anyhow::Result<()> {
        let a = self
            .attached
            .get_mut(&ifindex)
            .ok_or_else(|| anyhow::anyhow!("not attached"))?;
        if (a.1 ^ flags) & IFACE_F_BRIDGE_VLAN_FILTERING != 0 {
            let f = if flags & IFACE_F_BRIDGE_VLAN_FILTERING != 0 {
                "filtering"
            } else {
                "plain"
            };
            self.vlan_log.push(format!("flags {ifindex} {f}"));
        }
        a.0 = slot;
        // As the datapath: what the interface is (for a PPPoE session, a bridge managed as a
        // VLAN parent) stays.
        a.1 = flags
            | (a.1 & (IFACE_F_PPPOE | IFACE_F_PPPOE_LOWER | IFACE_F_BRIDGE | IFACE_F_VLAN_PARENT));
        Ok(())
    }
    fn set_iface_mac(&mut self, ifindex: u32, mac: [u8; 6]) -> anyhow::Result<bool> {
        let a = self
            .attached
            .get_mut(&ifindex)
            .ok_or_else(|| anyhow::anyhow!("not attached"))?;
        let changed = a.2 != mac;
        a.2 = mac;
        Ok(changed)
    }
    fn attach_bridge(
        &mut self,
        _name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
    ) -> anyhow::Result<AttachMode> {
        self.attached.insert(ifindex, (slot, flags, mac));
        Ok(AttachMode::Ports)
    }
    fn attach_port(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        bridge_mac: [u8; 6],
        _bridge_ifindex: u32,
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode> {
        // As the datapath: a port is flagged as one.
        self.attach(
            name,
            ifindex,
            slot,
            flags | IFACE_F_BRIDGE_PORT,
            bridge_mac,
            mode,
        )
    }
    fn attach_vlan(
        &mut self,
        _name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
        (vid, tpid): (u16, u16),
        parent: &VlanParent,
        _mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode> {
        self.attached.insert(ifindex, (slot, flags, mac));
        // As the datapath: the program runs on the parent, registered once; a bridge parent
        // is registered without it (it runs on the ports).
        let bridge = parent.flags & IFACE_F_BRIDGE != 0;
        let parent_flags = if bridge {
            parent.flags | IFACE_F_VLAN_PARENT | IFACE_F_NO_XDP_XMIT
        } else {
            parent.flags
        };
        self.attached
            .entry(parent.ifindex)
            .or_insert((parent.slot, parent_flags, parent.mac));
        self.vlans.insert(ifindex, (vid, tpid, parent.clone()));
        Ok(if bridge {
            AttachMode::Ports
        } else {
            AttachMode::Native
        })
    }
    fn attach_ppp(
        &mut self,
        _name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
    ) -> anyhow::Result<AttachMode> {
        self.attached.insert(ifindex, (slot, flags, [0; 6]));
        self.ppp.insert(ifindex, None);
        Ok(AttachMode::Lower)
    }
    fn set_pppoe(
        &mut self,
        _name: &str,
        ifindex: u32,
        session: Option<&PppoeBinding>,
        _mode: XdpModeConfig,
    ) -> anyhow::Result<()> {
        let old = self
            .ppp
            .get_mut(&ifindex)
            .ok_or_else(|| anyhow::anyhow!("not a PPP device"))?
            .take();
        if let Some(b) = &old {
            self.pppoe.remove(&(b.lower.ifindex, b.sid_be));
        }
        let entry = self.attached.get_mut(&ifindex).unwrap();
        entry.1 &= !IFACE_F_PPPOE;
        if let Some(b) = session {
            entry.1 |= IFACE_F_PPPOE;
            let l = &b.lower;
            self.attached.entry(l.ifindex).or_insert((
                l.slot,
                l.flags | IFACE_F_PPPOE_LOWER,
                l.mac,
            ));
            if let Some(((vid, tpid), parent)) = &b.vlan {
                self.vlans.insert(l.ifindex, (*vid, *tpid, parent.clone()));
                self.attached.entry(parent.ifindex).or_insert((
                    parent.slot,
                    parent.flags,
                    parent.mac,
                ));
            }
            self.pppoe.insert((l.ifindex, b.sid_be), ifindex);
            self.ppp.insert(ifindex, Some(b.clone()));
        }
        if let Some(b) = old {
            self.release_lower(b.lower.ifindex);
        }
        Ok(())
    }
    fn fdb_learn(&mut self, bridge: u32, mac: [u8; 6], vid: u16, port: u32) -> anyhow::Result<()> {
        self.fdb.insert((bridge, mac, vid), port);
        Ok(())
    }
    fn fdb_forget(&mut self, bridge: u32, mac: [u8; 6], vid: u16) {
        self.fdb.remove(&(bridge, mac, vid));
    }
    fn fdb_clear(&mut self, bridge: u32) {
        self.fdb.retain(|(b, _, _), _| *b != bridge);
    }
    fn bridge_vlan_set(&mut self, ifindex: u32, vid: u16, untagged: bool) -> anyhow::Result<()> {
        anyhow::ensure!(self.attached.contains_key(&ifindex), "not attached");
        self.bridge_vlans.insert((ifindex, vid), untagged);
        let u = if untagged { "u" } else { "" };
        self.vlan_log.push(format!("+{ifindex}/{vid}{u}"));
        Ok(())
    }
    fn bridge_vlan_remove(&mut self, ifindex: u32, vid: u16) {
        self.bridge_vlans.remove(&(ifindex, vid));
        self.vlan_log.push(format!("-{ifindex}/{vid}"));
    }
    fn set_bridge_pvid(&mut self, ifindex: u32, tpid: u16, pvid: u16) -> anyhow::Result<()> {
        anyhow::ensure!(self.attached.contains_key(&ifindex), "not attached");
        self.pvids.insert(ifindex, (tpid, pvid));
        self.vlan_log.push(format!("pvid {ifindex} {pvid}"));
        Ok(())
    }
}

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
    }
}

/// wan (ifindex 2, shaped = auto) and lan (ifindex 3, shaped = false), attached, with no qdiscs.
fn state() -> State<FakeDp> {
    let cfgs = [
        iface("wan", Role::Wan, Shaped::Auto),
        iface("lan", Role::Lan, Shaped::Never),
    ];
    let mut s = State::new(
        FakeDp::default(),
        &cfgs,
        &[Some(WAN), Some(LAN)],
        XdpModeConfig::Native,
    );
    s.set_kinds_and_xmit(&BridgeReads::new(), all_capable());
    s.apply_qdiscs(Ok(Vec::new()));
    s.attach_all(&[Some(MAC), Some(MAC)]).unwrap();
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

/// An interface missing at start (ppp0 while pppd dials) is attached when it appears.
#[test]
fn an_interface_missing_at_start_is_attached_when_it_appears() {
    let cfgs = [
        iface("ppp0", Role::Wan, Shaped::Never),
        iface("lan", Role::Lan, Shaped::Never),
    ];
    let mut s = State::new(
        FakeDp::default(),
        &cfgs,
        &[None, Some(LAN)],
        XdpModeConfig::Native,
    );
    s.set_kinds_and_xmit(&BridgeReads::new(), all_capable());
    s.attach_all(&[None, Some(MAC)]).unwrap();
    assert!(s.dp.attached.contains_key(&LAN));
    assert_eq!(s.ifindex_of("ppp0"), None);
    assert!(s.link_up(12, "ppp0", None, &BridgeRead::default()));
    assert!(s.dp.attached.contains_key(&12));
    assert_eq!(s.ifindex_of("ppp0"), Some(12));
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

/// CCP found running on a bound PPP device (`SIOCGPPPCSTATS`): its session is unbound (nothing
/// decapsulated or encapsulated any more, eth0 let go) and the status says why; the same read
/// again changes nothing.
#[test]
fn a_ppp_device_on_which_ccp_runs_is_handed_back_to_the_kernel() {
    let mut s = with_ppp0(false);
    s.apply_pppoe(&session_over_eth0(0x0100));
    assert_eq!(s.dp.pppoe.len(), 1);
    let ccp = BTreeMap::from([(
        "ppp0".to_string(),
        Err(crate::sync::pppoe::Unpaired::CompressionRuns),
    )]);
    assert!(!s.apply_pppoe(&ccp));
    assert!(s.dp.pppoe.is_empty());
    assert!(!s.dp.attached.contains_key(&20));
    assert_eq!(flags(&s, 12) & IFACE_F_PPPOE, 0);
    let why = s.ifaces[0].pppoe_status().unwrap().not_accelerated_because;
    assert_eq!(
        why.as_deref(),
        Some("CCP (PPP compression or MPPE) runs on it: the fast path needs pppd's noccp")
    );
    assert!(!s.apply_pppoe(&ccp));
    assert!(s.dp.pppoe.is_empty());
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

/// VLAN-filtering bridges, their VLANs and the VLAN devices over them.
mod vlan_filtering {
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

    #[test]
    fn a_vlan_over_a_vlan_device_says_why_it_is_not_accelerated() {
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
            Some("a VLAN over the VLAN device eth0.7 (stacked VLANs): left to the kernel")
        );
    }
}
