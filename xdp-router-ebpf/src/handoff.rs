//! The hand-over from the XDP program to the TC fast path behind it, on a native-XDP interface
//! ([`IFACE_F_TC_HANDOFF`]): a packet of an offloaded flow whose egress cannot transmit XDP
//! frames (a port on the TC datapath, a macvlan, a Wi-Fi port) is not given up to the kernel
//! but to the TC program at the same interface's ingress, which sends it through the egress
//! device's transmit path. The mark is XDP metadata ([`XDP_TC_HANDOFF`]): the kernel keeps it in
//! front of the skb it builds for the packet, and GRO merges only packets with equal metadata.
//!
//! Each packet is counted once: by XDP when it is not handed over, by TC when it is.
//!
//! A kernel that refuses XDP metadata to XDP programs (`bpf_xdp_adjust_meta`; the daemon probes
//! it and loads [`XDP_META`] 0, so the verifier never sees the call) gets the hand-over without
//! the mark: XDP passes such a packet uncounted as before, and the TC program behind it runs
//! the fast path on every packet XDP passed on that interface ([`unmarked`]). Being the same
//! pipeline on an skb, it forwards what XDP could not send (and what it could, had XDP not
//! passed the packet for a reason of its own, which TC then finds too), and it counts only what
//! it forwards: XDP counted everything else. What this costs: a TC lookup for every
//! kernel-bound packet on such a port; and two kinds of packet are counted otherwise than once:
//! a handed-over packet that TC then refuses (its own checks after XDP's last one: a frame it
//! cannot reframe) is passed uncounted, and a multi-buffer frame XDP counted and TC forwards is
//! counted by both.

use aya_ebpf::{
    EbpfContext,
    bindings::__sk_buff,
    helpers::bpf_xdp_adjust_meta,
    programs::{TcContext, XdpContext},
};
use xdp_router_common::{IFACE_F_TC_HANDOFF, IfaceInfo, XDP_TC_HANDOFF};

/// Bytes of metadata the mark takes.
const MARK_LEN: usize = core::mem::size_of::<u32>();

/// Whether XDP programs may use XDP metadata (`bpf_xdp_adjust_meta`), fixed at load time by the
/// daemon from its probe (`EbpfLoader::override_global`; [`xdp_router_common::GLOBAL_XDP_META`]).
/// 0: the mark is never written or read, and the verifier prunes the call.
#[unsafe(no_mangle)]
static XDP_META: u8 = 1;

/// [`XDP_META`] as loaded.
#[inline(always)]
fn xdp_meta() -> bool {
    // SAFETY: reading a static; volatile so that the value the loader wrote into .rodata is
    // used instead of the compile-time 1.
    unsafe { core::ptr::read_volatile(&XDP_META) != 0 }
}

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
/// driver keeps no metadata (`bpf_xdp_adjust_meta` refuses). Without XDP metadata in this
/// kernel, the packet goes to the TC program behind unmarked.
#[inline(always)]
pub fn to_tc(ctx: &XdpContext, info: Option<*const IfaceInfo>) -> bool {
    if !has_handoff(info) {
        return false;
    }
    if !xdp_meta() {
        return true;
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
/// yes; behind XDP ([`IFACE_F_TC_HANDOFF`]), only when XDP handed the packet over (without XDP
/// metadata: every packet, see [`unmarked`]).
#[inline(always)]
pub fn for_tc(ctx: &TcContext, info: Option<*const IfaceInfo>) -> bool {
    if !has_handoff(info) || !xdp_meta() {
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

/// In the TC program: whether it runs behind XDP on this interface without the mark (no XDP
/// metadata in this kernel), so that it sees every packet XDP passed, handed over or not, and
/// counts only what it forwards.
#[inline(always)]
pub fn unmarked(info: Option<*const IfaceInfo>) -> bool {
    has_handoff(info) && !xdp_meta()
}
