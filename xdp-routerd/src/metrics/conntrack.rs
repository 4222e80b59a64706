//! Conntrack sync metrics: ctnetlink events, errors, resyncs and keep-alive refreshes.

use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Unit;

use super::family::{counters, gauges};
use crate::status::Status;

/// Encodes this subsystem's families of one status snapshot.
pub(super) fn encode(s: &Status, enc: &mut DescriptorEncoder) -> Result<(), fmt::Error> {
    let ct = &s.conntrack;
    counters(
        enc,
        "conntrack_events",
        "ctnetlink events received, by type (new, update, destroy).",
        None,
        ct.events_by_type
            .iter()
            .map(|(t, n)| (vec![("type", t.clone())], *n)),
    )?;
    counters(
        enc,
        "conntrack_sync_errors",
        "Conntrack sync errors: failed dumps, timeout refreshes, socket errors.",
        None,
        [(vec![], ct.errors)],
    )?;
    counters(
        enc,
        "conntrack_decode_errors",
        "Conntrack event messages that could not be decoded and were skipped (their connections stay in the kernel).",
        None,
        [(vec![], ct.decode_errors)],
    )?;
    counters(
        enc,
        "conntrack_resyncs",
        "Full resyncs of the flow maps from a conntrack dump (start, event socket overrun).",
        None,
        [(vec![], ct.resyncs)],
    )?;
    gauges(
        enc,
        "conntrack_last_resync_duration",
        "Duration of the last full conntrack resync.",
        Some(&Unit::Seconds),
        [(vec![], ct.last_resync_ms as f64 / 1000.0)],
    )?;
    counters(
        enc,
        "conntrack_refreshes",
        "Conntrack timeout refreshes sent for flows that carried fast-path traffic (keep-alive).",
        None,
        [(vec![], ct.refreshes)],
    )?;
    counters(
        enc,
        "conntrack_joined_on_traffic",
        "Connections found in conntrack at start that the keep-alive took in once they carried traffic (a TCP one marked \"be liberal\"); until then the fast path leaves them to the kernel.",
        None,
        [(vec![], ct.joined_on_traffic)],
    )?;
    Ok(())
}
