//! Latency under load: probes through the router with the fast path off and on, interleaved
//! in blocks over a background load, recorded as per-mode rows and an on − off comparison.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use crate::{
    latency::{self, ModeSamples, Prober, Schedule},
    packet::Family,
    report::{LatencyDiff, LatencyRow, Report},
    router::Scenario,
    testbed::{Path, Testbed},
};

use super::{
    plan::{Plan, row_name},
    stop::check_stop,
    trials::search_cell,
};

/// Probes discarded after each switch of the fast path (10 ms at 1 ms apart). The switch runs
/// two short-lived processes (`xdp-routerd fastpath on|off`, `status --json`) next to the probe
/// client and the echo server, and the first packets after it meet the caches of the other
/// path; whatever that costs would land on the first probes of a block and be charged to the
/// mode switched to. The discarded round trips are kept in results.json (`discarded_us`) so
/// this can be checked.
pub(super) const LATENCY_DISCARD: u32 = 10;

/// Time the background load runs before the first probe (steady state).
const LOAD_SETTLE: Duration = Duration::from_millis(200);

/// One interleaved latency comparison.
pub(super) struct LatencyRun {
    sched: Schedule,
    /// Pooled samples per mode, in the order of the scenario's modes.
    modes: Vec<ModeSamples>,
    /// Per mode: packets the router's kernel forwarded per probe sent (idle runs only: with
    /// the load running the count is the load's).
    kernel_per_probe: Vec<Option<f64>>,
}

/// Lowest background load of the latency runs, frames/s (see [`latency_load`]).
const LATENCY_MIN_LOAD_PPS: f64 = 60_000.0;

/// The background load of a scenario's latency runs: `--latency-load-pps`, else the kernel's
/// NDR at the smallest IPv4 frame (measured now, fast path off, if this run has no such cell,
/// e.g. with `--only-latency`), at least
/// [`LATENCY_MIN_LOAD_PPS`].
pub(super) fn latency_load(
    plan: &Plan,
    tb: &mut Testbed,
    report: &mut Report,
    sc: Scenario,
    path: Path,
    set: &dyn Fn(bool) -> Result<()>,
) -> Result<f64> {
    if let Some(pps) = plan.latency_load_pps {
        return Ok(pps);
    }
    let small = plan.sizes(Family::Ipv4).first().copied().unwrap_or(64);
    let row = row_name(sc, false);
    if report.cell(&row, Family::Ipv4, small).is_none() {
        eprintln!("  kernel NDR at {small} B for the latency runs' background load");
        set(false)?;
        let cell = search_cell(plan, tb, &row, Some((sc, false)), Family::Ipv4, small, path)?;
        report.throughput.push(cell);
    }
    Ok(report
        .cell(&row, Family::Ipv4, small)
        .map_or(LATENCY_MIN_LOAD_PPS, |c| {
            // RFC 2544 measures latency at the throughput (NDR) rate; the kernel's, so both
            // modes carry the same load. Below ~55 Kpps the paced generator sleeps between
            // bursts and the CPUs idle, which measures wake-ups instead (p50 12 -> 160 us).
            c.ndr_pps.max(LATENCY_MIN_LOAD_PPS)
        }))
}

/// Latency probes through the router, idle or while the generator offers `load_pps` of 64 B
/// frames along `path`: the fast path `modes` are measured interleaved ([`latency::interleave`])
/// with the load running throughout.
pub(super) fn latency_run(
    plan: &Plan,
    tb: &mut Testbed,
    sc: Scenario,
    path: Path,
    load_pps: f64,
    modes: &[bool],
    set: &dyn Fn(bool) -> Result<()>,
) -> Result<LatencyRun> {
    let sched = Schedule {
        probes: plan.latency_probes,
        rounds: plan.latency_rounds,
        discard: if modes.len() > 1 { LATENCY_DISCARD } else { 0 },
        interval: Duration::from_millis(1),
    };
    let mut prober = Prober::new(&tb.lan)?;
    let switch = |fp: bool| -> Result<()> {
        check_stop()?;
        set(fp)
    };
    let slot = |fp: bool| modes.iter().position(|&m| m == fp).unwrap_or(0);
    if load_pps <= 0.0 {
        eprintln!(
            "  latency, idle: {} probes per mode in {} rounds",
            sched.probes, sched.rounds
        );
        let mut fwd = vec![(0u64, 0u64); modes.len()];
        let samples = latency::interleave(modes, &sched, switch, |fp, n| {
            let before = tb.kernel_forwarded()?;
            let rtts = prober.probe(n, sched.interval)?;
            let after = tb.kernel_forwarded()?;
            let f = &mut fwd[slot(fp)];
            f.0 += after.saturating_sub(before);
            f.1 += u64::from(n);
            Ok(rtts)
        })?;
        return Ok(LatencyRun {
            sched,
            modes: samples,
            kernel_per_probe: fwd
                .iter()
                .map(|&(k, n)| Some(k as f64 / n.max(1) as f64))
                .collect(),
        });
    }
    eprintln!(
        "  latency, {:.0} Kpps load: {} probes per mode in {} rounds",
        load_pps / 1e3,
        sched.probes,
        sched.rounds
    );
    let spec = tb.spec(path, Family::Ipv4, 64, plan.flows, sc.nat(Family::Ipv4));
    // The generator runs for a fixed time and every restart of it disturbs the next few probes
    // (a version that ran the load in 500 ms pieces had its tail events recur every 500 ms,
    // 2.3 s pieces every 2.3 s), so it runs once, for the schedule's length estimated from the
    // time a switch of the fast path takes, plus a margin; only if that falls short does
    // another piece follow (reported).
    let t = Instant::now();
    if let Some(&first) = modes.first() {
        set(first)?;
    }
    let switch_time = t.elapsed();
    let switches = if modes.len() > 1 {
        sched.rounds.min(sched.probes.max(1)) + 1
    } else {
        1
    };
    let probing = sched.interval * (sched.probes * modes.len() as u32 + switches * sched.discard)
        + switch_time * switches;
    let deadline = Instant::now() + LOAD_SETTLE + probing.mul_f64(1.1) + Duration::from_millis(300);
    let done = AtomicBool::new(false);
    let samples = thread::scope(|s| {
        let load = s.spawn(|| -> Result<u32> {
            let mut pieces = 0;
            while !done.load(Ordering::Relaxed) {
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(200));
                tb.load(path, &spec, load_pps, left)?;
                pieces += 1;
            }
            Ok(pieces)
        });
        let probed = (|| {
            thread::sleep(LOAD_SETTLE);
            if load.is_finished() {
                // The load failed at once; its error is reported below.
                return Ok(vec![]);
            }
            latency::interleave(modes, &sched, switch, |_, n| {
                prober.probe(n, sched.interval)
            })
        })();
        done.store(true, Ordering::Relaxed);
        let pieces = load
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
            .context("background load of the latency run")?;
        if pieces > 1 {
            eprintln!(
                "  note: the probes took longer than the background load's estimated {:.1} s; \
                 the load was restarted {} time(s)",
                (LOAD_SETTLE + probing).as_secs_f64(),
                pieces - 1
            );
        }
        probed
    })?;
    Ok(LatencyRun {
        sched,
        modes: samples,
        kernel_per_probe: vec![None; modes.len()],
    })
}

/// Adds a latency run's per-mode rows and, with both modes, the on − off comparison (and a
/// warning if the echo flow was not on the fast path when it should have been).
pub(super) fn record_latency(report: &mut Report, sc: Scenario, load_pps: f64, run: &LatencyRun) {
    // Each probe crosses the router twice; with the fast path on the kernel should forward
    // neither crossing (the echo flow is offloaded like the benchmark flows), except in a
    // shaped scenario the request: the fast path never sends out of a shaped interface.
    let expected_on = if sc.shaped() { 1.0 } else { 0.0 };
    for (m, kernel) in run.modes.iter().zip(&run.kernel_per_probe) {
        if m.fastpath
            && let Some(k) = kernel
            && *k > expected_on + 0.5
        {
            let msg = format!(
                "{} latency, idle, fast path on: the kernel forwarded {k:.1} packets per probe, \
                 expected {expected_on:.0} (is the echo flow offloaded?)",
                sc.id()
            );
            eprintln!("warning: {msg}");
            report.warnings.push(msg);
        }
        let row = LatencyRow::new(sc, load_pps, m, *kernel);
        let l = &row.latency;
        eprintln!(
            "    fast path {:<3}: p50 {:>5.0} p90 {:>5.0} p99 {:>5.0} p99.9 {:>6.0} max {:>6.0} µs, \
             lost {}",
            if m.fastpath { "on" } else { "off" },
            l.p50_us,
            l.p90_us,
            l.p99_us,
            l.p999_us,
            l.max_us,
            l.lost
        );
        report.latency.push(row);
    }
    let on = run.modes.iter().find(|m| m.fastpath);
    let off = run.modes.iter().find(|m| !m.fastpath);
    if let (Some(on), Some(off)) = (on, off) {
        let diff = LatencyDiff::new(sc, load_pps, &run.sched, on, off);
        if let Some(ci) = &diff.p99 {
            eprintln!(
                "    p99 on − off {:+.1} µs, 95 % CI [{:+.1}, {:+.1}] µs: {}",
                ci.diff_us,
                ci.lo_us,
                ci.hi_us,
                crate::report::verdict_text(ci.verdict)
            );
        }
        report.latency_diff.push(diff);
    }
}
