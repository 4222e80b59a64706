//! Counting what was forwarded. The kernel cannot be told about packets it did not see
//! (ctnetlink takes no counters on an update), so conntrack's counters (`nf_conntrack_acct`)
//! miss everything the fast path carried; the fast path counts those itself, per flow
//! direction, in the same unit ([`Traffic`]: IP bytes). This module holds what the two add up
//! to per connection ([`merge`], for `xdp-routerd flows`, with the fast path's counters of
//! map entries that were rewritten or removed kept in the [`Ledger`], so no total goes
//! backwards while the connection lives), and the per-host totals: the datapath adds every
//! packet of an offloaded direction to its LAN hosts' `HOST_TRAFFIC` slots as it goes, and
//! the [`Ledger`] says which host has which slot, so a scrape reads one entry per host.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    ops::{Add, AddAssign},
};

use foldhash::{HashMap, HashSet};

use serde::{Deserialize, Serialize};
use xdp_router_common::{
    FlowCounters, HOST_SLOT_FIRST, HOST_SLOT_NONE, HOST_SLOT_OTHER, HostCounters,
};

use super::conntrack::CtTuple;

/// Packets and bytes of one flow direction. Bytes are IP bytes: each packet's datagram length
/// (IPv4 total length, IPv6 payload length + 40), as conntrack counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Traffic {
    pub packets: u64,
    pub bytes: u64,
}

impl Add for Traffic {
    type Output = Traffic;
    fn add(self, o: Traffic) -> Traffic {
        Traffic {
            packets: self.packets.wrapping_add(o.packets),
            bytes: self.bytes.wrapping_add(o.bytes),
        }
    }
}

impl AddAssign for Traffic {
    fn add_assign(&mut self, o: Traffic) {
        *self = *self + o;
    }
}

impl From<FlowCounters> for Traffic {
    fn from(c: FlowCounters) -> Traffic {
        Traffic {
            packets: c.packets,
            bytes: c.bytes,
        }
    }
}

/// A connection's traffic, `[original, reply]` direction.
pub type DirTraffic = [Traffic; 2];

/// What the fast path forwarded of a connection's `[original, reply]` map entries (nothing
/// for a missing one): added to conntrack's own counters by `xdp-routerd flows`.
pub fn fastpath(counters: [Option<FlowCounters>; 2]) -> DirTraffic {
    counters.map(|c| Traffic::from(c.unwrap_or_default()))
}

/// Conntrack's own counters (`nf_conntrack_acct`) by original tuple and zone.
pub type KernelCounters = HashMap<(CtTuple, u16), DirTraffic>;

/// One direction of a connection as `xdp-routerd flows` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Merged {
    /// Forwarded by the fast path (conntrack never saw these).
    pub fastpath: Traffic,
    /// Conntrack's own counter: what the kernel forwarded (and the fast path handed it).
    /// `None` while `nf_conntrack_acct` is off (or the entry is gone).
    pub kernel: Option<Traffic>,
    /// `fastpath + kernel`: what conntrack would count without the fast path.
    pub total: Traffic,
}

/// The two counts of one direction added up. They never overlap: the fast path counts only
/// the packets it redirects, which conntrack never sees, and conntrack counts the packets the
/// kernel handled, including every one the fast path passed to it.
pub fn merge(fastpath: Traffic, kernel: Option<Traffic>) -> Merged {
    Merged {
        fastpath,
        kernel,
        total: fastpath + kernel.unwrap_or_default(),
    }
}

/// A connection's LAN hosts: `[originator, responder]` (its original tuple's source and its
/// reply tuple's source: the real endpoints, before SNAT and after DNAT), each `Some` when its
/// packets arrive on a LAN interface. The originator transmits the original direction and
/// receives the reply direction; the responder the other way round.
pub type LanHosts = [Option<IpAddr>; 2];

/// What one LAN host sent and received.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostTraffic {
    pub transmit: Traffic,
    pub receive: Traffic,
}

impl From<HostCounters> for HostTraffic {
    fn from(c: HostCounters) -> HostTraffic {
        HostTraffic {
            transmit: Traffic {
                packets: c.transmit_packets,
                bytes: c.transmit_bytes,
            },
            receive: Traffic {
                packets: c.receive_packets,
                bytes: c.receive_bytes,
            },
        }
    }
}

/// Per-host totals: the admitted hosts by address, the rest summed as `other`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostTotals {
    pub hosts: BTreeMap<IpAddr, HostTraffic>,
    pub other: HostTraffic,
}

/// The `HOST_TRAFFIC` slots of a connection's LAN hosts, `[originator, responder]`
/// (`HOST_SLOT_*`; see [`LanHosts`]).
pub type HostSlots = [u32; 2];

/// Which LAN hosts get a series of their own and their `HOST_TRAFFIC` slots, and what the
/// fast path forwarded in map entries that are gone while their connections live. Changed
/// only by the [`super::FlowManager`].
#[derive(Debug, Default)]
pub struct Ledger {
    /// Most hosts with a series of their own (`host_metrics_limit`); 0 = none.
    limit: usize,
    /// The admitted hosts (first come, never evicted, so each series stays monotonic) and
    /// their slots, `HOST_SLOT_FIRST` on in the order they came.
    slots: BTreeMap<IpAddr, u32>,
    /// Live connections whose map entries were rewritten or taken back: what the fast path
    /// forwarded in them, kept until conntrack destroys them (for `xdp-routerd flows`).
    carried: HashMap<CtTuple, DirTraffic>,
}

impl Ledger {
    /// Sets the most hosts with a series of their own (hosts admitted before stay).
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
    }

    /// A connection is being offloaded: its LAN hosts get a series while there is room.
    /// Returns their slots: a host's own, `HOST_SLOT_OTHER` beyond the limit,
    /// `HOST_SLOT_NONE` for an endpoint that is not a LAN host or with per-host metrics off.
    pub fn admit(&mut self, lan: &LanHosts) -> HostSlots {
        lan.map(|host| match host {
            Some(_) if self.limit == 0 => HOST_SLOT_NONE,
            None => HOST_SLOT_NONE,
            Some(host) => {
                let next = HOST_SLOT_FIRST + self.slots.len() as u32;
                match self.slots.get(&host) {
                    Some(slot) => *slot,
                    None if self.slots.len() < self.limit => {
                        self.slots.insert(host, next);
                        next
                    }
                    None => HOST_SLOT_OTHER,
                }
            }
        })
    }

    /// The admitted hosts and their slots.
    pub fn slots(&self) -> impl Iterator<Item = (IpAddr, u32)> + '_ {
        self.slots.iter().map(|(host, slot)| (*host, *slot))
    }

    /// A live connection's map entries are going (rewritten or taken back): keeps what the
    /// fast path forwarded in them.
    pub fn carry(&mut self, orig: CtTuple, fastpath: DirTraffic) {
        let carried = self.carried.entry(orig).or_default();
        for (c, t) in carried.iter_mut().zip(fastpath) {
            *c += t;
        }
    }

    /// What the fast path forwarded in the earlier map entries of the live connection `orig`.
    pub fn carried(&self, orig: &CtTuple) -> DirTraffic {
        self.carried.get(orig).copied().unwrap_or_default()
    }

    /// Conntrack destroyed the connection: what it carried is no longer needed.
    pub fn close(&mut self, orig: &CtTuple) {
        self.carried.remove(orig);
    }

    /// A conntrack dump no longer has these connections (`present`: the dump's original
    /// tuples): their destruction was missed.
    pub fn close_absent(&mut self, present: &HashSet<CtTuple>) {
        self.carried.retain(|orig, _| present.contains(orig));
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn t(packets: u64, bytes: u64) -> Traffic {
        Traffic { packets, bytes }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 1, last))
    }

    fn tuple(last: u8) -> CtTuple {
        CtTuple {
            src: ip(last),
            dst: IpAddr::V4(Ipv4Addr::new(10, 0, 2, 2)),
            proto: 6,
            sport: 40000,
            dport: 5201,
        }
    }

    #[test]
    fn entries_count_the_fast_path_share_only() {
        let c = FlowCounters {
            packets: 7,
            bytes: 700,
            kernel_packets: 2,
            kernel_bytes: 3000,
            ..Default::default()
        };
        assert_eq!(fastpath([Some(c), None]), [t(7, 700), t(0, 0)]);
    }

    #[test]
    fn merged_total_is_kernel_plus_fast_path() {
        let m = merge(t(70_000, 100_000_000), Some(t(3, 180)));
        assert_eq!(m.total, t(70_003, 100_000_180));
        // Accounting off: the fast path's count is all there is.
        let m = merge(t(5, 500), None);
        assert_eq!((m.kernel, m.total), (None, t(5, 500)));
    }

    #[test]
    fn hosts_get_slots_in_order_and_the_rest_share_other() {
        let mut l = Ledger::default();
        l.set_limit(2);
        assert_eq!(
            l.admit(&[Some(ip(1)), None]),
            [HOST_SLOT_FIRST, HOST_SLOT_NONE]
        );
        // LAN to LAN: both are hosts; the second takes the last free slot.
        assert_eq!(
            l.admit(&[Some(ip(2)), Some(ip(1))]),
            [HOST_SLOT_FIRST + 1, HOST_SLOT_FIRST]
        );
        assert_eq!(
            l.admit(&[Some(ip(3)), None]),
            [HOST_SLOT_OTHER, HOST_SLOT_NONE]
        );
        // An admitted host keeps its slot.
        assert_eq!(
            l.admit(&[None, Some(ip(2))]),
            [HOST_SLOT_NONE, HOST_SLOT_FIRST + 1]
        );
        assert_eq!(
            l.slots().collect::<Vec<_>>(),
            [(ip(1), HOST_SLOT_FIRST), (ip(2), HOST_SLOT_FIRST + 1)]
        );
        // 0: per-host metrics off, nothing is counted.
        let mut off = Ledger::default();
        assert_eq!(off.admit(&[Some(ip(1)), Some(ip(2))]), [HOST_SLOT_NONE; 2]);
        assert_eq!(off.slots().count(), 0);
    }

    #[test]
    fn host_counters_are_transmit_and_receive() {
        let c = HostCounters {
            transmit_packets: 1,
            transmit_bytes: 100,
            receive_packets: 2,
            receive_bytes: 3000,
        };
        assert_eq!(
            HostTraffic::from(c),
            HostTraffic {
                transmit: t(1, 100),
                receive: t(2, 3000)
            }
        );
    }

    #[test]
    fn fast_path_counts_of_rewritten_entries_are_kept_until_the_connection_closes() {
        let mut l = Ledger::default();
        // The entries were rewritten twice (route changes) while the connection lived.
        l.carry(tuple(2), [t(10, 1000), t(1, 60)]);
        l.carry(tuple(2), [t(5, 500), t(1, 60)]);
        assert_eq!(l.carried(&tuple(2)), [t(15, 1500), t(2, 120)]);
        l.carry(tuple(3), [t(1, 1), t(0, 0)]);
        // A dump without tuple(3): its DESTROY was missed.
        l.close_absent(&[tuple(2)].into_iter().collect());
        assert_eq!(l.carried(&tuple(3)), DirTraffic::default());
        l.close(&tuple(2));
        assert_eq!(l.carried(&tuple(2)), DirTraffic::default());
    }
}
