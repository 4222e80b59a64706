//! VLAN devices: the `VLANS` map (a managed VLAN device by its tag on its parent) and the
//! parent, where the program runs and pops and pushes the tags. Registering a VLAN device is
//! [`Ports::attach_vlan`]; it goes with [`Ports::detach`].

use std::collections::BTreeMap;

use anyhow::{Context as _, bail};
use aya::{
    Ebpf,
    maps::{HashMap, MapData, MapError},
};
use xdp_router_common::{
    IFACE_F_BRIDGE, IFACE_F_NO_XDP_XMIT, IFACE_F_VLAN_PARENT, IfaceInfo, MAP_IFACES, MAP_VLANS,
    MAX_IFACE_SLOTS, VlanKey,
};

#[cfg(doc)]
use super::PppoeBinding;
use super::{AttachMode, Datapath, Ports, take};
use crate::config::{DatapathConfig, XdpModeConfig};

/// The parent of a managed VLAN device, where the program runs (see
/// [`Ports::attach_vlan`]; a bridge when `flags` has `IFACE_F_BRIDGE`); also the lower
/// device of a managed PPPoE session (see [`PppoeBinding`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VlanParent {
    pub name: String,
    pub ifindex: u32,
    /// Stats slot for what it receives that is not the VLANs' (when not managed itself).
    pub slot: u32,
    /// Its `IFACE_F_*` flags (XDP transmit, shaping, hooks), as for a managed interface.
    pub flags: u32,
    pub mac: [u8; 6],
}

/// The managed VLAN devices.
pub(super) struct VlanMaps {
    /// `VLANS`: the managed VLAN devices by their tag on the parent.
    pub(super) map: HashMap<MapData, VlanKey, u32>,
    /// The managed VLAN devices (ifindex → their `VLANS` key), to find what to undo.
    pub(super) keys: BTreeMap<u32, VlanKey>,
}

impl VlanMaps {
    /// Takes `VLANS` out of `ebpf`; no VLAN device is managed yet.
    pub(super) fn take(ebpf: &mut Ebpf) -> anyhow::Result<VlanMaps> {
        Ok(VlanMaps {
            map: take(ebpf, MAP_VLANS)?,
            keys: BTreeMap::new(),
        })
    }

    /// Adds the VLAN device `ifindex` under its `VLANS` key.
    pub(super) fn add(&mut self, key: VlanKey, ifindex: u32) -> Result<(), MapError> {
        self.map.insert(key, ifindex, 0)?;
        self.keys.insert(ifindex, key);
        Ok(())
    }

    /// Whether `ifindex` is the parent of a managed VLAN device.
    pub(super) fn is_parent(&self, ifindex: u32) -> bool {
        self.keys.values().any(|k| k.parent_ifindex == ifindex)
    }
}

impl Datapath {
    /// Makes the program run for the VLAN frames of `parent` (see [`Ports::attach_vlan`]) and
    /// returns its mode there: on the parent itself unless it runs there already; a bridge
    /// parent is registered only (the program runs on its ports, [`AttachMode::Ports`]).
    pub(super) fn run_on_parent(
        &mut self,
        parent: &VlanParent,
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode> {
        let bridge = self
            .ifaces
            .get(&parent.ifindex, 0)
            .map_or(parent.flags, |i| i.flags)
            & IFACE_F_BRIDGE
            != 0;
        Ok(if bridge {
            self.register_parent_entry(parent)?;
            AttachMode::Ports
        } else if self.links.xdp.contains_key(&parent.ifindex)
            && self.ifaces.get(&parent.ifindex, 0).is_ok()
        {
            self.attached_mode(parent.ifindex)
        } else {
            // Not registered yet (the program may run there already: attached by
            // `native_on_host_or_why` for this VLAN or a PPPoE session over it; `register`
            // keeps it).
            let info = IfaceInfo {
                slot: parent.slot,
                flags: parent.flags | IFACE_F_VLAN_PARENT,
                mac: parent.mac,
                ..IfaceInfo::default()
            };
            self.register(&parent.name, parent.ifindex, info, mode, false)?
        })
    }

    /// The parent's `IFACES` entry where no program runs on it (a bridge, whose ports run it;
    /// a parent without native XDP, whose VLAN devices run the TC fast path): its stats slot
    /// and flags (shaping, hooks: the redirect must respect them), `IFACE_F_VLAN_PARENT`.
    /// Left as it is when registered already (managed itself, or for another VLAN).
    pub(super) fn register_parent_entry(&mut self, parent: &VlanParent) -> anyhow::Result<()> {
        if self.ifaces.get(&parent.ifindex, 0).is_ok() {
            return Ok(());
        }
        if parent.slot == 0 || parent.slot >= MAX_IFACE_SLOTS {
            bail!("interface slot {} out of range", parent.slot);
        }
        let info = IfaceInfo {
            slot: parent.slot,
            flags: parent.flags | IFACE_F_VLAN_PARENT | IFACE_F_NO_XDP_XMIT,
            mac: parent.mac,
            ..IfaceInfo::default()
        };
        self.ifaces
            .insert(parent.ifindex, info, 0)
            .with_context(|| format!("{}: cannot add to {MAP_IFACES}", parent.name))
    }

    /// Whether the VLAN device `name` over `parent` runs the TC fast path itself instead of
    /// the program on its parent, and why (for `status`); `None`: on the parent (see
    /// [`Datapath::run_on_parent`]). TC where the parent runs the TC fast path itself, where
    /// `datapath = "tc"` applies to the device, and with `"auto"` where the parent refuses
    /// native XDP (the attempt leaves the XDP program on the parent when it succeeds,
    /// registered by [`Datapath::run_on_parent`]). Never
    /// for a VLAN over a bridge, a parent that runs XDP already, or a PPPoE session's lower
    /// device (`pppoe_lower`: its sessions are handled on XDP only).
    pub(super) fn vlan_on_tc(
        &mut self,
        name: &str,
        parent: &VlanParent,
        mode: XdpModeConfig,
        pppoe_lower: bool,
    ) -> anyhow::Result<Option<String>> {
        let parent_flags = self
            .ifaces
            .get(&parent.ifindex, 0)
            .map_or(parent.flags, |i| i.flags);
        if pppoe_lower
            || parent_flags & IFACE_F_BRIDGE != 0
            || self.links.xdp.contains_key(&parent.ifindex)
            || self.tc_unavailable.is_some()
        {
            return Ok(None);
        }
        if self.mode_of(parent.ifindex) == Some(AttachMode::Tc) {
            return Ok(Some(format!(
                "its parent {} runs the TC fast path (its frames reach {name} untagged)",
                parent.name
            )));
        }
        let (choice, from) = self.datapath_choice.of(name);
        match choice {
            DatapathConfig::Tc => Ok(Some(format!(
                "datapath = \"tc\" in {from}: on {name} itself (its frames arrive untagged)"
            ))),
            DatapathConfig::Auto if mode == XdpModeConfig::Native => {
                Ok(self.native_on_host_or_why(name, parent, from)?.map(|why| {
                    format!(
                        "datapath = \"auto\" in {from}, and native XDP was refused on its \
                         parent {}: {why}",
                        parent.name
                    )
                }))
            }
            _ => Ok(None),
        }
    }

    /// Forgets the VLAN device `ifindex` (see [`Ports::attach_vlan`]) and detaches from its
    /// parent when the parent was managed only for its VLANs and none is left.
    pub(super) fn detach_vlan(&mut self, ifindex: u32) {
        let Some(key) = self.vlans.keys.remove(&ifindex) else {
            return;
        };
        let _ = self.vlans.map.remove(&key);
        let parent = key.parent_ifindex;
        let in_use = self.vlans.is_parent(parent);
        let parent_only = self
            .ifaces
            .get(&parent, 0)
            .is_ok_and(|i| i.flags & IFACE_F_VLAN_PARENT != 0);
        if !in_use && parent_only {
            self.detach(parent);
        }
    }
}
