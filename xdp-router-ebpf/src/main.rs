//! The xdp-router XDP program: forwards packets of offloaded (established) flows itself and
//! passes everything else to the kernel untouched, counting each packet under a [`Reason`].
//!
//! [`Reason`]: xdp_router_common::Reason
#![no_std]
#![no_main]
// Atomic add on the flow counters (see flow.rs): the eBPF crate is built with nightly anyway.
#![feature(core_intrinsics)]
#![expect(internal_features, reason = "core_intrinsics for BPF atomic add")]

mod flow;
mod maps;
mod parse;
mod rewrite;
mod stats;
mod verify;

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};

/// Entry point, attached to every managed interface. Counts the packet per ingress interface
/// and reason; a packet the fast path does not forward goes to the kernel (`XDP_PASS`).
#[xdp]
pub fn xdp_router(ctx: XdpContext) -> u32 {
    let ifindex = ctx.ingress_ifindex() as u32;
    let info = maps::IFACES.get_ptr(ifindex);
    let slot = stats::ingress_slot(info);
    let bytes = (ctx.data_end() - ctx.data()) as u64;
    match flow::try_forward(&ctx, ifindex, info) {
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

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
