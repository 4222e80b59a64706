//! Conntrack's counters of the connections a rule with a counter bound holds (`ct original
//! packets 1-6`, `-m connbytes --connbytes 1:6`): read every [`INTERVAL`] while there are any,
//! and a connection whose counters are past every bound that held it is offloaded (see
//! [`crate::flows::flow_match`]). A counter change sends no conntrack event, so they are
//! polled, one `get` per connection, outside the lock.

use std::{sync::Arc, time::Duration};

use tracing::debug;

use crate::{paths::Stale, state::Shared, sync::ctnetlink::CtNetlink};

/// How often the counters of such connections are read: a connection past its bound stays in
/// the kernel for up to this long.
pub const INTERVAL: Duration = Duration::from_millis(250);

/// Polls until the daemon stops.
pub async fn run(shared: Arc<Shared>) -> anyhow::Result<()> {
    let mut ct = CtNetlink::new()?;
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let wanted = shared.lock().flows().held_until_counted();
        if wanted.is_empty() {
            continue;
        }
        let mut read = Vec::with_capacity(wanted.len());
        for (orig, zone) in wanted {
            match ct.get_counters(&orig, zone).await {
                Ok(Some(c)) => read.push((orig, c)),
                // Gone (its DESTROY event forgets it), or no counters: held.
                Ok(None) => {}
                Err(e) => debug!(error = %e, "cannot read a held connection's counters"),
            }
        }
        let released = shared.lock().held_counters_read(read);
        if !released.is_empty() {
            debug!(
                connections = released.len(),
                "held connections past their rules' counter bounds: offloaded once their paths \
                 are looked up"
            );
            let mut stale = Stale::default();
            stale.add_conns(released);
            shared.request_revalidation(stale);
        }
    }
}
