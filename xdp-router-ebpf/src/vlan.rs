//! VLAN devices: the managed VLAN device a tagged frame belongs to (`vlan_do_receive`), and
//! the device and tag a packet routed out of a VLAN device leaves with (its parent, or the
//! bridge port for a VLAN over a bridge).

use core::mem::transmute;

use xdp_router_common::{
    IFACE_F_BRIDGE, IFACE_F_NO_XDP_XMIT, IFACE_F_VLAN, IfaceInfo, Reason, VlanKey, parse::ETH_HLEN,
};

use crate::{
    bridge,
    encap::{EgressTag, check_egress},
    maps::{IFACES, VLANS},
    packet::{Packet, ptr_at_mut},
    parse::{FrameTag, VlanHdr},
    words::pack16,
};

/// A managed VLAN device a tagged frame belongs to.
pub struct VlanDevice {
    pub ifindex: u32,
    pub info: *const IfaceInfo,
}

/// The VLAN tag of a frame whose EtherType (raw: `tpid_be`) is a VLAN TPID: its protocol and
/// TCI (raw) and the EtherType after it (host order).
#[inline(always)]
pub fn read_tag<P: Packet>(ctx: &P, tpid_be: u16) -> Result<FrameTag, Reason> {
    let tag: *mut VlanHdr = ptr_at_mut(ctx, ETH_HLEN)?;
    // SAFETY: bounds checked by ptr_at_mut.
    let (tci_be, inner) = unsafe { ((*tag).tci_be, u16::from_be((*tag).inner_ethertype_be)) };
    Ok(FrameTag {
        present: true,
        tpid_be,
        tci_be,
        inner,
    })
}

/// The managed VLAN device over `parent` for VLAN `vid` with tag protocol `tpid_be` (raw), per
/// `VLANS`, or why the kernel must have the frame.
#[inline(always)]
pub fn device_of(parent: u32, vid: u16, tpid_be: u16) -> Result<VlanDevice, Reason> {
    let words = [parent, pack16(vid, tpid_be)];
    // SAFETY: VlanKey is #[repr(C)], 8 bytes of integers without implicit padding
    // (parent_ifindex, vid, tpid_be), laid out as these words.
    let key = unsafe { transmute::<[u32; 2], VlanKey>(words) };
    // SAFETY: a map lookup; the value is copied out.
    let Some(&ifindex) = (unsafe { VLANS.get(key) }) else {
        // Another VLAN, or 802.1ad where the VLAN device is 802.1Q (or the other way round).
        return Err(Reason::PassVlanUnknown);
    };
    let Some(info) = IFACES.get_ptr(ifindex) else {
        return Err(Reason::PassVlanUnknown);
    };
    Ok(VlanDevice { ifindex, info })
}

/// The device a packet routed out of the VLAN device `info` to `dmac` is sent from (its
/// parent, or for a VLAN over a bridge the bridge's port), once the VLAN device's own egress
/// and the parent's allow a redirect; the tag to push goes to `tag`. From TC (`P::SKB`) a
/// packet for a VLAN device over an Ethernet parent is redirected to the VLAN device
/// `ifindex` itself, untagged: its transmit path tags it and queues it on the parent, as for
/// a packet the kernel routed there.
#[inline(always)]
pub fn parent<P: Packet>(
    ifindex: u32,
    info: *const IfaceInfo,
    flags: u32,
    dmac: [u8; 6],
    tag: &mut EgressTag,
) -> Result<u32, Reason> {
    // The kernel sends a packet routed out of a VLAN device through the device (its qdisc,
    // its egress hooks), then tagged out of the parent; the VLAN device transmits nothing
    // itself.
    check_egress::<P>(flags & !IFACE_F_NO_XDP_XMIT)?;
    // SAFETY: map value pointer from the kernel.
    let (parent, tpid_be, tci_be) = unsafe {
        (
            (*info).lower_ifindex,
            (*info).vlan_tpid_be,
            (*info).vlan_tci_be,
        )
    };
    let Some(pinfo) = IFACES.get_ptr(parent) else {
        return Err(Reason::PassEgressNotManaged);
    };
    // SAFETY: map value pointer from the kernel.
    let pflags = unsafe { (*pinfo).flags };
    if pflags & IFACE_F_VLAN != 0 || tpid_be == 0 {
        // Stacked VLANs: not handled here.
        return Err(Reason::PassEgressNotManaged);
    }
    if pflags & IFACE_F_BRIDGE != 0 {
        // A VLAN over a bridge: the bridge sends it on, in that VLAN. (A VLAN over a bridge
        // port is not this: the kernel sends its frames out of the port directly, past the
        // bridge and whatever its STP state.)
        return bridge::port::<P>(parent, pinfo, pflags, dmac, Some((tpid_be, tci_be)), tag);
    }
    check_egress::<P>(pflags)?;
    if P::SKB {
        return Ok(ifindex);
    }
    tag.tpid_be = tpid_be;
    tag.tci_be = tci_be;
    Ok(parent)
}
