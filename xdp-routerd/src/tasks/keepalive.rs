//! Keep-alive: the kernel sees no packet of a connection the fast path carries, so its conntrack
//! timeout is refreshed (over ctnetlink, no lock held) for every connection that carried traffic
//! since the previous pass; TCP ones are re-marked "be liberal" in the same message. A
//! connection found at start is taken in here once it carries traffic through the kernel (a
//! TCP one marked for the first time), see [`xdp_router_common::FLOW_F_AWAITING_TRAFFIC`].

use std::{sync::Arc, time::Duration};

use tracing::{debug, error, warn};

use crate::{
    flows::conntrack::IPPROTO_TCP,
    state::{Shared, monotonic_ns},
    sync::{
        ctnetlink::{CtNetlink, CtUpdate},
        sysctl::{KernelTimeouts, conntrack_checksum},
    },
};

/// Refreshes every `interval`, forever.
pub async fn run(shared: Arc<Shared>, mut ct: CtNetlink, interval: Duration) -> anyhow::Result<()> {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // Re-read every pass (a /proc read): whether conntrack verifies checksums. Written
        // only when it changed.
        let verify = conntrack_checksum();
        let active = {
            let mut s = shared.lock();
            if s.flows().is_empty() && s.dp().verify_l4_checksum() == verify {
                // An idle router: nothing to refresh, nothing written (the state is left
                // untouched, so no status is rebuilt either).
                continue;
            }
            if let Err(e) = s.set_verify_l4_checksum(verify) {
                error!(error = %e, "cannot update the checksum setting");
            }
            s.active_since_last_pass(monotonic_ns())
        };
        if active.is_empty() {
            continue;
        }
        // Re-read every pass that refreshes: an administrator may change the sysctls at any
        // time.
        let timeouts = match KernelTimeouts::read() {
            Ok(t) => t,
            Err(e) => {
                warn!(error = %e, "cannot read conntrack timeouts; keep-alive skipped");
                continue;
            }
        };
        let mut refreshed = Vec::new();
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
                Ok(true) => refreshed.push(e.orig),
                Ok(false) => gone.push(e),
                Err(err) => {
                    debug!(error = %err, "conntrack refresh failed");
                    errors += 1;
                }
            }
        }
        // Connections found at start are armable once refreshed (TCP: marked), see
        // `FLOW_F_AWAITING_TRAFFIC`.
        shared.lock().keepalive_done(&refreshed, errors, gone);
    }
}
