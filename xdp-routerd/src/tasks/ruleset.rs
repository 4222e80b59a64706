//! Firewall changes (nftables commits, lost notifications, iptables-legacy changes) bump the
//! ruleset generation: every flow direction is disarmed until the kernel forwards it again.
//! Each is then read for rules that must see every packet (`sync::per_packet`), which hold
//! every packet in the kernel meanwhile (see `state::per_packet`).

use std::sync::Arc;

use anyhow::anyhow;
use tokio::sync::mpsc::UnboundedReceiver;
use tracing::{debug, error};

use crate::{
    state::Shared,
    sync::{nftables::RulesetEvent, per_packet},
};

/// Follows both sources until one of them ends.
pub async fn run(
    shared: Arc<Shared>,
    mut nft: UnboundedReceiver<RulesetEvent>,
    mut legacy: UnboundedReceiver<RulesetEvent>,
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
            let mut s = shared.lock();
            // Held (per_packet_rules = "hold") until the new ruleset is read below.
            match s.ruleset_changed() {
                Ok(()) => debug!(
                    ?events,
                    generation = s.dp().ruleset_status().generation,
                    "firewall ruleset changed: every flow goes through the kernel's rules again"
                ),
                Err(e) => error!(error = %format!("{e:#}"), "cannot bump the ruleset generation"),
            }
        }
        // Rules that must see every packet may have come or gone with it: read off the runtime
        // (child processes), no lock held, then kept or lifted.
        let reading = std::time::Instant::now();
        match tokio::task::spawn_blocking(per_packet::read).await {
            Ok(found) => {
                let rules = found.rules.len();
                let released = shared.lock().apply_per_packet(found);
                // Connections a narrowed rule held until now: offloaded once their paths are
                // looked up again.
                let mut stale = crate::paths::Stale::default();
                stale.add_conns(released);
                shared.request_revalidation(stale);
                debug!(
                    rules,
                    read_ms = reading.elapsed().as_secs_f64() * 1000.0,
                    "firewall ruleset read for rules that must see every packet"
                );
            }
            Err(e) => error!(error = %e, "reading the firewall ruleset failed"),
        }
        // A netdev chain may have come or gone with the commit.
        super::rtnetlink::refresh_hooks(&shared).await;
    }
}
