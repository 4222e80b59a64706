//! The kernel FIB: where a translated packet goes (`bpf_fib_lookup`, with the input the kernel
//! would route it with), and the per-flow cache of that answer ([`FibCache`]), valid until the
//! daemon bumps the FIB generation or the entry ages out.

use core::mem::{size_of, transmute};

use aya_ebpf::{
    EbpfContext as _, bindings::bpf_fib_lookup, helpers::bpf_fib_lookup as fib_lookup,
    programs::XdpContext,
};
use xdp_router_common::{
    FIB_LOOKUP_MARK, FibCache, IFACE_F_L3, IFACE_F_PPPOE, Reason,
    parse::{check_fib_result, fib},
};

use crate::{
    maps::{IFACES, fib_flags},
    order::{halves, load_ordered, store_ordered, word},
    packet::Packet,
    words::{opaque_zero, pack16},
};

pub const AF_INET: u8 = 2;
pub const AF_INET6: u8 = 10;

/// Where a packet leaves: a successful `bpf_fib_lookup`'s answer, fresh or cached.
pub struct NextHop {
    /// Egress interface.
    pub ifindex: u32,
    /// The router's MAC on the egress.
    pub smac: [u8; 6],
    /// The next hop's MAC.
    pub dmac: [u8; 6],
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
pub fn fib_params(
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
    pub generation: u32,
    /// `Settings::fib_cache_ns`; 0 = no caching.
    pub max_age_ns: u64,
    /// `Settings::ruleset_generation`: a flow direction armed under another one goes to the
    /// kernel (see `flow::check_armed`).
    pub ruleset_generation: u32,
    /// `Settings::verdict_max_age`: how long an armed direction stays armed; 0 = until the
    /// ruleset changes (see `flow::check_armed`).
    pub verdict_max_age: u32,
    /// `bpf_fib_lookup` takes a mark (`SETTINGS_F_FIB_MARK`).
    pub fib_mark: bool,
    /// XDP applies a DSCP rewrite the kernel made (`SETTINGS_F_DSCP_REWRITE`; see
    /// `flow::check_dscp`).
    pub dscp_rewrite: bool,
    /// `Settings::active_since_ns`: start of the daemon's keep-alive pass (see `flow::first_in_pass`).
    pub active_since_ns: u64,
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
    cache: *mut FibCache,
    policy: &FibCachePolicy,
    now: u64,
    len: u16,
    tos_flowinfo: u32,
) -> Option<NextHop> {
    use core::ptr::{addr_of, addr_of_mut, read_volatile};
    if !policy.enabled() {
        return None;
    }
    // SAFETY: `cache` points into a live flow map value. The generation is read first and
    // again last, ordered around the copy (`order.rs`), and a writer zeroes it before it
    // rewrites the other fields (see store_hop), so a copy taken while a writer was busy is
    // discarded.
    unsafe {
        let head = addr_of_mut!((*cache).generation) as *mut u64;
        let (generation, ifindex) = halves(load_ordered(head));
        if generation != policy.generation
            || now.wrapping_sub(read_volatile(addr_of!((*cache).filled_ns))) >= policy.max_age_ns
            || len > read_volatile(addr_of!((*cache).max_len))
            || tos_flowinfo != read_volatile(addr_of!((*cache).tos_flowinfo))
        {
            return None;
        }
        let hop = NextHop {
            ifindex,
            smac: read_volatile(addr_of!((*cache).smac)),
            dmac: read_volatile(addr_of!((*cache).dmac)),
        };
        (halves(load_ordered(head)).0 == generation).then_some(hop)
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
        // The generation and the interface are one ordered word (see `order.rs`).
        let head = addr_of_mut!((*cache).generation) as *mut u64;
        store_ordered(head, word(0, hop.ifindex));
        write_volatile(addr_of_mut!((*cache).tos_flowinfo), tos_flowinfo);
        write_volatile(addr_of_mut!((*cache).max_len), len);
        write_volatile(addr_of_mut!((*cache).smac), hop.smac);
        write_volatile(addr_of_mut!((*cache).dmac), hop.dmac);
        write_volatile(addr_of_mut!((*cache).filled_ns), now);
        store_ordered(head, word(policy.generation, hop.ifindex));
    }
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
/// `bpf_fib_lookup` with the input `params` builds (whose answer is then cached). `len` is the
/// packet's IP length and `tos_flowinfo` the lookup's TOS / flow information input, both as in
/// that input.
#[expect(
    clippy::too_many_arguments,
    reason = "the lookup's inputs plus the cache's"
)]
#[inline(always)]
pub fn next_hop<P: Packet>(
    ctx: &P,
    cache: *mut FibCache,
    policy: &FibCachePolicy,
    now: u64,
    len: u16,
    tos_flowinfo: u32,
    mark: u32,
    params: impl FnOnce() -> bpf_fib_lookup,
) -> Result<NextHop, Reason> {
    if let Some(hop) = cached_hop(cache, policy, now, len, tos_flowinfo) {
        return Ok(hop);
    }
    let mut params = params();
    // SAFETY: params is a valid, initialised bpf_fib_lookup of the size passed.
    let rc = unsafe {
        fib_lookup(
            ctx.as_ptr(),
            &mut params as *mut bpf_fib_lookup,
            size_of::<bpf_fib_lookup>() as i32,
            lookup_flags(mark),
        )
    };
    // A PPP device has no neighbours to resolve (the session names the peer's MAC), nor has a
    // device without a link-layer header (`wg0`: the kernel sends to it without resolving
    // anything), so the helper may well answer "no neighbour" for them, with the egress and
    // the MTU check done.
    if rc != fib::NO_NEIGH || !has_no_neighbours(params.ifindex) {
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

/// Whether `ifindex` is a managed device that sends without a neighbour: a PPPoE device, or
/// one without a link-layer header.
#[inline(always)]
fn has_no_neighbours(ifindex: u32) -> bool {
    // SAFETY: a map value pointer returned by the kernel is valid for reads of IfaceInfo.
    IFACES
        .get_ptr(ifindex)
        .is_some_and(|i| unsafe { (*i).flags } & (IFACE_F_PPPOE | IFACE_F_L3) != 0)
}

/// The daemon's probe for `BPF_FIB_LOOKUP_MARK` (see the `xdp_router_fibm` program): the answer
/// of `bpf_fib_lookup` with that flag alone and no address family. The kernel checks the flags
/// first (`-EINVAL` for one it does not know), then the family (`-EAFNOSUPPORT`), so the
/// answer tells whether this kernel takes the mark, whatever its version says.
#[inline(always)]
pub fn probe_mark(ctx: &XdpContext) -> u32 {
    // SAFETY: bpf_fib_lookup is a #[repr(C)] struct of integers and unions of integers: all
    // zeroes is a valid value.
    let mut params: bpf_fib_lookup = unsafe { core::mem::zeroed() };
    // SAFETY: a helper on this program's own context and a stack struct of the size given.
    let rc = unsafe {
        fib_lookup(
            ctx.as_ptr().cast(),
            &mut params,
            size_of::<bpf_fib_lookup>() as i32,
            FIB_LOOKUP_MARK,
        )
    };
    rc as u32
}
