//! The managed VLAN devices, as the state keeps them: the parent the program runs on (a stats
//! slot shared by the VLANs over it; its own flags from its XDP transmit judgement, shaping and
//! hooks when it is not managed itself), and the VLAN over a VLAN device left to the kernel.
//! What a VLAN device is comes from [`crate::sync::vlan`]; a bridge under VLAN devices is
//! managed in [`super::bridge`].

use std::collections::BTreeMap;

use tracing::{debug, warn};
use xdp_router_common::{IFACE_F_BRIDGE, IFACE_F_NO_XDP_XMIT, IFACE_F_SHAPED};

use super::{Managed, Ports, SHAPED_UNKNOWN, State, bridge, egress::egress_flags};
use crate::{
    datapath::VlanParent,
    sync::{qdisc::Egress, vlan::VlanRead, xdp_xmit::Capabilities},
};

impl Managed {
    /// Why the fast path carries nothing of it, when it is a VLAN device it cannot accelerate
    /// (a VLAN over a VLAN device: the program would run on the lower VLAN device, in generic
    /// mode, where it only counts).
    pub fn not_accelerated_because(&self) -> Option<String> {
        let v = self.vlan.as_ref()?;
        (v.parent_kind.as_deref() == Some("vlan")).then(|| {
            format!(
                "a VLAN over the VLAN device {} (stacked VLANs): left to the kernel",
                v.parent_name
            )
        })
    }

    /// Records what its VLAN (if it is a VLAN device) is as read; a VLAN over a VLAN device
    /// is warned about (see [`Managed::not_accelerated_because`]).
    pub(super) fn set_vlan(&mut self, vlan: Option<VlanRead>) {
        self.vlan = vlan;
        if let Some(why) = self.not_accelerated_because() {
            let name = &self.cfg.name;
            warn!(interface = %name, "{name}: not accelerated: {why}");
        }
    }

    /// Whether it is a VLAN device over a bridge (`br-lan.20`).
    pub(super) fn is_vlan_over_bridge(&self) -> bool {
        self.vlan
            .as_ref()
            .is_some_and(|v| v.parent_kind.as_deref() == Some("bridge"))
    }

    /// The parent the program runs on when this is a VLAN device, with the flags its own
    /// transmit judgement gives. Its stats slot is the one of `parent_slots` for its ifindex
    /// (shared by the VLANs over one parent), allocated from `next_slot` the first time.
    pub(super) fn vlan_parent(
        &mut self,
        xmit: &Capabilities,
        parent_slots: &mut BTreeMap<u32, u32>,
        next_slot: &mut u32,
    ) -> Option<VlanParent> {
        let v = self.vlan.as_ref()?;
        self.parent_slot = *parent_slots.entry(v.link.parent).or_insert_with(|| {
            *next_slot += 1;
            *next_slot - 1
        });
        let judged = xmit.of(v.link.parent, v.parent_kind.as_deref());
        // Shaped until its qdiscs are read (the caller's job, see `apply_qdiscs`).
        let mut flags = IFACE_F_SHAPED;
        if self.is_vlan_over_bridge() {
            // Its ports transmit; the bridge's VLAN filtering is written with them (see
            // `State::sync_bridges`), before any of them is attached.
            flags |= IFACE_F_BRIDGE | IFACE_F_NO_XDP_XMIT;
        } else if let Some(why) = judged.why_not() {
            flags |= IFACE_F_NO_XDP_XMIT;
            warn!(interface = %self.cfg.name, parent = %v.parent_name, "{}: its parent {}: {why}: the fast path does not send out of {} (egress_no_xdp_xmit)", self.cfg.name, v.parent_name, self.cfg.name);
        }
        Some(VlanParent {
            name: v.parent_name.clone(),
            ifindex: v.link.parent,
            slot: self.parent_slot,
            flags,
            mac: v.parent_mac.unwrap_or_default(),
        })
    }
}

impl<D: Ports> State<D> {
    /// The names of the attached VLAN devices over `parent`, comma-separated (`br-lan.1,
    /// br-lan.2`).
    pub(super) fn vlans_over(&self, parent: u32) -> String {
        self.ifaces
            .iter()
            .filter(|m| m.mode.is_some())
            .filter(|m| m.vlan.as_ref().is_some_and(|v| v.link.parent == parent))
            .map(|m| m.cfg.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Whether a managed interface is a VLAN device.
    pub fn has_vlans(&self) -> bool {
        self.ifaces.iter().any(|m| m.vlan.is_some())
    }

    /// The parents of managed VLAN devices that are not managed themselves: a shaped parent
    /// (`None`: qdiscs unknown) is not sent out of (the kernel sends a VLAN's packets through
    /// the parent's qdisc too).
    pub(super) fn apply_parent_qdiscs(&mut self, by_ifindex: Option<&BTreeMap<u32, Egress>>) {
        for m in &mut self.ifaces {
            if let Some(v) = &m.vlan {
                m.parent_shaper = match by_ifindex {
                    Some(b) => b.get(&v.link.parent).and_then(|e| e.shaper.clone()),
                    None => Some(SHAPED_UNKNOWN.into()),
                };
            }
        }
        self.write_parent_flags();
    }

    /// Writes the flags of every VLAN parent that is not managed itself: its own XDP transmit
    /// judgement, shaping and hooks, which the kernel's path through the VLAN device meets too.
    pub(super) fn write_parent_flags(&mut self) {
        let configured: Vec<u32> = self.ifaces.iter().filter_map(|m| m.ifindex).collect();
        for m in &self.ifaces {
            let (Some(v), Some(_)) = (&m.vlan, m.mode) else {
                continue;
            };
            let parent = v.link.parent;
            if configured.contains(&parent) {
                continue;
            }
            if let Some(kind) = &m.parent_shaper {
                debug!(interface = %m.cfg.name, parent = %v.parent_name, qdisc = %kind, "{}: its parent {} is shaped by {kind}: the fast path does not send out of {}", m.cfg.name, v.parent_name, m.cfg.name);
            }
            // A bridge transmits nothing itself (its ports do).
            let xmit = !m.is_vlan_over_bridge()
                && self.xmit.of(parent, v.parent_kind.as_deref()).allowed();
            let flags = egress_flags(
                xmit,
                m.parent_shaper.is_some(),
                m.parent_hooks,
                m.cfg.bypass_hooks,
            ) | self
                .parent_bridges
                .get(&parent)
                .map_or(0, |p| p.bridge.filtering_flag());
            if let Err(e) = self.dp.set_iface_flags(parent, m.parent_slot, flags) {
                debug!(interface = %v.parent_name, error = %format!("{e:#}"), "cannot update the VLAN parent's flags");
            }
        }
    }
}

/// `VLAN 7 (802.1Q) on eth0`.
pub(super) fn vlan_encap(v: &VlanRead) -> String {
    let proto = bridge::protocol_name(v.link.tpid);
    format!("VLAN {} ({proto}) on {}", v.link.vid, v.parent_name)
}
