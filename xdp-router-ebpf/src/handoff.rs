//! The hand-over from the XDP program to the TC fast path behind it, on a native-XDP interface
//! ([`IFACE_F_TC_HANDOFF`]): a packet of an offloaded flow whose egress cannot transmit XDP
//! frames (a port on the TC datapath, a macvlan, a Wi-Fi port) is not given up to the kernel
//! but to the TC program at the same interface's ingress, which sends it through the egress
//! device's transmit path. The mark is XDP metadata ([`XDP_TC_HANDOFF`]): the kernel keeps it in
//! front of the skb it builds for the packet, and GRO merges only packets with equal metadata.
//!
//! Each packet is counted once: by XDP when it is not handed over, by TC when it is.

use aya_ebpf::{
    EbpfContext,
    bindings::__sk_buff,
    helpers::bpf_xdp_adjust_meta,
    programs::{TcContext, XdpContext},
};
use xdp_router_common::{IFACE_F_TC_HANDOFF, IfaceInfo, XDP_TC_HANDOFF};

/// Bytes of metadata the mark takes.
const MARK_LEN: usize = core::mem::size_of::<u32>();

/// Whether `info` (the ingress's entry) has the TC fast path behind XDP (the TC program
/// there runs only for what XDP hands over, not as the interface's datapath).
#[inline(always)]
pub fn has_handoff(info: Option<*const IfaceInfo>) -> bool {
    // SAFETY: map value pointer from the kernel.
    info.is_some_and(|i| unsafe { (*i).flags } & IFACE_F_TC_HANDOFF != 0)
}

/// In the XDP program, for a packet the fast path left untouched because its egress cannot
/// transmit XDP frames: marks it for the TC program behind and says so (`true`: the caller
/// passes it uncounted). `false` (count it as passed) where no TC program is behind, or the
/// driver keeps no metadata (`bpf_xdp_adjust_meta` refuses).
#[inline(always)]
pub fn to_tc(ctx: &XdpContext, info: Option<*const IfaceInfo>) -> bool {
    if !has_handoff(info) {
        return false;
    }
    // SAFETY: a helper on this program's own context.
    if unsafe { bpf_xdp_adjust_meta(ctx.as_ptr().cast(), -(MARK_LEN as i32)) } != 0 {
        return false;
    }
    let (meta, data) = (ctx.metadata(), ctx.data());
    if meta + MARK_LEN > data {
        return false;
    }
    // SAFETY: bounds checked against the packet start just above.
    unsafe { (meta as *mut u32).write_unaligned(XDP_TC_HANDOFF) };
    true
}

/// In the TC program: whether it is to look at this packet. Everywhere it runs instead of XDP,
/// yes; behind XDP ([`IFACE_F_TC_HANDOFF`]), only when XDP handed the packet over.
#[inline(always)]
pub fn for_tc(ctx: &TcContext, info: Option<*const IfaceInfo>) -> bool {
    if !has_handoff(info) {
        return true;
    }
    let skb: *mut __sk_buff = ctx.as_ptr().cast();
    // SAFETY: the context's skb pointer is valid for the program run.
    let (meta, data) = unsafe { ((*skb).data_meta as usize, (*skb).data as usize) };
    if meta + MARK_LEN > data {
        return false;
    }
    // SAFETY: bounds checked against the packet start just above.
    unsafe { (meta as *const u32).read_unaligned() == XDP_TC_HANDOFF }
}
