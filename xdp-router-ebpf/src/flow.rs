//! The per-packet pipeline: parse and check the headers, find the offloaded flow, ask the kernel
//! FIB where the translated packet goes, and only then rewrite and redirect it.
//!
//! Every function returns `Err(reason)` for a packet the kernel must handle; nothing is written
//! to the packet before the last check has passed, so a passed packet is exactly as received.

use core::{
    intrinsics::{AtomicOrdering, atomic_xadd},
    mem::{size_of, transmute},
    ptr::addr_of_mut,
};

use aya_ebpf::{
    EbpfContext as _,
    bindings::{bpf_fib_lookup, xdp_action},
    helpers::{
        bpf_fib_lookup as fib_lookup, bpf_ktime_get_coarse_ns, bpf_xdp_adjust_head,
        bpf_xdp_adjust_tail,
    },
    programs::XdpContext,
};
use xdp_router_common::{
    FIB_LOOKUP_MARK, FLOW_DSCP_KNOWN, FLOW_F_REPLY, FLOW_TTL_KNOWN, FibCache, FlowCounters,
    FlowKeyV4, FlowKeyV6, IFACE_F_BRIDGE, IFACE_F_BRIDGE_PORT, IFACE_F_EGRESS_HOOK,
    IFACE_F_GENERIC_XDP, IFACE_F_INGRESS_HOOK, IFACE_F_NO_XDP_XMIT, IFACE_F_PORT_NOT_FORWARDING,
    IFACE_F_PPPOE, IFACE_F_PPPOE_LOWER, IFACE_F_SHAPED, IFACE_F_VLAN, IFACE_F_VLAN_PARENT,
    IfaceInfo, Reason, SETTINGS_F_FIB_MARK, VlanKey,
    checksum::{pseudo_v4, pseudo_v6},
    parse::{
        ETH_HLEN, ETH_P_IP, ETH_P_IPV6, ETH_P_PPP_SES, IPPROTO_TCP, IPPROTO_UDP, IPV4_HLEN,
        IPV6_HLEN, Ipv4Fields, Ipv6Fields, L3, PPP_IP, PPP_IPV6, PPPOE_HLEN, PPPOE_VER_TYPE,
        VLAN_HLEN, check_fib_result, check_ipv4, check_ipv6, check_tcp, check_udp, check_vlan_tag,
        classify_ethertype, fib, is_vlan_tpid,
    },
};

use crate::{
    bridge,
    maps::{
        ACTIVE_V4, ACTIVE_V6, FLOWS_V4, FLOWS_V6, IFACES, SETTINGS, TX_PORTS, VLANS, fib_flags,
    },
    parse::{EthHdr, Ipv4Hdr, Ipv6Hdr, PppoeHdr, TcpHdr, UdpHdr, VlanHdr, VlanTag, ptr_at_mut},
    pppoe,
    rewrite::{self, L4, NextHop},
    verify,
};

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// A packet the fast path sent: the XDP action to return and the reason to count it under.
pub struct Forwarded {
    /// `XDP_REDIRECT` (or what `bpf_redirect_map` returned).
    pub action: u32,
    /// [`Reason::ForwardedOriginal`] or [`Reason::ForwardedReply`].
    pub reason: Reason,
    /// Length of the frame sent (Ethernet header + IP datagram: padding trimmed).
    pub bytes: u64,
}

/// Forwards the packet in `ctx`, received on `ifindex` (whose `IFACES` entry is `info`), or
/// says why the kernel must have it. A frame tagged for a managed VLAN device, or a session
/// frame of a managed PPPoE device, is counted under that device's stats slot: `slot` is set
/// to it.
#[inline(always)]
pub fn try_forward(
    ctx: &XdpContext,
    ifindex: u32,
    info: Option<*const IfaceInfo>,
    slot: &mut u32,
) -> Result<Forwarded, Reason> {
    // Switched off by the daemon (A/B runs, maintenance): the kernel carries everything.
    let Some(settings) = SETTINGS.get(0) else {
        return Err(Reason::PassDisabled);
    };
    let cache = FibCachePolicy {
        generation: settings.fib_generation,
        max_age_ns: settings.fib_cache_ns,
        ruleset_generation: settings.ruleset_generation,
        fib_mark: settings.flags & SETTINGS_F_FIB_MARK != 0,
        active_since_ns: settings.active_since_ns,
    };
    if settings.fastpath_enabled == 0 {
        return Err(Reason::PassDisabled);
    }
    let verify_l4 = settings.verify_l4_checksum != 0;
    // SAFETY: a map value pointer returned by the kernel is valid for reads of IfaceInfo.
    if info.is_some_and(|i| unsafe { (*i).flags } & IFACE_F_GENERIC_XDP != 0) {
        return Err(Reason::PassGenericXdp);
    }
    // An nftables netdev ingress chain or tc ingress filter on this interface runs after XDP:
    // a redirected packet would skip it.
    // SAFETY: a map value pointer returned by the kernel is valid for reads of IfaceInfo.
    if info.is_some_and(|i| unsafe { (*i).flags } & IFACE_F_INGRESS_HOOK != 0) {
        return Err(Reason::PassIngressHook);
    }
    // SAFETY: a map value pointer returned by the kernel is valid for reads of IfaceInfo.
    let (flags, l3_ifindex) = info.map_or((0, 0), |i| unsafe { ((*i).flags, (*i).l3_ifindex) });
    let eth: *mut EthHdr = ptr_at_mut(ctx, 0)?;
    // SAFETY: ptr_at_mut checked that the header is inside the frame.
    let (ethertype, tpid_be) = unsafe { ((*eth).ethertype(), (*eth).ethertype_be) };
    // The frame's VLAN tag (protocol, TCI: raw; the EtherType after it: host order).
    let tag = if is_vlan_tpid(ethertype) {
        Some(read_tag(ctx, tpid_be)?)
    } else {
        None
    };
    // A tagged frame for a managed VLAN device over the port it arrived on (`eth0.7`, or
    // `eth1.20` with eth1 in br-lan) is that device's: the kernel hands it over
    // (`vlan_do_receive`) before a bridge sees it.
    let mut vlan = tag.map(|(tpid_be, tci_be, inner)| {
        check_vlan_tag(u16::from_be(tci_be), inner)
            .and_then(|vid| vlan_device_of(ifindex, vid, tpid_be))
    });
    let port_vlan = matches!(vlan, Some(Ok(_)));
    let mut iif = ifindex;
    let mut l3_info = info;
    if flags & IFACE_F_BRIDGE_PORT != 0 && !port_vlan {
        // A frame on a bridge port that is not addressed to the bridge is the bridge's to
        // forward (LAN to LAN, STP, multicast, broadcast), whatever it carries.
        verify::dst_mac_is_ours(eth, info).map_err(|_| Reason::PassBridged)?;
        if flags & IFACE_F_PORT_NOT_FORWARDING != 0 {
            // The bridge drops what a blocking/listening/learning port receives.
            return Err(Reason::PassBridgePortNotForwarding);
        }
        let Some(port_info) = info else {
            return Err(Reason::PassBridged);
        };
        // The VLAN the bridge has it in, and the device it passes it up to.
        let up = bridge::ingress(l3_ifindex, ifindex, port_info, flags, tag)?;
        // The bridge learns where hosts are from the frames it sees; the ones XDP forwards it
        // never sees. A source the FDB does not place on this port (in this VLAN) goes to the
        // kernel so the bridge learns it (and a host whose entry aged out is learned again).
        // SAFETY: ptr_at_mut checked that the header is inside the frame.
        let src = unsafe { (*eth).src };
        if bridge::fdb_port(l3_ifindex, src, up.vid) != Some(ifindex) {
            return Err(Reason::PassBridgeLearning);
        }
        // The IP layer sees it as received by the bridge (flow keys and FIB lookups use the
        // bridge's ifindex, as conntrack and the kernel's routing do), or by the VLAN device
        // over the bridge.
        iif = l3_ifindex;
        vlan = up.upper.map(Ok);
    }
    let mut l2 = ETH_HLEN;
    if let Some(vlan) = vlan {
        // The kernel hands a frame tagged for one of its VLAN devices to that device
        // (`vlan_do_receive`): the IP layer sees it as received there, untagged. Flow keys,
        // FIB lookups and the MAC check use the VLAN device, as conntrack and routing do.
        let vlan = vlan?;
        *slot = crate::stats::ingress_slot(Some(vlan.info));
        // SAFETY: a map value pointer returned by the kernel is valid for reads.
        if unsafe { (*vlan.info).flags } & IFACE_F_INGRESS_HOOK != 0 {
            // Hooks on the VLAN device run after XDP too.
            return Err(Reason::PassIngressHook);
        }
        iif = vlan.ifindex;
        l3_info = Some(vlan.info);
    }
    // Whatever device takes it, the IP header follows the tag the frame arrived with.
    let ethertype = if let Some((_, _, inner)) = tag {
        l2 = ETH_HLEN + VLAN_HLEN;
        inner
    } else {
        ethertype
    };
    let (l3, ip_len_max) = if ethertype == ETH_P_PPP_SES {
        // A PPPoE session frame: the kernel hands it to the session's PPP device, where the IP
        // layer sees it (flow keys, FIB lookups), without the PPPoE and PPP headers. It is
        // addressed to the lower device.
        verify::dst_mac_is_ours(eth, l3_info)?;
        // SAFETY: ptr_at_mut checked that the header is inside the frame.
        let src = unsafe { (*eth).src };
        let session = pppoe::session(ctx, iif, l2, src)?;
        *slot = crate::stats::ingress_slot(Some(session.info));
        // SAFETY: a map value pointer returned by the kernel is valid for reads.
        if unsafe { (*session.info).flags } & IFACE_F_INGRESS_HOOK != 0 {
            // Hooks on the PPP device run after XDP too.
            return Err(Reason::PassIngressHook);
        }
        iif = session.ifindex;
        l2 += PPPOE_HLEN;
        (session.l3, session.ip_len_max)
    } else {
        if tag.is_none()
            && flags & (IFACE_F_VLAN_PARENT | IFACE_F_BRIDGE_PORT) == IFACE_F_VLAN_PARENT
        {
            // The parent device itself is not managed: the kernel routes what it receives
            // untagged. (A frame whose tag the NIC stripped into metadata, rx VLAN offload,
            // also arrives here and so also goes to the kernel, which knows its VLAN.)
            return Err(Reason::PassVlanParentUntagged);
        }
        // SAFETY: a map value pointer returned by the kernel is valid for reads of IfaceInfo.
        if l3_info.is_some_and(|i| unsafe { (*i).flags } & IFACE_F_PPPOE_LOWER != 0) {
            // Managed only for its PPPoE sessions: the kernel routes the rest.
            return Err(Reason::PassPppoeLowerOther);
        }
        let l3 = classify_ethertype(ethertype)?;
        verify::dst_mac_is_ours(eth, l3_info)?;
        (l3, frame_len(ctx) - l2)
    };
    match l3 {
        L3::V4 => try_forward_v4(ctx, iif, l2, ip_len_max, &cache, verify_l4),
        L3::V6 => try_forward_v6(ctx, iif, l2, ip_len_max, &cache, verify_l4),
    }
}

/// A managed VLAN device a tagged frame belongs to.
pub struct VlanDevice {
    pub ifindex: u32,
    pub info: *const IfaceInfo,
}

/// The VLAN tag of a frame whose EtherType (raw: `tpid_be`) is a VLAN TPID: its protocol and
/// TCI (raw) and the EtherType after it (host order).
#[inline(always)]
fn read_tag(ctx: &XdpContext, tpid_be: u16) -> Result<(u16, u16, u16), Reason> {
    let tag: *mut VlanHdr = ptr_at_mut(ctx, ETH_HLEN)?;
    // SAFETY: bounds checked by ptr_at_mut.
    let (tci_be, inner) = unsafe { ((*tag).tci_be, u16::from_be((*tag).inner_ethertype_be)) };
    Ok((tpid_be, tci_be, inner))
}

/// The managed VLAN device over `parent` for VLAN `vid` with tag protocol `tpid_be` (raw), per
/// `VLANS`, or why the kernel must have the frame.
#[inline(always)]
pub fn vlan_device_of(parent: u32, vid: u16, tpid_be: u16) -> Result<VlanDevice, Reason> {
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

/// What the transport header says about the packet.
struct Ports {
    /// Source port (raw).
    sport: u16,
    /// Destination port (raw).
    dport: u16,
    /// The segment carries no checksum (UDP with 0): nothing to verify.
    no_checksum: bool,
}

/// The transport header after `l2` bytes of Ethernet header (and VLAN tag) and an IP header
/// of `l3_len` bytes, with `l4_len` bytes of segment: TCP (data offset, control flags, ACK) or
/// UDP (length), checked as conntrack checks them.
#[inline(always)]
fn l4_ports(
    ctx: &XdpContext,
    proto: u8,
    l2: usize,
    l3_len: usize,
    l4_len: usize,
) -> Result<Ports, Reason> {
    let off = l2 + l3_len;
    if proto == IPPROTO_TCP {
        let tcp: *mut TcpHdr = ptr_at_mut(ctx, off)?;
        // SAFETY: bounds checked by ptr_at_mut.
        let (doff, flags, sport, dport) = unsafe {
            (
                (*tcp).doff_res,
                (*tcp).flags,
                (*tcp).sport_be,
                (*tcp).dport_be,
            )
        };
        // Connection setup and teardown drive conntrack's TCP state machine: it must see them;
        // what conntrack would call INVALID is its to judge too.
        check_tcp(doff, flags, l4_len)?;
        Ok(Ports {
            sport,
            dport,
            no_checksum: false,
        })
    } else {
        // check_ipv4 / check_ipv6 only let TCP and UDP through.
        let udp: *mut UdpHdr = ptr_at_mut(ctx, off)?;
        // SAFETY: bounds checked by ptr_at_mut.
        let (len, check, sport, dport) = unsafe {
            (
                u16::from_be((*udp).len_be),
                (*udp).check,
                (*udp).sport_be,
                (*udp).dport_be,
            )
        };
        check_udp(len, l4_len)?;
        // 0 = "no checksum" for conntrack in both families (udp_error()).
        Ok(Ports {
            sport,
            dport,
            no_checksum: check == 0,
        })
    }
}

/// The frame as it leaves: its Ethernet header, the VLAN tag to write after the MACs (when
/// the egress is a VLAN device, or a PPPoE session over one), the EtherType after it, the
/// PPPoE header after that (when the egress is a PPPoE device) and the IP header, all
/// re-derived after the resize.
struct Reframed<T> {
    eth: *mut EthHdr,
    tag: Option<*mut VlanTag>,
    ethertype: *mut u16,
    pppoe: Option<*mut PppoeHdr>,
    ip: *mut T,
    /// Length of the Ethernet header, tag and PPPoE header as the frame leaves.
    l2: usize,
}

/// Gives the frame the L2 header its egress needs and cuts it down to that header plus the
/// `ip_len`-byte IP datagram. `l2_in` is the received header's length (14, plus 4 with a tag,
/// plus 8 for a PPPoE session); the outgoing one is 14, plus 4 when `tag` has a VLAN tag,
/// plus 8 when it has a PPPoE session: `bpf_xdp_adjust_head` removes what the received
/// header has more or makes room for what the new one needs (the MACs, tag, EtherType and
/// PPPoE header are written by the caller). Done before anything is written, so a failed
/// resize passes the frame as received.
///
/// Bytes beyond the datagram (Ethernet padding, garbage) are cut as the kernel trims the skb
/// (`pskb_trim_rcsum` in `ip_rcv_core` / `ip6_rcv_core`): they must not leave, and would count
/// against the egress MTU. Every packet pointer is invalid after either helper, hence the
/// re-derived ones.
#[inline(always)]
fn reframe<T>(
    ctx: &XdpContext,
    l2_in: usize,
    ip_len: usize,
    tag: &EgressTag,
) -> Result<Reframed<T>, Reason> {
    let vlan = if tag.tpid_be != 0 { VLAN_HLEN } else { 0 };
    let session = if tag.pppoe { PPPOE_HLEN } else { 0 };
    let l2 = ETH_HLEN + vlan + session;
    if l2 != l2_in {
        // A positive delta pops received headers, a negative one makes room for new ones.
        let delta = l2_in as i32 - l2 as i32;
        // SAFETY: a helper on this program's own context; XDP frames have 256 bytes of
        // headroom (XDP_PACKET_HEADROOM) and the frame is longer than the tag.
        if unsafe { bpf_xdp_adjust_head(ctx.ctx, delta) } != 0 {
            return Err(Reason::PassMalformed);
        }
    }
    let len = l2 + ip_len;
    let have = frame_len(ctx);
    if have > len {
        // Both below 64 KiB: the difference fits an i32.
        let delta = len as i32 - have as i32;
        // SAFETY: a helper on this program's own context; a negative delta only shrinks.
        if unsafe { bpf_xdp_adjust_tail(ctx.ctx, delta) } != 0 {
            return Err(Reason::PassMalformed);
        }
    }
    let tag_ptr = if tag.tpid_be != 0 {
        Some(ptr_at_mut(ctx, 12)?)
    } else {
        None
    };
    let pppoe_ptr = if tag.pppoe {
        Some(ptr_at_mut(ctx, ETH_HLEN + vlan)?)
    } else {
        None
    };
    Ok(Reframed {
        eth: ptr_at_mut(ctx, 0)?,
        tag: tag_ptr,
        ethertype: ptr_at_mut(ctx, 12 + vlan)?,
        pppoe: pppoe_ptr,
        ip: ptr_at_mut(ctx, l2)?,
        l2,
    })
}

/// Writes the egress's headers between the MACs and the IP header of an `ip_len`-byte
/// datagram of family `l3`: the VLAN tag, the EtherType and the PPPoE session header, as far
/// as the egress has them (after the rewrite: nothing can fail by then). The EtherType is
/// always written: a received PPPoE frame's was 0x8864.
#[inline(always)]
fn write_l2<T>(out: &Reframed<T>, tag: &EgressTag, l3: L3, ip_len: usize) {
    if let Some(t) = out.tag {
        // SAFETY: bounds checked by ptr_at_mut in `reframe`.
        unsafe {
            (*t).tpid_be = tag.tpid_be;
            (*t).tci_be = tag.tci_be;
        }
    }
    let (ethertype, ppp_proto) = match l3 {
        L3::V4 => (ETH_P_IP, PPP_IP),
        L3::V6 => (ETH_P_IPV6, PPP_IPV6),
    };
    if let Some(h) = out.pppoe {
        // SAFETY: bounds checked by ptr_at_mut in `reframe`.
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
}

// Stack structs are built from 32-bit words. Runs of constant zero stores would be merged by
// LLVM into a `memset`, which the BPF backend (LLVM 22 via bpf-linker) lowers to a call to a
// byte-by-byte loop; words of non-constant values are stored as they are.

/// A zero the optimiser cannot see through (one stack store and load), so that zero fields do
/// not turn into a `memset` call.
#[inline(always)]
fn opaque_zero() -> u32 {
    let zero = 0u32;
    // SAFETY: reading a live local.
    unsafe { core::ptr::read_volatile(&zero) }
}

/// Two raw 16-bit words as the raw 32-bit word they form in memory (first one first).
#[inline(always)]
pub fn pack16(first: u16, second: u16) -> u32 {
    let [a, b] = first.to_ne_bytes();
    let [c, d] = second.to_ne_bytes();
    u32::from_ne_bytes([a, b, c, d])
}

/// The `FLOWS_V4` key of a packet.
#[inline(always)]
fn key_v4(ifindex: u32, src: u32, dst: u32, sport: u16, dport: u16, proto: u8) -> FlowKeyV4 {
    let words = [
        ifindex,
        src,
        dst,
        pack16(sport, dport),
        u32::from_ne_bytes([proto, 0, 0, 0]),
    ];
    // SAFETY: FlowKeyV4 is #[repr(C)], 20 bytes of integers without implicit padding (ifindex,
    // src, dst, sport+dport, proto+_pad), so these words are exactly its fields in order.
    unsafe { transmute::<[u32; 5], FlowKeyV4>(words) }
}

/// The `FLOWS_V6` key of a packet.
#[inline(always)]
fn key_v6(
    ifindex: u32,
    src: [u32; 4],
    dst: [u32; 4],
    sport: u16,
    dport: u16,
    proto: u8,
) -> FlowKeyV6 {
    let [s0, s1, s2, s3] = src;
    let [d0, d1, d2, d3] = dst;
    let words = [
        ifindex,
        s0,
        s1,
        s2,
        s3,
        d0,
        d1,
        d2,
        d3,
        pack16(sport, dport),
        u32::from_ne_bytes([proto, 0, 0, 0]),
    ];
    // SAFETY: FlowKeyV6 is #[repr(C)], 44 bytes of integers without implicit padding, laid out
    // as these words.
    unsafe { transmute::<[u32; 11], FlowKeyV6>(words) }
}

/// `bpf_fib_lookup` input (uapi layout: family, l4_protocol, sport, dport, tot_len, ifindex,
/// tos/flowinfo, src, dst, tbid/vlan, mark/smac, dmac). The kernel routes a forwarded packet
/// after DNAT and before SNAT, so callers pass the received source (address and port) and the
/// translated destination: `ip rule from`/`sport` rules then see what the kernel saw.
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per lookup input field"
)]
#[inline(always)]
fn fib_params(
    family: u8,
    proto: u8,
    sport_be: u16,
    dport_be: u16,
    tot_len: u16,
    ifindex: u32,
    tos_or_flowinfo: u32,
    src_be: [u32; 4],
    dst_be: [u32; 4],
    mark: u32,
) -> bpf_fib_lookup {
    let zero = opaque_zero();
    let [sp0, sp1] = sport_be.to_ne_bytes();
    let [s0, s1, s2, s3] = src_be;
    let [d0, d1, d2, d3] = dst_be;
    let words = [
        u32::from_ne_bytes([family, proto, sp0, sp1]),
        pack16(dport_be, tot_len),
        ifindex,
        tos_or_flowinfo,
        s0,
        s1,
        s2,
        s3,
        d0,
        d1,
        d2,
        d3,
        // tbid (input only with BPF_FIB_LOOKUP_TBID), then smac and dmac (outputs), whose
        // first 4 bytes are the `mark` input (Linux 6.10 uapi, read with BPF_FIB_LOOKUP_MARK).
        zero,
        mark,
        zero,
        zero,
    ];
    // SAFETY: bpf_fib_lookup is the 64-byte #[repr(C)] uapi struct of integers and unions of
    // integers, 4-byte aligned, laid out as these words.
    unsafe { transmute::<[u32; 16], bpf_fib_lookup>(words) }
}

/// When a flow's cached FIB answer may be used (from [`xdp_router_common::Settings`]).
pub struct FibCachePolicy {
    /// `Settings::fib_generation`; 0 = no caching.
    generation: u32,
    /// `Settings::fib_cache_ns`; 0 = no caching.
    max_age_ns: u64,
    /// `Settings::ruleset_generation`: a flow direction armed under another one goes to the
    /// kernel (see [`check_armed`]).
    ruleset_generation: u32,
    /// `bpf_fib_lookup` takes a mark (`SETTINGS_F_FIB_MARK`).
    fib_mark: bool,
    /// `Settings::active_since_ns`: start of the daemon's keep-alive pass (see [`first_in_pass`]).
    active_since_ns: u64,
}

impl FibCachePolicy {
    #[inline(always)]
    fn enabled(&self) -> bool {
        self.generation != 0 && self.max_age_ns != 0
    }
}

/// The flow's cached next hop, if it is valid for a packet of IP length `len` with lookup input
/// `tos_flowinfo` at `now` (see [`FibCache`] for the rules).
#[inline(always)]
fn cached_hop(
    cache: *const FibCache,
    policy: &FibCachePolicy,
    now: u64,
    len: u16,
    tos_flowinfo: u32,
) -> Option<NextHop> {
    use core::ptr::{addr_of, read_volatile};
    if !policy.enabled() {
        return None;
    }
    // SAFETY: `cache` points into a live flow map value. Volatile reads keep their order: the
    // generation is read first and again last, and a writer zeroes it before it rewrites the
    // other fields (see store_hop), so a copy taken while a writer was busy is discarded.
    unsafe {
        let generation = read_volatile(addr_of!((*cache).generation));
        if generation != policy.generation
            || now.wrapping_sub(read_volatile(addr_of!((*cache).filled_ns))) >= policy.max_age_ns
            || len > read_volatile(addr_of!((*cache).max_len))
            || tos_flowinfo != read_volatile(addr_of!((*cache).tos_flowinfo))
        {
            return None;
        }
        let hop = NextHop {
            ifindex: read_volatile(addr_of!((*cache).ifindex)),
            smac: read_volatile(addr_of!((*cache).smac)),
            dmac: read_volatile(addr_of!((*cache).dmac)),
        };
        (read_volatile(addr_of!((*cache).generation)) == generation).then_some(hop)
    }
}

/// Keeps a lookup's answer in the flow entry for its next packets.
#[inline(always)]
fn store_hop(
    cache: *mut FibCache,
    policy: &FibCachePolicy,
    now: u64,
    len: u16,
    tos_flowinfo: u32,
    hop: &NextHop,
) {
    use core::ptr::{addr_of_mut, write_volatile};
    if !policy.enabled() {
        return;
    }
    // SAFETY: `cache` points into a live flow map value; see cached_hop for the protocol.
    // Two CPUs filling the same entry at once write the answers of the same generation.
    unsafe {
        write_volatile(addr_of_mut!((*cache).generation), 0);
        write_volatile(addr_of_mut!((*cache).ifindex), hop.ifindex);
        write_volatile(addr_of_mut!((*cache).tos_flowinfo), tos_flowinfo);
        write_volatile(addr_of_mut!((*cache).max_len), len);
        write_volatile(addr_of_mut!((*cache).smac), hop.smac);
        write_volatile(addr_of_mut!((*cache).dmac), hop.dmac);
        write_volatile(addr_of_mut!((*cache).filled_ns), now);
        write_volatile(addr_of_mut!((*cache).generation), policy.generation);
    }
}

/// `Ok(fib_mark)` when the kernel itself forwarded this flow direction under the current
/// firewall ruleset (the TC egress program recorded it in `armed` and `mark`), else why not.
/// This is what makes the fast path follow iptables/nftables: a new flow, and every flow after
/// any ruleset change, has its next packet judged by the kernel's rules, and only a packet the
/// kernel forwarded re-arms the direction.
#[inline(always)]
fn check_armed(
    armed: *const u32,
    mark: *const u32,
    policy: &FibCachePolicy,
) -> Result<u32, Reason> {
    // SAFETY: both point into a live flow map value; the TC program writes the mark first.
    let (armed, mark) = unsafe {
        (
            core::ptr::read_volatile(armed),
            core::ptr::read_volatile(mark),
        )
    };
    if armed != policy.ruleset_generation {
        // The TC program leaves a marked direction unarmed when the lookup cannot take a mark.
        if mark != 0 && !policy.fib_mark {
            return Err(Reason::PassMarkUnsupported);
        }
        return Err(Reason::PassNotArmed);
    }
    Ok(mark)
}

/// `Ok` when the packet's `dscp` is the one the kernel sent this flow direction out with when it
/// armed it (`kernel_dscp`, see `FlowV4::kernel_dscp`), or none was recorded. A rule in the
/// forward path that rewrites the DSCP makes them differ; the kernel then carries the packet,
/// so the rule applies to it.
#[inline(always)]
fn check_dscp(kernel_dscp: *const u32, dscp: u8) -> Result<(), Reason> {
    // SAFETY: points into a live flow map value; the TC program writes it before arming.
    let recorded = unsafe { core::ptr::read_volatile(kernel_dscp) };
    if recorded & FLOW_DSCP_KNOWN != 0 && recorded & 0x3f != u32::from(dscp) {
        return Err(Reason::PassDscpNotKernels);
    }
    Ok(())
}

/// `Err(PassTtlNotKernels)` unless the kernel sent this direction out with `ttl - 1` (the
/// TTL / hop limit the fast path will send), per `kernel_ttl` (unchecked while none is
/// recorded).
#[inline(always)]
fn check_ttl(kernel_ttl: *const u32, ttl: u8) -> Result<(), Reason> {
    // SAFETY: points into a live flow map value; the TC program writes it before arming.
    let recorded = unsafe { core::ptr::read_volatile(kernel_ttl) };
    if recorded & FLOW_TTL_KNOWN != 0 && recorded & 0xff != u32::from(ttl.wrapping_sub(1)) {
        return Err(Reason::PassTtlNotKernels);
    }
    Ok(())
}

/// The `bpf_fib_lookup` flags for a flow direction with packet mark `mark`.
#[inline(always)]
fn lookup_flags(mark: u32) -> u32 {
    if mark != 0 {
        fib_flags() | FIB_LOOKUP_MARK
    } else {
        fib_flags()
    }
}

/// Where the translated packet goes: the flow's cached answer when it is still valid, else
/// `bpf_fib_lookup` with `params` (whose answer is then cached). `len` is the packet's IP length
/// and `tos_flowinfo` the lookup's TOS / flow information input, both as in `params`.
#[expect(
    clippy::too_many_arguments,
    reason = "the lookup's inputs plus the cache's"
)]
#[inline(always)]
fn next_hop(
    ctx: &XdpContext,
    cache: *mut FibCache,
    policy: &FibCachePolicy,
    now: u64,
    params: &mut bpf_fib_lookup,
    len: u16,
    tos_flowinfo: u32,
    mark: u32,
) -> Result<NextHop, Reason> {
    if let Some(hop) = cached_hop(cache, policy, now, len, tos_flowinfo) {
        return Ok(hop);
    }
    // SAFETY: params is a valid, initialised bpf_fib_lookup of the size passed.
    let rc = unsafe {
        fib_lookup(
            ctx.as_ptr(),
            params as *mut bpf_fib_lookup,
            size_of::<bpf_fib_lookup>() as i32,
            lookup_flags(mark),
        )
    };
    // A PPP device has no neighbours to resolve (the session names the peer's MAC), so the
    // helper may well answer "no neighbour" for it, with the egress and the MTU check done.
    if rc != fib::NO_NEIGH || !is_pppoe(params.ifindex) {
        check_fib_result(rc)?;
    }
    let hop = NextHop {
        ifindex: params.ifindex,
        smac: params.smac,
        dmac: params.dmac,
    };
    store_hop(cache, policy, now, len, tos_flowinfo, &hop);
    Ok(hop)
}

/// Whether `ifindex` is a managed PPPoE device.
#[inline(always)]
fn is_pppoe(ifindex: u32) -> bool {
    // SAFETY: a map value pointer returned by the kernel is valid for reads of IfaceInfo.
    IFACES
        .get_ptr(ifindex)
        .is_some_and(|i| unsafe { (*i).flags } & IFACE_F_PPPOE != 0)
}

/// Why the fast path must not send out of an interface with `IFACE_F_*` flags `flags`, if
/// anything.
#[inline(always)]
pub fn check_egress(flags: u32) -> Result<(), Reason> {
    if flags & IFACE_F_NO_XDP_XMIT != 0 {
        // The device would drop a redirected frame (no ndo_xdp_xmit, or a veth whose peer
        // has neither XDP nor GRO): the kernel's own output path can send it.
        return Err(Reason::PassEgressNoXdpXmit);
    }
    if flags & IFACE_F_SHAPED != 0 {
        // A redirect skips the egress qdisc; a shaped link must keep its shaping.
        return Err(Reason::PassEgressShaped);
    }
    if flags & IFACE_F_EGRESS_HOOK != 0 {
        // A redirect skips the netdev egress chain and tc egress filters too.
        return Err(Reason::PassEgressHook);
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

/// Where a packet goes once the FIB named its egress.
struct Egress {
    /// What the redirect set-up returned (`XDP_REDIRECT`).
    action: u32,
    /// The tag to push (egress is a VLAN device).
    tag: EgressTag,
}

/// The device a packet routed out of the VLAN device `info` to `dmac` is sent from (its
/// parent, or for a VLAN over a bridge the bridge's port), once the VLAN device's own egress
/// and the parent's allow a redirect; the tag to push goes to `tag`.
#[inline(always)]
pub fn vlan_parent(
    info: *const IfaceInfo,
    flags: u32,
    dmac: [u8; 6],
    tag: &mut EgressTag,
) -> Result<u32, Reason> {
    // The kernel sends a packet routed out of a VLAN device through the device (its qdisc,
    // its egress hooks), then tagged out of the parent; the VLAN device transmits nothing
    // itself.
    check_egress(flags & !IFACE_F_NO_XDP_XMIT)?;
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
        return bridge::port(parent, pinfo, pflags, dmac, Some((tpid_be, tci_be)), tag);
    }
    check_egress(pflags)?;
    tag.tpid_be = tpid_be;
    tag.tci_be = tci_be;
    Ok(parent)
}

/// The redirect set up once the FIB's egress `hop.ifindex` (and, for a bridge, the port
/// `hop.dmac` is behind; for a VLAN device, its parent; for a PPPoE device, its lower device)
/// may send the packet. Checked on every packet, cached next hop or not: the daemon flips
/// these live, and FDB moves are followed from the next packet on. For a PPPoE device the
/// session's MACs replace the hop's.
#[inline(always)]
fn redirect_to(hop: &mut NextHop) -> Result<Egress, Reason> {
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
        pppoe::lower(info, flags, hop, &mut tag)?
    } else if flags & IFACE_F_VLAN != 0 {
        vlan_parent(info, flags, hop.dmac, &mut tag)?
    } else if flags & IFACE_F_BRIDGE != 0 {
        bridge::port(egress, info, flags, hop.dmac, None, &mut tag)?
    } else if flags & (IFACE_F_BRIDGE_PORT | IFACE_F_VLAN_PARENT | IFACE_F_PPPOE_LOWER) != 0 {
        // The kernel never routes out of a bridge port itself; a VLAN parent or a PPPoE
        // lower device that is not in the config is only managed for its VLANs' tagged frames
        // or its sessions' frames.
        return Err(Reason::PassEgressNotManaged);
    } else {
        check_egress(flags)?;
        egress
    };
    // The redirect is set up now, before the rewrite: bpf_redirect_map() only records the
    // target (per-CPU redirect info, used once the program returns XDP_REDIRECT), and a
    // missing TX_PORTS entry returns the low bits of the flags (XDP_PASS) instead, so an egress
    // the daemon did not (or no longer) list goes to the kernel untouched. One devmap lookup
    // instead of a lookup to check plus another in the redirect.
    let action = TX_PORTS
        .redirect(target, u64::from(xdp_action::XDP_PASS))
        .map_err(|_| Reason::PassEgressNotManaged)?;
    Ok(Egress { action, tag })
}

/// Whether this is the flow direction's first forwarded packet since the daemon's keep-alive
/// pass started (`Settings::active_since_ns`): its connection is then recorded in the active
/// map, once per direction and pass, so the daemon's pass costs what the active connections
/// cost, not the table. Read before [`finish`] stamps `last_seen_ns`.
#[inline(always)]
fn first_in_pass(counters: *mut FlowCounters, policy: &FibCachePolicy) -> bool {
    // SAFETY: `counters` points into a live flow map value; another CPU may write it
    // concurrently, so the read is volatile (a torn or stale value only adds one insert).
    let last = unsafe { addr_of_mut!((*counters).last_seen_ns).read_volatile() };
    last < policy.active_since_ns
}

/// Counts the packet on its flow; `action` is what the redirect set-up returned.
#[inline(always)]
fn finish(counters: *mut FlowCounters, flags: u32, bytes: u64, action: u32, now: u64) -> Forwarded {
    // SAFETY: `counters` points into a flow map value (8-byte aligned); the kernel keeps it
    // alive for this program run. Several CPUs may forward the same flow, hence atomic adds
    // (BPF_ATOMIC | BPF_ADD): plain adds lose updates when two CPUs forward the same flow
    // (prog-cost --threads 2 shows it), for ~7 ns per packet saved. The bpfel target has no
    // CAS, so `AtomicU64::fetch_add` does not exist there; the intrinsic lowers to the BPF
    // atomic add directly.
    //
    // last_seen_ns (`now`) is CLOCK_MONOTONIC_COARSE (bpf_ktime_get_coarse_ns, kernel 5.11): the
    // daemon only needs it to the second for conntrack timeouts, and the precise clock
    // (bpf_ktime_get_ns, a TSC read) was a fifth of the forward path's cost on a VM.
    unsafe {
        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(addr_of_mut!((*counters).packets), 1);
        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(
            addr_of_mut!((*counters).bytes),
            bytes,
        );
        addr_of_mut!((*counters).last_seen_ns).write_volatile(now);
    }
    let reason = if flags & FLOW_F_REPLY != 0 {
        Reason::ForwardedReply
    } else {
        Reason::ForwardedOriginal
    };
    Forwarded {
        action,
        reason,
        bytes,
    }
}

/// Length of the whole frame (what the counters count).
#[inline(always)]
pub fn frame_len(ctx: &XdpContext) -> usize {
    let len = ctx.data_end() - ctx.data();
    // A number from here on, not pointers: LLVM would otherwise fold a later `len - l2` (with
    // `l2` a variable) into the end pointer, which the verifier rejects (pointer arithmetic on
    // pkt_end). One stack store and load.
    // SAFETY: reading a live local.
    unsafe { core::ptr::read_volatile(&len) }
}

/// Steps 4-11 for IPv4: checks, flow, FIB, egress, rewrite, counters, redirect.
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "the flow key stays in its one stack slot (a by-value key is copied): the program's stack is nearly full"
)]
#[inline(always)]
fn try_forward_v4(
    ctx: &XdpContext,
    ifindex: u32,
    l2: usize,
    ip_len_max: usize,
    cache: &FibCachePolicy,
    verify_l4: bool,
) -> Result<Forwarded, Reason> {
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
    // check_ipv4: tot_len covers the header and the transport header.
    let l4_len = fields.tot_len as usize - IPV4_HLEN;
    let ports = l4_ports(ctx, fields.proto, l2, IPV4_HLEN, l4_len)?;
    let (sport, dport) = (ports.sport, ports.dport);

    let mut key = key_v4(ifindex, src, dst, sport, dport, fields.proto);
    // Not offloaded (yet): new, unconfirmed, or not eligible per the daemon's policy.
    let Some(flow) = FLOWS_V4.get_ptr_mut(&key) else {
        return Err(Reason::PassNoFlow);
    };
    // SAFETY: map value pointer from the kernel; the daemon rewrites whole entries only via
    // map updates, so a copy of the translation is consistent enough for one packet.
    let nat = unsafe {
        rewrite::NatV4 {
            src_be: (*flow).new_src_be,
            dst_be: (*flow).new_dst_be,
            sport_be: (*flow).new_sport_be,
            dport_be: (*flow).new_dport_be,
            l3_csum_diff: (*flow).l3_csum_diff,
            l4_csum_diff: (*flow).l4_csum_diff,
        }
    };
    // SAFETY: `flow` is a live map value pointer.
    let flags = unsafe { (*flow).flags };
    let mark = check_armed(
        // SAFETY: `flow` is a live map value pointer.
        unsafe { addr_of_mut!((*flow).armed_generation) },
        // SAFETY: as above.
        unsafe { addr_of_mut!((*flow).fib_mark) },
        cache,
    )?;
    // SAFETY: `flow` is a live map value pointer.
    check_dscp(unsafe { addr_of_mut!((*flow).kernel_dscp) }, tos >> 2)?;
    // SAFETY: `flow` is a live map value pointer.
    check_ttl(unsafe { addr_of_mut!((*flow).kernel_ttl) }, fields.ttl)?;
    // Only packets of offloaded flows pay for it; conntrack would mark the others INVALID.
    if verify_l4 && !ports.no_checksum {
        let pseudo = pseudo_v4(src, dst, fields.proto, l4_len as u16);
        verify::l4_checksum(ctx, l2 + IPV4_HLEN, l4_len, pseudo)?;
    }

    // The TOS byte goes where the union's first byte is.
    let tos_word = u32::from_ne_bytes([tos, 0, 0, 0]);
    let mut params = fib_params(
        AF_INET,
        fields.proto,
        sport,
        nat.dport_be,
        // Host order: the helper compares it with the egress MTU.
        fields.tot_len,
        ifindex,
        tos_word,
        [src, opaque_zero(), opaque_zero(), opaque_zero()],
        [nat.dst_be, opaque_zero(), opaque_zero(), opaque_zero()],
        mark,
    );
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    // SAFETY: `flow` is a live map value pointer.
    let fib_cache = unsafe { addr_of_mut!((*flow).fib) };
    let hop = next_hop(
        ctx,
        fib_cache,
        cache,
        now,
        &mut params,
        fields.tot_len,
        tos_word,
        mark,
    )?;
    let mut hop = hop;
    let egress = redirect_to(&mut hop)?;

    let out = reframe::<Ipv4Hdr>(ctx, l2, fields.tot_len as usize, &egress.tag)?;
    let l4 = L4::at(ctx, out.l2 + IPV4_HLEN, fields.proto == IPPROTO_UDP)?;
    // Every check passed: from here on the packet is ours.
    rewrite::rewrite_v4(out.eth, out.ip, l4, &nat, &hop);
    write_l2(&out, &egress.tag, L3::V4, fields.tot_len as usize);
    // SAFETY: `flow` is a live map value pointer.
    let counters = unsafe { addr_of_mut!((*flow).counters) };
    if first_in_pass(counters, cache) {
        // The connection by its original tuple (the flow key without the ingress): this
        // direction's key, or for the reply direction the tuple it is rewritten to, swapped.
        // Built in the lookup key's stack slot: the program's stack is nearly full.
        key.ifindex = 0;
        if flags & FLOW_F_REPLY != 0 {
            key.src_be = nat.dst_be;
            key.dst_be = nat.src_be;
            key.sport_be = nat.dport_be;
            key.dport_be = nat.sport_be;
        }
        // A failed insert (out of memory) only delays the conntrack refresh to a later pass.
        let _ = ACTIVE_V4.insert(&key, &0, 0);
    }
    Ok(finish(
        counters,
        flags,
        frame_len(ctx) as u64,
        egress.action,
        now,
    ))
}

/// Steps 4-11 for IPv6 (see [`try_forward_v4`]).
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "the flow key stays in its one stack slot (a by-value key is copied): the program's stack is nearly full"
)]
#[inline(always)]
fn try_forward_v6(
    ctx: &XdpContext,
    ifindex: u32,
    l2: usize,
    ip_len_max: usize,
    cache: &FibCachePolicy,
    verify_l4: bool,
) -> Result<Forwarded, Reason> {
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
    let l4_len = fields.payload_len as usize;
    let ports = l4_ports(ctx, fields.next_header, l2, IPV6_HLEN, l4_len)?;
    let (sport, dport) = (ports.sport, ports.dport);

    let mut key = key_v6(ifindex, src, dst, sport, dport, fields.next_header);
    // Not offloaded (yet): new, unconfirmed, or not eligible per the daemon's policy.
    let Some(flow) = FLOWS_V6.get_ptr_mut(&key) else {
        return Err(Reason::PassNoFlow);
    };
    // SAFETY: map value pointer from the kernel (see try_forward_v4).
    let nat = unsafe {
        rewrite::NatV6 {
            src_be: (*flow).new_src_be,
            dst_be: (*flow).new_dst_be,
            sport_be: (*flow).new_sport_be,
            dport_be: (*flow).new_dport_be,
            l4_csum_diff: (*flow).l4_csum_diff,
        }
    };
    // SAFETY: `flow` is a live map value pointer.
    let flags = unsafe { (*flow).flags };
    let mark = check_armed(
        // SAFETY: `flow` is a live map value pointer.
        unsafe { addr_of_mut!((*flow).armed_generation) },
        // SAFETY: as above.
        unsafe { addr_of_mut!((*flow).fib_mark) },
        cache,
    )?;
    // The DSCP: the top 6 bits of the traffic class, below the 4 version bits.
    check_dscp(
        // SAFETY: `flow` is a live map value pointer.
        unsafe { addr_of_mut!((*flow).kernel_dscp) },
        (u32::from_be(flowinfo) >> 22) as u8 & 0x3f,
    )?;
    check_ttl(
        // SAFETY: `flow` is a live map value pointer.
        unsafe { addr_of_mut!((*flow).kernel_ttl) },
        fields.hop_limit,
    )?;
    // Only packets of offloaded flows pay for it; conntrack would mark the others INVALID.
    if verify_l4 && !ports.no_checksum {
        let pseudo = pseudo_v6(src, dst, fields.next_header, fields.payload_len);
        verify::l4_checksum(ctx, l2 + IPV6_HLEN, l4_len, pseudo)?;
    }

    // The whole datagram, header included, in host order (MTU check).
    let len = fields.payload_len.wrapping_add(IPV6_HLEN as u16);
    let mut params = fib_params(
        AF_INET6,
        fields.next_header,
        sport,
        nat.dport_be,
        len,
        ifindex,
        flowinfo,
        src,
        nat.dst_be,
        mark,
    );
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    // SAFETY: `flow` is a live map value pointer.
    let fib_cache = unsafe { addr_of_mut!((*flow).fib) };
    let hop = next_hop(ctx, fib_cache, cache, now, &mut params, len, flowinfo, mark)?;
    let mut hop = hop;
    let egress = redirect_to(&mut hop)?;

    let out = reframe::<Ipv6Hdr>(ctx, l2, len as usize, &egress.tag)?;
    let l4 = L4::at(ctx, out.l2 + IPV6_HLEN, fields.next_header == IPPROTO_UDP)?;
    // Every check passed: from here on the packet is ours.
    rewrite::rewrite_v6(out.eth, out.ip, l4, &nat, &hop);
    write_l2(&out, &egress.tag, L3::V6, len as usize);
    // SAFETY: `flow` is a live map value pointer.
    let counters = unsafe { addr_of_mut!((*flow).counters) };
    if first_in_pass(counters, cache) {
        // The connection by its original tuple (the flow key without the ingress): this
        // direction's key, or for the reply direction the tuple it is rewritten to, swapped.
        // Built in the lookup key's stack slot: the program's stack is nearly full.
        key.ifindex = 0;
        if flags & FLOW_F_REPLY != 0 {
            key.src_be = nat.dst_be;
            key.dst_be = nat.src_be;
            key.sport_be = nat.dport_be;
            key.dport_be = nat.sport_be;
        }
        // A failed insert (out of memory) only delays the conntrack refresh to a later pass.
        let _ = ACTIVE_V6.insert(&key, &0, 0);
    }
    Ok(finish(
        counters,
        flags,
        frame_len(ctx) as u64,
        egress.action,
        now,
    ))
}
