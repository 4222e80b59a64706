//! The managed bridges, as the state keeps them: a port joins (attached, with the bridge's MAC
//! and a stats slot of its own), leaves (detached), changes STP state, qdiscs, hooks or XDP
//! transmit capability (its `IFACE_F_*` flags rewritten); a VLAN-filtering bridge's and its
//! ports' VLANs are copied into `BRIDGE_VLANS` (PVID and tag protocol into `IFACES`) and kept
//! in step by diff ([`sync_vlans`]). What the bridges are is read from sysfs and rtnetlink
//! outside the lock ([`crate::sync::bridge::read`]); the FDB copy is written by
//! [`super::State::apply_fdb`].

use std::collections::BTreeMap;

use tracing::{error, info, warn};
use xdp_router_common::{
    IFACE_F_BRIDGE_PORT, IFACE_F_BRIDGE_VLAN_FILTERING, IFACE_F_EGRESS_HOOK, IFACE_F_INGRESS_HOOK,
    IFACE_F_NO_XDP_XMIT, IFACE_F_PORT_NOT_FORWARDING, IFACE_F_SHAPED, IFACE_F_VLAN_PARENT,
    MAX_IFACE_SLOTS,
};

use super::Ports as StatePorts;
use crate::{
    config::XdpModeConfig,
    datapath::AttachMode,
    sync::{
        bridge::{self as read, BridgeRead, PortInfo, VlanTable},
        hooks::Hooks,
        qdisc::Egress,
        xdp_xmit::{Capabilities, XdpXmit},
    },
};

/// A managed bridge (in the config, or only the parent of managed VLAN devices): its ports
/// and its VLAN filtering, as written to the datapath.
#[derive(Debug, Clone, Default)]
pub struct Bridge {
    /// Its ports, where the program runs.
    pub ports: Ports,
    /// Its tag protocol (host order) while it filters by VLAN (`vlan_filtering 1`), as last
    /// read; `None` while it does not.
    pub filtering: Option<u16>,
    /// Its own VLANs as written.
    pub vlans: Vlans,
}

impl Bridge {
    /// `IFACE_F_BRIDGE_VLAN_FILTERING` while it filters by VLAN, else 0: for the bridge's
    /// `IFACES` entry and its ports'.
    pub fn filtering_flag(&self) -> u32 {
        if self.filtering.is_some() {
            IFACE_F_BRIDGE_VLAN_FILTERING
        } else {
            0
        }
    }

    /// Follows the bridge as read (`read`; its own `IFACES` flags, which carry
    /// [`Bridge::filtering_flag`], must have been written since [`Bridge::set_filtering`]):
    /// its ports (see [`sync_ports`]), its own VLANs, and its ports' VLANs.
    pub fn sync<D: StatePorts>(
        &mut self,
        dp: &mut D,
        b: &BridgeView,
        read: &BridgeRead,
        xmit: &Capabilities,
        next_slot: &mut u32,
    ) {
        let f = read.filtering.as_ref();
        let want = |table: Option<&VlanTable>| match f {
            Some(f) => Vlans::of(f.tpid, table.cloned().unwrap_or_default()),
            None => Vlans::default(),
        };
        // The ports' flags first: a port of a bridge switching filtering on is strict (no
        // PVID, no VLAN) until its VLANs are written, one switching it off stops at once.
        sync_ports(dp, b, &mut self.ports, read.ports.clone(), xmit, next_slot);
        sync_vlans(
            dp,
            b.name,
            b.ifindex,
            &mut self.vlans,
            &want(f.map(|f| &f.own)),
        );
        for (ifindex, p) in self.ports.iter_mut().filter(|(_, p)| p.mode.is_some()) {
            let table = f.and_then(|f| f.ports.get(ifindex));
            sync_vlans(dp, &p.name, *ifindex, &mut p.vlans, &want(table));
        }
    }

    /// Records whether the bridge filters by VLAN as read; returns whether that changed (its
    /// own flags must then be written before [`Bridge::sync`], so a bridge switching it on is
    /// strict at once and one switching it off stops filtering at once). Logged.
    pub fn set_filtering(&mut self, name: &str, read: &BridgeRead) -> bool {
        let now = read.filtering.as_ref().map(|f| f.tpid);
        if now == self.filtering {
            return false;
        }
        match now {
            Some(tpid) => {
                info!(
                    interface = name,
                    "{name}: VLAN filtering ({}): the fast path bridges by VLAN as the kernel does",
                    protocol_name(tpid)
                )
            }
            None if self.filtering.is_some() => {
                info!(interface = name, "{name}: VLAN filtering off")
            }
            None => {}
        }
        self.filtering = now;
        true
    }
}

/// `802.1Q` / `802.1ad` for a tag protocol (host order).
pub fn protocol_name(tpid: u16) -> &'static str {
    match tpid {
        0x8100 => "802.1Q",
        0x88a8 => "802.1ad",
        _ => "unknown protocol",
    }
}

/// A device's VLAN filtering as the datapath holds it: the tag protocol and PVID in its
/// `IFACES` entry, its memberships in `BRIDGE_VLANS`. All empty for a device that does not
/// filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Vlans {
    /// Tag protocol (host order); 0: none.
    pub tpid: u16,
    /// PVID; 0: none (untagged frames are dropped by the bridge).
    pub pvid: u16,
    pub table: VlanTable,
}

impl Vlans {
    /// A filtering device's VLANs (`table`) under the bridge's protocol `tpid`.
    pub fn of(tpid: u16, table: VlanTable) -> Vlans {
        Vlans {
            tpid,
            pvid: read::pvid(&table).unwrap_or(0),
            table,
        }
    }
}

/// Brings the VLANs of `ifindex` in the datapath (`have`, updated to what was written) in
/// line with `want`, in the order that never lets the datapath accept a frame both sides
/// would not: memberships removed or changed first, then the PVID and tag protocol (a PVID
/// whose membership is not there yet matches nothing), then memberships added. A failed
/// write is logged and left out of `have`, so the next sync retries it.
pub fn sync_vlans<D: StatePorts>(
    dp: &mut D,
    name: &str,
    ifindex: u32,
    have: &mut Vlans,
    want: &Vlans,
) {
    if have == want {
        return;
    }
    let gone: Vec<u16> = have
        .table
        .keys()
        .filter(|v| !want.table.contains_key(v))
        .copied()
        .collect();
    for vid in gone {
        dp.bridge_vlan_remove(ifindex, vid);
        have.table.remove(&vid);
    }
    for (&vid, &m) in &want.table {
        if have.table.get(&vid).is_some_and(|h| *h != m) {
            write_vlan(dp, name, ifindex, have, vid, m);
        }
    }
    if (have.tpid, have.pvid) != (want.tpid, want.pvid) {
        match dp.set_bridge_pvid(ifindex, want.tpid, want.pvid) {
            Ok(()) => (have.tpid, have.pvid) = (want.tpid, want.pvid),
            Err(e) => {
                error!(interface = name, error = %format!("{e:#}"), "{name}: cannot write its PVID and VLAN protocol")
            }
        }
    }
    for (&vid, &m) in &want.table {
        if !have.table.contains_key(&vid) {
            write_vlan(dp, name, ifindex, have, vid, m);
        }
    }
}

/// Writes one membership of [`sync_vlans`], recorded in `have` once written.
fn write_vlan<D: StatePorts>(
    dp: &mut D,
    name: &str,
    ifindex: u32,
    have: &mut Vlans,
    vid: u16,
    m: read::VlanMember,
) {
    match dp.bridge_vlan_set(ifindex, vid, m.untagged) {
        Ok(()) => {
            have.table.insert(vid, m);
        }
        Err(e) => {
            error!(interface = name, vid, error = %format!("{e:#}"), "{name}: cannot copy its VLAN {vid}: its frames in that VLAN stay in the kernel")
        }
    }
}

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
    /// Its VLANs as written (a port of a VLAN-filtering bridge; else empty).
    pub vlans: Vlans,
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
    /// `IFACE_F_BRIDGE_VLAN_FILTERING` or 0 (see [`Bridge::filtering_flag`]).
    pub filtering_flag: u32,
    /// Managed only as the parent of VLAN devices ([`ParentBridge`]): its ports get
    /// `IFACE_F_VLAN_PARENT`, and the datapath routes nothing they receive as the bridge's own.
    pub parent_only: bool,
}

impl Port {
    /// The port's `IFACE_F_*` flags (without `IFACE_F_BRIDGE_PORT`, which the datapath adds).
    pub fn flags(&self, b: &BridgeView) -> u32 {
        let hooks = if b.bypass_hooks {
            Hooks::default()
        } else {
            self.hooks
        };
        let mut f = b.filtering_flag;
        if b.parent_only {
            f |= IFACE_F_VLAN_PARENT;
        }
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

/// Brings `ports` in line with the bridge's ports as found (`found`, see
/// [`crate::sync::bridge::ports`]): ports that left are detached (their VLANs with them), new
/// ones attached (stats slots from `next_slot` on, never reused, so a slot's counters always
/// belong to one port), and every port's flags and MAC rewritten.
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
            // Written right after (see `Bridge::sync`): until then a port of a filtering
            // bridge has no PVID and no VLAN, and its frames go to the kernel.
            vlans: Vlans::default(),
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

/// A bridge managed only as the parent of managed VLAN devices (`br-lan` under `br-lan.1` and
/// `br-lan.2`, the OpenWrt DSA layout, without `br-lan` in the config): its ports are managed
/// as a configured bridge's, and its own `IFACES` entry is `IFACE_F_VLAN_PARENT` (the datapath
/// routes nothing as the bridge itself).
#[derive(Debug, Clone)]
pub struct ParentBridge {
    pub name: String,
    pub mac: [u8; 6],
    /// Its own hooks as last read (they see what its ports pass up).
    pub hooks: Hooks,
    pub bridge: Bridge,
}
