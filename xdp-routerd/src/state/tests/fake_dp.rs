//! The datapath in memory for the state's tests: the flow maps ([`FakeTable`]) plus what
//! is attached with which flags and MAC, the bridge, VLAN and PPPoE tables, as the real
//! datapath keeps them.

use super::*;

/// The datapath in memory: the flow maps plus what is attached with which flags and MAC.
#[derive(Default)]
pub(super) struct FakeDp {
    pub(super) table: FakeTable,
    /// ifindex → (slot, flags, mac).
    pub(super) attached: BTreeMap<u32, (u32, u32, [u8; 6])>,
    pub(super) attach_fails: HashSet<u32>,
    /// (bridge, MAC, VLAN) → port.
    pub(super) fdb: BTreeMap<(u32, [u8; 6], u16), u32>,
    /// `BRIDGE_VLANS`: (ifindex, VLAN) → untagged.
    pub(super) bridge_vlans: BTreeMap<(u32, u16), bool>,
    /// Tag protocol and PVID written into a filtering bridge's or port's entry.
    pub(super) pvids: BTreeMap<u32, (u16, u16)>,
    /// The VLAN writes in order (`-10/20`: VLAN 20 of ifindex 10 removed, `+10/20u`: added or
    /// changed, untagged, `pvid 10 1`: PVID 1 written), for the tests of their order.
    pub(super) vlan_log: Vec<String>,
    /// VLAN device ifindex → (VLAN ID, tag protocol, parent).
    pub(super) vlans: BTreeMap<u32, (u16, u16, VlanParent)>,
    /// Registered PPP devices → the session bound to them.
    pub(super) ppp: BTreeMap<u32, Option<PppoeBinding>>,
    /// The `PPPOE` map: (lower ifindex, session ID as held) → PPP device.
    pub(super) pppoe: BTreeMap<(u32, u16), u32>,
    /// A PPP device without a paired session runs the TC fast path itself (as `datapath =
    /// "auto"` with TC available); `false`: it stays unbound (`"xdp"`, or no TC).
    pub(super) unpaired_ppp_on_tc: bool,
    /// PPP device on TC without a session → why none is paired (its `status` reason).
    pub(super) unpaired_why: BTreeMap<u32, String>,
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
    fn kernel_forwarded_packets(&self) -> Option<u64> {
        self.table.kernel_forwarded_packets()
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
    fn attach_l3(
        &mut self,
        _name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
    ) -> anyhow::Result<AttachMode> {
        self.attached.insert(
            ifindex,
            (slot, flags | IFACE_F_L3 | IFACE_F_NO_XDP_XMIT, [0; 6]),
        );
        Ok(AttachMode::Tc)
    }
    fn set_pppoe(
        &mut self,
        _name: &str,
        ifindex: u32,
        session: Result<&PppoeBinding, &str>,
        _mode: XdpModeConfig,
    ) -> anyhow::Result<bool> {
        let old = self
            .ppp
            .get_mut(&ifindex)
            .ok_or_else(|| anyhow::anyhow!("not a PPP device"))?
            .take();
        if let Some(b) = &old {
            self.pppoe.remove(&(b.lower.ifindex, b.sid_be));
        }
        self.unpaired_why.remove(&ifindex);
        let entry = self.attached.get_mut(&ifindex).unwrap();
        entry.1 &= !(IFACE_F_PPPOE | IFACE_F_L3);
        let carried = match session {
            Ok(_) => true,
            Err(why) if self.unpaired_ppp_on_tc => {
                self.unpaired_why.insert(ifindex, why.to_string());
                entry.1 |= IFACE_F_L3;
                true
            }
            Err(_) => false,
        };
        if let Ok(b) = session {
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
        Ok(carried)
    }
    fn reword_unpaired_ppp(&mut self, _name: &str, ifindex: u32, why: &str) {
        if self.unpaired_ppp_on_tc {
            self.unpaired_why.insert(ifindex, why.to_string());
        }
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
