//! rtnetlink notifications: managed links come and go (attach, detach, MAC changes; the PPPoE
//! sessions are read again, see [`super::pppoe`]), their
//! qdiscs and hooks change (`shaped = "auto"`, netdev chains), a managed bridge's ports and FDB
//! change, and routes, addresses or rules change (cached FIB answers are dropped; offloaded
//! flows are revalidated). What a batch needs is read here, outside the lock; the state applies
//! it ([`crate::state::State::apply_rt_events`]).
//!
//! Two loops: [`run`] follows the notifications and never waits on route lookups, so the FIB
//! cache is invalidated as soon as a change arrives; [`revalidate`] re-checks every flow
//! against fresh route answers whenever asked (requests made while a pass runs coalesce into
//! one more pass, which a route flap of thousands of messages needs).

use std::{sync::Arc, time::Duration};

use anyhow::anyhow;
use tokio::sync::mpsc::UnboundedReceiver;
use tracing::{error, info};

use super::conntrack;
use crate::{
    paths,
    state::{APPLY_CHUNK, LinkReads, Shared},
    sync::{
        bridge::{self, BridgeReads},
        ctnetlink::CtNetlink,
        hooks, netdev, qdisc,
        routes::RouteLookup,
        rtnl::RtEvent,
    },
};

/// How long a burst of notifications is collected before it is applied.
const DEBOUNCE: Duration = Duration::from_millis(50);

/// Follows rtnetlink notifications until the event socket closes.
pub async fn run(
    shared: Arc<Shared>,
    mut events: UnboundedReceiver<RtEvent>,
) -> anyhow::Result<()> {
    while let Some(first) = events.recv().await {
        // Route answers looked up from now on may differ from those looked up before.
        shared.paths_changed();
        // The datapath's cached FIB answers go first, before the debounce: the next packet of
        // every flow asks the kernel's FIB again.
        invalidate_fib_cache(&shared);
        // Debounce: a route change usually comes as a burst of messages.
        let mut batch = vec![first];
        tokio::time::sleep(DEBOUNCE).await;
        while let Ok(ev) = events.try_recv() {
            batch.push(ev);
        }
        if batch.len() > 1 {
            // Answers cached while the burst was being applied may be half-old.
            shared.paths_changed();
            invalidate_fib_cache(&shared);
        }
        let links = read_links(&shared, &batch);
        let bridges = read_bridges(&shared, &batch).await;
        let fdb = read_fdb(&shared, &batch);
        let (stale, reread_qdiscs) = {
            let mut s = shared.lock();
            let planned = s.apply_rt_events(batch, &links, &bridges);
            // Newer than every event of the batch: applied after them.
            if let Some(entries) = fdb {
                s.reload_fdb(entries);
            }
            planned
        };
        shared.request_revalidation(stale);
        if !bridges.is_empty() {
            // Links changed: a PPP device or its session's lower device may have come or gone.
            shared.request_pppoe_read();
        }
        if reread_qdiscs {
            let qdiscs = qdisc::read_all().await;
            shared.lock().apply_qdiscs(qdiscs);
            refresh_hooks(&shared).await;
        }
    }
    Err(anyhow!("rtnetlink event socket closed"))
}

/// Re-checks the offloaded and parked connections whose route answers may have changed each
/// time a revalidation is asked for (only those with an address inside a changed route, unless
/// links, addresses or everything changed): a snapshot of them (under the lock), their routes
/// looked up (no lock), the answers applied in chunks.
/// Parked TCP connections the new paths let through are marked "be liberal" through `ct`
/// before their chunk is applied (see [`crate::flows::FlowManager::would_add`]).
pub async fn revalidate(
    shared: Arc<Shared>,
    mut lookup: RouteLookup,
    mut ct: CtNetlink,
) -> anyhow::Result<()> {
    loop {
        let stale = shared.revalidation_requested().await;
        let snapshot = {
            let s = shared.lock();
            if stale.is_all() {
                s.flows().snapshot()
            } else if stale
                .prefixes()
                .any(|p| s.flows().uses_addresses_in(p.addr, p.last()))
            {
                s.flows().snapshot_where(|e| stale.touches(e))
            } else {
                // Routes no offloaded connection uses (most of a BGP table's churn): only the
                // connections named and the parked ones are looked at.
                s.flows().snapshot_of(stale.conns(), |e| stale.touches(e))
            }
        };
        drop(stale);
        if snapshot.is_empty() {
            continue;
        }
        let resolved = paths::resolve(&mut lookup, &snapshot).await;
        let (mut removed, mut added) = (0, 0);
        for chunk in snapshot.chunks(APPLY_CHUNK) {
            let parked = shared
                .lock()
                .flows()
                .parked_tcp_to_offload(chunk, &resolved);
            conntrack::mark(&shared, &mut ct, &parked).await;
            let (r, a) = shared.lock().revalidate(chunk.iter().cloned(), &resolved);
            removed += r;
            added += a;
            // Let status, metrics and the other tasks in between chunks.
            tokio::task::yield_now().await;
        }
        if removed > 0 {
            info!(
                removed,
                "routing or address change: flows handed back to the kernel"
            );
        }
        if added > 0 {
            info!(
                added,
                "routing or address change: connections offloaded again"
            );
        }
    }
}

fn read_links(shared: &Shared, batch: &[RtEvent]) -> LinkReads {
    let names = shared.lock().iface_names();
    let overrun = batch.iter().any(|e| matches!(e, RtEvent::Overrun));
    names
        .into_iter()
        .filter(|n| {
            overrun
                || batch
                    .iter()
                    .any(|e| matches!(e, RtEvent::LinkUp { name, mac: None, .. } if name == n))
        })
        .map(|n| {
            let read = (netdev::ifindex(&n), netdev::hw_addr(&n));
            (n, read)
        })
        .collect()
}

/// What the managed interfaces are (bridges, their MAC, ports and VLAN tables), read before
/// the lock is taken (off the runtime: sysfs and a netlink dump) when the batch has link
/// notifications (a port added, removed, or changing STP state is one, and so are
/// `bridge vlan add/del`, `AF_BRIDGE` `RTM_NEWLINK`, and a `vlan_filtering` toggle) or bridge
/// VLAN notifications (a per-VLAN STP state); empty otherwise.
async fn read_bridges(shared: &Shared, batch: &[RtEvent]) -> BridgeReads {
    let links = batch.iter().any(|e| {
        matches!(
            e,
            RtEvent::LinkUp { .. }
                | RtEvent::LinkGone { .. }
                | RtEvent::BridgeVlan
                | RtEvent::Overrun
        )
    });
    if !links {
        return BridgeReads::new();
    }
    let names = shared.lock().iface_names();
    tokio::task::spawn_blocking(move || bridge::read(&names))
        .await
        .unwrap_or_else(|e| {
            error!(error = %e, "reading the bridges failed");
            BridgeReads::new()
        })
}

/// After an overrun (FDB notifications lost), the whole bridge FDB, read before the lock is
/// taken, when a managed interface is a bridge; `None` otherwise or when it cannot be read
/// (logged; the entries then stay as they are until notifications correct them).
fn read_fdb(shared: &Shared, batch: &[RtEvent]) -> Option<Vec<bridge::FdbEvent>> {
    if !batch.iter().any(|e| matches!(e, RtEvent::Overrun)) || !shared.lock().has_bridges() {
        return None;
    }
    bridge::fdb_dump()
        .inspect_err(|e| error!(error = %e, "cannot re-read the bridge FDB after an overrun"))
        .ok()
}

/// Re-reads the hooks on every managed interface and bridge port (no lock held while reading)
/// and updates the flags of those whose hooks changed.
pub async fn refresh_hooks(shared: &Shared) {
    let names = shared.lock().hook_names();
    let found = hooks::read(&names).await;
    shared.lock().apply_hooks(&found);
}

/// Drops every cached FIB answer in the datapath (see
/// [`crate::datapath::Datapath::invalidate_fib_cache`]).
fn invalidate_fib_cache(shared: &Shared) {
    if let Err(e) = shared.lock().invalidate_fib_cache() {
        error!(error = %e, "cannot invalidate the FIB cache");
    }
}
