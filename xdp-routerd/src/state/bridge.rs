//! The ports of a managed bridge, as the state keeps them: a port joins (attached, with the
//! bridge's MAC and a stats slot of its own), leaves (detached), changes STP state, qdiscs,
//! hooks or XDP transmit capability (its `IFACE_F_*` flags rewritten). What the ports are is
//! read from sysfs outside the lock ([`crate::sync::bridge::read`]); the FDB copy is written
//! by [`super::State::apply_fdb`].

use std::collections::BTreeMap;

use tracing::{error, info, warn};
use xdp_router_common::{
    IFACE_F_BRIDGE_PORT, IFACE_F_EGRESS_HOOK, IFACE_F_INGRESS_HOOK, IFACE_F_NO_XDP_XMIT,
    IFACE_F_PORT_NOT_FORWARDING, IFACE_F_SHAPED, MAX_IFACE_SLOTS,
};

use super::Ports as StatePorts;
use crate::{
    config::XdpModeConfig,
    datapath::AttachMode,
    sync::{
        bridge::PortInfo,
        hooks::Hooks,
        qdisc::Egress,
        xdp_xmit::{Capabilities, XdpXmit},
    },
};

/// A managed bridge's port, as the daemon manages it.
#[derive(Debug, Clone)]
pub struct Port {
    pub name: String,
    /// Stats slot.
    pub slot: u32,
    /// XDP attach mode; `None` when the attach failed.
    pub mode: Option<AttachMode>,
    /// STP state is forwarding.
    pub forwarding: bool,
    /// Whether it can transmit XDP frames.
    pub xmit: XdpXmit,
    /// Its link kind (judges `xmit` on kernels without the `netdev` family).
    pub link_kind: Option<String>,
    /// Its egress qdiscs as last read.
    pub egress: Option<Egress>,
    /// Hooks found on it.
    pub hooks: Hooks,
}

impl Port {
    /// Why the fast path must not send out of this port because of its qdiscs, if so (in
    /// doubt, while they are unknown, it does not).
    pub fn shaped_by(&self) -> Option<String> {
        match &self.egress {
            Some(e) => e.shaper.clone(),
            None => Some("unknown qdiscs".into()),
        }
    }
}

/// The ports of one managed bridge, by ifindex.
pub type Ports = BTreeMap<u32, Port>;

/// What a bridge's ports take from the bridge.
pub struct BridgeView<'a> {
    pub name: &'a str,
    pub ifindex: u32,
    /// The bridge's MAC: frames for it are routed.
    pub mac: [u8; 6],
    /// The bridge has ingress hooks (they see the frames it passes up) and does not bypass
    /// them.
    pub ingress_hook: bool,
    /// `bypass_hooks = true` in the bridge's config (applies to its ports too).
    pub bypass_hooks: bool,
    pub xdp_mode: XdpModeConfig,
}

impl Port {
    /// The port's `IFACE_F_*` flags (without `IFACE_F_BRIDGE_PORT`, which the datapath adds).
    pub fn flags(&self, b: &BridgeView) -> u32 {
        let hooks = if b.bypass_hooks {
            Hooks::default()
        } else {
            self.hooks
        };
        let mut f = 0;
        if b.ingress_hook || hooks.ingress {
            f |= IFACE_F_INGRESS_HOOK;
        }
        if hooks.egress {
            f |= IFACE_F_EGRESS_HOOK;
        }
        if self.shaped_by().is_some() {
            f |= IFACE_F_SHAPED;
        }
        if !self.xmit.allowed() {
            f |= IFACE_F_NO_XDP_XMIT;
        }
        if !self.forwarding {
            f |= IFACE_F_PORT_NOT_FORWARDING;
        }
        f
    }
}

/// Brings `ports` in line with the bridge's ports as found (`found`, see [`ports`]): ports that
/// left are detached, new ones attached (stats slots from `next_slot` on, never reused, so a
/// slot's counters always belong to one port), and every port's flags and MAC rewritten.
pub fn sync_ports<D: StatePorts>(
    dp: &mut D,
    b: &BridgeView,
    ports: &mut Ports,
    found: Vec<PortInfo>,
    xmit: &Capabilities,
    next_slot: &mut u32,
) {
    let name = b.name;
    let gone: Vec<u32> = ports
        .keys()
        .filter(|i| !found.iter().any(|f| f.ifindex == **i))
        .copied()
        .collect();
    for ifindex in gone {
        if let Some(p) = ports.remove(&ifindex) {
            info!(bridge = name, port = %p.name, "{name}: port {} left the bridge; detached", p.name);
            dp.detach(ifindex);
        }
    }
    for f in found {
        if let Some(p) = ports.get_mut(&f.ifindex) {
            p.forwarding = f.forwarding;
            p.xmit = xmit.of(f.ifindex, f.kind.as_deref());
            if p.mode.is_some() {
                let flags = p.flags(b);
                if let Err(e) = dp
                    .set_iface_flags(f.ifindex, p.slot, flags | IFACE_F_BRIDGE_PORT)
                    .and_then(|_| dp.set_iface_mac(f.ifindex, b.mac))
                {
                    error!(bridge = name, port = %p.name, error = %format!("{e:#}"), "cannot update a bridge port");
                }
            }
            continue;
        }
        if *next_slot >= MAX_IFACE_SLOTS {
            warn!(bridge = name, port = %f.name, "{name}: no stats slot left for port {}: not accelerated", f.name);
            continue;
        }
        let mut p = Port {
            name: f.name.clone(),
            slot: *next_slot,
            mode: None,
            forwarding: f.forwarding,
            xmit: xmit.of(f.ifindex, f.kind.as_deref()),
            link_kind: f.kind.clone(),
            // Read right after (the caller's job); until then the port counts as shaped.
            egress: None,
            hooks: Hooks::default(),
        };
        *next_slot += 1;
        match dp.attach_port(
            &f.name,
            f.ifindex,
            p.slot,
            p.flags(b),
            b.mac,
            b.ifindex,
            b.xdp_mode,
        ) {
            Ok(mode) => {
                info!(bridge = name, port = %f.name, mode = mode.as_str(), "{name}: port {} attached", f.name);
                p.mode = Some(mode);
            }
            Err(e) => {
                error!(bridge = name, port = %f.name, error = %format!("{e:#}"), "{name}: cannot attach to port {}", f.name)
            }
        }
        ports.insert(f.ifindex, p);
    }
}

/// Rewrites every attached port's flags (after its qdiscs, hooks or XDP transmit capability
/// changed).
pub fn write_flags<D: StatePorts>(dp: &mut D, b: &BridgeView, ports: &Ports) {
    for (ifindex, p) in ports {
        if p.mode.is_some()
            && let Err(e) = dp.set_iface_flags(*ifindex, p.slot, p.flags(b) | IFACE_F_BRIDGE_PORT)
        {
            error!(bridge = b.name, port = %p.name, error = %format!("{e:#}"), "cannot update a bridge port's flags");
        }
    }
}

/// Re-judges every port's XDP transmit capability (after a change of the kernel's XDP
/// features) and rewrites the flags of the ports whose judgement changed.
pub fn refresh_xmit<D: StatePorts>(
    dp: &mut D,
    b: &BridgeView,
    ports: &mut Ports,
    xmit: &Capabilities,
) {
    for (ifindex, p) in ports.iter_mut() {
        let now = xmit.of(*ifindex, p.link_kind.as_deref());
        if now == p.xmit {
            continue;
        }
        p.xmit = now;
        if p.mode.is_some()
            && let Err(e) = dp.set_iface_flags(*ifindex, p.slot, p.flags(b) | IFACE_F_BRIDGE_PORT)
        {
            error!(bridge = b.name, port = %p.name, error = %format!("{e:#}"), "cannot update a bridge port's flags");
        }
    }
}
