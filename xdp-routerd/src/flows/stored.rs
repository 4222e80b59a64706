//! What the manager keeps per offloaded connection: its tuples packed per family ([`TupleV4`],
//! [`TupleV6`]) and the few conntrack fields ([`Stored`]) needed to rebuild its map entries
//! and to tell it from a later connection on the same tuple.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use foldhash::{HashMap, HashMapExt as _};

use super::Offloaded;
use super::accounting::DirTraffic;
use super::conntrack::{CtEntry, CtStatus, CtTuple, IPPROTO_TCP, tcp_state};
use super::map_entries::Plan;

/// A connection's tuple, packed per family: the manager keeps one per direction and connection,
/// so its size is most of the daemon's memory per flow (`CtTuple` with two `IpAddr` is 40
/// bytes, [`TupleV4`] 14).
pub(super) trait Packed: Copy + Eq + std::hash::Hash {
    fn pack(t: &CtTuple) -> Option<Self>;
    fn unpack(&self) -> CtTuple;
}

/// An IPv4 [`CtTuple`], packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct TupleV4 {
    pub(super) src: [u8; 4],
    pub(super) dst: [u8; 4],
    pub(super) sport: u16,
    pub(super) dport: u16,
    pub(super) proto: u8,
}

/// An IPv6 [`CtTuple`], packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct TupleV6 {
    pub(super) src: [u8; 16],
    pub(super) dst: [u8; 16],
    pub(super) sport: u16,
    pub(super) dport: u16,
    pub(super) proto: u8,
}

impl Packed for TupleV4 {
    fn pack(t: &CtTuple) -> Option<Self> {
        match (t.src, t.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => Some(TupleV4 {
                src: s.octets(),
                dst: d.octets(),
                sport: t.sport,
                dport: t.dport,
                proto: t.proto,
            }),
            _ => None,
        }
    }
    fn unpack(&self) -> CtTuple {
        CtTuple {
            src: Ipv4Addr::from(self.src).into(),
            dst: Ipv4Addr::from(self.dst).into(),
            proto: self.proto,
            sport: self.sport,
            dport: self.dport,
        }
    }
}

impl Packed for TupleV6 {
    fn pack(t: &CtTuple) -> Option<Self> {
        match (t.src, t.dst) {
            (IpAddr::V6(s), IpAddr::V6(d)) => Some(TupleV6 {
                src: s.octets(),
                dst: d.octets(),
                sport: t.sport,
                dport: t.dport,
                proto: t.proto,
            }),
            _ => None,
        }
    }
    fn unpack(&self) -> CtTuple {
        CtTuple {
            src: Ipv6Addr::from(self.src).into(),
            dst: Ipv6Addr::from(self.dst).into(),
            proto: self.proto,
            sport: self.sport,
            dport: self.dport,
        }
    }
}

/// What the manager keeps per offloaded connection besides its original tuple (the map key):
/// enough to rebuild its map entries, to refresh or re-check it, and to tell it from a later
/// connection on the same tuple. 36 bytes for IPv4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stored<T> {
    pub(super) reply: T,
    /// The low 16 bits of the conntrack entry's `CTA_ID` (0: not known), enough to tell a
    /// later connection on the same tuple from this one but for one case in 65,536 (then it
    /// is taken for the same one, as without ids); 16 bits keep the entry at 32 bytes.
    pub(super) id: u16,
    /// `CTA_STATUS` bits as last seen (the kernel's `IPS_*` bits end at 15).
    pub(super) status: u16,
    pub(super) mark: u32,
    pub(super) zone: u16,
    /// `[original, reply]` ingress interfaces.
    pub(super) ingress: [u32; 2],
    /// A connection found in conntrack at the daemon's start that has carried no traffic
    /// since: its entries carry `FLOW_F_AWAITING_TRAFFIC` until the keep-alive takes it in (see
    /// [`FlowManager::joined_on_traffic`](super::FlowManager::joined_on_traffic)).
    pub(super) awaiting_traffic: bool,
}

impl<T> Stored<T> {
    /// The same, with the reply tuple converted (packed or unpacked).
    fn with_reply<U>(self, reply: impl FnOnce(T) -> U) -> Stored<U> {
        Stored {
            reply: reply(self.reply),
            id: self.id,
            status: self.status,
            mark: self.mark,
            zone: self.zone,
            ingress: self.ingress,
            awaiting_traffic: self.awaiting_traffic,
        }
    }
}

/// The offloaded connections of one family, by original tuple.
pub(super) struct Conns<T>(pub(super) HashMap<T, Stored<T>>);

impl<T> Default for Conns<T> {
    fn default() -> Self {
        Conns(HashMap::new())
    }
}

impl<T: Packed> Conns<T> {
    pub(super) fn get(&self, orig: &CtTuple) -> Option<Stored<CtTuple>> {
        let s = self.0.get(&T::pack(orig)?)?;
        Some(s.with_reply(|r| r.unpack()))
    }
    /// Stores `s` under `orig`; returns what it replaced, and whether it was stored (both
    /// tuples of this family).
    pub(super) fn insert(
        &mut self,
        orig: &CtTuple,
        s: &Stored<CtTuple>,
    ) -> (Option<Stored<CtTuple>>, bool) {
        let (Some(k), Some(reply)) = (T::pack(orig), T::pack(&s.reply)) else {
            return (None, false);
        };
        let old = self.0.insert(k, s.with_reply(|_| reply));
        (old.map(|s| s.with_reply(|r| r.unpack())), true)
    }
    pub(super) fn remove(&mut self, orig: &CtTuple) -> Option<Stored<CtTuple>> {
        let s = self.0.remove(&T::pack(orig)?)?;
        Some(s.with_reply(|r| r.unpack()))
    }
    pub(super) fn iter(&self) -> impl Iterator<Item = (CtTuple, Stored<CtTuple>)> + '_ {
        self.0
            .iter()
            .map(|(k, s)| (k.unpack(), s.with_reply(|r| r.unpack())))
    }
}

/// What [`Stored`] keeps of a `CTA_ID`.
pub(super) fn short_id(id: u32) -> u16 {
    id as u16
}

impl Stored<CtTuple> {
    /// Whether `entry` is the conntrack entry this was written from, not a later connection
    /// that reuses its tuple (its `CTA_ID` differs). Unknown ids count as the same.
    ///
    /// Why it matters: a flow left from the earlier connection (its closing events lost in
    /// an event socket overrun, or written from a resync dump that was stale by then) is armed
    /// by the new connection's first packets the kernel forwards (the arming index knows
    /// tuples, not connections). Taken as "unchanged", the new connection would neither be
    /// marked liberal in conntrack nor get fresh, unarmed map entries: the fast path would
    /// carry its handshake ACK and data past conntrack, and its FIN would then be out of
    /// window for conntrack (INVALID: not de-NATed, dropped by an ESTABLISHED-only FORWARD).
    pub(super) fn is_same_conn(&self, entry: &CtEntry) -> bool {
        self.id == 0 || entry.id.is_none_or(|id| short_id(id) == self.id)
    }

    /// The conntrack entry as far as it is kept (see [`Offloaded::entry`]).
    pub(super) fn entry(&self, orig: CtTuple) -> CtEntry {
        CtEntry {
            id: (self.id != 0).then_some(u32::from(self.id)),
            orig,
            reply: self.reply,
            status: CtStatus::from_bits_retain(u32::from(self.status)),
            tcp_state: (orig.proto == IPPROTO_TCP).then_some(tcp_state::ESTABLISHED),
            tcp_flags: None,
            timeout: None,
            mark: self.mark,
            zone: self.zone,
            has_helper: false,
        }
    }

    pub(super) fn offloaded(&self, orig: CtTuple, carried: DirTraffic) -> Offloaded {
        let plan = Plan::new(
            &orig,
            &self.reply,
            self.ingress[0],
            self.ingress[1],
            self.awaiting_traffic,
        );
        Offloaded {
            entry: self.entry(orig),
            keys: plan.keys,
            arms: plan.arms,
            carried,
        }
    }
}
