//! Stamping: the TC ingress program that writes the DSCP each packet arrived with into
//! `skb->tc_index` (see `xdp_router_common::dscp_stamp`), before the kernel's rules see it.
//!
//! The arming program (`arm.rs`) runs on egress, after the whole forwarding path: it sees the
//! DSCP the kernel sends a packet out with, and here the one it came in with. When they differ,
//! a rule rewrote the DSCP of that flow direction (`FLOW_DSCP_REWRITTEN`), and the fast path
//! may apply the same rewrite (`flow::check_dscp`). Each skb carries its own stamp, so packets
//! of one flow with different DSCPs (WebRTC sends audio and video on one 5-tuple) cannot be
//! mixed up. Never changes the packet itself; packets that are not Ethernet-framed IP (PPPoE
//! sessions) are not stamped, and their flows' rewrites stay with the kernel.

use aya_ebpf::programs::TcContext;
use xdp_router_common::{
    dscp_stamp,
    parse::{ETH_HLEN, ETH_P_IP, ETH_P_IPV6},
};

/// Stamps the skb in `ctx` with its arrival DSCP, if it is an IP packet.
#[inline(always)]
pub fn try_stamp(ctx: &TcContext) -> Option<()> {
    // A VLAN tag is skb metadata by now: the Ethernet type is the inner one.
    let ethertype = u16::from_be(ctx.load::<u16>(12).ok()?);
    let dscp = match ethertype {
        // Version/IHL, then the TOS byte: DSCP in its top 6 bits.
        ETH_P_IP => ctx.load::<u8>(ETH_HLEN + 1).ok()? >> 2,
        // Version (4 bits), then the traffic class: DSCP in its top 6 bits.
        ETH_P_IPV6 => {
            let vtc: [u8; 2] = ctx.load(ETH_HLEN).ok()?;
            (u16::from_be_bytes(vtc) >> 6) as u8 & 0x3f
        }
        _ => return None,
    };
    // SAFETY: the context's skb pointer is valid for the program run; `tc_index` is writable
    // for TC programs.
    unsafe { (*ctx.skb.skb).tc_index = dscp_stamp(dscp) };
    Some(())
}
