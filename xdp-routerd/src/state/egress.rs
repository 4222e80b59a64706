//! What a device may do in the fast path on its way out: its egress qdiscs (`shaped`), its
//! hooks (nftables netdev chains, tc filters) and whether it can transmit XDP frames, each
//! read outside the lock and applied here to the managed interfaces, the bridges' ports, the
//! VLAN parents and the PPPoE lower devices (their `IFACE_F_*` flags rewritten).

use tracing::error;
use xdp_router_common::{
    IFACE_F_EGRESS_HOOK, IFACE_F_INGRESS_HOOK, IFACE_F_NO_XDP_XMIT, IFACE_F_SHAPED,
};

use super::{Ports, State, bridge};
use crate::sync::{
    hooks::{self, Hooks},
    qdisc::{self, Qdisc},
    xdp_xmit::XmitEvent,
};

/// The `IFACE_F_*` flags of what a device may do in the fast path, for a managed interface
/// and for a device managed only under one (a VLAN parent, a PPPoE lower device) alike: it
/// transmits XDP frames (`xmit`), is shaped, has hooks (ignored with `bypass_hooks`).
pub fn egress_flags(xmit: bool, shaped: bool, hooks: Hooks, bypass_hooks: bool) -> u32 {
    let mut flags = 0;
    if !xmit {
        flags |= IFACE_F_NO_XDP_XMIT;
    }
    if shaped {
        flags |= IFACE_F_SHAPED;
    }
    if !bypass_hooks {
        if hooks.ingress {
            flags |= IFACE_F_INGRESS_HOOK;
        }
        if hooks.egress {
            flags |= IFACE_F_EGRESS_HOOK;
        }
    }
    flags
}

/// `shaped_by` while `shaped = "auto"` and the qdiscs are not known yet: in doubt the fast
/// path does not send out of the interface.
pub(super) const SHAPED_UNKNOWN: &str = "unknown qdiscs";

impl<D: Ports> State<D> {
    /// The configured interface names and the names of the managed bridges' ports (whose hooks
    /// are read too).
    pub fn hook_names(&self) -> Vec<String> {
        self.ifaces
            .iter()
            .flat_map(|m| {
                let ports = m
                    .bridge
                    .iter()
                    .flat_map(|b| b.ports.values().map(|p| p.name.clone()));
                let parent = m.vlan.iter().map(|v| v.parent_name.clone());
                let session = m
                    .pppoe
                    .iter()
                    .flat_map(|p| p.sides().into_iter().map(|d| d.name.to_string()));
                std::iter::once(m.cfg.name.clone())
                    .chain(ports)
                    .chain(parent)
                    .chain(session)
            })
            .chain(
                self.parent_bridges
                    .values()
                    .flat_map(|p| p.bridge.ports.values().map(|p| p.name.clone())),
            )
            .collect()
    }

    /// Whether `ifindex` is a managed interface or a managed bridge's port (whose qdiscs the
    /// fast path follows).
    pub fn has_egress_of(&self, ifindex: u32) -> bool {
        self.ifaces.iter().any(|m| {
            m.ifindex == Some(ifindex)
                || m.bridge
                    .as_ref()
                    .is_some_and(|b| b.ports.contains_key(&ifindex))
        }) || self
            .parent_bridges
            .values()
            .any(|p| p.bridge.ports.contains_key(&ifindex))
    }

    /// Applies a fresh qdisc read to every present managed interface and updates the flags of
    /// those whose shaping changed (start-up and every qdisc change: the one qdisc path).
    pub fn apply_qdiscs(&mut self, qdiscs: std::io::Result<Vec<Qdisc>>) {
        let by_ifindex = match qdiscs {
            Ok(q) => Some(qdisc::egress_by_ifindex(&q)),
            Err(e) => {
                error!(error = %e, "cannot read qdiscs (RTM_GETQDISC)");
                None
            }
        };
        for m in &mut self.ifaces {
            let Some(ifindex) = m.ifindex else {
                continue;
            };
            let egress = by_ifindex
                .as_ref()
                .map(|b| b.get(&ifindex).cloned().unwrap_or_default());
            if m.set_egress(egress) && m.mode.is_some() {
                let flags = m.flags();
                if let Err(e) = self.dp.set_iface_flags(ifindex, m.slot, flags) {
                    error!(interface = %m.cfg.name, error = %format!("{e:#}"), "cannot update interface flags");
                }
            }
            let mut b = m.bridge.take();
            if let Some(b) = b.as_mut()
                && let Some(view) = m.bridge_view(self.xdp_mode, b)
            {
                for (i, p) in b.ports.iter_mut() {
                    p.egress = by_ifindex
                        .as_ref()
                        .map(|b| b.get(i).cloned().unwrap_or_default());
                }
                bridge::write_flags(&mut self.dp, &view, &b.ports);
            }
            m.bridge = b;
        }
        let mut parents = std::mem::take(&mut self.parent_bridges);
        for (ifindex, pb) in &mut parents {
            let mut b = std::mem::take(&mut pb.bridge);
            for (i, p) in b.ports.iter_mut() {
                p.egress = by_ifindex
                    .as_ref()
                    .map(|b| b.get(i).cloned().unwrap_or_default());
            }
            let view = self.parent_bridge_view(*ifindex, pb, &b);
            bridge::write_flags(&mut self.dp, &view, &b.ports);
            pb.bridge = b;
        }
        self.parent_bridges = parents;
        self.apply_parent_qdiscs(by_ifindex.as_ref());
        self.apply_session_qdiscs(by_ifindex.as_ref());
    }

    /// Follows a change of the kernel's XDP features (a veth peer got or lost XDP/GRO, a
    /// device came or went): flips `IFACE_F_NO_XDP_XMIT` where the judgement changed, on the
    /// managed interfaces, the bridges' ports and the VLAN parents.
    pub fn apply_xmit_event(&mut self, event: XmitEvent) {
        self.xmit.apply(event);
        for m in &mut self.ifaces {
            let (Some(ifindex), Some(_)) = (m.ifindex, m.mode) else {
                continue;
            };
            if m.set_xmit(self.xmit.of(ifindex, m.link_kind.as_deref()))
                && let Err(e) = self.dp.set_iface_flags(ifindex, m.slot, m.flags())
            {
                error!(interface = %m.cfg.name, error = %format!("{e:#}"), "cannot update interface flags");
            }
            let mut b = m.bridge.take();
            if let Some(b) = b.as_mut()
                && let Some(view) = m.bridge_view(self.xdp_mode, b)
            {
                bridge::refresh_xmit(&mut self.dp, &view, &mut b.ports, &self.xmit);
            }
            m.bridge = b;
        }
        let mut parents = std::mem::take(&mut self.parent_bridges);
        for (ifindex, pb) in &mut parents {
            let mut b = std::mem::take(&mut pb.bridge);
            let view = self.parent_bridge_view(*ifindex, pb, &b);
            bridge::refresh_xmit(&mut self.dp, &view, &mut b.ports, &self.xmit);
            pb.bridge = b;
        }
        self.parent_bridges = parents;
        // The VLAN parents' and PPPoE lower devices' own judgement.
        self.write_parent_flags();
        self.write_session_flags();
    }

    /// Applies freshly read hooks (by interface name, see [`State::hook_names`]) and updates
    /// the flags of the interfaces whose hooks changed, and of the bridges' ports.
    pub fn apply_hooks(&mut self, found: &hooks::Found) {
        for m in &mut self.ifaces {
            let h = found.device(&m.cfg.name);
            if m.set_hooks(h)
                && let (Some(ifindex), Some(_)) = (m.ifindex, m.mode)
                && let Err(e) = self.dp.set_iface_flags(ifindex, m.slot, m.flags())
            {
                error!(interface = %m.cfg.name, error = %format!("{e:#}"), "cannot update interface flags");
            }
            let mut b = m.bridge.take();
            if let Some(b) = b.as_mut()
                && let Some(view) = m.bridge_view(self.xdp_mode, b)
            {
                for p in b.ports.values_mut() {
                    p.hooks = found.port(&p.name);
                }
                bridge::write_flags(&mut self.dp, &view, &b.ports);
            }
            m.bridge = b;
            if let Some(v) = &m.vlan {
                m.parent_hooks = found.device(&v.parent_name);
            }
            if let Some(p) = &mut m.pppoe {
                p.set_hooks(|name| found.device(name));
            }
        }
        let mut parents = std::mem::take(&mut self.parent_bridges);
        for (ifindex, pb) in &mut parents {
            pb.hooks = found.device(&pb.name);
            let mut b = std::mem::take(&mut pb.bridge);
            for p in b.ports.values_mut() {
                p.hooks = found.port(&p.name);
            }
            let view = self.parent_bridge_view(*ifindex, pb, &b);
            bridge::write_flags(&mut self.dp, &view, &b.ports);
            pb.bridge = b;
        }
        self.parent_bridges = parents;
        self.write_parent_flags();
        self.write_session_flags();
    }
}
