//! Bridged LANs: what the kernel bridge does with a frame addressed to it on one of its ports
//! (the VLAN it is in, the device its IP layer sees it on), and the port a packet routed out
//! of the bridge leaves by (FDB, VLAN membership, tag). Per the kernel's `br_handle_frame`,
//! `br_allowed_ingress`, `br_pass_frame_up`, `br_dev_xmit` and `br_handle_vlan`; what the fast
//! path does not reproduce goes to the kernel.

use core::mem::transmute;

use xdp_router_common::{
    BRIDGE_VLAN_F_UNTAGGED, BridgeVlanKey, FdbKey, IFACE_F_BRIDGE_PORT,
    IFACE_F_BRIDGE_VLAN_FILTERING, IFACE_F_NO_XDP_XMIT, IFACE_F_PORT_NOT_FORWARDING,
    IFACE_F_VLAN_PARENT, IfaceInfo, Reason,
    parse::{VLAN_VID_MASK, check_vlan_tag},
};

use crate::{
    encap::{EgressTag, check_egress},
    maps::{BRIDGE_FDB, BRIDGE_VLANS, IFACES},
    packet::Packet,
    parse::FrameTag,
    words::pack16,
};

/// What the bridge does with a frame addressed to it on a port.
pub struct Ingress {
    /// The VLAN the bridge has the frame in (its FDB is keyed by it): 0 on a bridge without
    /// VLAN filtering.
    pub vid: u16,
    /// The VLAN (ID, tag protocol: raw) of the VLAN device over the bridge that receives it
    /// (`br-lan.20`, looked up in `VLANS` by the caller); `None`: the bridge device itself.
    pub upper: Option<(u16, u16)>,
}

/// The VLAN a frame received on `port` (a port of `bridge`, flags `flags`, `IfaceInfo` `info`)
/// is bridged in, and the device the bridge passes it up to, or why the kernel must have it.
/// `tag` is the frame's VLAN tag, if it has one. The frame is addressed to the bridge; the caller checked that.
#[inline(always)]
pub fn ingress(
    bridge: u32,
    port: u32,
    info: *const IfaceInfo,
    flags: u32,
    tag: FrameTag,
) -> Result<Ingress, Reason> {
    if flags & IFACE_F_BRIDGE_VLAN_FILTERING == 0 {
        // A bridge without VLAN filtering passes a tagged frame up as it is: the kernel then
        // hands it to the VLAN device over the bridge for its tag, if there is one.
        let upper = if tag.present {
            let vid = check_vlan_tag(u16::from_be(tag.tci_be), tag.inner)?;
            Some((vid, tag.tpid_be))
        } else {
            None
        };
        return up_to(flags, Ingress { vid: 0, upper });
    }
    // SAFETY: a map value pointer returned by the kernel is valid for reads.
    let (proto_be, pvid_be) = unsafe { ((*info).vlan_tpid_be, (*info).vlan_tci_be) };
    let vid = if tag.present {
        if tag.tpid_be != proto_be {
            // A tag of the other protocol is payload to this bridge (the frame is in the
            // PVID, tag and all): not routed here.
            return Err(Reason::PassVlanUnknown);
        }
        check_vlan_tag(u16::from_be(tag.tci_be), tag.inner)?
    } else {
        u16::from_be(pvid_be) & VLAN_VID_MASK
    };
    if vid == 0 {
        // An untagged frame on a port without a PVID: the bridge drops it.
        return Err(Reason::PassBridgeVlanFiltered);
    }
    if membership(port, vid).is_none() {
        // Ingress filtering: the port is not in this VLAN.
        return Err(Reason::PassBridgeVlanFiltered);
    }
    // `br_pass_frame_up`: the bridge device must be in the VLAN too; it gets the frame untagged
    // when its own entry is untagged, else tagged, for its VLAN device.
    let Some(own) = membership(bridge, vid) else {
        return Err(Reason::PassBridgeVlanFiltered);
    };
    let upper = if own & BRIDGE_VLAN_F_UNTAGGED != 0 {
        None
    } else {
        Some((vid, proto_be))
    };
    up_to(flags, Ingress { vid, upper })
}

/// `ingress`'s answer, unless it names the bridge device itself on a bridge managed only as
/// the parent of VLAN devices (the port's `IFACE_F_VLAN_PARENT`): then the kernel routes it.
#[inline(always)]
fn up_to(flags: u32, ingress: Ingress) -> Result<Ingress, Reason> {
    if ingress.upper.is_none() && flags & IFACE_F_VLAN_PARENT != 0 {
        return Err(Reason::PassVlanParentUntagged);
    }
    Ok(ingress)
}

/// The `BRIDGE_VLANS` flags of `ifindex`'s membership of VLAN `vid`, if it is a member.
#[inline(always)]
fn membership(ifindex: u32, vid: u16) -> Option<u32> {
    let words = [ifindex, u32::from(vid)];
    // SAFETY: BridgeVlanKey is #[repr(C)], 8 bytes of integers without implicit padding
    // (ifindex, vid, _pad), laid out as these words on little-endian BPF.
    let key = unsafe { transmute::<[u32; 2], BridgeVlanKey>(words) };
    // SAFETY: a map lookup; the value is copied out.
    unsafe { BRIDGE_VLANS.get(key) }.copied()
}

/// The port of `bridge` that `mac` is behind in VLAN `vid`, per `BRIDGE_FDB`.
#[inline(always)]
pub fn fdb_port(bridge: u32, mac: [u8; 6], vid: u16) -> Option<u32> {
    let [m0, m1, m2, m3, m4, m5] = mac;
    let words = [
        bridge,
        u32::from_ne_bytes([m0, m1, m2, m3]),
        pack16(u16::from_ne_bytes([m4, m5]), vid),
    ];
    // SAFETY: FdbKey is #[repr(C)], 12 bytes of integers without implicit padding (bridge,
    // mac, vid), laid out as these words.
    let key = unsafe { transmute::<[u32; 3], FdbKey>(words) };
    // SAFETY: a map lookup; the value is copied out.
    unsafe { BRIDGE_FDB.get(key) }.copied()
}

/// The port of `bridge` (`IfaceInfo` `info`, flags `flags`) a packet routed out of it to
/// `dmac` leaves by, once the bridge's own egress and the port's allow a redirect. `vlan` is
/// the tag of the VLAN device over the bridge it was routed out of (protocol, TCI: raw), if
/// any. The tag the frame leaves with goes to `tag`.
#[inline(always)]
pub fn port<P: Packet>(
    bridge: u32,
    info: *const IfaceInfo,
    flags: u32,
    dmac: [u8; 6],
    vlan: Option<(u16, u16)>,
    tag: &mut EgressTag,
) -> Result<u32, Reason> {
    if vlan.is_none() && flags & IFACE_F_VLAN_PARENT != 0 {
        // Managed only as the parent of VLAN devices: the kernel routes out of the bridge.
        return Err(Reason::PassEgressNotManaged);
    }
    // The kernel sends a routed packet through the bridge device first (its qdisc, its
    // egress hooks), then out of the port; the bridge device itself transmits nothing.
    check_egress::<P>(flags & !IFACE_F_NO_XDP_XMIT)?;
    let filtering = flags & IFACE_F_BRIDGE_VLAN_FILTERING != 0;
    let vid = if filtering {
        // SAFETY: a map value pointer returned by the kernel is valid for reads.
        let (proto_be, pvid_be) = unsafe { ((*info).vlan_tpid_be, (*info).vlan_tci_be) };
        // `br_dev_xmit` → `br_allowed_ingress` on the bridge's own VLANs: a packet of a VLAN
        // device is in its VLAN, one of the bridge device itself in the bridge's PVID.
        let vid = match vlan {
            Some((tpid_be, tci_be)) => {
                if tpid_be != proto_be {
                    // The bridge would carry the tag as payload.
                    return Err(Reason::PassEgressNotManaged);
                }
                u16::from_be(tci_be) & VLAN_VID_MASK
            }
            None => u16::from_be(pvid_be) & VLAN_VID_MASK,
        };
        if vid == 0 || membership(bridge, vid).is_none() {
            return Err(Reason::PassBridgeVlanFiltered);
        }
        vid
    } else {
        0
    };
    let Some(port) = fdb_port(bridge, dmac, vid) else {
        // The bridge floods unknown destinations; the kernel learns where the host is.
        return Err(Reason::PassBridgeFdbMiss);
    };
    let Some(pinfo) = IFACES.get_ptr(port) else {
        return Err(Reason::PassEgressNotManaged);
    };
    // SAFETY: map value pointer from the kernel.
    let (pflags, owner) = unsafe { ((*pinfo).flags, (*pinfo).l3_ifindex) };
    if pflags & IFACE_F_BRIDGE_PORT == 0 || owner != bridge {
        // An FDB entry for a port the daemon does not (or no longer) manage as this bridge's.
        return Err(Reason::PassEgressNotManaged);
    }
    if pflags & IFACE_F_PORT_NOT_FORWARDING != 0 {
        return Err(Reason::PassBridgePortNotForwarding);
    }
    check_egress::<P>(pflags)?;
    if filtering {
        // `br_forward` → `br_allowed_egress`, `br_handle_vlan`: the port must be in the VLAN,
        // and sends it tagged unless its entry is untagged.
        let Some(member) = membership(port, vid) else {
            return Err(Reason::PassBridgeVlanFiltered);
        };
        if member & BRIDGE_VLAN_F_UNTAGGED == 0 {
            // SAFETY: a map value pointer returned by the kernel is valid for reads.
            tag.tpid_be = unsafe { (*info).vlan_tpid_be };
            tag.tci_be = match vlan {
                Some((_, tci_be)) => tci_be,
                None => vid.to_be(),
            };
        }
    } else if let Some((tpid_be, tci_be)) = vlan {
        // Without VLAN filtering the bridge forwards the VLAN device's tagged frame as it is.
        tag.tpid_be = tpid_be;
        tag.tci_be = tci_be;
    }
    Ok(port)
}
