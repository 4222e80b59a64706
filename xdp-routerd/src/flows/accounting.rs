//! Counting what was forwarded. The kernel cannot be told about packets it did not see
//! (ctnetlink takes no counters on an update), so conntrack's counters (`nf_conntrack_acct`)
//! miss everything the fast path carried; the fast path counts those itself, per flow
//! direction, in the same unit ([`Traffic`]: IP bytes). This module holds what the two add up
//! to: per connection ([`merge`], for `xdp-routerd flows`) and per LAN host ([`Ledger`], for
//! the per-host metrics), and keeps the fast path's counters of map entries that were
//! rewritten or removed, so no total goes backwards while the connection lives or after it.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::IpAddr,
    ops::{Add, AddAssign},
};

use serde::{Deserialize, Serialize};
use xdp_router_common::FlowCounters;

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

/// Everything the router forwarded of a flow direction while it was offloaded: the fast
/// path's packets and the ones the kernel forwarded itself (counted by the arming program),
/// which the per-host metrics report.
pub fn routed(c: &FlowCounters) -> Traffic {
    Traffic {
        packets: c.packets.wrapping_add(c.kernel_packets),
        bytes: c.bytes.wrapping_add(c.kernel_bytes),
    }
}

/// A connection's traffic, `[original, reply]` direction.
pub type DirTraffic = [Traffic; 2];

/// What a connection's map entries counted: the fast path's share (for `xdp-routerd flows`,
/// added to conntrack's own counters) and everything routed (for the per-host metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EntryTraffic {
    pub fastpath: DirTraffic,
    pub routed: DirTraffic,
}

impl EntryTraffic {
    /// What `[original, reply]` map entries count (nothing for a missing one).
    pub fn of(counters: [Option<FlowCounters>; 2]) -> EntryTraffic {
        let c = counters.map(Option::unwrap_or_default);
        EntryTraffic {
            fastpath: c.map(Traffic::from),
            routed: [routed(&c[0]), routed(&c[1])],
        }
    }
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

impl AddAssign for HostTraffic {
    fn add_assign(&mut self, o: HostTraffic) {
        self.transmit += o.transmit;
        self.receive += o.receive;
    }
}

/// Per-host totals: the admitted hosts by address, the rest summed as `other`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostTotals {
    pub hosts: BTreeMap<IpAddr, HostTraffic>,
    pub other: HostTraffic,
}

impl HostTotals {
    /// Adds a connection's traffic to its hosts (see [`LanHosts`]); hosts not in `hosts`
    /// (not admitted) go to `other`.
    pub fn add(&mut self, lan: &LanHosts, traffic: &DirTraffic) {
        for (i, host) in lan.iter().enumerate() {
            let Some(host) = host else { continue };
            let t = HostTraffic {
                transmit: traffic[i],
                receive: traffic[1 - i],
            };
            match self.hosts.get_mut(host) {
                Some(h) => *h += t,
                None => self.other += t,
            }
        }
    }
}

/// What the fast path forwarded that is no longer in a live map entry, and which LAN hosts
/// get a series of their own. Changed only by the [`super::FlowManager`].
#[derive(Debug, Default)]
pub struct Ledger {
    /// Most hosts with a series of their own (`host_metrics_limit`); 0 = none.
    limit: usize,
    /// The admitted hosts (first come, never evicted, so each series stays monotonic) with
    /// the traffic of their connections that conntrack destroyed; `other.other` the rest.
    closed: HostTotals,
    /// Live connections whose map entries were rewritten or taken back: their counters until
    /// then, attributed to the hosts they had then, kept until conntrack destroys them.
    carried: HashMap<CtTuple, (LanHosts, EntryTraffic)>,
}

impl Ledger {
    /// Sets the most hosts with a series of their own (hosts admitted before stay).
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
    }

    /// The host limit (0: per-host metrics off).
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A connection was offloaded: its LAN hosts get a series while there is room.
    pub fn admit(&mut self, lan: &LanHosts) {
        for host in lan.iter().flatten() {
            if self.closed.hosts.len() < self.limit {
                self.closed.hosts.entry(*host).or_default();
            }
        }
    }

    /// A live connection's map entries are going (rewritten or taken back): keeps what they
    /// counted.
    pub fn carry(&mut self, orig: CtTuple, lan: LanHosts, traffic: EntryTraffic) {
        let (_, carried) = self
            .carried
            .entry(orig)
            .or_insert((lan, EntryTraffic::default()));
        for i in 0..2 {
            carried.fastpath[i] += traffic.fastpath[i];
            carried.routed[i] += traffic.routed[i];
        }
    }

    /// What the fast path forwarded in the earlier map entries of the live connection `orig`.
    pub fn carried(&self, orig: &CtTuple) -> DirTraffic {
        self.carried
            .get(orig)
            .map(|(_, t)| t.fastpath)
            .unwrap_or_default()
    }

    /// Conntrack destroyed the connection: what it carried goes to its hosts' totals.
    pub fn close(&mut self, orig: &CtTuple) {
        if let Some((lan, traffic)) = self.carried.remove(orig) {
            self.closed.add(&lan, &traffic.routed);
        }
    }

    /// A conntrack dump no longer has these connections (`present`: the dump's original
    /// tuples): their destruction was missed, so what they carried goes to their hosts.
    pub fn close_absent(&mut self, present: &HashSet<CtTuple>) {
        let gone: Vec<CtTuple> = self
            .carried
            .keys()
            .filter(|k| !present.contains(k))
            .copied()
            .collect();
        for orig in &gone {
            self.close(orig);
        }
    }

    /// The per-host totals without the live map entries (add those with [`HostTotals::add`]).
    pub fn totals(&self) -> HostTotals {
        let mut t = self.closed.clone();
        for (lan, traffic) in self.carried.values() {
            t.add(lan, &traffic.routed);
        }
        t
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
    fn entries_count_the_fast_path_share_and_everything_routed() {
        let c = FlowCounters {
            packets: 7,
            bytes: 700,
            kernel_packets: 2,
            kernel_bytes: 3000,
            ..Default::default()
        };
        let e = EntryTraffic::of([Some(c), None]);
        assert_eq!(e.fastpath, [t(7, 700), t(0, 0)]);
        assert_eq!(e.routed, [t(9, 3700), t(0, 0)]);
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
    fn hosts_send_one_direction_and_receive_the_other() {
        let mut totals = HostTotals::default();
        totals.hosts.insert(ip(2), HostTraffic::default());
        totals.hosts.insert(ip(3), HostTraffic::default());
        // A LAN client to the WAN: only the originator is a LAN host.
        totals.add(&[Some(ip(2)), None], &[t(10, 1000), t(5, 300)]);
        // LAN to LAN: both are.
        totals.add(&[Some(ip(3)), Some(ip(2))], &[t(1, 100), t(2, 200)]);
        assert_eq!(
            totals.hosts[&ip(2)],
            HostTraffic {
                transmit: t(12, 1200),
                receive: t(6, 400)
            }
        );
        assert_eq!(
            totals.hosts[&ip(3)],
            HostTraffic {
                transmit: t(1, 100),
                receive: t(2, 200)
            }
        );
        assert_eq!(totals.other, HostTraffic::default());
    }

    #[test]
    fn hosts_beyond_the_limit_are_summed_as_other() {
        let mut l = Ledger::default();
        l.set_limit(2);
        for host in 1..=4 {
            l.admit(&[Some(ip(host)), None]);
        }
        let mut totals = l.totals();
        assert_eq!(
            totals.hosts.keys().copied().collect::<Vec<_>>(),
            [ip(1), ip(2)]
        );
        for host in 1..=4 {
            totals.add(&[Some(ip(host)), None], &[t(1, 100), t(0, 0)]);
        }
        assert_eq!(totals.hosts[&ip(2)].transmit, t(1, 100));
        assert_eq!(totals.other.transmit, t(2, 200));
        // 0 admits nobody.
        let mut off = Ledger::default();
        off.admit(&[Some(ip(1)), Some(ip(2))]);
        assert!(off.totals().hosts.is_empty());
    }

    #[test]
    fn counters_of_rewritten_and_removed_entries_are_kept() {
        let mut l = Ledger::default();
        l.set_limit(8);
        let lan = [Some(ip(2)), None];
        l.admit(&lan);
        // The entries were rewritten twice (route changes) while the connection lived; the
        // second time the kernel had forwarded 3 packets of the original direction itself.
        let fast = |d: DirTraffic| EntryTraffic {
            fastpath: d,
            routed: d,
        };
        l.carry(tuple(2), lan, fast([t(10, 1000), t(1, 60)]));
        l.carry(
            tuple(2),
            lan,
            EntryTraffic {
                fastpath: [t(5, 500), t(1, 60)],
                routed: [t(8, 800), t(1, 60)],
            },
        );
        // `flows` adds conntrack's own counters to the fast path's share only.
        assert_eq!(l.carried(&tuple(2)), [t(15, 1500), t(2, 120)]);
        let live = [t(1, 100), t(0, 0)];
        let mut before = l.totals();
        before.add(&lan, &live);
        // Then conntrack destroyed it (its last entries were carried when they were removed).
        l.carry(tuple(2), lan, fast(live));
        l.close(&tuple(2));
        assert_eq!(l.carried(&tuple(2)), DirTraffic::default());
        let after = l.totals();
        assert_eq!(
            after, before,
            "closing moves the counts, it neither adds nor drops"
        );
        // The hosts get everything routed: fast path and kernel.
        assert_eq!(after.hosts[&ip(2)].transmit, t(19, 1900));
        assert_eq!(after.hosts[&ip(2)].receive, t(2, 120));
    }
}
