//! PPPoE sessions: the managed PPP devices' sessions are read from `/proc/net/pppoe`, with
//! whether PPP compression has run on each device (on a blocking thread, no lock held), every
//! [`POLL`] and whenever links changed, and bound,
//! rebound or unbound in the datapath (see [`crate::state::State::apply_pppoe`]). Polled
//! because the kernel announces no session change: pppd can set the session up again under a
//! new ID while `ppp0` stays (`demand`, `persist`). Nothing is read while no PPP device is
//! managed.

use std::{sync::Arc, time::Duration};

use anyhow::anyhow;

use super::rtnetlink::refresh_hooks;
use crate::{
    state::Shared,
    sync::{pppoe, qdisc},
};

/// How often the sessions are read: how long the fast path may keep sending into a session
/// pppd has replaced (the access concentrator drops those frames) before it follows, or
/// carrying packets around a PPP compressor that has started.
pub const POLL: Duration = Duration::from_secs(2);

/// Reads and applies the sessions every [`POLL`] and on request, forever.
pub async fn run(shared: Arc<Shared>) -> anyhow::Result<()> {
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shared.pppoe_read_requested() => {}
        }
        refresh(&shared).await?;
    }
}

/// One read and its application; the qdiscs and hooks are read again when a session now
/// runs over another device.
pub async fn refresh(shared: &Shared) -> anyhow::Result<()> {
    let devices = shared.lock().pppoe_devices();
    if devices.is_empty() {
        return Ok(());
    }
    let found = tokio::task::spawn_blocking(move || pppoe::read(&devices))
        .await
        .map_err(|e| anyhow!("the PPPoE session read failed: {e}"))?;
    let new_lower = shared.lock().apply_pppoe(&found);
    if new_lower {
        let qdiscs = qdisc::read_all().await;
        shared.lock().apply_qdiscs(qdiscs);
        refresh_hooks(shared).await;
    }
    Ok(())
}
