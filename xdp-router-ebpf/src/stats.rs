//! Where every packet is counted: per ingress interface slot and [`Reason`], packets and bytes,
//! on a per-CPU array (no atomics needed, summed by the daemon at scrape time).

use xdp_router_common::{MAX_IFACE_SLOTS, Reason, stats_index};

use crate::maps::{IFACES, STATS};

/// Stats slot and `IFACE_F_*` flags of the ingress interface: its `IfaceInfo`, or slot 0 (no
/// flags) when the interface is not in `IFACES` (an out-of-range slot also counts in slot 0,
/// so the index stays inside `STATS`).
#[inline(always)]
pub fn ingress_info(ifindex: u32) -> (u32, u32) {
    match IFACES.get_ptr(ifindex) {
        // SAFETY: a map value pointer returned by the kernel is valid for reads of IfaceInfo.
        Some(info) => {
            let (slot, flags) = unsafe { ((*info).slot, (*info).flags) };
            (if slot < MAX_IFACE_SLOTS { slot } else { 0 }, flags)
        }
        None => (0, 0),
    }
}

/// Adds one packet of `bytes` bytes to `STATS[slot, reason]` on this CPU.
#[inline(always)]
pub fn count(slot: u32, reason: Reason, bytes: u64) {
    if let Some(c) = STATS.get_ptr_mut(stats_index(slot, reason)) {
        // SAFETY: per-CPU array value, only this CPU writes it and XDP runs with preemption
        // (migration) disabled, so a plain read-modify-write is race free.
        unsafe {
            (*c).packets += 1;
            (*c).bytes += bytes;
        }
    }
}
