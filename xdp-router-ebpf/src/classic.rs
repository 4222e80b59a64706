//! The entry points of classic tc filters (clsact qdisc + cls_bpf direct-action), which the
//! daemon attaches where the kernel has no TCX links (Linux < 6.6): each one only tail-calls
//! its TC program through [`CLASSIC_TC`], whose slots the daemon fills.
//!
//! A classic filter is no bpf_link: it stays attached after the daemon is gone (SIGKILL). The
//! kernel empties a program array when the last file descriptor on it is closed
//! (`bpf_fd_array_map_clear` from `prog_array_map_release_uref`), which for [`CLASSIC_TC`] is
//! the daemon's own: a filter left behind then tail-calls into an empty slot, the call falls
//! through, and the packet goes on to the kernel untouched ([`TC_ACT_UNSPEC`]), as it would with
//! no filter. The daemon removes such filters at its next start.

use aya_ebpf::{bindings::TC_ACT_UNSPEC, macros::map, maps::ProgramArray, programs::TcContext};
use xdp_router_common::ClassicSlot;

/// The TC programs the classic tc entry points tail-call, by [`ClassicSlot`]; written by the
/// daemon when it first attaches a classic filter. Never pinned: only the daemon's descriptor
/// keeps its slots filled.
#[map]
pub static CLASSIC_TC: ProgramArray = ProgramArray::with_max_entries(ClassicSlot::COUNT, 0);

/// Runs the TC program in `slot` on `ctx` (it does not come back), or, when the slot is empty
/// (the daemon is gone), hands the packet on untouched.
#[inline(always)]
pub fn enter(ctx: &TcContext, slot: ClassicSlot) -> i32 {
    // SAFETY: a tail call on this program's own context; on success it does not return, on
    // failure nothing was changed.
    unsafe { CLASSIC_TC.tail_call(ctx, slot as u32) };
    TC_ACT_UNSPEC
}
