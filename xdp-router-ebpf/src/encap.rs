//! Encapsulation on egress: the headers a packet leaves with between its MACs and its IP header
//! (VLAN tag, PPPoE session), the checks that an egress device may send a redirected frame, and
//! the reframing that pops what the received frame had and pushes what the egress needs.

use xdp_router_common::{
    IFACE_F_EGRESS_HOOK, IFACE_F_NO_XDP_XMIT, IFACE_F_SHAPED, Reason,
    parse::{
        ETH_HLEN, ETH_P_IP, ETH_P_IPV6, ETH_P_PPP_SES, L3, PPP_IP, PPP_IPV6, PPPOE_HLEN,
        PPPOE_VER_TYPE, VLAN_HLEN,
    },
};

use crate::{
    packet::{Packet, frame_len, ptr_at_mut},
    parse::{EthHdr, PppoeHdr, VlanTag},
};

/// Why the fast path must not send out of an interface with `IFACE_F_*` flags `flags`, if
/// anything. A redirect from TC (`P::SKB`) goes through the device's transmit path
/// (`dev_queue_xmit`): it needs no XDP transmit.
#[inline(always)]
///
/// The transmit check comes last: a packet XDP passes as `egress_no_xdp_xmit` is one the TC
/// fast path behind it could send (`handoff.rs`), the shaping and hook checks being the same
/// on both.
pub fn check_egress<P: Packet>(flags: u32) -> Result<(), Reason> {
    // From TC the qdisc would run, but with the skb's priority and mark as received: a
    // classification the kernel's forward path would have set (mangle rules, CLASSIFY) is
    // not applied, so a shaped link stays with the kernel on both paths.
    if flags & IFACE_F_SHAPED != 0 {
        // A redirect skips the egress qdisc; a shaped link must keep its shaping.
        return Err(Reason::PassEgressShaped);
    }
    if flags & IFACE_F_EGRESS_HOOK != 0 {
        // A redirect skips the netdev egress chain and tc egress filters too. (From TC the
        // tc egress filters do run, the netdev egress chain does not: `nf_skip_egress` is set
        // around TC ingress.)
        return Err(Reason::PassEgressHook);
    }
    if !P::SKB && flags & IFACE_F_NO_XDP_XMIT != 0 {
        // The device would drop a redirected frame (no ndo_xdp_xmit, or a veth whose peer
        // has neither XDP nor GRO): the kernel's own output path can send it.
        return Err(Reason::PassEgressNoXdpXmit);
    }
    Ok(())
}

/// The headers a packet leaves with between its MACs and its IP header, besides the
/// EtherType (raw wire values): a VLAN tag (`tpid_be` 0 = untagged) and a PPPoE session.
pub struct EgressTag {
    pub tpid_be: u16,
    pub tci_be: u16,
    /// The PPPoE session's ID, when `pppoe`.
    pub pppoe_sid_be: u16,
    /// The egress is a PPPoE device: the session header goes after the EtherType.
    pub pppoe: bool,
}

/// The frame as it leaves: its Ethernet header, the EtherType (after the MACs, or after the
/// VLAN tag when the egress is a VLAN device or a PPPoE session over one) and the IP header,
/// all re-derived after the resize. The VLAN tag (after the MACs, `tag_in_frame`) and the
/// PPPoE header (when the egress is a PPPoE device, ending where `l2` does) are derived by
/// [`write_l2`], which says why.
pub struct Reframed<T> {
    pub eth: *mut EthHdr,
    /// A VLAN tag goes into the frame after the MACs.
    tag_in_frame: bool,
    ethertype: *mut u16,
    pub ip: *mut T,
    /// Length of the Ethernet header, tag and PPPoE header as the frame leaves.
    pub l2: usize,
    /// The VLAN tag it leaves with goes into the skb's metadata, not the frame.
    meta_tag: bool,
}

/// Gives the frame the L2 header its egress needs and cuts it down to that header plus the
/// `ip_len`-byte IP datagram. `l2_in` is the received header's length (14, plus 4 with a tag
/// in the frame, `tag_in_frame`, plus 8 for a PPPoE session; 0 on a device without a
/// link-layer header, where the packet starts with its IP header); the outgoing one is 14,
/// plus 4 when `tag` has a VLAN tag that goes into the frame, plus 8 when it has a PPPoE
/// session: `bpf_xdp_adjust_head` removes what the received header has more or makes room
/// for what the new one needs (the MACs, tag, EtherType and PPPoE header are written by the
/// caller). A packet for a device without a link-layer header leaves with an Ethernet header
/// too: the kernel's redirect takes it off (`__bpf_redirect_no_mac`).
///
/// On an skb the VLAN tag is metadata, received (see `Packet::meta_vlan_tag`) and sent: no
/// byte moves for it, and [`write_l2`] sets the one `tag` names there. (Only an skb built
/// from a tagged frame's bytes, as BPF_PROG_RUN builds it and a real TC ingress never sees,
/// has its tag in the frame: it is rewritten there as on XDP.) Nothing else is pushed or
/// popped on an skb but the Ethernet header of a packet received without one and a received
/// session header ([`Packet::pop_session`], which needs the datagram's family `l3`).
///
/// Done before anything is written, so a failed resize passes the frame as received. Bytes
/// beyond the datagram (Ethernet padding, garbage) are cut as the kernel trims the skb
/// (`pskb_trim_rcsum` in `ip_rcv_core` / `ip6_rcv_core`): they must not leave, and would count
/// against the egress MTU. Every packet pointer is invalid after either helper, hence the
/// re-derived ones.
#[inline(always)]
pub fn reframe<T, P: Packet>(
    ctx: &P,
    l2_in: usize,
    tag_in_frame: bool,
    ip_len: usize,
    l3: L3,
    tag: &EgressTag,
) -> Result<Reframed<T>, Reason> {
    let meta_tag = P::SKB && !tag_in_frame;
    let vlan = if tag.tpid_be != 0 && !meta_tag {
        VLAN_HLEN
    } else {
        0
    };
    let session = if tag.pppoe { PPPOE_HLEN } else { 0 };
    let l2 = ETH_HLEN + vlan + session;
    if l2 == ETH_HLEN && l2_in == ETH_HLEN + PPPOE_HLEN {
        // A session frame (untagged, or on an skb with its tag in metadata) leaving without
        // a session header or a tag in its bytes.
        ctx.pop_session(l3)?;
    } else if l2 != l2_in {
        if P::SKB && !(l2_in == 0 && l2 == ETH_HLEN) {
            // On skbs only the Ethernet header of a packet received without a link-layer
            // header (`IFACE_F_L3`) is pushed, and the session header above popped. (None is
            // pushed: from TC a PPPoE device is sent into itself, see `pppoe::lower`. A tag
            // in the bytes is one of BPF_PROG_RUN's skbs.)
            return Err(Reason::PassNotOnTc);
        }
        // A positive delta pops received headers, a negative one makes room for new ones.
        let delta = l2_in as i32 - l2 as i32;
        // XDP frames have 256 bytes of headroom (XDP_PACKET_HEADROOM) and the frame is longer
        // than the tag.
        if !ctx.adjust_head(delta) {
            return Err(Reason::PassMalformed);
        }
    }
    let len = l2 + ip_len;
    let have = frame_len(ctx);
    if have > len {
        // Both below 64 KiB: the difference fits an i32.
        let delta = len as i32 - have as i32;
        // A negative delta only shrinks.
        if !ctx.adjust_tail(delta) {
            return Err(Reason::PassMalformed);
        }
    }
    // The VLAN tag and the PPPoE header lie before the IP header, whose check below covers
    // them: `write_l2` cannot fail.
    Ok(Reframed {
        eth: ptr_at_mut(ctx, 0)?,
        tag_in_frame: vlan != 0,
        ethertype: ptr_at_mut(ctx, 12 + vlan)?,
        ip: ptr_at_mut(ctx, l2)?,
        l2,
        meta_tag,
    })
}

/// Writes the egress's headers between the MACs and the IP header of an `ip_len`-byte
/// datagram of family `l3`: the VLAN tag, the EtherType and the PPPoE session header, as far
/// as the egress has them (after the rewrite: nothing can fail by then). The EtherType is
/// always written: a received PPPoE frame's was 0x8864. On an skb the VLAN tag is set in its
/// metadata, last (the helpers invalidate packet pointers): the received one is cleared and
/// the egress's, if any, set; with the received tag present and an IP protocol neither
/// helper can fail (`skb_vlan_pop` only clears it, `skb_vlan_push` only sets one where none
/// is), so nothing is left to undo.
///
/// The VLAN tag's and the session header's pointers are derived here, not kept from `reframe`
/// beside a flag saying whether there is one: LLVM keeps such a flag as a value it already
/// has (`tag.tpid_be`, `flags & IFACE_F_PPPOE`) in a stack slot, and a verifier without
/// commit 8ecfc371d829 ("bpf: Assign ID to scalars on spill", 2024: 6.12 has it, Debian 12's
/// 6.1 does not) does not narrow a spilled copy when the register it came from is compared.
/// So on 6.1 it followed these branches on paths where the pointer's stack slot, shared
/// with another value, held a number (`l2`), and refused the program ("R2 invalid mem access
/// 'scalar'"). Checked again here, the pointers are valid on every path a verifier walks;
/// `reframe` checked the IP header after them, so on a real egress these checks never fail.
#[inline(always)]
pub fn write_l2<T, P: Packet>(ctx: &P, out: &Reframed<T>, tag: &EgressTag, l3: L3, ip_len: usize) {
    if out.tag_in_frame
        && let Ok(t) = ptr_at_mut::<VlanTag, P>(ctx, 12)
    {
        // SAFETY: bounds checked by ptr_at_mut just above.
        unsafe {
            (*t).tpid_be = tag.tpid_be;
            (*t).tci_be = tag.tci_be;
        }
    }
    let (ethertype, ppp_proto) = match l3 {
        L3::V4 => (ETH_P_IP, PPP_IP),
        L3::V6 => (ETH_P_IPV6, PPP_IPV6),
    };
    if tag.pppoe
        && let Ok(h) = ptr_at_mut::<PppoeHdr, P>(ctx, out.l2 - PPPOE_HLEN)
    {
        // SAFETY: bounds checked by ptr_at_mut just above (the EtherType's in `reframe`).
        unsafe {
            *out.ethertype = ETH_P_PPP_SES.to_be();
            (*h).ver_type = PPPOE_VER_TYPE;
            (*h).code = 0;
            (*h).sid_be = tag.pppoe_sid_be;
            // The PPP protocol field and the datagram (below 64 KiB: checked by the parser).
            (*h).length_be = (ip_len as u16).wrapping_add(2).to_be();
            (*h).proto_be = ppp_proto.to_be();
        }
    } else {
        // SAFETY: bounds checked by ptr_at_mut in `reframe`.
        unsafe { *out.ethertype = ethertype.to_be() };
    }
    if out.meta_tag {
        let want = if tag.tpid_be != 0 {
            Some((tag.tpid_be, tag.tci_be))
        } else {
            None
        };
        ctx.set_meta_vlan_tag(want);
    }
}
