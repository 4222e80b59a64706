//! Where a routed packet leaves: from the FIB's egress device down to the one that sends the
//! frame (a VLAN device's parent, a bridge's port, a PPPoE device's lower device), each
//! device's egress checked on the way, and the redirect to it set up.

use xdp_router_common::{
    IFACE_F_BRIDGE, IFACE_F_BRIDGE_PORT, IFACE_F_L3, IFACE_F_PPPOE, IFACE_F_PPPOE_LOWER,
    IFACE_F_VLAN, IFACE_F_VLAN_PARENT, Reason,
};

use crate::{
    bridge,
    encap::{EgressTag, check_egress},
    fib::NextHop,
    maps::IFACES,
    packet::Packet,
    pppoe, vlan,
};

/// Where a packet goes once the FIB named its egress.
pub struct Egress {
    /// What the redirect set-up returned (`XDP_REDIRECT`): the program's action.
    pub action: u32,
    /// The headers to push between the MACs and the IP header (VLAN tag, PPPoE session).
    pub tag: EgressTag,
    /// The egress has no link-layer header (`IFACE_F_L3`, or from TC a PPPoE device): the
    /// Ethernet header the frame is given does not leave (the kernel's redirect takes it off).
    pub no_link_header: bool,
}

/// The redirect set up once the FIB's egress `hop.ifindex` (and, for a bridge, the port
/// `hop.dmac` is behind; for a VLAN device, its parent; for a PPPoE device, its lower device)
/// may send the packet. Checked on every packet, cached next hop or not: the daemon flips
/// these live, and FDB moves are followed from the next packet on. For a PPPoE device the
/// session's MACs replace the hop's.
#[inline(always)]
pub fn redirect_to<P: Packet>(hop: &mut NextHop) -> Result<Egress, Reason> {
    let egress = hop.ifindex;
    // Only interfaces the daemon manages are fast-path targets (their neighbours, qdiscs and
    // counters are known); anything else keeps the kernel's full output path.
    let Some(info) = IFACES.get_ptr(egress) else {
        return Err(Reason::PassEgressNotManaged);
    };
    // SAFETY: map value pointer from the kernel.
    let flags = unsafe { (*info).flags };
    let mut tag = EgressTag {
        tpid_be: 0,
        tci_be: 0,
        pppoe_sid_be: 0,
        pppoe: false,
    };
    let target = if flags & IFACE_F_PPPOE != 0 {
        pppoe::lower::<P>(egress, info, flags, hop, &mut tag)?
    } else if flags & IFACE_F_VLAN != 0 {
        vlan::parent::<P>(egress, info, flags, hop.dmac, &mut tag)?
    } else if flags & IFACE_F_BRIDGE != 0 {
        bridge::port::<P>(egress, info, flags, hop.dmac, None, &mut tag)?
    } else if flags & (IFACE_F_BRIDGE_PORT | IFACE_F_VLAN_PARENT | IFACE_F_PPPOE_LOWER) != 0 {
        // The kernel never routes out of a bridge port itself; a VLAN parent or a PPPoE
        // lower device that is not in the config is only managed for its VLANs' tagged frames
        // or its sessions' frames.
        return Err(Reason::PassEgressNotManaged);
    } else {
        check_egress::<P>(flags)?;
        egress
    };
    // The redirect is set up now, before the rewrite (it only records the target): an egress
    // the daemon did not (or no longer) list goes to the kernel untouched.
    let Some(action) = P::redirect(target) else {
        return Err(Reason::PassEgressNotManaged);
    };
    Ok(Egress {
        action,
        tag,
        // From TC a PPPoE device is sent into itself (see `pppoe::lower`), without a
        // link-layer header as a device bound on TC (`IFACE_F_L3`).
        no_link_header: flags & IFACE_F_L3 != 0 || (P::SKB && flags & IFACE_F_PPPOE != 0),
    })
}
