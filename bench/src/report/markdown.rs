//! The Markdown report of a run: shaped like router test reports (rows = scenario × fast path,
//! columns = frame sizes), then the shaping check, TCP, latency and targets.

use std::fmt::Write as _;

use super::{Report, mbps, verdict_text};
use crate::{
    latency::{Bootstrap, DiffCi},
    packet::Family,
};

impl Report {
    /// The Markdown report.
    pub fn markdown(&self) -> String {
        let m = &self.meta;
        let mut o = String::new();
        let _ = writeln!(o, "# xdp-router A/B benchmark\n");
        let _ = writeln!(
            o,
            "- Machine: {} CPUs, {}, kernel {}\n- Generator: {}\n- Command: `{}`\n- Trials: {} ms, \
             {} paced steps per search (a lossy rate is retried {} time(s)), loss limit {} %, {} \
             flows per stream, S3 shaper {} Mbit/s\n- Fast path: {}\n- Duration: {:.0} s{}",
            m.cpus,
            m.cpu_model,
            m.kernel,
            m.generator,
            m.command,
            m.trial_ms,
            m.steps,
            m.retries,
            m.loss_limit_pct,
            m.flows,
            m.shaper_mbit,
            m.datapath.map_or("none (kernel rows only)", |d| d.label()),
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
                let _ = write!(o, "| generator alone, flat out into a bare sink |");
                for s in &sizes {
                    match self.generator_at(family, *s) {
                        Some(g) => {
                            let p = g.pps();
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
                                let ge = if c.generator_limited
                                    || c.pacing_short
                                    || self.generator_bound(family, *s, c.ndr_pps)
                                {
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
            let _ = write!(o, "| generator alone, flat out into a bare sink |");
            for s in &sizes {
                match self.generator_at(family, *s) {
                    Some(g) => {
                        let _ = write!(o, " {:.0} |", g.pps() / 1e3);
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
                            let cpu = c.overload_cpu;
                            let ge = if self.generator_bound(family, *s, c.overload_pps) {
                                "≥"
                            } else {
                                ""
                            };
                            let _ = write!(
                                o,
                                " {ge}{:.0} — {:.0} ({:.0}/{:.0}/{:.0}) — {:.0} % |",
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
                 retransmits | kernel-forwarded pkts | fast-path-forwarded pkts |\n\
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
            "\n\"≥\": lower bound, the generator (not the router) was the limit: even flat out \
             nothing was lost, the paced generator fell short of the rate asked, or the rate is \
             within 10 % of the generator's own (the \"generator alone\" row). Frame sizes \
             include the FCS; Mbps = pps × size × 8."
        );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        cpu::CpuShare,
        latency::{ModeSamples, Schedule},
        report::{Cell, GenCeiling, LatencyDiff, LatencyRow},
        router::Scenario,
        testbed::{Path, Trial},
    };

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
    fn rates_near_the_generators_own_are_lower_bounds() {
        let alone = Trial {
            requested_pps: None,
            sent: 1_000_000,
            delivered: 1_000_000,
            secs: 1.0,
            offered_pps: 1_000_000.0,
            delivered_pps: 1_000_000.0,
            loss: 0.0,
            router_cpu: CpuShare::default(),
            kernel_forwarded: 0,
        };
        let mut r = Report {
            generator: vec![GenCeiling {
                family: Family::Ipv4,
                size: 64,
                trial: alone,
            }],
            throughput: vec![
                cell("S1 kernel", 64, 500_000.0),
                cell("S1 fast path", 64, 950_000.0),
            ],
            ..Report::default()
        };
        r.meta.generator = "AF_PACKET TX ring".into();
        let md = r.markdown();
        assert!(md.contains("- Generator: AF_PACKET TX ring\n"), "{md}");
        assert!(md.contains("| generator alone, flat out into a bare sink | 1000 / 512 |"));
        assert!(md.contains("| S1 kernel | 500 / 256 |"), "{md}");
        assert!(md.contains("| S1 fast path | ≥950 / ≥486 |"), "{md}");
        // The overload table too, with the generator's own rate as its first row.
        assert!(md.contains("| generator alone, flat out into a bare sink | 1000 |"));
        assert!(md.contains("| S1 fast path | ≥950 — "), "{md}");
        assert!(md.contains("| S1 kernel | 500 — "), "{md}");
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
