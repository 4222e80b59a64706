//! The xdp-router XDP program: forwards packets of offloaded (established) flows itself and
//! passes everything else to the kernel untouched, counting each packet under a [`Reason`].
//!
//! [`Reason`]: xdp_router_common::Reason
#![no_std]
#![no_main]
// Atomic add on the flow counters (see flow.rs): the eBPF crate is built with nightly anyway.
#![feature(core_intrinsics)]
#![expect(internal_features, reason = "core_intrinsics for BPF atomic add")]

mod arm;
mod bridge;
mod classic;
mod egress;
mod encap;
mod family;
mod fib;
mod flow;
mod handoff;
mod hosts;
mod maps;
mod order;
mod packet;
mod parse;
mod pppoe;
mod rewrite;
mod stamp;
mod stats;
mod tc;
mod verify;
mod vlan;
mod words;

use aya_ebpf::{
    bindings::{TC_ACT_UNSPEC, xdp_action},
    helpers::bpf_xdp_get_buff_len,
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};
use xdp_router_common::{ClassicSlot, FASTPATH_TC_INDEX, IfaceInfo, Reason, parse::VLAN_VID_MASK};

use crate::packet::Packet;

/// Entry point, attached to every managed interface. Counts the packet per ingress interface
/// and reason; a packet the fast path does not forward goes to the kernel (`XDP_PASS`).
///
/// Loaded with multi-buffer support (`xdp.frags`), so that a port with a jumbo MTU keeps
/// native XDP (a driver, veth among them, refuses a program without it once a frame may be
/// longer than a page): its frames up to a page are forwarded as on any port, a longer one
/// (in several buffers) goes to the kernel as `multi_buffer_frame`, before the pipeline, which
/// reads only the first buffer.
#[xdp(frags)]
pub fn xdp_router(ctx: XdpContext) -> u32 {
    let ifindex = ctx.ingress_ifindex() as u32;
    let info = maps::IFACES.get_ptr(ifindex);
    let slot = stats::ingress_slot(info);
    let bytes = (ctx.data_end() - ctx.data()) as u64;
    // SAFETY: a helper on this program's own context.
    let whole = unsafe { bpf_xdp_get_buff_len(ctx.ctx) };
    if whole > bytes {
        stats::count(slot, Reason::PassMultiBuffer, whole);
        return xdp_action::XDP_PASS;
    }
    xdp_pipeline(&ctx, ifindex, info, slot, bytes)
}

/// [`xdp_router`] for kernels without multi-buffer XDP (`xdp.frags` and
/// `bpf_xdp_get_buff_len`, Linux 5.18; the daemon probes them with [`xdp_router_mbp`] and
/// attaches this one where they are refused): the same pipeline, loaded without the frags flag,
/// so every frame it sees is in one buffer (a driver refuses it under a jumbo MTU instead).
#[xdp]
pub fn xdp_router_1buf(ctx: XdpContext) -> u32 {
    let ifindex = ctx.ingress_ifindex() as u32;
    let info = maps::IFACES.get_ptr(ifindex);
    let slot = stats::ingress_slot(info);
    let bytes = (ctx.data_end() - ctx.data()) as u64;
    xdp_pipeline(&ctx, ifindex, info, slot, bytes)
}

/// The XDP entry points' fast path on a frame of `bytes` in one buffer.
#[inline(always)]
fn xdp_pipeline(
    ctx: &XdpContext,
    ifindex: u32,
    info: Option<*const IfaceInfo>,
    mut slot: u32,
    bytes: u64,
) -> u32 {
    match flow::try_forward(ctx, ifindex, info, &mut slot) {
        Ok(fwd) => {
            // What was sent: padding after the IP datagram is trimmed before forwarding.
            stats::count(slot, fwd.reason, fwd.bytes);
            fwd.action
        }
        Err(Reason::PassEgressNoXdpXmit) if handoff::to_tc(ctx, info) => {
            // Counted by the TC fast path behind this program (see `handoff.rs`).
            xdp_action::XDP_PASS
        }
        Err(reason) => {
            stats::count(slot, reason, bytes);
            xdp_action::XDP_PASS
        }
    }
}

/// Probe, loaded once by the daemon and never attached or run: whether this kernel takes a
/// multi-buffer XDP program (`xdp.frags`) calling `bpf_xdp_get_buff_len`, as [`xdp_router`]
/// is. Where it does not, the daemon attaches [`xdp_router_1buf`].
#[xdp(frags)]
pub fn xdp_router_mbp(ctx: XdpContext) -> u32 {
    // SAFETY: a helper on this program's own context.
    let whole = unsafe { bpf_xdp_get_buff_len(ctx.ctx) };
    if whole > 0 {
        xdp_action::XDP_PASS
    } else {
        xdp_action::XDP_DROP
    }
}

/// The same fast path at TC ingress (a TCX link, or a classic tc filter through `classic.rs`
/// where the kernel has no TCX links), on socket buffers, attached instead of the XDP
/// program to interfaces whose datapath is TC, and behind it on native-XDP interfaces for the
/// packets it hands over (see `handoff.rs`): counts the packet per ingress interface and
/// reason in the same stats map; a packet it forwards is redirected to its egress device's
/// transmit path (`TC_ACT_REDIRECT`), anything else goes on to the kernel (`TC_ACT_UNSPEC`:
/// the next TCX program, then the stack) untouched.
#[classifier]
pub fn xdp_router_tc(ctx: TcContext) -> i32 {
    // SAFETY: the context's skb pointer is valid for the program run.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    let info = maps::IFACES.get_ptr(ifindex);
    if !handoff::for_tc(&ctx, info) {
        // Behind the XDP program, which counted this packet already.
        return TC_ACT_UNSPEC;
    }
    if !handoff::has_handoff(info)
        && let Some((tpid_be, tci_be)) = ctx.meta_vlan_tag()
        && vlan::device_of(ifindex, u16::from_be(tci_be) & VLAN_VID_MASK, tpid_be).is_ok()
    {
        // A frame for a managed VLAN device over this TC port: the kernel hands it to that
        // device (`vlan_do_receive`), untagged, and the TC fast path there counts it.
        return TC_ACT_UNSPEC;
    }
    let mut slot = stats::ingress_slot(info);
    let bytes = Packet::len(&ctx) as u64;
    let result = if !ctx.pull((bytes as usize).min(tc::TC_HEADER_PULL as usize)) {
        Err(Reason::PassMalformed)
    } else {
        flow::try_forward(&ctx, ifindex, info, &mut slot)
    };
    match result {
        Ok(fwd) => {
            stats::count(slot, fwd.reason, fwd.bytes);
            // The arming program on the egress must not take this packet for one the kernel
            // forwarded (see `arm.rs`).
            // SAFETY: the context's skb pointer is valid for the program run; `tc_index` is
            // writable for TC programs.
            unsafe { (*ctx.skb.skb).tc_index = FASTPATH_TC_INDEX };
            fwd.action as i32
        }
        Err(reason) => {
            // Behind XDP without the hand-over's mark, XDP counted what it did not hand over
            // (see `handoff.rs`). Looked up again rather than kept across the pipeline: the
            // stack is full.
            if !handoff::unmarked(maps::IFACES.get_ptr(ifindex)) {
                stats::count(slot, reason, Packet::len(&ctx) as u64);
            }
            TC_ACT_UNSPEC
        }
    }
}

/// TC egress program (TCX, or classic tc through `classic.rs`), attached to every managed
/// interface: arms the offloaded flow
/// direction of each packet the kernel itself forwards (see `arm.rs`). Never changes or drops a
/// packet: `TC_ACT_UNSPEC` hands it to the next program / the qdisc unchanged.
#[classifier]
pub fn xdp_router_arm(ctx: TcContext) -> i32 {
    let _ = arm::try_arm(&ctx, arm::LinkHeader::Ethernet);
    TC_ACT_UNSPEC
}

/// The arming program for devices without a link-layer header (`ppp0`), where the IP header
/// starts the packet on egress; see [`xdp_router_arm`].
#[classifier]
pub fn xdp_router_arm3(ctx: TcContext) -> i32 {
    let _ = arm::try_arm(&ctx, arm::LinkHeader::None);
    TC_ACT_UNSPEC
}

/// TC ingress program (TCX, or classic tc through `classic.rs`), attached with the arming
/// program: stamps each packet the kernel
/// receives with the DSCP it arrived with (see `stamp.rs`). Never changes or drops a packet.
#[classifier]
pub fn xdp_router_stamp(ctx: TcContext) -> i32 {
    let _ = stamp::try_stamp(&ctx);
    TC_ACT_UNSPEC
}

/// Probe, run once by the daemon with `BPF_PROG_RUN` and never attached: returns what
/// `bpf_fib_lookup` answers with `BPF_FIB_LOOKUP_MARK` (see `fib::probe_mark`).
#[xdp]
pub fn xdp_router_fibm(ctx: XdpContext) -> u32 {
    fib::probe_mark(&ctx)
}

/// The TC fast path ([`xdp_router_tc`]) as a classic tc filter, on kernels without TCX links
/// (see `classic.rs`).
#[classifier]
pub fn xr_cls_tc(ctx: TcContext) -> i32 {
    classic::enter(&ctx, ClassicSlot::Tc)
}

/// The arming program ([`xdp_router_arm`]) as a classic tc filter (see `classic.rs`).
#[classifier]
pub fn xr_cls_arm(ctx: TcContext) -> i32 {
    classic::enter(&ctx, ClassicSlot::Arm)
}

/// The arming program for devices without a link-layer header ([`xdp_router_arm3`]) as a
/// classic tc filter (see `classic.rs`).
#[classifier]
pub fn xr_cls_arm3(ctx: TcContext) -> i32 {
    classic::enter(&ctx, ClassicSlot::ArmL3)
}

/// The DSCP stamp ([`xdp_router_stamp`]) as a classic tc filter (see `classic.rs`).
#[classifier]
pub fn xr_cls_stamp(ctx: TcContext) -> i32 {
    classic::enter(&ctx, ClassicSlot::Stamp)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
