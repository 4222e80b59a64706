//! Where conntrack entries become fast-path flows.
//!
//! [`FlowManager`] decides, for each conntrack entry, whether it may be offloaded and with which
//! map entries (one per direction, keyed by ingress interface), writes them through the
//! [`FlowTable`] trait and removes them when conntrack or the routing says so. It is pure
//! bookkeeping over two small traits so it can be unit-tested with in-memory fakes.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::{Duration, Instant},
};

use tracing::warn;

use aya::maps::MapError;
use xdp_router_common::{
    ArmKeyV4, ArmKeyV6, FLOW_F_REPLY, FibCache, FlowCounters, FlowKeyV4, FlowKeyV6, FlowV4, FlowV6,
    checksum::{nat_diff_v4, nat_diff_v6},
};

use addresses::Addresses;
use conntrack::{CtEntry, CtStatus, CtTuple, IPPROTO_TCP, tcp_state};

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

/// Why a conntrack entry is not (or no longer) offloaded, besides conntrack's own reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Skip {
    /// Conntrack state does not allow it (not established, helper, protocol…).
    NotEstablished,
    /// One endpoint is not reached through a managed interface (or is the router itself).
    PathNotManaged,
    /// The SNAT address is no longer an address of this router.
    NatAddressGone,
    /// The flow map is full; the connection stays in the kernel.
    TableFull,
    /// Another map error.
    MapError,
}

impl Skip {
    /// Stable name for logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Skip::NotEstablished => "not_established",
            Skip::PathNotManaged => "path_not_managed",
            Skip::NatAddressGone => "nat_address_gone",
            Skip::TableFull => "flow_table_full",
            Skip::MapError => "map_error",
        }
    }

    /// Every reason.
    pub const ALL: [Skip; 5] = [
        Skip::NotEstablished,
        Skip::PathNotManaged,
        Skip::NatAddressGone,
        Skip::TableFull,
        Skip::MapError,
    ];

    /// The reason called `name`, if any.
    pub fn from_name(name: &str) -> Option<Skip> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`, not `write_str`: tables align names with `{:<28}`.
        f.pad(self.name())
    }
}

/// Serialized as its stable name (the `reason` label of `connections_skipped`).
impl serde::Serialize for Skip {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Skip {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Skip::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown skip reason {name:?}")))
    }
}

/// The map key of one flow direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirKey {
    V4(FlowKeyV4),
    V6(FlowKeyV6),
}

/// The arming index key of one flow direction (its tuple as the kernel sends it out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArmKey {
    V4(ArmKeyV4),
    V6(ArmKeyV6),
}

/// One offloaded connection as [`FlowManager::conns`] shows it: the conntrack entry (as far as
/// the manager keeps it, see [`Stored`]) and both directions' keys.
#[derive(Debug, Clone)]
pub struct Offloaded {
    /// The conntrack entry: tuples, status, mark and zone as last seen; TCP ones are
    /// ESTABLISHED (otherwise they would not be offloaded); no id, timeout or TCP flags.
    pub entry: CtEntry,
    /// `[original, reply]` map keys.
    pub keys: [DirKey; 2],
    /// `[original, reply]` arming index keys.
    pub arms: [ArmKey; 2],
}

/// A connection's tuple, packed per family: the manager keeps one per direction and connection,
/// so its size is most of the daemon's memory per flow (`CtTuple` with two `IpAddr` is 40
/// bytes, [`TupleV4`] 14).
trait Packed: Copy + Eq + std::hash::Hash {
    fn pack(t: &CtTuple) -> Option<Self>;
    fn unpack(&self) -> CtTuple;
}

/// An IPv4 [`CtTuple`], packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct TupleV4 {
    src: [u8; 4],
    dst: [u8; 4],
    sport: u16,
    dport: u16,
    proto: u8,
}

/// An IPv6 [`CtTuple`], packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct TupleV6 {
    src: [u8; 16],
    dst: [u8; 16],
    sport: u16,
    dport: u16,
    proto: u8,
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
/// connection on the same tuple. 32 bytes for IPv4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stored<T> {
    reply: T,
    /// The low 16 bits of the conntrack entry's `CTA_ID` (0: not known), enough to tell a
    /// later connection on the same tuple from this one but for one case in 65,536 (then it
    /// is taken for the same one, as without ids); 16 bits keep the entry at 32 bytes.
    id: u16,
    /// `CTA_STATUS` bits as last seen (the kernel's `IPS_*` bits end at 15).
    status: u16,
    mark: u32,
    zone: u16,
    /// `[original, reply]` ingress interfaces.
    ingress: [u32; 2],
}

/// The offloaded connections of one family, by original tuple.
struct Conns<T>(HashMap<T, Stored<T>>);

impl<T> Default for Conns<T> {
    fn default() -> Self {
        Conns(HashMap::new())
    }
}

impl<T: Packed> Conns<T> {
    fn get(&self, orig: &CtTuple) -> Option<Stored<CtTuple>> {
        let s = self.0.get(&T::pack(orig)?)?;
        Some(Stored {
            reply: s.reply.unpack(),
            id: s.id,
            status: s.status,
            mark: s.mark,
            zone: s.zone,
            ingress: s.ingress,
        })
    }
    /// Stores `s` under `orig`; returns what it replaced, and whether it was stored (both
    /// tuples of this family).
    fn insert(&mut self, orig: &CtTuple, s: &Stored<CtTuple>) -> (Option<Stored<CtTuple>>, bool) {
        let (Some(k), Some(reply)) = (T::pack(orig), T::pack(&s.reply)) else {
            return (None, false);
        };
        let old = self.0.insert(
            k,
            Stored {
                reply,
                id: s.id,
                status: s.status,
                mark: s.mark,
                zone: s.zone,
                ingress: s.ingress,
            },
        );
        let old = old.map(|s| Stored {
            reply: s.reply.unpack(),
            id: s.id,
            status: s.status,
            mark: s.mark,
            zone: s.zone,
            ingress: s.ingress,
        });
        (old, true)
    }
    fn remove(&mut self, orig: &CtTuple) -> Option<Stored<CtTuple>> {
        let s = self.0.remove(&T::pack(orig)?)?;
        Some(Stored {
            reply: s.reply.unpack(),
            id: s.id,
            status: s.status,
            mark: s.mark,
            zone: s.zone,
            ingress: s.ingress,
        })
    }
    fn iter(&self) -> impl Iterator<Item = (CtTuple, Stored<CtTuple>)> + '_ {
        self.0.iter().map(|(k, s)| {
            (
                k.unpack(),
                Stored {
                    reply: s.reply.unpack(),
                    id: s.id,
                    status: s.status,
                    mark: s.mark,
                    zone: s.zone,
                    ingress: s.ingress,
                },
            )
        })
    }
}

/// What [`Stored`] keeps of a `CTA_ID`.
fn short_id(id: u32) -> u16 {
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
    fn is_same_conn(&self, entry: &CtEntry) -> bool {
        self.id == 0 || entry.id.is_none_or(|id| short_id(id) == self.id)
    }

    /// The conntrack entry as far as it is kept (see [`Offloaded::entry`]).
    fn entry(&self, orig: CtTuple) -> CtEntry {
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

    fn offloaded(&self, orig: CtTuple) -> Offloaded {
        let plan = Plan::new(&orig, &self.reply, self.ingress[0], self.ingress[1]);
        Offloaded {
            entry: self.entry(orig),
            keys: plan.keys,
            arms: plan.arms,
        }
    }
}

/// A connection the keep-alive should refresh: what a conntrack update needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Active {
    /// Original tuple.
    pub orig: CtTuple,
    /// Conntrack zone.
    pub zone: u16,
}

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
}

/// How often a full flow map is reported in the log, at most.
pub const TABLE_FULL_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Rate limit of a repeated warning: the first occurrence is reported at once, the ones after
/// it together once per [`TABLE_FULL_LOG_INTERVAL`].
#[derive(Debug, Default)]
struct OncePerInterval {
    last: Option<Instant>,
    pending: u64,
}

impl OncePerInterval {
    /// Counts one occurrence at `now`; returns how many to report when a report is due.
    fn note(&mut self, now: Instant) -> Option<u64> {
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

impl FlowManager {
    /// An empty manager.
    pub fn new() -> FlowManager {
        FlowManager::default()
    }

    /// Sets the managed interfaces (ifindex → name) that flows may enter or leave through.
    pub fn set_managed(&mut self, managed: BTreeMap<u32, String>) {
        self.managed = managed;
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
        self.stored().map(|(orig, s)| s.offloaded(orig))
    }

    /// Offloads `entry` if conntrack and the routing allow it, else makes sure it is not.
    pub fn upsert(
        &mut self,
        entry: CtEntry,
        table: &mut impl FlowTable,
        paths: &impl PathOracle,
    ) -> Upsert {
        let plan = match self.plan(&entry, paths) {
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
        };
        if let Some(existing) = self.get(&entry.orig)
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
    /// first, as in the dump).
    pub fn upsert_many(
        &mut self,
        entries: &[CtEntry],
        table: &mut impl FlowTable,
        paths: &impl PathOracle,
    ) {
        let mut fresh: Vec<(&CtEntry, Plan)> = Vec::with_capacity(entries.len());
        let mut rest: Vec<&CtEntry> = Vec::new();
        let mut seen = HashSet::with_capacity(entries.len());
        for e in entries {
            if self.get(&e.orig).is_none()
                && seen.insert(e.orig)
                && let Ok(plan) = self.plan(e, paths)
            {
                fresh.push((e, plan));
            } else {
                rest.push(e);
            }
        }
        let (mut f4, mut a4, mut f6, mut a6) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (_, plan) in &fresh {
            match &plan.values {
                PlanValues::V4(es) => {
                    f4.extend(es.iter().map(|(k, v, _)| (*k, *v)));
                    a4.extend(es.iter().map(|(k, _, a)| (*a, *k)));
                }
                PlanValues::V6(es) => {
                    f6.extend(es.iter().map(|(k, v, _)| (*k, *v)));
                    a6.extend(es.iter().map(|(k, _, a)| (*a, *k)));
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

    /// Remembers `entry` for a later retry when `skip` may change with the routing.
    fn park(&mut self, entry: CtEntry, skip: Skip) {
        match skip {
            Skip::PathNotManaged | Skip::NatAddressGone | Skip::TableFull => {
                if self.parked.len() < MAX_PARKED || self.parked.contains_key(&entry.orig) {
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
        self.plan(entry, paths).is_ok_and(|plan| {
            self.get(&entry.orig).is_none_or(|c| {
                c.reply != entry.reply || c.ingress != plan.ingress || !c.is_same_conn(entry)
            })
        })
    }

    /// Whether [`FlowManager::upsert`] would offload `entry` were it not offloaded yet (after
    /// a DESTROY of the same tuple earlier in a batch: a new connection on the same ports).
    pub fn would_add_anew(&self, entry: &CtEntry, paths: &impl PathOracle) -> bool {
        self.plan(entry, paths).is_ok()
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

    /// Conntrack destroyed the connection: forget it entirely. Returns whether it was offloaded.
    pub fn forget(&mut self, orig: &CtTuple, table: &mut impl FlowTable) -> bool {
        self.parked.remove(orig);
        self.remove(orig, table)
    }

    /// Number of parked connections (offloadable by conntrack, waiting for a usable path).
    pub fn parked_len(&self) -> usize {
        self.parked.len()
    }

    /// Takes a connection back from the fast path. Returns whether it was offloaded.
    pub fn remove(&mut self, orig: &CtTuple, table: &mut impl FlowTable) -> bool {
        let Some(conn) = self.take(orig) else {
            return false;
        };
        let plan = Plan::new(orig, &conn.reply, conn.ingress[0], conn.ingress[1]);
        remove_entries(table, &plan.keys, &plan.arms);
        self.stats.removed_total += 1;
        true
    }

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

    /// Makes the offloaded set match a fresh conntrack dump (after start or a netlink overrun).
    /// Returns `(removed, upserted)`.
    pub fn resync(
        &mut self,
        dump: Vec<CtEntry>,
        table: &mut impl FlowTable,
        paths: &impl PathOracle,
    ) -> (usize, usize) {
        // At start nothing is known yet: no set of a million tuples to build.
        let removed = match self.tuples_to_check(&dump) {
            Some(present) => self.remove_absent(&present, table),
            None => 0,
        };
        let n = dump.len();
        self.reserve_for(&dump);
        for e in dump {
            self.upsert(e, table, paths);
        }
        release_freed_memory();
        (removed, n)
    }

    /// The original tuples of `dump` for [`remove_absent`](Self::remove_absent), or `None`
    /// when nothing is offloaded or parked (at start: no set of a million tuples to build).
    pub fn tuples_to_check(&self, dump: &[CtEntry]) -> Option<HashSet<CtTuple>> {
        (!self.is_empty() || !self.parked.is_empty()).then(|| dump.iter().map(|e| e.orig).collect())
    }

    /// Sizes the connection tables once for the entries of a dump about to be applied, instead
    /// of doubling through it: each doubling leaves the previous table behind as freed heap
    /// the process keeps.
    pub fn reserve_for(&mut self, dump: &[CtEntry]) {
        let v4 = dump.iter().filter(|e| e.orig.is_ipv4()).count();
        self.conns_v4
            .0
            .reserve(v4.saturating_sub(self.conns_v4.0.len()));
        self.conns_v6
            .0
            .reserve((dump.len() - v4).saturating_sub(self.conns_v6.0.len()));
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
            self.remove(k, table);
        }
        self.parked.retain(|k, _| present.contains(k));
        stale.len()
    }

    /// Connections that carried fast-path traffic since the previous call (their conntrack
    /// timeout must be refreshed), and starts the next pass at `now_ns`. Costs what the active
    /// connections cost: the datapath records them (see [`FlowTable::take_active`]); entries
    /// for connections no longer offloaded are dropped.
    pub fn active_since_last_pass(
        &mut self,
        table: &mut impl FlowTable,
        now_ns: u64,
    ) -> Vec<Active> {
        let (v4, v6) = table.take_active(now_ns);
        let v4 = v4.iter().map(|k| TupleV4 {
            src: k.src_be.to_ne_bytes(),
            dst: k.dst_be.to_ne_bytes(),
            sport: u16::from_be(k.sport_be),
            dport: u16::from_be(k.dport_be),
            proto: k.proto,
        });
        let v6 = v6.iter().map(|k| TupleV6 {
            src: words_to_bytes(k.src_be),
            dst: words_to_bytes(k.dst_be),
            sport: u16::from_be(k.sport_be),
            dport: u16::from_be(k.dport_be),
            proto: k.proto,
        });
        let v4 = v4.filter_map(|t| {
            let s = self.conns_v4.0.get(&t)?;
            Some(Active {
                orig: t.unpack(),
                zone: s.zone,
            })
        });
        let v6 = v6.filter_map(|t| {
            let s = self.conns_v6.0.get(&t)?;
            Some(Active {
                orig: t.unpack(),
                zone: s.zone,
            })
        });
        v4.chain(v6).collect()
    }

    fn plan(&self, entry: &CtEntry, paths: &impl PathOracle) -> Result<Plan, Skip> {
        entry.offload_decision().map_err(|_| Skip::NotEstablished)?;
        let (orig, reply) = (&entry.orig, &entry.reply);
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
        Ok(Plan::new(orig, reply, ingress_orig, ingress_reply))
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

/// Removes a connection's flow entries and their arming index entries.
fn remove_entries(table: &mut impl FlowTable, keys: &[DirKey; 2], arms: &[ArmKey; 2]) {
    for arm in arms {
        match arm {
            ArmKey::V4(a) => table.remove_arm_v4(a),
            ArmKey::V6(a) => table.remove_arm_v6(a),
        }
    }
    for key in keys {
        match key {
            DirKey::V4(k) => table.remove_v4(k),
            DirKey::V6(k) => table.remove_v6(k),
        }
    }
}

/// The two map entries of a connection, each with its arming index key.
enum PlanValues {
    V4([(FlowKeyV4, FlowV4, ArmKeyV4); 2]),
    V6([(FlowKeyV6, FlowV6, ArmKeyV6); 2]),
}

struct Plan {
    /// `[original, reply]` ingress interfaces.
    ingress: [u32; 2],
    keys: [DirKey; 2],
    arms: [ArmKey; 2],
    values: PlanValues,
}

/// One direction: packets `from` arrive on `ifindex` and leave rewritten as `to`.
struct Dir<'a> {
    ifindex: u32,
    from: &'a CtTuple,
    to_src: IpAddr,
    to_sport: u16,
    to_dst: IpAddr,
    to_dport: u16,
    reply: bool,
}

impl Plan {
    fn new(orig: &CtTuple, reply: &CtTuple, ingress_orig: u32, ingress_reply: u32) -> Plan {
        // Original direction A:a -> B:b leaves as A':a' -> B':b' where the reply tuple is
        // B':b' -> A':a'; the reply direction is the mirror image.
        let dirs = [
            Dir {
                ifindex: ingress_orig,
                from: orig,
                to_src: reply.dst,
                to_sport: reply.dport,
                to_dst: reply.src,
                to_dport: reply.sport,
                reply: false,
            },
            Dir {
                ifindex: ingress_reply,
                from: reply,
                to_src: orig.dst,
                to_sport: orig.dport,
                to_dst: orig.src,
                to_dport: orig.sport,
                reply: true,
            },
        ];
        match (orig.src, orig.dst) {
            (IpAddr::V4(_), IpAddr::V4(_)) => {
                let [a, b] = dirs.map(|d| v4_entry(&d));
                Plan {
                    ingress: [ingress_orig, ingress_reply],
                    keys: [DirKey::V4(a.0), DirKey::V4(b.0)],
                    arms: [ArmKey::V4(a.2), ArmKey::V4(b.2)],
                    values: PlanValues::V4([a, b]),
                }
            }
            _ => {
                let [a, b] = dirs.map(|d| v6_entry(&d));
                Plan {
                    ingress: [ingress_orig, ingress_reply],
                    keys: [DirKey::V6(a.0), DirKey::V6(b.0)],
                    arms: [ArmKey::V6(a.2), ArmKey::V6(b.2)],
                    values: PlanValues::V6([a, b]),
                }
            }
        }
    }

    fn write(&self, table: &mut impl FlowTable) -> Result<(), Skip> {
        // Flow entries first (unarmed), then the index that lets the kernel arm them.
        let res = match &self.values {
            PlanValues::V4(es) => es
                .iter()
                .try_for_each(|(k, v, _)| table.insert_v4(k, v))
                .and_then(|()| {
                    es.iter()
                        .try_for_each(|(k, _, a)| table.insert_arm_v4(a, k))
                }),
            PlanValues::V6(es) => es
                .iter()
                .try_for_each(|(k, v, _)| table.insert_v6(k, v))
                .and_then(|()| {
                    es.iter()
                        .try_for_each(|(k, _, a)| table.insert_arm_v6(a, k))
                }),
        };
        res.map_err(|e| {
            // Undo a half-written connection.
            remove_entries(table, &self.keys, &self.arms);
            if is_full(&e) {
                Skip::TableFull
            } else {
                Skip::MapError
            }
        })
    }
}

fn is_full(e: &MapError) -> bool {
    matches!(e, MapError::SyscallError(s)
        if matches!(s.io_error.raw_os_error(), Some(libc::E2BIG) | Some(libc::ENOMEM) | Some(libc::ENOSPC)))
}

/// Raw (memory-order) representation of an IPv4 address, as the datapath reads it.
pub fn raw_v4(a: IpAddr) -> u32 {
    match a {
        IpAddr::V4(a) => u32::from_ne_bytes(a.octets()),
        IpAddr::V6(_) => 0,
    }
}

/// The bytes of an address in raw (memory-order) words, as [`raw_v6`] made them.
fn words_to_bytes(w: [u32; 4]) -> [u8; 16] {
    let mut o = [0; 16];
    for (chunk, word) in o.chunks_exact_mut(4).zip(w) {
        chunk.copy_from_slice(&word.to_ne_bytes());
    }
    o
}

/// Raw (memory-order) representation of an IPv6 address.
pub fn raw_v6(a: IpAddr) -> [u32; 4] {
    let o = match a {
        IpAddr::V6(a) => a.octets(),
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
    };
    core::array::from_fn(|i| {
        u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
    })
}

fn flags(d: &Dir<'_>) -> u32 {
    if d.reply { FLOW_F_REPLY } else { 0 }
}

fn v4_entry(d: &Dir<'_>) -> (FlowKeyV4, FlowV4, ArmKeyV4) {
    let key = FlowKeyV4 {
        ifindex: d.ifindex,
        src_be: raw_v4(d.from.src),
        dst_be: raw_v4(d.from.dst),
        sport_be: d.from.sport.to_be(),
        dport_be: d.from.dport.to_be(),
        proto: d.from.proto,
        _pad: [0; 3],
    };
    let (new_src, new_dst) = (raw_v4(d.to_src), raw_v4(d.to_dst));
    let (new_sport, new_dport) = (d.to_sport.to_be(), d.to_dport.to_be());
    let (l3, l4) = nat_diff_v4(
        key.src_be,
        key.dst_be,
        key.sport_be,
        key.dport_be,
        new_src,
        new_dst,
        new_sport,
        new_dport,
    );
    let value = FlowV4 {
        new_src_be: new_src,
        new_dst_be: new_dst,
        new_sport_be: new_sport,
        new_dport_be: new_dport,
        flags: flags(d),
        l3_csum_diff: l3,
        l4_csum_diff: l4,
        _pad: 0,
        counters: FlowCounters::default(),
        fib: FibCache::default(),
        // Unarmed: the kernel forwards the next packet first.
        armed_generation: 0,
        fib_mark: 0,
        kernel_dscp: 0,
        kernel_ttl: 0,
    };
    let arm = ArmKeyV4 {
        src_be: new_src,
        dst_be: new_dst,
        sport_be: new_sport,
        dport_be: new_dport,
        proto: key.proto,
        _pad: [0; 3],
    };
    (key, value, arm)
}

fn v6_entry(d: &Dir<'_>) -> (FlowKeyV6, FlowV6, ArmKeyV6) {
    let key = FlowKeyV6 {
        ifindex: d.ifindex,
        src_be: raw_v6(d.from.src),
        dst_be: raw_v6(d.from.dst),
        sport_be: d.from.sport.to_be(),
        dport_be: d.from.dport.to_be(),
        proto: d.from.proto,
        _pad: [0; 3],
    };
    let (new_src, new_dst) = (raw_v6(d.to_src), raw_v6(d.to_dst));
    let (new_sport, new_dport) = (d.to_sport.to_be(), d.to_dport.to_be());
    let l4 = nat_diff_v6(
        key.src_be,
        key.dst_be,
        key.sport_be,
        key.dport_be,
        new_src,
        new_dst,
        new_sport,
        new_dport,
    );
    let value = FlowV6 {
        new_src_be: new_src,
        new_dst_be: new_dst,
        new_sport_be: new_sport,
        new_dport_be: new_dport,
        flags: flags(d),
        l4_csum_diff: l4,
        _pad: 0,
        counters: FlowCounters::default(),
        fib: FibCache::default(),
        // Unarmed: the kernel forwards the next packet first.
        armed_generation: 0,
        fib_mark: 0,
        kernel_dscp: 0,
        kernel_ttl: 0,
    };
    let arm = ArmKeyV6 {
        src_be: new_src,
        dst_be: new_dst,
        sport_be: new_sport,
        dport_be: new_dport,
        proto: key.proto,
        _pad: [0; 3],
    };
    (key, value, arm)
}

mod addresses;
pub mod conntrack;
#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;
