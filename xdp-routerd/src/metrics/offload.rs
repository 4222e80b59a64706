//! Offload metrics: flow map occupancy and capacity, and the connections the flow manager
//! offloaded, withdrew or skipped (by reason).

use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;

use super::family::{counters, gauges};
use crate::status::Status;

/// Encodes this subsystem's families of one status snapshot.
pub(super) fn encode(s: &Status, enc: &mut DescriptorEncoder) -> Result<(), fmt::Error> {
    let families = [("ipv4", s.flows.ipv4), ("ipv6", s.flows.ipv6)];
    gauges(
        enc,
        "flow_entries",
        "Offloaded flow directions in the flow map of each address family (two per connection).",
        None,
        families.map(|(f, n)| (vec![("family", f.to_string())], n)),
    )?;
    gauges(
        enc,
        "flow_capacity_entries",
        "Capacity of the flow map of each address family, in flow directions.",
        None,
        families.map(|(f, _)| (vec![("family", f.to_string())], u64::from(s.flows.capacity))),
    )?;
    let ct = &s.conntrack;
    gauges(
        enc,
        "offloaded_connections",
        "Conntrack connections currently forwarded by the fast path.",
        None,
        [(vec![], ct.offloaded)],
    )?;
    counters(
        enc,
        "connections_offloaded",
        "Conntrack connections handed to the fast path since the daemon started.",
        None,
        [(vec![], ct.offloaded_total)],
    )?;
    counters(
        enc,
        "connections_withdrawn",
        "Connections taken back from the fast path (conntrack destroy, route, address or link change) since the daemon started.",
        None,
        [(vec![], ct.removed_total)],
    )?;
    counters(
        enc,
        "connections_skipped",
        "Conntrack connections considered for offload but left to the kernel, by reason.",
        None,
        ct.skipped
            .iter()
            .map(|(r, n)| (vec![("reason", r.name().to_string())], *n)),
    )?;
    Ok(())
}
