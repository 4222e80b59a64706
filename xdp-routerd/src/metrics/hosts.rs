//! Per-LAN-host traffic the router forwarded on offloaded connections, by the fast path or by
//! the kernel (the arming program counts the latter):
//! `xdp_router_host_{transmit,receive}_{bytes,packets}_total{host}`, for per-host traffic
//! graphs (what nlbwmon and friends draw from conntrack's counters, which miss the fast path).
//!
//! Bounded: only LAN hosts (endpoints whose packets arrive on a `lan` interface), the first
//! `host_metrics_limit` of them by address, the rest under `host="other"`. Monotonic: the
//! datapath's per-host counters only grow, closed connections included, and a scrape whose
//! read of a host fails (see [`crate::state::Shared::host_traffic`]) reports the previous
//! value instead of a dip.

use std::fmt;

use parking_lot::Mutex;
use prometheus_client::{collector::Collector, encoding::DescriptorEncoder, registry::Unit};

use super::HostSource;
use super::family::counters;
use crate::flows::accounting::{HostTotals, HostTraffic, Traffic};

/// What the help texts say the series cover.
const COVERS: &str = "IP bytes (datagram lengths, conntrack's unit) the router forwarded for a LAN host on its offloaded (established TCP/UDP) connections, by the XDP fast path or by the kernel, the fast path on or off (host=\"other\": the hosts beyond host_metrics_limit); a connection's packets before it was offloaded, and other protocols, are in conntrack's counters only (nf_conntrack_acct).";

/// Reads the per-host totals at each scrape.
pub(super) struct HostCollector {
    pub(super) source: HostSource,
    /// The totals last reported: a series never goes below them.
    pub(super) last: Mutex<HostTotals>,
}

impl fmt::Debug for HostCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostCollector").finish_non_exhaustive()
    }
}

impl Collector for HostCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let totals = {
            let mut last = self.last.lock();
            *last = at_least(&last, (self.source)());
            last.clone()
        };
        encode_totals(&totals, &mut enc)
    }
}

/// `now`, each counter raised to its value in `last` where it is lower.
fn at_least(last: &HostTotals, mut now: HostTotals) -> HostTotals {
    fn max(a: Traffic, b: Traffic) -> Traffic {
        Traffic {
            packets: a.packets.max(b.packets),
            bytes: a.bytes.max(b.bytes),
        }
    }
    fn raise(h: &mut HostTraffic, floor: &HostTraffic) {
        h.transmit = max(h.transmit, floor.transmit);
        h.receive = max(h.receive, floor.receive);
    }
    for (host, floor) in &last.hosts {
        raise(now.hosts.entry(*host).or_default(), floor);
    }
    raise(&mut now.other, &last.other);
    now
}

/// The four families of one set of totals. Pure: unit-tested on hand-made totals.
pub(super) fn encode_totals(t: &HostTotals, enc: &mut DescriptorEncoder) -> Result<(), fmt::Error> {
    let rows = || {
        t.hosts
            .iter()
            .map(|(host, h)| (host.to_string(), *h))
            .chain([("other".to_string(), t.other)])
    };
    let family = |enc: &mut DescriptorEncoder,
                  name: &str,
                  what: &str,
                  unit: Option<&Unit>,
                  pick: fn(&HostTraffic) -> u64| {
        counters(
            enc,
            name,
            &format!("{what}: {COVERS}"),
            unit,
            rows().map(|(host, h)| (vec![("host", host)], pick(&h))),
        )
    };
    family(
        enc,
        "host_transmit",
        "Bytes a LAN host sent",
        Some(&Unit::Bytes),
        |h| h.transmit.bytes,
    )?;
    family(
        enc,
        "host_receive",
        "Bytes sent to a LAN host",
        Some(&Unit::Bytes),
        |h| h.receive.bytes,
    )?;
    family(
        enc,
        "host_transmit_packets",
        "Packets a LAN host sent",
        None,
        |h| h.transmit.packets,
    )?;
    family(
        enc,
        "host_receive_packets",
        "Packets sent to a LAN host",
        None,
        |h| h.receive.packets,
    )
}

#[cfg(test)]
mod tests {
    use std::{net::IpAddr, sync::Arc};

    use prometheus_client::registry::Registry;

    use super::*;
    use crate::metrics::{PREFIX, encode};

    fn traffic(tx: u64, rx: u64) -> HostTraffic {
        HostTraffic {
            transmit: Traffic {
                packets: tx / 100,
                bytes: tx,
            },
            receive: Traffic {
                packets: rx / 100,
                bytes: rx,
            },
        }
    }

    fn totals(host: u64, other: u64) -> HostTotals {
        let ip: IpAddr = "10.0.1.2".parse().unwrap();
        HostTotals {
            hosts: [(ip, traffic(host, host / 2))].into(),
            other: traffic(other, 0),
        }
    }

    fn scrape(c: HostCollector) -> (String, HostCollector) {
        let shared = Arc::new(c);
        let mut r = Registry::with_prefix(PREFIX);
        r.register_collector(Box::new(Shared(shared.clone())));
        let text = encode(&r).unwrap();
        drop(r);
        (text, Arc::into_inner(shared).unwrap())
    }

    /// Registers a shared collector (the registry takes it by box).
    #[derive(Debug)]
    struct Shared(Arc<HostCollector>);
    impl Collector for Shared {
        fn encode(&self, enc: DescriptorEncoder) -> Result<(), fmt::Error> {
            self.0.encode(enc)
        }
    }

    #[test]
    fn hosts_and_other_are_encoded_with_help() {
        let c = HostCollector {
            source: Arc::new(|| totals(100_000_000, 3000)),
            last: Mutex::default(),
        };
        let (text, _) = scrape(c);
        for line in [
            "xdp_router_host_transmit_bytes_total{host=\"10.0.1.2\"} 100000000",
            "xdp_router_host_receive_bytes_total{host=\"10.0.1.2\"} 50000000",
            "xdp_router_host_transmit_packets_total{host=\"10.0.1.2\"} 1000000",
            "xdp_router_host_receive_packets_total{host=\"10.0.1.2\"} 500000",
            "xdp_router_host_transmit_bytes_total{host=\"other\"} 3000",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        assert!(
            text.contains("# HELP xdp_router_host_transmit_bytes Bytes a LAN host sent: IP bytes"),
            "{text}"
        );
        assert!(text.contains("# TYPE xdp_router_host_receive_packets counter"));
    }

    #[test]
    fn a_dip_is_reported_as_the_previous_value() {
        let calls = std::sync::atomic::AtomicU64::new(0);
        let c = HostCollector {
            source: Arc::new(move || {
                // 1000, then 900 (a flow removed between the two reads of a scrape), then 1200.
                match calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                    0 => totals(1000, 10),
                    1 => totals(900, 10),
                    _ => totals(1200, 10),
                }
            }),
            last: Mutex::default(),
        };
        let line = |text: &str| {
            text.lines()
                .find(|l| l.starts_with("xdp_router_host_transmit_bytes_total{host=\"10.0.1.2\"}"))
                .unwrap()
                .to_string()
        };
        let (a, c) = scrape(c);
        let (b, c) = scrape(c);
        let (d, _) = scrape(c);
        assert!(line(&a).ends_with(" 1000"));
        assert!(line(&b).ends_with(" 1000"), "{}", line(&b));
        assert!(line(&d).ends_with(" 1200"));
    }
}
