//! `xdp-routerd run`: start up ([`crate::startup`]), run one task per event source
//! ([`crate::tasks`]) over the shared [`crate::state`], and detach on exit.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::anyhow;
use tokio::{signal::unix::SignalKind, task::JoinSet};
use tracing::info;

use crate::{
    config::Config,
    control::{self, Handler},
    startup,
    status::Status,
    sync::nftables,
    tasks,
};

/// A source of [`Status`] snapshots for other subsystems (metrics).
pub type StatusSource = Arc<dyn Fn() -> anyhow::Result<Status> + Send + Sync>;

/// Runs the daemon until SIGINT/SIGTERM (or a fatal error), calling `started` with a status
/// source once everything is attached and synced. On return every XDP attachment is gone and
/// the control socket is removed.
pub async fn run_with(
    config: Config,
    socket: PathBuf,
    started: impl FnOnce(StatusSource),
) -> anyhow::Result<()> {
    let s = startup::start(&config, socket.clone()).await?;
    let _socket_guard = s.socket_guard;
    let shared = s.shared;

    let mut tasks = JoinSet::new();
    let (marker, to_mark) = tokio::sync::mpsc::unbounded_channel();
    let _ = marker.send(s.to_mark);
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
    tasks.spawn(tasks::rtnetlink::revalidate(
        shared.clone(),
        s.revalidate_lookup,
    ));
    let (legacy_tx, legacy_events) = tokio::sync::mpsc::unbounded_channel();
    tasks.spawn(async move {
        nftables::poll_legacy(legacy_tx).await;
        Err(anyhow!("iptables-legacy poller ended"))
    });
    tasks.spawn(tasks::ruleset::run(
        shared.clone(),
        s.ruleset_events,
        legacy_events,
    ));
    let handler: Arc<dyn Handler> = Arc::new(tasks::control::ControlHandler {
        shared: shared.clone(),
    });
    let listener = s.listener;
    tasks.spawn(async move {
        control::serve(listener, handler).await;
        Err(anyhow!("control socket closed"))
    });
    let source = shared.clone();
    started(Arc::new(move || source.lock().status()));
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
    shared.lock().dp.detach_all();
    result
}
