//! The interfaces' part of the map ABI: `IFACES` values ([`IfaceInfo`] and its flags) and the
//! keys of the VLAN and PPPoE maps. Re-exported at the crate root.

// What the doc comments link to.
#[cfg(doc)]
use crate::*;

/// `IfaceInfo::flags`: egress on this interface is shaped by a qdisc: the fast path must not bypass it, so packets
/// routed out of it go to the kernel (`Reason::PassEgressShaped`).
pub const IFACE_F_SHAPED: u32 = 1 << 2;
/// Packets arriving on this interface pass hooks that run after XDP (an nftables `netdev`
/// ingress chain, tc ingress filters): they go to the kernel (`Reason::PassIngressHook`).
pub const IFACE_F_INGRESS_HOOK: u32 = 1 << 3;
/// Packets leaving this interface pass egress hooks (nftables `netdev` egress chain, tc egress
/// filters) that a redirect would skip: never redirected out of it (`Reason::PassEgressHook`).
pub const IFACE_F_EGRESS_HOOK: u32 = 1 << 4;
/// The interface cannot transmit XDP frames (no `ndo_xdp_xmit`, or a veth whose peer has
/// neither XDP nor GRO: `NETDEV_XDP_ACT_NDO_XMIT` is off): never redirected to
/// (`Reason::PassEgressNoXdpXmit`), and kept out of [`MAP_TX_PORTS`] while set. The daemon adds
/// the `TX_PORTS` entry before it clears this flag and removes it only after setting it.
pub const IFACE_F_NO_XDP_XMIT: u32 = 1 << 5;
/// The interface is a bridge (`br-lan`): the program does not run on it but on its ports, and a
/// packet routed out of it is redirected to the port the bridge FDB ([`MAP_BRIDGE_FDB`]) names
/// for its destination MAC (`Reason::PassBridgeFdbMiss` when none). Its own `IFACE_F_SHAPED`
/// and `IFACE_F_EGRESS_HOOK` apply to such packets (the kernel sends them through the bridge
/// device first); its `IFACE_F_NO_XDP_XMIT` does not (the port transmits).
pub const IFACE_F_BRIDGE: u32 = 1 << 6;
/// The interface is a port of the managed bridge [`IfaceInfo::l3_ifindex`]: frames not sent to
/// the bridge's MAC are bridged by the kernel (`Reason::PassBridged`); the others are routed as
/// if received by the bridge (flow keys and FIB lookups use the bridge's ifindex).
pub const IFACE_F_BRIDGE_PORT: u32 = 1 << 7;
/// A bridge port whose STP state is not forwarding: the kernel bridge drops what it receives
/// and sends nothing out of it (`Reason::PassBridgePortNotForwarding`).
pub const IFACE_F_PORT_NOT_FORWARDING: u32 = 1 << 8;
/// The program runs on this interface in generic (skb) mode: what it receives goes to the
/// kernel (`Reason::PassGenericXdp`). In that mode the kernel has already built an skb, maybe
/// with a checksum it validated in software (`CHECKSUM_COMPLETE`); a packet rewritten and
/// redirected from there keeps that stale state, and a veth hands it to the next namespace,
/// whose stack then drops it as a checksum error. The daemon sets this flag before attaching
/// and clears it once the attachment is native.
pub const IFACE_F_GENERIC_XDP: u32 = 1 << 11;

/// The interface is an 802.1Q / 802.1ad VLAN device (`eth0.7`) over
/// [`IfaceInfo::lower_ifindex`]. On XDP the program runs on that parent, where frames with
/// this VLAN's tag ([`MAP_VLANS`]) are routed as this device's (tag popped), and a packet
/// routed out of it gets [`IfaceInfo::vlan_tci_be`] / [`IfaceInfo::vlan_tpid_be`] pushed and
/// is redirected to the parent. Where the parent has no native XDP, the TC fast path runs on
/// the VLAN device itself (the kernel untags its frames before), and a packet routed out of
/// it from TC is redirected to it untagged (its transmit path tags it). Its own
/// `IFACE_F_SHAPED` / `IFACE_F_EGRESS_HOOK` / `IFACE_F_INGRESS_HOOK` apply (the kernel passes
/// the VLAN device first), and the parent's entry must allow the redirect too.
pub const IFACE_F_VLAN: u32 = 1 << 9;
/// The interface is managed only as the parent of VLAN devices (it is not in the config
/// itself): its untagged frames go to the kernel (`Reason::PassVlanParentUntagged`). On a
/// bridge ([`IFACE_F_BRIDGE`]) and on its ports: the bridge is managed only for the VLAN
/// devices over it, so what its ports receive for the bridge device itself goes to the kernel
/// (the same reason), and nothing is routed out of the bridge itself.
pub const IFACE_F_VLAN_PARENT: u32 = 1 << 10;

/// The interface is a PPP device carrying a PPPoE session (`ppp0`) over the Ethernet (or
/// VLAN) device [`IfaceInfo::lower_ifindex`]: the program runs on that device, where session
/// frames of [`IfaceInfo::pppoe_sid_be`] from [`IfaceInfo::peer_mac`] ([`MAP_PPPOE`]) are
/// routed as this device's (PPPoE and PPP headers removed), and a packet routed out of it gets
/// them pushed and is sent to the peer from the lower device. Its own `IFACE_F_SHAPED` /
/// `IFACE_F_EGRESS_HOOK` / `IFACE_F_INGRESS_HOOK` apply (the kernel passes the PPP device
/// first), and the lower device's entry must allow the redirect too. `mac` is the lower
/// device's MAC (session frames are sent from and to it).
pub const IFACE_F_PPPOE: u32 = 1 << 12;
/// The interface is managed only as the lower device of PPPoE sessions (it is not in the
/// config itself): what it receives outside the sessions goes to the kernel
/// (`Reason::PassPppoeLowerOther`).
pub const IFACE_F_PPPOE_LOWER: u32 = 1 << 13;
/// Set by the datapath on a PPPoE device when the access concentrator sends a compressed (or
/// MPPE-encrypted) datagram on the session or acknowledges a CCP option: CCP runs there, and
/// the kernel's compressor, decompressor or encryption keeps state across packets (and MPPE
/// requires every packet encrypted), so from then on nothing of the session is forwarded in
/// XDP, either way (`Reason::PassPppoeCcp`). The daemon keeps the bit and clears it only when
/// it binds a session anew.
pub const IFACE_F_PPP_CCP: u32 = 1 << 14;

/// The bridge filters by VLAN (`vlan_filtering 1`, the OpenWrt DSA layout): set on the bridge
/// ([`IFACE_F_BRIDGE`]) and on each of its ports ([`IFACE_F_BRIDGE_PORT`]), whose
/// [`IfaceInfo::vlan_tpid_be`] is then the bridge's `vlan_protocol` and
/// [`IfaceInfo::vlan_tci_be`] its PVID (the bridge's own for the bridge; 0 = none).
///
/// - A frame on a port is in its tag's VLAN (a tag of the bridge's protocol) or, untagged, in
///   the port's PVID; the port must be a member of that VLAN ([`MAP_BRIDGE_VLANS`]), the FDB
///   entry of its source is looked up in that VLAN ([`FdbKey::vid`]), and the bridge itself must
///   be a member too. The IP layer then sees it on the bridge when the bridge's entry is
///   untagged ([`BRIDGE_VLAN_F_UNTAGGED`]), else on the managed VLAN device over the bridge
///   for that VLAN ([`MAP_VLANS`] with the bridge as parent: `br-lan.20`).
/// - A packet routed out of the bridge is in the bridge's PVID, one routed out of a VLAN device
///   over it in that device's VLAN; the FDB names the port in that VLAN, the port must be a
///   member, and it leaves tagged unless the port's entry is untagged.
///
/// Anything else the bridge would drop or flood (`Reason::PassBridgeVlanFiltered`, ...).
pub const IFACE_F_BRIDGE_VLAN_FILTERING: u32 = 1 << 15;

/// The TC fast path ([`TC_PROG_NAME`]) also runs at TC ingress of this native-XDP interface,
/// behind the XDP program, for the packets XDP hands it: those of offloaded flows routed out of
/// a device that cannot transmit XDP frames ([`IFACE_F_NO_XDP_XMIT`]: a port on the TC datapath,
/// a macvlan, a Wi-Fi port). The XDP program leaves such a packet untouched, puts
/// [`XDP_TC_HANDOFF`] in its metadata and passes it without counting it; the TC program
/// forwards it through the egress device's transmit path (or passes it, counted under its
/// reason). Packets without the metadata were counted by XDP and are not looked at again. Set
/// by the daemon after the TC program is attached, cleared before it is detached.
pub const IFACE_F_TC_HANDOFF: u32 = 1 << 16;

/// The interface has no link-layer header (WireGuard's `wg0`, `tun0`, GRE, IPIP): its packets
/// start with the IP header, in both directions. Only the TC fast path runs there: it reads a
/// received packet's family from the skb (`skb->protocol`) and pushes an Ethernet header
/// (`bpf_skb_change_head`) before it redirects one to an Ethernet device; a packet redirected
/// to it loses its Ethernet header in the kernel's redirect (`__bpf_redirect_no_mac`). Always
/// with [`IFACE_F_NO_XDP_XMIT`]: the XDP program writes Ethernet frames, so what it would send
/// there is handed to the TC fast path instead ([`IFACE_F_TC_HANDOFF`]).
pub const IFACE_F_L3: u32 = 1 << 17;

/// The XDP metadata (four bytes before the frame, `bpf_xdp_adjust_meta`) that hands a packet
/// to the TC fast path on an [`IFACE_F_TC_HANDOFF`] interface.
pub const XDP_TC_HANDOFF: u32 = 0x7c68_0ff0;

/// Value of [`MAP_IFACES`], keyed by ifindex (host order): a managed interface.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IfaceInfo {
    /// Slot in [`MAP_STATS`], 1..MAX_IFACE_SLOTS.
    pub slot: u32,
    /// `IFACE_F_*`.
    pub flags: u32,
    /// The interface's own MAC address: only frames sent to it are forwarded
    /// (`Reason::PassDstMacNotOurs` otherwise). Kept up to date by the daemon. For a bridge
    /// port: the bridge's MAC.
    pub mac: [u8; 6],
    /// For a VLAN device ([`IFACE_F_VLAN`]): the TCI it tags frames with (network order):
    /// its VLAN ID, priority 0 (the kernel's default `egress-qos-map`). For a VLAN-filtering
    /// bridge or its port ([`IFACE_F_BRIDGE_VLAN_FILTERING`]): its PVID the same way (0 =
    /// none: untagged frames are dropped). Else 0.
    pub vlan_tci_be: u16,
    /// The interface the kernel's IP layer sees packets of this one on (host order): the
    /// bridge's ifindex for a bridge port ([`IFACE_F_BRIDGE_PORT`]); 0 = this interface.
    pub l3_ifindex: u32,
    /// For a VLAN device ([`IFACE_F_VLAN`]): its parent's ifindex (host order), where tagged
    /// frames are sent. Else 0.
    pub lower_ifindex: u32,
    /// For a VLAN device: its tag protocol, 0x8100 (802.1Q) or 0x88a8 (802.1ad), network
    /// order. For a VLAN-filtering bridge or its port: the bridge's `vlan_protocol`, the same
    /// way. Else 0.
    pub vlan_tpid_be: u16,
    /// For a PPPoE device ([`IFACE_F_PPPOE`]): its session ID (network order). Else 0.
    pub pppoe_sid_be: u16,
    /// For a PPPoE device: the access concentrator's MAC, where its session frames come from
    /// and go to. Else 0.
    pub peer_mac: [u8; 6],
    pub _pad: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<IfaceInfo>() == 36);

/// Key of [`MAP_VLANS`]: a VLAN tag as it arrives on a managed VLAN's parent. The value is
/// the VLAN device's ifindex (host order), which has its own [`IfaceInfo`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VlanKey {
    /// The parent's ifindex (host order), where the XDP program runs.
    pub parent_ifindex: u32,
    /// The VLAN ID (host order, 1..4094).
    pub vid: u16,
    /// The tag protocol (network order): 0x8100 or 0x88a8.
    pub tpid_be: u16,
}
const _: () = assert!(core::mem::size_of::<VlanKey>() == 8);

/// Capacity of [`MAP_VLANS`] (managed VLAN devices).
pub const VLANS_CAPACITY: u32 = 64;

/// Key of [`MAP_PPPOE`]: a PPPoE session as its frames arrive on the lower device. The value
/// is the PPP device's ifindex (host order), whose [`IfaceInfo`] names the session's peer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PppoeKey {
    /// The lower device's ifindex (host order): the Ethernet port, or the VLAN device the
    /// session runs over.
    pub lower_ifindex: u32,
    /// The session ID (network order).
    pub sid_be: u16,
    pub _pad: u16,
}
const _: () = assert!(core::mem::size_of::<PppoeKey>() == 8);

/// Capacity of [`MAP_PPPOE`] (managed PPPoE sessions).
pub const PPPOE_CAPACITY: u32 = 16;
