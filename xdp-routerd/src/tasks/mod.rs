//! The daemon's tasks, one file per event source. Each does its I/O (netlink, ctnetlink, /proc,
//! tc/nft reads) without holding the state lock, then applies what it planned through
//! [`crate::state`]:
//! - [`conntrack`]: conntrack events (and resyncs) become flows;
//! - [`keepalive`]: conntrack timeouts of connections the fast path carried are refreshed;
//! - [`pppoe`]: the managed PPP devices' PPPoE sessions are followed;
//! - [`rtnetlink`]: links come and go, routes and addresses change, qdiscs change;
//! - [`ruleset`]: nftables commits and iptables-legacy changes disarm every flow;
//! - [`held_counters`]: conntrack's counters of connections held until a counter bound;
//! - [`xdp_xmit`]: the kernel's XDP features change (which devices can transmit XDP frames);
//! - [`control`]: the control socket (`status`, `flows`, the fast-path toggle);
//! - [`metrics`]: the `/metrics` endpoint;
//! - [`status`]: keeps a recent status published for the two above.
//!
//! The two that answer requests run [`on_own_thread`]: a request never waits for a busy
//! runtime worker, only (briefly, see [`crate::state::Shared::status`]) for the state. A new
//! event source is a new file here and one `spawn` line in [`crate::daemon`].

pub mod conntrack;
pub mod control;
pub mod held_counters;
pub mod keepalive;
pub mod metrics;
pub mod pppoe;
pub mod rtnetlink;
pub mod ruleset;
pub mod status;
pub mod xdp_xmit;

use crate::{
    flows::conntrack::{CtEntry, CtTuple},
    paths::{self, ResolvedPaths, RouteSource, Stale},
    state::Shared,
};

/// How many times a batch's routes are looked up again when a routing change arrived while they
/// were being looked up.
const FRESH_ATTEMPTS: usize = 3;

/// Looks up the routes `entries` need (no lock held), again if the routing changed meanwhile.
/// Returns the answers and the route generation they were looked up at: the caller applies
/// them and, if the generation moved on before it could, asks for a revalidation
/// ([`apply_stale_check`]).
pub async fn resolve_fresh(
    shared: &Shared,
    lookup: &mut impl RouteSource,
    entries: &[&CtEntry],
) -> (ResolvedPaths, u64) {
    let mut attempt = 0;
    loop {
        let generation = shared.paths_generation();
        let resolved = paths::resolve(lookup, entries.iter().copied()).await;
        attempt += 1;
        if shared.paths_generation() == generation || attempt == FRESH_ATTEMPTS {
            return (resolved, generation);
        }
    }
}

/// After applying answers looked up at `generation` for `entries`: if the routing changed
/// since, those flows may use stale paths, so the rtnetlink task revalidates them.
pub fn apply_stale_check(
    shared: &Shared,
    generation: u64,
    entries: impl IntoIterator<Item = CtTuple>,
) {
    if shared.paths_generation() != generation {
        let mut stale = Stale::default();
        stale.add_conns(entries);
        shared.request_revalidation(stale);
    }
}

/// Runs the future `make` returns on a new thread `name` with a single-threaded tokio runtime
/// of its own, and resolves with its result: the task's I/O is then polled however busy the
/// daemon's runtime workers are. (At exit the thread is simply left to end with the process.)
pub async fn on_own_thread<F, Fut>(name: &str, make: F) -> anyhow::Result<()>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(make()));
            let _ = tx.send(result);
        })
        .map_err(|e| anyhow::anyhow!("cannot start the {name} thread: {e}"))?;
    rx.await
        .unwrap_or_else(|_| Err(anyhow::anyhow!("the {name} thread panicked")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn on_own_thread_runs_on_its_thread_and_returns_the_result() {
        let caller = std::thread::current().id();
        let result = on_own_thread("own-thread-test", move || async move {
            let me = std::thread::current();
            // Its own runtime: tokio's I/O and timers work there.
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            if me.id() == caller || me.name() != Some("own-thread-test") {
                return Ok(());
            }
            Err(anyhow::anyhow!("ended"))
        })
        .await;
        assert_eq!(result.unwrap_err().to_string(), "ended");
        let panicked = on_own_thread("own-thread-panic", || async { panic!("boom") }).await;
        assert!(
            panicked.unwrap_err().to_string().contains("panicked"),
            "a panic is an error, not a hang"
        );
    }
}
