//! Re-checking what is offloaded: snapshots for a revalidation after a routing change, and
//! resynchronisation with a fresh conntrack dump.

use foldhash::{HashSet, HashSetExt as _};

use super::conntrack::{CtEntry, CtTuple};
use super::upsert::Upsert;
use super::{FlowManager, FlowTable, PathOracle};

impl FlowManager {
    /// Every offloaded and parked connection as last seen: what a revalidation re-checks (its
    /// routes are looked up before [`revalidate`](Self::revalidate) applies the answers).
    pub fn snapshot(&self) -> Vec<CtEntry> {
        self.snapshot_where(|_| true)
    }

    /// The offloaded and parked connections `keep` selects, as last seen (a revalidation of
    /// those whose route answers may have changed, see [`crate::paths::Stale`]). Walks every
    /// connection.
    pub fn snapshot_where(&self, keep: impl Fn(&CtEntry) -> bool) -> Vec<CtEntry> {
        self.stored()
            .map(|(orig, s)| s.entry(orig))
            .chain(self.parked.values().cloned())
            .filter(|e| keep(e))
            .collect()
    }

    /// [`snapshot_where`](Self::snapshot_where) among the offloaded connections `named` and
    /// the parked ones only: when no offloaded connection uses a changed address (see
    /// [`uses_addresses_in`](Self::uses_addresses_in)), costs what was named, not the table.
    pub fn snapshot_of<'a>(
        &self,
        named: impl IntoIterator<Item = &'a CtTuple>,
        keep: impl Fn(&CtEntry) -> bool,
    ) -> Vec<CtEntry> {
        let mut seen = HashSet::new();
        named
            .into_iter()
            .filter_map(|orig| Some(self.get(orig)?.entry(*orig)))
            .chain(self.parked.values().cloned())
            .filter(|e| seen.insert(e.orig) && keep(e))
            .collect()
    }

    /// Re-checks the connections of a [`snapshot`](Self::snapshot) against the current routes,
    /// addresses and managed interfaces (after an rtnetlink change): moved paths are rewritten,
    /// broken ones removed, parked ones whose path works again offloaded. Entries that changed
    /// or went away since the snapshot are left alone (their own event handled them). Returns
    /// `(removed, added)`.
    pub fn revalidate(
        &mut self,
        snapshot: impl IntoIterator<Item = CtEntry>,
        table: &mut impl FlowTable,
        paths: &impl PathOracle,
    ) -> (usize, usize) {
        let (mut removed, mut added) = (0, 0);
        for e in snapshot {
            let offloaded = match (self.get(&e.orig), self.parked.get(&e.orig)) {
                (Some(c), _) if c.entry(e.orig) == e => true,
                (None, Some(p)) if *p == e => false,
                _ => continue,
            };
            match self.upsert(e, table, paths) {
                Upsert::Skipped(_) if offloaded => removed += 1,
                Upsert::Added if !offloaded => added += 1,
                _ => {}
            }
        }
        (removed, added)
    }

    /// The original tuples of `dump` for [`remove_absent`](Self::remove_absent), or `None`
    /// when nothing is offloaded or parked (nothing to remove: no set of a million tuples to
    /// build).
    pub fn tuples_to_check(&self, dump: &[CtEntry]) -> Option<HashSet<CtTuple>> {
        (!self.is_empty() || !self.parked.is_empty()).then(|| dump.iter().map(|e| e.orig).collect())
    }

    /// Sizes the connection tables once for the entries of a dump about to be applied, instead
    /// of doubling through it: each doubling leaves the previous table behind as freed heap
    /// the process keeps.
    pub fn reserve_for(&mut self, dump: &[CtEntry]) {
        self.reserve_like(dump, dump.len());
    }

    /// [`reserve_for`](Self::reserve_for) a dump of `total` entries whose families are mixed
    /// as in `sample`, its first part (a dump walks conntrack's hash table, so any part of it
    /// is a fair sample).
    pub fn reserve_like(&mut self, sample: &[CtEntry], total: usize) {
        if sample.is_empty() {
            return;
        }
        let v4_sampled = sample.iter().filter(|e| e.orig.is_ipv4()).count();
        let v4 = total * v4_sampled / sample.len();
        self.conns_v4
            .0
            .reserve(v4.saturating_sub(self.conns_v4.0.len()));
        self.conns_v6
            .0
            .reserve((total - v4).saturating_sub(self.conns_v6.0.len()));
    }

    /// Whether `entry` is already applied as it is: offloaded with the same tuples, status,
    /// mark and zone (conntrack still allowing it), or parked with the same tuples, status,
    /// state, mark and zone (only its timeout may differ). A resync skips those: their paths
    /// are re-checked by the revalidation that follows every routing change.
    pub fn is_current(&self, entry: &CtEntry) -> bool {
        if let Some(s) = self.get(&entry.orig) {
            return s.reply == entry.reply
                && s.is_same_conn(entry)
                && u32::from(s.status) == entry.status.bits()
                && s.mark == entry.mark
                && s.zone == entry.zone
                && entry.offload_decision().is_ok();
        }
        self.parked.get(&entry.orig).is_some_and(|known| {
            known.reply == entry.reply
                && known.id == entry.id
                && known.status == entry.status
                && known.tcp_state == entry.tcp_state
                && known.tcp_flags == entry.tcp_flags
                && known.mark == entry.mark
                && known.zone == entry.zone
                && known.has_helper == entry.has_helper
        })
    }

    /// The first half of [`resync`](Self::resync): forgets every connection a fresh dump no
    /// longer has (`present`: the dump's original tuples). Returns how many were offloaded.
    pub fn remove_absent(
        &mut self,
        present: &HashSet<CtTuple>,
        table: &mut impl FlowTable,
    ) -> usize {
        let stale: Vec<CtTuple> = self
            .stored()
            .map(|(orig, _)| orig)
            .filter(|k| !present.contains(k))
            .collect();
        for k in &stale {
            self.forget(k, table);
        }
        self.parked.retain(|k, _| present.contains(k));
        self.ledger.close_absent(present);
        stale.len()
    }
}

/// Hands the heap memory freed after a big dump (its entries, the manager's grown tables) back
/// to the kernel. glibc keeps freed heap chunks below its (adaptive, up to 32 MiB) mmap
/// threshold for reuse, so without this a resync of a million entries leaves the daemon's RSS
/// at its peak for good.
pub fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory; no pointer is involved.
    unsafe {
        libc::malloc_trim(0);
    }
}
