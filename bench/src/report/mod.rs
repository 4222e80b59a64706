//! Results: the JSON record of every trial, a Markdown report shaped like router test reports
//! (rows = scenario × fast path, columns = frame sizes) and an SVG chart of NDR vs frame size.
//!
//! This module holds the record (serialized as results.json); [`markdown`] writes the report
//! and [`svg`] the chart.

mod markdown;
mod svg;

use serde::Serialize;

use crate::{
    cpu::CpuShare,
    generator::generator_bound,
    latency::{self, Bootstrap, DiffCi, Latency, ModeSamples, Schedule, Verdict},
    packet::Family,
    router::{Datapath, Scenario},
    tcp::TcpRun,
    testbed::{Path, Trial},
};

/// The median of `v` (0 when empty).
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Mbit/s of `pps` frames of `size` bytes (FCS included; no preamble or inter-frame gap).
pub fn mbps(pps: f64, size: usize) -> f64 {
    pps * size as f64 * 8.0 / 1e6
}

/// The whole run.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// Machine and parameters.
    pub meta: Meta,
    /// The generator alone (direct pair, no router), flat out.
    pub generator: Vec<GenCeiling>,
    /// One NDR search per row × family × frame size.
    pub throughput: Vec<Cell>,
    /// S3 upload shaping checks.
    pub shaping: Vec<ShapeCheck>,
    /// iperf3 runs.
    pub tcp: Vec<TcpRow>,
    /// Latency probe runs, one per scenario × background load × fast path mode.
    pub latency: Vec<LatencyRow>,
    /// Fast path on − off latency differences with confidence intervals, one per scenario ×
    /// background load (interleaved runs with both modes).
    pub latency_diff: Vec<LatencyDiff>,
    /// The project's targets, evaluated on this run.
    pub targets: Vec<Target>,
    /// Things that went wrong without stopping the run.
    pub warnings: Vec<String>,
}

/// Machine and parameters of a run.
#[derive(Debug, Default, Serialize)]
pub struct Meta {
    /// Seconds since the Unix epoch at the start.
    pub started_unix: u64,
    /// Wall time of the whole run, seconds.
    pub duration_secs: f64,
    /// `uname -r`.
    pub kernel: String,
    /// CPU model from /proc/cpuinfo.
    pub cpu_model: String,
    /// Online CPUs.
    pub cpus: usize,
    /// The command line.
    pub command: String,
    /// Quick mode (smoke test) or a full run.
    pub quick: bool,
    /// Trial length, milliseconds.
    pub trial_ms: u64,
    /// Paced trials per NDR search.
    pub steps: u32,
    /// Extra attempts of a lossy paced trial.
    pub retries: u32,
    /// Loss limit, percent.
    pub loss_limit_pct: f64,
    /// Flows per stream.
    pub flows: u32,
    /// S3 shaper rate, Mbit/s.
    pub shaper_mbit: u32,
    /// The daemon binary, if fast-path rows were measured.
    pub daemon: Option<String>,
    /// The fast path of the fast-path rows (with a daemon).
    pub datapath: Option<Datapath>,
    /// The traffic generator (live frames, or AF_PACKET where the kernel refuses them).
    pub generator: String,
}

/// The generator's own ceiling at one frame size.
#[derive(Debug, Serialize)]
pub struct GenCeiling {
    /// Address family.
    pub family: Family,
    /// Frame size, FCS included.
    pub size: usize,
    /// The flat-out trial.
    pub trial: Trial,
}

impl GenCeiling {
    /// The generator's own rate: what it delivered into the bare sink, frames/s.
    pub fn pps(&self) -> f64 {
        self.trial.delivered_pps
    }
}

/// One NDR search.
#[derive(Debug, Serialize)]
pub struct Cell {
    /// Row label, e.g. `S2 fast path`.
    pub row: String,
    /// Scenario (`None` for the ceiling row).
    pub scenario: Option<Scenario>,
    /// Fast path on/off (`None` for the ceiling row).
    pub fastpath: Option<bool>,
    /// Address family.
    pub family: Family,
    /// Frame size, FCS included.
    pub size: usize,
    /// Direction through the router.
    pub path: Path,
    /// No-drop rate, frames/s.
    pub ndr_pps: f64,
    /// No-drop rate, Mbit/s.
    pub ndr_mbps: f64,
    /// The DUT lost nothing even flat out (NDR is a lower bound).
    pub generator_limited: bool,
    /// The paced generator fell short of the rate asked in the best trial (NDR may be
    /// generator-bound).
    pub pacing_short: bool,
    /// Delivered rate under overload (flat-out generator), frames/s.
    pub overload_pps: f64,
    /// Router CPU during the overload trial.
    pub overload_cpu: CpuShare,
    /// Share of the delivered packets the kernel forwarded (not the fast path) in the overload
    /// trial.
    pub kernel_share: f64,
    /// Every trial of the search.
    pub trials: Vec<Trial>,
}

impl Cell {
    /// Router CPU time per delivered packet in the overload trial, ns: CPU1's *system* share (the
    /// router's NAPI thread: XDP program, redirect, or the kernel's forwarding path) over the
    /// delivered rate. The sink's softirq and idle time are left out, so it compares the router's
    /// own work even when the generator cannot keep CPU1 saturated. `None` without data.
    pub fn router_ns_per_pkt(&self) -> Option<f64> {
        self.overload_cpu.system_ns_per_packet(self.overload_pps)
    }

    /// CPU1 busy time (router + sink) per delivered packet in the overload trial, ns.
    pub fn busy_ns_per_pkt(&self) -> Option<f64> {
        self.overload_cpu.busy_ns_per_packet(self.overload_pps)
    }
}

/// S3: does the shaper still bind uploads?
#[derive(Debug, Serialize)]
pub struct ShapeCheck {
    /// Fast path on/off.
    pub fastpath: bool,
    /// HTB rate, Mbit/s.
    pub shaper_mbit: u32,
    /// Offered upload, Mbit/s.
    pub offered_mbps: f64,
    /// Delivered upload, Mbit/s.
    pub delivered_mbps: f64,
    /// Delivered ≤ 110 % of the shaper rate.
    pub shaped: bool,
}

/// One iperf3 run in a scenario.
#[derive(Debug, Serialize)]
pub struct TcpRow {
    /// Scenario.
    pub scenario: Scenario,
    /// Fast path on/off.
    pub fastpath: bool,
    /// The run.
    #[serde(flatten)]
    pub run: TcpRun,
    /// Packets the router's kernel forwarded during the run.
    pub kernel_forwarded: u64,
    /// Packets the fast path forwarded during the run (daemon `forwarded_*` counters).
    pub xdp_forwarded: u64,
}

/// One fast path mode's probes of an interleaved latency run in a scenario.
#[derive(Debug, Serialize)]
pub struct LatencyRow {
    /// Scenario.
    pub scenario: Scenario,
    /// Fast path on/off.
    pub fastpath: bool,
    /// Background load (64 B frames/s through the router), 0 = idle.
    pub load_pps: f64,
    /// Percentiles of the pooled counted probes.
    #[serde(flatten)]
    pub latency: Latency,
    /// Blocks (rounds) this mode was measured in.
    pub blocks: u32,
    /// Packets the router's kernel forwarded per probe sent (idle runs; each probe crosses the
    /// router twice, so ≈ 2 when the kernel forwards the echo flow, ≈ 0 when XDP does).
    pub kernel_forwarded_per_probe: Option<f64>,
    /// Round trips of the counted probes in the order taken, µs (0.01 µs resolution).
    pub rtts_us: Vec<f64>,
    /// Answered probes of each block, in order (they cut `rtts_us` into the blocks).
    pub block_lens: Vec<usize>,
    /// When each of `rtts_us` was sent, ms since the start of the run (0.01 ms resolution).
    pub sent_ms: Vec<f64>,
    /// Round trips of the probes discarded right after switching to this mode, µs.
    pub discarded_us: Vec<f64>,
}

impl LatencyRow {
    /// The row of mode `m` of a run.
    pub fn new(
        scenario: Scenario,
        load_pps: f64,
        m: &ModeSamples,
        kernel_forwarded_per_probe: Option<f64>,
    ) -> LatencyRow {
        let centi = |v: &[f64]| v.iter().map(|x| (x * 100.0).round() / 100.0).collect();
        LatencyRow {
            scenario,
            fastpath: m.fastpath,
            load_pps,
            latency: m.summary(),
            blocks: m.blocks,
            kernel_forwarded_per_probe,
            rtts_us: centi(&m.rtts_us),
            block_lens: m.block_lens.clone(),
            sent_ms: centi(&m.sent_ms),
            discarded_us: centi(&m.discarded_us),
        }
    }
}

/// Fast path on − off latency of one interleaved run.
#[derive(Debug, Serialize)]
pub struct LatencyDiff {
    /// Scenario.
    pub scenario: Scenario,
    /// Background load (64 B frames/s), 0 = idle.
    pub load_pps: f64,
    /// How the probes were taken.
    pub schedule: Schedule,
    /// p50 on − off with its 95 % bootstrap interval.
    pub p50: Option<DiffCi>,
    /// p99 on − off with its 95 % bootstrap interval (the target's figure).
    pub p99: Option<DiffCi>,
}

impl LatencyDiff {
    /// Compares the pooled round trips of `on` and `off`, their blocks as the strata.
    pub fn new(
        scenario: Scenario,
        load_pps: f64,
        sched: &Schedule,
        on: &ModeSamples,
        off: &ModeSamples,
    ) -> LatencyDiff {
        let ci = |p| {
            latency::quantile_diff_ci(
                &on.rtts_us,
                &on.block_lens,
                &off.rtts_us,
                &off.block_lens,
                p,
                &Bootstrap::BENCH,
            )
        };
        LatencyDiff {
            scenario,
            load_pps,
            schedule: *sched,
            p50: ci(50.0),
            p99: ci(99.0),
        }
    }
}

/// How a confidence interval of fast path on − off reads.
pub fn verdict_text(v: Verdict) -> &'static str {
    match v {
        Verdict::Lower => "on lower",
        Verdict::NoDifference => "no measurable difference",
        Verdict::Higher => "on higher",
    }
}

/// One project target, evaluated.
#[derive(Debug, Serialize)]
pub struct Target {
    /// What is compared.
    pub name: String,
    /// The goal.
    pub goal: String,
    /// What this run measured.
    pub measured: String,
    /// `None` when this run lacks the rows to decide.
    pub met: Option<bool>,
}

impl Report {
    /// The NDR cell for `row`, `family`, `size`.
    pub fn cell(&self, row: &str, family: Family, size: usize) -> Option<&Cell> {
        self.throughput
            .iter()
            .find(|c| c.row == row && c.family == family && c.size == size)
    }

    /// Whether `pps` at `family` and `size` is within 10 % of the generator's own rate there
    /// (see [`generator_bound`]).
    pub fn generator_bound(&self, family: Family, size: usize, pps: f64) -> bool {
        self.generator_at(family, size)
            .is_some_and(|g| generator_bound(pps, g.pps()))
    }

    /// The generator's own ceiling at `family` and `size`.
    pub fn generator_at(&self, family: Family, size: usize) -> Option<&GenCeiling> {
        self.generator
            .iter()
            .find(|g| g.family == family && g.size == size)
    }

    fn rows(&self) -> Vec<String> {
        let mut rows: Vec<String> = Vec::new();
        for c in &self.throughput {
            if !rows.contains(&c.row) {
                rows.push(c.row.clone());
            }
        }
        rows
    }

    fn sizes(&self, family: Family) -> Vec<usize> {
        let mut s: Vec<usize> = self
            .throughput
            .iter()
            .filter(|c| c.family == family)
            .map(|c| c.size)
            .chain(
                self.generator
                    .iter()
                    .filter(|g| g.family == family)
                    .map(|g| g.size),
            )
            .collect();
        s.sort_unstable();
        s.dedup();
        s
    }
}
