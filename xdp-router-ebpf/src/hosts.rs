//! Per-LAN-host traffic: each packet of an offloaded direction, forwarded by the fast path
//! (`flow.rs::finish`) or by the kernel (`arm.rs`), is added to its LAN hosts' counters in
//! `HOST_TRAFFIC`, so the daemon's scrape reads one entry per host instead of every flow.

use xdp_router_common::HOST_SLOT_NONE;

use crate::maps::HOST_TRAFFIC;

/// Adds `packets` and `ip_bytes` (as `FlowCounters` counts them) of a direction whose
/// `host_slots` are `slots` (`[sender, receiver]`) to the sender's transmit and the
/// receiver's receive counters. A slot the map does not have counts nothing.
#[inline(always)]
pub fn count(slots: [u32; 2], packets: u64, ip_bytes: u64) {
    let [sender, receiver] = slots;
    if sender != HOST_SLOT_NONE
        && let Some(h) = HOST_TRAFFIC.get_ptr_mut(sender)
    {
        // SAFETY: a per-CPU array value of this CPU. The programs that write it (XDP, TC
        // ingress and egress) run with bottom halves disabled and do not call the kernel
        // between the read and the write, so a plain read-modify-write is race free (as
        // `KERNEL_FWD` in `arm.rs`).
        unsafe {
            add(
                &mut (*h).transmit_packets,
                &mut (*h).transmit_bytes,
                packets,
                ip_bytes,
            )
        }
    }
    if receiver != HOST_SLOT_NONE
        && let Some(h) = HOST_TRAFFIC.get_ptr_mut(receiver)
    {
        // SAFETY: as above.
        unsafe {
            add(
                &mut (*h).receive_packets,
                &mut (*h).receive_bytes,
                packets,
                ip_bytes,
            )
        }
    }
}

#[inline(always)]
fn add(p: &mut u64, b: &mut u64, packets: u64, ip_bytes: u64) {
    *p = p.wrapping_add(packets);
    *b = b.wrapping_add(ip_bytes);
}
