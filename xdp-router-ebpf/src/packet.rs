//! Packet access, whatever the program type: [`Packet`] is what the pipeline (flow.rs and the
//! modules below it) needs from its context: where the packet is, how to resize it, how to
//! redirect it. The XDP program's context implements it here; a TC (socket buffer) program
//! can implement it for its own context and run the same pipeline. On top of it: the
//! bounds-checked pointer into the packet and the packet's length.

use core::{ffi::c_void, mem::size_of};

use aya_ebpf::{
    EbpfContext,
    bindings::{xdp_action, xdp_md},
    helpers::{bpf_xdp_adjust_head, bpf_xdp_adjust_tail},
    programs::XdpContext,
};
use xdp_router_common::Reason;

use crate::maps::TX_PORTS;

/// A program context the pipeline can forward a packet from. Every method is
/// `#[inline(always)]` in its implementations: the pipeline compiles to what it would be
/// written against the context itself.
pub trait Packet: EbpfContext {
    /// Address of the packet's first byte.
    fn data(&self) -> usize;

    /// Address one past the packet's last byte.
    fn data_end(&self) -> usize;

    /// The context whose pointer ([`EbpfContext::as_ptr`]) is `ptr`: a BPF subprogram takes
    /// the context pointer as its argument (see `verify::l4_checksum`).
    ///
    /// # Safety
    /// `ptr` must be this program type's context pointer, as the program received it.
    unsafe fn from_ptr(ptr: *mut c_void) -> Self;

    /// Moves the packet's start by `delta` bytes, as `bpf_xdp_adjust_head` does: a positive
    /// delta removes bytes from the front, a negative one makes room there. `false` when it
    /// failed (the packet is unchanged). Every packet pointer is invalid afterwards.
    fn adjust_head(&self, delta: i32) -> bool;

    /// Moves the packet's end by `delta` bytes, as `bpf_xdp_adjust_tail` does (negative:
    /// trims). `false` when it failed. Every packet pointer is invalid afterwards.
    fn adjust_tail(&self, delta: i32) -> bool;

    /// Sets up the redirect of the packet out of `ifindex`, if the daemon lists it as a
    /// target: the action the program then returns. `None`: not a target, nothing set up.
    fn redirect(ifindex: u32) -> Option<u32>;
}

impl Packet for XdpContext {
    #[inline(always)]
    fn data(&self) -> usize {
        XdpContext::data(self)
    }

    #[inline(always)]
    fn data_end(&self) -> usize {
        XdpContext::data_end(self)
    }

    #[inline(always)]
    unsafe fn from_ptr(ptr: *mut c_void) -> Self {
        XdpContext::new(ptr.cast::<xdp_md>())
    }

    #[inline(always)]
    fn adjust_head(&self, delta: i32) -> bool {
        // SAFETY: a helper on this program's own context.
        unsafe { bpf_xdp_adjust_head(self.ctx, delta) == 0 }
    }

    #[inline(always)]
    fn adjust_tail(&self, delta: i32) -> bool {
        // SAFETY: a helper on this program's own context.
        unsafe { bpf_xdp_adjust_tail(self.ctx, delta) == 0 }
    }

    #[inline(always)]
    fn redirect(ifindex: u32) -> Option<u32> {
        // bpf_redirect_map() only records the target (per-CPU redirect info, used once the
        // program returns XDP_REDIRECT), and a missing TX_PORTS entry returns the low bits of
        // the flags (XDP_PASS) instead, so an egress the daemon did not (or no longer) list
        // goes to the kernel untouched. One devmap lookup instead of a lookup to check plus
        // another in the redirect.
        TX_PORTS
            .redirect(ifindex, u64::from(xdp_action::XDP_PASS))
            .ok()
    }
}

/// Pointer to a `T` at `offset` bytes into the packet, if the whole `T` is inside it; a packet
/// too short for the header is [`Reason::PassMalformed`]. Mutable because every header the
/// fast path reads is also one it may rewrite (after all checks).
#[inline(always)]
pub fn ptr_at_mut<T, P: Packet>(ctx: &P, offset: usize) -> Result<*mut T, Reason> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + size_of::<T>() > end {
        return Err(Reason::PassMalformed);
    }
    Ok((start + offset) as *mut T)
}

/// Length of the whole packet (what the counters count).
#[inline(always)]
pub fn frame_len<P: Packet>(ctx: &P) -> usize {
    let len = ctx.data_end() - ctx.data();
    // A number from here on, not pointers: LLVM would otherwise fold a later `len - l2` (with
    // `l2` a variable) into the end pointer, which the verifier rejects (pointer arithmetic on
    // pkt_end). One stack store and load.
    // SAFETY: reading a live local.
    unsafe { core::ptr::read_volatile(&len) }
}
