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
    FLOW_F_REPLY, IFACE_F_BRIDGE, IFACE_F_EGRESS_HOOK, IFACE_F_INGRESS_HOOK, IFACE_F_NO_XDP_XMIT,
    IFACE_F_SHAPED, Reason,
};

use crate::{
    config::{InterfaceConfig, Shaped, XdpModeConfig},
    datapath::{AttachMode, Datapath, PppoeBinding, VlanParent},
    flows::{DirKey, FlowManager, FlowTable, Offloaded},
    paths::Stale,
    status::{
        BridgeVlanStatus, BridgeVlansStatus, ConntrackStatus, CounterRow, FlowCounts, FlowRow,
        Flows, IfaceStatus, PppoeStatus, Status,
    },
    sync::{
        bridge::{BridgeKind, BridgeRead, BridgeReads, FdbEvent},
        hooks::{self, Hooks},
        pppoe::{PppoeReads, SessionRead},
        qdisc::{self, Egress, Qdisc},
        vlan::VlanRead,
        xdp_xmit::{Capabilities, XdpXmit, XmitEvent},
    },
};

pub mod bridge;
pub mod lock_stats;
pub mod pppoe;

use bridge::{Bridge, BridgeView, ParentBridge, Vlans};
use pppoe::PppoeState;

pub use crate::datapath::Ports;

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
    /// For a bridge: its ports, where the program runs, and its VLAN filtering (see
    /// [`bridge`]).
    pub bridge: Option<Bridge>,
    /// For a VLAN device: its VLAN and parent, where the program runs (see
    /// [`crate::sync::vlan`]).
    pub vlan: Option<VlanRead>,
    /// Stats slot of the VLAN parent's own entry (0 = none allocated yet).
    pub parent_slot: u32,
    /// The VLAN parent's shaping qdisc as last read ([`SHAPED_UNKNOWN`] until read).
    pub parent_shaper: Option<String>,
    /// The VLAN parent's hooks as last read.
    pub parent_hooks: Hooks,
    /// For a PPP device (link kind `ppp`): its PPPoE session (see [`pppoe`]); `None` for
    /// any other device.
    pub pppoe: Option<PppoeState>,
}

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

    /// Whether it is a PPP device (`ppp0`), as last read.
    pub fn is_ppp(&self) -> bool {
        self.link_kind.as_deref() == Some("ppp")
    }

    /// Records its link kind as read; a PPP device starts without a session (read next).
    fn set_link_kind(&mut self, kind: Option<String>) {
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

    /// Records what sysfs says the interface is (`read`): a bridge is managed through its
    /// ports, with its VLAN filtering as read.
    pub fn set_bridge_kind(&mut self, read: &BridgeRead) {
        self.bridge = (read.kind == BridgeKind::Bridge).then(|| {
            let mut b = Bridge::default();
            b.set_filtering(&self.cfg.name, read);
            b
        });
    }

    /// Why the fast path carries nothing of it, when it is a VLAN device it cannot accelerate
    /// (a VLAN over a VLAN device: the program would run on the lower VLAN device, in generic
    /// mode, where it only counts).
    pub fn not_accelerated_because(&self) -> Option<String> {
        let v = self.vlan.as_ref()?;
        (v.parent_kind.as_deref() == Some("vlan")).then(|| {
            format!(
                "a VLAN over the VLAN device {} (stacked VLANs): left to the kernel",
                v.parent_name
            )
        })
    }

    /// Records what its VLAN (if it is a VLAN device) is as read; a VLAN over a VLAN device
    /// is warned about (see [`Managed::not_accelerated_because`]).
    fn set_vlan(&mut self, vlan: Option<VlanRead>) {
        self.vlan = vlan;
        if let Some(why) = self.not_accelerated_because() {
            let name = &self.cfg.name;
            warn!(interface = %name, "{name}: not accelerated: {why}");
        }
    }

    /// Whether it is a VLAN device over a bridge (`br-lan.20`).
    fn is_vlan_over_bridge(&self) -> bool {
        self.vlan
            .as_ref()
            .is_some_and(|v| v.parent_kind.as_deref() == Some("bridge"))
    }

    /// What the ports of `b` (its bridge, taken out of it while they are synced) take from it
    /// (`None` while it is missing).
    fn bridge_view(&self, xdp_mode: XdpModeConfig, b: &Bridge) -> Option<BridgeView<'_>> {
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

    /// Attaches to the interface (now `ifindex`, with `mac`): to its ports when it is a bridge,
    /// to `parent` when it is a VLAN device; a PPP device is only registered (its session is
    /// bound by [`State::apply_pppoe`]).
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
    fn detach<D: Ports>(&mut self, dp: &mut D, ifindex: u32) {
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

    /// Records a new XDP transmit judgement and logs what changes for the fast path. Returns
    /// whether it changed whether packets may be redirected into the interface.
    fn set_xmit(&mut self, xmit: XdpXmit) -> bool {
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
    /// Asks the PPPoE task to read the sessions now (links changed).
    pppoe_read: Notify,
    /// Signalled when a lock holder had the state mutably (see [`StateGuard`]): the status
    /// publisher rebuilds only then, so an idle daemon builds no status and reads no counter.
    changed: Notify,
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
            pppoe_read: Notify::new(),
            changed: Notify::new(),
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
            changed: &self.changed,
            touched: false,
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
            changed: &self.changed,
            touched: false,
        })
    }

    /// What `xdp-routerd status` and `/metrics` show: built fresh when the state lock is free
    /// within [`STATUS_WAIT`], else the status last built if it is younger than
    /// [`STATUS_MAX_AGE`] (rebuilt after changes by [`crate::tasks::status`], so it is fresh
    /// whenever bulk work holds the lock), else built fresh after waiting for the lock. A
    /// scrape does not queue behind bulk work.
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

    /// Resolves when the state was changed (had mutably under the lock) since the last call;
    /// changes made meanwhile coalesce into one wake-up.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Asks the PPPoE task for a read of the sessions (see [`crate::tasks::pppoe`]); requests
    /// made before it starts the read coalesce.
    pub fn request_pppoe_read(&self) {
        self.pppoe_read.notify_one();
    }

    /// Resolves when a read of the PPPoE sessions was asked for.
    pub async fn pppoe_read_requested(&self) {
        self.pppoe_read.notified().await;
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

/// The locked state (see [`Shared::lock`]). Having it mutably counts as a change: the status
/// publisher is told when the guard is dropped.
pub struct StateGuard<'a> {
    guard: FairMutexGuard<'a, State>,
    /// Where it was locked, how long that took, and when it was got (while timing).
    timed: Option<(&'static Location<'static>, Duration, Instant)>,
    /// [`Shared::changed`]'s signal.
    changed: &'a Notify,
    /// Whether the state was had mutably.
    touched: bool,
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.guard
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.touched = true;
        &mut self.guard
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        if self.touched {
            self.changed.notify_one();
        }
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
    /// The bridges managed only as the parent of managed VLAN devices, by ifindex (see
    /// [`State::sync_bridges`]).
    pub parent_bridges: BTreeMap<u32, ParentBridge>,
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
        }
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

    /// The names of the attached VLAN devices over `parent`, comma-separated (`br-lan.1,
    /// br-lan.2`).
    fn vlans_over(&self, parent: u32) -> String {
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

    /// Whether a managed interface is a bridge, or a VLAN device over one.
    pub fn has_bridges(&self) -> bool {
        self.ifaces
            .iter()
            .any(|m| m.bridge.is_some() || m.is_vlan_over_bridge())
    }

    /// Attaches to every present interface (start-up: its qdiscs and hooks are known by now).
    /// `macs` holds each one's MAC address, in config order.
    pub fn attach_all(&mut self, macs: &[Option<[u8; 6]>]) -> anyhow::Result<()> {
        for (m, mac) in self.ifaces.iter_mut().zip(macs) {
            let Some(ifindex) = m.ifindex else {
                continue;
            };
            let mac = mac_or_zero(&m.cfg.name, *mac, m.is_ppp());
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
        let mac = mac_or_zero(name, mac, m.is_ppp());
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
        self.prune_parent_bridges();
        let managed = self.managed_map();
        self.flows.set_managed(managed);
        true
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

    /// The present, attached PPP devices whose sessions must be read, with their
    /// `pppoe_device` (see [`crate::sync::pppoe::read`]).
    pub fn pppoe_devices(&self) -> Vec<(String, Option<String>)> {
        self.ifaces
            .iter()
            .filter(|m| m.pppoe.is_some() && m.mode.is_some() && m.ifindex.is_some())
            .map(|m| (m.cfg.name.clone(), m.cfg.pppoe_device.clone()))
            .collect()
    }

    /// Binds each attached PPP device to the session a read found for it (`found`, by name;
    /// see [`crate::sync::pppoe::read`]): rebinds when the session (ID, peer, lower device)
    /// changed, unbinds when it is gone or ambiguous (one warning per change). Returns
    /// whether a session now runs over another device (its qdiscs and hooks must be read).
    pub fn apply_pppoe(&mut self, found: &PppoeReads) -> bool {
        let configured: BTreeMap<u32, bool> = self
            .ifaces
            .iter()
            .filter_map(|m| Some((m.ifindex?, m.mode.is_some())))
            .collect();
        let (mut new_lower, mut rebound) = (false, false);
        let State {
            dp,
            ifaces,
            xmit,
            next_slot,
            parent_slots,
            xdp_mode,
            ..
        } = self;
        for m in ifaces.iter_mut() {
            let (Some(p), Some(ifindex), Some(_)) = (&mut m.pppoe, m.ifindex, m.mode) else {
                continue;
            };
            let Some(f) = found.get(&m.cfg.name) else {
                continue;
            };
            // Unchanged: bound already, or its binding failed (retried when it changes).
            if p.found.as_ref() == Some(f) {
                continue;
            }
            p.found = Some(f.clone());
            p.bind_error = None;
            let want = f.as_ref().ok();
            let name = &m.cfg.name;
            if want == p.bound.as_ref() {
                // Nothing bound before or now, for another reason.
                if let Err(why) = f {
                    warn!(interface = %name, "{name}: not accelerated: {why}");
                }
                continue;
            }
            let mut slot = |i: u32| match configured.get(&i) {
                // The program runs there for the interface itself: its own entry stays.
                Some(true) => 0,
                _ => *parent_slots.entry(i).or_insert_with(|| {
                    *next_slot += 1;
                    *next_slot - 1
                }),
            };
            let binding = want.map(|s| session_binding(s, xmit, &mut slot));
            rebound = true;
            match dp.set_pppoe(name, ifindex, binding.as_ref(), *xdp_mode) {
                Ok(()) => {
                    let lower = |b: &Option<SessionRead>| b.as_ref().map(|b| b.lower.ifindex);
                    if lower(&p.bound) != want.map(|s| s.lower.ifindex) {
                        p.lower = Default::default();
                        p.parent = Default::default();
                        // A device managed for itself has its qdiscs and hooks read already.
                        new_lower |=
                            want.is_some_and(|s| configured.get(&s.lower.ifindex) != Some(&true));
                    }
                    p.bound = want.cloned();
                    match f {
                        Ok(s) => {
                            info!(interface = %name, "{name}: {}: the fast path carries it", s.session)
                        }
                        Err(why) => warn!(interface = %name, "{name}: not accelerated: {why}"),
                    }
                }
                Err(e) => {
                    let e = format!("{e:#}");
                    error!(interface = %name, error = %e, "{name}: cannot bind its PPPoE session: not accelerated");
                    p.bound = None;
                    p.bind_error = Some(e);
                }
            }
        }
        if rebound {
            self.write_session_flags();
        }
        new_lower
    }

    /// The lower devices of the bound sessions that are not managed themselves (and their
    /// VLAN parents): a shaped device (`None`: qdiscs unknown) is not sent out of.
    fn apply_session_qdiscs(&mut self, by_ifindex: Option<&BTreeMap<u32, Egress>>) {
        for p in self.ifaces.iter_mut().filter_map(|m| m.pppoe.as_mut()) {
            let shaper = |i: u32| match by_ifindex {
                Some(b) => b.get(&i).and_then(|e| e.shaper.clone()),
                None => Some(SHAPED_UNKNOWN.into()),
            };
            let shapers: Vec<Option<String>> =
                p.sides().iter().map(|d| shaper(d.ifindex)).collect();
            let mut shapers = shapers.into_iter();
            if let Some(s) = shapers.next() {
                p.lower.shaper = s;
            }
            if let Some(s) = shapers.next() {
                p.parent.shaper = s;
            }
        }
        self.write_session_flags();
    }

    /// Writes the flags of every device a bound session runs over that is not managed
    /// itself (see [`pppoe::side_flags`]).
    fn write_session_flags(&mut self) {
        let configured: Vec<u32> = self.ifaces.iter().filter_map(|m| m.ifindex).collect();
        for m in &self.ifaces {
            let (Some(p), Some(_)) = (&m.pppoe, m.mode) else {
                continue;
            };
            for d in p.sides() {
                let Some(&slot) = self.parent_slots.get(&d.ifindex) else {
                    continue;
                };
                if configured.contains(&d.ifindex) {
                    continue;
                }
                let flags = pppoe::side_flags(&self.xmit, &d, m.cfg.bypass_hooks);
                if let Some(kind) = &d.side.shaper {
                    debug!(interface = %m.cfg.name, lower = %d.name, qdisc = %kind, "{}: its session's device {} is shaped by {kind}: the fast path does not send out of {}", m.cfg.name, d.name, m.cfg.name);
                }
                if let Err(e) = self.dp.set_iface_flags(d.ifindex, slot, flags) {
                    debug!(interface = %d.name, error = %format!("{e:#}"), "cannot update the PPPoE lower device's flags");
                }
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
    fn wanted_parent_bridges(&self) -> BTreeMap<u32, (String, bool)> {
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
    fn prune_parent_bridges(&mut self) {
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
    fn parent_bridge_view<'a>(
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
    fn sync_parent_bridges(&mut self, found: &BridgeReads) {
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
    fn bridge_ifindexes(&self) -> Vec<u32> {
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

/// The MAC address frames must be sent to for the fast path to forward them. An interface
/// without an Ethernet address gets all zeros, which no frame carries: everything it receives
/// goes to the kernel. (A PPP device has none, and needs none: its session's frames are sent
/// to its lower device's.)
fn mac_or_zero(name: &str, mac: Option<[u8; 6]>, ppp: bool) -> [u8; 6] {
    mac.unwrap_or_else(|| {
        if !ppp {
            warn!(
                interface = name,
                "no Ethernet address: the fast path forwards nothing it receives"
            );
        }
        [0; 6]
    })
}

/// What the datapath gets to bind `s`: the lower device (and, for a VLAN lower device, its
/// parent) with a stats slot from `slot` and, for when it is registered for the session only,
/// its XDP transmit judgement, shaped until its qdiscs are read (see
/// [`State::apply_session_qdiscs`]).
fn session_binding(
    s: &SessionRead,
    xmit: &Capabilities,
    slot: &mut impl FnMut(u32) -> u32,
) -> PppoeBinding {
    let flags = |ifindex: u32, kind: Option<&str>| {
        let mut f = IFACE_F_SHAPED;
        if !xmit.of(ifindex, kind).allowed() {
            f |= IFACE_F_NO_XDP_XMIT;
        }
        f
    };
    let l = &s.lower;
    PppoeBinding {
        sid_be: s.session.sid_be,
        peer_mac: s.session.peer,
        lower: VlanParent {
            name: s.session.lower.clone(),
            ifindex: l.ifindex,
            slot: slot(l.ifindex),
            flags: flags(l.ifindex, l.kind.as_deref()),
            mac: l.mac.unwrap_or_default(),
        },
        vlan: l.vlan.as_ref().map(|v| {
            let parent = VlanParent {
                name: v.parent_name.clone(),
                ifindex: v.link.parent,
                slot: slot(v.link.parent),
                flags: flags(v.link.parent, v.parent_kind.as_deref()),
                mac: v.parent_mac.unwrap_or_default(),
            };
            ((v.link.vid, v.link.tpid), parent)
        }),
    }
}

/// A VLAN-filtering device's VLANs for `status`.
fn vlans_status(v: &Vlans) -> BridgeVlansStatus {
    BridgeVlansStatus {
        tpid: v.tpid,
        pvid: (v.pvid != 0).then_some(v.pvid),
        vlans: v
            .table
            .iter()
            .map(|(&vid, m)| BridgeVlanStatus {
                vid,
                pvid: m.pvid,
                untagged: m.untagged,
            })
            .collect(),
    }
}

/// `VLAN 7 (802.1Q) on eth0`.
fn vlan_encap(v: &VlanRead) -> String {
    let proto = bridge::protocol_name(v.link.tpid);
    format!("VLAN {} ({proto}) on {}", v.link.vid, v.parent_name)
}

impl State<Datapath> {
    /// What `xdp-routerd status` and `/metrics` show (a few map reads).
    pub fn status(&self) -> anyhow::Result<Status> {
        let mut counters = Vec::new();
        let mut seen_parents = std::collections::BTreeSet::new();
        let mut slots = Vec::new();
        let configured: Vec<u32> = self.ifaces.iter().filter_map(|m| m.ifindex).collect();
        for m in &self.ifaces {
            slots.push((m.cfg.name.clone(), m.slot));
            for p in m.bridge.iter().flat_map(|b| b.ports.values()) {
                slots.push((p.name.clone(), p.slot));
            }
            // A parent over several VLANs: one row; none for a parent in the config (it
            // counts in its own slot). A bridge parent's ports count in theirs.
            if let Some(v) = &m.vlan
                && m.parent_slot != 0
                && !self.ifaces.iter().any(|o| o.ifindex == Some(v.link.parent))
                && seen_parents.insert(m.parent_slot)
            {
                slots.push((v.parent_name.clone(), m.parent_slot));
                if let Some(pb) = self.parent_bridges.get(&v.link.parent) {
                    for p in pb.bridge.ports.values() {
                        slots.push((p.name.clone(), p.slot));
                    }
                }
            }
            // The devices managed only for a PPPoE session: one row each, like a VLAN parent.
            for d in m.pppoe.iter().flat_map(PppoeState::sides) {
                if let Some(&slot) = self.parent_slots.get(&d.ifindex)
                    && !configured.contains(&d.ifindex)
                    && seen_parents.insert(slot)
                {
                    slots.push((d.name.to_string(), slot));
                }
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
                xdp_xmit: match &m.pppoe {
                    Some(p) => p.bound.is_some(),
                    None => m.ifindex.is_some() && m.xmit.allowed(),
                },
                no_xdp_xmit_because: match (&m.bridge, m.ifindex, &m.pppoe) {
                    (_, None, _) => None,
                    (Some(_), Some(_), _) => Some(
                        "a bridge: the fast path sends to the port its FDB names instead".into(),
                    ),
                    (None, Some(_), Some(p)) => p.bound.is_none().then(|| {
                        "a PPP device without an accelerated PPPoE session: packets routed out of it stay in the kernel".into()
                    }),
                    (None, Some(_), None) => m.xmit.why_not(),
                },
                generic_because: m
                    .ifindex
                    .and_then(|i| self.dp.generic_because(i))
                    .map(str::to_string),
                bridge: None,
                fdb_entries: m
                    .bridge
                    .as_ref()
                    .and(m.ifindex)
                    .map(|i| self.dp.fdb_len(i) as u64),
                encap: m.vlan.as_ref().map(vlan_encap).or_else(|| m.pppoe_encap()),
                pppoe: m.pppoe_status(),
                bridge_vlans: m
                    .bridge
                    .as_ref()
                    .filter(|b| b.filtering.is_some())
                    .map(|b| vlans_status(&b.vlans)),
                not_accelerated_because: m.not_accelerated_because(),
            });
            if let (Some(v), Some(_)) = (&m.vlan, m.mode)
                && !self.ifaces.iter().any(|o| o.ifindex == Some(v.link.parent))
                && !interfaces.iter().any(|i| i.ifindex == v.link.parent)
            {
                let pb = self.parent_bridges.get(&v.link.parent);
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
                        if m.is_vlan_over_bridge() {
                            "a bridge managed only as a VLAN parent: only its VLANs' frames are sent, out of the port its FDB names"
                        } else {
                            "managed only as a VLAN parent: only its VLANs' tagged frames are sent"
                        }
                        .into(),
                    ),
                    generic_because: self.dp.generic_because(v.link.parent).map(str::to_string),
                    bridge: None,
                    fdb_entries: pb.map(|_| self.dp.fdb_len(v.link.parent) as u64),
                    // A bridge parent (OpenWrt DSA: br-lan.1, br-lan.2) names all its VLANs.
                    encap: Some(format!(
                        "parent of {}",
                        if pb.is_some() {
                            self.vlans_over(v.link.parent)
                        } else {
                            m.cfg.name.clone()
                        }
                    )),
                    pppoe: None,
                    bridge_vlans: pb
                        .filter(|pb| pb.bridge.filtering.is_some())
                        .map(|pb| vlans_status(&pb.bridge.vlans)),
                    not_accelerated_because: None,
                });
                for (ifindex, p) in pb.iter().flat_map(|pb| pb.bridge.ports.iter()) {
                    let filtering = pb.is_some_and(|pb| pb.bridge.filtering.is_some());
                    interfaces.push(self.port_status(
                        m,
                        pb.map_or("", |pb| &pb.name),
                        *ifindex,
                        p,
                        filtering,
                    ));
                }
            }
            for d in m.pppoe.iter().flat_map(PppoeState::sides) {
                if configured.contains(&d.ifindex) {
                    continue;
                }
                let lower_of = format!("lower device of {}", m.cfg.name);
                if let Some(row) = interfaces.iter_mut().find(|i| i.ifindex == d.ifindex) {
                    // Listed already (a VLAN parent, another session's lower device).
                    if let Some(e) = &mut row.encap
                        && !e.contains(&lower_of)
                    {
                        e.push_str(&format!(", {lower_of}"));
                    }
                    continue;
                }
                let b = m.pppoe.as_ref().and_then(|p| p.bound.as_ref());
                let vlan = b
                    .and_then(|b| b.lower.vlan.as_ref())
                    .filter(|_| d.ifindex == b.map_or(0, |b| b.lower.ifindex));
                let encap = match vlan {
                    Some(v) => format!("{}, {lower_of}", vlan_encap(v)),
                    None if b.is_some_and(|b| b.lower.ifindex == d.ifindex) => lower_of,
                    None => format!("parent of {}", b.map_or("", |b| b.session.lower.as_str())),
                };
                let judged = self.xmit.of(d.ifindex, d.kind);
                let runs_on = vlan.map_or(d.ifindex, |v| v.link.parent);
                interfaces.push(IfaceStatus {
                    name: d.name.to_string(),
                    ifindex: d.ifindex,
                    role: m.cfg.role.to_string(),
                    attach_mode: self
                        .dp
                        .mode_of(runs_on)
                        .map(AttachMode::as_str)
                        .unwrap_or("detached")
                        .into(),
                    shaped: d.side.shaper.is_some(),
                    shaped_config: "auto".into(),
                    shaped_by: d.side.shaper.clone(),
                    egress_qdisc: None,
                    xdp_xmit: vlan.is_none() && judged.allowed(),
                    no_xdp_xmit_because: match vlan {
                        Some(_) => Some("a VLAN device: its parent sends its frames".into()),
                        None => judged.why_not(),
                    },
                    generic_because: self.dp.generic_because(runs_on).map(str::to_string),
                    bridge: None,
                    fdb_entries: None,
                    encap: Some(encap),
                    pppoe: None,
                    bridge_vlans: None,
                    not_accelerated_because: None,
                });
            }
            for (ifindex, p) in m.bridge.iter().flat_map(|b| b.ports.iter()) {
                let filtering = m.bridge.as_ref().is_some_and(|b| b.filtering.is_some());
                interfaces.push(self.port_status(m, &m.cfg.name, *ifindex, p, filtering));
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
            fib_cache: self.dp.fib_cache_status().into(),
            ruleset: self.dp.ruleset_status().into(),
            age_ms: 0,
        })
    }

    /// The `status` row of the port `p` (`ifindex`) of the bridge called `bridge`, managed for
    /// `m` (whose role it takes).
    fn port_status(
        &self,
        m: &Managed,
        bridge: &str,
        ifindex: u32,
        p: &bridge::Port,
        filtering: bool,
    ) -> IfaceStatus {
        IfaceStatus {
            name: p.name.clone(),
            ifindex,
            role: m.cfg.role.to_string(),
            attach_mode: p.mode.map(AttachMode::as_str).unwrap_or("detached").into(),
            shaped: p.shaped_by().is_some(),
            shaped_config: "auto".into(),
            shaped_by: p.shaped_by(),
            egress_qdisc: p.egress.as_ref().and_then(|e| e.root.clone()),
            xdp_xmit: p.xmit.allowed(),
            no_xdp_xmit_because: p.xmit.why_not(),
            generic_because: self.dp.generic_because(ifindex).map(str::to_string),
            bridge: Some(bridge.to_string()),
            fdb_entries: None,
            encap: None,
            pppoe: None,
            bridge_vlans: filtering.then(|| vlans_status(&p.vlans)),
            not_accelerated_because: None,
        }
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
