//! Conntrack events (ctnetlink NEW/UPDATE/DESTROY) become fast-path flows; on a socket overrun
//! the flows are resynced from a dump. Each batch: routes looked up first (batched, no lock),
//! then the flow changes applied in event order under the lock. Newly offloaded TCP connections
//! are marked "be liberal" by a second task ([`mark_liberal`]), one ctnetlink round trip each,
//! so the event loop never falls behind the kernel while they are marked.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::anyhow;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tracing::{debug, error, info, warn};

use super::{APPLY_CHUNK, apply_stale_check, resolve_fresh};
use crate::{
    flows::{Upsert, release_freed_memory},
    state::{Shared, State},
    sync::{
        conntrack::{CtEntry, CtEvent, IPPROTO_TCP},
        ctnetlink::{CtNetlink, CtNetlinkError, CtSubscription},
        routes::RouteLookup,
    },
};

/// When newly offloaded TCP connections are marked liberal a second time (after arming).
const REMARK_LIBERAL_AFTER: Duration = Duration::from_millis(200);

/// Conntrack errors as the daemon reports them.
pub fn ct_err(e: CtNetlinkError) -> anyhow::Error {
    anyhow!("conntrack: {e}")
}

/// Where connections to mark "be liberal" are sent.
pub type Marker = UnboundedSender<Vec<CtEntry>>;

/// Follows conntrack events until the subscription fails.
pub async fn run(
    shared: Arc<Shared>,
    mut lookup: RouteLookup,
    mut events: CtSubscription,
    mut requests: CtNetlink,
    marker: Marker,
) -> anyhow::Result<()> {
    loop {
        let batch = match events.next_batch().await {
            Ok(batch) => batch,
            Err(CtNetlinkError::Overrun) => {
                // Empty the queue first: until it is empty the kernel silently drops every
                // new event, which the dump below could miss.
                let dropped = events.discard_queued();
                warn!(
                    dropped,
                    "conntrack event socket overrun: resyncing from a dump"
                );
                match resync(&shared, &mut lookup, &mut requests).await {
                    Ok(tcp) => {
                        let _ = marker.send(tcp);
                    }
                    Err(e) => {
                        error!(error = %format!("{e:#}"), "conntrack resync failed");
                        shared.lock().ct.errors += 1;
                    }
                }
                continue;
            }
            Err(e) => {
                shared.lock().ct.errors += 1;
                return Err(ct_err(e));
            }
        };
        let upserts: Vec<&CtEntry> = batch
            .iter()
            .filter_map(|ev| match ev {
                CtEvent::New(e) | CtEvent::Update(e) => Some(e),
                CtEvent::Destroy(_) => None,
            })
            .collect();
        let (paths, generation) = resolve_fresh(&shared, &mut lookup, &upserts).await;
        let newly_tcp = {
            let mut s = shared.lock();
            s.ct.decode_errors = events.decode_errors();
            apply_events(&mut s, batch, &paths)
        };
        apply_stale_check(&shared, generation);
        if !newly_tcp.is_empty() {
            let _ = marker.send(newly_tcp.clone());
            // The kernel forwards the first packets of each direction again before they are
            // armed, and those set MAXACK_SET again: a stale td_maxack would make conntrack
            // ignore the connection's RST. Mark them liberal once more after arming (the
            // keep-alive does it for every active connection later on).
            let marker = marker.clone();
            tokio::spawn(async move {
                tokio::time::sleep(REMARK_LIBERAL_AFTER).await;
                let _ = marker.send(newly_tcp);
            });
        }
    }
}

/// Marks the TCP connections it is sent "be liberal", in order, one ctnetlink round trip each.
pub async fn mark_liberal(
    shared: Arc<Shared>,
    mut ct: CtNetlink,
    mut to_mark: UnboundedReceiver<Vec<CtEntry>>,
) -> anyhow::Result<()> {
    while let Some(batch) = to_mark.recv().await {
        for e in &batch {
            liberal(&shared, &mut ct, e).await;
        }
    }
    Err(anyhow!("the liberal-marking channel closed"))
}

/// Applies one batch of events in order with routes already looked up. Returns the TCP
/// connections newly offloaded (to be marked liberal).
pub fn apply_events<D: crate::flows::FlowTable>(
    s: &mut State<D>,
    batch: Vec<CtEvent>,
    paths: &impl crate::flows::PathOracle,
) -> Vec<CtEntry> {
    let mut newly_tcp = Vec::new();
    s.ct.events += batch.len() as u64;
    let State { dp, flows, ct, .. } = s;
    for ev in batch {
        *ct.events_by_type.entry(ev.kind().into()).or_default() += 1;
        match ev {
            CtEvent::New(e) | CtEvent::Update(e) => {
                let tcp = e.orig.proto == IPPROTO_TCP;
                let entry = e.clone();
                if flows.upsert(e, dp, paths) == Upsert::Added {
                    debug!(orig = ?entry.orig, "offloaded");
                    if tcp {
                        newly_tcp.push(entry);
                    }
                }
            }
            CtEvent::Destroy(e) => {
                if flows.forget(&e.orig, dp) {
                    debug!(orig = ?e.orig, "conntrack entry destroyed; flow removed");
                }
            }
        }
    }
    newly_tcp
}

/// Makes the flow maps match a fresh conntrack dump (at start and after an overrun). Returns the
/// TCP connections to mark "be liberal" (every offloaded one when any was added).
pub async fn resync(
    shared: &Shared,
    lookup: &mut RouteLookup,
    ct: &mut CtNetlink,
) -> anyhow::Result<Vec<CtEntry>> {
    let started = Instant::now();
    let mut dump = ct.dump().await.map_err(ct_err)?;
    let n = dump.len();
    // Entries already applied as they are need neither route lookups nor map writes: a resync
    // after an overrun under load then costs what changed, not the whole table.
    let present = {
        let s = shared.lock();
        let present = s.flows.tuples_to_check(&dump);
        if present.is_some() {
            dump.retain(|e| !s.flows.is_current(e));
        }
        present
    };
    let (paths, generation) = resolve_fresh(shared, lookup, &dump.iter().collect::<Vec<_>>()).await;
    let looked_up_ms = started.elapsed().as_millis() as u64;
    let (removed, before) = {
        let mut s = shared.lock();
        let State { dp, flows, .. } = &mut *s;
        let before = flows.stats().offloaded_total;
        let removed = present.map_or(0, |p| flows.remove_absent(&p, dp));
        flows.reserve_for(&dump);
        (removed, before)
    };
    // In chunks, so status, metrics and the other tasks get the lock in between.
    for chunk in dump.chunks(APPLY_CHUNK) {
        {
            let mut s = shared.lock();
            let State { dp, flows, .. } = &mut *s;
            for e in chunk {
                flows.upsert(e.clone(), dp, &paths);
            }
        }
        tokio::task::yield_now().await;
    }
    let added = {
        let mut s = shared.lock();
        s.ct.resyncs += 1;
        s.ct.last_resync_ms = started.elapsed().as_millis() as u64;
        let added = s.flows.stats().offloaded_total - before;
        info!(
            entries = n,
            changed = dump.len(),
            offloaded = s.flows.len(),
            removed,
            routes = paths.len(),
            looked_up_ms,
            ms = started.elapsed().as_millis() as u64,
            "conntrack resync"
        );
        added
    };
    apply_stale_check(shared, generation);
    // The lookups' memory and what the tables left behind growing, back to the kernel.
    drop(paths);
    release_freed_memory();
    if added == 0 {
        return Ok(Vec::new());
    }
    // Only the TCP connections this resync wrote: each mark comes back to our event socket as
    // an UPDATE (ignored, but it fills the buffer), so re-marking every offloaded connection
    // after each resync would overrun the socket again and again.
    let s = shared.lock();
    Ok(dump
        .into_iter()
        .filter(|e| e.orig.proto == IPPROTO_TCP && s.flows.is_offloaded(&e.orig))
        .collect())
}

async fn liberal(shared: &Shared, ct: &mut CtNetlink, e: &CtEntry) {
    if let Err(err) = ct.set_tcp_liberal(&e.orig, e.zone).await {
        debug!(error = %err, "cannot mark TCP connection liberal");
        shared.lock().ct.errors += 1;
    }
}
