//! The parents of the managed VLAN devices, as the state keeps them: the parent the program
//! runs on has a stats slot shared by the VLANs over it and, when it is not managed itself, its
//! own flags from its XDP transmit judgement, shaping and hooks. What a VLAN device is comes
//! from [`crate::sync::vlan`]; which parent it runs on, and why a VLAN over a VLAN device is
//! left to the kernel, is decided with the rest of the interface (`Managed::vlan_parent` in
//! [`super::iface`]); a bridge under VLAN devices is managed in [`super::bridge`].

use std::collections::BTreeMap;

use tracing::debug;

use super::{Ports, SHAPED_UNKNOWN, State, egress::egress_flags};
use crate::sync::{qdisc::Egress, vlan::VlanRead};

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
    let proto = crate::status::vlan_protocol_name(v.link.tpid);
    format!("VLAN {} ({proto}) on {}", v.link.vid, v.parent_name)
}
