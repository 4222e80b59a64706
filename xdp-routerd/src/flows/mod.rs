//! Where conntrack entries become fast-path flows.
//!
//! [`FlowManager`] decides, for each conntrack entry, whether it may be offloaded and with which
//! map entries (one per direction, keyed by ingress interface), writes them through the
//! [`FlowTable`] trait and removes them when conntrack or the routing says so. It is pure
//! bookkeeping over two small traits so it can be unit-tested with in-memory fakes.
//!
//! This file holds the two traits and the manager's tables; the rest is by concern:
//! `upsert` (the offload decision and parking), `map_entries` (the map entries of a
//! connection), `stored` (what is kept per connection), `resync` (snapshots, revalidation,
//! dumps), `keepalive` (the active connections), `skip` (why a connection is not offloaded),
//! `accounting` (what the fast path forwarded, per connection and per LAN host), `armed` (the
//! connections the kernel forwarded since their entries were written), `held` (connections a
//! narrowed rule that must see every packet holds in the kernel).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use foldhash::HashMap;

use aya::maps::MapError;
use xdp_router_common::{ArmKeyV4, ArmKeyV6, FlowKeyV4, FlowKeyV6, FlowV4, FlowV6};

use accounting::{DirTraffic, LanHosts, Ledger};
use addresses::Addresses;
use conntrack::{CtEntry, CtTuple};
use map_entries::{Plan, read_traffic, remove_entries};
use stored::{Conns, Stored, TupleV4, TupleV6};
use upsert::OncePerInterval;

pub use held::HeldCounts;
pub use keepalive::Active;
pub use map_entries::{ArmKey, DirKey};
pub use resync::release_freed_memory;
pub use skip::Skip;
pub use upsert::{TABLE_FULL_LOG_INTERVAL, Upsert};

/// The flow maps, as the manager needs them (implemented by [`crate::datapath::Datapath`]).
pub trait FlowTable {
    fn insert_v4(&mut self, key: &FlowKeyV4, value: &FlowV4) -> Result<(), MapError>;
    fn insert_v6(&mut self, key: &FlowKeyV6, value: &FlowV6) -> Result<(), MapError>;
    fn remove_v4(&mut self, key: &FlowKeyV4);
    fn remove_v6(&mut self, key: &FlowKeyV6);
    fn get_v4(&self, key: &FlowKeyV4) -> Option<FlowV4>;
    fn get_v6(&self, key: &FlowKeyV6) -> Option<FlowV6>;
    /// Indexes a flow direction by its tuple as the kernel sends it out (arming, see
    /// [`xdp_router_common::FlowV4::armed_generation`]).
    fn insert_arm_v4(&mut self, arm: &ArmKeyV4, flow: &FlowKeyV4) -> Result<(), MapError>;
    fn insert_arm_v6(&mut self, arm: &ArmKeyV6, flow: &FlowKeyV6) -> Result<(), MapError>;
    fn remove_arm_v4(&mut self, arm: &ArmKeyV4);
    fn remove_arm_v6(&mut self, arm: &ArmKeyV6);
    /// Writes many new flow directions, then their arming index entries, in as few system
    /// calls as the table can. On an error some may be written: the caller removes them.
    fn insert_many_v4(
        &mut self,
        flows: &[(FlowKeyV4, FlowV4)],
        arms: &[(ArmKeyV4, FlowKeyV4)],
    ) -> Result<(), MapError> {
        flows.iter().try_for_each(|(k, v)| self.insert_v4(k, v))?;
        arms.iter().try_for_each(|(a, k)| self.insert_arm_v4(a, k))
    }
    /// IPv6 counterpart of [`FlowTable::insert_many_v4`].
    fn insert_many_v6(
        &mut self,
        flows: &[(FlowKeyV6, FlowV6)],
        arms: &[(ArmKeyV6, FlowKeyV6)],
    ) -> Result<(), MapError> {
        flows.iter().try_for_each(|(k, v)| self.insert_v6(k, v))?;
        arms.iter().try_for_each(|(a, k)| self.insert_arm_v6(a, k))
    }
    /// Starts a keep-alive pass at `now_ns` (`bpf_ktime_get_coarse_ns` time) and takes the
    /// connections the datapath recorded as active since the previous pass started (see
    /// [`xdp_router_common::Settings::active_since_ns`]), emptying the record.
    fn take_active(&mut self, now_ns: u64) -> (Vec<FlowKeyV4>, Vec<FlowKeyV6>);
    /// How many packets of offloaded directions the kernel has forwarded (each one arms or
    /// re-arms its direction, writing `armed_at`), summed over the CPUs; `None` when it cannot
    /// be read. Only its changes mean something.
    fn kernel_forwarded_packets(&self) -> Option<u64>;
}

/// What the manager needs to know about the kernel's routing (implemented over rtnetlink).
pub trait PathOracle {
    /// The interface packets *from* `addr` arrive on: the output interface of the unicast route
    /// to `addr` (symmetric routing, as rp_filter assumes). `None` for local, blackhole,
    /// unreachable or missing routes.
    fn ingress_for(&self, addr: IpAddr) -> Option<u32>;
    /// Whether `addr` is one of this router's own addresses.
    fn is_local(&self, addr: IpAddr) -> bool;
    /// The interface the kernel forwards a packet `src -> dst` that arrived on `iif` with
    /// packet mark `mark` out of, policy routing (`ip rule from/iif/fwmark`) included; `None`
    /// when it would not forward it. Replies arrive where the original direction leaves.
    fn forward_egress(&self, src: IpAddr, dst: IpAddr, iif: u32, mark: u32) -> Option<u32> {
        let _ = (src, iif, mark);
        self.ingress_for(dst)
    }
}

/// One offloaded connection as [`FlowManager::conns`] shows it: the conntrack entry (as far as
/// the manager keeps it, see `Stored`) and both directions' keys.
#[derive(Debug, Clone)]
pub struct Offloaded {
    /// The conntrack entry: tuples, status, mark and zone as last seen; TCP ones are
    /// ESTABLISHED (otherwise they would not be offloaded); no id, timeout or TCP flags.
    pub entry: CtEntry,
    /// `[original, reply]` map keys.
    pub keys: [DirKey; 2],
    /// `[original, reply]` arming index keys.
    pub arms: [ArmKey; 2],
    /// What earlier map entries of this connection counted (see [`Ledger::carried`]): its
    /// fast-path traffic is this plus what its current entries count.
    pub carried: DirTraffic,
}

/// Counters the manager keeps for `status` and metrics.
#[derive(Debug, Clone, Default)]
pub struct ManagerStats {
    /// Connections offloaded since start.
    pub offloaded_total: u64,
    /// Connections taken back from the fast path since start.
    pub removed_total: u64,
    /// Connections considered but not offloaded, by reason.
    pub skipped: BTreeMap<Skip, u64>,
}

/// Keeps the flow maps equal to "the offloadable subset of conntrack".
#[derive(Default)]
pub struct FlowManager {
    conns_v4: Conns<TupleV4>,
    conns_v6: Conns<TupleV6>,
    /// Connections conntrack would let us offload but whose path or NAT address did not allow
    /// it (yet): re-checked after every routing change, so a connection taken back when its
    /// route moved returns to the fast path when the route comes back.
    parked: HashMap<CtTuple, CtEntry>,
    managed: BTreeMap<u32, String>,
    stats: ManagerStats,
    full_log: OncePerInterval,
    /// The addresses the offloaded connections use (not the parked ones).
    addresses: Addresses,
    /// The managed LAN interfaces (ifindex): a connection's endpoint whose packets arrive on
    /// one is a LAN host.
    lan: BTreeSet<u32>,
    /// What removed map entries counted, and the hosts with per-host series.
    ledger: Ledger,
    /// The connections firewall rules that must see every packet can match (see
    /// [`per_packet::held_flows`]): not offloaded ([`Skip::HeldByRule`]).
    held: Vec<flow_match::FlowMatch>,
    /// Conntrack's counters of held connections as last read (a counter bound releases a
    /// connection once a counter is past it).
    held_counters: HashMap<CtTuple, DirTraffic>,
}

impl FlowManager {
    /// An empty manager.
    pub fn new() -> FlowManager {
        FlowManager::default()
    }

    /// Sets the managed interfaces (ifindex → name) that flows may enter or leave through.
    pub fn set_managed(&mut self, managed: BTreeMap<u32, String>) {
        self.managed = managed;
    }

    /// Sets the managed LAN interfaces (ifindexes; see [`LanHosts`]).
    pub fn set_lan(&mut self, lan: BTreeSet<u32>) {
        self.lan = lan;
    }

    /// Sets how many LAN hosts get per-host series (`host_metrics_limit`; 0: none).
    pub fn set_host_limit(&mut self, limit: usize) {
        self.ledger.set_limit(limit);
    }

    /// The LAN hosts' slots, and what removed map entries of live connections counted.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The LAN hosts of a connection whose directions arrive on `ingress`.
    fn lan_hosts(&self, orig: &CtTuple, reply: &CtTuple, ingress: [u32; 2]) -> LanHosts {
        [
            self.lan.contains(&ingress[0]).then_some(orig.src),
            self.lan.contains(&ingress[1]).then_some(reply.src),
        ]
    }

    /// Name of a managed interface.
    pub fn iface_name(&self, ifindex: u32) -> Option<&str> {
        self.managed.get(&ifindex).map(String::as_str)
    }

    /// Whether the connection with this original tuple is offloaded.
    pub fn is_offloaded(&self, orig: &CtTuple) -> bool {
        self.get(orig).is_some()
    }

    /// Number of offloaded connections.
    pub fn len(&self) -> usize {
        self.conns_v4.0.len() + self.conns_v6.0.len()
    }

    /// Flow map entries written by the manager: `(IPv4, IPv6)` directions (two per connection).
    /// Kept in memory so a status scrape does not walk the maps.
    pub fn directions(&self) -> (u64, u64) {
        (
            2 * self.conns_v4.0.len() as u64,
            2 * self.conns_v6.0.len() as u64,
        )
    }

    /// True when nothing is offloaded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn get(&self, orig: &CtTuple) -> Option<Stored<CtTuple>> {
        match orig.src {
            IpAddr::V4(_) => self.conns_v4.get(orig),
            IpAddr::V6(_) => self.conns_v6.get(orig),
        }
    }

    fn insert(&mut self, orig: &CtTuple, s: &Stored<CtTuple>) {
        let (old, stored) = match orig.src {
            IpAddr::V4(_) => self.conns_v4.insert(orig, s),
            IpAddr::V6(_) => self.conns_v6.insert(orig, s),
        };
        if let Some(old) = old {
            self.addresses.remove(orig, &old.reply);
        }
        if stored {
            self.addresses.add(orig, &s.reply);
        }
    }

    fn take(&mut self, orig: &CtTuple) -> Option<Stored<CtTuple>> {
        let old = match orig.src {
            IpAddr::V4(_) => self.conns_v4.remove(orig),
            IpAddr::V6(_) => self.conns_v6.remove(orig),
        };
        if let Some(old) = &old {
            self.addresses.remove(orig, &old.reply);
        }
        old
    }

    /// Whether an offloaded connection's route answers depend on an address from `first` to
    /// `last` (its source, NAT address or remote end; same family).
    pub fn uses_addresses_in(&self, first: IpAddr, last: IpAddr) -> bool {
        self.addresses.any_in(first, last)
    }

    fn stored(&self) -> impl Iterator<Item = (CtTuple, Stored<CtTuple>)> + '_ {
        self.conns_v4.iter().chain(self.conns_v6.iter())
    }

    /// Counters.
    pub fn stats(&self) -> &ManagerStats {
        &self.stats
    }

    /// The offloaded connections (built on the fly from what the manager keeps).
    pub fn conns(&self) -> impl Iterator<Item = Offloaded> + '_ {
        self.stored()
            .map(|(orig, s)| s.offloaded(orig, self.ledger.carried(&orig)))
    }

    /// Conntrack destroyed the connection: forget it entirely (its hosts' counters in
    /// `HOST_TRAFFIC` have its packets already). Returns whether it was offloaded.
    pub fn forget(&mut self, orig: &CtTuple, table: &mut impl FlowTable) -> bool {
        self.parked.remove(orig);
        self.held_counters.remove(orig);
        // Its entries' counters are of no use any more: not read.
        let was = self.take_back(orig, table, false);
        self.ledger.close(orig);
        was
    }

    /// Number of parked connections (offloadable by conntrack, waiting for a usable path).
    pub fn parked_len(&self) -> usize {
        self.parked.len()
    }

    /// Takes a connection back from the fast path. Returns whether it was offloaded.
    pub fn remove(&mut self, orig: &CtTuple, table: &mut impl FlowTable) -> bool {
        // The connection lives on: what its entries counted stays with it (it may be
        // offloaded again, with new entries).
        self.take_back(orig, table, true)
    }

    /// [`FlowManager::remove`], keeping what the entries counted when `keep_counts` (two map
    /// reads).
    fn take_back(&mut self, orig: &CtTuple, table: &mut impl FlowTable, keep_counts: bool) -> bool {
        let Some(conn) = self.take(orig) else {
            return false;
        };
        let plan = Plan::new(
            orig,
            &conn.reply,
            conn.ingress[0],
            conn.ingress[1],
            conn.awaiting_traffic,
        );
        if keep_counts {
            self.ledger.carry(*orig, read_traffic(table, &plan.keys));
        }
        remove_entries(table, &plan.keys, &plan.arms);
        self.stats.removed_total += 1;
        true
    }
}

pub mod accounting;
mod addresses;
pub mod armed;
pub mod conntrack;
pub mod dscp_rewrite;
#[cfg(test)]
pub(crate) mod fake;
pub mod flow_match;
mod held;
mod keepalive;
mod map_entries;
pub mod per_packet;
mod resync;
pub mod rule_origin;
pub mod rule_reach;
mod skip;
mod stored;
#[cfg(test)]
mod tests;
mod upsert;
pub mod verdict_expiry;
