//! One managed interface as the state keeps it ([`Managed`]): its config, what it is in the
//! kernel (ifindex, link kind, MAC, bridge, VLAN or PPP device), how it is attached, and what
//! its egress is judged to be. Attaching and detaching it by its kind lives here; its egress
//! judgements in [`super::egress`], its VLAN, bridge and PPPoE sides in [`super::vlan`],
//! [`super::bridge`] and [`super::pppoe`].

use tracing::warn;

use super::{
    Ports,
    bridge::{Bridge, Vlans},
    pppoe::PppoeState,
};
use crate::{
    config::{InterfaceConfig, XdpModeConfig},
    datapath::{AttachMode, VlanParent},
    sync::{hooks::Hooks, qdisc::Egress, vlan::VlanRead, xdp_xmit::XdpXmit},
};

use super::egress::egress_flags;

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
    /// to `parent` when it is a VLAN device; a PPP device is only registered (its session is
    /// bound by [`super::State::apply_pppoe`]).
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
}
