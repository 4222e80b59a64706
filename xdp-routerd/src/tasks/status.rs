//! Keeps a recent status published (see [`crate::state::Shared::status`]): a status read or a
//! scrape that finds the state lock busy answers with it instead of queueing behind bulk work
//! (a resync, a revalidation). Rebuilt after the state changed, at most every [`REFRESH`], on a
//! blocking thread, where waiting for the lock costs no runtime worker. An idle daemon (nothing
//! changes) builds none: a read then finds the lock free and builds its own.

use std::{sync::Arc, time::Duration};

use tracing::debug;

use crate::state::Shared;

/// How often the published status is rebuilt at most while the state keeps changing: a busy
/// read's answer is at most about this old.
pub const REFRESH: Duration = Duration::from_millis(250);

/// Rebuilds the published status after each change (changes within [`REFRESH`] coalesce),
/// forever.
pub async fn publish(shared: Arc<Shared>) -> anyhow::Result<()> {
    loop {
        shared.changed().await;
        tokio::time::sleep(REFRESH).await;
        let s = shared.clone();
        match tokio::task::spawn_blocking(move || s.build_status(s.lock()).map(drop)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => debug!(error = %format!("{e:#}"), "status not rebuilt"),
            Err(e) => return Err(anyhow::anyhow!("the status rebuild failed: {e}")),
        }
    }
}
