//! [`Ports`]: what the state asks of the datapath besides the flow maps, the one interface
//! through which interfaces of every kind (plain, bridge and port, VLAN device, PPP device
//! and its PPPoE session) are registered in `IFACES`, attached and detached; and its
//! implementation by [`Datapath`]. The state's unit tests implement it with an in-memory fake.

use anyhow::{Context as _, bail};
use tracing::info;
use xdp_router_common::{
    ARM_L3_PROG_NAME, ARM_PROG_NAME, BRIDGE_VLAN_F_UNTAGGED, FdbKey, IFACE_F_BRIDGE,
    IFACE_F_BRIDGE_PORT, IFACE_F_L3, IFACE_F_NO_XDP_XMIT, IFACE_F_PPP_CCP, IFACE_F_PPPOE,
    IFACE_F_PPPOE_LOWER, IFACE_F_VLAN, IFACE_F_VLAN_PARENT, IfaceInfo, MAP_BRIDGE_FDB,
    MAP_BRIDGE_VLANS, MAP_IFACES, MAP_TX_PORTS, MAP_VLANS, MAX_IFACE_SLOTS, VlanKey,
};

use super::{
    AttachMode, DATAPATH_FLAGS, Datapath, PppoeBinding, VlanParent,
    bridge::{bridge_vlan_key, fdb_key},
};
use crate::{config::XdpModeConfig, flows::FlowTable};

/// Why a device without a link-layer header runs the TC fast path (`status`).
pub const NO_LINK_LAYER_TC: &str = "no link-layer header (an L3 device such as WireGuard or \
     tun): the TC fast path, whatever `datapath` says (XDP would run generic there)";

/// What the daemon's state needs from the datapath besides the flow maps (the interface it
/// drives): the managed interfaces' attachments and `IFACES` entries, and the bridge, VLAN
/// and PPPoE maps. Implemented by [`Datapath`] (below); the state's unit tests use an
/// in-memory fake.
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
    /// Registers and attaches to the device without a link-layer header `ifindex` (`wg0`,
    /// `tun0`): the TC fast path at its ingress, whatever `datapath` says.
    fn attach_l3(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
    ) -> anyhow::Result<AttachMode>;
    /// Binds the registered PPP device `ifindex` to `session`, or, where no PPPoE session is
    /// paired with it (`Err`: why), to the TC fast path on the device itself where its
    /// `datapath` allows (see `Datapath::unpaired_ppp_on_tc`), else unbinds it. Returns
    /// whether the fast path carries the device.
    fn set_pppoe(
        &mut self,
        name: &str,
        ifindex: u32,
        session: Result<&PppoeBinding, &str>,
        mode: XdpModeConfig,
    ) -> anyhow::Result<bool>;
    /// The PPP device `ifindex`, carried on TC with no PPPoE session paired with it, is still
    /// unpaired, now because `why` (another count of sessions, say): only the reason `status`
    /// gives changes; the device stays bound.
    fn reword_unpaired_ppp(&mut self, name: &str, ifindex: u32, why: &str);
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
    /// Registers `ifindex` as managed (stats slot, flags, its own MAC, devmap entry) and
    /// attaches the program to it. Returns the mode it got.
    fn attach(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode> {
        let info = IfaceInfo {
            slot,
            flags,
            mac,
            l3_ifindex: 0,
            ..IfaceInfo::default()
        };
        self.register(name, ifindex, info, mode, true)
    }

    fn reword_unpaired_ppp(&mut self, name: &str, ifindex: u32, why: &str) {
        if let Some(because) = self.unpaired_ppp_on_tc(name, why) {
            self.links.datapath_because.insert(ifindex, because);
        }
    }

    /// Detaches from `ifindex` (if attached) and forgets it in the maps. Used when an interface
    /// disappears; the kernel already dropped the link if the device is gone.
    fn detach(&mut self, ifindex: u32) {
        self.detach_vlan(ifindex);
        // A bridge or port no longer managed (also one that stays only as a VLAN parent:
        // its VLANs are written again when it is managed again).
        self.bridges.clear_vlans(ifindex);
        if self.pppoe.devices.contains_key(&ifindex) {
            self.detach_ppp(ifindex);
            return;
        }
        let vlan_parent = self.vlans.is_parent(ifindex);
        let pppoe_lower = self.pppoe.lower_in_use(ifindex);
        if (vlan_parent || pppoe_lower)
            && let Ok(mut info) = self.iface(ifindex)
        {
            // A managed interface that is also the parent of managed VLANs or the lower
            // device of a managed PPPoE session: the program stays for them, the interface
            // itself is now managed only as their parent / lower device.
            if vlan_parent {
                info.flags |= IFACE_F_VLAN_PARENT;
            }
            if pppoe_lower {
                info.flags |= IFACE_F_PPPOE_LOWER;
            } else {
                // Only its VLANs' tagged frames are sent out of it.
                let _ = self.tx_ports.remove(ifindex);
            }
            let _ = self.update_iface(ifindex, info);
            self.detach_arming(ifindex);
            return;
        }
        self.detach_arming(ifindex);
        self.detach_program(ifindex);
        let _ = self.ifaces.remove(&ifindex);
        let _ = self.tx_ports.remove(ifindex);
    }

    /// Rewrites the `IFACE_F_*` flags of a registered interface (e.g. its egress became shaped
    /// or stopped being shaped); the program sees them from its next packet on. Fails when
    /// `ifindex` is not registered (never adds it).
    ///
    /// `IFACE_F_NO_XDP_XMIT` also decides the interface's `TX_PORTS` entry, in the order that
    /// never lets the datapath see the flag clear without the entry (that would count packets
    /// as `egress_not_managed`): the entry is added before the flag is cleared, and removed
    /// only after it is set.
    fn set_iface_flags(&mut self, ifindex: u32, slot: u32, flags: u32) -> anyhow::Result<()> {
        let mut info = self.iface(ifindex)?;
        // What the interface is (bridge, port, VLAN device, VLAN parent) and how the program
        // is attached to it stay.
        let mut flags = flags | (info.flags & DATAPATH_FLAGS);
        if flags & IFACE_F_L3 != 0 {
            // The XDP program writes Ethernet frames: never sent into a device without a
            // link-layer header by XDP (see `attach_l3`).
            flags |= IFACE_F_NO_XDP_XMIT;
        }
        // A bridge, VLAN device or PPP device transmits nothing itself: no TX_PORTS entry.
        let xmit = flags & IFACE_F_NO_XDP_XMIT == 0
            && flags & (IFACE_F_BRIDGE | IFACE_F_VLAN) == 0
            && !self.pppoe.devices.contains_key(&ifindex);
        if xmit {
            self.tx_ports
                .insert(ifindex, ifindex, None, 0)
                .with_context(|| format!("cannot add ifindex {ifindex} to {MAP_TX_PORTS}"))?;
        }
        info.slot = slot;
        info.flags = flags;
        self.update_iface(ifindex, info)?;
        if !xmit {
            let _ = self.tx_ports.remove(ifindex);
        }
        Ok(())
    }

    /// Rewrites the MAC address of a registered interface (`ip link set dev X address ...`):
    /// only frames sent to it are forwarded. Returns whether it changed.
    fn set_iface_mac(&mut self, ifindex: u32, mac: [u8; 6]) -> anyhow::Result<bool> {
        let mut info = self.iface(ifindex)?;
        if info.mac == mac {
            return Ok(false);
        }
        info.mac = mac;
        self.update_iface(ifindex, info)?;
        Ok(true)
    }

    /// Registers the bridge `ifindex` (`IFACE_F_BRIDGE`): no XDP program on it (it runs on the
    /// ports, see [`Ports::attach_port`]) and no `TX_PORTS` entry (a bridge transmits no
    /// XDP frames), but the arming program on its egress, where the kernel's routed packets
    /// to the LAN leave.
    fn attach_bridge(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
    ) -> anyhow::Result<AttachMode> {
        if slot == 0 || slot >= MAX_IFACE_SLOTS {
            bail!("interface slot {slot} out of range");
        }
        let info = IfaceInfo {
            slot,
            flags: flags | IFACE_F_BRIDGE | IFACE_F_NO_XDP_XMIT,
            mac,
            l3_ifindex: 0,
            ..IfaceInfo::default()
        };
        self.ifaces
            .insert(ifindex, info, 0)
            .with_context(|| format!("{name}: cannot add to {MAP_IFACES}"))?;
        self.attach_arming(name, ifindex, ARM_PROG_NAME);
        info!(interface = name, ifindex, "bridge: XDP runs on its ports");
        Ok(AttachMode::Ports)
    }

    /// Registers `ifindex` as a port of the managed bridge `bridge_ifindex` (whose MAC is
    /// `bridge_mac`) and attaches the program to it: frames it receives for the bridge's MAC
    /// are routed as the bridge's, and packets routed out of the bridge to a MAC behind it are
    /// redirected to it (`BRIDGE_FDB`). No arming program: the kernel's routed packets leave
    /// through the bridge device, where that one runs.
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
        let info = IfaceInfo {
            slot,
            flags: flags | IFACE_F_BRIDGE_PORT,
            mac: bridge_mac,
            l3_ifindex: bridge_ifindex,
            ..IfaceInfo::default()
        };
        self.register(name, ifindex, info, mode, false)
    }

    /// Registers the VLAN device `ifindex` (VLAN `vid`, tag protocol `tpid`, over the parent
    /// `parent`): its `IFACES` entry (`IFACE_F_VLAN`, no `TX_PORTS` entry: the parent
    /// transmits), its `VLANS` entry, and the arming program on its egress, where the kernel's
    /// routed packets leave. The XDP program runs on the parent: attached here unless it runs
    /// there already (the parent is managed itself, or for another VLAN); a parent that is not
    /// managed itself gets an entry of its own (`IFACE_F_VLAN_PARENT`, stats slot
    /// `parent.slot`, flags `parent.flags`). A bridge parent (`IFACE_F_BRIDGE` in
    /// `parent.flags`, `br-lan.20`) gets no XDP program (it runs on the bridge's ports, which
    /// the caller attaches with [`Ports::attach_port`]) and no `TX_PORTS` entry. Where the
    /// parent has no native XDP (see [`Datapath::vlan_on_tc`]), the TC fast path runs on the
    /// VLAN device itself instead, and the parent gets only an entry.
    fn attach_vlan(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
        (vid, tpid): (u16, u16),
        parent: &VlanParent,
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode> {
        if slot == 0 || slot >= MAX_IFACE_SLOTS {
            bail!("interface slot {slot} out of range");
        }
        let tc = self.vlan_on_tc(name, parent, mode, flags & IFACE_F_PPPOE_LOWER != 0)?;
        let mode = match tc {
            Some(_) => {
                self.register_parent_entry(parent)?;
                AttachMode::Tc
            }
            None => self.run_on_parent(parent, mode)?,
        };
        let info = IfaceInfo {
            slot,
            flags: flags | IFACE_F_VLAN,
            mac,
            vlan_tci_be: vid.to_be(),
            lower_ifindex: parent.ifindex,
            vlan_tpid_be: tpid.to_be(),
            ..IfaceInfo::default()
        };
        self.ifaces
            .insert(ifindex, info, 0)
            .with_context(|| format!("{name}: cannot add to {MAP_IFACES}"))?;
        let key = VlanKey {
            parent_ifindex: parent.ifindex,
            vid,
            tpid_be: tpid.to_be(),
        };
        self.vlans
            .add(key, ifindex)
            .with_context(|| format!("{name}: cannot add to {MAP_VLANS}"))?;
        if let Some(because) = tc
            && let Err(e) = self.run_tc_on(name, ifindex, because)
        {
            self.detach(ifindex);
            return Err(e);
        }
        // A VLAN device managed only as a PPPoE session's lower device: the kernel's routed
        // packets leave through the PPP device, where its own arming program runs.
        if flags & IFACE_F_PPPOE_LOWER == 0 {
            self.attach_arming(name, ifindex, ARM_PROG_NAME);
        }
        let how = if mode == AttachMode::Tc {
            self.update_handoffs();
            "VLAN device: the TC fast path runs on it, the kernel untags and tags"
        } else {
            "VLAN device: XDP runs on its parent, tags popped and pushed there"
        };
        info!(
            interface = name,
            ifindex,
            parent = %parent.name,
            vid,
            tpid = format!("{tpid:#06x}"),
            mode = mode.as_str(),
            "{how}"
        );
        Ok(mode)
    }

    /// Registers the PPP device `ifindex` (`ppp0`): its `IFACES` entry (stats slot, its own
    /// `flags`) and the L3 arming program on its egress, where the kernel's routed packets
    /// leave without a link-layer header. Never XDP (it would only run generic there, and
    /// never see a session frame) and never a `TX_PORTS` entry (the lower device transmits).
    /// The entry gets `IFACE_F_PPPOE` only while a session is bound ([`Ports::set_pppoe`]):
    /// until then packets routed out of it go to the kernel.
    fn attach_ppp(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
    ) -> anyhow::Result<AttachMode> {
        self.register_l3(
            name,
            ifindex,
            slot,
            flags & !(IFACE_F_PPPOE | IFACE_F_PPPOE_LOWER),
        )?;
        self.pppoe.devices.insert(ifindex, None);
        if !self.links.armed.contains_key(&ifindex) {
            self.attach_arming(name, ifindex, ARM_L3_PROG_NAME);
        }
        info!(
            interface = name,
            ifindex, "PPP device: XDP runs on its PPPoE session's lower device"
        );
        Ok(AttachMode::Lower)
    }

    /// Registers the device without a link-layer header `ifindex` (`wg0`, `tun0`): its
    /// `IFACES` entry (`IFACE_F_L3`, and `IFACE_F_NO_XDP_XMIT`: the XDP program writes
    /// Ethernet frames, so what it routes there is handed to the TC fast path), the TC fast
    /// path at its ingress whatever `datapath` says (XDP would run generic there and parse
    /// nothing), and the L3 arming program on its egress. No `TX_PORTS` entry, no DSCP stamp
    /// (it reads Ethernet frames: DSCP rewrites of flows entering here stay with the kernel).
    fn attach_l3(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
    ) -> anyhow::Result<AttachMode> {
        self.register_l3(
            name,
            ifindex,
            slot,
            flags | IFACE_F_L3 | IFACE_F_NO_XDP_XMIT,
        )?;
        if let Err(e) = self.run_tc_on(name, ifindex, NO_LINK_LAYER_TC.to_string()) {
            let _ = self.ifaces.remove(&ifindex);
            self.links.names.remove(&ifindex);
            return Err(e);
        }
        if !self.links.armed.contains_key(&ifindex) {
            self.attach_arming(name, ifindex, ARM_L3_PROG_NAME);
        }
        self.update_handoffs();
        Ok(AttachMode::Tc)
    }

    /// Binds the PPP device `ifindex` (registered by [`Ports::attach_ppp`]) to `session`,
    /// or unbinds it (`None`). In the order that never forwards into a session that is not
    /// the current one: the old session goes first (the PPP device's entry loses
    /// `IFACE_F_PPPOE`, so nothing is sent into it, then its `PPPOE` key goes, so nothing of
    /// it is received as the PPP device's); then the lower device is registered (XDP attached
    /// in `mode`, `IFACE_F_PPPOE_LOWER`, unless it is registered already), the PPP device's
    /// entry rewritten (`IFACE_F_PPPOE`, session ID, peer, lower device and its MAC), and the
    /// new key added last; a lower device managed only for the old session is released at
    /// the end. A session bound on TC (`bind_ppp_tc`) goes with its TC program and
    /// `IFACE_F_L3`. On error the PPP device is left unbound.
    fn set_pppoe(
        &mut self,
        name: &str,
        ifindex: u32,
        session: Result<&PppoeBinding, &str>,
        mode: XdpModeConfig,
    ) -> anyhow::Result<bool> {
        let Some(old) = self.pppoe.devices.get(&ifindex).copied() else {
            bail!("{name}: not a registered PPP device");
        };
        let mut info = self.iface(ifindex)?;
        // The PPP device's entry without a session: its packets go to the kernel.
        let unbound = |i: IfaceInfo| IfaceInfo {
            slot: i.slot,
            // CCP seen (by the datapath) belongs to the session that goes, and so does a TC
            // binding's `IFACE_F_L3` (its packets then go to the kernel).
            flags: i.flags & !(IFACE_F_PPPOE | IFACE_F_PPP_CCP | IFACE_F_L3),
            ..IfaceInfo::default()
        };
        // Bound on XDP (a `PPPOE` key) or on TC (its TC program): nothing is sent into it
        // from here on, then nothing of the old session is received as its.
        let on_tc = self.links.tc.contains_key(&ifindex);
        if old.is_some() || on_tc {
            info = unbound(info);
            self.update_iface(ifindex, info)?;
        }
        if let Some(key) = old {
            let _ = self.pppoe.sessions.remove(&key);
            self.pppoe.devices.insert(ifindex, None);
        }
        if on_tc {
            self.detach_program(ifindex);
        }
        let result = match session {
            Ok(s) => self
                .bind_pppoe(name, ifindex, &mut info, s, mode)
                .map(|()| true),
            Err(why) => match self.unpaired_ppp_on_tc(name, why) {
                Some(because) => self
                    .bind_ppp_tc(name, ifindex, &mut info, because)
                    .map(|()| true),
                None => Ok(false),
            },
        };
        if !matches!(result, Ok(true)) {
            self.update_iface(ifindex, unbound(info))?;
        }
        // Released unless a bound session still runs over it (this one, bound again there).
        if let Some(key) = old {
            self.release_lower(key.lower_ifindex);
        }
        if let (Err(_), Ok(s)) = (&result, session) {
            self.release_lower(s.lower.ifindex);
        }
        result
    }

    /// `BRIDGE_FDB`: `mac` is behind `port` of `bridge` in VLAN `vid` (0: none).
    fn fdb_learn(&mut self, bridge: u32, mac: [u8; 6], vid: u16, port: u32) -> anyhow::Result<()> {
        self.bridges
            .fdb
            .insert(fdb_key(bridge, mac, vid), port, 0)
            .with_context(|| format!("cannot write {MAP_BRIDGE_FDB}"))
    }

    /// `BRIDGE_FDB`: `mac` is no longer known to `bridge` in VLAN `vid`.
    fn fdb_forget(&mut self, bridge: u32, mac: [u8; 6], vid: u16) {
        let _ = self.bridges.fdb.remove(&fdb_key(bridge, mac, vid));
    }

    /// Every `BRIDGE_FDB` entry of `bridge` goes (the bridge went away or stopped being
    /// managed).
    fn fdb_clear(&mut self, bridge: u32) {
        let keys: Vec<FdbKey> = self.bridges.fdb_keys(bridge).collect();
        for k in keys {
            let _ = self.bridges.fdb.remove(&k);
        }
    }

    /// `BRIDGE_VLANS`: `ifindex` (a port of a managed VLAN-filtering bridge, or the bridge) is
    /// a member of VLAN `vid`, sending it untagged when `untagged`.
    fn bridge_vlan_set(&mut self, ifindex: u32, vid: u16, untagged: bool) -> anyhow::Result<()> {
        let flags = if untagged { BRIDGE_VLAN_F_UNTAGGED } else { 0 };
        self.bridges
            .vlans
            .insert(bridge_vlan_key(ifindex, vid), flags, 0)
            .with_context(|| format!("cannot write {MAP_BRIDGE_VLANS}"))
    }

    /// `BRIDGE_VLANS`: `ifindex` is no longer a member of VLAN `vid`.
    fn bridge_vlan_remove(&mut self, ifindex: u32, vid: u16) {
        let _ = self.bridges.vlans.remove(&bridge_vlan_key(ifindex, vid));
    }

    /// Writes the tag protocol (`tpid`, host order) and PVID (0: none) of a registered
    /// VLAN-filtering bridge or port into its `IFACES` entry (both 0 when it does not filter).
    /// The datapath reads them only while the entry has `IFACE_F_BRIDGE_VLAN_FILTERING`.
    fn set_bridge_pvid(&mut self, ifindex: u32, tpid: u16, pvid: u16) -> anyhow::Result<()> {
        let mut info = self.iface(ifindex)?;
        info.vlan_tpid_be = tpid.to_be();
        info.vlan_tci_be = pvid.to_be();
        self.update_iface(ifindex, info)
    }
}

impl Datapath {
    /// The `IFACES` entry (stats slot `slot`, `flags`) of a device without a link-layer header
    /// (a PPP device, `wg0`): never a `TX_PORTS` entry, XDP sends nothing there.
    fn register_l3(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
    ) -> anyhow::Result<()> {
        if slot == 0 || slot >= MAX_IFACE_SLOTS {
            bail!("interface slot {slot} out of range");
        }
        let info = IfaceInfo {
            slot,
            flags,
            ..IfaceInfo::default()
        };
        self.ifaces
            .insert(ifindex, info, 0)
            .with_context(|| format!("{name}: cannot add to {MAP_IFACES}"))?;
        let _ = self.tx_ports.remove(ifindex);
        Ok(())
    }
}
