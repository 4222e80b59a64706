//! Conntrack and rtnetlink batches applied to the state. The tasks read and decode them, and
//! look routes up, outside the lock ([`crate::tasks::conntrack`], [`crate::tasks::rtnetlink`]),
//! then hand them here: conntrack events become flow changes in event order (and the TCP
//! connections a batch would offload are foreseen, to be marked first); a resync's dump, a
//! revalidation's fresh route answers and a keep-alive pass are applied the same way; link,
//! FDB, route and qdisc notifications become attachments, detachments and FDB copies, and name
//! the flows to revalidate.

use std::collections::BTreeMap;

use foldhash::{HashSet, HashSetExt as _};

use tracing::{debug, warn};

use super::{Ports, State};
use crate::{
    flows::{
        Active, FlowTable, PathOracle, Upsert,
        conntrack::{CtEntry, CtEvent, CtTuple, IPPROTO_TCP},
    },
    paths::Stale,
    sync::{
        bridge::{BridgeRead, BridgeReads},
        rtnl::RtEvent,
    },
};

/// What the kernel says about the links a batch touches, read before the lock is taken:
/// for each managed interface named in the batch (all of them after an overrun), its current
/// ifindex (`None`: gone) and MAC address.
pub type LinkReads = BTreeMap<String, (Option<u32>, Option<[u8; 6]>)>;

impl<D: FlowTable> State<D> {
    /// Records the event subscription's undecodable messages so far.
    pub fn set_decode_errors(&mut self, n: u64) {
        self.ct.decode_errors = n;
    }

    /// Counts `n` conntrack errors (requests or marks that failed, a failed resync, the event
    /// socket failing).
    pub fn count_ct_errors(&mut self, n: u64) {
        self.ct.errors += n;
    }

    /// A resync's first write: forgets every connection the fresh `dump` no longer has
    /// (`present`: its original tuples; `None`: none to check) and makes room for the entries
    /// it will write. Returns how many offloaded connections were forgotten.
    pub fn resync_remove_absent(
        &mut self,
        present: Option<&HashSet<CtTuple>>,
        dump: &[CtEntry],
    ) -> usize {
        let removed = present.map_or(0, |p| self.flows.remove_absent(p, &mut self.dp));
        self.flows.reserve_for(dump);
        removed
    }

    /// Before the start-up resync's first write: makes room for the `total` entries of a dump
    /// whose first part is `sample` (see [`crate::flows::FlowManager::reserve_like`]).
    pub fn resync_reserve(&mut self, sample: &[CtEntry], total: usize) {
        self.flows.reserve_like(sample, total);
    }

    /// Applies one chunk of a resync's dump with routes already looked up (see
    /// [`crate::flows::FlowManager::upsert_many`]); `awaiting_traffic`: its connections await
    /// traffic (the start-up resync, see `FLOW_F_AWAITING_TRAFFIC`).
    pub fn resync_upsert(
        &mut self,
        chunk: &[CtEntry],
        paths: &impl PathOracle,
        awaiting_traffic: bool,
    ) {
        self.flows
            .upsert_many(chunk, &mut self.dp, paths, awaiting_traffic);
    }

    /// Counts a finished resync that took `ms`.
    pub fn resync_done(&mut self, ms: u64) {
        self.ct.resyncs += 1;
        self.ct.last_resync_ms = ms;
    }

    /// Re-checks the connections of `snapshot` against fresh route answers (see
    /// [`crate::flows::FlowManager::revalidate`]). Returns `(removed, added)`.
    pub fn revalidate(
        &mut self,
        snapshot: impl IntoIterator<Item = CtEntry>,
        paths: &impl PathOracle,
    ) -> (usize, usize) {
        self.flows.revalidate(snapshot, &mut self.dp, paths)
    }

    /// The connections that carried fast-path traffic since the keep-alive's previous pass;
    /// the next pass starts at `now_ns`.
    pub fn active_since_last_pass(&mut self, now_ns: u64) -> Vec<Active> {
        self.flows.active_since_last_pass(&mut self.dp, now_ns)
    }

    /// Records a keep-alive pass: the connections whose conntrack timeouts were refreshed
    /// (`refreshed`; among them the ones found at start join the fast path, see
    /// [`crate::flows::FlowManager::joined_on_traffic`]), `errors` failed refreshes and the
    /// connections conntrack no longer has (`gone`: their DESTROY was missed), taken back.
    pub fn keepalive_done(&mut self, refreshed: &[CtTuple], errors: u64, gone: Vec<Active>) {
        self.ct.refreshes += refreshed.len() as u64;
        self.ct.errors += errors;
        for e in gone {
            self.flows.forget(&e.orig, &mut self.dp);
        }
        self.ct.joined_on_traffic += self.flows.joined_on_traffic(refreshed, &mut self.dp) as u64;
    }

    /// The TCP connections among `entries` that applying them would offload (newly, or on another
    /// path), each once: to be marked "be liberal" before they are applied.
    pub fn tcp_to_offload<'a>(
        &self,
        entries: impl IntoIterator<Item = &'a CtEntry>,
        paths: &impl PathOracle,
    ) -> Vec<CtEntry> {
        let mut seen = HashSet::new();
        entries
            .into_iter()
            .filter(|e| {
                e.orig.proto == IPPROTO_TCP && self.flows.would_add(e, paths) && seen.insert(e.orig)
            })
            .cloned()
            .collect()
    }

    /// [`State::tcp_to_offload`] for a batch of events applied in order: a connection destroyed
    /// earlier in the batch is offloaded anew by a later NEW/UPDATE of the same tuple (ports
    /// reused).
    pub fn batch_tcp_to_offload(&self, batch: &[CtEvent], paths: &impl PathOracle) -> Vec<CtEntry> {
        let (mut gone, mut seen) = (HashSet::new(), HashSet::new());
        let mut out = Vec::new();
        for ev in batch {
            match ev {
                CtEvent::Destroy(e) => {
                    gone.insert(e.orig);
                }
                CtEvent::New(e) | CtEvent::Update(e) => {
                    let adds = if gone.contains(&e.orig) {
                        self.flows.would_add_anew(e, paths)
                    } else {
                        self.flows.would_add(e, paths)
                    };
                    if e.orig.proto == IPPROTO_TCP && adds && seen.insert(e.orig) {
                        out.push(e.clone());
                    }
                }
            }
        }
        out
    }

    /// Applies one batch of events in order with routes already looked up. Returns the TCP
    /// connections newly offloaded (to be marked liberal).
    pub fn apply_events(&mut self, batch: Vec<CtEvent>, paths: &impl PathOracle) -> Vec<CtEntry> {
        let mut newly_tcp = Vec::new();
        self.ct.events += batch.len() as u64;
        let State { dp, flows, ct, .. } = self;
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
}

impl<D: Ports> State<D> {
    /// Applies a batch of rtnetlink events with the links and bridges already read; returns
    /// which flows must be revalidated and whether the qdiscs (and hooks) must be read again.
    pub fn apply_rt_events(
        &mut self,
        batch: Vec<RtEvent>,
        links: &LinkReads,
        bridges: &BridgeReads,
    ) -> (Stale, bool) {
        let mut revalidate = Stale::default();
        let mut reread_qdiscs = false;
        // A port added, removed or changing STP state comes as a link notification.
        let mut bridges_changed = false;
        let no_read = BridgeRead::default();
        let read = |name: &str| bridges.get(name).unwrap_or(&no_read);
        for ev in batch {
            match ev {
                RtEvent::LinkUp { ifindex, name, mac } => {
                    let mac = mac.or_else(|| links.get(&name).and_then(|l| l.1));
                    let new_device = self.link_up(ifindex, &name, mac, read(&name));
                    if new_device {
                        revalidate.add_all();
                    }
                    reread_qdiscs |= new_device;
                    bridges_changed = true;
                }
                RtEvent::LinkGone { ifindex, .. } => {
                    if self.link_gone(ifindex) {
                        revalidate.add_all();
                    }
                    bridges_changed = true;
                }
                RtEvent::Fdb(ev) => self.apply_fdb(ev),
                RtEvent::BridgeVlan => bridges_changed = true,
                RtEvent::PathsChanged => revalidate.add_all(),
                RtEvent::RouteChanged(prefix) => revalidate.add_prefix(prefix),
                // Only cached FIB answers depend on these (dropped already).
                RtEvent::FibChanged => {}
                RtEvent::QdiscChanged { ifindex } => reread_qdiscs |= self.has_egress_of(ifindex),
                RtEvent::Overrun => {
                    reread_qdiscs = true;
                    bridges_changed = true;
                    warn!("rtnetlink overrun: re-reading links and revalidating flows");
                    for name in self.iface_names() {
                        match links.get(&name) {
                            Some((Some(i), mac)) => {
                                self.link_up(*i, &name, *mac, read(&name));
                            }
                            _ => {
                                if let Some(i) = self.ifindex_of(&name) {
                                    self.link_gone(i);
                                }
                            }
                        }
                    }
                    revalidate.add_all();
                }
            }
        }
        if bridges_changed {
            reread_qdiscs |= self.sync_bridges(bridges);
        }
        (revalidate, reread_qdiscs)
    }
}
