//! The datapath as the state sees it: [`Ports`], what [`super::State`] needs from it besides
//! the flow maps (the managed interfaces' attachments and `IFACES` entries), and its
//! implementation by [`Datapath`] (unit tests use a fake).

use crate::{
    config::XdpModeConfig,
    datapath::{AttachMode, Datapath, PppoeBinding, VlanParent},
    flows::FlowTable,
};

/// What [`super::State`] needs from the datapath besides the flow maps: the managed interfaces'
/// attachments and `IFACES` entries. Implemented by [`Datapath`]; unit tests use a fake.
pub trait Ports: FlowTable {
    /// Registers and attaches to `ifindex`; returns the mode it got.
    fn attach(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode>;
    /// Detaches from `ifindex` and forgets it.
    fn detach(&mut self, ifindex: u32);
    /// Rewrites the flags of a registered interface.
    fn set_iface_flags(&mut self, ifindex: u32, slot: u32, flags: u32) -> anyhow::Result<()>;
    /// Rewrites the MAC address of a registered interface; returns whether it changed.
    fn set_iface_mac(&mut self, ifindex: u32, mac: [u8; 6]) -> anyhow::Result<bool>;
    /// Registers the bridge `ifindex` (its program runs on its ports).
    fn attach_bridge(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
    ) -> anyhow::Result<AttachMode>;
    /// Registers and attaches to a port of the bridge `bridge_ifindex`.
    #[expect(
        clippy::too_many_arguments,
        reason = "one per IFACES field plus the mode"
    )]
    fn attach_port(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        bridge_mac: [u8; 6],
        bridge_ifindex: u32,
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode>;
    /// Registers the VLAN device `ifindex` (`vlan`: VLAN ID and tag protocol) over
    /// `parent`, where the program runs.
    #[expect(
        clippy::too_many_arguments,
        reason = "one per IFACES field plus the parent"
    )]
    fn attach_vlan(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
        vlan: (u16, u16),
        parent: &VlanParent,
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode>;
    /// Registers the PPP device `ifindex` (the program runs on its session's lower device,
    /// see [`Ports::set_pppoe`]).
    fn attach_ppp(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
    ) -> anyhow::Result<AttachMode>;
    /// Binds the registered PPP device `ifindex` to `session`, or unbinds it (`None`).
    fn set_pppoe(
        &mut self,
        name: &str,
        ifindex: u32,
        session: Option<&PppoeBinding>,
        mode: XdpModeConfig,
    ) -> anyhow::Result<()>;
    /// `mac` is behind `port` of `bridge` in VLAN `vid` (0: none; the FDB copy).
    fn fdb_learn(&mut self, bridge: u32, mac: [u8; 6], vid: u16, port: u32) -> anyhow::Result<()>;
    /// `mac` is no longer known to `bridge` in VLAN `vid`.
    fn fdb_forget(&mut self, bridge: u32, mac: [u8; 6], vid: u16);
    /// Forgets every FDB entry of `bridge`.
    fn fdb_clear(&mut self, bridge: u32);
    /// The registered `ifindex` (a VLAN-filtering bridge or its port) is a member of VLAN
    /// `vid`, untagged or not (`BRIDGE_VLANS`); its entries go when it is detached.
    fn bridge_vlan_set(&mut self, ifindex: u32, vid: u16, untagged: bool) -> anyhow::Result<()>;
    /// The registered `ifindex` is no longer a member of VLAN `vid`.
    fn bridge_vlan_remove(&mut self, ifindex: u32, vid: u16);
    /// Writes the tag protocol and PVID (host order; 0: none) of a registered VLAN-filtering
    /// bridge or port.
    fn set_bridge_pvid(&mut self, ifindex: u32, tpid: u16, pvid: u16) -> anyhow::Result<()>;
}

impl Ports for Datapath {
    fn attach(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode> {
        Datapath::attach(self, name, ifindex, slot, flags, mac, mode)
    }
    fn detach(&mut self, ifindex: u32) {
        Datapath::detach(self, ifindex)
    }
    fn set_iface_flags(&mut self, ifindex: u32, slot: u32, flags: u32) -> anyhow::Result<()> {
        Datapath::set_iface_flags(self, ifindex, slot, flags)
    }
    fn set_iface_mac(&mut self, ifindex: u32, mac: [u8; 6]) -> anyhow::Result<bool> {
        Datapath::set_iface_mac(self, ifindex, mac)
    }
    fn attach_bridge(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
    ) -> anyhow::Result<AttachMode> {
        Datapath::attach_bridge(self, name, ifindex, slot, flags, mac)
    }
    fn attach_port(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        bridge_mac: [u8; 6],
        bridge_ifindex: u32,
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode> {
        Datapath::attach_port(
            self,
            name,
            ifindex,
            slot,
            flags,
            bridge_mac,
            bridge_ifindex,
            mode,
        )
    }
    fn attach_vlan(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
        vlan: (u16, u16),
        parent: &VlanParent,
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode> {
        Datapath::attach_vlan(self, name, ifindex, slot, flags, mac, vlan, parent, mode)
    }
    fn attach_ppp(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
    ) -> anyhow::Result<AttachMode> {
        Datapath::attach_ppp(self, name, ifindex, slot, flags)
    }
    fn set_pppoe(
        &mut self,
        name: &str,
        ifindex: u32,
        session: Option<&PppoeBinding>,
        mode: XdpModeConfig,
    ) -> anyhow::Result<()> {
        Datapath::set_pppoe(self, name, ifindex, session, mode)
    }
    fn fdb_learn(&mut self, bridge: u32, mac: [u8; 6], vid: u16, port: u32) -> anyhow::Result<()> {
        Datapath::fdb_learn(self, bridge, mac, vid, port)
    }
    fn fdb_forget(&mut self, bridge: u32, mac: [u8; 6], vid: u16) {
        Datapath::fdb_forget(self, bridge, mac, vid)
    }
    fn fdb_clear(&mut self, bridge: u32) {
        Datapath::fdb_clear(self, bridge)
    }
    fn bridge_vlan_set(&mut self, ifindex: u32, vid: u16, untagged: bool) -> anyhow::Result<()> {
        Datapath::bridge_vlan_set(self, ifindex, vid, untagged)
    }
    fn bridge_vlan_remove(&mut self, ifindex: u32, vid: u16) {
        Datapath::bridge_vlan_remove(self, ifindex, vid)
    }
    fn set_bridge_pvid(&mut self, ifindex: u32, tpid: u16, pvid: u16) -> anyhow::Result<()> {
        Datapath::set_bridge_pvid(self, ifindex, tpid, pvid)
    }
}
