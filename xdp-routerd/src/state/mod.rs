//! The state the daemon's tasks share, and the only place it changes.
//!
//! [`Shared`] holds the [`State`] behind a mutex that is only ever taken for map writes already
//! planned outside it and for status reads: no netlink round trip, qdisc or hooks read, or
//! ctnetlink request happens while it is held (the tasks in [`crate::tasks`] do their I/O first,
//! then call one of the methods here). Route answers for flow changes come from
//! [`crate::paths::resolve`], looked up before the lock is taken.
//!
//! [`State`]'s fields are private: its methods are the only writers, and the tasks get
//! read-only access ([`State::flows`], [`State::dp`]) to plan outside the lock. Here: the
//! interfaces' lifecycle (attach, link up and gone) and the datapath-wide settings. One file
//! per concern besides: `shared.rs` (the lock), `iface.rs` (one managed interface),
//! `egress.rs` (qdiscs, hooks, XDP transmit), `events.rs` (conntrack and rtnetlink batches,
//! resyncs, revalidation, keep-alive), `view.rs` (status and flow rows), and one per device
//! kind: [`bridge`], `vlan.rs`, [`pppoe`]. What the state needs of the datapath is
//! [`crate::datapath::Ports`].

use std::collections::BTreeMap;

use tracing::{error, info, warn};

use crate::{
    config::{InterfaceConfig, Role, XdpModeConfig},
    datapath::Datapath,
    flows::FlowManager,
    status::ConntrackStatus,
    sync::{
        bridge::{BridgeRead, BridgeReads},
        hooks::Hooks,
        xdp_xmit::{Capabilities, XdpXmit},
    },
};

pub mod bridge;
mod egress;
mod events;
mod iface;
pub mod lock_stats;
mod per_packet;
pub mod pppoe;
mod shared;
mod view;
mod vlan;

pub use crate::datapath::Ports;
use bridge::ParentBridge;
use egress::SHAPED_UNKNOWN;
pub use events::LinkReads;
use iface::Managed;
pub use shared::{APPLY_CHUNK, STATUS_MAX_AGE, STATUS_WAIT, Shared, StateGuard};

/// Everything the tasks share: the datapath, the flow manager (the one place conntrack entries
/// become flows), the managed interfaces, and conntrack sync counters.
pub struct State<D = Datapath> {
    dp: D,
    flows: FlowManager,
    ifaces: Vec<Managed>,
    ct: ConntrackStatus,
    xdp_mode: XdpModeConfig,
    /// The kernel's XDP features of every device.
    xmit: Capabilities,
    /// Next stats slot for a bridge port or VLAN parent (never reused).
    next_slot: u32,
    /// Stats slots of the VLAN parents, by ifindex (one per parent, whatever its VLANs).
    parent_slots: BTreeMap<u32, u32>,
    /// The bridges managed only as the parent of managed VLAN devices, by ifindex (see
    /// [`State::sync_bridges`]).
    parent_bridges: BTreeMap<u32, ParentBridge>,
    /// Rules that must see every packet, and the hold they cause.
    per_packet: per_packet::PerPacket,
}

impl<D> State<D> {
    /// The datapath, to read from (its settings, for logs).
    pub fn dp(&self) -> &D {
        &self.dp
    }

    /// The flow manager, to read from: what a batch would offload, snapshots to revalidate,
    /// what a resync must still write.
    pub fn flows(&self) -> &FlowManager {
        &self.flows
    }
}

/// The datapath-wide settings, each one map write.
impl State<Datapath> {
    /// Switches the fast path on or off.
    pub fn set_fastpath(&mut self, on: bool) -> anyhow::Result<()> {
        self.dp.set_fastpath(on)
    }

    /// How long a kernel verdict holds (see [`Datapath::set_verdict_max_age`]).
    pub fn set_verdict_max_age(&mut self, max_age: std::time::Duration) -> anyhow::Result<()> {
        self.dp.set_verdict_max_age(max_age)
    }

    /// Verifies TCP/UDP checksums in XDP (while conntrack verifies them, `on`).
    pub fn set_verify_l4_checksum(&mut self, on: bool) -> anyhow::Result<()> {
        self.dp.set_verify_l4_checksum(on)
    }

    /// Drops every cached FIB answer in the datapath (see
    /// [`Datapath::invalidate_fib_cache`]).
    pub fn invalidate_fib_cache(&mut self) -> anyhow::Result<()> {
        self.dp.invalidate_fib_cache()
    }

    /// The firewall ruleset changed: every flow direction is disarmed until the kernel
    /// forwards it again (see [`Datapath::bump_ruleset_generation`]).
    pub fn bump_ruleset_generation(&mut self) -> anyhow::Result<()> {
        self.dp.bump_ruleset_generation()
    }

    /// Detaches from every device (at exit).
    pub fn detach_all(&mut self) {
        self.dp.detach_all()
    }
}

fn fmt_mac(m: [u8; 6]) -> String {
    m.map(|b| format!("{b:02x}")).join(":")
}

impl<D: Ports> State<D> {
    /// The state for the configured interfaces (found under `ifindexes`, in config order;
    /// `None`: does not exist yet), nothing attached yet.
    pub fn new(
        dp: D,
        interfaces: &[InterfaceConfig],
        ifindexes: &[Option<u32>],
        xdp_mode: XdpModeConfig,
    ) -> State<D> {
        let ifaces = interfaces
            .iter()
            .zip(ifindexes)
            .enumerate()
            .map(|(i, (cfg, ifindex))| Managed {
                cfg: cfg.clone(),
                slot: i as u32 + 1,
                ifindex: *ifindex,
                mode: None,
                egress: None,
                hooks: Hooks::default(),
                mac: [0; 6],
                xmit: XdpXmit::Unknown,
                link_kind: None,
                bridge: None,
                vlan: None,
                parent_slot: 0,
                parent_shaper: Some(SHAPED_UNKNOWN.into()),
                parent_hooks: Hooks::default(),
                pppoe: None,
                no_link_layer: false,
            })
            .collect();
        State {
            dp,
            flows: FlowManager::new(),
            ifaces,
            ct: ConntrackStatus::default(),
            xdp_mode,
            xmit: Capabilities::default(),
            next_slot: interfaces.len() as u32 + 1,
            parent_slots: BTreeMap::new(),
            parent_bridges: BTreeMap::new(),
            per_packet: per_packet::PerPacket::default(),
        }
    }

    /// How many LAN hosts get per-host traffic series (`host_metrics_limit`; 0: none).
    pub fn set_host_metrics_limit(&mut self, limit: usize) {
        self.flows.set_host_limit(limit);
    }

    /// Start-up: records what every interface is (`found`, by name; see
    /// [`crate::sync::bridge::read`]) and which devices can transmit XDP frames, before
    /// anything is attached.
    pub fn set_kinds_and_xmit(&mut self, found: &BridgeReads, xmit: Capabilities) {
        self.xmit = xmit;
        for m in &mut self.ifaces {
            let read = found.get(&m.cfg.name).cloned().unwrap_or_default();
            m.set_bridge_kind(&read);
            m.set_link_kind(read.link_kind);
            m.set_vlan(read.vlan);
            m.set_xmit(
                self.xmit
                    .of(m.ifindex.unwrap_or_default(), m.link_kind.as_deref()),
            );
        }
    }

    /// Attaches to every present interface (start-up: its qdiscs and hooks are known by now).
    /// `macs` holds each one's MAC address, in config order.
    pub fn attach_all(&mut self, macs: &[Option<[u8; 6]>]) -> anyhow::Result<()> {
        for (m, mac) in self.ifaces.iter_mut().zip(macs) {
            let Some(ifindex) = m.ifindex else {
                continue;
            };
            let mac = attach_mac(m, *mac);
            let parent = m.vlan_parent(&self.xmit, &mut self.parent_slots, &mut self.next_slot);
            m.mode = Some(m.attach(&mut self.dp, ifindex, mac, self.xdp_mode, parent)?);
        }
        self.sync_managed();
        Ok(())
    }

    /// Tells the flow manager which interfaces are managed now, and which of them face the
    /// LAN.
    fn sync_managed(&mut self) {
        let managed = self.managed_map();
        let lan = self
            .ifaces
            .iter()
            .filter(|m| m.mode.is_some() && m.cfg.role == Role::Lan)
            .filter_map(|m| m.ifindex)
            .collect();
        self.flows.set_managed(managed);
        self.flows.set_lan(lan);
    }

    pub(super) fn managed_map(&self) -> BTreeMap<u32, String> {
        self.ifaces
            .iter()
            .filter(|m| m.mode.is_some())
            .filter_map(|m| m.ifindex.map(|i| (i, m.cfg.name.clone())))
            .collect()
    }

    /// The configured interface names, in config order.
    pub fn iface_names(&self) -> Vec<String> {
        self.ifaces.iter().map(|m| m.cfg.name.clone()).collect()
    }

    /// Attaches to a managed interface that (re)appeared under `ifindex`, or follows a change
    /// of its MAC address (`mac`: from the link notification or read by the caller; `read`:
    /// what it is, read by the caller, see [`crate::sync::bridge::read`]). Returns whether it
    /// is a new device.
    pub fn link_up(
        &mut self,
        ifindex: u32,
        name: &str,
        mac: Option<[u8; 6]>,
        read: &BridgeRead,
    ) -> bool {
        let xdp_mode = self.xdp_mode;
        let Some(i) = self.ifaces.iter().position(|m| m.cfg.name == name) else {
            return false;
        };
        let m = &mut self.ifaces[i];
        if m.ifindex == Some(ifindex) && m.mode.is_some() {
            if let Some(mac) = mac {
                m.mac = mac;
                match self.dp.set_iface_mac(ifindex, mac) {
                    Ok(true) => info!(interface = name, mac = %fmt_mac(mac), "MAC address changed"),
                    Ok(false) => {}
                    Err(e) => {
                        error!(interface = name, error = %format!("{e:#}"), "cannot update the MAC address")
                    }
                }
            }
            return false;
        }
        if let Some(old) = m.ifindex.take() {
            m.mode = None;
            m.detach(&mut self.dp, old);
            // A bridge parent managed for this VLAN device alone goes with it (the datapath
            // forgot the bridge's own entry with it) and is managed afresh once it is back.
            self.prune_parent_bridges();
        }
        let m = &mut self.ifaces[i];
        m.set_bridge_kind(read);
        m.set_link_kind(read.link_kind.clone());
        m.set_vlan(read.vlan.clone());
        // A new device: its qdiscs are read right after this (the caller's job); until then
        // `auto` counts it as shaped.
        m.egress = None;
        m.mode = None;
        m.ifindex = Some(ifindex);
        m.set_xmit(self.xmit.of(ifindex, m.link_kind.as_deref()));
        let mac = attach_mac(m, mac);
        let parent = m.vlan_parent(&self.xmit, &mut self.parent_slots, &mut self.next_slot);
        match m.attach(&mut self.dp, ifindex, mac, xdp_mode, parent) {
            Ok(mode) => m.mode = Some(mode),
            Err(e) => error!(interface = name, error = %format!("{e:#}"), "cannot attach"),
        }
        self.sync_managed();
        true
    }

    /// A managed interface disappeared: detach, and its flows no longer have a path. Returns
    /// whether it was one of ours.
    pub fn link_gone(&mut self, ifindex: u32) -> bool {
        let Some(m) = self.ifaces.iter_mut().find(|m| m.ifindex == Some(ifindex)) else {
            return false;
        };
        warn!(interface = %m.cfg.name, ifindex, "managed interface disappeared; its flows go back to the kernel");
        m.ifindex = None;
        m.mode = None;
        m.detach(&mut self.dp, ifindex);
        self.prune_parent_bridges();
        self.sync_managed();
        true
    }

    /// The ifindex a managed interface has now, if it is present.
    pub fn ifindex_of(&self, name: &str) -> Option<u32> {
        self.ifaces
            .iter()
            .find(|m| m.cfg.name == name)
            .and_then(|m| m.ifindex)
    }
}

/// The MAC address frames must be sent to for the fast path to forward them. A device without
/// a link-layer header (WireGuard, tun, GRE, IPIP) has none and needs none: it gets the TC fast
/// path on its IP packets (`Ports::attach_l3`); nor does a PPP device: its session's frames are
/// sent to its lower device's.
pub(super) fn attach_mac(m: &mut Managed, mac: Option<[u8; 6]>) -> [u8; 6] {
    m.no_link_layer = mac.is_none() && !m.is_ppp();
    mac.unwrap_or_default()
}

/// CLOCK_MONOTONIC_COARSE in ns, the clock of `bpf_ktime_get_coarse_ns()` that the datapath
/// stamps `last_seen_ns` with.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests;
