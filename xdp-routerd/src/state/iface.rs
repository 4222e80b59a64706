//! One managed interface as the state keeps it ([`Managed`]): its config, what it is in the
//! kernel (ifindex, link kind, MAC, bridge, VLAN or PPP device), how it is attached, and what
//! its egress is judged to be (qdiscs, hooks, XDP transmit), each change logged. Everything
//! [`Managed`] does itself is here, its bridge, VLAN and PPPoE sides included, so the files of
//! the state's other concerns import it and it imports none of them but the device kinds'
//! types ([`super::bridge`], [`super::pppoe`]) and the flags ([`super::egress`]).

use std::collections::BTreeMap;

use tracing::{debug, info, warn};
use xdp_router_common::{
    IFACE_F_BRIDGE, IFACE_F_INGRESS_HOOK, IFACE_F_NO_XDP_XMIT, IFACE_F_SHAPED,
};

use super::{
    Ports,
    bridge::{Bridge, BridgeView, Vlans},
    egress::{SHAPED_UNKNOWN, egress_flags},
    pppoe::PppoeState,
};
use crate::{
    config::{InterfaceConfig, Shaped, XdpModeConfig},
    datapath::{AttachMode, VlanParent},
    status::PppoeStatus,
    sync::{
        bridge::{BridgeKind, BridgeRead},
        hooks::Hooks,
        qdisc::Egress,
        vlan::VlanRead,
        xdp_xmit::{Capabilities, XdpXmit},
    },
};

/// A managed interface as configured, and what it currently is in the kernel.
pub struct Managed {
    pub(super) cfg: InterfaceConfig,
    pub(super) slot: u32,
    pub(super) ifindex: Option<u32>,
    pub(super) mode: Option<AttachMode>,
    /// Its egress qdiscs as last read; `None` until read (or when the last read failed).
    pub(super) egress: Option<Egress>,
    /// nftables netdev chains / tc filters found on it (see [`crate::sync::hooks`]).
    pub(super) hooks: Hooks,
    /// The MAC address it was attached with (for a bridge: what its ports route for).
    pub(super) mac: [u8; 6],
    /// Whether it can transmit XDP frames (see [`crate::sync::xdp_xmit`]).
    pub(super) xmit: XdpXmit,
    /// Its link kind as last read (judges `xmit` on kernels without the `netdev` family).
    pub(super) link_kind: Option<String>,
    /// For a bridge: its ports, where the program runs, and its VLAN filtering (see
    /// [`super::bridge`]).
    pub(super) bridge: Option<Bridge>,
    /// For a VLAN device: its VLAN and parent, where the program runs (see
    /// [`crate::sync::vlan`]).
    pub(super) vlan: Option<VlanRead>,
    /// Stats slot of the VLAN parent's own entry (0 = none allocated yet).
    pub(super) parent_slot: u32,
    /// The VLAN parent's shaping qdisc as last read ([`SHAPED_UNKNOWN`] until read).
    pub(super) parent_shaper: Option<String>,
    /// The VLAN parent's hooks as last read.
    pub(super) parent_hooks: Hooks,
    /// For a PPP device (link kind `ppp`): its PPPoE session (see [`super::pppoe`]); `None` for
    /// any other device.
    pub(super) pppoe: Option<PppoeState>,
    /// Present without an Ethernet address (and not a PPP device): a device without a
    /// link-layer header, on the TC fast path (see [`super::attach_mac`]).
    pub(super) no_link_layer: bool,
}

impl Managed {
    /// Records its link kind as read; a PPP device starts without a session (read next).
    pub(super) fn set_link_kind(&mut self, kind: Option<String>) {
        self.link_kind = kind;
        self.pppoe = self.is_ppp().then(PppoeState::default);
        if let (Some(d), Some(_), false) = (&self.cfg.pppoe_device, &self.link_kind, self.is_ppp())
        {
            let name = &self.cfg.name;
            warn!(interface = %name, "{name}: pppoe_device = {d:?} is ignored: {name} is not a PPP device");
        }
    }

    /// The `IFACE_F_*` flags the datapath gets for it.
    pub fn flags(&self) -> u32 {
        egress_flags(
            self.xmit.allowed(),
            self.shaped_by().is_some(),
            self.hooks,
            self.cfg.bypass_hooks,
        ) | self.bridge.as_ref().map_or(0, Bridge::filtering_flag)
    }

    /// Attaches to the interface (now `ifindex`, with `mac`): to its ports when it is a bridge,
    /// to `parent` when it is a VLAN device, the TC fast path when it has no link-layer header;
    /// a PPP device is only registered (its session is bound by
    /// [`super::State::apply_pppoe`]).
    pub(super) fn attach<D: Ports>(
        &mut self,
        dp: &mut D,
        ifindex: u32,
        mac: [u8; 6],
        xdp_mode: XdpModeConfig,
        parent: Option<VlanParent>,
    ) -> anyhow::Result<AttachMode> {
        self.mac = mac;
        if let (Some(parent), Some(v)) = (parent, &self.vlan) {
            let vlan = (v.link.vid, v.link.tpid);
            dp.attach_vlan(
                &self.cfg.name,
                ifindex,
                self.slot,
                self.flags(),
                mac,
                vlan,
                &parent,
                xdp_mode,
            )
        } else if self.no_link_layer {
            dp.attach_l3(&self.cfg.name, ifindex, self.slot, self.flags())
        } else if self.bridge.is_some() {
            dp.attach_bridge(&self.cfg.name, ifindex, self.slot, self.flags(), mac)
        } else if self.is_ppp() {
            dp.attach_ppp(&self.cfg.name, ifindex, self.slot, self.flags())
        } else {
            dp.attach(
                &self.cfg.name,
                ifindex,
                self.slot,
                self.flags(),
                mac,
                xdp_mode,
            )
        }
    }

    /// Detaches from it, its ports and their FDB entries and VLANs included.
    pub(super) fn detach<D: Ports>(&mut self, dp: &mut D, ifindex: u32) {
        if let Some(b) = &mut self.bridge {
            for port in std::mem::take(&mut b.ports).into_keys() {
                dp.detach(port);
            }
            b.vlans = Vlans::default();
            dp.fdb_clear(ifindex);
        }
        // The datapath forgets the session with the PPP device.
        if let Some(p) = &mut self.pppoe {
            *p = PppoeState::default();
        }
        dp.detach(ifindex);
    }

    /// Why the fast path must not send out of this interface (`config`, the shaping qdisc's
    /// kind, or [`SHAPED_UNKNOWN`]); `None` when it may.
    pub fn shaped_by(&self) -> Option<String> {
        match self.cfg.shaped {
            Shaped::Always => Some("config".into()),
            Shaped::Never => None,
            Shaped::Auto => match &self.egress {
                Some(e) => e.shaper.clone(),
                None => Some(SHAPED_UNKNOWN.into()),
            },
        }
    }

    /// Records a new XDP transmit judgement and logs what changes for the fast path. Returns
    /// whether it changed whether packets may be redirected into the interface.
    pub(super) fn set_xmit(&mut self, xmit: XdpXmit) -> bool {
        let before = self.xmit.allowed();
        let first = self.xmit == XdpXmit::Unknown;
        self.xmit = xmit;
        let name = &self.cfg.name;
        match (before, self.xmit.why_not()) {
            // A bridge transmits nothing itself: its ports do; a VLAN device: its parent; a
            // PPP device: its session's lower device.
            _ if self.bridge.is_some() || self.vlan.is_some() || self.is_ppp() => {}
            (true, Some(why)) => {
                warn!(interface = %name, "{name}: {why}: the fast path does not send out of it (egress_no_xdp_xmit)")
            }
            (false, None) if !first => {
                info!(interface = %name, "{name}: can transmit XDP frames again: the fast path sends out of it")
            }
            _ => {}
        }
        before != self.xmit.allowed()
    }

    /// Records freshly read hooks and logs what changes for the fast path. Returns whether
    /// they changed.
    pub(super) fn set_hooks(&mut self, hooks: Hooks) -> bool {
        if hooks == self.hooks {
            return false;
        }
        self.hooks = hooks;
        let name = &self.cfg.name;
        if self.cfg.bypass_hooks {
            info!(interface = %name, ?hooks, "{name}: netdev chains / tc filters changed; bypass_hooks = true: the fast path jumps over them");
        } else {
            info!(
                interface = %name,
                ingress = hooks.ingress,
                egress = hooks.egress,
                "{name}: netdev chains / tc filters: packets that would pass them stay in the kernel"
            );
        }
        true
    }

    /// Records freshly read egress qdiscs (`None`: the read failed) and logs what changes for
    /// the fast path. Returns whether the datapath flags changed.
    pub(super) fn set_egress(&mut self, egress: Option<Egress>) -> bool {
        let name = &self.cfg.name;
        let before = self.shaped_by();
        let shaper_before = self.egress.as_ref().and_then(|e| e.shaper.clone());
        self.egress = egress;
        let after = self.shaped_by();
        if self.cfg.shaped == Shaped::Never {
            let shaper = self.egress.as_ref().and_then(|e| e.shaper.clone());
            if let Some(kind) = shaper.as_deref()
                && shaper != shaper_before
            {
                warn!(
                    interface = %name,
                    qdisc = kind,
                    "{name}: egress shaped by {kind}, but the config says shaped = false: the fast path bypasses it"
                );
            }
        }
        if before == after {
            return false;
        }
        match (before.as_deref(), after.as_deref()) {
            (_, Some(SHAPED_UNKNOWN)) => warn!(
                interface = %name,
                "{name}: cannot read its qdiscs: fast path will not send out of it until they are known"
            ),
            (_, Some(kind)) => info!(
                interface = %name,
                qdisc = kind,
                "{name}: egress shaped by {kind}: fast path will not send out of it"
            ),
            // Not shaped at start: nothing to say.
            (Some(SHAPED_UNKNOWN), None) => debug!(interface = %name, "egress not shaped"),
            (_, None) => {
                let root = self
                    .egress
                    .as_ref()
                    .and_then(|e| e.root.as_deref())
                    .unwrap_or("none");
                info!(
                    interface = %name,
                    qdisc = root,
                    "{name}: egress no longer shaped (root qdisc {root}): fast path sends out of it again"
                )
            }
        }
        true
    }

    /// Why the fast path carries nothing of it, when it is an attached VLAN device it cannot
    /// accelerate: a VLAN over a VLAN device is carried by the TC fast path on itself only
    /// (the kernel takes both tags off before it); XDP would run on the lower VLAN device, in
    /// generic mode, where it only counts.
    pub fn not_accelerated_because(&self) -> Option<String> {
        let v = self.vlan.as_ref()?;
        let on_xdp = self.mode.is_some_and(|m| m != AttachMode::Tc);
        (on_xdp && v.parent_kind.as_deref() == Some("vlan")).then(|| {
            format!(
                "a VLAN over the VLAN device {} (stacked VLANs), not on the TC fast path: \
                 left to the kernel",
                v.parent_name
            )
        })
    }

    /// Records what its VLAN (if it is a VLAN device) is as read.
    pub(super) fn set_vlan(&mut self, vlan: Option<VlanRead>) {
        self.vlan = vlan;
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

    /// Records what sysfs says the interface is (`read`): a bridge is managed through its
    /// ports, with its VLAN filtering as read.
    pub fn set_bridge_kind(&mut self, read: &BridgeRead) {
        self.bridge = (read.kind == BridgeKind::Bridge).then(|| {
            let mut b = Bridge::default();
            b.set_filtering(&self.cfg.name, read);
            b
        });
    }

    /// What the ports of `b` (its bridge, taken out of it while they are synced) take from it
    /// (`None` while it is missing).
    pub(super) fn bridge_view(
        &self,
        xdp_mode: XdpModeConfig,
        b: &Bridge,
    ) -> Option<BridgeView<'_>> {
        let flags = self.flags();
        Some(BridgeView {
            name: &self.cfg.name,
            ifindex: self.ifindex?,
            mac: self.mac,
            ingress_hook: flags & IFACE_F_INGRESS_HOOK != 0,
            bypass_hooks: self.cfg.bypass_hooks,
            xdp_mode,
            filtering_flag: b.filtering_flag(),
            parent_only: false,
        })
    }

    /// Whether it is a PPP device (`ppp0`), as last read.
    pub fn is_ppp(&self) -> bool {
        self.link_kind.as_deref() == Some("ppp")
    }

    /// What `status` says of its PPPoE session: the bound session (`PPPoE session 0x0001 over
    /// eth0 (peer ...)`); `None` for any other device or while none is bound.
    pub fn pppoe_encap(&self) -> Option<String> {
        let b = self.pppoe.as_ref()?.bound.as_ref()?;
        Some(b.session.to_string())
    }

    /// Its PPPoE session for `status` (`None` unless it is a PPP device).
    pub fn pppoe_status(&self) -> Option<PppoeStatus> {
        let p = self.pppoe.as_ref()?;
        let b = p.bound.as_ref();
        Some(PppoeStatus {
            session_id: b.map(|b| b.session.id()),
            lower: b.map(|b| b.session.lower.clone()),
            peer_mac: b.map(|b| crate::sync::pppoe::fmt_mac(b.session.peer)),
            not_accelerated_because: p.not_accelerated_because(),
        })
    }
}
