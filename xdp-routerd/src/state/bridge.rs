//! The managed bridges, as the state keeps them: a port joins (attached, with the bridge's MAC
//! and a stats slot of its own), leaves (detached), changes STP state, qdiscs, hooks or XDP
//! transmit capability (its `IFACE_F_*` flags rewritten); a VLAN-filtering bridge's and its
//! ports' VLANs are copied into `BRIDGE_VLANS` (PVID and tag protocol into `IFACES`) and kept
//! in step by diff ([`sync_vlans`]). A bridge under managed VLAN devices that is not in the
//! config is managed for them ([`ParentBridge`]), and the FDB of every managed bridge is copied
//! into `BRIDGE_FDB` ([`State::apply_fdb`]). What the bridges are is read from sysfs and
//! rtnetlink outside the lock ([`crate::sync::bridge::read`]).

use std::collections::BTreeMap;

use tracing::{error, info, warn};
use xdp_router_common::{
    IFACE_F_BRIDGE_PORT, IFACE_F_BRIDGE_VLAN_FILTERING, IFACE_F_EGRESS_HOOK, IFACE_F_INGRESS_HOOK,
    IFACE_F_NO_XDP_XMIT, IFACE_F_PORT_NOT_FORWARDING, IFACE_F_SHAPED, IFACE_F_VLAN_PARENT,
    MAX_IFACE_SLOTS,
};

use super::{Ports as StatePorts, State};
use crate::{
    config::XdpModeConfig,
    datapath::AttachMode,
    sync::{
        bridge::{
            self as read, BridgeKind, BridgeRead, BridgeReads, FdbEvent, PortInfo, VlanTable,
        },
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
                    crate::status::vlan_protocol_name(tpid)
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

impl<D: StatePorts> State<D> {
    /// Whether a managed interface is a bridge, or a VLAN device over one.
    pub fn has_bridges(&self) -> bool {
        self.ifaces
            .iter()
            .any(|m| m.bridge.is_some() || m.is_vlan_over_bridge())
    }

    /// Follows the ports of every managed bridge as read (`found`, by bridge name; see
    /// [`crate::sync::bridge::read`]): ports added or removed, STP state, XDP transmit, the
    /// bridge's MAC. A bridge missing from `found` is left as it is. Returns whether a port
    /// was added (its qdiscs and hooks must be read).
    pub fn sync_bridges(&mut self, found: &BridgeReads) -> bool {
        let before = self.next_slot;
        let State {
            dp,
            ifaces,
            xmit,
            next_slot,
            xdp_mode,
            ..
        } = self;
        for m in ifaces.iter_mut().filter(|m| m.mode.is_some()) {
            let Some(read) = found.get(&m.cfg.name) else {
                continue;
            };
            if let Some(mac) = read.mac
                && mac != m.mac
                && let Some(ifindex) = m.ifindex
            {
                m.mac = mac;
                if let Err(e) = dp.set_iface_mac(ifindex, mac) {
                    error!(interface = %m.cfg.name, error = %format!("{e:#}"), "cannot update the MAC address");
                }
            }
            // VLAN filtering switched on or off: the bridge's own flags first (see
            // `Bridge::set_filtering`), the ports' with them in `sync_ports`.
            let name = &m.cfg.name;
            if m.bridge
                .as_mut()
                .is_some_and(|b| b.set_filtering(name, read))
                && let Some(ifindex) = m.ifindex
                && let Err(e) = dp.set_iface_flags(ifindex, m.slot, m.flags())
            {
                error!(interface = %m.cfg.name, error = %format!("{e:#}"), "cannot update interface flags");
            }
            let mut b = m.bridge.take();
            if let Some(b) = b.as_mut()
                && let Some(view) = m.bridge_view(*xdp_mode, b)
            {
                b.sync(dp, &view, read, xmit, next_slot);
            }
            m.bridge = b;
        }
        self.sync_parent_bridges(found);
        self.next_slot != before
    }

    /// The bridges under attached VLAN devices that are not in the config themselves, by
    /// ifindex: their name, and whether every VLAN device over them bypasses hooks.
    pub(super) fn wanted_parent_bridges(&self) -> BTreeMap<u32, (String, bool)> {
        let configured: Vec<u32> = self.ifaces.iter().filter_map(|m| m.ifindex).collect();
        let mut out: BTreeMap<u32, (String, bool)> = BTreeMap::new();
        for m in self.ifaces.iter().filter(|m| m.mode.is_some()) {
            let Some(v) = m.vlan.as_ref().filter(|_| m.is_vlan_over_bridge()) else {
                continue;
            };
            if configured.contains(&v.link.parent) {
                continue;
            }
            out.entry(v.link.parent)
                .and_modify(|(_, bypass)| *bypass &= m.cfg.bypass_hooks)
                .or_insert((v.parent_name.clone(), m.cfg.bypass_hooks));
        }
        out
    }

    /// Stops managing the bridges no attached VLAN device runs over any more: their ports are
    /// detached (VLANs with them) and their FDB copy forgotten. (The datapath forgets the
    /// bridge's own entry with its last VLAN device.)
    pub(super) fn prune_parent_bridges(&mut self) {
        let wanted = self.wanted_parent_bridges();
        let gone: Vec<u32> = self
            .parent_bridges
            .keys()
            .filter(|i| !wanted.contains_key(i))
            .copied()
            .collect();
        for ifindex in gone {
            if let Some(pb) = self.parent_bridges.remove(&ifindex) {
                info!(interface = %pb.name, "{}: no managed VLAN device over it any more: its ports are detached", pb.name);
                for port in pb.bridge.ports.into_keys() {
                    self.dp.detach(port);
                }
                self.dp.fdb_clear(ifindex);
            }
        }
    }

    /// What the ports of the parent bridge `pb` (`ifindex`; `b`: its bridge, taken out of it
    /// while they are synced) take from it.
    pub(super) fn parent_bridge_view<'a>(
        &self,
        ifindex: u32,
        pb: &'a ParentBridge,
        b: &Bridge,
    ) -> BridgeView<'a> {
        let bypass_hooks = self
            .wanted_parent_bridges()
            .get(&ifindex)
            .is_some_and(|(_, bypass)| *bypass);
        BridgeView {
            name: &pb.name,
            ifindex,
            mac: pb.mac,
            ingress_hook: !bypass_hooks && pb.hooks.ingress,
            bypass_hooks,
            xdp_mode: self.xdp_mode,
            filtering_flag: b.filtering_flag(),
            parent_only: true,
        }
    }

    /// Manages the bridges under attached VLAN devices that are not in the config themselves
    /// (`br-lan` under `br-lan.20`), as read (`found`, by the bridge's name; one missing there
    /// is left as it is): their ports as a configured bridge's, their VLAN filtering, their
    /// MAC; and stops managing those no VLAN device runs over any more.
    pub(super) fn sync_parent_bridges(&mut self, found: &BridgeReads) {
        self.prune_parent_bridges();
        let mut flags_changed = false;
        for (ifindex, (name, _)) in self.wanted_parent_bridges() {
            let Some(read) = found.get(&name).filter(|r| r.kind == BridgeKind::Bridge) else {
                continue;
            };
            let pb = self.parent_bridges.entry(ifindex).or_insert_with(|| {
                info!(interface = %name, "{name}: a bridge under managed VLAN devices: its ports are managed for them");
                ParentBridge {
                    name: name.clone(),
                    mac: [0; 6],
                    hooks: Hooks::default(),
                    bridge: Bridge::default(),
                }
            });
            if let Some(mac) = read.mac
                && mac != pb.mac
            {
                pb.mac = mac;
                if let Err(e) = self.dp.set_iface_mac(ifindex, mac) {
                    error!(interface = %name, error = %format!("{e:#}"), "cannot update the MAC address");
                }
            }
            flags_changed |= pb.bridge.set_filtering(&name, read);
        }
        if flags_changed {
            // The bridges' own flags before their VLANs and ports (see `Bridge::set_filtering`).
            self.write_parent_flags();
        }
        let mut parents = std::mem::take(&mut self.parent_bridges);
        for (ifindex, pb) in &mut parents {
            let Some(read) = found.get(&pb.name).filter(|r| r.kind == BridgeKind::Bridge) else {
                continue;
            };
            let mut b = std::mem::take(&mut pb.bridge);
            let view = self.parent_bridge_view(*ifindex, pb, &b);
            b.sync(&mut self.dp, &view, read, &self.xmit, &mut self.next_slot);
            pb.bridge = b;
        }
        self.parent_bridges = parents;
    }

    /// The ifindexes of the managed bridges (configured, or managed as VLAN parents).
    pub(super) fn bridge_ifindexes(&self) -> Vec<u32> {
        self.ifaces
            .iter()
            .filter(|m| m.bridge.is_some())
            .filter_map(|m| m.ifindex)
            .chain(self.parent_bridges.keys().copied())
            .collect()
    }

    /// Copies a bridge FDB change into `BRIDGE_FDB` (managed bridges only).
    pub fn apply_fdb(&mut self, ev: FdbEvent) {
        let bridge = match ev {
            FdbEvent::Learned { bridge, .. } | FdbEvent::Forgotten { bridge, .. } => bridge,
        };
        if !self.bridge_ifindexes().contains(&bridge) {
            return;
        }
        match ev {
            FdbEvent::Learned {
                bridge,
                mac,
                vid,
                port,
            } => {
                if let Err(e) = self.dp.fdb_learn(bridge, mac, vid, port) {
                    error!(error = %format!("{e:#}"), "cannot copy a bridge FDB entry");
                }
            }
            FdbEvent::Forgotten { bridge, mac, vid } => self.dp.fdb_forget(bridge, mac, vid),
        }
    }

    /// Replaces the `BRIDGE_FDB` entries of every managed bridge with a fresh FDB dump
    /// (`entries`, see [`crate::sync::bridge::fdb_dump`]): after an rtnetlink overrun, FDB
    /// notifications were lost, so entries of MACs that moved or left may be stale.
    pub fn reload_fdb(&mut self, entries: Vec<FdbEvent>) {
        for bridge in self.bridge_ifindexes() {
            self.dp.fdb_clear(bridge);
        }
        for ev in entries {
            self.apply_fdb(ev);
        }
    }
}
