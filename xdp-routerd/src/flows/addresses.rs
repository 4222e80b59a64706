//! The addresses the offloaded connections' route answers depend on (source, NAT address,
//! remote end: what [`crate::paths::resolve`] asks about), counted, so that a routing change
//! can be checked against them without walking every connection.

use std::{collections::BTreeMap, net::IpAddr};

use super::conntrack::CtTuple;

/// How many offloaded connections use each address.
#[derive(Debug, Default)]
pub struct Addresses(BTreeMap<IpAddr, u32>);

/// The addresses a connection's route answers depend on.
fn of(orig: &CtTuple, reply: &CtTuple) -> [IpAddr; 3] {
    [orig.src, reply.dst, reply.src]
}

impl Addresses {
    /// A connection was offloaded.
    pub fn add(&mut self, orig: &CtTuple, reply: &CtTuple) {
        for a in of(orig, reply) {
            *self.0.entry(a).or_default() += 1;
        }
    }

    /// A connection offloaded with `reply` is gone.
    pub fn remove(&mut self, orig: &CtTuple, reply: &CtTuple) {
        for a in of(orig, reply) {
            if let Some(n) = self.0.get_mut(&a) {
                *n -= 1;
                if *n == 0 {
                    self.0.remove(&a);
                }
            }
        }
    }

    /// Whether an offloaded connection uses an address from `first` to `last` (same family).
    pub fn any_in(&self, first: IpAddr, last: IpAddr) -> bool {
        first <= last && self.0.range(first..=last).next().is_some()
    }
}
