//! Connections held in the kernel by a narrowed firewall rule that must see every packet (see
//! [`super::per_packet::held_flows`]): applying a new set of such rules to what is offloaded
//! and parked.

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

    /// Whether a rule that must see every packet can match the connection.
    pub(super) fn is_held(&self, orig: &CtTuple, reply: &CtTuple) -> bool {
        self.held.iter().any(|m| m.may_match(orig, reply))
    }

    /// How many parked connections a rule that must see every packet holds.
    pub fn held_len(&self) -> usize {
        if self.held.is_empty() {
            return 0;
        }
        self.parked
            .values()
            .filter(|e| self.is_held(&e.orig, &e.reply))
            .count()
    }
}
