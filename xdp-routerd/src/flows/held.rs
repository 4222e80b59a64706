//! Connections held in the kernel by a narrowed firewall rule that must see every packet (see
//! [`super::per_packet::held_flows`]): applying a new set of such rules to what is offloaded
//! and parked.

use super::accounting::DirTraffic;
use super::conntrack::CtTuple;
use super::flow_match::FlowMatch;
use super::{FlowManager, FlowTable, Skip};

impl FlowManager {
    /// The connections rules that must see every packet can match now. Offloaded connections
    /// they match are taken back at once (parked as [`Skip::HeldByRule`]); returns the parked
    /// connections they no longer match, for a revalidation to offload (their paths must be
    /// looked up first). Nothing when `held` is what it was.
    pub fn set_held(&mut self, held: Vec<FlowMatch>, table: &mut impl FlowTable) -> Vec<CtTuple> {
        if held == self.held {
            return vec![];
        }
        self.held = held;
        let now_held: Vec<_> = self
            .stored()
            .map(|(orig, s)| s.entry(orig))
            .filter(|e| self.is_held(&e.orig, &e.reply))
            .collect();
        for e in now_held {
            self.remove(&e.orig, table);
            *self.stats.skipped.entry(Skip::HeldByRule).or_default() += 1;
            self.park(e, Skip::HeldByRule);
        }
        self.parked
            .values()
            .filter(|e| !self.is_held(&e.orig, &e.reply))
            .map(|e| e.orig)
            .collect()
    }

    /// Whether a rule that must see every packet can match the connection (a bounded one only
    /// while the counters last read are within its bounds).
    pub(super) fn is_held(&self, orig: &CtTuple, reply: &CtTuple) -> bool {
        let counters = self.held_counters.get(orig);
        self.held.iter().any(|m| holds(m, orig, reply, counters))
    }

    /// The parked connections held only by rules with a counter bound, with their zones: their
    /// counters are to be read ([`FlowManager::counters_read`]).
    pub fn held_until_counted(&self) -> Vec<(CtTuple, u16)> {
        if !self.held.iter().any(FlowMatch::is_bounded) {
            return vec![];
        }
        self.parked
            .values()
            .filter(|e| {
                let mut holding = self
                    .held
                    .iter()
                    .filter(|m| m.may_match(&e.orig, &e.reply))
                    .peekable();
                holding.peek().is_some() && holding.all(FlowMatch::is_bounded)
            })
            .map(|e| (e.orig, e.zone))
            .collect()
    }

    /// Conntrack's counters of held connections, as just read: returns the ones no rule holds
    /// any more (past every bound that held them), for a revalidation to offload.
    pub fn counters_read(&mut self, read: Vec<(CtTuple, DirTraffic)>) -> Vec<CtTuple> {
        let parked = &self.parked;
        self.held_counters.retain(|t, _| parked.contains_key(t));
        let mut released = Vec::new();
        for (orig, c) in read {
            let Some(e) = self.parked.get(&orig) else {
                continue;
            };
            let reply = e.reply;
            self.held_counters.insert(orig, c);
            if !self.is_held(&orig, &reply) {
                released.push(orig);
            }
        }
        released
    }

    /// How many parked connections the rules that must see every packet hold: in all, and for
    /// each rule's match (a connection two rules can match counts for both).
    pub fn held_counts(&self) -> HeldCounts {
        let mut counts = HeldCounts {
            total: 0,
            by_match: self.held.iter().map(|m| (m.clone(), 0)).collect(),
        };
        if self.held.is_empty() {
            return counts;
        }
        for e in self.parked.values() {
            let c = self.held_counters.get(&e.orig);
            let mut held = false;
            for (m, n) in &mut counts.by_match {
                if holds(m, &e.orig, &e.reply, c) {
                    *n += 1;
                    held = true;
                }
            }
            counts.total += u64::from(held);
        }
        counts
    }
}

/// Whether the rule narrowed to `m` holds the connection: it can match a packet of it, and
/// for a bounded rule the `counters` last read are within its bounds.
fn holds(m: &FlowMatch, orig: &CtTuple, reply: &CtTuple, counters: Option<&DirTraffic>) -> bool {
    m.may_match(orig, reply) && !counters.is_some_and(|c| m.past_bound(c))
}

/// What [`FlowManager::held_counts`] counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldCounts {
    /// Connections held by at least one rule.
    pub total: u64,
    /// Connections held by each match of [`FlowManager::set_held`]'s list.
    pub by_match: Vec<(FlowMatch, u64)>,
}

impl HeldCounts {
    /// The connections the rule narrowed to `flows` holds (0 for a match not in the list).
    pub fn of(&self, flows: &FlowMatch) -> u64 {
        self.by_match
            .iter()
            .find(|(m, _)| m == flows)
            .map_or(0, |(_, n)| *n)
    }
}
