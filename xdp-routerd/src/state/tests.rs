//! State transitions against an in-memory datapath: links come, go and change MAC; qdiscs and
//! hooks change the interface flags; conntrack events become flows; rtnetlink batches ask for
//! revalidation. (The netns tests cover the same with a real kernel.)

use std::collections::{BTreeMap, HashSet};

use aya::maps::MapError;
use xdp_router_common::{ArmKeyV4, ArmKeyV6, FlowKeyV4, FlowKeyV6, FlowV4, FlowV6};

use super::*;
use crate::config::Role;
use crate::{
    flows::fake::FakeTable,
    sync::{
        conntrack::{CtEntry, CtEvent, CtStatus, CtTuple},
        rtnl::RtEvent,
    },
    tasks::{conntrack::apply_events, rtnetlink::apply_rt_events},
};

/// The datapath in memory: the flow maps plus what is attached with which flags and MAC.
#[derive(Default)]
struct FakeDp {
    table: FakeTable,
    /// ifindex → (slot, flags, mac).
    attached: BTreeMap<u32, (u32, u32, [u8; 6])>,
    attach_fails: HashSet<u32>,
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
    }
    fn set_iface_flags(&mut self, ifindex: u32, slot: u32, flags: u32) -> anyhow::Result<()> {
        let a = self
            .attached
            .get_mut(&ifindex)
            .ok_or_else(|| anyhow::anyhow!("not attached"))?;
        a.0 = slot;
        a.1 = flags;
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
    }
}

/// wan (ifindex 2, shaped = auto) and lan (ifindex 3, shaped = false), attached, with no qdiscs.
fn state() -> State<FakeDp> {
    let cfgs = [
        iface("wan", Role::Wan, Shaped::Auto),
        iface("lan", Role::Lan, Shaped::Never),
    ];
    let mut s = State::new(FakeDp::default(), &cfgs, &[WAN, LAN], XdpModeConfig::Native);
    s.apply_qdiscs(Ok(Vec::new()));
    s.attach_all(&[Some(MAC), Some(MAC)]).unwrap();
    s
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
    let found = BTreeMap::from([(
        "lan".to_string(),
        Hooks {
            ingress: true,
            egress: false,
        },
    )]);
    s.apply_hooks(&found);
    assert_eq!(flags(&s, LAN), IFACE_F_INGRESS_HOOK);
    s.ifaces[1].cfg.bypass_hooks = true;
    s.ifaces[1].hooks = Hooks::default();
    s.apply_hooks(&found);
    assert_eq!(flags(&s, LAN), 0);
    s.apply_hooks(&BTreeMap::new());
    assert_eq!(flags(&s, LAN), 0);
}

#[test]
fn conntrack_events_become_flows_and_destroy_removes_them() {
    let mut s = state();
    let routes = Routes(WAN);
    let added = apply_events(
        &mut s,
        vec![CtEvent::New(snat(40000)), CtEvent::Update(snat(40001))],
        &routes,
    );
    assert_eq!(added.len(), 2, "both TCP connections are marked liberal");
    assert_eq!(s.dp.table.v4.len(), 4);
    assert_eq!(s.ct.events, 2);
    // An update of an offloaded connection writes nothing new.
    assert!(apply_events(&mut s, vec![CtEvent::Update(snat(40000))], &routes).is_empty());
    apply_events(&mut s, vec![CtEvent::Destroy(snat(40000))], &routes);
    assert_eq!(s.dp.table.v4.len(), 2);
    assert_eq!(s.flows.len(), 1);
}

#[test]
fn link_gone_detaches_and_revalidation_hands_its_flows_back() {
    let mut s = state();
    let routes = Routes(WAN);
    apply_events(&mut s, vec![CtEvent::New(snat(40000))], &routes);
    let (revalidate, _) = apply_rt_events(
        &mut s,
        vec![RtEvent::LinkGone {
            ifindex: WAN,
            name: "wan".into(),
        }],
        &BTreeMap::new(),
    );
    assert!(revalidate);
    assert!(!s.dp.attached.contains_key(&WAN));
    let State { dp, flows, .. } = &mut s;
    assert_eq!(flows.revalidate(flows.snapshot(), dp, &routes), (1, 0));
    assert!(s.dp.table.v4.is_empty());
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
    let (revalidate, reread) = apply_rt_events(&mut s, batch, &links);
    assert!(revalidate && reread);
    assert_eq!(s.dp.attached[&7], (1, IFACE_F_SHAPED, [2, 0, 0, 0, 0, 7]));
    s.apply_qdiscs(Ok(Vec::new()));
    assert_eq!(flags(&s, 7), 0);
    // Flows may now use the new device.
    let routes = Routes(7);
    apply_events(&mut s, vec![CtEvent::New(snat(40000))], &routes);
    assert_eq!(s.flows.len(), 1);
}

#[test]
fn a_mac_change_is_written_without_reattaching() {
    let mut s = state();
    let (revalidate, reread) = apply_rt_events(
        &mut s,
        vec![RtEvent::LinkUp {
            ifindex: LAN,
            name: "lan".into(),
            mac: Some([2, 0, 0, 0, 0, 9]),
        }],
        &BTreeMap::new(),
    );
    assert!(!revalidate && !reread);
    assert_eq!(s.dp.attached[&LAN].2, [2, 0, 0, 0, 0, 9]);
}

#[test]
fn a_failed_attach_leaves_the_interface_unmanaged_and_is_retried() {
    let mut s = state();
    s.dp.attach_fails.insert(8);
    s.link_gone(WAN);
    assert!(s.link_up(8, "wan", Some(MAC)));
    assert!(!s.dp.attached.contains_key(&8));
    // No flow may enter or leave through it.
    apply_events(&mut s, vec![CtEvent::New(snat(40000))], &Routes(8));
    assert_eq!(s.flows.len(), 0);
    s.dp.attach_fails.clear();
    assert!(
        s.link_up(8, "wan", Some(MAC)),
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
    let (revalidate, reread) = apply_rt_events(&mut s, vec![RtEvent::Overrun], &links);
    assert!(revalidate && reread);
    assert!(!s.dp.attached.contains_key(&WAN));
    assert!(s.dp.attached.contains_key(&LAN));
}

#[test]
fn route_changes_ask_for_revalidation_and_neighbour_changes_do_not() {
    let mut s = state();
    let none = BTreeMap::new();
    assert_eq!(
        apply_rt_events(&mut s, vec![RtEvent::PathsChanged], &none),
        (true, false)
    );
    assert_eq!(
        apply_rt_events(&mut s, vec![RtEvent::FibChanged], &none),
        (false, false)
    );
    assert_eq!(
        apply_rt_events(&mut s, vec![RtEvent::QdiscChanged { ifindex: LAN }], &none),
        (false, true)
    );
    assert_eq!(
        apply_rt_events(&mut s, vec![RtEvent::QdiscChanged { ifindex: 99 }], &none),
        (false, false)
    );
}
