//! Arming: the TC egress program that records which flow directions the kernel itself forwards.
//!
//! It runs on every managed interface (on a PPP device as `xdp_router_arm3`, which finds the
//! IP header at the start of the packet) after the kernel's whole forwarding path (FORWARD,
//! POSTROUTING, NAT). A packet seen here was accepted by the firewall as it is now; the fast
//! path's own packets are redirected by XDP and never pass here; those the TC fast path
//! redirects do (a TC redirect goes through the egress device's transmit path) and are
//! skipped by their `FASTPATH_TC_INDEX` mark. For a packet that belongs to an
//! offloaded flow direction (found by its post-NAT tuple in `ARM_V4`/`ARM_V6`, arriving on the
//! direction's ingress interface), it stores the current `ruleset_generation`, the time, the
//! packet's mark, DSCP and TTL in the flow entry: from then on XDP forwards that direction,
//! until the ruleset changes or the verdict is older than `Settings::verdict_max_age`, and only
//! packets that would leave the kernel with that DSCP and TTL. The DSCP the packet arrived with
//! (stamped by `stamp.rs` at TC ingress) says whether the kernel's rules rewrote it
//! (`FLOW_DSCP_REWRITTEN`), which XDP may then apply itself (see `flow::check_dscp`).
//!
//! A direction found at the daemon's start that has not carried traffic since
//! (`FLOW_F_AWAITING_TRAFFIC`) has no arming index entry, so it is not found here; should it
//! be, it is not armed either (a TCP one is not marked "be liberal" in conntrack yet).
//!
//! A TCP SYN the kernel forwards opens a new connection: if its tuple finds an entry, that
//! entry is a closed connection's whose removal the daemon has not caught up with yet. The SYN
//! disarms it and marks it stale (`FLOW_F_STALE`), so the new connection's packets are never
//! forwarded with the old connection's entry (its NAT mapping, its conntrack entry left
//! unrefreshed and not liberal); the daemon rewrites the entry when it offloads the new one.
//!
//! A packet the kernel decrypted (IPsec: it carries a security path) never arms: the kernel
//! accepted it because it came through a tunnel an xfrm policy requires, which XDP cannot
//! check, so a plaintext packet with the same tuple would be forwarded. Packets the kernel
//! encrypts leave as ESP and never match a flow direction either: IPsec-protected
//! connections stay in the kernel.

use core::{
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr::{addr_of_mut, write_volatile},
};

use aya_ebpf::{
    bindings::bpf_xfrm_state,
    helpers::{bpf_ktime_get_coarse_ns, bpf_skb_get_xfrm_state},
    programs::TcContext,
};
use xdp_router_common::{
    ArmKeyV4, ArmKeyV6, FASTPATH_TC_INDEX, FLOW_DSCP_KNOWN, FLOW_DSCP_REWRITTEN,
    FLOW_F_AWAITING_TRAFFIC, FLOW_F_STALE, FLOW_TTL_KNOWN, FlowCounters, SETTINGS_F_FIB_MARK,
    parse::{ETH_HLEN, ETH_P_IP, ETH_P_IPV6, IPPROTO_TCP, IPPROTO_UDP},
    stamped_dscp, verdict_tick,
};

use crate::{
    hosts,
    maps::{ARM_V4, ARM_V6, FLOWS_V4, FLOWS_V6, KERNEL_FWD, SETTINGS},
    order::{halves, store_ordered, word},
};

/// What the kernel forwarded: the packet's mark, ingress interface and arrival DSCP.
struct Forwarded {
    mark: u32,
    ingress_ifindex: u32,
    generation: u32,
    mark_ok: bool,
    /// The DSCP the packet arrived with, if the stamp program saw it (`stamp.rs`).
    arrival_dscp: Option<u8>,
    /// Its IP bytes and (GSO) segments, for the direction's kernel counters.
    ip_bytes: u64,
    segments: u64,
}

/// What precedes the IP header on the device the arming program runs on.
#[derive(Clone, Copy)]
pub enum LinkHeader {
    /// An Ethernet header (the VLAN tag, if any, is metadata on egress).
    Ethernet,
    /// Nothing (a PPP device): the family is the packet's protocol.
    None,
}

/// Arms the flow direction of the packet in `ctx`, if it is one. Never changes the packet.
#[inline(always)]
pub fn try_arm(ctx: &TcContext, link: LinkHeader) -> Option<()> {
    let settings = SETTINGS.get(0)?;
    // SAFETY: the context's skb pointer is valid for the program run.
    let (mark, ingress_ifindex, tc_index, len, gso_segs) = unsafe {
        let skb = ctx.skb.skb;
        (
            (*skb).mark,
            (*skb).ingress_ifindex,
            (*skb).tc_index,
            (*skb).len,
            (*skb).gso_segs,
        )
    };
    if tc_index == FASTPATH_TC_INDEX {
        // Redirected by the TC fast path, not forwarded by the kernel: arming from it would
        // refresh the verdict without the firewall having seen the packet.
        return None;
    }
    let (ethertype, l3) = match link {
        LinkHeader::Ethernet => (u16::from_be(ctx.load::<u16>(12).ok()?), ETH_HLEN),
        // SAFETY: the context's skb pointer is valid for the program run.
        LinkHeader::None => (u16::from_be(unsafe { (*ctx.skb.skb).protocol } as u16), 0),
    };
    let fwd = Forwarded {
        mark,
        ingress_ifindex,
        generation: settings.ruleset_generation,
        mark_ok: settings.flags & SETTINGS_F_FIB_MARK != 0,
        arrival_dscp: stamped_dscp(tc_index),
        // The skb's length from the IP header on (a GSO packet's whole payload; a VLAN tag is
        // metadata here), as conntrack counts bytes.
        ip_bytes: u64::from(len).saturating_sub(l3 as u64),
        segments: u64::from(gso_segs.max(1)),
    };
    match ethertype {
        ETH_P_IP => arm_v4(ctx, l3, &fwd),
        ETH_P_IPV6 => arm_v6(ctx, l3, &fwd),
        _ => None,
    }
}

/// Whether the packet carries an IPsec security path (the kernel decrypted it): the helper
/// finds a first xfrm state.
#[inline(always)]
fn decrypted_by_ipsec(ctx: &TcContext) -> bool {
    let mut state = core::mem::MaybeUninit::<bpf_xfrm_state>::zeroed();
    // SAFETY: the skb pointer is valid for the program run; `state` is writable for the size
    // passed.
    unsafe {
        bpf_skb_get_xfrm_state(
            ctx.skb.skb,
            0,
            state.as_mut_ptr(),
            core::mem::size_of::<bpf_xfrm_state>() as u32,
            0,
        ) == 0
    }
}

/// The raw source and destination ports at offset `l4`.
#[inline(always)]
fn ports(ctx: &TcContext, l4: usize) -> Option<(u16, u16)> {
    let ports: [u16; 2] = ctx.load(l4).ok()?;
    Some((ports[0], ports[1]))
}

/// TCP SYN in the flags byte of the TCP header.
const TCP_SYN: u8 = 0x02;

/// Whether the packet is a TCP segment with SYN set (`l4`: offset of the TCP header).
#[inline(always)]
fn is_tcp_syn(ctx: &TcContext, proto: u8, l4: usize) -> bool {
    proto == IPPROTO_TCP && ctx.load::<u8>(l4 + 13).is_ok_and(|f| f & TCP_SYN != 0)
}

/// Where the arming goes in a flow entry.
struct ArmFields {
    flags: *mut u32,
    /// `armed_generation` and `fib_mark`: one ordered word (see `order.rs`).
    arming: *mut u64,
    armed_at: *mut u32,
    fib_generation: *mut u32,
    kernel_dscp: *mut u32,
    kernel_ttl: *mut u32,
    counters: *mut FlowCounters,
    /// `[sender, receiver]` LAN host slots (see `hosts.rs`).
    host_slots: [u32; 2],
}

/// Writes the arming into a flow entry's `armed_generation`, `armed_at` (now), `fib_mark`,
/// `kernel_dscp` and `kernel_ttl` (`dscp`, `ttl`: what this packet leaves with). A direction with a mark the FIB
/// lookup cannot take is left unarmed (XDP counts it as `fib_mark_unsupported`), and so is a
/// direction still awaiting traffic (`FLOW_F_AWAITING_TRAFFIC`).
#[inline(always)]
fn arm(f: ArmFields, dscp: u8, ttl: u8, syn: bool, fwd: &Forwarded) {
    let ArmFields {
        flags,
        arming,
        armed_at,
        fib_generation,
        kernel_dscp,
        kernel_ttl,
        counters,
        host_slots,
    } = f;
    let generation = if fwd.mark != 0 && !fwd.mark_ok {
        0
    } else {
        fwd.generation
    };
    // SAFETY: the pointers point into a live flow map value. The generation and the mark are
    // published last, together, ordered after the fields they vouch for (`order.rs`); XDP
    // reads them first. A changed mark drops the cached FIB answer, which was looked up with
    // the old one.
    unsafe {
        let f = core::ptr::read_volatile(flags);
        let (_, mark) = halves(core::ptr::read_volatile(arming));
        if syn {
            // A new connection on this tuple: the entry is stale (see the module docs).
            store_ordered(arming, word(0, mark));
            write_volatile(flags, f | FLOW_F_STALE);
            return;
        }
        if f & FLOW_F_STALE != 0 {
            return;
        }
        // Packets (GSO segments) of an offloaded direction the kernel forwarded, for the
        // daemon (`MAP_KERNEL_FORWARDED`): per CPU, and TC egress runs with bottom halves
        // disabled, so a plain read-modify-write is race free.
        if let Some(n) = KERNEL_FWD.get_ptr_mut(0) {
            *n += fwd.segments;
        }
        // What the kernel forwarded of the direction (several CPUs may: atomic adds, as the
        // fast path's own counters in `flow::finish`).
        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(
            addr_of_mut!((*counters).kernel_packets),
            fwd.segments,
        );
        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(
            addr_of_mut!((*counters).kernel_bytes),
            fwd.ip_bytes,
        );
        hosts::count(host_slots, fwd.segments, fwd.ip_bytes);
        if f & FLOW_F_AWAITING_TRAFFIC != 0 {
            // Not before the keep-alive took the connection in (a TCP one marked liberal:
            // conntrack would judge the fast path's packets by a strict window).
            return;
        }
        if mark != fwd.mark {
            write_volatile(fib_generation, 0);
        }
        // Before the generation: XDP compares packets with it once armed. A packet that
        // arrived with another DSCP shows a rewrite by the kernel's rules.
        let rewritten = match fwd.arrival_dscp {
            Some(arrived) if arrived != dscp & 0x3f => FLOW_DSCP_REWRITTEN,
            _ => 0,
        };
        let dscp = FLOW_DSCP_KNOWN | rewritten | u32::from(dscp & 0x3f);
        if core::ptr::read_volatile(kernel_dscp) != dscp {
            write_volatile(kernel_dscp, dscp);
        }
        let ttl = FLOW_TTL_KNOWN | u32::from(ttl);
        if core::ptr::read_volatile(kernel_ttl) != ttl {
            write_volatile(kernel_ttl, ttl);
        }
        // Before the generation too: XDP forwards an armed direction only while this is
        // recent (`Settings::verdict_max_age`).
        let now = verdict_tick(bpf_ktime_get_coarse_ns());
        if core::ptr::read_volatile(armed_at) != now {
            write_volatile(armed_at, now);
        }
        // Last, ordered after the writes above (`order.rs`): XDP reads it first.
        let armed = word(generation, fwd.mark);
        if core::ptr::read_volatile(arming) != armed {
            store_ordered(arming, armed);
        }
    }
}

#[inline(always)]
fn arm_v4(ctx: &TcContext, l3: usize, fwd: &Forwarded) -> Option<()> {
    // version_ihl, tos, tot_len, id, frag_off, ttl, proto, check: the first 10 bytes.
    let head: [u8; 10] = ctx.load(l3).ok()?;
    let [version_ihl, tos, _, _, _, _, frag0, frag1, ttl, proto] = head;
    // The fast path only forwards option-less, unfragmented TCP/UDP.
    if version_ihl != 0x45
        || u16::from_be_bytes([frag0, frag1]) & 0x3fff != 0
        || (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
    {
        return None;
    }
    let addrs: [u32; 2] = ctx.load(l3 + 12).ok()?;
    let (sport_be, dport_be) = ports(ctx, l3 + 20)?;
    let key = ArmKeyV4 {
        src_be: addrs[0],
        dst_be: addrs[1],
        sport_be,
        dport_be,
        proto,
        _pad: [0; 3],
    };
    // SAFETY: map lookups; the value is copied out.
    let flow_key = *unsafe { ARM_V4.get(key) }?;
    // Only a packet that came in where the flow direction enters arms it.
    if flow_key.ifindex != fwd.ingress_ifindex {
        return None;
    }
    // Only packets of offloaded flow directions pay for the helper call.
    if decrypted_by_ipsec(ctx) {
        return None;
    }
    let flow = FLOWS_V4.get_ptr_mut(flow_key)?;
    // SAFETY: map value pointer from the kernel.
    let fields = unsafe {
        ArmFields {
            flags: addr_of_mut!((*flow).flags),
            // `armed_generation` and `fib_mark`, side by side and 8-byte aligned (asserted in
            // the common crate).
            arming: addr_of_mut!((*flow).armed_generation) as *mut u64,
            armed_at: addr_of_mut!((*flow).armed_at),
            fib_generation: addr_of_mut!((*flow).fib.generation),
            kernel_dscp: addr_of_mut!((*flow).kernel_dscp),
            kernel_ttl: addr_of_mut!((*flow).kernel_ttl),
            counters: addr_of_mut!((*flow).counters),
            host_slots: (*flow).host_slots,
        }
    };
    let syn = is_tcp_syn(ctx, proto, l3 + 20);
    arm(fields, tos >> 2, ttl, syn, fwd);
    Some(())
}

#[inline(always)]
fn arm_v6(ctx: &TcContext, l3: usize, fwd: &Forwarded) -> Option<()> {
    // version/class/flow label (4), payload length (2), next header, hop limit.
    let [next_header, hop_limit]: [u8; 2] = ctx.load(l3 + 6).ok()?;
    // Version (4 bits) and traffic class (8 bits): the DSCP is the class's top 6 bits.
    let vtc: [u8; 2] = ctx.load(l3).ok()?;
    let dscp = (u16::from_be_bytes(vtc) >> 6) as u8 & 0x3f;
    if next_header != IPPROTO_TCP && next_header != IPPROTO_UDP {
        return None;
    }
    let addrs: [[u32; 4]; 2] = ctx.load(l3 + 8).ok()?;
    let (sport_be, dport_be) = ports(ctx, l3 + 40)?;
    let key = ArmKeyV6 {
        src_be: addrs[0],
        dst_be: addrs[1],
        sport_be,
        dport_be,
        proto: next_header,
        _pad: [0; 3],
    };
    // SAFETY: map lookups; the value is copied out.
    let flow_key = *unsafe { ARM_V6.get(key) }?;
    if flow_key.ifindex != fwd.ingress_ifindex {
        return None;
    }
    // Only packets of offloaded flow directions pay for the helper call.
    if decrypted_by_ipsec(ctx) {
        return None;
    }
    let flow = FLOWS_V6.get_ptr_mut(flow_key)?;
    // SAFETY: map value pointer from the kernel.
    let fields = unsafe {
        ArmFields {
            flags: addr_of_mut!((*flow).flags),
            // `armed_generation` and `fib_mark`, side by side and 8-byte aligned (asserted in
            // the common crate).
            arming: addr_of_mut!((*flow).armed_generation) as *mut u64,
            armed_at: addr_of_mut!((*flow).armed_at),
            fib_generation: addr_of_mut!((*flow).fib.generation),
            kernel_dscp: addr_of_mut!((*flow).kernel_dscp),
            kernel_ttl: addr_of_mut!((*flow).kernel_ttl),
            counters: addr_of_mut!((*flow).counters),
            host_slots: (*flow).host_slots,
        }
    };
    let syn = is_tcp_syn(ctx, next_header, l3 + 40);
    arm(fields, dscp, hop_limit, syn, fwd);
    Some(())
}
