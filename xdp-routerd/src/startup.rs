//! Start-up, in the order that loses nothing: check what a user can get wrong, load the
//! datapath, subscribe to every notification source, learn the interfaces' qdiscs and hooks,
//! attach, then offload what conntrack already has.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::{Context as _, bail};
use tokio::{net::UnixListener, sync::mpsc::UnboundedReceiver};

use crate::{
    config::Config,
    control,
    datapath::{
        Datapath, DatapathChoice,
        hosts::{self, HostTrafficMap},
    },
    state::{Shared, State},
    sync::{
        bridge,
        ctnetlink::{CtNetlink, CtSubscription},
        hooks, netdev,
        nftables::{self, RulesetEvent},
        per_packet, pppoe, qdisc,
        routes::RouteLookup,
        rtnl::{self, RtEvent},
        sysctl::conntrack_checksum,
        xdp_xmit::{self, Capabilities, XmitEvent},
    },
    tasks::{self, conntrack::ct_err},
};

/// Everything the tasks start with.
pub struct Started {
    pub shared: Arc<Shared>,
    pub listener: UnixListener,
    pub socket_guard: RemoveOnDrop,
    pub rt_events: UnboundedReceiver<RtEvent>,
    pub ruleset_events: UnboundedReceiver<RulesetEvent>,
    /// Route lookups for conntrack events and for revalidation (one socket each).
    pub ct_lookup: RouteLookup,
    pub revalidate_lookup: RouteLookup,
    pub ct_events: CtSubscription,
    pub ct_requests: CtNetlink,
    /// Marks offloaded TCP connections "be liberal" again ([`tasks::conntrack::mark_liberal`]).
    pub ct_marker: CtNetlink,
    /// Marks parked TCP connections "be liberal" before revalidation offloads them.
    pub revalidate_marker: CtNetlink,
    pub keepalive: CtNetlink,
    /// The kernel's XDP feature changes; `None` without the `netdev` family (Linux < 6.3).
    pub xmit_events: Option<UnboundedReceiver<XmitEvent>>,
    /// The per-host counters, for the metrics task.
    pub host_traffic: HostTrafficMap,
}

/// Checks, loads, subscribes, attaches and offloads the existing connections.
pub async fn start(config: &Config, socket: PathBuf) -> anyhow::Result<Started> {
    // Everything a user can get wrong is checked before anything is attached.
    // An interface that does not exist yet (ppp0 while pppd dials, a VLAN or bridge created
    // later at boot) is attached when it appears; if none exists, the config is wrong.
    let ifindexes: Vec<Option<u32>> = config
        .interfaces
        .iter()
        .map(|cfg| netdev::ifindex(&cfg.name))
        .collect();
    if ifindexes.iter().all(Option::is_none) {
        let names: Vec<&str> = config.interfaces.iter().map(|c| c.name.as_str()).collect();
        bail!(
            "none of the interfaces in the config exists ({})",
            names.join(", ")
        );
    }
    for (cfg, _) in config
        .interfaces
        .iter()
        .zip(&ifindexes)
        .filter(|(_, i)| i.is_none())
    {
        tracing::warn!(
            interface = %cfg.name,
            "interface {} (from the config) does not exist yet: it is attached when it appears \
             (a PPP link still dialling, or a typo: see `ip link`)",
            cfg.name
        );
    }
    check_privileges()?;
    let listener = control::bind(&socket)?;
    let socket_guard = RemoveOnDrop(socket);

    let (capacity, source) = config.flow_capacity();
    let loading = std::time::Instant::now();
    let mut dp = Datapath::load(capacity, hosts::slots(config.host_metrics_limit))?;
    let host_traffic = dp.host_traffic_reader()?;
    tracing::info!(
        capacity,
        source = ?source,
        load_ms = loading.elapsed().as_millis() as u64,
        "flow maps created and programs loaded (capacity: directions per family)"
    );
    // Subscribe before reading qdiscs and dumping conntrack so nothing that happens in between
    // is lost.
    let rt_events = rtnl::subscribe().context("cannot subscribe to rtnetlink events")?;
    // Firewall changes: subscribed before anything is offloaded, so no commit is missed.
    let ruleset_events =
        nftables::subscribe().context("cannot subscribe to nftables notifications")?;
    // Flows may keep FIB answers only while the notifications that invalidate them are heard.
    dp.set_fib_cache(Duration::from_millis(config.fib_cache_ms))?;
    dp.set_verdict_max_age(Duration::from_millis(config.verdict_max_age_ms))?;
    // TCP/UDP checksums are verified in XDP exactly while conntrack verifies them.
    dp.set_verify_l4_checksum(conntrack_checksum())?;
    // XDP or TC per interface, as configured; before anything is attached.
    dp.set_datapath_choice(DatapathChoice {
        default: config.datapath,
        per_iface: config
            .interfaces
            .iter()
            .filter_map(|i| Some((i.name.clone(), i.datapath?)))
            .collect(),
    });
    let mut state = State::new(dp, &config.interfaces, &ifindexes, config.xdp_mode);
    state.set_host_metrics_limit(config.host_metrics_limit);
    // Rules that must see every packet, read before the first packet can be forwarded (the
    // nftables subscription above catches any commit from here on).
    state.set_per_packet_mode(config.per_packet_rules);
    // Nothing is offloaded or parked yet: no connection to release.
    state.apply_per_packet(
        tokio::task::spawn_blocking(per_packet::read)
            .await
            .context("reading the firewall ruleset")?,
    );
    // Which interfaces are bridges, and which devices can transmit XDP frames, before the
    // first packet is redirected.
    let xmit_sub = xdp_xmit::subscribe().context("cannot read the devices' XDP features")?;
    state.set_kinds_and_xmit(
        &bridge::read(&state.iface_names()),
        Capabilities::new(xmit_sub.initial.clone()),
    );
    // Know which egresses are shaped and which interfaces carry hooks XDP would jump over,
    // before the first packet is forwarded.
    state.apply_qdiscs(qdisc::read_all().await);
    state.apply_hooks(&hooks::read(&state.hook_names()).await);
    let macs: Vec<Option<[u8; 6]>> = config
        .interfaces
        .iter()
        .map(|c| netdev::hw_addr(&c.name))
        .collect();
    state.attach_all(&macs)?;
    if state.has_vlans() {
        // The VLAN parents' qdiscs (a parent not managed itself is attached only now).
        state.apply_qdiscs(qdisc::read_all().await);
    }
    // The PPP devices' sessions, then the qdiscs and hooks of the devices they run over.
    let ppp = state.pppoe_devices();
    if !ppp.is_empty() && state.apply_pppoe(&pppoe::read(&ppp)) {
        state.apply_qdiscs(qdisc::read_all().await);
        state.apply_hooks(&hooks::read(&state.hook_names()).await);
    }
    if state.has_bridges() {
        // The bridges' ports, their FDBs, then the ports' qdiscs and hooks.
        state.sync_bridges(&bridge::read(&state.iface_names()));
        match bridge::fdb_dump() {
            Ok(entries) => entries.into_iter().for_each(|e| state.apply_fdb(e)),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the bridge FDB: until MAC addresses are learned again, routed packets to the LAN go through the kernel")
            }
        }
        state.apply_qdiscs(qdisc::read_all().await);
        state.apply_hooks(&hooks::read(&state.hook_names()).await);
    }
    let shared = Arc::new(Shared::new(state));

    let ct_lookup = RouteLookup::new().context("cannot open an rtnetlink socket")?;
    let revalidate_lookup = RouteLookup::new().context("cannot open an rtnetlink socket")?;
    let ct_requests = CtNetlink::new().map_err(ct_err)?;
    let mut ct_events =
        CtSubscription::with_rcvbuf(config.conntrack_event_buffer).map_err(ct_err)?;
    let keepalive = CtNetlink::new().map_err(ct_err)?;
    let ct_marker = CtNetlink::new().map_err(ct_err)?;
    let revalidate_marker = CtNetlink::new().map_err(ct_err)?;
    // Our own timeout refreshes and liberal-flag updates come back as UPDATE events that carry
    // nothing new.
    ct_events.ignore_events_from(keepalive.port_id());
    ct_events.ignore_events_from(ct_requests.port_id());
    ct_events.ignore_events_from(ct_marker.port_id());
    ct_events.ignore_events_from(revalidate_marker.port_id());
    // Its own sockets: the dump and the lookups run on other threads than the writes.
    tasks::conntrack::resync_at_start(
        &shared,
        RouteLookup::new().context("cannot open an rtnetlink socket")?,
        CtNetlink::new().map_err(ct_err)?,
    )
    .await?;
    Ok(Started {
        shared,
        listener,
        socket_guard,
        rt_events,
        ruleset_events,
        ct_lookup,
        revalidate_lookup,
        ct_events,
        ct_requests,
        ct_marker,
        revalidate_marker,
        keepalive,
        xmit_events: xmit_sub.initial.is_some().then_some(xmit_sub.events),
        host_traffic,
    })
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

/// Removes the control socket's path when dropped.
pub struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
