//! The scrape-time collector: reads a [`Status`] per scrape and has each subsystem encode
//! its metric families from it, counting the scrapes whose status read failed.

use std::fmt;

use prometheus_client::{
    collector::Collector, encoding::DescriptorEncoder, metrics::counter::Counter, registry::Unit,
};
use tracing::warn;

use super::family::{counters, gauges};
use super::{StatusSource, conntrack, forwarding, interfaces, kernel_changes, offload, per_packet};
use crate::status::Status;

/// Reads a [`Status`] per scrape and turns it into metric families.
pub(super) struct StatusCollector {
    pub(super) source: StatusSource,
    /// Scrapes whose status read failed (also exported, so an alert can fire on it).
    pub(super) errors: Counter,
}

impl fmt::Debug for StatusCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatusCollector").finish_non_exhaustive()
    }
}

impl Collector for StatusCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        match (self.source)() {
            Ok(status) => encode_status(&status, &mut encoder)?,
            Err(e) => {
                self.errors.inc();
                warn!(error = %format!("{e:#}"), "metrics scrape: cannot read the daemon status");
            }
        }
        counters(
            &mut encoder,
            "status_read_errors",
            "Scrapes during which the daemon status could not be read (the datapath metrics are missing from those).",
            None,
            [(vec![], self.errors.get())],
        )
    }
}

/// The metric families of one status snapshot. Pure: unit-tested on a hand-made [`Status`].
fn encode_status(s: &Status, enc: &mut DescriptorEncoder) -> Result<(), fmt::Error> {
    forwarding::encode(s, enc)?;
    interfaces::encode(s, enc)?;
    offload::encode(s, enc)?;
    conntrack::encode(s, enc)?;
    kernel_changes::encode(s, enc)?;
    per_packet::encode(s, enc)?;
    gauges(
        enc,
        "status_age",
        "How old this scrape's figures are: 0 when read for it, else the age of the last status read, served because the daemon's state was busy.",
        Some(&Unit::Seconds),
        [(vec![], s.age_ms as f64 / 1000.0)],
    )?;
    Ok(())
}
