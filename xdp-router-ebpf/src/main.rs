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
mod egress;
mod encap;
mod family;
mod fib;
mod flow;
mod maps;
mod order;
mod packet;
mod parse;
mod pppoe;
mod rewrite;
mod stamp;
mod stats;
mod verify;
mod vlan;
mod words;

use aya_ebpf::{
    bindings::{TC_ACT_UNSPEC, xdp_action},
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};

/// Entry point, attached to every managed interface. Counts the packet per ingress interface
/// and reason; a packet the fast path does not forward goes to the kernel (`XDP_PASS`).
#[xdp]
pub fn xdp_router(ctx: XdpContext) -> u32 {
    let ifindex = ctx.ingress_ifindex() as u32;
    let info = maps::IFACES.get_ptr(ifindex);
    let mut slot = stats::ingress_slot(info);
    let bytes = (ctx.data_end() - ctx.data()) as u64;
    match flow::try_forward(&ctx, ifindex, info, &mut slot) {
        Ok(fwd) => {
            // What was sent: padding after the IP datagram is trimmed before forwarding.
            stats::count(slot, fwd.reason, fwd.bytes);
            fwd.action
        }
        Err(reason) => {
            stats::count(slot, reason, bytes);
            xdp_action::XDP_PASS
        }
    }
}

/// TC egress program (TCX), attached to every managed interface: arms the offloaded flow
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

/// TC ingress program (TCX), attached with the arming program: stamps each packet the kernel
/// receives with the DSCP it arrived with (see `stamp.rs`). Never changes or drops a packet.
#[classifier]
pub fn xdp_router_stamp(ctx: TcContext) -> i32 {
    let _ = stamp::try_stamp(&ctx);
    TC_ACT_UNSPEC
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
