//! The `/metrics` endpoint: Prometheus scrapes answered from the status
//! ([`crate::state::Shared::status`]), on a thread and runtime of its own (see
//! [`super::on_own_thread`]) so that a scrape never waits for the daemon's busy runtime
//! workers.

use std::sync::Arc;

use anyhow::anyhow;

use crate::{
    datapath::hosts::HostTrafficMap,
    metrics::{self, HostSource, StatusSource},
    state::Shared,
};

/// Serves `/metrics` on `listener` (bound before anything was attached) until the daemon exits;
/// with per-host series read from `host_traffic` when given (`host_metrics_limit` > 0).
pub async fn run(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    host_traffic: Option<HostTrafficMap>,
) -> anyhow::Result<()> {
    let hosts: Option<HostSource> = host_traffic.map(|map| {
        let shared = shared.clone();
        Arc::new(move || shared.host_traffic(&map)) as HostSource
    });
    let source: StatusSource = Arc::new(move || shared.status());
    super::on_own_thread("metrics", move || async move {
        metrics::serve_listener(listener, source, hosts).await?;
        Err(anyhow!("the metrics endpoint ended"))
    })
    .await
}
