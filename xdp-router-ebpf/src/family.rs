//! The address families, and what the pipeline does differently for each: the IP header (its
//! fields and checks), the DSCP, the pseudo-header, the addresses of the FIB lookup, the flow
//! and active maps with their keys, the translation and the rewrite. `flow.rs` runs one
//! pipeline for both through [`Family`]; every method is `#[inline(always)]`, so each family's
//! code is what a copy of the pipeline written for it would be.

use core::{mem::transmute, ptr::addr_of_mut};

use aya_ebpf::maps::HashMap;
use xdp_router_common::{
    FLOW_DSCP_KNOWN, FibCache, FlowCounters, FlowKeyV4, FlowKeyV6, FlowV4, FlowV6, Reason,
    checksum::{combine, diff16, diff32, pseudo_v4, pseudo_v6},
    parse::{IPV4_HLEN, IPV6_HLEN, Ipv4Fields, Ipv6Fields, L3, check_ipv4, check_ipv6},
};

use crate::{
    fib::{AF_INET, AF_INET6, NextHop},
    maps::{ACTIVE_V4, ACTIVE_V6, FLOWS_V4, FLOWS_V6},
    packet::{Packet, ptr_at_mut},
    parse::{EthHdr, Ipv4Hdr, Ipv6Hdr},
    rewrite::{self, L4, Nat},
    verify,
    words::{opaque_zero, pack16},
};

/// IPv4.
pub struct V4;

/// IPv6.
pub struct V6;

/// What the pipeline reads from a checked IP header; `A` is an address (raw words).
pub struct IpHeader<A> {
    /// Source address (network order).
    pub src: A,
    /// Destination address (network order).
    pub dst: A,
    /// Transport protocol (IPv4 protocol, IPv6 next header).
    pub proto: u8,
    /// TTL / hop limit as received.
    pub ttl: u8,
    /// `bpf_fib_lookup`'s TOS (IPv4) / flow information (IPv6) input, as the lookup takes it;
    /// a cached answer is valid only for the same.
    pub tos_flowinfo: u32,
    /// The whole datagram, header included, in host order (the lookup's MTU check).
    pub len: u16,
    /// Bytes of transport segment after the header.
    pub l4_len: usize,
}

/// An address family the pipeline forwards: what differs between the two beyond the names
/// of their types and maps ([`FlowMaps`]).
pub trait Family: FlowMaps {
    /// The IP header.
    type Hdr;
    /// Length of the IP header (without options or extension headers).
    const HLEN: usize;
    /// The family as the EtherType / PPP protocol is chosen by.
    const L3: L3;
    /// The family as `bpf_fib_lookup` takes it.
    const AF: u8 = match Self::L3 {
        L3::V4 => AF_INET,
        L3::V6 => AF_INET6,
    };

    /// The IP header `l2` bytes into the packet (with at most `ip_len_max` bytes of datagram
    /// there), checked as the kernel checks it before it forwards; or why the kernel must have
    /// the packet.
    fn header<P: Packet>(
        ctx: &P,
        l2: usize,
        ip_len_max: usize,
    ) -> Result<IpHeader<Self::Addr>, Reason>;

    /// The packet's DSCP.
    fn dscp(h: &IpHeader<Self::Addr>) -> u8;

    /// The sum of the transport checksum's pseudo-header.
    fn pseudo(h: &IpHeader<Self::Addr>) -> u64;

    /// An address as the four words of a `bpf_fib_lookup` address field.
    fn fib_addr(a: Self::Addr) -> [u32; 4];

    /// The flow map key of a packet.
    fn key(
        ifindex: u32,
        src: Self::Addr,
        dst: Self::Addr,
        sport: u16,
        dport: u16,
        proto: u8,
    ) -> Self::Key;

    /// The header checksum diff of the flow direction's address rewrite (0 for IPv6, which
    /// has no header checksum).
    fn l3_csum_diff(flow: *const Self::Flow) -> u32;

    /// The checksum diff a `CHECKSUM_COMPLETE` skb's sum needs after the rewrite of a packet
    /// with header `h` (`pseudo`: the address rewrite's diff, which the pseudo-header checksum
    /// helper took off the sum; `dscp` as for [`Family::rewrite`]): see
    /// `packet::L4ChecksumEdit::complete_fix`.
    fn complete_fix(h: &IpHeader<Self::Addr>, pseudo: u32, dscp: u32) -> u32;

    /// Rewrites a checked packet for forwarding (see `rewrite.rs`).
    /// `dscp`: `FLOW_DSCP_KNOWN | dscp` to set (see `flow::check_dscp`), or 0.
    fn rewrite<P: Packet>(
        eth: *mut EthHdr,
        ip: *mut Self::Hdr,
        l4: L4,
        nat: &Nat<Self::Addr>,
        hop: &NextHop,
        dscp: u32,
    );
}

impl Family for V4 {
    type Hdr = Ipv4Hdr;
    const HLEN: usize = IPV4_HLEN;
    const L3: L3 = L3::V4;

    #[inline(always)]
    fn header<P: Packet>(ctx: &P, l2: usize, ip_len_max: usize) -> Result<IpHeader<u32>, Reason> {
        let ip: *mut Ipv4Hdr = ptr_at_mut(ctx, l2)?;
        // SAFETY: bounds checked by ptr_at_mut; fields are copied out, no reference is kept.
        let (fields, tos, src, dst) = unsafe {
            (
                Ipv4Fields {
                    version_ihl: (*ip).version_ihl,
                    tot_len: (*ip).tot_len(),
                    frag_off: (*ip).frag_off(),
                    ttl: (*ip).ttl,
                    proto: (*ip).proto,
                    available: ip_len_max,
                },
                (*ip).tos,
                (*ip).src_be,
                (*ip).dst_be,
            )
        };
        check_ipv4(&fields)?;
        verify::ipv4_header_checksum(ctx, l2)?;
        Ok(IpHeader {
            src,
            dst,
            proto: fields.proto,
            ttl: fields.ttl,
            // The TOS byte goes where the union's first byte is.
            tos_flowinfo: u32::from_ne_bytes([tos, 0, 0, 0]),
            len: fields.tot_len,
            // check_ipv4: tot_len covers the header and the transport header.
            l4_len: fields.tot_len as usize - IPV4_HLEN,
        })
    }

    #[inline(always)]
    fn dscp(h: &IpHeader<u32>) -> u8 {
        let [tos, ..] = h.tos_flowinfo.to_ne_bytes();
        tos >> 2
    }

    #[inline(always)]
    fn pseudo(h: &IpHeader<u32>) -> u64 {
        pseudo_v4(h.src, h.dst, h.proto, h.l4_len as u16)
    }

    #[inline(always)]
    fn fib_addr(a: u32) -> [u32; 4] {
        [a, opaque_zero(), opaque_zero(), opaque_zero()]
    }

    #[inline(always)]
    fn key(ifindex: u32, src: u32, dst: u32, sport: u16, dport: u16, proto: u8) -> FlowKeyV4 {
        let words = [
            ifindex,
            src,
            dst,
            pack16(sport, dport),
            u32::from_ne_bytes([proto, 0, 0, 0]),
        ];
        // SAFETY: FlowKeyV4 is #[repr(C)], 20 bytes of integers without implicit padding
        // (ifindex, src, dst, sport+dport, proto+_pad), so these words are exactly its fields
        // in order.
        unsafe { transmute::<[u32; 5], FlowKeyV4>(words) }
    }

    #[inline(always)]
    fn l3_csum_diff(flow: *const FlowV4) -> u32 {
        // SAFETY: map value pointer from the kernel.
        unsafe { (*flow).l3_csum_diff }
    }

    #[inline(always)]
    fn complete_fix(_: &IpHeader<u32>, _: u32, _: u32) -> u32 {
        // The header checksum compensates every header change, and the helper's adjustment
        // of the sum for the pseudo-header is the IPv4 one.
        0
    }

    #[inline(always)]
    fn rewrite<P: Packet>(
        eth: *mut EthHdr,
        ip: *mut Ipv4Hdr,
        l4: L4,
        nat: &Nat<u32>,
        hop: &NextHop,
        dscp: u32,
    ) {
        rewrite::rewrite_v4::<P>(eth, ip, l4, nat, hop, dscp);
    }
}

impl Family for V6 {
    type Hdr = Ipv6Hdr;
    const HLEN: usize = IPV6_HLEN;
    const L3: L3 = L3::V6;

    #[inline(always)]
    fn header<P: Packet>(
        ctx: &P,
        l2: usize,
        ip_len_max: usize,
    ) -> Result<IpHeader<[u32; 4]>, Reason> {
        let ip: *mut Ipv6Hdr = ptr_at_mut(ctx, l2)?;
        // SAFETY: bounds checked by ptr_at_mut; fields are copied out, no reference is kept.
        let (fields, flowinfo, src, dst) = unsafe {
            (
                Ipv6Fields {
                    version_tc: (*ip).version_tc(),
                    payload_len: (*ip).payload_len(),
                    next_header: (*ip).next_header,
                    hop_limit: (*ip).hop_limit,
                    available: ip_len_max,
                },
                (*ip).flowinfo_be(),
                (*ip).src_be,
                (*ip).dst_be,
            )
        };
        check_ipv6(&fields)?;
        Ok(IpHeader {
            src,
            dst,
            proto: fields.next_header,
            ttl: fields.hop_limit,
            tos_flowinfo: flowinfo,
            len: fields.payload_len.wrapping_add(IPV6_HLEN as u16),
            l4_len: fields.payload_len as usize,
        })
    }

    #[inline(always)]
    fn dscp(h: &IpHeader<[u32; 4]>) -> u8 {
        // The top 6 bits of the traffic class, below the 4 version bits.
        (u32::from_be(h.tos_flowinfo) >> 22) as u8 & 0x3f
    }

    #[inline(always)]
    fn pseudo(h: &IpHeader<[u32; 4]>) -> u64 {
        pseudo_v6(h.src, h.dst, h.proto, h.l4_len as u16)
    }

    #[inline(always)]
    fn fib_addr(a: [u32; 4]) -> [u32; 4] {
        a
    }

    #[inline(always)]
    fn key(
        ifindex: u32,
        src: [u32; 4],
        dst: [u32; 4],
        sport: u16,
        dport: u16,
        proto: u8,
    ) -> FlowKeyV6 {
        let [s0, s1, s2, s3] = src;
        let [d0, d1, d2, d3] = dst;
        let ports = pack16(sport, dport);
        let proto_word = u32::from_ne_bytes([proto, 0, 0, 0]);
        let words = [ifindex, s0, s1, s2, s3, d0, d1, d2, d3, ports, proto_word];
        // SAFETY: FlowKeyV6 is #[repr(C)], 44 bytes of integers without implicit padding,
        // laid out as these words.
        unsafe { transmute::<[u32; 11], FlowKeyV6>(words) }
    }

    #[inline(always)]
    fn l3_csum_diff(_: *const FlowV6) -> u32 {
        0
    }

    #[inline(always)]
    fn complete_fix(h: &IpHeader<[u32; 4]>, pseudo: u32, dscp: u32) -> u32 {
        // The addresses changed in the header (the helper took their diff off the sum, as for
        // IPv4), and the hop limit (with the next header: one 16-bit word)...
        let mut fix = combine(
            pseudo,
            diff16(
                u16::from_ne_bytes([h.proto, h.ttl]),
                u16::from_ne_bytes([h.proto, h.ttl.wrapping_sub(1)]),
            ),
        );
        if dscp & FLOW_DSCP_KNOWN != 0 {
            // ...and the traffic class's DSCP, in the first word (version 6 above it).
            let old = u32::from_be(h.tos_flowinfo) | 0x6000_0000;
            let new = (old & !(0x3f << 22)) | ((dscp & 0x3f) << 22);
            fix = combine(fix, diff32(old.to_be(), new.to_be()));
        }
        fix
    }

    #[inline(always)]
    fn rewrite<P: Packet>(
        eth: *mut EthHdr,
        ip: *mut Ipv6Hdr,
        l4: L4,
        nat: &Nat<[u32; 4]>,
        hop: &NextHop,
        dscp: u32,
    ) {
        rewrite::rewrite_v6::<P>(eth, ip, l4, nat, hop, dscp);
    }
}

/// A family's flow and active maps, and the fields of their keys and values the pipeline
/// uses: `FlowKeyV4`/`FlowKeyV6` and `FlowV4`/`FlowV6` name them alike (at other offsets), so
/// [`flow_maps!`] implements this once for both.
pub trait FlowMaps {
    /// An address as raw 32-bit words in network order.
    type Addr: Copy;
    /// The flow maps' key.
    type Key: 'static;
    /// The flow map's value.
    type Flow: 'static;

    /// The offloaded flow directions (`FLOWS_V4`, `FLOWS_V6`).
    fn flows() -> &'static HashMap<Self::Key, Self::Flow>;
    /// The connections forwarded in this keep-alive pass (`ACTIVE_V4`, `ACTIVE_V6`).
    fn active() -> &'static HashMap<Self::Key, u8>;
    /// Turns the flow key of a direction translated by `nat` into its connection's active map
    /// key, in place: the original tuple without the ingress (for a `reply` direction the tuple
    /// it is rewritten to, swapped).
    fn to_active_key(key: &mut Self::Key, nat: &Nat<Self::Addr>, reply: bool);
    /// The flow direction's translation.
    fn nat(flow: *const Self::Flow) -> Nat<Self::Addr>;
    /// The rest of the flow value the pipeline checks and updates.
    fn fields(flow: *mut Self::Flow) -> FlowFields;
}

/// The fields of a flow value the pipeline checks and updates in place: its flags (copied) and
/// pointers into the live map value.
pub struct FlowFields {
    /// `FLOW_F_*`.
    pub flags: u32,
    /// What the TC arming program records (see `flow::check_armed`, `flow::check_dscp`,
    /// `flow::check_ttl`).
    /// `armed_generation` and `fib_mark`: one ordered word (see `order.rs`).
    pub arming: *mut u64,
    pub armed_at: *mut u32,
    pub kernel_dscp: *mut u32,
    pub kernel_ttl: *mut u32,
    /// The cached FIB answer.
    pub fib: *mut FibCache,
    /// Packets, bytes, last seen.
    pub counters: *mut FlowCounters,
    /// `[sender, receiver]` LAN host slots (see `hosts.rs`).
    pub host_slots: [u32; 2],
}

/// [`FlowMaps`] for a family (its address, key and value types, flow and active maps).
macro_rules! flow_maps {
    ($family:ty, $addr:ty, $key:ty, $flow:ty, $flows:ident, $active:ident) => {
        impl FlowMaps for $family {
            type Addr = $addr;
            type Key = $key;
            type Flow = $flow;

            #[inline(always)]
            fn flows() -> &'static HashMap<$key, $flow> {
                &$flows
            }

            #[inline(always)]
            fn active() -> &'static HashMap<$key, u8> {
                &$active
            }

            #[inline(always)]
            fn to_active_key(key: &mut $key, nat: &Nat<$addr>, reply: bool) {
                key.ifindex = 0;
                if reply {
                    key.src_be = nat.dst_be;
                    key.dst_be = nat.src_be;
                    key.sport_be = nat.dport_be;
                    key.dport_be = nat.sport_be;
                }
            }

            #[inline(always)]
            fn nat(flow: *const $flow) -> Nat<$addr> {
                // SAFETY: map value pointer from the kernel; the daemon rewrites whole entries
                // only via map updates, so a copy of the translation is consistent enough for
                // one packet.
                unsafe {
                    Nat {
                        src_be: (*flow).new_src_be,
                        dst_be: (*flow).new_dst_be,
                        sport_be: (*flow).new_sport_be,
                        dport_be: (*flow).new_dport_be,
                        l3_csum_diff: <$family>::l3_csum_diff(flow),
                        l4_csum_diff: (*flow).l4_csum_diff,
                    }
                }
            }

            #[inline(always)]
            fn fields(flow: *mut $flow) -> FlowFields {
                // SAFETY: `flow` is a live map value pointer: `flags` is copied out, the rest
                // are addresses in it.
                unsafe {
                    FlowFields {
                        flags: (*flow).flags,
                        // Side by side and 8-byte aligned (asserted in the common crate).
                        arming: addr_of_mut!((*flow).armed_generation) as *mut u64,
                        armed_at: addr_of_mut!((*flow).armed_at),
                        kernel_dscp: addr_of_mut!((*flow).kernel_dscp),
                        kernel_ttl: addr_of_mut!((*flow).kernel_ttl),
                        fib: addr_of_mut!((*flow).fib),
                        counters: addr_of_mut!((*flow).counters),
                        host_slots: (*flow).host_slots,
                    }
                }
            }
        }
    };
}

flow_maps!(V4, u32, FlowKeyV4, FlowV4, FLOWS_V4, ACTIVE_V4);
flow_maps!(V6, [u32; 4], FlowKeyV6, FlowV6, FLOWS_V6, ACTIVE_V6);
