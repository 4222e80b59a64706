//! Bounds-checked access to packet memory.

use core::mem::size_of;

use aya_ebpf::programs::XdpContext;
use xdp_router_common::Reason;

/// Pointer to a `T` at `offset` bytes into the frame, if the whole `T` is inside it; a frame too
/// short for the header is [`Reason::PassMalformed`]. Mutable because every header the fast
/// path reads is also one it may rewrite (after all checks).
#[inline(always)]
pub fn ptr_at_mut<T>(ctx: &XdpContext, offset: usize) -> Result<*mut T, Reason> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + size_of::<T>() > end {
        return Err(Reason::PassMalformed);
    }
    Ok((start + offset) as *mut T)
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
