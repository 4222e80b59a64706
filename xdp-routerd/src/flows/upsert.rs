//! The offload decision: whether a conntrack entry may be offloaded on its current paths
//! ([`FlowManager::upsert`] and its batch form), and the parking of those that may not yet.

use std::time::{Duration, Instant};

use foldhash::{HashSet, HashSetExt as _};

use tracing::warn;

use super::conntrack::{CtEntry, IPPROTO_TCP};
use super::map_entries::{Plan, PlanValues, remove_entries};
use super::stored::{Stored, short_id};
use super::{FlowManager, FlowTable, PathOracle, Skip};

/// Outcome of [`FlowManager::upsert`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upsert {
    /// Newly offloaded (or re-offloaded on a new path).
    Added,
    /// Already offloaded with the same map entries; nothing written.
    Unchanged,
    /// Not offloaded (and removed if it was).
    Skipped(Skip),
}

/// How often a full flow map is reported in the log, at most.
pub const TABLE_FULL_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Rate limit of a repeated warning: the first occurrence is reported at once, the ones after
/// it together once per [`TABLE_FULL_LOG_INTERVAL`].
#[derive(Debug, Default)]
pub(super) struct OncePerInterval {
    last: Option<Instant>,
    pending: u64,
}

impl OncePerInterval {
    /// Counts one occurrence at `now`; returns how many to report when a report is due.
    pub(super) fn note(&mut self, now: Instant) -> Option<u64> {
        self.pending += 1;
        match self.last {
            Some(last) if now.duration_since(last) < TABLE_FULL_LOG_INTERVAL => None,
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.pending))
            }
        }
    }
}

/// At most this many parked connections are remembered (connections to the router itself, for
/// instance, are parked for their whole life); beyond it they are simply not re-checked.
const MAX_PARKED: usize = 4096;

/// At most this many connections held by a narrowed rule are remembered (all parked ones
/// counted), to be offloaded when the rule goes; one beyond it returns to the fast path only
/// with its next conntrack event after the rule is gone.
const MAX_HELD: usize = 262_144;

impl FlowManager {
    /// Offloads `entry` if conntrack and the routing allow it, else makes sure it is not.
    pub fn upsert(
        &mut self,
        entry: CtEntry,
        table: &mut impl FlowTable,
        paths: &impl PathOracle,
    ) -> Upsert {
        let existing = self.get(&entry.orig);
        // A connection awaiting traffic stays so when its entries are rewritten (a route
        // change): only the keep-alive takes it in. A new connection on the tuple is not
        // awaiting (a TCP one was marked by the caller, see `would_add`).
        let awaiting_traffic =
            existing.is_some_and(|c| c.awaiting_traffic && c.is_same_conn(&entry));
        let plan = match self.plan(&entry, paths, awaiting_traffic) {
            Ok(plan) => plan,
            Err(skip) => {
                self.remove(&entry.orig, table);
                *self.stats.skipped.entry(skip).or_default() += 1;
                self.park(entry, skip);
                return Upsert::Skipped(skip);
            }
        };
        self.parked.remove(&entry.orig);
        let stored = Stored {
            reply: entry.reply,
            id: entry.id.map_or(0, short_id),
            status: entry.status.bits() as u16,
            mark: entry.mark,
            zone: entry.zone,
            ingress: plan.ingress,
            awaiting_traffic,
        };
        if let Some(existing) = existing
            && existing.reply == stored.reply
            && existing.ingress == stored.ingress
            && existing.is_same_conn(&entry)
        {
            // Same map entries: only what the manager keeps of the entry is refreshed.
            if existing != stored {
                self.insert(&entry.orig, &stored);
            }
            return Upsert::Unchanged;
        }
        self.remove(&entry.orig, table);
        let hosts = self
            .ledger
            .admit(&self.lan_hosts(&entry.orig, &entry.reply, plan.ingress));
        let plan = plan.count_for(hosts);
        if let Err(skip) = plan.write(table) {
            *self.stats.skipped.entry(skip).or_default() += 1;
            if skip == Skip::TableFull
                && let Some(n) = self.full_log.note(Instant::now())
            {
                warn!(
                    connections = n,
                    offloaded = self.len(),
                    "flow map full: {n} new connection(s) stay in the kernel since the last \
                     report; raise flow_capacity (counted as \
                     xdp_router_connections_skipped_total{{reason=\"flow_table_full\"}})"
                );
            }
            self.park(entry, skip);
            return Upsert::Skipped(skip);
        }
        self.stats.offloaded_total += 1;
        self.insert(&entry.orig, &stored);
        Upsert::Added
    }

    /// [`FlowManager::upsert`] for many entries at once (a conntrack dump), in order. The
    /// connections not offloaded yet whose paths allow it are written together (all flow
    /// directions, then all arming entries: two batched writes per family); should that fail
    /// (a full map), their entries are removed and each goes through [`FlowManager::upsert`].
    /// The other entries go through [`FlowManager::upsert`] after them (entries of a dump are
    /// distinct connections, so their order does not matter; a repeated tuple comes after the
    /// first, as in the dump). With `awaiting_traffic`, the connections written here await
    /// traffic (the daemon's start: see [`Stored::awaiting_traffic`]).
    pub fn upsert_many(
        &mut self,
        entries: &[CtEntry],
        table: &mut impl FlowTable,
        paths: &impl PathOracle,
        awaiting_traffic: bool,
    ) {
        let mut fresh: Vec<(&CtEntry, Plan)> = Vec::with_capacity(entries.len());
        let mut rest: Vec<&CtEntry> = Vec::new();
        let mut seen = HashSet::with_capacity(entries.len());
        for e in entries {
            if self.get(&e.orig).is_none()
                && seen.insert(e.orig)
                && let Ok(plan) = self.plan(e, paths, awaiting_traffic)
            {
                let hosts = self
                    .ledger
                    .admit(&self.lan_hosts(&e.orig, &e.reply, plan.ingress));
                fresh.push((e, plan.count_for(hosts)));
            } else {
                rest.push(e);
            }
        }
        let (mut f4, mut a4, mut f6, mut a6) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (_, plan) in &fresh {
            // A connection awaiting traffic gets no arming index entries (see
            // `Plan::awaiting_traffic`).
            match &plan.values {
                PlanValues::V4(es) => {
                    f4.extend(es.iter().map(|(k, v, _)| (*k, *v)));
                    if !plan.awaiting_traffic {
                        a4.extend(es.iter().map(|(k, _, a)| (*a, *k)));
                    }
                }
                PlanValues::V6(es) => {
                    f6.extend(es.iter().map(|(k, v, _)| (*k, *v)));
                    if !plan.awaiting_traffic {
                        a6.extend(es.iter().map(|(k, _, a)| (*a, *k)));
                    }
                }
            }
        }
        let written = (f4.is_empty() || table.insert_many_v4(&f4, &a4).is_ok())
            && (f6.is_empty() || table.insert_many_v6(&f6, &a6).is_ok());
        for (e, plan) in fresh {
            if written {
                self.parked.remove(&e.orig);
                self.stats.offloaded_total += 1;
                let stored = Stored {
                    reply: e.reply,
                    id: e.id.map_or(0, short_id),
                    status: e.status.bits() as u16,
                    mark: e.mark,
                    zone: e.zone,
                    ingress: plan.ingress,
                    awaiting_traffic,
                };
                self.insert(&e.orig, &stored);
            } else {
                remove_entries(table, &plan.keys, &plan.arms);
                self.upsert(e.clone(), table, paths);
            }
        }
        for e in rest {
            self.upsert(e.clone(), table, paths);
        }
    }

    /// Remembers `entry` for a later retry when `skip` may change with the routing or the
    /// ruleset.
    pub(super) fn park(&mut self, entry: CtEntry, skip: Skip) {
        match skip {
            Skip::PathNotManaged | Skip::NatAddressGone | Skip::TableFull | Skip::HeldByRule => {
                let limit = if skip == Skip::HeldByRule {
                    MAX_HELD
                } else {
                    MAX_PARKED
                };
                if self.parked.len() < limit || self.parked.contains_key(&entry.orig) {
                    self.parked.insert(entry.orig, entry);
                }
            }
            Skip::NotEstablished | Skip::MapError => {
                self.parked.remove(&entry.orig);
            }
        }
    }

    /// Whether [`FlowManager::upsert`] would write new map entries for `entry` (offloadable,
    /// and not already offloaded on the same path). The daemon marks such TCP connections
    /// liberal in conntrack *before* the upsert: once written, a flow is armed by the next
    /// packet the kernel forwards and the fast path carries the rest unseen by conntrack's
    /// window tracking, so a FIN the kernel sees next would otherwise be out of window
    /// (INVALID: not de-NATed, answered by the router's own stack with a reset).
    pub fn would_add(&self, entry: &CtEntry, paths: &impl PathOracle) -> bool {
        // As in `upsert`: the same reply tuple and ingresses mean the same map entries.
        self.plan(entry, paths, false).is_ok_and(|plan| {
            self.get(&entry.orig).is_none_or(|c| {
                c.reply != entry.reply || c.ingress != plan.ingress || !c.is_same_conn(entry)
            })
        })
    }

    /// Whether [`FlowManager::upsert`] would offload `entry` were it not offloaded yet (after
    /// a DESTROY of the same tuple earlier in a batch: a new connection on the same ports).
    pub fn would_add_anew(&self, entry: &CtEntry, paths: &impl PathOracle) -> bool {
        self.plan(entry, paths, false).is_ok()
    }

    /// The parked TCP connections among `snapshot` that [`FlowManager::revalidate`] would
    /// offload under `paths` (to be marked liberal first, see [`FlowManager::would_add`]).
    pub fn parked_tcp_to_offload<'a>(
        &self,
        snapshot: impl IntoIterator<Item = &'a CtEntry>,
        paths: &impl PathOracle,
    ) -> Vec<CtEntry> {
        snapshot
            .into_iter()
            .filter(|e| {
                e.orig.proto == IPPROTO_TCP
                    && self.parked.get(&e.orig) == Some(*e)
                    && self.would_add(e, paths)
            })
            .cloned()
            .collect()
    }

    fn plan(
        &self,
        entry: &CtEntry,
        paths: &impl PathOracle,
        awaiting_traffic: bool,
    ) -> Result<Plan, Skip> {
        entry.offload_decision().map_err(|_| Skip::NotEstablished)?;
        let (orig, reply) = (&entry.orig, &entry.reply);
        if self.is_held(orig, reply) {
            return Err(Skip::HeldByRule);
        }
        let ingress_orig = paths.ingress_for(orig.src).ok_or(Skip::PathNotManaged)?;
        // Replies come back where the original direction leaves: its egress as the kernel
        // routes it (source, ingress and connection mark included, so `ip rule` multi-WAN
        // setups get the right ingress for the replies).
        let ingress_reply = paths
            .forward_egress(orig.src, reply.src, ingress_orig, entry.mark)
            .ok_or(Skip::PathNotManaged)?;
        if !self.managed.contains_key(&ingress_orig) || !self.managed.contains_key(&ingress_reply) {
            return Err(Skip::PathNotManaged);
        }
        // SNAT (masquerade): replies are addressed to the router's own address. If that address
        // is gone (DHCP renew, PPP reconnect), the kernel will drop the connection: so do we.
        if reply.dst != orig.src && !paths.is_local(reply.dst) {
            return Err(Skip::NatAddressGone);
        }
        Ok(Plan::new(
            orig,
            reply,
            ingress_orig,
            ingress_reply,
            awaiting_traffic,
        ))
    }
}
