//! The state the daemon's tasks share, and the only place it changes.
//!
//! [`Shared`] holds the [`State`] behind a mutex that is only ever taken for map writes already
//! planned outside it and for status reads: no netlink round trip, qdisc or hooks read, or
//! ctnetlink request happens while it is held (the tasks in [`crate::tasks`] do their I/O first,
//! then call one of the methods here). Route answers for flow changes come from
//! [`crate::paths::resolve`], looked up before the lock is taken.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    panic::Location,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use parking_lot::{FairMutex, FairMutexGuard};

use tokio::sync::Notify;
use tracing::{debug, error, info, warn};
use xdp_router_common::{
    FLOW_F_REPLY, IFACE_F_EGRESS_HOOK, IFACE_F_INGRESS_HOOK, IFACE_F_NO_XDP_XMIT, IFACE_F_SHAPED,
    Reason,
};

use crate::{
    config::{InterfaceConfig, Shaped, XdpModeConfig},
    datapath::{AttachMode, Datapath, VlanParent},
    flows::{DirKey, FlowManager, FlowTable, Offloaded},
    paths::Stale,
    status::{ConntrackStatus, CounterRow, FlowCounts, FlowRow, Flows, IfaceStatus, Status},
    sync::{
        bridge::{BridgeKind, BridgeRead, BridgeReads, FdbEvent},
        hooks::{self, Hooks},
        qdisc::{self, Egress, Qdisc},
        vlan::VlanRead,
        xdp_xmit::{Capabilities, XdpXmit, XmitEvent},
    },
};

pub mod bridge;
pub mod lock_stats;

use bridge::{BridgeView, Ports as BridgePorts};

/// What [`State`] needs from the datapath besides the flow maps: the managed interfaces'
/// attachments and `IFACES` entries. Implemented by [`Datapath`]; unit tests use a fake.
pub trait Ports: FlowTable {
    /// Registers and attaches to `ifindex`; returns the mode it got.
    fn attach(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode>;
    /// Detaches from `ifindex` and forgets it.
    fn detach(&mut self, ifindex: u32);
    /// Rewrites the flags of a registered interface.
    fn set_iface_flags(&mut self, ifindex: u32, slot: u32, flags: u32) -> anyhow::Result<()>;
    /// Rewrites the MAC address of a registered interface; returns whether it changed.
    fn set_iface_mac(&mut self, ifindex: u32, mac: [u8; 6]) -> anyhow::Result<bool>;
    /// Registers the bridge `ifindex` (its program runs on its ports).
    fn attach_bridge(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
    ) -> anyhow::Result<AttachMode>;
    /// Registers and attaches to a port of the bridge `bridge_ifindex`.
    #[expect(
        clippy::too_many_arguments,
        reason = "one per IFACES field plus the mode"
    )]
    fn attach_port(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        bridge_mac: [u8; 6],
        bridge_ifindex: u32,
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode>;
    /// Registers the VLAN device `ifindex` (`vlan`: VLAN ID and tag protocol) over
    /// `parent`, where the program runs.
    #[expect(
        clippy::too_many_arguments,
        reason = "one per IFACES field plus the parent"
    )]
    fn attach_vlan(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
        vlan: (u16, u16),
        parent: &VlanParent,
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode>;
    /// `mac` is behind `port` of `bridge` (the FDB copy).
    fn fdb_learn(&mut self, bridge: u32, mac: [u8; 6], port: u32) -> anyhow::Result<()>;
    /// `mac` is no longer known to `bridge`.
    fn fdb_forget(&mut self, bridge: u32, mac: [u8; 6]);
    /// Forgets every FDB entry of `bridge`.
    fn fdb_clear(&mut self, bridge: u32);
}

impl Ports for Datapath {
    fn attach(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode> {
        Datapath::attach(self, name, ifindex, slot, flags, mac, mode)
    }
    fn detach(&mut self, ifindex: u32) {
        Datapath::detach(self, ifindex)
    }
    fn set_iface_flags(&mut self, ifindex: u32, slot: u32, flags: u32) -> anyhow::Result<()> {
        Datapath::set_iface_flags(self, ifindex, slot, flags)
    }
    fn set_iface_mac(&mut self, ifindex: u32, mac: [u8; 6]) -> anyhow::Result<bool> {
        Datapath::set_iface_mac(self, ifindex, mac)
    }
    fn attach_bridge(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
    ) -> anyhow::Result<AttachMode> {
        Datapath::attach_bridge(self, name, ifindex, slot, flags, mac)
    }
    fn attach_port(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        bridge_mac: [u8; 6],
        bridge_ifindex: u32,
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode> {
        Datapath::attach_port(
            self,
            name,
            ifindex,
            slot,
            flags,
            bridge_mac,
            bridge_ifindex,
            mode,
        )
    }
    fn attach_vlan(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
        vlan: (u16, u16),
        parent: &VlanParent,
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode> {
        Datapath::attach_vlan(self, name, ifindex, slot, flags, mac, vlan, parent, mode)
    }
    fn fdb_learn(&mut self, bridge: u32, mac: [u8; 6], port: u32) -> anyhow::Result<()> {
        Datapath::fdb_learn(self, bridge, mac, port)
    }
    fn fdb_forget(&mut self, bridge: u32, mac: [u8; 6]) {
        Datapath::fdb_forget(self, bridge, mac)
    }
    fn fdb_clear(&mut self, bridge: u32) {
        Datapath::fdb_clear(self, bridge)
    }
}

/// A managed interface as configured, and what it currently is in the kernel.
pub struct Managed {
    pub cfg: InterfaceConfig,
    pub slot: u32,
    pub ifindex: Option<u32>,
    pub mode: Option<AttachMode>,
    /// Its egress qdiscs as last read; `None` until read (or when the last read failed).
    pub egress: Option<Egress>,
    /// nftables netdev chains / tc filters found on it (see [`crate::sync::hooks`]).
    pub hooks: Hooks,
    /// The MAC address it was attached with (for a bridge: what its ports route for).
    pub mac: [u8; 6],
    /// Whether it can transmit XDP frames (see [`crate::sync::xdp_xmit`]).
    pub xmit: XdpXmit,
    /// Its link kind as last read (judges `xmit` on kernels without the `netdev` family).
    pub link_kind: Option<String>,
    /// For a bridge: its ports, where the program runs (see [`bridge`]).
    pub ports: Option<BridgePorts>,
    /// For a VLAN device: its VLAN and parent, where the program runs (see
    /// [`crate::sync::vlan`]).
    pub vlan: Option<VlanRead>,
    /// Stats slot of the VLAN parent's own entry (0 = none allocated yet).
    pub parent_slot: u32,
    /// The VLAN parent's shaping qdisc as last read ([`SHAPED_UNKNOWN`] until read).
    pub parent_shaper: Option<String>,
    /// The VLAN parent's hooks as last read.
    pub parent_hooks: Hooks,
}

/// `shaped_by` while `shaped = "auto"` and the qdiscs are not known yet: in doubt the fast
/// path does not send out of the interface.
const SHAPED_UNKNOWN: &str = "unknown qdiscs";

impl Managed {
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

    /// The `IFACE_F_*` flags the datapath gets for it.
    pub fn flags(&self) -> u32 {
        let hooks = if self.cfg.bypass_hooks {
            Hooks::default()
        } else {
            self.hooks
        };
        let mut flags = 0;
        if self.shaped_by().is_some() {
            flags |= IFACE_F_SHAPED;
        }
        if hooks.ingress {
            flags |= IFACE_F_INGRESS_HOOK;
        }
        if hooks.egress {
            flags |= IFACE_F_EGRESS_HOOK;
        }
        if !self.xmit.allowed() {
            flags |= IFACE_F_NO_XDP_XMIT;
        }
        flags
    }

    /// Records what sysfs says the interface is: a bridge is managed through its ports; a
    /// VLAN-filtering bridge is not (the fast path does not know a frame's VLAN).
    pub fn set_bridge_kind(&mut self, kind: BridgeKind) {
        let name = &self.cfg.name;
        if kind == BridgeKind::VlanFiltering {
            warn!(interface = %name, "{name}: a VLAN-filtering bridge is not accelerated: XDP runs on the bridge itself in generic mode, where it only counts, and nothing is sent out of it by the fast path");
        }
        self.ports = (kind == BridgeKind::Bridge).then(BridgePorts::new);
    }

    /// What its ports take from it, when it is a bridge (`None` while it is missing).
    fn bridge_view(&self, xdp_mode: XdpModeConfig) -> Option<BridgeView<'_>> {
        let flags = self.flags();
        Some(BridgeView {
            name: &self.cfg.name,
            ifindex: self.ifindex?,
            mac: self.mac,
            ingress_hook: flags & IFACE_F_INGRESS_HOOK != 0,
            bypass_hooks: self.cfg.bypass_hooks,
            xdp_mode,
        })
    }

    /// The parent the program runs on when this is a VLAN device, with the flags its own
    /// transmit judgement gives. Its stats slot is the one of `parent_slots` for its ifindex
    /// (shared by the VLANs over one parent), allocated from `next_slot` the first time.
    fn vlan_parent(
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
        if let Some(why) = judged.why_not() {
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

    /// Attaches to the interface (now `ifindex`, with `mac`): to its ports when it is a bridge,
    /// to `parent` when it is a VLAN device.
    fn attach<D: Ports>(
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
        } else if self.ports.is_some() {
            dp.attach_bridge(&self.cfg.name, ifindex, self.slot, self.flags(), mac)
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

    /// Detaches from it, its ports and their FDB entries included.
    fn detach<D: Ports>(&mut self, dp: &mut D, ifindex: u32) {
        for port in self
            .ports
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
            .into_keys()
        {
            dp.detach(port);
        }
        if self.ports.is_some() {
            dp.fdb_clear(ifindex);
        }
        dp.detach(ifindex);
    }

    /// Records a new XDP transmit judgement and logs what changes for the fast path. Returns
    /// whether it changed whether packets may be redirected into the interface.
    fn set_xmit(&mut self, xmit: XdpXmit) -> bool {
        let before = self.xmit.allowed();
        let first = self.xmit == XdpXmit::Unknown;
        self.xmit = xmit;
        let name = &self.cfg.name;
        match (before, self.xmit.why_not()) {
            // A bridge transmits nothing itself: its ports do; a VLAN device: its parent.
            _ if self.ports.is_some() || self.vlan.is_some() => {}
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
    fn set_hooks(&mut self, hooks: Hooks) -> bool {
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
    fn set_egress(&mut self, egress: Option<Egress>) -> bool {
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
}

/// What the tasks share: the state, and what tells a task that route answers it looked up
/// may be stale.
pub struct Shared {
    state: FairMutex<State>,
    /// Bumped (before anything else) when an rtnetlink notification that can change a route
    /// answer arrives: a task that looked routes up compares it before and after.
    paths_generation: AtomicU64,
    /// Asks the rtnetlink task for a revalidation (a batch was applied with route answers
    /// that were stale by then).
    revalidate: Notify,
    /// What the next revalidation re-checks (gathered until it starts; its own small lock,
    /// never held with the state's).
    stale: parking_lot::Mutex<Stale>,
    /// The last status built, and when: answers a status read that finds the state busy.
    published: parking_lot::Mutex<Option<(Instant, Arc<Status>)>>,
}

/// How long a status read waits for the state lock before it answers from the last status
/// built instead (see [`Shared::status`]).
pub const STATUS_WAIT: Duration = Duration::from_millis(10);
/// The oldest published status a read may answer with; older, it waits for the lock. Long
/// enough to cover a lock holder the scheduler keeps off the CPU on a loaded machine (up to
/// 1.6 s measured under `bench responsive` with three other build jobs on 2 cores).
pub const STATUS_MAX_AGE: Duration = Duration::from_secs(5);

impl Shared {
    /// Wraps the state built at start-up.
    pub fn new(state: State) -> Shared {
        Shared {
            state: FairMutex::new(state),
            paths_generation: AtomicU64::new(0),
            revalidate: Notify::new(),
            stale: parking_lot::Mutex::new(Stale::default()),
            published: parking_lot::Mutex::new(None),
        }
    }

    /// Locks the state (for planned map writes or a status read only). Fair: a task that
    /// applies a table in chunks lets every waiting request in between two chunks. How long
    /// each call site waits and holds it is recorded while debugging (see [`lock_stats`]).
    #[track_caller]
    pub fn lock(&self) -> StateGuard<'_> {
        // Outside any closure: a closure would be the caller.
        let at = Location::caller();
        let timed = lock_stats::enabled().then(|| (at, Instant::now()));
        let guard = self.state.lock();
        StateGuard {
            guard,
            timed: timed.map(|(at, asked)| (at, asked.elapsed(), Instant::now())),
        }
    }

    /// Waits at most `wait` for the state lock (see [`Shared::lock`]).
    #[track_caller]
    pub fn try_lock_for(&self, wait: Duration) -> Option<StateGuard<'_>> {
        let at = Location::caller();
        let asked = Instant::now();
        let guard = self.state.try_lock_for(wait)?;
        Some(StateGuard {
            guard,
            timed: lock_stats::enabled().then(|| (at, asked.elapsed(), Instant::now())),
        })
    }

    /// What `xdp-routerd status` and `/metrics` show: built fresh when the state lock is free
    /// within [`STATUS_WAIT`], else the status last built if it is younger than
    /// [`STATUS_MAX_AGE`] (kept fresh under load by [`crate::tasks::status`]), else built
    /// fresh after waiting for the lock. A scrape does not queue behind bulk work.
    pub fn status(&self) -> anyhow::Result<Status> {
        if let Some(s) = self.try_lock_for(STATUS_WAIT) {
            return self.build_status(s);
        }
        if let Some((at, status)) = self.published.lock().clone()
            && at.elapsed() < STATUS_MAX_AGE
        {
            let mut status = (*status).clone();
            status.age_ms = at.elapsed().as_millis() as u64;
            return Ok(status);
        }
        self.build_status(self.lock())
    }

    /// Builds the status under `s` (released before it is published) and publishes it.
    pub fn build_status(&self, s: StateGuard<'_>) -> anyhow::Result<Status> {
        let status = s.status()?;
        drop(s);
        *self.published.lock() = Some((Instant::now(), Arc::new(status.clone())));
        Ok(status)
    }

    /// What `xdp-routerd flows` shows: the connections listed under the lock, their counters
    /// (two map reads each) read a chunk at a time with the lock released in between, so a
    /// listing of 100,000 flows does not stall the other tasks. A connection removed meanwhile
    /// is left out.
    pub fn flows(&self) -> Flows {
        let conns: Vec<Offloaded> = self.lock().flows.conns().collect();
        let now = monotonic_ns();
        let mut flows = Vec::with_capacity(2 * conns.len());
        for chunk in conns.chunks(crate::tasks::APPLY_CHUNK) {
            flows.extend(self.lock().flow_rows(chunk, now));
        }
        Flows { flows }
    }

    /// Switches the fast path on or off; the published status says so at once.
    pub fn set_fastpath(&self, on: bool) -> anyhow::Result<()> {
        let mut s = self.lock();
        s.dp.set_fastpath(on)?;
        self.build_status(s).map(drop)
    }

    /// The current route generation (see [`Shared::paths_changed`]).
    pub fn paths_generation(&self) -> u64 {
        self.paths_generation.load(Ordering::Acquire)
    }

    /// Routes, addresses or links may have changed: answers looked up before are stale.
    pub fn paths_changed(&self) {
        self.paths_generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Asks for a revalidation of the connections `stale` names against fresh route answers
    /// (nothing when it is empty). Requests made before the revalidation task takes them
    /// coalesce into one pass.
    pub fn request_revalidation(&self, stale: Stale) {
        if stale.is_empty() {
            return;
        }
        self.stale.lock().merge(stale);
        self.revalidate.notify_one();
    }

    /// Resolves when a revalidation was asked for, with what it must re-check.
    pub async fn revalidation_requested(&self) -> Stale {
        loop {
            self.revalidate.notified().await;
            let stale = std::mem::take(&mut *self.stale.lock());
            if !stale.is_empty() {
                return stale;
            }
        }
    }
}

/// The locked state (see [`Shared::lock`]).
pub struct StateGuard<'a> {
    guard: FairMutexGuard<'a, State>,
    /// Where it was locked, how long that took, and when it was got (while timing).
    timed: Option<(&'static Location<'static>, Duration, Instant)>,
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.guard
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.guard
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        if let Some((at, wait, got)) = self.timed {
            let hold = got.elapsed();
            lock_stats::record(at, wait, hold);
        }
    }
}

/// Everything the tasks share: the datapath, the flow manager (the one place conntrack entries
/// become flows), the managed interfaces, and conntrack sync counters.
pub struct State<D = Datapath> {
    pub dp: D,
    pub flows: FlowManager,
    pub ifaces: Vec<Managed>,
    pub ct: ConntrackStatus,
    pub xdp_mode: XdpModeConfig,
    /// The kernel's XDP features of every device.
    pub xmit: Capabilities,
    /// Next stats slot for a bridge port or VLAN parent (never reused).
    pub next_slot: u32,
    /// Stats slots of the VLAN parents, by ifindex (one per parent, whatever its VLANs).
    pub parent_slots: BTreeMap<u32, u32>,
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
                ports: None,
                vlan: None,
                parent_slot: 0,
                parent_shaper: Some(SHAPED_UNKNOWN.into()),
                parent_hooks: Hooks::default(),
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
        }
    }

    /// Start-up: records what every interface is (`found`, by name; see
    /// [`crate::sync::bridge::read`]) and which devices can transmit XDP frames, before
    /// anything is attached.
    pub fn set_kinds_and_xmit(&mut self, found: &BridgeReads, xmit: Capabilities) {
        self.xmit = xmit;
        for m in &mut self.ifaces {
            let read = found.get(&m.cfg.name).cloned().unwrap_or_default();
            m.set_bridge_kind(read.kind);
            m.link_kind = read.link_kind;
            m.vlan = read.vlan;
            m.set_xmit(
                self.xmit
                    .of(m.ifindex.unwrap_or_default(), m.link_kind.as_deref()),
            );
        }
    }

    /// Whether a managed interface is a VLAN device.
    pub fn has_vlans(&self) -> bool {
        self.ifaces.iter().any(|m| m.vlan.is_some())
    }

    /// Whether a managed interface is a bridge.
    pub fn has_bridges(&self) -> bool {
        self.ifaces.iter().any(|m| m.ports.is_some())
    }

    /// Attaches to every present interface (start-up: its qdiscs and hooks are known by now).
    /// `macs` holds each one's MAC address, in config order.
    pub fn attach_all(&mut self, macs: &[Option<[u8; 6]>]) -> anyhow::Result<()> {
        for (m, mac) in self.ifaces.iter_mut().zip(macs) {
            let Some(ifindex) = m.ifindex else {
                continue;
            };
            let mac = mac_or_zero(&m.cfg.name, *mac);
            let parent = m.vlan_parent(&self.xmit, &mut self.parent_slots, &mut self.next_slot);
            m.mode = Some(m.attach(&mut self.dp, ifindex, mac, self.xdp_mode, parent)?);
        }
        let managed = self.managed_map();
        self.flows.set_managed(managed);
        Ok(())
    }

    fn managed_map(&self) -> BTreeMap<u32, String> {
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

    /// The configured interface names and the names of the managed bridges' ports (whose hooks
    /// are read too).
    pub fn hook_names(&self) -> Vec<String> {
        self.ifaces
            .iter()
            .flat_map(|m| {
                let ports = m
                    .ports
                    .iter()
                    .flat_map(|p| p.values().map(|p| p.name.clone()));
                let parent = m.vlan.iter().map(|v| v.parent_name.clone());
                std::iter::once(m.cfg.name.clone())
                    .chain(ports)
                    .chain(parent)
            })
            .collect()
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
        let Some(m) = self.ifaces.iter_mut().find(|m| m.cfg.name == name) else {
            return false;
        };
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
            m.detach(&mut self.dp, old);
        }
        m.set_bridge_kind(read.kind);
        m.link_kind = read.link_kind.clone();
        m.vlan = read.vlan.clone();
        // A new device: its qdiscs are read right after this (the caller's job); until then
        // `auto` counts it as shaped.
        m.egress = None;
        m.mode = None;
        m.ifindex = Some(ifindex);
        m.set_xmit(self.xmit.of(ifindex, m.link_kind.as_deref()));
        let mac = mac_or_zero(name, mac);
        let parent = m.vlan_parent(&self.xmit, &mut self.parent_slots, &mut self.next_slot);
        match m.attach(&mut self.dp, ifindex, mac, xdp_mode, parent) {
            Ok(mode) => m.mode = Some(mode),
            Err(e) => error!(interface = name, error = %format!("{e:#}"), "cannot attach"),
        }
        let managed = self.managed_map();
        self.flows.set_managed(managed);
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
        let managed = self.managed_map();
        self.flows.set_managed(managed);
        true
    }

    /// Whether `ifindex` is a managed interface or a managed bridge's port (whose qdiscs the
    /// fast path follows).
    pub fn has_egress_of(&self, ifindex: u32) -> bool {
        self.ifaces.iter().any(|m| {
            m.ifindex == Some(ifindex) || m.ports.as_ref().is_some_and(|p| p.contains_key(&ifindex))
        })
    }

    /// The ifindex a managed interface has now, if it is present.
    pub fn ifindex_of(&self, name: &str) -> Option<u32> {
        self.ifaces
            .iter()
            .find(|m| m.cfg.name == name)
            .and_then(|m| m.ifindex)
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
            let mut ports = m.ports.take();
            if let (Some(view), Some(ports)) = (m.bridge_view(self.xdp_mode), ports.as_mut()) {
                for (i, p) in ports.iter_mut() {
                    p.egress = by_ifindex
                        .as_ref()
                        .map(|b| b.get(i).cloned().unwrap_or_default());
                }
                bridge::write_flags(&mut self.dp, &view, ports);
            }
            m.ports = ports;
        }
        self.apply_parent_qdiscs(by_ifindex.as_ref());
    }

    /// The parents of managed VLAN devices that are not managed themselves: a shaped parent
    /// (`None`: qdiscs unknown) is not sent out of (the kernel sends a VLAN's packets through
    /// the parent's qdisc too).
    fn apply_parent_qdiscs(&mut self, by_ifindex: Option<&BTreeMap<u32, Egress>>) {
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
    fn write_parent_flags(&mut self) {
        let configured: Vec<u32> = self.ifaces.iter().filter_map(|m| m.ifindex).collect();
        for m in &self.ifaces {
            let (Some(v), Some(_)) = (&m.vlan, m.mode) else {
                continue;
            };
            let parent = v.link.parent;
            if configured.contains(&parent) {
                continue;
            }
            let mut flags = 0;
            if !self.xmit.of(parent, v.parent_kind.as_deref()).allowed() {
                flags |= IFACE_F_NO_XDP_XMIT;
            }
            if let Some(kind) = &m.parent_shaper {
                flags |= IFACE_F_SHAPED;
                debug!(interface = %m.cfg.name, parent = %v.parent_name, qdisc = %kind, "{}: its parent {} is shaped by {kind}: the fast path does not send out of {}", m.cfg.name, v.parent_name, m.cfg.name);
            }
            if !m.cfg.bypass_hooks {
                if m.parent_hooks.ingress {
                    flags |= IFACE_F_INGRESS_HOOK;
                }
                if m.parent_hooks.egress {
                    flags |= IFACE_F_EGRESS_HOOK;
                }
            }
            if let Err(e) = self.dp.set_iface_flags(parent, m.parent_slot, flags) {
                debug!(interface = %v.parent_name, error = %format!("{e:#}"), "cannot update the VLAN parent's flags");
            }
        }
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
            let mut ports = m.ports.take();
            if let (Some(view), Some(ports)) = (m.bridge_view(self.xdp_mode), ports.as_mut()) {
                bridge::refresh_xmit(&mut self.dp, &view, ports, &self.xmit);
            }
            m.ports = ports;
        }
        // The VLAN parents' own judgement.
        self.write_parent_flags();
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
            let mut ports = m.ports.take();
            if let (Some(view), Some(ports)) = (m.bridge_view(*xdp_mode), ports.as_mut()) {
                bridge::sync_ports(dp, &view, ports, read.ports.clone(), xmit, next_slot);
            }
            m.ports = ports;
        }
        self.next_slot != before
    }

    /// Copies a bridge FDB change into `BRIDGE_FDB` (managed bridges only).
    pub fn apply_fdb(&mut self, ev: FdbEvent) {
        let bridge = match ev {
            FdbEvent::Learned { bridge, .. } | FdbEvent::Forgotten { bridge, .. } => bridge,
        };
        if !self
            .ifaces
            .iter()
            .any(|m| m.ports.is_some() && m.ifindex == Some(bridge))
        {
            return;
        }
        match ev {
            FdbEvent::Learned { bridge, mac, port } => {
                if let Err(e) = self.dp.fdb_learn(bridge, mac, port) {
                    error!(error = %format!("{e:#}"), "cannot copy a bridge FDB entry");
                }
            }
            FdbEvent::Forgotten { bridge, mac } => self.dp.fdb_forget(bridge, mac),
        }
    }

    /// Replaces the `BRIDGE_FDB` entries of every managed bridge with a fresh FDB dump
    /// (`entries`, see [`crate::sync::bridge::fdb_dump`]): after an rtnetlink overrun, FDB
    /// notifications were lost, so entries of MACs that moved or left may be stale.
    pub fn reload_fdb(&mut self, entries: Vec<FdbEvent>) {
        let bridges: Vec<u32> = self
            .ifaces
            .iter()
            .filter(|m| m.ports.is_some())
            .filter_map(|m| m.ifindex)
            .collect();
        for &bridge in &bridges {
            self.dp.fdb_clear(bridge);
        }
        for ev in entries {
            self.apply_fdb(ev);
        }
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
            let mut ports = m.ports.take();
            if let (Some(view), Some(ports)) = (m.bridge_view(self.xdp_mode), ports.as_mut()) {
                for p in ports.values_mut() {
                    p.hooks = found.port(&p.name);
                }
                bridge::write_flags(&mut self.dp, &view, ports);
            }
            m.ports = ports;
            if let Some(v) = &m.vlan {
                m.parent_hooks = found.device(&v.parent_name);
            }
        }
        self.write_parent_flags();
    }
}

/// The MAC address frames must be sent to for the fast path to forward them. An interface
/// without an Ethernet address gets all zeros, which no frame carries: everything it receives
/// goes to the kernel.
fn mac_or_zero(name: &str, mac: Option<[u8; 6]>) -> [u8; 6] {
    mac.unwrap_or_else(|| {
        warn!(
            interface = name,
            "no Ethernet address: the fast path forwards nothing it receives"
        );
        [0; 6]
    })
}

impl State<Datapath> {
    /// What `xdp-routerd status` and `/metrics` show (a few map reads).
    pub fn status(&self) -> anyhow::Result<Status> {
        let mut counters = Vec::new();
        let mut seen_parents = std::collections::BTreeSet::new();
        let mut slots = Vec::new();
        for m in &self.ifaces {
            slots.push((&m.cfg.name, m.slot));
            for p in m.ports.iter().flat_map(|p| p.values()) {
                slots.push((&p.name, p.slot));
            }
            // A parent over several VLANs: one row; none for a parent in the config (it
            // counts in its own slot).
            if let Some(v) = &m.vlan
                && m.parent_slot != 0
                && !self.ifaces.iter().any(|o| o.ifindex == Some(v.link.parent))
                && seen_parents.insert(m.parent_slot)
            {
                slots.push((&v.parent_name, m.parent_slot));
            }
        }
        for (name, slot) in slots {
            for r in Reason::ALL {
                let c = self.dp.counter(slot, r)?;
                counters.push(CounterRow {
                    interface: name.clone(),
                    reason: r,
                    packets: c.packets,
                    bytes: c.bytes,
                });
            }
        }
        let mut interfaces = Vec::new();
        for m in &self.ifaces {
            interfaces.push(IfaceStatus {
                name: m.cfg.name.clone(),
                ifindex: m.ifindex.unwrap_or(0),
                role: m.cfg.role.to_string(),
                attach_mode: m.mode.map(AttachMode::as_str).unwrap_or("detached").into(),
                shaped: m.shaped_by().is_some(),
                shaped_config: m.cfg.shaped.to_string(),
                shaped_by: m.shaped_by(),
                egress_qdisc: m.egress.as_ref().and_then(|e| e.root.clone()),
                xdp_xmit: m.ifindex.is_some() && m.xmit.allowed(),
                no_xdp_xmit_because: match (&m.ports, m.ifindex) {
                    (_, None) => None,
                    (Some(_), Some(_)) => Some(
                        "a bridge: the fast path sends to the port its FDB names instead".into(),
                    ),
                    (None, Some(_)) => m.xmit.why_not(),
                },
                generic_because: m
                    .ifindex
                    .and_then(|i| self.dp.generic_because(i))
                    .map(str::to_string),
                bridge: None,
                fdb_entries: m
                    .ports
                    .as_ref()
                    .and(m.ifindex)
                    .map(|i| self.dp.fdb_len(i) as u64),
                encap: m.vlan.as_ref().map(|v| {
                    let proto = if v.link.tpid == 0x88a8 {
                        "802.1ad"
                    } else {
                        "802.1Q"
                    };
                    format!("VLAN {} ({proto}) on {}", v.link.vid, v.parent_name)
                }),
            });
            if let (Some(v), Some(_)) = (&m.vlan, m.mode)
                && !self.ifaces.iter().any(|o| o.ifindex == Some(v.link.parent))
                && !interfaces.iter().any(|i| i.ifindex == v.link.parent)
            {
                interfaces.push(IfaceStatus {
                    name: v.parent_name.clone(),
                    ifindex: v.link.parent,
                    role: m.cfg.role.to_string(),
                    attach_mode: m.mode.map(AttachMode::as_str).unwrap_or("detached").into(),
                    shaped: false,
                    shaped_config: "auto".into(),
                    shaped_by: None,
                    egress_qdisc: None,
                    xdp_xmit: false,
                    no_xdp_xmit_because: Some(
                        "managed only as a VLAN parent: only its VLANs' tagged frames are sent"
                            .into(),
                    ),
                    generic_because: self.dp.generic_because(v.link.parent).map(str::to_string),
                    bridge: None,
                    fdb_entries: None,
                    encap: Some(format!("parent of {}", m.cfg.name)),
                });
            }
            for (ifindex, p) in m.ports.iter().flatten() {
                interfaces.push(IfaceStatus {
                    name: p.name.clone(),
                    ifindex: *ifindex,
                    role: m.cfg.role.to_string(),
                    attach_mode: p.mode.map(AttachMode::as_str).unwrap_or("detached").into(),
                    shaped: p.shaped_by().is_some(),
                    shaped_config: "auto".into(),
                    shaped_by: p.shaped_by(),
                    egress_qdisc: p.egress.as_ref().and_then(|e| e.root.clone()),
                    xdp_xmit: p.xmit.allowed(),
                    no_xdp_xmit_because: p.xmit.why_not(),
                    generic_because: self.dp.generic_because(*ifindex).map(str::to_string),
                    bridge: Some(m.cfg.name.clone()),
                    fdb_entries: None,
                    encap: None,
                });
            }
        }
        let (v4_dirs, v6_dirs) = self.flows.directions();
        let mut ct = self.ct.clone();
        let fs = self.flows.stats();
        ct.offloaded = self.flows.len() as u64;
        ct.offloaded_total = fs.offloaded_total;
        ct.removed_total = fs.removed_total;
        ct.skipped = fs.skipped.clone();
        Ok(Status {
            fastpath: self.dp.fastpath()?,
            interfaces,
            flows: FlowCounts {
                ipv4: v4_dirs,
                ipv6: v6_dirs,
                capacity: self.dp.flow_capacity(),
            },
            counters,
            conntrack: ct,
            fib_cache: self.dp.fib_cache_status(),
            ruleset: self.dp.ruleset_status(),
            age_ms: 0,
        })
    }

    /// The `xdp-routerd flows` rows of `conns`, with their counters read from the maps now
    /// (see [`Shared::flows`]).
    fn flow_rows(&self, conns: &[Offloaded], now: u64) -> Vec<FlowRow> {
        let name = |i: u32| self.flows.iface_name(i).unwrap_or("?").to_string();
        let proto = |p: u8| match p {
            6 => "tcp".to_string(),
            17 => "udp".to_string(),
            p => p.to_string(),
        };
        let ep = |a: IpAddr, port: u16| match a {
            IpAddr::V4(a) => format!("{a}:{port}"),
            IpAddr::V6(a) => format!("[{a}]:{port}"),
        };
        let mut rows = Vec::new();
        for conn in conns {
            let e = &conn.entry;
            for (i, key) in conn.keys.iter().enumerate() {
                let (from, to_src, to_sport, to_dst, to_dport) = if i == 0 {
                    (
                        &e.orig,
                        e.reply.dst,
                        e.reply.dport,
                        e.reply.src,
                        e.reply.sport,
                    )
                } else {
                    (&e.reply, e.orig.dst, e.orig.dport, e.orig.src, e.orig.sport)
                };
                let (ifindex, family, counters, flags) = match key {
                    DirKey::V4(k) => {
                        let v = self.dp.get_v4(k);
                        (k.ifindex, "ipv4", v.map(|v| v.counters), v.map(|v| v.flags))
                    }
                    DirKey::V6(k) => {
                        let v = self.dp.get_v6(k);
                        (k.ifindex, "ipv6", v.map(|v| v.counters), v.map(|v| v.flags))
                    }
                };
                // Removed since it was listed (see `Shared::flows`): left out.
                let Some(c) = counters else {
                    continue;
                };
                rows.push(FlowRow {
                    family: family.into(),
                    ingress: name(ifindex),
                    proto: proto(from.proto),
                    src: ep(from.src, from.sport),
                    dst: ep(from.dst, from.dport),
                    new_src: ep(to_src, to_sport),
                    new_dst: ep(to_dst, to_dport),
                    direction: if flags.unwrap_or(0) & FLOW_F_REPLY != 0 {
                        "reply"
                    } else {
                        "original"
                    }
                    .into(),
                    packets: c.packets,
                    bytes: c.bytes,
                    idle_ms: (c.last_seen_ns != 0)
                        .then(|| now.saturating_sub(c.last_seen_ns) / 1_000_000),
                });
            }
        }
        rows
    }
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
