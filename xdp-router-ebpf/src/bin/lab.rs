//! Benchmark lab programs (not part of the router): a live-frames traffic generator, a counting
//! sink, a bare redirect (the XDP ceiling) and a plain pass. Driven by `xdp-router-bench`; the
//! map ABI is `xdp_router_common::lab`.
#![no_std]
#![no_main]

use core::ptr::{read_unaligned, write_unaligned};

use aya_ebpf::{
    bindings::xdp_action,
    helpers::bpf_redirect,
    macros::{map, xdp},
    maps::{Array, PerCpuArray},
    programs::XdpContext,
};
use xdp_router_common::lab::{
    GEN_FAMILY_V4, GEN_FAMILY_V6, GEN_TEMPLATE_LEN, GEN_TEMPLATE_LEN_V4, GenConfig, LAB_PORT,
    LabCounter, RedirectConfig,
};

/// What the generator writes (one entry; see [`GenConfig`]).
#[map]
static LAB_GEN: Array<GenConfig> = Array::with_max_entries(1, 0);

/// Per-CPU frame sequence number of the generator: frame `n` belongs to flow `n % flows`.
#[map]
static LAB_GEN_SEQ: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// Packets and bytes the sink counted and dropped.
#[map]
static LAB_SINK: PerCpuArray<LabCounter> = PerCpuArray::with_max_entries(1, 0);

/// Where the bare-redirect program sends frames (one entry; see [`RedirectConfig`]).
#[map]
static LAB_REDIR: Array<RedirectConfig> = Array::with_max_entries(1, 0);

const ETH_HLEN: usize = 14;
const ETH_P_IPV4: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_UDP: u8 = 17;
/// UDP header offset for IPv4 without options and for IPv6 without extension headers.
const L4_OFF_V4: usize = ETH_HLEN + 20;
const L4_OFF_V6: usize = ETH_HLEN + 40;

/// Generator for `BPF_PROG_RUN` with `BPF_F_TEST_XDP_LIVE_FRAMES`: rewrites the headers of every
/// frame from the template, sets the flow's port and redirects the frame.
#[xdp]
pub fn lab_gen(ctx: XdpContext) -> u32 {
    // An unusable configuration (no flows, unknown family, frame shorter than the headers) is
    // an impossible state for the bench harness, which validates it: abort (visible in
    // the xdp:xdp_exception tracepoint) rather than send garbage.
    try_gen(&ctx).unwrap_or(xdp_action::XDP_ABORTED)
}

#[inline(always)]
fn try_gen(ctx: &XdpContext) -> Result<u32, ()> {
    let cfg = LAB_GEN.get(0).ok_or(())?;
    let seq = LAB_GEN_SEQ.get_ptr_mut(0).ok_or(())?;
    // SAFETY: a valid per-CPU map value pointer; the program does not migrate CPUs mid-run.
    let n = unsafe {
        let n = *seq;
        *seq = n.wrapping_add(1);
        n
    };
    let flow = n.checked_rem(cfg.flows).ok_or(())?;
    let port_be = cfg.port_base.wrapping_add(flow as u16).to_be();
    let (l4_off, len) = match cfg.family {
        GEN_FAMILY_V4 => (L4_OFF_V4, GEN_TEMPLATE_LEN_V4),
        GEN_FAMILY_V6 => (L4_OFF_V6, GEN_TEMPLATE_LEN),
        _ => return Err(()),
    };
    let data = ctx.data();
    if data + GEN_TEMPLATE_LEN_V4 > ctx.data_end() {
        return Err(());
    }
    let tpl = cfg.template.as_ptr();
    // SAFETY: 44 bytes of packet were bounds-checked above; the template is 64 bytes.
    unsafe {
        for i in 0..5 {
            write_unaligned(
                (data as *mut u64).add(i),
                read_unaligned((tpl as *const u64).add(i)),
            );
        }
        write_unaligned(
            (data + 40) as *mut u32,
            read_unaligned(tpl.add(40) as *const u32),
        );
    }
    if len == GEN_TEMPLATE_LEN {
        if data + GEN_TEMPLATE_LEN > ctx.data_end() {
            return Err(());
        }
        // SAFETY: 64 bytes of packet were bounds-checked just above.
        unsafe {
            write_unaligned(
                (data + 40) as *mut u64,
                read_unaligned(tpl.add(40) as *const u64),
            );
            write_unaligned(
                (data + 48) as *mut u64,
                read_unaligned(tpl.add(48) as *const u64),
            );
            write_unaligned(
                (data + 56) as *mut u64,
                read_unaligned(tpl.add(56) as *const u64),
            );
        }
    }
    let port_off = l4_off + if cfg.vary_dst != 0 { 2 } else { 0 };
    // SAFETY: both fields lie inside the `len` bytes checked above (port ≤ 58, word at 42/62).
    unsafe {
        write_unaligned((data + port_off) as *mut u16, port_be);
        write_unaligned((data + l4_off + 8) as *mut u16, !port_be);
    }
    // SAFETY: plain helper call; it only records the target for XDP_REDIRECT.
    Ok(unsafe { bpf_redirect(cfg.ifindex, 0) } as u32)
}

/// Sink: counts and drops UDP to or from [`LAB_PORT`]; passes everything else (ARP, ND, ping,
/// TCP, other UDP) to the stack so the host stays reachable.
#[xdp]
pub fn lab_sink(ctx: XdpContext) -> u32 {
    if !is_bench_udp(&ctx) {
        return xdp_action::XDP_PASS;
    }
    if let Some(c) = LAB_SINK.get_ptr_mut(0) {
        let len = (ctx.data_end() - ctx.data()) as u64;
        // SAFETY: a valid per-CPU map value pointer.
        unsafe {
            (*c).packets += 1;
            (*c).bytes += len;
        }
    }
    xdp_action::XDP_DROP
}

/// True for IPv4 (no options) or IPv6 (no extension headers) UDP with [`LAB_PORT`] as source or
/// destination port.
#[inline(always)]
fn is_bench_udp(ctx: &XdpContext) -> bool {
    let data = ctx.data();
    let end = ctx.data_end();
    if data + L4_OFF_V6 + 4 > end {
        // Shorter than IPv6 + ports: could still be a minimal IPv4 frame.
        if data + L4_OFF_V4 + 4 > end {
            return false;
        }
    }
    // SAFETY: at least L4_OFF_V4 + 4 = 38 bytes were bounds-checked above.
    let (ethertype, vihl, proto4) = unsafe {
        (
            u16::from_be(read_unaligned((data + 12) as *const u16)),
            *((data + ETH_HLEN) as *const u8),
            *((data + ETH_HLEN + 9) as *const u8),
        )
    };
    let l4 = match ethertype {
        ETH_P_IPV4 if vihl == 0x45 && proto4 == IPPROTO_UDP => L4_OFF_V4,
        ETH_P_IPV6 => {
            if data + L4_OFF_V6 + 4 > end {
                return false;
            }
            // SAFETY: L4_OFF_V6 + 4 bytes were bounds-checked just above.
            let next = unsafe { *((data + ETH_HLEN + 6) as *const u8) };
            if next != IPPROTO_UDP {
                return false;
            }
            L4_OFF_V6
        }
        _ => return false,
    };
    // SAFETY: l4 + 4 bytes were bounds-checked for the family chosen above.
    let (sport, dport) = unsafe {
        (
            u16::from_be(read_unaligned((data + l4) as *const u16)),
            u16::from_be(read_unaligned((data + l4 + 2) as *const u16)),
        )
    };
    sport == LAB_PORT || dport == LAB_PORT
}

/// Bare redirect (the XDP ceiling between the router's interfaces): rewrites both MACs and
/// redirects every frame, with no parsing, lookup or TTL handling.
#[xdp]
pub fn lab_redirect(ctx: XdpContext) -> u32 {
    let Some(cfg) = LAB_REDIR.get(0) else {
        return xdp_action::XDP_ABORTED;
    };
    let data = ctx.data();
    if data + ETH_HLEN > ctx.data_end() {
        // Runt frame: nothing to rewrite, let the stack drop it.
        return xdp_action::XDP_PASS;
    }
    // SAFETY: the 14-byte Ethernet header was bounds-checked above.
    unsafe {
        write_unaligned(data as *mut [u8; 6], cfg.dst_mac);
        write_unaligned((data + 6) as *mut [u8; 6], cfg.src_mac);
        bpf_redirect(cfg.ifindex, 0) as u32
    }
}

/// Plain `XDP_PASS`: attached to veth peers that must accept redirected frames (a veth takes
/// `ndo_xdp_xmit` frames only when its peer runs NAPI, which an XDP program provides).
#[xdp]
pub fn lab_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
