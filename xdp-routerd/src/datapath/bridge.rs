//! Bridges: the copy of the managed bridges' FDBs (`BRIDGE_FDB`) and the VLANs of the
//! VLAN-filtering bridges and their ports (`BRIDGE_VLANS`). The program runs on a bridge's
//! ports, not on the bridge; registering them and writing these maps are
//! [`Ports::attach_bridge`], [`Ports::attach_port`], [`Ports::fdb_learn`] and the other FDB and
//! bridge VLAN methods of [`Ports`].

use aya::{
    Ebpf,
    maps::{HashMap, MapData},
};
use xdp_router_common::{BridgeVlanKey, FdbKey, MAP_BRIDGE_FDB, MAP_BRIDGE_VLANS};

#[cfg(doc)]
use super::Ports;
use super::{Datapath, take};

/// The managed bridges' maps.
pub(super) struct BridgeMaps {
    /// The managed bridges' FDBs.
    pub(super) fdb: HashMap<MapData, FdbKey, u32>,
    /// The VLANs of the managed VLAN-filtering bridges and their ports.
    pub(super) vlans: HashMap<MapData, BridgeVlanKey, u32>,
}

impl BridgeMaps {
    /// Takes `BRIDGE_FDB` and `BRIDGE_VLANS` out of `ebpf`.
    pub(super) fn take(ebpf: &mut Ebpf) -> anyhow::Result<BridgeMaps> {
        Ok(BridgeMaps {
            fdb: take(ebpf, MAP_BRIDGE_FDB)?,
            vlans: take(ebpf, MAP_BRIDGE_VLANS)?,
        })
    }

    /// The `BRIDGE_FDB` keys of `bridge`.
    pub(super) fn fdb_keys(&self, bridge: u32) -> impl Iterator<Item = FdbKey> + '_ {
        self.fdb
            .keys()
            .filter_map(Result::ok)
            .filter(move |k| k.bridge_ifindex == bridge)
    }

    /// Every `BRIDGE_VLANS` entry of `ifindex` goes (it is no longer managed).
    pub(super) fn clear_vlans(&mut self, ifindex: u32) {
        let keys: Vec<BridgeVlanKey> = self
            .vlans
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.ifindex == ifindex)
            .collect();
        for k in keys {
            let _ = self.vlans.remove(&k);
        }
    }
}

/// The `BRIDGE_FDB` key of `mac` behind `bridge` in VLAN `vid` (0: none).
pub(super) fn fdb_key(bridge: u32, mac: [u8; 6], vid: u16) -> FdbKey {
    FdbKey {
        bridge_ifindex: bridge,
        mac,
        vid,
    }
}

/// The `BRIDGE_VLANS` key of VLAN `vid` on `ifindex`.
pub(super) fn bridge_vlan_key(ifindex: u32, vid: u16) -> BridgeVlanKey {
    BridgeVlanKey {
        ifindex,
        vid,
        _pad: 0,
    }
}

impl Datapath {
    /// Number of `BRIDGE_FDB` entries of `bridge`.
    pub fn fdb_len(&self, bridge: u32) -> usize {
        self.bridges.fdb_keys(bridge).count()
    }
}
