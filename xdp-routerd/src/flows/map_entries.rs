//! The map entries of one connection: a flow direction per way (keyed by ingress interface,
//! with its NAT rewrite and checksum differences) and its arming index entry (written once the
//! connection is marked liberal), built as a [`Plan`], written and removed through
//! [`FlowTable`].

use std::net::IpAddr;

use aya::maps::MapError;
use xdp_router_common::{
    ArmKeyV4, ArmKeyV6, FLOW_F_AWAITING_TRAFFIC, FLOW_F_REPLY, FibCache, FlowCounters, FlowKeyV4,
    FlowKeyV6, FlowV4, FlowV6, HOST_SLOT_NONE,
    checksum::{nat_diff_v4, nat_diff_v6},
};

use super::accounting::{DirTraffic, HostSlots, fastpath};
use super::conntrack::CtTuple;
use super::{FlowTable, Skip};

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

/// Removes a connection's flow entries and their arming index entries.
pub(super) fn remove_entries(table: &mut impl FlowTable, keys: &[DirKey; 2], arms: &[ArmKey; 2]) {
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

/// What the fast path forwarded in a connection's `[original, reply]` flow entries (nothing
/// for a missing one).
pub(super) fn read_traffic(table: &impl FlowTable, keys: &[DirKey; 2]) -> DirTraffic {
    fastpath(keys.map(|key| match key {
        DirKey::V4(k) => table.get_v4(&k).map(|v| v.counters),
        DirKey::V6(k) => table.get_v6(&k).map(|v| v.counters),
    }))
}

/// The two map entries of a connection, each with its arming index key.
pub(super) enum PlanValues {
    V4([(FlowKeyV4, FlowV4, ArmKeyV4); 2]),
    V6([(FlowKeyV6, FlowV6, ArmKeyV6); 2]),
}

pub(super) struct Plan {
    /// `[original, reply]` ingress interfaces.
    pub(super) ingress: [u32; 2],
    pub(super) keys: [DirKey; 2],
    pub(super) arms: [ArmKey; 2],
    pub(super) values: PlanValues,
    /// A connection found at the daemon's start, awaiting traffic (`FLOW_F_AWAITING_TRAFFIC`):
    /// its arming index entries are not written (nothing may arm it), only its flow entries,
    /// where the fast path finds its packets and records the connection for the keep-alive.
    pub(super) awaiting_traffic: bool,
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
    /// Awaiting traffic (`FLOW_F_AWAITING_TRAFFIC`).
    awaiting_traffic: bool,
}

impl Plan {
    /// The entries of a connection with these tuples and `[original, reply]` ingresses;
    /// `awaiting_traffic`: a connection found at the daemon's start that has carried no traffic
    /// since, whose directions the kernel must not arm yet (`FLOW_F_AWAITING_TRAFFIC`).
    pub(super) fn new(
        orig: &CtTuple,
        reply: &CtTuple,
        ingress_orig: u32,
        ingress_reply: u32,
        awaiting_traffic: bool,
    ) -> Plan {
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
                awaiting_traffic,
            },
            Dir {
                ifindex: ingress_reply,
                from: reply,
                to_src: orig.dst,
                to_sport: orig.dport,
                to_dst: orig.src,
                to_dport: orig.sport,
                reply: true,
                awaiting_traffic,
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
                    awaiting_traffic,
                }
            }
            _ => {
                let [a, b] = dirs.map(|d| v6_entry(&d));
                Plan {
                    ingress: [ingress_orig, ingress_reply],
                    keys: [DirKey::V6(a.0), DirKey::V6(b.0)],
                    arms: [ArmKey::V6(a.2), ArmKey::V6(b.2)],
                    values: PlanValues::V6([a, b]),
                    awaiting_traffic,
                }
            }
        }
    }

    pub(super) fn write(&self, table: &mut impl FlowTable) -> Result<(), Skip> {
        // Flow entries first (unarmed), then the index that lets the kernel arm them.
        let res = match &self.values {
            PlanValues::V4(es) => es
                .iter()
                .try_for_each(|(k, v, _)| table.insert_v4(k, v))
                .and_then(|()| self.write_arms(table)),
            PlanValues::V6(es) => es
                .iter()
                .try_for_each(|(k, v, _)| table.insert_v6(k, v))
                .and_then(|()| self.write_arms(table)),
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

impl Plan {
    /// Has the entries count their packets for the connection's LAN hosts (`hosts`:
    /// `[originator, responder]` slots): the originator sends the original direction and
    /// receives the reply direction, the responder the other way round.
    pub(super) fn count_for(mut self, hosts: HostSlots) -> Plan {
        let [originator, responder] = hosts;
        let slots = [[originator, responder], [responder, originator]];
        match &mut self.values {
            PlanValues::V4(es) => {
                for ((_, v, _), s) in es.iter_mut().zip(slots) {
                    v.host_slots = s;
                }
            }
            PlanValues::V6(es) => {
                for ((_, v, _), s) in es.iter_mut().zip(slots) {
                    v.host_slots = s;
                }
            }
        }
        self
    }

    /// The arming index entries of both directions (none while awaiting traffic).
    pub(super) fn write_arms(&self, table: &mut impl FlowTable) -> Result<(), MapError> {
        if self.awaiting_traffic {
            return Ok(());
        }
        match &self.values {
            PlanValues::V4(es) => es
                .iter()
                .try_for_each(|(k, _, a)| table.insert_arm_v4(a, k)),
            PlanValues::V6(es) => es
                .iter()
                .try_for_each(|(k, _, a)| table.insert_arm_v6(a, k)),
        }
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
pub(super) fn words_to_bytes(w: [u32; 4]) -> [u8; 16] {
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
    let reply = if d.reply { FLOW_F_REPLY } else { 0 };
    let awaiting_traffic = if d.awaiting_traffic {
        FLOW_F_AWAITING_TRAFFIC
    } else {
        0
    };
    reply | awaiting_traffic
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
        counters: FlowCounters::default(),
        fib: FibCache::default(),
        // Unarmed: the kernel forwards the next packet first.
        armed_generation: 0,
        armed_at: 0,
        fib_mark: 0,
        kernel_dscp: 0,
        kernel_ttl: 0,
        // Set by `Plan::count_for` when the connection is offloaded.
        host_slots: [HOST_SLOT_NONE; 2],
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
        counters: FlowCounters::default(),
        fib: FibCache::default(),
        // Unarmed: the kernel forwards the next packet first.
        armed_generation: 0,
        armed_at: 0,
        fib_mark: 0,
        kernel_dscp: 0,
        kernel_ttl: 0,
        // Set by `Plan::count_for` when the connection is offloaded.
        host_slots: [HOST_SLOT_NONE; 2],
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
