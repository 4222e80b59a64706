//! Flow map entries of the fixtures: a direction's key and value, with NAT, DSCP/TTL and the
//! ruleset generation it is armed with.

use std::net::IpAddr;

use xdp_router_common::{
    FLOW_F_REPLY, FlowKeyV4, FlowKeyV6, FlowV4, FlowV6, HOST_SLOT_FIRST,
    checksum::{nat_diff_v4, nat_diff_v6},
};

use crate::packet::{Spec, Transport};

/// One flow map entry.
#[derive(Clone, Copy, Debug)]
pub enum FlowEntry {
    /// An IPv4 flow direction.
    V4(FlowKeyV4, FlowV4),
    /// An IPv6 flow direction.
    V6(FlowKeyV6, FlowV6),
}

/// A port as the raw network-order `u16` the maps hold.
pub fn raw_port(p: u16) -> u16 {
    p.to_be()
}

/// An IPv4 address as the raw network-order `u32` the maps hold.
pub fn raw_v4(a: IpAddr) -> u32 {
    match a {
        IpAddr::V4(a) => u32::from_ne_bytes(a.octets()),
        IpAddr::V6(a) => panic!("{a} is not IPv4"),
    }
}

/// An IPv6 address as the four raw network-order words the maps hold.
pub fn raw_v6(a: IpAddr) -> [u32; 4] {
    match a {
        IpAddr::V6(a) => {
            let o = a.octets();
            std::array::from_fn(|i| {
                u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
            })
        }
        IpAddr::V4(a) => panic!("{a} is not IPv6"),
    }
}

/// The flow entry the daemon would write for packets like `pkt` arriving on `ingress`, to be
/// translated to `new_src` → `new_dst` (the same as the packet's for no NAT).
pub fn flow(
    ingress: u32,
    pkt: &Spec,
    (new_src, new_sport): (IpAddr, u16),
    (new_dst, new_dport): (IpAddr, u16),
    reply: bool,
) -> FlowEntry {
    let proto = match pkt.transport {
        Transport::Tcp(_) => 6,
        Transport::Udp => 17,
    };
    let flags = if reply { FLOW_F_REPLY } else { 0 };
    let (sport, dport) = (raw_port(pkt.sport), raw_port(pkt.dport));
    let (nsport, ndport) = (raw_port(new_sport), raw_port(new_dport));
    match pkt.src {
        IpAddr::V4(_) => {
            let key = FlowKeyV4 {
                ifindex: ingress,
                src_be: raw_v4(pkt.src),
                dst_be: raw_v4(pkt.dst),
                sport_be: sport,
                dport_be: dport,
                proto,
                _pad: [0; 3],
            };
            let (l3, l4) = nat_diff_v4(
                key.src_be,
                key.dst_be,
                sport,
                dport,
                raw_v4(new_src),
                raw_v4(new_dst),
                nsport,
                ndport,
            );
            FlowEntry::V4(
                key,
                FlowV4 {
                    new_src_be: raw_v4(new_src),
                    new_dst_be: raw_v4(new_dst),
                    new_sport_be: nsport,
                    new_dport_be: ndport,
                    flags,
                    l3_csum_diff: l3,
                    l4_csum_diff: l4,
                    armed_generation: ARMED,
                    host_slots: HOST_SLOTS,
                    ..Default::default()
                },
            )
        }
        IpAddr::V6(_) => {
            let key = FlowKeyV6 {
                ifindex: ingress,
                src_be: raw_v6(pkt.src),
                dst_be: raw_v6(pkt.dst),
                sport_be: sport,
                dport_be: dport,
                proto,
                _pad: [0; 3],
            };
            let l4 = nat_diff_v6(
                key.src_be,
                key.dst_be,
                sport,
                dport,
                raw_v6(new_src),
                raw_v6(new_dst),
                nsport,
                ndport,
            );
            FlowEntry::V6(
                key,
                FlowV6 {
                    new_src_be: raw_v6(new_src),
                    new_dst_be: raw_v6(new_dst),
                    new_sport_be: nsport,
                    new_dport_be: ndport,
                    flags,
                    l4_csum_diff: l4,
                    armed_generation: ARMED,
                    host_slots: HOST_SLOTS,
                    ..Default::default()
                },
            )
        }
    }
}

impl FlowEntry {
    /// The entry with the DSCP the TC arming program recorded (`kernel_dscp`).
    pub fn with_kernel_dscp(self, kernel_dscp: u32) -> FlowEntry {
        match self {
            FlowEntry::V4(k, v) => FlowEntry::V4(k, FlowV4 { kernel_dscp, ..v }),
            FlowEntry::V6(k, v) => FlowEntry::V6(k, FlowV6 { kernel_dscp, ..v }),
        }
    }

    /// The entry with this `kernel_ttl` (`FLOW_TTL_KNOWN | ttl`, as the TC arming program
    /// records the TTL / hop limit the kernel sent the direction out with).
    pub fn with_kernel_ttl(self, kernel_ttl: u32) -> FlowEntry {
        match self {
            FlowEntry::V4(k, v) => FlowEntry::V4(k, FlowV4 { kernel_ttl, ..v }),
            FlowEntry::V6(k, v) => FlowEntry::V6(k, FlowV6 { kernel_ttl, ..v }),
        }
    }

    /// The entry with the time the TC arming program last armed it (`armed_at`, in verdict
    /// ticks).
    pub fn armed_at(self, armed_at: u32) -> FlowEntry {
        match self {
            FlowEntry::V4(k, v) => FlowEntry::V4(k, FlowV4 { armed_at, ..v }),
            FlowEntry::V6(k, v) => FlowEntry::V6(k, FlowV6 { armed_at, ..v }),
        }
    }

    /// The entry with `armed_generation` and `fib_mark` as the TC arming program would have
    /// left them.
    pub fn armed(self, generation: u32, mark: u32) -> FlowEntry {
        match self {
            FlowEntry::V4(k, v) => FlowEntry::V4(
                k,
                FlowV4 {
                    armed_generation: generation,
                    fib_mark: mark,
                    ..v
                },
            ),
            FlowEntry::V6(k, v) => FlowEntry::V6(
                k,
                FlowV6 {
                    armed_generation: generation,
                    fib_mark: mark,
                    ..v
                },
            ),
        }
    }
}

/// `[sender, receiver]` `HOST_TRAFFIC` slots of every fixture flow direction: each packet
/// it forwards counts for two LAN hosts (checked by the runner).
pub const HOST_SLOTS: [u32; 2] = [HOST_SLOT_FIRST, HOST_SLOT_FIRST + 1];

/// The ruleset generation the fixtures' `SETTINGS` hold, and the one their flows are armed
/// with (as if the kernel had forwarded a packet of each under the current rules).
pub const ARMED: u32 = 1;

/// A flow that forwards `pkt` unchanged (routing only).
pub fn routed(ingress: u32, pkt: &Spec, reply: bool) -> FlowEntry {
    flow(
        ingress,
        pkt,
        (pkt.src, pkt.sport),
        (pkt.dst, pkt.dport),
        reply,
    )
}
