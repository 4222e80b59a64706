//! `xdp-routerd run`: load, attach, sync, serve, and clean up on exit.
//!
//! Tasks: conntrack events → [`FlowManager`]; keep-alive (conntrack timeout refresh of flows the
//! fast path carried); rtnetlink events (links come and go, paths change); the control socket.
//! They share one [`State`] behind a mutex: every operation under it is a few map syscalls.
//! The rtnetlink task also follows the managed interfaces' egress qdiscs (`shaped = "auto"`)
//! and flips `IFACE_F_SHAPED` in the IFACES map live.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use anyhow::{Context as _, anyhow, bail};
use tokio::{signal::unix::SignalKind, task::JoinSet};
use tracing::{debug, error, info, warn};
use xdp_router_common::{
    FLOW_F_REPLY, IFACE_F_EGRESS_HOOK, IFACE_F_INGRESS_HOOK, IFACE_F_LAN, IFACE_F_SHAPED,
    IFACE_F_WAN, Reason,
};

use crate::{
    config::{Config, InterfaceConfig, Role, Shaped},
    control::{self, Handler, Request},
    datapath::{AttachMode, Datapath},
    flows::{DirKey, FlowManager, Upsert},
    status::{ConntrackStatus, CounterRow, FlowCounts, FlowRow, Flows, IfaceStatus, Status},
    sync::{
        conntrack::{CtEntry, CtEvent, IPPROTO_TCP},
        ctnetlink::{
            CtNetlink, CtNetlinkError, CtSubscription, CtUpdate, KernelTimeouts, conntrack_checksum,
        },
        hooks::{self, Hooks},
        nftables::{self, RulesetEvent},
        qdisc::{self, Egress, Qdisc},
        rtnl::{self, RouteLookup, RtEvent},
    },
};

/// A managed interface as configured, and what it currently is in the kernel.
struct Managed {
    cfg: InterfaceConfig,
    slot: u32,
    ifindex: Option<u32>,
    mode: Option<AttachMode>,
    /// Its egress qdiscs as last read; `None` until read (or when the last read failed).
    egress: Option<Egress>,
    /// nftables netdev chains / tc filters found on it (see [`crate::sync::hooks`]).
    hooks: Hooks,
}

/// `shaped_by` while `shaped = "auto"` and the qdiscs are not known yet: in doubt the fast
/// path does not send out of the interface.
const SHAPED_UNKNOWN: &str = "unknown qdiscs";

impl Managed {
    /// Why the fast path must not send out of this interface (`config`, the shaping qdisc's
    /// kind, or [`SHAPED_UNKNOWN`]); `None` when it may.
    fn shaped_by(&self) -> Option<String> {
        match self.cfg.shaped {
            Shaped::Always => Some("config".into()),
            Shaped::Never => None,
            Shaped::Auto => match &self.egress {
                Some(e) => e.shaper.clone(),
                None => Some(SHAPED_UNKNOWN.into()),
            },
        }
    }

    fn flags(&self) -> u32 {
        let role = match self.cfg.role {
            Role::Lan => IFACE_F_LAN,
            Role::Wan => IFACE_F_WAN,
        };
        let hooks = if self.cfg.bypass_hooks {
            Hooks::default()
        } else {
            self.hooks
        };
        role | if self.shaped_by().is_some() {
            IFACE_F_SHAPED
        } else {
            0
        } | if hooks.ingress {
            IFACE_F_INGRESS_HOOK
        } else {
            0
        } | if hooks.egress { IFACE_F_EGRESS_HOOK } else { 0 }
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

/// Reads every qdisc of the namespace (on a blocking thread); a few attempts, since a failed
/// read leaves `auto` interfaces marked shaped.
async fn read_qdiscs() -> std::io::Result<Vec<Qdisc>> {
    let mut last = None;
    for attempt in 0..3 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match tokio::task::spawn_blocking(qdisc::dump).await {
            Ok(Ok(q)) => return Ok(q),
            Ok(Err(e)) => last = Some(e),
            Err(e) => last = Some(std::io::Error::other(e.to_string())),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("qdisc dump failed")))
}

/// Everything the tasks share.
struct State {
    dp: Datapath,
    flows: FlowManager,
    ifaces: Vec<Managed>,
    ct: ConntrackStatus,
    xdp_mode: crate::config::XdpModeConfig,
}

type Shared = Arc<Mutex<State>>;

/// The MAC address frames must be sent to for the fast path to forward them: `known` (from a
/// link notification) or the interface's current one. An interface without an Ethernet
/// address gets all zeros, which no frame carries: everything it receives goes to the kernel.
fn iface_mac(name: &str, known: Option<[u8; 6]>) -> [u8; 6] {
    known.or_else(|| rtnl::hw_addr(name)).unwrap_or_else(|| {
        warn!(
            interface = name,
            "no Ethernet address: the fast path forwards nothing it receives"
        );
        [0; 6]
    })
}

fn fmt_mac(m: [u8; 6]) -> String {
    m.map(|b| format!("{b:02x}")).join(":")
}

fn lock(s: &Shared) -> MutexGuard<'_, State> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    fn managed_map(&self) -> BTreeMap<u32, String> {
        self.ifaces
            .iter()
            .filter_map(|m| m.ifindex.map(|i| (i, m.cfg.name.clone())))
            .collect()
    }

    /// Attaches to a managed interface that (re)appeared under `ifindex`, or follows a change
    /// of its MAC address (`mac`, from the link notification; `None`: read it). Returns
    /// whether it is a new device.
    fn link_up(&mut self, ifindex: u32, name: &str, mac: Option<[u8; 6]>) -> bool {
        let xdp_mode = self.xdp_mode;
        let Some(m) = self.ifaces.iter_mut().find(|m| m.cfg.name == name) else {
            return false;
        };
        if m.ifindex == Some(ifindex) {
            if m.mode.is_some()
                && let Some(mac) = mac.or_else(|| rtnl::hw_addr(name))
            {
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
            self.dp.detach(old);
        }
        // A new device: its qdiscs are read right after this (the caller's job); until then
        // `auto` counts it as shaped.
        m.egress = None;
        let mac = iface_mac(name, mac);
        match self
            .dp
            .attach(name, ifindex, m.slot, m.flags(), mac, xdp_mode)
        {
            Ok(mode) => {
                m.ifindex = Some(ifindex);
                m.mode = Some(mode);
            }
            Err(e) => error!(interface = name, error = %format!("{e:#}"), "cannot attach"),
        }
        let managed = self.managed_map();
        self.flows.set_managed(managed);
        true
    }

    /// Applies a fresh qdisc read to every present managed interface and updates the flags of
    /// those whose shaping changed.
    fn apply_qdiscs(&mut self, qdiscs: std::io::Result<Vec<Qdisc>>) {
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
        }
    }

    fn link_gone(&mut self, ifindex: u32) -> bool {
        let Some(m) = self.ifaces.iter_mut().find(|m| m.ifindex == Some(ifindex)) else {
            return false;
        };
        warn!(interface = %m.cfg.name, ifindex, "managed interface disappeared; its flows go back to the kernel");
        m.ifindex = None;
        m.mode = None;
        self.dp.detach(ifindex);
        let managed = self.managed_map();
        self.flows.set_managed(managed);
        true
    }

    fn status(&self) -> anyhow::Result<Status> {
        let mut counters = Vec::new();
        for m in &self.ifaces {
            for r in Reason::ALL {
                let c = self.dp.counter(m.slot, r)?;
                counters.push(CounterRow {
                    interface: m.cfg.name.clone(),
                    reason: r.name().to_string(),
                    packets: c.packets,
                    bytes: c.bytes,
                });
            }
        }
        let (v4_dirs, v6_dirs) = self.flows.directions();
        let mut ct = self.ct.clone();
        let fs = self.flows.stats();
        ct.offloaded = self.flows.len() as u64;
        ct.offloaded_total = fs.offloaded_total;
        ct.removed_total = fs.removed_total;
        ct.skipped = fs
            .skipped
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        Ok(Status {
            fastpath: self.dp.fastpath()?,
            interfaces: self
                .ifaces
                .iter()
                .map(|m| IfaceStatus {
                    name: m.cfg.name.clone(),
                    ifindex: m.ifindex.unwrap_or(0),
                    role: m.cfg.role.to_string(),
                    attach_mode: m.mode.map(AttachMode::as_str).unwrap_or("detached").into(),
                    shaped: m.shaped_by().is_some(),
                    shaped_config: m.cfg.shaped.to_string(),
                    shaped_by: m.shaped_by(),
                    egress_qdisc: m.egress.as_ref().and_then(|e| e.root.clone()),
                })
                .collect(),
            flows: FlowCounts {
                ipv4: v4_dirs,
                ipv6: v6_dirs,
                capacity: self.dp.flow_capacity(),
            },
            counters,
            conntrack: ct,
            fib_cache: self.dp.fib_cache_status(),
            ruleset: self.dp.ruleset_status(),
        })
    }

    fn flows(&self) -> Flows {
        let now = monotonic_ns();
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
        for conn in self.flows.conns() {
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
                        let v = self.dp_get_v4(k);
                        (k.ifindex, "ipv4", v.map(|v| v.counters), v.map(|v| v.flags))
                    }
                    DirKey::V6(k) => {
                        let v = self.dp_get_v6(k);
                        (k.ifindex, "ipv6", v.map(|v| v.counters), v.map(|v| v.flags))
                    }
                };
                let c = counters.unwrap_or_default();
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
        Flows { flows: rows }
    }

    fn dp_get_v4(&self, k: &xdp_router_common::FlowKeyV4) -> Option<xdp_router_common::FlowV4> {
        crate::flows::FlowTable::get_v4(&self.dp, k)
    }
    fn dp_get_v6(&self, k: &xdp_router_common::FlowKeyV6) -> Option<xdp_router_common::FlowV6> {
        crate::flows::FlowTable::get_v6(&self.dp, k)
    }
}

/// CLOCK_MONOTONIC_COARSE in ns, the clock of `bpf_ktime_get_coarse_ns()` that the datapath
/// stamps `last_seen_ns` with.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

struct ControlHandler {
    state: Shared,
}

impl Handler for ControlHandler {
    fn handle(&self, req: Request) -> anyhow::Result<serde_json::Value> {
        let mut s = lock(&self.state);
        Ok(match req {
            Request::Status => serde_json::to_value(s.status()?)?,
            Request::Flows => serde_json::to_value(s.flows())?,
            Request::Fastpath { on } => {
                s.dp.set_fastpath(on)?;
                info!(on, "fast path switched {}", if on { "on" } else { "off" });
                serde_json::json!({ "fastpath": on })
            }
        })
    }
}

/// Runs the daemon until SIGINT/SIGTERM (or a fatal error). On return every XDP attachment is
/// gone (links are dropped with the datapath) and the control socket is removed.
pub async fn run(config: Config, socket: PathBuf) -> anyhow::Result<()> {
    run_with(config, socket, |_status| {}).await
}

/// A source of [`Status`] snapshots for other subsystems (metrics).
pub type StatusSource = Arc<dyn Fn() -> anyhow::Result<Status> + Send + Sync>;

/// [`run`], calling `started` with a status source once everything is attached and synced.
pub async fn run_with(
    config: Config,
    socket: PathBuf,
    started: impl FnOnce(StatusSource),
) -> anyhow::Result<()> {
    // Everything a user can get wrong is checked before anything is attached.
    let mut ifaces = Vec::new();
    for (i, cfg) in config.interfaces.iter().enumerate() {
        let ifindex = rtnl::ifindex(&cfg.name)
            .ok_or_else(|| anyhow!("interface {} (from the config) does not exist", cfg.name))?;
        ifaces.push(Managed {
            cfg: cfg.clone(),
            slot: i as u32 + 1,
            ifindex: Some(ifindex),
            mode: None,
            egress: None,
            hooks: Hooks::default(),
        });
    }
    check_privileges()?;
    let listener = control::bind(&socket)?;
    let _socket_guard = RemoveOnDrop(socket.clone());

    let (capacity, source) = config.flow_capacity();
    info!(capacity, source = ?source, "flow map capacity (directions per family)");
    let mut dp = Datapath::load(capacity)?;
    // Subscribe before reading qdiscs and dumping conntrack so nothing that happens in between
    // is lost.
    let rt_events = rtnl::subscribe().context("cannot subscribe to rtnetlink events")?;
    // Firewall changes: subscribed before anything is offloaded, so no commit is missed.
    let ruleset_events =
        nftables::subscribe().context("cannot subscribe to nftables notifications")?;
    // Flows may keep FIB answers only while the notifications that invalidate them are heard.
    dp.set_fib_cache(Duration::from_millis(config.fib_cache_ms))?;
    // TCP/UDP checksums are verified in XDP exactly while conntrack verifies them.
    dp.set_verify_l4_checksum(conntrack_checksum())?;
    // Know which egresses are shaped before the first packet is forwarded.
    match read_qdiscs().await {
        Ok(q) => {
            let by_ifindex = qdisc::egress_by_ifindex(&q);
            for m in &mut ifaces {
                let ifindex = m.ifindex.unwrap_or_default();
                m.set_egress(Some(by_ifindex.get(&ifindex).cloned().unwrap_or_default()));
            }
        }
        Err(e) => error!(error = %e, "cannot read qdiscs (RTM_GETQDISC)"),
    }
    // Know which interfaces carry hooks XDP would jump over, before the first packet.
    let names: Vec<String> = ifaces.iter().map(|m| m.cfg.name.clone()).collect();
    let found = hooks::read(&names).await;
    for m in &mut ifaces {
        m.set_hooks(found.get(&m.cfg.name).copied().unwrap_or_default());
    }
    for m in &mut ifaces {
        let ifindex = m.ifindex.unwrap_or_default();
        let mac = iface_mac(&m.cfg.name, None);
        m.mode = Some(dp.attach(
            &m.cfg.name,
            ifindex,
            m.slot,
            m.flags(),
            mac,
            config.xdp_mode,
        )?);
    }
    let mut flows = FlowManager::new();
    let state: Shared = Arc::new(Mutex::new(State {
        dp,
        flows: FlowManager::new(),
        ifaces,
        ct: ConntrackStatus::default(),
        xdp_mode: config.xdp_mode,
    }));
    {
        let mut s = lock(&state);
        flows.set_managed(s.managed_map());
        s.flows = flows;
    }

    let paths = Arc::new(RouteLookup::new().context("cannot open an rtnetlink socket")?);
    let mut requests = CtNetlink::new().map_err(ct_err)?;
    let mut events = CtSubscription::new().map_err(ct_err)?;
    let keepalive = CtNetlink::new().map_err(ct_err)?;
    // Our own timeout refreshes and liberal-flag updates come back as UPDATE events that carry
    // nothing new.
    events.ignore_events_from(keepalive.port_id());
    events.ignore_events_from(requests.port_id());
    resync(&state, &paths, &mut requests).await?;

    let mut tasks = JoinSet::new();
    tasks.spawn(conntrack_events(
        state.clone(),
        paths.clone(),
        events,
        requests,
    ));
    tasks.spawn(keepalive_loop(
        state.clone(),
        keepalive,
        Duration::from_millis(config.keepalive_interval_ms),
    ));
    tasks.spawn(rtnl_events(state.clone(), paths.clone(), rt_events));
    let (legacy_tx, legacy_events) = tokio::sync::mpsc::unbounded_channel();
    tasks.spawn(async move {
        nftables::poll_legacy(legacy_tx).await;
        Err(anyhow!("iptables-legacy poller ended"))
    });
    tasks.spawn(ruleset_changes(
        state.clone(),
        ruleset_events,
        legacy_events,
    ));
    let handler: Arc<dyn Handler> = Arc::new(ControlHandler {
        state: state.clone(),
    });
    tasks.spawn(async move {
        control::serve(listener, handler).await;
        Err(anyhow!("control socket closed"))
    });
    let source_state = state.clone();
    started(Arc::new(move || lock(&source_state).status()));
    info!(socket = %socket.display(), "xdp-routerd running; fast path on");

    let mut sigterm = tokio::signal::unix::signal(SignalKind::terminate())?;
    let result = tokio::select! {
        _ = tokio::signal::ctrl_c() => { info!("SIGINT: detaching and exiting"); Ok(()) }
        _ = sigterm.recv() => { info!("SIGTERM: detaching and exiting"); Ok(()) }
        Some(res) = tasks.join_next() => match res {
            Ok(Err(e)) => Err(e),
            Ok(Ok(())) => Err(anyhow!("a task ended unexpectedly")),
            Err(e) => Err(anyhow!("a task failed: {e}")),
        },
    };
    tasks.abort_all();
    // Detach now, explicitly: aborted tasks and the metrics' status source may still hold the
    // state for a moment, so dropping our reference alone would not close the bpf_links yet.
    lock(&state).dp.detach_all();
    drop(state);
    result
}

fn ct_err(e: CtNetlinkError) -> anyhow::Error {
    anyhow!("conntrack: {e}")
}

fn check_privileges() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // Capabilities may still be enough (systemd AmbientCapabilities); loading will tell.
        let caps = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let eff = caps
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0);
        const CAP_NET_ADMIN: u64 = 12;
        const CAP_PERFMON: u64 = 38;
        const CAP_BPF: u64 = 39;
        // Without CAP_PERFMON the verifier rejects the program's packet pointer arithmetic.
        let need = (1 << CAP_NET_ADMIN) | (1 << CAP_BPF) | (1 << CAP_PERFMON);
        if eff & need != need {
            bail!(
                "xdp-routerd needs root or the capabilities CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON"
            );
        }
    }
    Ok(())
}

struct RemoveOnDrop(PathBuf);
impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Makes the flow maps match a fresh conntrack dump.
async fn resync(state: &Shared, paths: &RouteLookup, ct: &mut CtNetlink) -> anyhow::Result<()> {
    let started = Instant::now();
    let dump = ct.dump().await.map_err(ct_err)?;
    let n = dump.len();
    let added = {
        let mut s = lock(state);
        let State { dp, flows, .. } = &mut *s;
        let before = flows.stats().offloaded_total;
        let (removed, _) = flows.resync(dump, dp, paths);
        s.ct.resyncs += 1;
        s.ct.last_resync_ms = started.elapsed().as_millis() as u64;
        let added = s.flows.stats().offloaded_total - before;
        info!(
            entries = n,
            offloaded = s.flows.len(),
            removed,
            ms = started.elapsed().as_millis() as u64,
            "conntrack resync"
        );
        added
    };
    if added > 0 {
        make_tcp_liberal(state, ct).await;
    }
    Ok(())
}

/// Marks every offloaded TCP connection "be liberal" (idempotent, see `CtUpdate::tcp_liberal`).
async fn make_tcp_liberal(state: &Shared, ct: &mut CtNetlink) {
    let tcp: Vec<CtEntry> = lock(state)
        .flows
        .conns()
        .filter(|c| c.entry.orig.proto == IPPROTO_TCP)
        .map(|c| c.entry.clone())
        .collect();
    for e in tcp {
        liberal(state, ct, &e).await;
    }
}

async fn liberal(state: &Shared, ct: &mut CtNetlink, e: &CtEntry) {
    if let Err(err) = ct.set_tcp_liberal(&e.orig, e.zone).await {
        debug!(error = %err, "cannot mark TCP connection liberal");
        lock(state).ct.errors += 1;
    }
}

async fn conntrack_events(
    state: Shared,
    paths: Arc<RouteLookup>,
    mut events: CtSubscription,
    mut requests: CtNetlink,
) -> anyhow::Result<()> {
    loop {
        let batch = match events.next_batch().await {
            Ok(batch) => batch,
            Err(CtNetlinkError::Overrun) => {
                warn!("conntrack event socket overrun: resyncing from a dump");
                if let Err(e) = resync(&state, &paths, &mut requests).await {
                    error!(error = %format!("{e:#}"), "conntrack resync failed");
                    lock(&state).ct.errors += 1;
                }
                continue;
            }
            Err(e) => {
                lock(&state).ct.errors += 1;
                return Err(ct_err(e));
            }
        };
        let mut newly_tcp = Vec::new();
        {
            let mut s = lock(&state);
            s.ct.events += batch.len() as u64;
            let State { dp, flows, ct, .. } = &mut *s;
            for ev in batch {
                *ct.events_by_type.entry(ev.kind().into()).or_default() += 1;
                match ev {
                    CtEvent::New(e) | CtEvent::Update(e) => {
                        let tcp = e.orig.proto == IPPROTO_TCP;
                        let entry = e.clone();
                        if flows.upsert(e, dp, &*paths) == Upsert::Added {
                            debug!(orig = ?entry.orig, "offloaded");
                            if tcp {
                                newly_tcp.push(entry);
                            }
                        }
                    }
                    CtEvent::Destroy(e) => {
                        if flows.forget(&e.orig, dp) {
                            debug!(orig = ?e.orig, "conntrack entry destroyed; flow removed");
                        }
                    }
                }
            }
        }
        for e in &newly_tcp {
            liberal(&state, &mut requests, e).await;
        }
        if !newly_tcp.is_empty() {
            // The kernel forwards the first packets of each direction again before they are
            // armed, and those set MAXACK_SET again: a stale td_maxack would make conntrack
            // ignore the connection's RST. Mark them liberal once more after arming (the
            // keep-alive does it for every active connection later on).
            let state = state.clone();
            tokio::spawn(async move {
                tokio::time::sleep(REMARK_LIBERAL_AFTER).await;
                let Ok(mut ct) = CtNetlink::new() else {
                    return;
                };
                for e in &newly_tcp {
                    liberal(&state, &mut ct, e).await;
                }
            });
        }
    }
}

/// When newly offloaded TCP connections are marked liberal a second time (after arming).
const REMARK_LIBERAL_AFTER: Duration = Duration::from_millis(200);

async fn keepalive_loop(
    state: Shared,
    mut ct: CtNetlink,
    interval: Duration,
) -> anyhow::Result<()> {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // Re-read every pass: an administrator may change the sysctls at any time.
        let timeouts = match KernelTimeouts::read() {
            Ok(t) => t,
            Err(e) => {
                warn!(error = %e, "cannot read conntrack timeouts; keep-alive skipped");
                continue;
            }
        };
        // Also re-read every pass (a /proc read): whether conntrack verifies checksums.
        let verify = conntrack_checksum();
        let active = {
            let s = lock(&state);
            let mut s = s;
            if let Err(e) = s.dp.set_verify_l4_checksum(verify) {
                error!(error = %e, "cannot update the checksum setting");
            }
            let State { dp, flows, .. } = &mut *s;
            flows.active_since_last_pass(dp, monotonic_ns())
        };
        let mut refreshed = 0u64;
        let mut errors = 0u64;
        let mut gone = Vec::new();
        for e in active {
            let Some(secs) = timeouts.for_proto(e.orig.proto) else {
                continue;
            };
            // TCP: re-mark it liberal in the same message. Packets the kernel saw since the
            // last pass (handshake stragglers, shaped egress) set MAXACK_SET again, and a stale
            // td_maxack would make conntrack ignore the connection's RST.
            let mut update = CtUpdate::new(e.orig, e.zone).timeout(secs);
            if e.orig.proto == IPPROTO_TCP {
                update = update.tcp_liberal();
            }
            match ct.update(&update).await {
                Ok(true) => refreshed += 1,
                Ok(false) => gone.push(e),
                Err(err) => {
                    debug!(error = %err, "conntrack refresh failed");
                    errors += 1;
                }
            }
        }
        let mut s = lock(&state);
        s.ct.refreshes += refreshed;
        s.ct.errors += errors;
        let State { dp, flows, .. } = &mut *s;
        for e in gone {
            // Conntrack no longer has it (we missed the DESTROY): take it back.
            flows.forget(&e.orig, dp);
        }
    }
}

async fn rtnl_events(
    state: Shared,
    paths: Arc<RouteLookup>,
    mut events: tokio::sync::mpsc::UnboundedReceiver<RtEvent>,
) -> anyhow::Result<()> {
    while let Some(first) = events.recv().await {
        // The datapath's cached FIB answers go first, before the debounce: the next packet of
        // every flow asks the kernel's FIB again.
        invalidate_fib_cache(&state);
        // Debounce: a route change usually comes as a burst of messages.
        let mut batch = vec![first];
        tokio::time::sleep(Duration::from_millis(50)).await;
        while let Ok(ev) = events.try_recv() {
            batch.push(ev);
        }
        if batch.len() > 1 {
            // Answers cached while the burst was being applied may be half-old.
            invalidate_fib_cache(&state);
        }
        if apply_rt_events(&state, &paths, batch) {
            let qdiscs = read_qdiscs().await;
            lock(&state).apply_qdiscs(qdiscs);
            refresh_hooks(&state).await;
        }
    }
    Err(anyhow!("rtnetlink event socket closed"))
}

/// Bumps the ruleset generation for every firewall change (nftables commit, lost notifications,
/// iptables-legacy change): every flow direction is disarmed until the kernel forwards it again.
async fn ruleset_changes(
    state: Shared,
    mut nft: tokio::sync::mpsc::UnboundedReceiver<RulesetEvent>,
    mut legacy: tokio::sync::mpsc::UnboundedReceiver<RulesetEvent>,
) -> anyhow::Result<()> {
    loop {
        let first = tokio::select! {
            ev = nft.recv() => ev.ok_or_else(|| anyhow!("nftables event socket closed"))?,
            ev = legacy.recv() => ev.ok_or_else(|| anyhow!("iptables-legacy poller ended"))?,
        };
        // One bump covers everything queued: a single map write disarms every flow.
        let mut events = vec![first];
        while let Ok(ev) = nft.try_recv() {
            events.push(ev);
        }
        {
            let mut s = lock(&state);
            match s.dp.bump_ruleset_generation() {
                Ok(()) => debug!(
                    ?events,
                    generation = s.dp.ruleset_status().generation,
                    "firewall ruleset changed: every flow goes through the kernel's rules again"
                ),
                Err(e) => error!(error = %format!("{e:#}"), "cannot bump the ruleset generation"),
            }
        }
        // A netdev chain may have come or gone with the commit.
        refresh_hooks(&state).await;
    }
}

/// Re-reads the hooks on every managed interface (no lock held while reading) and updates the
/// flags of those whose hooks changed.
async fn refresh_hooks(state: &Shared) {
    let names: Vec<String> = lock(state)
        .ifaces
        .iter()
        .map(|m| m.cfg.name.clone())
        .collect();
    let found = hooks::read(&names).await;
    let mut s = lock(state);
    let State { dp, ifaces, .. } = &mut *s;
    for m in ifaces.iter_mut() {
        let h = found.get(&m.cfg.name).copied().unwrap_or_default();
        if m.set_hooks(h)
            && let (Some(ifindex), Some(_)) = (m.ifindex, m.mode)
            && let Err(e) = dp.set_iface_flags(ifindex, m.slot, m.flags())
        {
            error!(interface = %m.cfg.name, error = %format!("{e:#}"), "cannot update interface flags");
        }
    }
}

/// Drops every cached FIB answer in the datapath (see [`Datapath::invalidate_fib_cache`]).
fn invalidate_fib_cache(state: &Shared) {
    if let Err(e) = lock(state).dp.invalidate_fib_cache() {
        error!(error = %e, "cannot invalidate the FIB cache");
    }
}

/// Applies a batch of rtnetlink events; returns whether the qdiscs must be read again.
fn apply_rt_events(state: &Shared, paths: &RouteLookup, batch: Vec<RtEvent>) -> bool {
    let mut s = lock(state);
    let mut revalidate = false;
    let mut reread_qdiscs = false;
    for ev in batch {
        match ev {
            RtEvent::LinkUp { ifindex, name, mac } => {
                let new_device = s.link_up(ifindex, &name, mac);
                revalidate |= new_device;
                reread_qdiscs |= new_device;
            }
            RtEvent::LinkGone { ifindex, .. } => revalidate |= s.link_gone(ifindex),
            RtEvent::PathsChanged => revalidate = true,
            // Only cached FIB answers depend on these (dropped above).
            RtEvent::FibChanged => {}
            RtEvent::QdiscChanged { ifindex } => {
                reread_qdiscs |= s.ifaces.iter().any(|m| m.ifindex == Some(ifindex));
            }
            RtEvent::Overrun => {
                reread_qdiscs = true;
                warn!("rtnetlink overrun: re-reading links and revalidating flows");
                let names: Vec<String> = s.ifaces.iter().map(|m| m.cfg.name.clone()).collect();
                for name in names {
                    match rtnl::ifindex(&name) {
                        Some(i) => {
                            s.link_up(i, &name, None);
                        }
                        None => {
                            if let Some(i) = s
                                .ifaces
                                .iter()
                                .find(|m| m.cfg.name == name)
                                .and_then(|m| m.ifindex)
                            {
                                s.link_gone(i);
                            }
                        }
                    }
                }
                revalidate = true;
            }
        }
    }
    if revalidate {
        let State { dp, flows, .. } = &mut *s;
        let (removed, added) = flows.revalidate(dp, paths);
        if removed > 0 {
            info!(
                removed,
                "routing or address change: flows handed back to the kernel"
            );
        }
        if added > 0 {
            info!(
                added,
                "routing or address change: connections offloaded again"
            );
        }
    }
    reread_qdiscs
}
