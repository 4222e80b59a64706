//! The daemon's tasks, one file per event source. Each does its I/O (netlink, ctnetlink, /proc,
//! tc/nft reads) without holding the state lock, then applies what it planned through
//! [`crate::state`]:
//! - [`conntrack`]: conntrack events (and resyncs) become flows;
//! - [`keepalive`]: conntrack timeouts of connections the fast path carried are refreshed;
//! - [`rtnetlink`]: links come and go, routes and addresses change, qdiscs change;
//! - [`ruleset`]: nftables commits and iptables-legacy changes disarm every flow;
//! - [`xdp_xmit`]: the kernel's XDP features change (which devices can transmit XDP frames);
//! - [`control`]: the control socket (`status`, `flows`, the fast-path toggle).
//!
//! The `/metrics` endpoint is served by [`crate::metrics`] from status snapshots. A new event
//! source is a new file here and one `spawn` line in [`crate::daemon`].

pub mod conntrack;
pub mod control;
pub mod keepalive;
pub mod rtnetlink;
pub mod ruleset;
pub mod xdp_xmit;

use crate::{
    paths::{self, ResolvedPaths, RouteSource, Stale},
    state::Shared,
    sync::conntrack::{CtEntry, CtTuple},
};

/// Connections (or events) applied per lock hold when many are (resync, revalidation, a big
/// event batch): status, metrics and the other tasks get the lock in between. Measured under
/// `bench responsive`: a chunk of 4,096 upserts held the lock up to 47 ms; 1,024 keep holds
/// near 10 ms.
pub const APPLY_CHUNK: usize = 1024;

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
