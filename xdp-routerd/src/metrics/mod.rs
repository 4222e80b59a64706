//! The Prometheus `/metrics` endpoint (`metrics_listen` in the config, loopback by default).
//!
//! Everything is read at scrape time: a [`Collector`] asks the daemon for a [`Status`] snapshot
//! (which sums the per-CPU `STATS` map and reads the flow maps right then) and encodes it, so a
//! scrape never sees a stale copy and the datapath never does anything for metrics.
//!
//! Naming follows the Prometheus conventions: every name starts with `xdp_router_`, counters end
//! in `_total`, sizes are in bytes and durations in seconds (base units, named in the metric),
//! and variants are labels (`interface`, `direction`, `reason`, `family`, `type`, `mode`), not
//! names. The exposition format is OpenMetrics text.
//!
//! Here: the registry and its exposition; `collector` (the scrape-time collector), one file per
//! subsystem that exports metrics (`forwarding`, `interfaces`, `offload`, `conntrack`,
//! `kernel_changes`, `per_packet`), `hosts` (per-LAN-host traffic, a collector of its own),
//! `family` (encoding one family), `server` (HTTP).

use std::{fmt, sync::Arc};

use prometheus_client::{
    collector::Collector, encoding::DescriptorEncoder, metrics::counter::Counter,
    registry::Registry,
};

use crate::{flows::accounting::HostTotals, status::Status};
use collector::StatusCollector;
use family::gauges;
use hosts::HostCollector;

/// Where the metrics' status comes from (the daemon's state; a fixed one in tests).
pub type StatusSource = Arc<dyn Fn() -> anyhow::Result<Status> + Send + Sync>;

/// Where the per-host traffic comes from (see [`crate::state::Shared::host_traffic`]).
pub type HostSource = Arc<dyn Fn() -> HostTotals + Send + Sync>;

/// Every metric name starts with this (plus `_`).
pub const PREFIX: &str = "xdp_router";

/// `Content-Type` of the exposition (OpenMetrics text 1.0, which Prometheus negotiates).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The daemon's registry: build info, scrape errors, the status collector over `source` and,
/// when given (`host_metrics_limit` > 0), the per-host collector over `hosts`.
pub fn registry(source: StatusSource, hosts: Option<HostSource>) -> Registry {
    let mut registry = Registry::with_prefix(PREFIX);
    registry.register_collector(Box::new(BuildInfo));
    registry.register_collector(Box::new(StatusCollector {
        source,
        errors: Counter::default(),
    }));
    if let Some(source) = hosts {
        registry.register_collector(Box::new(HostCollector {
            source,
            last: Default::default(),
        }));
    }
    registry
}

/// `xdp_router_build_info{version} 1`.
#[derive(Debug)]
struct BuildInfo;

impl Collector for BuildInfo {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        gauges(
            &mut enc,
            "build_info",
            "Always 1; the labels say which xdp-routerd is running.",
            None,
            [(
                vec![("version", env!("CARGO_PKG_VERSION").to_string())],
                1u64,
            )],
        )
    }
}

/// The exposition text of `registry` (what `/metrics` returns).
pub fn encode(registry: &Registry) -> Result<String, fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}

mod collector;
mod conntrack;
mod family;
mod forwarding;
mod hosts;
mod interfaces;
mod kernel_changes;
mod offload;
mod per_packet;
mod server;
#[cfg(test)]
pub(crate) mod tests;

pub use server::{bind, serve, serve_listener};
