//! `xdp-routerd run`: start up ([`crate::startup`]), run one task per event source
//! ([`crate::tasks`]) over the shared [`crate::state`], and detach on exit.

use std::{path::PathBuf, time::Duration};

use anyhow::anyhow;
use tokio::task::JoinSet;
use tracing::info;

use crate::{config::Config, signals::Shutdown, startup, sync::nftables, tasks};

/// Runs the daemon until SIGINT/SIGTERM ([`Shutdown`]) or a fatal error, serving `/metrics` on
/// `metrics` (bound before anything was attached) when given. On return every XDP attachment
/// is gone and the control socket is removed.
pub async fn run(
    config: Config,
    socket: PathBuf,
    metrics: Option<std::net::TcpListener>,
    mut shutdown: Shutdown,
) -> anyhow::Result<()> {
    let s = startup::start(&config, socket.clone()).await?;
    let _socket_guard = s.socket_guard;
    let shared = s.shared;

    let mut tasks = JoinSet::new();
    let (marker, to_mark) = tokio::sync::mpsc::unbounded_channel();
    tasks.spawn(tasks::conntrack::run(
        shared.clone(),
        s.ct_lookup,
        s.ct_events,
        s.ct_requests,
        marker,
    ));
    tasks.spawn(tasks::conntrack::mark_liberal(
        shared.clone(),
        s.ct_marker,
        to_mark,
    ));
    tasks.spawn(tasks::keepalive::run(
        shared.clone(),
        s.keepalive,
        Duration::from_millis(config.keepalive_interval_ms),
    ));
    tasks.spawn(tasks::rtnetlink::run(shared.clone(), s.rt_events));
    tasks.spawn(tasks::pppoe::run(shared.clone()));
    tasks.spawn(tasks::rtnetlink::revalidate(
        shared.clone(),
        s.revalidate_lookup,
        s.revalidate_marker,
    ));
    if let Some(events) = s.xmit_events {
        tasks.spawn(tasks::xdp_xmit::run(shared.clone(), events));
    }
    let (legacy_tx, legacy_events) = tokio::sync::mpsc::unbounded_channel();
    let legacy_ended = nftables::spawn_legacy_poller(legacy_tx)
        .map_err(|e| anyhow!("cannot start the iptables-legacy poller: {e}"))?;
    tasks.spawn(async move {
        let _ = legacy_ended.await;
        Err(anyhow!("iptables-legacy poller ended"))
    });
    tasks.spawn(tasks::ruleset::run(
        shared.clone(),
        s.ruleset_events,
        legacy_events,
    ));
    tasks.spawn(tasks::held_counters::run(shared.clone()));
    tasks.spawn(tasks::control::run(s.listener, shared.clone()));
    tasks.spawn(tasks::status::publish(shared.clone()));
    if let Some(listener) = metrics {
        tasks.spawn(tasks::metrics::run(
            listener,
            shared.clone(),
            (config.host_metrics_limit > 0).then_some(s.host_traffic),
        ));
    }
    info!(socket = %socket.display(), "xdp-routerd running; fast path on");

    let result = tokio::select! {
        signal = shutdown.requested() => { info!("{signal}: detaching and exiting"); Ok(()) }
        Some(res) = tasks.join_next() => match res {
            Ok(Err(e)) => Err(e),
            Ok(Ok(())) => Err(anyhow!("a task ended unexpectedly")),
            Err(e) => Err(anyhow!("a task failed: {e}")),
        },
    };
    tasks.abort_all();
    // Detach now, explicitly: aborted tasks and the request threads may still hold the state
    // for a moment, so dropping our reference alone would not close the bpf_links yet.
    shared.lock().detach_all();
    result
}
