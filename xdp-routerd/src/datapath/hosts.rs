//! `HOST_TRAFFIC`: what the router forwarded per LAN host, by host slot, per CPU. The fast
//! path and the arming program add each packet of an offloaded direction to its hosts' slots
//! (`xdp-router-ebpf/src/hosts.rs`); a scrape sums one entry per host over the CPUs.

use std::os::fd::AsFd as _;

use anyhow::Context as _;
use aya::{
    Ebpf,
    maps::{IterableMap as _, Map, MapData, MapError, PerCpuArray},
};
use xdp_router_common::{HOST_SLOT_FIRST, HostCounters, MAP_HOST_TRAFFIC};

/// The `HOST_TRAFFIC` map's entries: `host_metrics_limit` hosts, `other` and the unused
/// `HOST_SLOT_NONE`.
pub fn slots(host_metrics_limit: usize) -> u32 {
    u32::try_from(host_metrics_limit)
        .unwrap_or(u32::MAX)
        .saturating_add(HOST_SLOT_FIRST)
}

/// A handle on `HOST_TRAFFIC`.
pub struct HostTrafficMap(PerCpuArray<MapData, HostCounters>);

impl HostTrafficMap {
    pub(super) fn take(ebpf: &mut Ebpf) -> anyhow::Result<HostTrafficMap> {
        super::take(ebpf, MAP_HOST_TRAFFIC).map(HostTrafficMap)
    }

    /// Another handle on the same map (a file descriptor of its own), for the metrics task:
    /// it reads the counters without the state's lock.
    pub fn try_clone(&self) -> anyhow::Result<HostTrafficMap> {
        let fd = self
            .0
            .map()
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .with_context(|| format!("cannot duplicate the {MAP_HOST_TRAFFIC} map's descriptor"))?;
        let data = MapData::from_fd(fd)
            .with_context(|| format!("cannot open the {MAP_HOST_TRAFFIC} map"))?;
        PerCpuArray::try_from(Map::PerCpuArray(data))
            .map(HostTrafficMap)
            .with_context(|| format!("map {MAP_HOST_TRAFFIC} has an unexpected type"))
    }

    /// The counters of `slot`, summed over the CPUs (one system call).
    pub fn read(&self, slot: u32) -> Result<HostCounters, MapError> {
        let per_cpu = self.0.get(&slot, 0)?;
        Ok(per_cpu
            .iter()
            .fold(HostCounters::default(), |a, c| HostCounters {
                transmit_packets: a.transmit_packets.wrapping_add(c.transmit_packets),
                transmit_bytes: a.transmit_bytes.wrapping_add(c.transmit_bytes),
                receive_packets: a.receive_packets.wrapping_add(c.receive_packets),
                receive_bytes: a.receive_bytes.wrapping_add(c.receive_bytes),
            }))
    }
}
