//! VLAN devices: the `VLANS` map (a managed VLAN device by its tag on its parent) and the
//! parent, where the program runs and pops and pushes the tags. Registering a VLAN device is
//! [`Ports::attach_vlan`]; it goes with [`Ports::detach`].

use std::collections::BTreeMap;

use aya::{
    Ebpf,
    maps::{HashMap, MapData},
};
use xdp_router_common::{IFACE_F_VLAN_PARENT, MAP_VLANS, VlanKey};

#[cfg(doc)]
use super::PppoeBinding;
use super::{Datapath, Ports, take};

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

    /// Whether `ifindex` is the parent of a managed VLAN device.
    pub(super) fn is_parent(&self, ifindex: u32) -> bool {
        self.keys.values().any(|k| k.parent_ifindex == ifindex)
    }
}

impl Datapath {
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
