//! What a benchmark run measures (after the quick preset), and the names of its table rows.

use std::time::Duration;

use crate::{
    Opts,
    packet::Family,
    router::{Datapath, Scenario},
    search::SearchParams,
    tcp::TcpMode,
};

/// Row label of the bare-redirect ceiling.
pub const CEILING_ROW: &str = "ceiling: bare XDP redirect";

/// Row label of a scenario × fast path.
pub fn row_name(sc: Scenario, fastpath: bool) -> String {
    format!(
        "{} {}",
        sc.id(),
        if fastpath { "fast path" } else { "kernel" }
    )
}

/// What to run, after applying the quick preset.
pub(super) struct Plan {
    pub(super) quick: bool,
    pub(super) trial: Duration,
    pub(super) search: SearchParams,
    pub(super) flows: u32,
    pub(super) families: Vec<Family>,
    pub(super) sizes_v4: Vec<usize>,
    pub(super) sizes_v6: Vec<usize>,
    pub(super) scenarios: Vec<Scenario>,
    pub(super) ceiling_sizes: usize,
    pub(super) tcp_secs: u32,
    pub(super) tcp_streams: Vec<u32>,
    pub(super) tcp_modes: Vec<TcpMode>,
    pub(super) latency_probes: u32,
    pub(super) latency_rounds: u32,
    pub(super) latency_load_pps: Option<f64>,
    pub(super) only_latency: bool,
    pub(super) shaper_mbit: u32,
    pub(super) daemon: bool,
    /// The fast path of the fast-path rows.
    pub(super) datapath: Datapath,
}

impl Plan {
    pub(super) fn new(o: &Opts, quick: bool) -> Plan {
        let fams = if o.families.is_empty() {
            if quick {
                vec![Family::Ipv4]
            } else {
                vec![Family::Ipv4, Family::Ipv6]
            }
        } else {
            o.families.clone()
        };
        let sizes = |family: Family, default: &[usize]| -> Vec<usize> {
            if o.sizes.is_empty() {
                if quick {
                    vec![family.min_frame().max(64), 1518]
                } else {
                    default.to_vec()
                }
            } else {
                o.sizes
                    .iter()
                    .map(|s| (*s).max(family.min_frame()))
                    .collect()
            }
        };
        Plan {
            quick,
            trial: Duration::from_millis(o.trial_ms.unwrap_or(if quick { 300 } else { 400 })),
            search: SearchParams {
                loss_limit: o.loss_pct / 100.0,
                // Quick: the flat-out trial only (no NDR search; its few short trials would
                // measure the VM's hiccups, not the router).
                steps: o.steps.unwrap_or(if quick { 0 } else { 5 }),
                retries: o.retries,
            },
            flows: o.flows.unwrap_or(64),
            families: fams,
            sizes_v4: sizes(Family::Ipv4, &[64, 128, 256, 512, 1024, 1280, 1518]),
            sizes_v6: sizes(Family::Ipv6, &[78, 128, 256, 512, 1024, 1280, 1518]),
            scenarios: if o.scenarios.is_empty() {
                if quick {
                    vec![Scenario::S2]
                } else {
                    vec![Scenario::S1, Scenario::S2, Scenario::S3]
                }
            } else {
                o.scenarios.clone()
            },
            ceiling_sizes: if quick { 1 } else { usize::MAX },
            tcp_secs: o.tcp_secs.unwrap_or(if quick { 1 } else { 2 }),
            tcp_streams: if o.no_tcp {
                vec![]
            } else if quick {
                vec![1]
            } else {
                vec![1, 8]
            },
            tcp_modes: if quick {
                vec![TcpMode::Upload]
            } else {
                vec![TcpMode::Upload, TcpMode::Download, TcpMode::Bidir]
            },
            latency_probes: if o.no_latency {
                0
            } else {
                o.latency_probes.unwrap_or(if quick { 200 } else { 3000 })
            },
            latency_rounds: o.latency_rounds,
            latency_load_pps: o.latency_load_pps,
            only_latency: o.only_latency,
            shaper_mbit: o.shaper_mbit,
            daemon: !o.no_daemon,
            datapath: o.datapath,
        }
    }

    pub(super) fn sizes(&self, f: Family) -> &[usize] {
        match f {
            Family::Ipv4 => &self.sizes_v4,
            Family::Ipv6 => &self.sizes_v6,
        }
    }
}
