//! PPPoE sessions: the `PPPOE` map (a PPP device by its session's frames on the lower device)
//! and the lower device, where the program runs and pops and pushes the PPPoE and PPP headers.
//! Registering a PPP device and binding its session are [`Ports::attach_ppp`] and
//! [`Ports::set_pppoe`]; both go with [`Ports::detach`].

use std::collections::BTreeMap;

use anyhow::{Context as _, bail};
use aya::{
    Ebpf,
    maps::{HashMap, MapData},
};
use tracing::info;
use xdp_router_common::{
    IFACE_F_BRIDGE, IFACE_F_BRIDGE_PORT, IFACE_F_L3, IFACE_F_NO_XDP_XMIT, IFACE_F_PPPOE,
    IFACE_F_PPPOE_LOWER, IFACE_F_VLAN_PARENT, IfaceInfo, MAP_PPPOE, PppoeKey,
};

use super::{AttachMode, Datapath, Ports, VlanParent, take};
use crate::config::{DatapathConfig, XdpModeConfig};

/// A PPPoE session as [`Ports::set_pppoe`] binds it to its PPP device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PppoeBinding {
    /// The session ID as the kernel holds it (network order).
    pub sid_be: u16,
    /// The access concentrator's MAC.
    pub peer_mac: [u8; 6],
    /// The device the session runs over, where its frames arrive; `slot` and `flags` are used
    /// when it is registered for the session only.
    pub lower: VlanParent,
    /// When `lower` is a VLAN device: its VLAN ID and tag protocol, and its parent, where the
    /// program then runs.
    pub vlan: Option<((u16, u16), VlanParent)>,
    /// CCP (compression, MPPE) has run on the PPP device: only the TC fast path on the PPP
    /// device, between the kernel's PPP layer and the IP layer, may carry it (see
    /// `sync::ppp_compression`).
    pub ccp: bool,
    /// Why XDP cannot take the session's frames off the wire (a bridge under it), if so
    /// (`sync::pppoe::SessionRead::not_for_xdp`): only the TC fast path on the PPP device
    /// serves it.
    pub not_for_xdp: Option<String>,
}

/// The managed PPPoE sessions and PPP devices.
pub(super) struct PppoeMaps {
    /// `PPPOE`: the managed PPPoE sessions, by their frames on the lower device.
    pub(super) sessions: HashMap<MapData, PppoeKey, u32>,
    /// The registered PPP devices (ifindex → the `PPPOE` key of their session, when bound).
    pub(super) devices: BTreeMap<u32, Option<PppoeKey>>,
}

impl PppoeMaps {
    /// Takes `PPPOE` out of `ebpf`; no PPP device is registered yet.
    pub(super) fn take(ebpf: &mut Ebpf) -> anyhow::Result<PppoeMaps> {
        Ok(PppoeMaps {
            sessions: take(ebpf, MAP_PPPOE)?,
            devices: BTreeMap::new(),
        })
    }

    /// Whether a bound PPPoE session runs over `ifindex`.
    pub(super) fn lower_in_use(&self, ifindex: u32) -> bool {
        self.devices
            .values()
            .flatten()
            .any(|k| k.lower_ifindex == ifindex)
    }
}

impl Datapath {
    /// [`Ports::set_pppoe`] with a session: lower device, entry, key.
    pub(super) fn bind_pppoe(
        &mut self,
        name: &str,
        ifindex: u32,
        info: &mut IfaceInfo,
        s: &PppoeBinding,
        mode: XdpModeConfig,
    ) -> anyhow::Result<()> {
        if let Some(because) = self.ppp_on_tc(name, s, mode)? {
            return self.bind_ppp_tc(name, ifindex, info, because);
        }
        let tc_ruled_out = || match &self.tc_unavailable {
            Some(why) => format!("is unavailable here ({why})"),
            None => format!(
                "is ruled out by datapath = \"xdp\" in {}",
                self.datapath_choice.of(name).1
            ),
        };
        if s.ccp {
            // XDP would carry packets past the compressor and decompressor (and out
            // unencrypted, under MPPE).
            bail!(
                "CCP (PPP compression or MPPE) runs on it: XDP cannot carry it, and the TC \
                 fast path, which can, {}",
                tc_ruled_out()
            );
        }
        if let Some(why) = &s.not_for_xdp {
            bail!(
                "{why}: XDP cannot take its frames there, and the TC fast path on {name}, \
                 which can, {}",
                tc_ruled_out()
            );
        }
        let lower = &s.lower;
        match self.ifaces.get(&lower.ifindex, 0) {
            Ok(l) if l.flags & (IFACE_F_BRIDGE | IFACE_F_BRIDGE_PORT) != 0 => {
                bail!(
                    "{name}: its PPPoE session runs over a bridge or bridge port ({})",
                    lower.name
                )
            }
            Ok(mut l)
                if l.flags & IFACE_F_VLAN_PARENT != 0 && l.flags & IFACE_F_PPPOE_LOWER == 0 =>
            {
                // Managed only as the parent of VLANs so far: now its session frames too.
                l.flags |= IFACE_F_PPPOE_LOWER;
                self.update_iface(lower.ifindex, l)?;
            }
            Ok(mut l) if l.flags & IFACE_F_PPPOE_LOWER != 0 && l.mac != lower.mac => {
                // Managed for sessions (this one, another): its MAC as read now.
                l.mac = lower.mac;
                self.update_iface(lower.ifindex, l)?;
            }
            // Managed itself, or for another session already: the program runs there.
            Ok(_) => {}
            Err(_) => {
                let flags = lower.flags | IFACE_F_PPPOE_LOWER;
                match &s.vlan {
                    Some((vlan, parent)) => {
                        self.attach_vlan(
                            &lower.name,
                            lower.ifindex,
                            lower.slot,
                            flags,
                            lower.mac,
                            *vlan,
                            parent,
                            mode,
                        )?;
                    }
                    None => {
                        let l = IfaceInfo {
                            slot: lower.slot,
                            flags,
                            mac: lower.mac,
                            ..IfaceInfo::default()
                        };
                        self.register(&lower.name, lower.ifindex, l, mode, false)?;
                    }
                }
            }
        }
        *info = IfaceInfo {
            slot: info.slot,
            flags: info.flags | IFACE_F_PPPOE,
            mac: lower.mac,
            lower_ifindex: lower.ifindex,
            pppoe_sid_be: s.sid_be,
            peer_mac: s.peer_mac,
            ..IfaceInfo::default()
        };
        self.update_iface(ifindex, *info)?;
        let key = PppoeKey {
            lower_ifindex: lower.ifindex,
            sid_be: s.sid_be,
            _pad: 0,
        };
        self.pppoe
            .sessions
            .insert(key, ifindex, 0)
            .with_context(|| format!("{name}: cannot add to {MAP_PPPOE}"))?;
        self.pppoe.devices.insert(ifindex, Some(key));
        info!(
            interface = name,
            ifindex,
            lower = %lower.name,
            session_id = format!("{:#06x}", u16::from_be(s.sid_be)),
            "PPPoE session: XDP runs on its lower device, PPPoE and PPP headers popped and pushed there"
        );
        Ok(())
    }

    /// Whether the PPP device `name` runs the TC fast path itself for session `s`, and why
    /// (for `status`); `None`: XDP on the session's lower device (its VLAN parent for a
    /// session over a VLAN), which pops and pushes the PPPoE header. TC where `datapath =
    /// "tc"` applies to the PPP device, and with `"auto"` where CCP runs on the session (the
    /// kernel's PPP layer then sees every packet), where XDP cannot serve the session's lower
    /// device (a bridge: `PppoeBinding::not_for_xdp`) or where that device neither runs native
    /// XDP already nor takes it (tried: where it takes it, the program stays for the session,
    /// registered with it).
    fn ppp_on_tc(
        &mut self,
        name: &str,
        s: &PppoeBinding,
        mode: XdpModeConfig,
    ) -> anyhow::Result<Option<String>> {
        if self.tc_unavailable.is_some() {
            return Ok(None);
        }
        let (choice, from) = self.datapath_choice.of(name);
        match choice {
            DatapathConfig::Tc => Ok(Some(format!(
                "datapath = \"tc\" in {from}: on {name} itself (the kernel's PPPoE code \
                 removes and adds the session headers)"
            ))),
            DatapathConfig::Auto if s.ccp => Ok(Some(format!(
                "datapath = \"auto\" in {from}, and CCP (PPP compression or MPPE) runs on its \
                 session: on {name} itself, the kernel's PPP layer decompresses before it and \
                 compresses after it"
            ))),
            DatapathConfig::Auto if let Some(why) = &s.not_for_xdp => Ok(Some(format!(
                "datapath = \"auto\" in {from}, and {why}, where XDP cannot take its frames: \
                 on {name} itself"
            ))),
            DatapathConfig::Auto if mode == XdpModeConfig::Native => {
                let host = s.vlan.as_ref().map_or(&s.lower, |(_, parent)| parent);
                let why = match self.mode_of(host.ifindex) {
                    Some(AttachMode::Native) => return Ok(None),
                    Some(AttachMode::Tc) => format!("{} runs the TC fast path", host.name),
                    Some(other) => format!("{} runs XDP {}", host.name, other.as_str()),
                    None => match self.native_on_host_or_why(name, host, from)? {
                        None => return Ok(None),
                        Some(why) => format!("native XDP was refused on {}: {why}", host.name),
                    },
                };
                Ok(Some(format!(
                    "datapath = \"auto\" in {from}, and its session's frames arrive where XDP \
                     cannot run natively ({why})"
                )))
            }
            _ => Ok(None),
        }
    }

    /// Whether the PPP device `name`, with no PPPoE session paired with it (`why`), runs the
    /// TC fast path itself, and why (for `status`): with `datapath = "auto"` or `"tc"`, where
    /// TC is available. The TC fast path on a PPP device needs no session: the kernel's PPP
    /// layer delivers what it receives and takes what is sent into it, whatever channel
    /// carries its frames (L2TP, PPTP, a serial or mobile modem, a PPPoE session the daemon
    /// cannot pair: several in the namespace). Should a session be paired later, the device
    /// is bound to it instead (`Ports::set_pppoe`).
    pub(super) fn unpaired_ppp_on_tc(&self, name: &str, why: &str) -> Option<String> {
        if self.tc_unavailable.is_some() {
            return None;
        }
        let (choice, from) = self.datapath_choice.of(name);
        let choice = match choice {
            DatapathConfig::Xdp => return None,
            DatapathConfig::Auto => "auto",
            DatapathConfig::Tc => "tc",
        };
        Some(format!(
            "datapath = \"{choice}\" in {from}, and no PPPoE session is paired with it ({why}): \
             on {name} itself, where the kernel's PPP layer delivers and takes its packets \
             whatever carries them (L2TP, PPTP, a serial modem)"
        ))
    }

    /// Binds the PPP device `ifindex` on TC (see [`Datapath::ppp_on_tc`],
    /// [`Datapath::unpaired_ppp_on_tc`]): a device without a link-layer header, as `wg0`
    /// (`IFACE_F_L3`, and `IFACE_F_NO_XDP_XMIT`: native-XDP ports hand what they route there
    /// to TC), the TC fast path at its ingress, where the kernel's PPP code (under it PPPoE's,
    /// or another channel's) delivers the device's packets, and packets routed out of it
    /// redirected into it, where the same code encapsulates them (and compresses or encrypts
    /// them, where CCP runs). No `PPPOE` key: nothing runs on the lower device.
    pub(super) fn bind_ppp_tc(
        &mut self,
        name: &str,
        ifindex: u32,
        info: &mut IfaceInfo,
        because: String,
    ) -> anyhow::Result<()> {
        info.flags |= IFACE_F_L3 | IFACE_F_NO_XDP_XMIT;
        self.update_iface(ifindex, *info)?;
        self.run_tc_on(name, ifindex, because)?;
        self.update_handoffs();
        info!(
            interface = name,
            ifindex, "PPP device: the TC fast path runs on it, the kernel's PPP layer encapsulates"
        );
        Ok(())
    }

    /// Stops managing `lower` as a PPPoE lower device when no bound session runs over it any
    /// more: detached when it was managed only for sessions, the flag cleared when it is
    /// still a VLAN parent. A device managed for itself is left as it is.
    pub(super) fn release_lower(&mut self, lower: u32) {
        if self.pppoe.lower_in_use(lower) {
            return;
        }
        let Ok(mut info) = self.iface(lower) else {
            return;
        };
        if info.flags & IFACE_F_PPPOE_LOWER == 0 {
            return;
        }
        let vlan_parent = self.vlans.is_parent(lower);
        if vlan_parent {
            info.flags &= !IFACE_F_PPPOE_LOWER;
            let _ = self.update_iface(lower, info);
        } else {
            self.detach(lower);
        }
    }

    /// Forgets the PPP device `ifindex`: its session's key, its entry and arming program, and
    /// the lower device when it was managed only for this session.
    pub(super) fn detach_ppp(&mut self, ifindex: u32) {
        let key = self.pppoe.devices.remove(&ifindex).flatten();
        if let Some(key) = key {
            let _ = self.pppoe.sessions.remove(&key);
        }
        self.detach_arming(ifindex);
        // The TC fast path, where its session was bound on TC.
        self.detach_program(ifindex);
        let _ = self.ifaces.remove(&ifindex);
        if let Some(key) = key {
            self.release_lower(key.lower_ifindex);
        }
    }
}
