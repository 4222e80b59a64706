//! The per-packet pipeline: parse and check the headers, find the offloaded flow, ask the kernel
//! FIB where the translated packet goes, and only then rewrite and redirect it. Written once:
//! for both address families (through `family::Family`) and for any program context that
//! gives packet access (`packet::Packet`: the XDP program's and the TC program's).
//!
//! Every function returns `Err(reason)` for a packet the kernel must handle; nothing is written
//! to the packet before the last check has passed, so a passed packet is exactly as received.

use core::{
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr::addr_of_mut,
};

use aya_ebpf::{bindings::BPF_NOEXIST, helpers::bpf_ktime_get_coarse_ns};
use xdp_router_common::{
    FLOW_DSCP_KNOWN, FLOW_DSCP_REWRITTEN, FLOW_F_AWAITING_TRAFFIC, FLOW_F_REPLY, FLOW_TTL_KNOWN,
    FlowCounters, IFACE_F_BRIDGE_PORT, IFACE_F_GENERIC_XDP, IFACE_F_INGRESS_HOOK, IFACE_F_L3,
    IFACE_F_PORT_NOT_FORWARDING, IFACE_F_PPPOE_LOWER, IFACE_F_VLAN_PARENT, IfaceInfo, Reason,
    SETTINGS_F_DSCP_REWRITE, SETTINGS_F_FIB_MARK, SETTINGS_F_HOLD_ALL,
    checksum::{combine, diff16, fold, is_noop},
    parse::{
        ETH_HLEN, ETH_P_PPP_SES, IPPROTO_TCP, IPPROTO_UDP, L3, PPPOE_HLEN, VLAN_HLEN, check_tcp,
        check_udp, check_vlan_tag, classify_ethertype, is_vlan_tpid,
    },
    verdict_tick,
};

use crate::{
    bridge,
    egress::redirect_to,
    encap::{reframe, write_l2},
    family::{Family, FlowFields, V4, V6},
    fib::{FibCachePolicy, fib_params, next_hop},
    hosts,
    maps::SETTINGS,
    order::{halves, load_ordered},
    packet::{L4ChecksumEdit, Packet, frame_len, ptr_at_mut},
    parse::{EthHdr, FrameTag, TcpHdr, UdpHdr},
    pppoe,
    rewrite::{L4, kernel_dscp_to_set},
    verify, vlan,
};

/// A packet the fast path sent: the program's action to return and the reason to count it
/// under.
pub struct Forwarded {
    /// What the redirect set-up returned (`XDP_REDIRECT` for XDP).
    pub action: u32,
    /// [`Reason::ForwardedOriginal`] or [`Reason::ForwardedReply`].
    pub reason: Reason,
    /// Length of the frame sent (Ethernet header + IP datagram: padding trimmed; the datagram
    /// alone out of a device without a link-layer header).
    pub bytes: u64,
}

/// Forwards the packet in `ctx`, received on `ifindex` (whose `IFACES` entry is `info`), or
/// says why the kernel must have it. A frame tagged for a managed VLAN device, or a session
/// frame of a managed PPPoE device, is counted under that device's stats slot: `slot` is set
/// to it.
#[inline(always)]
pub fn try_forward<P: Packet>(
    ctx: &P,
    ifindex: u32,
    info: Option<*const IfaceInfo>,
    slot: &mut u32,
) -> Result<Forwarded, Reason> {
    // Switched off by the daemon (A/B runs, maintenance): the kernel carries everything.
    let Some(settings) = SETTINGS.get(0) else {
        return Err(Reason::PassDisabled);
    };
    if settings.fastpath_enabled == 0 {
        return Err(Reason::PassDisabled);
    }
    let cache = FibCachePolicy {
        generation: settings.fib_generation,
        max_age_ns: settings.fib_cache_ns,
        ruleset_generation: settings.ruleset_generation,
        verdict_max_age: settings.verdict_max_age,
        fib_mark: settings.flags & SETTINGS_F_FIB_MARK != 0,
        dscp_rewrite: settings.flags & SETTINGS_F_DSCP_REWRITE != 0,
        active_since_ns: settings.active_since_ns,
    };
    let verify_l4 = settings.verify_l4_checksum != 0;
    // A rule in the ruleset must see every packet (a rate limit, quota, queue, log: state XDP
    // cannot keep), or the daemon is reading the ruleset after a change: the kernel carries
    // everything (see `SETTINGS_F_HOLD_ALL`).
    if settings.flags & SETTINGS_F_HOLD_ALL != 0 {
        return Err(Reason::PassPerPacketRule);
    }
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
    let front = if P::SKB && flags & IFACE_F_L3 != 0 {
        // No link-layer header (`wg0`, `tun0`): the IP header starts the packet, and the
        // kernel recorded its family in the skb. Nothing here is a bridge, VLAN or PPPoE
        // frame, and no MAC addresses it.
        Front {
            l3: classify_ethertype(ctx.l3_protocol())?,
            l2: 0,
            tag_in_frame: false,
            iif: ifindex,
            ip_len_max: frame_len(ctx),
        }
    } else {
        ethernet_front(ctx, ifindex, info, flags, l3_ifindex, slot)?
    };
    match front.l3 {
        L3::V4 => try_forward_ip::<V4, P>(ctx, &front, &cache, verify_l4),
        L3::V6 => try_forward_ip::<V6, P>(ctx, &front, &cache, verify_l4),
    }
}

/// Where a received packet's IP header is, and what the IP layer sees it as.
struct Front {
    /// Its family.
    l3: L3,
    /// Bytes before the IP header (link-layer header, VLAN tag, PPPoE session).
    l2: usize,
    /// Its VLAN tag is in its bytes (counted in `l2`), not in skb metadata (see
    /// `encap::reframe`): always, for a tagged XDP frame.
    tag_in_frame: bool,
    /// The device the IP layer sees it received on (a bridge, VLAN or PPP device over the
    /// port it arrived on, or that port).
    iif: u32,
    /// At most this many bytes of IP datagram follow the header's start.
    ip_len_max: usize,
}

/// The link-layer part of the pipeline for an Ethernet frame received on `ifindex` (flags
/// `flags`, `IFACES` entry `info`, bridge `l3_ifindex`): bridge, VLAN and PPPoE handling, and
/// the destination MAC check. `slot` is set to a VLAN or PPP device's stats slot when the
/// frame is that device's.
#[inline(always)]
fn ethernet_front<P: Packet>(
    ctx: &P,
    ifindex: u32,
    info: Option<*const IfaceInfo>,
    flags: u32,
    l3_ifindex: u32,
    slot: &mut u32,
) -> Result<Front, Reason> {
    let eth: *mut EthHdr = ptr_at_mut(ctx, 0)?;
    // SAFETY: ptr_at_mut checked that the header is inside the frame.
    let (ethertype, tpid_be) = unsafe { ((*eth).ethertype(), (*eth).ethertype_be) };
    // The frame's VLAN tag (protocol, TCI: raw; the EtherType after it: host order): on an
    // skb in its metadata, with the frame's bytes untagged (the EtherType after the MACs is
    // the one after the tag), else in the frame after the MACs.
    let meta_tag = ctx.meta_vlan_tag();
    // (A `FrameTag`, not an `Option`: see `parse.rs`.)
    let tag = if let Some((tpid_be, tci_be)) = meta_tag {
        FrameTag {
            present: true,
            tpid_be,
            tci_be,
            inner: ethertype,
        }
    } else if is_vlan_tpid(ethertype) {
        vlan::read_tag(ctx, tpid_be)?
    } else {
        FrameTag::untagged(ethertype)
    };
    let tag_in_frame = tag.present && meta_tag.is_none();
    // A tagged frame for a managed VLAN device over the port it arrived on (`eth0.7`, or
    // `eth1.20` with eth1 in br-lan) is that device's: the kernel hands it over
    // (`vlan_do_receive`) before a bridge sees it.
    let mut vlan = tag.present.then(|| {
        check_vlan_tag(u16::from_be(tag.tci_be), tag.inner)
            .and_then(|vid| vlan::device_of(ifindex, vid, tag.tpid_be))
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
        let upper = match up.upper {
            Some((vid, tpid_be)) => Some(vlan::device_of(l3_ifindex, vid, tpid_be)?),
            None => None,
        };
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
        vlan = upper.map(Ok);
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
    let ethertype = if tag.present {
        if tag_in_frame {
            l2 = ETH_HLEN + VLAN_HLEN;
        }
        tag.inner
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
        if !tag.present
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
    Ok(Front {
        l3,
        l2,
        tag_in_frame,
        iif,
        ip_len_max,
    })
}

/// Offset of the checksum field in the transport header of protocol `proto` (TCP 16, UDP 6).
#[inline(always)]
fn check_offset(proto: u8) -> usize {
    if proto == IPPROTO_UDP { 6 } else { 16 }
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
fn l4_ports<P: Packet>(
    ctx: &P,
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

/// `Ok(fib_mark)` when the kernel itself forwarded this flow direction under the current
/// firewall ruleset (the TC egress program recorded it in `armed` and `mark`), else why not.
/// This is what makes the fast path follow iptables/nftables: a new flow, and every flow after
/// any ruleset change, has its next packet judged by the kernel's rules, and only a packet the
/// kernel forwarded re-arms the direction. A verdict also expires `verdict_max_age` ticks after
/// the kernel last forwarded the direction (`armed_at`, `now`: [`verdict_tick`]s): verdicts
/// that change without a ruleset change (ipset membership, time rules) then reach the flow
/// with its next packet, which the kernel forwards (re-arming it) or drops.
#[inline(always)]
fn check_armed(fields: &FlowFields, policy: &FibCachePolicy, now: u32) -> Result<u32, Reason> {
    // SAFETY: all point into a live flow map value; the TC program writes the time first, the
    // generation and the mark last, as one ordered word (see `order.rs`), read here first.
    let (armed, mark, armed_at) = unsafe {
        let (armed, mark) = halves(load_ordered(fields.arming));
        (armed, mark, core::ptr::read_volatile(fields.armed_at))
    };
    if armed != policy.ruleset_generation {
        // The TC program leaves a marked direction unarmed when the lookup cannot take a mark.
        if mark != 0 && !policy.fib_mark {
            return Err(Reason::PassMarkUnsupported);
        }
        return Err(Reason::PassNotArmed);
    }
    // An `armed_at` read before the TC program's latest write only makes the age look larger:
    // one more packet for the kernel, never a forward past the limit.
    if policy.verdict_max_age != 0 && now.wrapping_sub(armed_at) > policy.verdict_max_age {
        return Err(Reason::PassVerdictExpired);
    }
    Ok(mark)
}

/// `Ok` when the packet's `dscp` is the one the kernel sent this flow direction out with when
/// it armed it (`kernel_dscp`, see `FlowV4::kernel_dscp`), or none was recorded. A rule in the
/// forward path that rewrites the DSCP makes them differ: the kernel then carries the packet,
/// so the rule applies to it, unless the kernel was seen rewriting this direction
/// (`FLOW_DSCP_REWRITTEN`) and the daemon proved the rewrite is the same for every packet of a
/// flow (`SETTINGS_F_DSCP_REWRITE`): then the rewrite step sets the recorded DSCP itself
/// (`rewrite::kernel_dscp_to_set`).
#[inline(always)]
fn check_dscp(kernel_dscp: *const u32, dscp: u8, policy: &FibCachePolicy) -> Result<(), Reason> {
    // SAFETY: points into a live flow map value; the TC program writes it before arming.
    let recorded = unsafe { core::ptr::read_volatile(kernel_dscp) };
    if recorded & FLOW_DSCP_KNOWN != 0
        && recorded & 0x3f != u32::from(dscp)
        && !(policy.dscp_rewrite && recorded & FLOW_DSCP_REWRITTEN != 0)
    {
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

/// Whether this is the flow direction's first forwarded packet since the daemon's keep-alive
/// pass started (`Settings::active_since_ns`): its connection is then recorded in the active
/// map, once per direction and pass, so the daemon's pass costs what the active connections
/// cost, not the table. Read before [`finish`] stamps `last_seen_ns`.
///
/// Both times are CLOCK_MONOTONIC_COARSE, which advances once per tick: a packet forwarded
/// just before the pass started, in the same tick, stamped the pass's start itself. "Not after
/// the start" counts it as before: a strict comparison left such a direction unrecorded for the
/// whole pass, and a flow whose packets kept that phase to the pass's timer (a packet every
/// 50 ms, a pass every 2 s) lost its conntrack entry. The cost: packets forwarded in the
/// pass's first tick insert again.
#[inline(always)]
fn first_in_pass(counters: *mut FlowCounters, policy: &FibCachePolicy) -> bool {
    // SAFETY: `counters` points into a live flow map value; another CPU may write it
    // concurrently, so the read is volatile (a torn or stale value only adds one insert).
    let last = unsafe { addr_of_mut!((*counters).last_seen_ns).read_volatile() };
    last <= policy.active_since_ns
}

/// Counts the packet on its flow and on its LAN hosts (`host_slots`; `ip_len`: its IP
/// datagram's length, as conntrack counts bytes) and says what was sent (`frame_len` bytes, for the per-reason counters); `action`
/// is what the redirect set-up returned.
#[inline(always)]
fn finish(
    counters: *mut FlowCounters,
    host_slots: [u32; 2],
    flags: u32,
    ip_len: u64,
    frame_len: u64,
    action: u32,
    now: u64,
) -> Forwarded {
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
            ip_len,
        );
        addr_of_mut!((*counters).last_seen_ns).write_volatile(now);
    }
    hosts::count(host_slots, 1, ip_len);
    let reason = if flags & FLOW_F_REPLY != 0 {
        Reason::ForwardedReply
    } else {
        Reason::ForwardedOriginal
    };
    Forwarded {
        action,
        reason,
        bytes: frame_len,
    }
}

/// Steps 4-11 for an IP packet of family `F` whose header is `front.l2` bytes into the frame
/// (0 on a device without a link-layer header): checks, flow, FIB, egress, rewrite, counters,
/// redirect.
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "the flow key stays in its one stack slot (a by-value key is copied): the program's stack is nearly full"
)]
#[inline(always)]
fn try_forward_ip<F: Family, P: Packet>(
    ctx: &P,
    front: &Front,
    cache: &FibCachePolicy,
    verify_l4: bool,
) -> Result<Forwarded, Reason> {
    let (ifindex, l2, ip_len_max) = (front.iif, front.l2, front.ip_len_max);
    let h = F::header(ctx, l2, ip_len_max)?;
    let ports = l4_ports(ctx, h.proto, l2, F::HLEN, h.l4_len)?;
    let (sport, dport) = (ports.sport, ports.dport);

    let mut key = F::key(ifindex, h.src, h.dst, sport, dport, h.proto);
    // Not offloaded (yet): new, unconfirmed, or not eligible per the daemon's policy.
    let Some(flow) = F::flows().get_ptr_mut(&key) else {
        return Err(Reason::PassNoFlow);
    };
    let nat = F::nat(flow);
    let fields = F::fields(flow);
    let flags = fields.flags;
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    let mark = match check_armed(&fields, cache, verdict_tick(now)) {
        Ok(mark) => mark,
        Err(reason) => {
            if flags & (FLOW_F_AWAITING_TRAFFIC | FLOW_F_REPLY) == FLOW_F_AWAITING_TRAFFIC {
                // The original direction of a connection found in conntrack at the daemon's
                // start that has carried no traffic since (no arming index entry, and a TCP
                // one not marked liberal: the kernel cannot arm it, so this packet goes to the
                // kernel as `awaiting_kernel_verdict`). Its connection is recorded as active
                // (the key without its ingress is the original tuple): the keep-alive's next
                // pass takes it in, after which the kernel arms it. Only this direction
                // records it: a TCP connection that carries traffic sends this way too (its
                // ACKs), and a UDP one waits for its client. Off the path of armed packets.
                F::to_active_key(&mut key, &nat, false);
                // Only the first packet of a keep-alive pass writes: with BPF_ANY every packet
                // would replace the element.
                let _ = F::active().insert(&key, &0, u64::from(BPF_NOEXIST));
            }
            return Err(reason);
        }
    };
    check_dscp(fields.kernel_dscp, F::dscp(&h), cache)?;
    check_ttl(fields.kernel_ttl, h.ttl)?;
    // Only packets of offloaded flows pay for it; conntrack would mark the others INVALID. A
    // checksum the device verified (an skb's CHECKSUM_UNNECESSARY) conntrack takes as it is,
    // and so does the fast path: no pull, no sum.
    if verify_l4 && !ports.no_checksum && !ctx.l4_checksum_verified() {
        let l4_off = l2 + F::HLEN;
        // An skb's segment may be partly in pages: pulled into the head to be summed (not a
        // GSO aggregate, longer than the sum covers anyway, and as a rule CHECKSUM_PARTIAL).
        // Every packet pointer is re-derived after this.
        if P::SKB && h.l4_len < verify::MAX_SUMMED && !ctx.pull(l4_off + h.l4_len) {
            return Err(Reason::PassMalformed);
        }
        if let Err(reason) = verify::l4_checksum(ctx, l4_off, h.l4_len, F::pseudo(&h)) {
            // A checksum the kernel does not verify either (an skb's CHECKSUM_PARTIAL); never
            // for XDP.
            if !ctx.l4_checksum_partial(l4_off + check_offset(h.proto)) {
                return Err(reason);
            }
        }
    }
    // The length the egress MTU is checked against (a GSO skb's segments; XDP: `h.len`).
    let mtu_len = ctx.mtu_len(h.len, l2, l2 + F::HLEN, h.proto == IPPROTO_TCP);

    // The lookup's input is built only when the flow's cached answer cannot be used.
    let mut hop = next_hop(
        ctx,
        fields.fib,
        cache,
        now,
        mtu_len,
        h.tos_flowinfo,
        mark,
        || {
            fib_params(
                F::AF,
                h.proto,
                sport,
                nat.dport_be,
                mtu_len,
                ifindex,
                h.tos_flowinfo,
                F::fib_addr(h.src),
                F::fib_addr(nat.dst_be),
                mark,
            )
        },
    )?;
    let egress = redirect_to::<P>(&mut hop)?;

    let out = reframe::<F::Hdr, P>(
        ctx,
        l2,
        front.tag_in_frame,
        h.len as usize,
        F::L3,
        &egress.tag,
    )?;
    let udp = h.proto == IPPROTO_UDP;
    // The transport checksum written directly, as on XDP, where no sum in the skb depends on
    // it: an skb whose checksum the device verified (CHECKSUM_UNNECESSARY: the field is the
    // full checksum, and the skb keeps no sum of the packet). Else, on an skb, through the
    // helpers after the rewrite. Asked only where the NAT changes the checksum.
    let direct = !P::SKB || (!is_noop(nat.l4_csum_diff) && ctx.l4_checksum_verified());
    let l4 = L4::at::<P>(ctx, out.l2 + F::HLEN, udp, direct)?;
    // Every check passed: from here on the packet is ours.
    let dscp = kernel_dscp_to_set(fields.kernel_dscp, cache.dscp_rewrite);
    F::rewrite::<P>(out.eth, out.ip, l4, &nat, &hop, dscp);
    write_l2(ctx, &out, &egress.tag, F::L3, h.len as usize);
    if !direct {
        // The transport checksum, through the skb helpers (after every direct write: they
        // invalidate packet pointers). The pseudo-header's part of the flow's diff is the
        // address rewrite; the rest is the ports'.
        let ports_diff = combine(diff16(sport, nat.sport_be), diff16(dport, nat.dport_be));
        let pseudo = combine(nat.l4_csum_diff, u32::from(!fold(u64::from(ports_diff))));
        ctx.update_l4_checksum(&L4ChecksumEdit {
            offset: out.l2 + F::HLEN + check_offset(h.proto),
            pseudo,
            ports: ports_diff,
            udp,
            complete_fix: F::complete_fix(&h, pseudo, dscp),
        });
    }
    let counters = fields.counters;
    if first_in_pass(counters, cache) {
        // The connection by its original tuple, built in the lookup key's stack slot: the
        // program's stack is nearly full.
        F::to_active_key(&mut key, &nat, flags & FLOW_F_REPLY != 0);
        // A failed insert (out of memory) only delays the conntrack refresh to a later pass.
        let _ = F::active().insert(&key, &0, 0);
    }
    // What leaves: without the Ethernet header where the egress has none (only TC sends there).
    let sent = if P::SKB && egress.no_link_header {
        usize::from(h.len)
    } else {
        frame_len(ctx)
    };
    Ok(finish(
        counters,
        fields.host_slots,
        flags,
        u64::from(h.len),
        sent as u64,
        egress.action,
        now,
    ))
}
