//! Conntrack events (ctnetlink NEW/UPDATE/DESTROY) become fast-path flows; at start the whole
//! table is read, looked up and written in overlapping stages ([`resync_at_start`]), and on a
//! socket overrun the flows are resynced from a dump ([`resync`]). Each batch: routes looked up first (batched, no lock),
//! then the TCP connections the batch will offload marked "be liberal" in conntrack (pipelined,
//! a few round trips per batch, no lock), then the batch handed to the state, which applies the
//! flow changes in event order under the lock ([`crate::state::State::apply_events`]).
//! Marking comes *before* the flows reach the maps: the kernel's next packet arms a flow and
//! conntrack sees nothing after that, so a FIN in between would be out of window (see
//! [`crate::flows::FlowManager::would_add`]). Repeat marks after arming go to a second
//! task ([`mark_liberal`]) so the event loop never waits for them, and only for the
//! connections the kernel forwarded a packet of meanwhile ([`ToMark::AfterArming`]): a
//! million connections offloaded at start with no traffic cost no second million marks.
//!
//! The marks' own UPDATE events never reach the event socket: the kernel drops them
//! (`sync/ctnetlink/echo_filter.rs`), so marking cannot overrun it.
//!
//! The event socket is read by its own task ([`read_events`]), so the kernel's socket buffer
//! keeps draining while the loop waits on route lookups, marks or a resync: a resync that took
//! longer than the buffer holds used to overrun it again, resync after resync.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use foldhash::HashSet;

use anyhow::anyhow;
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tracing::{debug, error, info, warn};

use super::{apply_stale_check, resolve_fresh};
use crate::{
    flows::{
        FlowTable,
        armed::kernel_forwarded_since,
        conntrack::{CtEntry, CtEvent, CtTuple, IPPROTO_TCP},
        release_freed_memory,
    },
    paths::ResolvedPaths,
    state::{APPLY_CHUNK, Shared},
    sync::{
        ctnetlink::{CtNetlink, CtNetlinkError, CtSubscription, CtUpdate},
        routes::RouteLookup,
        sysctl::conntrack_count,
    },
};

/// When newly offloaded TCP connections are marked liberal a second time (after arming).
const REMARK_LIBERAL_AFTER: Duration = Duration::from_millis(200);

/// Conntrack errors as the daemon reports them.
pub fn ct_err(e: CtNetlinkError) -> anyhow::Error {
    anyhow!("conntrack: {e}")
}

/// What the marking task ([`mark_liberal`]) is sent.
#[derive(Debug)]
pub enum ToMark {
    /// Connections offloaded without a mark first (not foreseen): every one is marked.
    Unmarked(Vec<CtEntry>),
    /// Connections marked before their flows were written, to be marked again after arming
    /// (see [`remark_after_arming`]): only those the kernel has forwarded a packet of since
    /// their flows were written ([`crate::flows::FlowManager::kernel_forwarded`]); the others
    /// had no packet that could set `MAXACK_SET` again (the keep-alive marks them once they
    /// carry traffic).
    AfterArming(JustOffloaded),
}

/// TCP connections whose flows were just written, to be marked again after arming.
#[derive(Debug, Default)]
pub struct JustOffloaded {
    pub tcp: Vec<CtEntry>,
    /// [`FlowTable::kernel_forwarded_packets`] read before their flows were written.
    pub forwarded_before: Option<u64>,
}

/// Where connections to mark "be liberal" are sent.
pub type Marker = UnboundedSender<ToMark>;

/// Event batches queued between [`read_events`] and the event loop, at most: when the loop
/// falls this far behind, the reader waits and the kernel's socket buffer fills instead (and
/// overruns if it must: a resync follows). Bounds the daemon's memory under a flood.
const QUEUED_BATCHES: usize = 1024;

/// What [`read_events`] hands the event loop.
#[derive(Debug)]
pub enum Received {
    /// A batch of events, in order, and the subscription's undecodable messages so far.
    Events {
        batch: Vec<CtEvent>,
        decode_errors: u64,
    },
    /// The socket overran: events were lost (the ones still queued were discarded, see
    /// [`CtSubscription::next_batch`]); everything before this in the channel is older.
    Overrun { discarded_total: u64 },
}

/// Reads the event socket as fast as the kernel fills it and queues what it read for the
/// event loop (at most `QUEUED_BATCHES`), until the socket fails or the loop is gone.
pub async fn read_events(
    mut events: CtSubscription,
    queue: mpsc::Sender<Result<Received, CtNetlinkError>>,
) {
    loop {
        let read = match events.next_batch().await {
            Ok(batch) => Ok(Received::Events {
                batch,
                decode_errors: events.decode_errors(),
            }),
            Err(CtNetlinkError::Overrun) => Ok(Received::Overrun {
                discarded_total: events.stale_discarded(),
            }),
            Err(e) => Err(e),
        };
        let failed = read.is_err();
        if queue.send(read).await.is_err() || failed {
            return;
        }
    }
}

/// Follows conntrack events until the subscription fails.
pub async fn run(
    shared: Arc<Shared>,
    mut lookup: RouteLookup,
    events: CtSubscription,
    mut requests: CtNetlink,
    marker: Marker,
) -> anyhow::Result<()> {
    let (queue, mut received) = mpsc::channel(QUEUED_BATCHES);
    // Ends by itself once `received` is dropped (its next send fails).
    tokio::spawn(read_events(events, queue));
    loop {
        let (batch, decode_errors) = match received.recv().await {
            Some(Ok(Received::Events {
                batch,
                decode_errors,
            })) => (batch, decode_errors),
            Some(Ok(Received::Overrun { discarded_total })) => {
                // The subscription has emptied the socket's queue already: the dump below
                // covers those events.
                warn!(
                    discarded_total,
                    "conntrack event socket overrun: resyncing from a dump"
                );
                match resync(&shared, &mut lookup, &mut requests).await {
                    Ok(tcp) => remark_after_arming(&marker, tcp),
                    Err(e) => {
                        error!(error = %format!("{e:#}"), "conntrack resync failed");
                        shared.lock().count_ct_errors(1);
                    }
                }
                continue;
            }
            Some(Err(e)) => {
                shared.lock().count_ct_errors(1);
                return Err(ct_err(e));
            }
            None => return Err(anyhow!("the conntrack event reader ended")),
        };
        let upserts: Vec<&CtEntry> = batch
            .iter()
            .filter_map(|ev| match ev {
                CtEvent::New(e) | CtEvent::Update(e) => Some(e),
                CtEvent::Destroy(_) => None,
            })
            .collect();
        let (paths, generation) = resolve_fresh(&shared, &mut lookup, &upserts).await;
        let marked = shared.lock().batch_tcp_to_offload(&batch, &paths);
        mark(&shared, &mut requests, &marked).await;
        let upserted: Vec<CtTuple> = upserts.iter().map(|e| e.orig).collect();
        let forwarded_before = shared.lock().dp().kernel_forwarded_packets();
        // In order, in chunks: status, metrics and the other tasks get the lock in between.
        let mut newly_tcp = Vec::new();
        let mut rest = batch;
        while !rest.is_empty() {
            let tail = rest.split_off(rest.len().min(APPLY_CHUNK));
            {
                let mut s = shared.lock();
                s.set_decode_errors(decode_errors);
                newly_tcp.extend(s.apply_events(rest, &paths));
            }
            rest = tail;
            if !rest.is_empty() {
                tokio::task::yield_now().await;
            }
        }
        apply_stale_check(&shared, generation, upserted);
        if !newly_tcp.is_empty() {
            // Offloaded although not foreseen (an earlier event of the batch changed what the
            // upsert did): marked now, as soon as possible.
            let marked: HashSet<CtTuple> = marked.iter().map(|e| e.orig).collect();
            let late: Vec<CtEntry> = newly_tcp
                .iter()
                .filter(|e| !marked.contains(&e.orig))
                .cloned()
                .collect();
            if !late.is_empty() {
                let _ = marker.send(ToMark::Unmarked(late));
            }
            remark_after_arming(
                &marker,
                JustOffloaded {
                    tcp: newly_tcp,
                    forwarded_before,
                },
            );
        }
    }
}

/// The kernel forwards the first packets of each direction again before they are armed, and
/// those set MAXACK_SET again: a stale td_maxack would make conntrack ignore the connection's
/// RST. So connections just offloaded (and marked) are marked liberal once more after arming
/// (the keep-alive does it for every active connection later on). Only those the kernel
/// forwarded a packet of by then are marked again (see [`ToMark::AfterArming`]).
pub fn remark_after_arming(marker: &Marker, just: JustOffloaded) {
    if just.tcp.is_empty() {
        return;
    }
    let marker = marker.clone();
    tokio::spawn(async move {
        tokio::time::sleep(REMARK_LIBERAL_AFTER).await;
        let _ = marker.send(ToMark::AfterArming(just));
    });
}

/// Marks the TCP connections it is sent "be liberal" (again after arming, or late), in
/// order, off the event loop.
pub async fn mark_liberal(
    shared: Arc<Shared>,
    mut ct: CtNetlink,
    mut to_mark: UnboundedReceiver<ToMark>,
) -> anyhow::Result<()> {
    while let Some(batch) = to_mark.recv().await {
        let entries = match batch {
            ToMark::Unmarked(entries) => entries,
            ToMark::AfterArming(just) => kernel_forwarded(&shared, &just).await,
        };
        mark(&shared, &mut ct, &entries).await;
    }
    Err(anyhow!("the liberal-marking channel closed"))
}

/// The connections of `just` still offloaded that the kernel forwarded a packet of since
/// their flows were written: none without a read when the kernel forwarded no packet of an
/// offloaded direction since, else two map reads each, in chunks, so the other tasks get the
/// lock in between.
async fn kernel_forwarded(shared: &Shared, just: &JustOffloaded) -> Vec<CtEntry> {
    if !kernel_forwarded_since(shared.lock().dp(), just.forwarded_before) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for chunk in just.tcp.chunks(APPLY_CHUNK) {
        {
            let s = shared.lock();
            out.extend(s.flows().kernel_forwarded(chunk, s.dp()));
        }
        tokio::task::yield_now().await;
    }
    out
}

/// Marks `entries` "be liberal" in conntrack (see [`CtUpdate::tcp_liberal`]), pipelined
/// ([`CtNetlink::update_many`]); connections that could not be marked are counted as errors.
pub async fn mark(shared: &Shared, ct: &mut CtNetlink, entries: &[CtEntry]) {
    if entries.is_empty() {
        return;
    }
    let updates: Vec<CtUpdate> = entries
        .iter()
        .map(|e| CtUpdate::for_entry(e).tcp_liberal())
        .collect();
    let failed = match ct.update_many(&updates).await {
        Ok(results) => results
            .iter()
            .filter_map(|r| r.as_ref().err())
            .inspect(|err| debug!(error = %err, "cannot mark TCP connection liberal"))
            .count(),
        Err(err) => {
            debug!(error = %err, "cannot mark TCP connections liberal");
            updates.len()
        }
    };
    if failed > 0 {
        shared.lock().count_ct_errors(failed as u64);
    }
}

/// Makes the flow maps match a fresh conntrack dump after an event-socket overrun. The TCP
/// connections it offloads are marked "be liberal" before their flows are written, and
/// returned (to be marked again after arming).
pub async fn resync(
    shared: &Shared,
    lookup: &mut RouteLookup,
    ct: &mut CtNetlink,
) -> anyhow::Result<JustOffloaded> {
    let started = Instant::now();
    let forwarded_before = shared.lock().dp().kernel_forwarded_packets();
    let mut dump = ct.dump().await.map_err(ct_err)?;
    let dumped_ms = started.elapsed().as_millis() as u64;
    let n = dump.len();
    // Entries already applied as they are need neither route lookups nor map writes: a resync
    // after an overrun under load then costs what changed, not the whole table.
    let present = {
        let s = shared.lock();
        let present = s.flows().tuples_to_check(&dump);
        if present.is_some() {
            dump.retain(|e| !s.flows().is_current(e));
        }
        present
    };
    let (paths, generation) = resolve_fresh(shared, lookup, &dump.iter().collect::<Vec<_>>()).await;
    let looked_up_ms = started.elapsed().as_millis() as u64;
    let (removed, before) = {
        let mut s = shared.lock();
        let before = s.flows().stats().offloaded_total;
        (s.resync_remove_absent(present.as_ref(), &dump), before)
    };
    // In chunks, so status, metrics and the other tasks get the lock in between; the TCP
    // connections of each chunk are marked liberal before it is applied.
    let (mut mark_time, mut write_time) = (Duration::ZERO, Duration::ZERO);
    for chunk in dump.chunks(APPLY_CHUNK) {
        let t = Instant::now();
        let marked = shared.lock().tcp_to_offload(chunk, &paths);
        mark(shared, ct, &marked).await;
        mark_time += t.elapsed();
        let t = Instant::now();
        shared.lock().resync_upsert(chunk, &paths, false);
        write_time += t.elapsed();
        tokio::task::yield_now().await;
    }
    let added = {
        let mut s = shared.lock();
        s.resync_done(started.elapsed().as_millis() as u64);
        let added = s.flows().stats().offloaded_total - before;
        info!(
            entries = n,
            changed = dump.len(),
            offloaded = s.flows().len(),
            removed,
            routes = paths.len(),
            dumped_ms,
            looked_up_ms,
            marked_ms = mark_time.as_millis() as u64,
            written_ms = write_time.as_millis() as u64,
            ms = started.elapsed().as_millis() as u64,
            "conntrack resync"
        );
        added
    };
    apply_stale_check(shared, generation, dump.iter().map(|e| e.orig));
    // The lookups' memory and what the tables left behind growing, back to the kernel.
    drop(paths);
    release_freed_memory();
    if added == 0 {
        return Ok(JustOffloaded::default());
    }
    // Only the TCP connections this resync wrote: the others were marked again after their
    // own arming, and the keep-alive marks those that carry traffic.
    let s = shared.lock();
    Ok(JustOffloaded {
        tcp: dump
            .into_iter()
            .filter(|e| e.orig.proto == IPPROTO_TCP && s.flows().is_offloaded(&e.orig))
            .collect(),
        forwarded_before,
    })
}

/// Entries per part of the start-up dump handed from one stage to the next.
const START_PART: usize = 16 * 1024;

/// Parts queued between two stages of the start-up resync, at most: a stage ahead of the next
/// waits, and so does the kernel's dump, so the daemon never holds the whole table at once.
const START_PARTS_QUEUED: usize = 4;

/// A part of the start-up dump with the routes its connections need.
struct LookedUp {
    entries: Vec<CtEntry>,
    paths: ResolvedPaths,
    /// The route generation `paths` were looked up at.
    generation: u64,
}

/// Writes every connection of a conntrack dump to the flow maps at start (nothing offloaded
/// yet), in three stages that overlap: the dump is parsed as the kernel produces it
/// (`ct`), each part's routes are looked up (`lookup`), and each part is written while the
/// next ones are read, so a million entries cost about the longest stage, not the sum.
///
/// No connection is marked and no arming index entry is written: their flows await traffic
/// (`FLOW_F_AWAITING_TRAFFIC`), which the kernel cannot arm, and the keep-alive takes each in
/// (marking a TCP one) once it carries traffic. A router's table at start is mostly idle
/// connections: marking a million of them and indexing them for arming took as long as the
/// rest of the start-up.
pub async fn resync_at_start(
    shared: &Arc<Shared>,
    mut lookup: RouteLookup,
    mut ct: CtNetlink,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let expected = tokio::task::spawn_blocking(conntrack_count)
        .await
        .ok()
        .flatten()
        .unwrap_or(0) as usize;
    let (dumped, mut to_look_up) = mpsc::channel(START_PARTS_QUEUED);
    let dumper = tokio::spawn(async move {
        let n = ct.dump_in_chunks(START_PART, &dumped).await;
        (n, started.elapsed())
    });
    let (looked_up, mut to_write) = mpsc::channel(START_PARTS_QUEUED);
    let looker = {
        let shared = Arc::clone(shared);
        tokio::spawn(async move {
            let mut busy = Duration::ZERO;
            let mut routes = 0;
            while let Some(entries) = to_look_up.recv().await {
                let t = Instant::now();
                let refs: Vec<&CtEntry> = entries.iter().collect();
                let (paths, generation) = resolve_fresh(&shared, &mut lookup, &refs).await;
                drop(refs);
                busy += t.elapsed();
                routes = routes.max(paths.len());
                let part = LookedUp {
                    entries,
                    paths,
                    generation,
                };
                if looked_up.send(part).await.is_err() {
                    break;
                }
            }
            (busy, routes)
        })
    };
    let (mut written, mut write_time) = (0, Duration::ZERO);
    while let Some(part) = to_write.recv().await {
        let t = Instant::now();
        if written == 0 {
            shared
                .lock()
                .resync_reserve(&part.entries, expected.max(part.entries.len()));
        }
        // In chunks, so status, metrics and the other tasks get the lock in between.
        for chunk in part.entries.chunks(APPLY_CHUNK) {
            shared.lock().resync_upsert(chunk, &part.paths, true);
            tokio::task::yield_now().await;
        }
        write_time += t.elapsed();
        written += part.entries.len();
        apply_stale_check(shared, part.generation, part.entries.iter().map(|e| e.orig));
    }
    let task_failed = |e: tokio::task::JoinError| anyhow!("the conntrack dump at start: {e}");
    let (dump, dumped) = dumper.await.map_err(task_failed)?;
    let n = dump.map_err(ct_err)?;
    let (look_up_time, routes) = looker.await.map_err(task_failed)?;
    {
        let mut s = shared.lock();
        s.resync_done(started.elapsed().as_millis() as u64);
        info!(
            at_start = true,
            entries = n,
            changed = written,
            offloaded = s.flows().len(),
            removed = 0,
            routes,
            dumped_ms = dumped.as_millis() as u64,
            looked_up_ms = look_up_time.as_millis() as u64,
            marked_ms = 0,
            written_ms = write_time.as_millis() as u64,
            ms = started.elapsed().as_millis() as u64,
            "conntrack resync"
        );
    }
    // What the tables left behind growing, back to the kernel.
    release_freed_memory();
    Ok(())
}
