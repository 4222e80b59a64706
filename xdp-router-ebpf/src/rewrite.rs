//! Where packets are changed: NAT of addresses and ports with incremental checksum updates
//! (RFC 1624, per-flow diffs precomputed by the daemon), TTL / hop-limit decrement, and the MAC
//! addresses from the FIB result. Called only after every check has passed.

use xdp_router_common::{
    FLOW_DSCP_KNOWN, FLOW_DSCP_REWRITTEN, Reason,
    checksum::{apply, apply_udp, combine, diff16},
};

use crate::{
    fib::NextHop,
    packet::{Packet, ptr_at_mut},
    parse::{EthHdr, Ipv4Hdr, Ipv6Hdr, PortsHdr},
};

/// Where the transport header of the packet being forwarded gets written: its ports and its
/// checksum field, each behind its own bounds check taken right before the rewrite.
///
/// Why not keep the TCP/UDP header pointers from parsing: LLVM merges the two differently sized
/// bounds checks into one and branches on the protocol again at the write; the verifier cannot
/// carry "not TCP" across that second branch and rejects the TCP write on the UDP-checked path.
/// Pointers checked for exactly the bytes they cover need no protocol branch at all.
pub struct L4 {
    ports: *mut PortsHdr,
    check: *mut u16,
    udp: bool,
}

impl L4 {
    /// The transport header at `offset` (TCP if `!udp`), already parsed and checked. Without
    /// `direct` only the ports: the checksum is left to `Packet::update_l4_checksum` (an skb
    /// whose checksum state needs the helpers, see `flow::try_forward_ip`).
    #[inline(always)]
    pub fn at<P: Packet>(ctx: &P, offset: usize, udp: bool, direct: bool) -> Result<L4, Reason> {
        if !direct {
            return Ok(L4 {
                ports: ptr_at_mut(ctx, offset)?,
                check: core::ptr::null_mut(),
                udp,
            });
        }
        // Offset of the checksum field: TCP 16, UDP 6.
        let check_off = if udp { 6 } else { 16 };
        Ok(L4 {
            ports: ptr_at_mut(ctx, offset)?,
            check: ptr_at_mut(ctx, offset + check_off)?,
            udp,
        })
    }
}

/// The translation of one flow direction (copied from its `FlowV4` / `FlowV6`); `A` is an
/// address: `u32` for IPv4, `[u32; 4]` for IPv6 (raw words).
pub struct Nat<A> {
    /// New source address (network order).
    pub src_be: A,
    /// New destination address (network order).
    pub dst_be: A,
    /// New source port (network order).
    pub sport_be: u16,
    /// New destination port (network order).
    pub dport_be: u16,
    /// Header checksum diff of the address rewrite (IPv4; IPv6 has no header checksum).
    pub l3_csum_diff: u32,
    /// TCP/UDP checksum diff of the address and port rewrite.
    pub l4_csum_diff: u32,
}

/// The DSCP to send a packet of a flow direction with, as `FLOW_DSCP_KNOWN | dscp`, or 0 to
/// keep the packet's: the one recorded in `kernel_dscp` when the kernel was seen rewriting the
/// direction's DSCP and the fast path may apply such rewrites (`allow`; see
/// `flow::check_dscp`, which let the packet through). Read again here rather than carried from
/// the check: a value live across the whole pipeline doubles the verifier's paths. A re-arm in
/// between only gives the packet the kernel's newest DSCP for the direction.
#[inline(always)]
pub fn kernel_dscp_to_set(kernel_dscp: *const u32, allow: bool) -> u32 {
    // SAFETY: points into a live flow map value.
    let recorded = unsafe { core::ptr::read_volatile(kernel_dscp) };
    let both = FLOW_DSCP_KNOWN | FLOW_DSCP_REWRITTEN;
    if allow && recorded & both == both {
        FLOW_DSCP_KNOWN | (recorded & 0x3f)
    } else {
        0
    }
}

/// Source and destination MAC of the next hop.
#[inline(always)]
fn rewrite_macs(eth: *mut EthHdr, hop: &NextHop) {
    // SAFETY: `eth` was bounds checked by the caller's parse.
    unsafe {
        (*eth).dst = hop.dmac;
        (*eth).src = hop.smac;
    }
}

/// Ports and checksum of the transport header. UDP over IPv4 sent without checksum (0) stays
/// without, and a computed UDP 0 goes out as 0xffff (RFC 768), as `apply_udp` does; a TCP
/// checksum of 0 is an ordinary value.
#[inline(always)]
fn rewrite_l4<P: Packet>(l4: L4, sport_be: u16, dport_be: u16, diff: u32) {
    // SAFETY: both pointers were bounds checked by L4::at.
    unsafe {
        (*l4.ports).sport_be = sport_be;
        (*l4.ports).dport_be = dport_be;
        if P::SKB && l4.check.is_null() {
            // `Packet::update_l4_checksum` updates it after the rewrite.
            return;
        }
        let old = *l4.check;
        *l4.check = if l4.udp {
            apply_udp(old, diff)
        } else {
            apply(old, diff)
        };
    }
}

/// Rewrites a checked IPv4 packet for forwarding: NAT, TTL - 1, the DSCP when `dscp` is
/// `FLOW_DSCP_KNOWN | dscp` (the ECN bits stay), header checksum, MACs.
#[inline(always)]
pub fn rewrite_v4<P: Packet>(
    eth: *mut EthHdr,
    ip: *mut Ipv4Hdr,
    l4: L4,
    nat: &Nat<u32>,
    hop: &NextHop,
    dscp: u32,
) {
    // SAFETY: `ip` was bounds checked by the caller's parse; TTL >= 2 was checked.
    unsafe {
        let old_word = (*ip).ttl_proto_word();
        (*ip).ttl -= 1;
        let mut diff = combine(nat.l3_csum_diff, diff16(old_word, (*ip).ttl_proto_word()));
        if dscp & FLOW_DSCP_KNOWN != 0 {
            let old_word = (*ip).version_tos_word();
            (*ip).tos = (((dscp & 0x3f) as u8) << 2) | ((*ip).tos & 0x3);
            diff = combine(diff, diff16(old_word, (*ip).version_tos_word()));
        }
        (*ip).src_be = nat.src_be;
        (*ip).dst_be = nat.dst_be;
        (*ip).check = apply((*ip).check, diff);
    }
    rewrite_l4::<P>(l4, nat.sport_be, nat.dport_be, nat.l4_csum_diff);
    rewrite_macs(eth, hop);
}

/// Rewrites a checked IPv6 packet for forwarding: NAT, hop limit - 1, the traffic class's DSCP
/// when `dscp` is `FLOW_DSCP_KNOWN | dscp`, MACs (IPv6 has no header checksum; neither the hop
/// limit nor the traffic class is in the pseudo-header).
#[inline(always)]
pub fn rewrite_v6<P: Packet>(
    eth: *mut EthHdr,
    ip: *mut Ipv6Hdr,
    l4: L4,
    nat: &Nat<[u32; 4]>,
    hop: &NextHop,
    dscp: u32,
) {
    // SAFETY: `ip` was bounds checked by the caller's parse; hop limit >= 2 was checked.
    unsafe {
        if dscp & FLOW_DSCP_KNOWN != 0 {
            // Version (4 bits), then the DSCP (6) of the traffic class, ECN (2), flow label.
            let word = u32::from_be((*ip).vtc_flow_be);
            (*ip).vtc_flow_be = u32::to_be((word & !(0x3f << 22)) | ((dscp & 0x3f) << 22));
        }
        (*ip).hop_limit -= 1;
        (*ip).src_be = nat.src_be;
        (*ip).dst_be = nat.dst_be;
    }
    rewrite_l4::<P>(l4, nat.sport_be, nat.dport_be, nat.l4_csum_diff);
    rewrite_macs(eth, hop);
}
