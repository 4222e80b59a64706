//! Datapath forwarding metrics: packets and bytes the fast path forwarded or handed to the
//! kernel (summed from the per-CPU `STATS` map at scrape time), and the fast-path switch.

use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Unit;
use xdp_router_common::Reason;

use super::family::{counters, gauges};
use crate::status::Status;

/// Encodes this subsystem's families of one status snapshot.
pub(super) fn encode(s: &Status, enc: &mut DescriptorEncoder) -> Result<(), fmt::Error> {
    let fast: Vec<_> = s
        .counters
        .iter()
        .filter_map(|c| {
            let direction = match c.reason {
                Reason::ForwardedOriginal => "original",
                Reason::ForwardedReply => "reply",
                _ => return None,
            };
            Some((c, direction))
        })
        .collect();
    counters(
        enc,
        "fastpath_packets",
        "Packets forwarded by the XDP fast path, by ingress interface and connection direction.",
        None,
        fast.iter().map(|(c, d)| {
            (
                vec![
                    ("interface", c.interface.clone()),
                    ("direction", d.to_string()),
                ],
                c.packets,
            )
        }),
    )?;
    counters(
        enc,
        "fastpath",
        "Bytes (L2 frames as received) forwarded by the XDP fast path, by ingress interface and connection direction.",
        Some(&Unit::Bytes),
        fast.iter().map(|(c, d)| {
            (
                vec![
                    ("interface", c.interface.clone()),
                    ("direction", d.to_string()),
                ],
                c.bytes,
            )
        }),
    )?;
    let fallback: Vec<_> = s
        .counters
        .iter()
        .filter(|c| !c.reason.is_forwarded())
        .collect();
    counters(
        enc,
        "fallback_packets",
        "Packets handed to the kernel stack unmodified, by ingress interface and reason.",
        None,
        fallback.iter().map(|c| {
            (
                vec![
                    ("interface", c.interface.clone()),
                    ("reason", c.reason.name().to_string()),
                ],
                c.packets,
            )
        }),
    )?;
    counters(
        enc,
        "fallback",
        "Bytes (L2 frames) handed to the kernel stack unmodified, by ingress interface and reason.",
        Some(&Unit::Bytes),
        fallback.iter().map(|c| {
            (
                vec![
                    ("interface", c.interface.clone()),
                    ("reason", c.reason.name().to_string()),
                ],
                c.bytes,
            )
        }),
    )?;
    gauges(
        enc,
        "fastpath_enabled",
        "1 when the fast path forwards established flows, 0 when it is switched off (everything goes to the kernel).",
        None,
        [(vec![], u64::from(s.fastpath))],
    )?;
    Ok(())
}
