//! PPPoE: where session frames become the PPP device's packets and back.
//!
//! The kernel hands a session frame that arrives on the session's lower device (the Ethernet
//! port, or a VLAN device over it) from the session's access concentrator to its PPP device
//! (`pppoe_rcv`: session ID, source MAC and device must match a connected PPPoE socket), which
//! the IP layer then sees as received on `ppp0`. A packet routed out of `ppp0` gets the PPP and
//! PPPoE headers pushed (`pppoe_xmit`) and leaves the lower device addressed to the peer. The
//! fast path does the same for the sessions the daemon lists in `PPPOE`, and leaves everything
//! else (discovery, LCP, IPCP, CCP, other sessions) to the kernel.

use core::{mem::transmute, ptr::addr_of_mut};

use xdp_router_common::{
    IFACE_F_BRIDGE, IFACE_F_BRIDGE_PORT, IFACE_F_NO_XDP_XMIT, IFACE_F_PPP_CCP, IFACE_F_PPPOE,
    IFACE_F_VLAN, IfaceInfo, PppoeKey, Reason,
    parse::{CCP_CONFACK, L3, PPP_CCP, PPP_COMP, PPPOE_HLEN, PppoeFields, check_pppoe},
};

use crate::{
    encap::{EgressTag, check_egress},
    fib::NextHop,
    maps::{IFACES, PPPOE},
    packet::{Packet, frame_len, ptr_at_mut},
    parse::PppoeHdr,
    verify::mac_words,
    vlan,
};

/// The managed PPP device a session frame belongs to.
pub struct Session {
    pub ifindex: u32,
    pub info: *const IfaceInfo,
    /// The network layer the PPP protocol field names.
    pub l3: L3,
    /// Bytes of the IP datagram the PPPoE length covers (the rest is padding).
    pub ip_len_max: usize,
}

/// The managed session of the PPPoE session frame whose header is at `at`, received on
/// `lower` (the device the kernel's PPPoE socket is bound to) from `src`, or why the kernel
/// must have the frame.
#[inline(always)]
pub fn session<P: Packet>(ctx: &P, lower: u32, at: usize, src: [u8; 6]) -> Result<Session, Reason> {
    let h: *mut PppoeHdr = ptr_at_mut(ctx, at)?;
    // SAFETY: bounds checked by ptr_at_mut.
    let (ver_type, code, sid_be, length_be, proto_be) = unsafe {
        (
            (*h).ver_type,
            (*h).code,
            (*h).sid_be,
            (*h).length_be,
            (*h).proto_be,
        )
    };
    let [s0, s1] = sid_be.to_ne_bytes();
    let words = [lower, u32::from_ne_bytes([s0, s1, 0, 0])];
    // SAFETY: PppoeKey is #[repr(C)], 8 bytes of integers without implicit padding
    // (lower_ifindex, sid_be, _pad), laid out as these words.
    let key = unsafe { transmute::<[u32; 2], PppoeKey>(words) };
    // SAFETY: a map lookup; the value is copied out.
    let Some(&ifindex) = (unsafe { PPPOE.get(key) }) else {
        return Err(Reason::PassPppoeUnknownSession);
    };
    let Some(info) = IFACES.get_ptr_mut(ifindex) else {
        return Err(Reason::PassPppoeUnknownSession);
    };
    // SAFETY: a map value pointer returned by the kernel is valid for reads of IfaceInfo.
    let (flags, peer) = unsafe { ((*info).flags, (*info).peer_mac) };
    // The kernel's socket lookup matches the peer's MAC too: a frame with the session's ID
    // from anyone else is not the session's.
    if flags & IFACE_F_PPPOE == 0 || mac_words(src) != mac_words(peer) {
        return Err(Reason::PassPppoeUnknownSession);
    }
    if flags & IFACE_F_PPP_CCP != 0 {
        return Err(Reason::PassPppoeCcp);
    }
    let proto = u16::from_be(proto_be);
    // The peer compresses (or encrypts) what it sends, or accepts what we asked for: CCP
    // runs on the session. Recorded for the PPP device (both directions), before the
    // connections it carries can be offloaded: their replies arrive compressed.
    if proto == PPP_COMP || (proto == PPP_CCP && ccp_code(ctx, at + PPPOE_HLEN)? == CCP_CONFACK) {
        // SAFETY: a map value pointer returned by the kernel; a plain read-modify-write: the
        // daemon keeps the bit when it rewrites the entry, and the peer's next compressed
        // datagram sets it again should a concurrent rewrite have lost it.
        unsafe {
            let f = addr_of_mut!((*info).flags);
            f.write_volatile(f.read_volatile() | IFACE_F_PPP_CCP);
        }
        return Err(Reason::PassPppoeCcp);
    }
    let frame = frame_len(ctx);
    let (l3, ip_len_max) = check_pppoe(&PppoeFields {
        ver_type,
        code,
        length: u16::from_be(length_be),
        proto,
        // After the 6 bytes before the PPP protocol field; ptr_at_mut checked that the
        // whole header is inside the frame.
        available: frame - at - 6,
    })?;
    Ok(Session {
        ifindex,
        info,
        l3,
        ip_len_max,
    })
}

/// The code of the CCP packet at `at`.
#[inline(always)]
fn ccp_code<P: Packet>(ctx: &P, at: usize) -> Result<u8, Reason> {
    let code: *mut u8 = ptr_at_mut(ctx, at)?;
    // SAFETY: bounds checked by ptr_at_mut.
    Ok(unsafe { *code })
}

/// The device a packet routed out of the PPPoE device `ifindex` (`IfaceInfo` `info`, flags
/// `flags`) is sent from, once the PPP device's own egress and the lower device's allow a
/// redirect: the lower device, or the parent of a VLAN lower device (whose tag goes to
/// `tag`). The session's headers go to `tag` and its MACs (the lower device's, the peer's) to
/// `hop`. From TC (`P::SKB`) the packet is redirected into the PPP device itself, whose
/// transmit path (the kernel's PPP and PPPoE code, and the lower device's qdisc) encapsulates
/// and sends it, as for a packet the kernel routed there: an skb's PPPoE header is not pushed
/// here (see `encap::reframe`).
#[inline(always)]
pub fn lower<P: Packet>(
    ifindex: u32,
    info: *const IfaceInfo,
    flags: u32,
    hop: &mut NextHop,
    tag: &mut EgressTag,
) -> Result<u32, Reason> {
    // The kernel sends a packet routed out of ppp0 through ppp0 (its qdisc, its egress
    // hooks), then encapsulated out of the lower device; ppp0 transmits nothing itself.
    check_egress::<P>(flags & !IFACE_F_NO_XDP_XMIT)?;
    if P::SKB {
        return Ok(ifindex);
    }
    if flags & IFACE_F_PPP_CCP != 0 {
        // The kernel's compressor or encryption must see what goes into the session.
        return Err(Reason::PassPppoeCcp);
    }
    // SAFETY: map value pointer from the kernel.
    let (lower, sid_be, smac, peer) = unsafe {
        (
            (*info).lower_ifindex,
            (*info).pppoe_sid_be,
            (*info).mac,
            (*info).peer_mac,
        )
    };
    let Some(linfo) = IFACES.get_ptr(lower) else {
        return Err(Reason::PassEgressNotManaged);
    };
    // SAFETY: map value pointer from the kernel.
    let lflags = unsafe { (*linfo).flags };
    let target = if lflags & IFACE_F_VLAN != 0 {
        vlan::parent::<P>(lower, linfo, lflags, peer, tag)?
    } else if lflags & (IFACE_F_BRIDGE | IFACE_F_BRIDGE_PORT | IFACE_F_PPPOE) != 0 {
        // PPPoE over a bridge or a bridge port, or over another PPP device: not handled here.
        return Err(Reason::PassEgressNotManaged);
    } else {
        check_egress::<P>(lflags)?;
        lower
    };
    tag.pppoe_sid_be = sid_be;
    tag.pppoe = true;
    hop.smac = smac;
    hop.dmac = peer;
    Ok(target)
}
