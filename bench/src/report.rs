//! Results: the JSON record of every trial, a Markdown report shaped like router test reports
//! (rows = scenario × fast path, columns = frame sizes) and an SVG chart of NDR vs frame size.

use std::fmt::Write as _;

use serde::Serialize;

use crate::{
    cpu::CpuShare,
    latency::{self, Bootstrap, DiffCi, Latency, ModeSamples, Schedule, Verdict},
    packet::Family,
    router::Scenario,
    tcp::TcpRun,
    testbed::{Path, Trial},
};

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

    /// The Markdown report.
    pub fn markdown(&self) -> String {
        let m = &self.meta;
        let mut o = String::new();
        let _ = writeln!(o, "# xdp-router A/B benchmark\n");
        let _ = writeln!(
            o,
            "- Machine: {} CPUs, {}, kernel {}\n- Command: `{}`\n- Trials: {} ms, {} paced steps \
             per search (a lossy rate is retried {} time(s)), loss limit {} %, {} flows per \
             stream, S3 shaper {} Mbit/s\n- Duration: {:.0} s{}",
            m.cpus,
            m.cpu_model,
            m.kernel,
            m.command,
            m.trial_ms,
            m.steps,
            m.retries,
            m.loss_limit_pct,
            m.flows,
            m.shaper_mbit,
            m.duration_secs,
            if m.quick {
                " (quick mode: smoke test, numbers are rough)"
            } else {
                ""
            }
        );
        for family in [Family::Ipv4, Family::Ipv6] {
            let sizes = self.sizes(family);
            if sizes.is_empty() {
                continue;
            }
            let head = |o: &mut String, first: &str| {
                let _ = write!(o, "| {first} |");
                for s in &sizes {
                    let _ = write!(o, " {s} B |");
                }
                let _ = write!(o, "\n|---|");
                for _ in &sizes {
                    let _ = write!(o, "---|");
                }
                o.push('\n');
            };
            if m.quick {
                // No NDR search in a quick run: a few 300 ms trials measure the VM's pauses.
                let _ = writeln!(
                    o,
                    "\n## {}: quick mode, no NDR search (see a full run for RFC 2544 throughput)",
                    family.name()
                );
            } else {
                let _ = writeln!(
                    o,
                    "\n## {}: throughput (NDR, loss < {} %), Kpps / Mbps\n",
                    family.name(),
                    m.loss_limit_pct
                );
                head(&mut o, "row");
                let _ = write!(o, "| generator alone, flat out (offered) |");
                for s in &sizes {
                    match self
                        .generator
                        .iter()
                        .find(|g| g.family == family && g.size == *s)
                    {
                        Some(g) => {
                            let p = g.trial.offered_pps;
                            let _ = write!(o, " {:.0} / {:.0} |", p / 1e3, mbps(p, *s));
                        }
                        None => o.push_str(" – |"),
                    }
                }
                o.push('\n');
                for row in self.rows() {
                    let _ = write!(o, "| {row} |");
                    for s in &sizes {
                        match self.cell(&row, family, *s) {
                            Some(c) => {
                                let ge = if c.generator_limited || c.pacing_short {
                                    "≥"
                                } else {
                                    ""
                                };
                                let _ = write!(
                                    o,
                                    " {ge}{:.0} / {ge}{:.0} |",
                                    c.ndr_pps / 1e3,
                                    c.ndr_mbps
                                );
                            }
                            None => o.push_str(" – |"),
                        }
                    }
                    o.push('\n');
                }
            }
            let _ = writeln!(
                o,
                "\n{}: delivered under overload (flat-out generator), Kpps — router CPU1 busy % \
                 (sys/softirq/other: other = processes, e.g. other tenants) — share the kernel \
                 forwarded\n",
                family.name()
            );
            head(&mut o, "row");
            for row in self.rows() {
                let _ = write!(o, "| {row} |");
                for s in &sizes {
                    match self.cell(&row, family, *s) {
                        Some(c) => {
                            let cpu = c.overload_cpu;
                            let _ = write!(
                                o,
                                " {:.0} — {:.0} ({:.0}/{:.0}/{:.0}) — {:.0} % |",
                                c.overload_pps / 1e3,
                                cpu.busy,
                                cpu.system,
                                cpu.softirq,
                                (cpu.busy - cpu.system - cpu.softirq).max(0.0),
                                100.0 * c.kernel_share
                            );
                        }
                        None => o.push_str(" – |"),
                    }
                }
                o.push('\n');
            }
            let _ = writeln!(
                o,
                "\n{}: CPU1 time per delivered packet under overload, ns — router (system time: \
                 the router's NAPI thread) / all of CPU1's busy time (router + sink)\n",
                family.name()
            );
            head(&mut o, "row");
            for row in self.rows() {
                let _ = write!(o, "| {row} |");
                for s in &sizes {
                    match self
                        .cell(&row, family, *s)
                        .and_then(|c| Some((c.router_ns_per_pkt()?, c.busy_ns_per_pkt()?)))
                    {
                        Some((router, busy)) => {
                            let _ = write!(o, " {router:.0} / {busy:.0} |");
                        }
                        None => o.push_str(" – |"),
                    }
                }
                o.push('\n');
            }
        }
        if !self.shaping.is_empty() {
            let _ = writeln!(
                o,
                "\n## S3 upload shaping (1518 B UDP offered at 3× the shaper rate)\n\n\
                 | fast path | shaper Mbit/s | offered Mbit/s | delivered Mbit/s | still shaped |\n\
                 |---|---|---|---|---|"
            );
            for s in &self.shaping {
                let _ = writeln!(
                    o,
                    "| {} | {} | {:.0} | {:.1} | {} |",
                    onoff(s.fastpath),
                    s.shaper_mbit,
                    s.offered_mbps,
                    s.delivered_mbps,
                    if s.shaped { "yes" } else { "**no**" }
                );
            }
        }
        if !self.tcp.is_empty() {
            let _ = writeln!(
                o,
                "\n## TCP (iperf3, IPv4, LAN host ⇄ WAN host)\n\n\
                 | scenario | fast path | streams | mode | upload Mbit/s | download Mbit/s | \
                 retransmits | kernel-forwarded pkts | XDP-forwarded pkts |\n\
                 |---|---|---|---|---|---|---|---|---|"
            );
            for t in &self.tcp {
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {:?} | {:.0} | {:.0} | {} | {} | {} |",
                    t.scenario.id(),
                    onoff(t.fastpath),
                    t.run.streams,
                    t.run.mode,
                    t.run.upload_mbps,
                    t.run.download_mbps,
                    t.run.retransmits,
                    t.kernel_forwarded,
                    t.xdp_forwarded
                );
            }
        }
        if !self.latency.is_empty() {
            let _ = writeln!(
                o,
                "\n## Latency (UDP echo through the router, an offloaded flow), µs\n\n\
                 Fast path off and on interleaved: per run, rounds of one block per mode (order \
                 alternating), the background load running throughout, each mode's probes \
                 pooled.\n\n\
                 | scenario | fast path | background load | probes | lost | p50 | p90 | p99 | \
                 p99.9 | max |\n|---|---|---|---|---|---|---|---|---|---|"
            );
            for l in &self.latency {
                let x = &l.latency;
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
                    l.scenario.id(),
                    onoff(l.fastpath),
                    load_label(l.load_pps),
                    x.probes,
                    x.lost,
                    x.p50_us,
                    x.p90_us,
                    x.p99_us,
                    x.p999_us,
                    x.max_us
                );
            }
        }
        if !self.latency_diff.is_empty() {
            let _ = writeln!(
                o,
                "\nFast path on − off, µs, with 95 % confidence intervals (bootstrap: the rounds \
                 resampled as pairs, then each picked block in runs of {} probes; {} resamples, \
                 fixed seed). Verdict: \"on higher\" only if the whole interval is above 0.\n\n\
                 | scenario | background load | rounds | p50 on − off | p50 95 % CI | \
                 p99 on − off | p99 95 % CI | p99 verdict |\n|---|---|---|---|---|---|---|---|",
                Bootstrap::BENCH.block,
                Bootstrap::BENCH.resamples
            );
            let fmt = |c: &Option<DiffCi>| match c {
                Some(c) => (
                    format!("{:+.1}", c.diff_us),
                    format!("[{:+.1}, {:+.1}]", c.lo_us, c.hi_us),
                    verdict_text(c.verdict),
                ),
                None => ("–".into(), "–".into(), "n/a"),
            };
            for d in &self.latency_diff {
                let (p50, p50ci, _) = fmt(&d.p50);
                let (p99, p99ci, verdict) = fmt(&d.p99);
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {p50} | {p50ci} | {p99} | {p99ci} | {verdict} |",
                    d.scenario.id(),
                    load_label(d.load_pps),
                    d.schedule.rounds,
                );
            }
        }
        if !self.targets.is_empty() {
            let _ = writeln!(
                o,
                "\n## {}\n\n| target | goal | measured | met |\n|---|---|---|---|",
                if m.quick { "Quick checks" } else { "Targets" }
            );
            for t in &self.targets {
                let met = match t.met {
                    Some(true) => "yes",
                    Some(false) => "**no**",
                    None => "n/a",
                };
                let _ = writeln!(o, "| {} | {} | {} | {met} |", t.name, t.goal, t.measured);
            }
        }
        if !self.warnings.is_empty() {
            let _ = writeln!(o, "\n## Warnings\n");
            for w in &self.warnings {
                let _ = writeln!(o, "- {w}");
            }
        }
        let _ = writeln!(
            o,
            "\n\"≥\": lower bound, the generator (not the router) was the limit. Frame sizes \
             include the FCS; Mbps = pps × size × 8."
        );
        o
    }

    /// SVG line chart: NDR (Kpps) against frame size, one panel per family, one line per row.
    pub fn svg(&self) -> String {
        const COLORS: [&str; 8] = [
            "#444444", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
        ];
        let families: Vec<Family> = [Family::Ipv4, Family::Ipv6]
            .into_iter()
            .filter(|f| !self.sizes(*f).is_empty())
            .collect();
        let rows = self.rows();
        let (pw, ph, left, top) = (520.0, 300.0, 70.0, 40.0);
        let width = left + (pw + 40.0) * families.len().max(1) as f64 + 240.0;
        let height = top + ph + 70.0;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
             font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" \
             fill=\"white\"/>"
        );
        for (fi, family) in families.iter().enumerate() {
            let sizes = self.sizes(*family);
            let x0 = left + fi as f64 * (pw + 40.0);
            let ymax = self
                .throughput
                .iter()
                .filter(|c| c.family == *family)
                .map(|c| c.ndr_pps / 1e3)
                .fold(1.0f64, f64::max)
                * 1.1;
            let x = |i: usize| x0 + pw * (i as f64 + 0.5) / sizes.len() as f64;
            let y = |k: f64| top + ph - ph * k / ymax;
            let _ = writeln!(
                o,
                "<text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"middle\" font-size=\"14\">{} NDR \
                 (Kpps) vs frame size (B)</text>",
                x0 + pw / 2.0,
                top - 15.0,
                family.name()
            );
            let _ = writeln!(
                o,
                "<rect x=\"{x0:.0}\" y=\"{top:.0}\" width=\"{pw:.0}\" height=\"{ph:.0}\" \
                 fill=\"none\" stroke=\"#999\"/>"
            );
            for t in 0..=4 {
                let k = ymax * f64::from(t) / 4.0;
                let _ = writeln!(
                    o,
                    "<line x1=\"{x0:.0}\" x2=\"{:.0}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" \
                     stroke=\"#eee\"/><text x=\"{:.0}\" y=\"{:.1}\" text-anchor=\"end\">{k:.0}\
                     </text>",
                    x0 + pw,
                    x0 - 5.0,
                    y(k) + 4.0,
                    yy = y(k)
                );
            }
            for (i, s) in sizes.iter().enumerate() {
                let _ = writeln!(
                    o,
                    "<text x=\"{:.1}\" y=\"{:.0}\" text-anchor=\"middle\">{s}</text>",
                    x(i),
                    top + ph + 18.0
                );
            }
            for (ri, row) in rows.iter().enumerate() {
                let pts: Vec<String> = sizes
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| {
                        self.cell(row, *family, *s)
                            .map(|c| format!("{:.1},{:.1}", x(i), y(c.ndr_pps / 1e3)))
                    })
                    .collect();
                if pts.is_empty() {
                    continue;
                }
                let color = COLORS[ri % COLORS.len()];
                let _ = writeln!(
                    o,
                    "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
                    pts.join(" ")
                );
                for p in &pts {
                    let (px, py) = p.split_once(',').unwrap_or(("0", "0"));
                    let _ = writeln!(
                        o,
                        "<circle cx=\"{px}\" cy=\"{py}\" r=\"3\" fill=\"{color}\"/>"
                    );
                }
            }
        }
        let lx = left + (pw + 40.0) * families.len().max(1) as f64;
        for (ri, row) in rows.iter().enumerate() {
            let color = COLORS[ri % COLORS.len()];
            let ly = top + 10.0 + 20.0 * ri as f64;
            let _ = writeln!(
                o,
                "<rect x=\"{lx:.0}\" y=\"{:.0}\" width=\"14\" height=\"4\" fill=\"{color}\"/>\
                 <text x=\"{:.0}\" y=\"{:.0}\">{}</text>",
                ly - 4.0,
                lx + 20.0,
                ly + 2.0,
                xml_escape(row)
            );
        }
        o.push_str("</svg>\n");
        o
    }
}

fn load_label(pps: f64) -> String {
    if pps > 0.0 {
        format!("{:.0} Kpps 64 B", pps / 1e3)
    } else {
        "idle".to_owned()
    }
}

fn onoff(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(row: &str, size: usize, ndr: f64) -> Cell {
        Cell {
            row: row.to_owned(),
            scenario: Some(Scenario::S1),
            fastpath: Some(true),
            family: Family::Ipv4,
            size,
            path: Path::Upload,
            ndr_pps: ndr,
            ndr_mbps: mbps(ndr, size),
            generator_limited: false,
            pacing_short: false,
            overload_pps: ndr,
            overload_cpu: CpuShare::default(),
            kernel_share: 0.0,
            trials: vec![],
        }
    }

    #[test]
    fn table_has_one_row_per_scenario_and_a_column_per_size() {
        let r = Report {
            throughput: vec![
                cell("S1 kernel", 64, 500_000.0),
                cell("S1 kernel", 1518, 400_000.0),
                cell("S1 fast path", 64, 2_000_000.0),
            ],
            ..Report::default()
        };
        let md = r.markdown();
        assert!(md.contains("| row | 64 B | 1518 B |"));
        assert!(md.contains("| S1 kernel | 500 / 256 | 400 / 4858 |"));
        assert!(md.contains("| S1 fast path | 2000 / 1024 | – |"));
        let svg = r.svg();
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.ends_with("</svg>\n"));
    }

    #[test]
    fn latency_tables_show_percentiles_and_the_interval() {
        let sched = Schedule {
            probes: 4,
            rounds: 2,
            discard: 1,
            interval: std::time::Duration::from_millis(1),
        };
        let mode = |fastpath, base: f64| ModeSamples {
            fastpath,
            rtts_us: vec![base, base + 1.0, base + 2.0, base + 3.0],
            lost: 1,
            discarded_us: vec![99.0],
            blocks: 2,
            block_lens: vec![2, 2],
            sent_ms: vec![0.0, 1.0, 5.0, 6.0],
        };
        let (off, on) = (mode(false, 10.0), mode(true, 20.0));
        let r = Report {
            latency: vec![
                LatencyRow::new(Scenario::S2, 50_000.0, &off, None),
                LatencyRow::new(Scenario::S2, 50_000.0, &on, None),
            ],
            latency_diff: vec![LatencyDiff::new(Scenario::S2, 50_000.0, &sched, &on, &off)],
            ..Report::default()
        };
        let md = r.markdown();
        assert!(
            md.contains("| S2 | off | 50 Kpps 64 B | 5 | 1 | 12 | 13 | 13 | 13 | 13 |"),
            "{md}"
        );
        // Every resample of "on" is above every resample of "off": the interval is [+7, +13].
        let p99 = r.latency_diff[0].p99.expect("p99");
        assert!(p99.lo_us >= 7.0 && p99.hi_us <= 13.0, "{p99:?}");
        assert!(md.contains("| S2 | 50 Kpps 64 B | 2 | +10.0 |"), "{md}");
        assert!(md.contains("| on higher |"), "{md}");
        let json = serde_json::to_value(&r).expect("json");
        assert_eq!(json["latency_diff"][0]["p99"]["verdict"], "higher");
        assert_eq!(json["latency"][1]["rtts_us"][0], 20.0);
        assert_eq!(json["latency"][1]["block_lens"][1], 2);
    }
}
