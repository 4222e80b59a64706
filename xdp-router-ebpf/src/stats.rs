//! Where every packet is counted: per ingress interface slot and [`Reason`], packets and bytes,
//! on a per-CPU array (no atomics needed, summed by the daemon at scrape time).

use xdp_router_common::{IfaceInfo, MAX_IFACE_SLOTS, Reason, stats_index};

use crate::maps::STATS;

/// Stats slot of the ingress interface: its `IfaceInfo::slot` (`info`, its `IFACES` entry), or
/// 0 when the interface is not in `IFACES` (or carries an out-of-range slot, so the index stays
/// inside `STATS`).
#[inline(always)]
pub fn ingress_slot(info: Option<*const IfaceInfo>) -> u32 {
    match info {
        Some(info) => {
            // SAFETY: a map value pointer returned by the kernel is valid for reads of
            // IfaceInfo.
            let slot = unsafe { (*info).slot };
            if slot < MAX_IFACE_SLOTS { slot } else { 0 }
        }
        None => 0,
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
