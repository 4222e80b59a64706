//! `xdp-routerd run`: load, attach, sync, serve, and clean up on exit.
//!
//! Tasks: conntrack events → [`FlowManager`]; keep-alive (conntrack timeout refresh of flows the
//! fast path carried); rtnetlink events (links come and go, paths change); the control socket.
//! They share one [`State`] behind a mutex: every operation under it is a few map syscalls.

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
use xdp_router_common::{FLOW_F_REPLY, IFACE_F_LAN, IFACE_F_SHAPED, IFACE_F_WAN, Reason};

use crate::{
    config::{Config, InterfaceConfig, Role},
    control::{self, Handler, Request},
    datapath::{AttachMode, Datapath},
    flows::{DirKey, FlowManager, Upsert},
    status::{ConntrackStatus, CounterRow, FlowCounts, FlowRow, Flows, IfaceStatus, Status},
    sync::{
        conntrack::{CtEntry, CtEvent, IPPROTO_TCP},
        ctnetlink::{CtNetlink, CtNetlinkError, CtSubscription, KernelTimeouts},
        rtnl::{self, RouteLookup, RtEvent},
    },
};

/// A managed interface as configured, and what it currently is in the kernel.
struct Managed {
    cfg: InterfaceConfig,
    slot: u32,
    ifindex: Option<u32>,
    mode: Option<AttachMode>,
}

impl Managed {
    fn flags(&self) -> u32 {
        let role = match self.cfg.role {
            Role::Lan => IFACE_F_LAN,
            Role::Wan => IFACE_F_WAN,
        };
        role | if self.cfg.shaped { IFACE_F_SHAPED } else { 0 }
    }
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

    /// Attaches to a managed interface that (re)appeared under `ifindex`.
    fn link_up(&mut self, ifindex: u32, name: &str) -> bool {
        let xdp_mode = self.xdp_mode;
        let Some(m) = self.ifaces.iter_mut().find(|m| m.cfg.name == name) else {
            return false;
        };
        if m.ifindex == Some(ifindex) {
            return false;
        }
        if let Some(old) = m.ifindex.take() {
            self.dp.detach(old);
        }
        match self.dp.attach(name, ifindex, m.slot, m.flags(), xdp_mode) {
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
                    shaped: m.cfg.shaped,
                })
                .collect(),
            flows: FlowCounts {
                ipv4: self.flows.directions().0,
                ipv6: self.flows.directions().1,
                capacity: self.dp.flow_capacity(),
            },
            counters,
            conntrack: ct,
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

/// CLOCK_MONOTONIC in ns, the clock of `bpf_ktime_get_ns()`.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
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
        });
    }
    check_privileges()?;
    let listener = control::bind(&socket)?;
    let _socket_guard = RemoveOnDrop(socket.clone());

    let mut dp = Datapath::load(config.flow_capacity)?;
    for m in &mut ifaces {
        let ifindex = m.ifindex.unwrap_or_default();
        m.mode = Some(dp.attach(&m.cfg.name, ifindex, m.slot, m.flags(), config.xdp_mode)?);
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
    // Subscribe before dumping so nothing that happens in between is lost.
    let rt_events = rtnl::subscribe().context("cannot subscribe to rtnetlink events")?;
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
    // Dropping the datapath closes the bpf_links: the kernel carries everything again.
    let state = Arc::try_unwrap(state).ok();
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
                let kind = match ev {
                    CtEvent::Upsert(_) => "new_or_update",
                    CtEvent::Destroy(_) => "destroy",
                };
                *ct.events_by_type.entry(kind.into()).or_default() += 1;
                match ev {
                    CtEvent::Upsert(e) => {
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
                        if flows.remove(&e.orig, dp) {
                            debug!(orig = ?e.orig, "conntrack entry destroyed; flow removed");
                        }
                    }
                }
            }
        }
        for e in &newly_tcp {
            liberal(&state, &mut requests, e).await;
        }
    }
}

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
        let active = {
            let s = lock(&state);
            let mut s = s;
            let State { dp, flows, .. } = &mut *s;
            flows.active_since_last_pass(dp)
        };
        let mut refreshed = 0u64;
        let mut errors = 0u64;
        let mut gone = Vec::new();
        for e in active {
            let Some(secs) = timeouts.for_proto(e.orig.proto) else {
                continue;
            };
            match ct.refresh_timeout(&e.orig, e.zone, secs).await {
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
            flows.remove(&e.orig, dp);
        }
    }
}

async fn rtnl_events(
    state: Shared,
    paths: Arc<RouteLookup>,
    mut events: tokio::sync::mpsc::UnboundedReceiver<RtEvent>,
) -> anyhow::Result<()> {
    while let Some(first) = events.recv().await {
        // Debounce: a route change usually comes as a burst of messages.
        let mut batch = vec![first];
        tokio::time::sleep(Duration::from_millis(50)).await;
        while let Ok(ev) = events.try_recv() {
            batch.push(ev);
        }
        let mut s = lock(&state);
        let mut revalidate = false;
        for ev in batch {
            match ev {
                RtEvent::LinkUp { ifindex, name } => revalidate |= s.link_up(ifindex, &name),
                RtEvent::LinkGone { ifindex, .. } => revalidate |= s.link_gone(ifindex),
                RtEvent::PathsChanged => revalidate = true,
                RtEvent::Overrun => {
                    warn!("rtnetlink overrun: re-reading links and revalidating flows");
                    let names: Vec<String> = s.ifaces.iter().map(|m| m.cfg.name.clone()).collect();
                    for name in names {
                        match rtnl::ifindex(&name) {
                            Some(i) => {
                                s.link_up(i, &name);
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
            let removed = flows.revalidate(dp, &*paths);
            if removed > 0 {
                info!(
                    removed,
                    "routing or address change: flows handed back to the kernel"
                );
            }
        }
    }
    Err(anyhow!("rtnetlink event socket closed"))
}
