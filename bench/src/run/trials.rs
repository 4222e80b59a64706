//! The single steps of a run: one NDR search recorded as a table cell (with its offload
//! check), priming the benchmark flows so the daemon offloads them, and the S3 shaping check.

use std::{thread, time::Duration};

use anyhow::{Context as _, Result, bail};
use xdp_router_common::lab::LAB_PORT;

use crate::{
    latency,
    packet::Family,
    report::{Cell, Report, ShapeCheck, mbps},
    router::{self, Daemon, Scenario},
    search::ndr_search,
    testbed::{Path, Testbed},
};

use super::{plan::Plan, stop::check_stop};

/// Packets the daemon's datapath forwarded so far (0 without a daemon).
pub(super) fn xdp_forwarded(daemon: Option<&Daemon>) -> Result<u64> {
    daemon.map_or(Ok(0), |d| Ok(d.status()?.forwarded()))
}

/// One NDR search, recorded as a table cell.
pub(super) fn search_cell(
    plan: &Plan,
    tb: &mut Testbed,
    row: &str,
    sc_fp: Option<(Scenario, bool)>,
    family: Family,
    size: usize,
    path: Path,
) -> Result<Cell> {
    let nat = sc_fp.is_some_and(|(sc, _)| sc.nat(family));
    let spec = tb.spec(path, family, size, plan.flows, nat);
    let res = ndr_search(&plan.search, |rate| {
        check_stop()?;
        tb.trial(path, &spec, rate, plan.trial)
    })
    .with_context(|| format!("{row}, {}, {size} B", family.name()))?;
    let sat = &res.saturation;
    let pacing_short = res
        .ndr_trial
        .as_ref()
        .is_some_and(|t| t.requested_pps.is_some_and(|r| t.offered_pps < 0.97 * r));
    let cell = Cell {
        row: row.to_owned(),
        scenario: sc_fp.map(|(s, _)| s),
        fastpath: sc_fp.map(|(_, f)| f),
        family,
        size,
        path,
        ndr_pps: res.ndr_pps,
        ndr_mbps: mbps(res.ndr_pps, size),
        generator_limited: res.generator_limited,
        pacing_short,
        overload_pps: sat.delivered_pps,
        overload_cpu: sat.router_cpu,
        kernel_share: if sat.delivered == 0 {
            0.0
        } else {
            (sat.kernel_forwarded as f64 / sat.delivered as f64).min(1.0)
        },
        trials: res.trials,
    };
    eprintln!(
        "  {row:<28} {:<4} {size:>4} B: NDR {:>7.0} Kpps, overload {:>7.0} Kpps, CPU1 {:>3.0} %, \
         kernel share {:>3.0} %",
        family.name(),
        cell.ndr_pps / 1e3,
        cell.overload_pps / 1e3,
        cell.overload_cpu.busy,
        cell.kernel_share * 100.0
    );
    Ok(cell)
}

/// With the fast path on, the kernel should forward (almost) none of the stream: a fast path
/// that silently carries nothing fails the quick run and is a warning in a full run.
pub(super) fn check_offload(plan: &Plan, report: &mut Report, cell: &Cell) -> Result<()> {
    let fp_on = cell.fastpath == Some(true);
    let kernel_expected = !fp_on;
    if kernel_expected && cell.kernel_share < 0.5 {
        let msg = format!(
            "{} {} {} B: fast path off, but the kernel forwarded only {:.0} % of the packets",
            cell.row,
            cell.family.name(),
            cell.size,
            cell.kernel_share * 100.0
        );
        report.warnings.push(msg);
    }
    if fp_on && cell.kernel_share > 0.5 {
        let msg = format!(
            "{} {} {} B: fast path on, but the kernel forwarded {:.0} % of the packets",
            cell.row,
            cell.family.name(),
            cell.size,
            cell.kernel_share * 100.0
        );
        if plan.quick {
            bail!("{msg}");
        }
        eprintln!("warning: {msg}");
        report.warnings.push(msg);
    }
    Ok(())
}

/// Establishes `flows` benchmark flows of `family` (and the echo flow) so that conntrack marks
/// them ASSURED and the daemon offloads them: traffic, a reply per flow, then traffic again more
/// than 2 s after creation (UDP is ASSURED only then, nf_conntrack_proto_udp.c). `nat`: the
/// router masquerades `family` (replies then go to its WAN address). Leaves the fast path on.
pub fn prime(
    tb: &mut Testbed,
    daemon: Option<&Daemon>,
    family: Family,
    flows: u32,
    nat: bool,
) -> Result<()> {
    eprintln!("  priming {flows} {} flows", family.name());
    let size = family.min_frame().max(64);
    let up = tb.spec(Path::Upload, family, size, flows, nat);
    let down = tb.spec(Path::Download, family, size, flows, nat);
    let n = u64::from(flows) * 4;
    for round in 0..2 {
        check_stop()?;
        tb.send(Path::Upload, &up, 20_000.0, n)?;
        thread::sleep(Duration::from_millis(20));
        tb.send(Path::Download, &down, 20_000.0, n)?;
        latency::probe(&tb.lan, 5, Duration::from_millis(5))?;
        if round == 0 {
            thread::sleep(Duration::from_millis(2200));
        }
    }
    thread::sleep(Duration::from_millis(100));
    let assured = router::assured_flows(&tb.rtr, family, LAB_PORT)?;
    if assured < flows as usize {
        bail!(
            "only {assured} of {flows} {} flows are ASSURED in conntrack after priming",
            family.name()
        );
    }
    if let Some(d) = daemon {
        d.set_fastpath(true)?;
        d.wait_flows(family, u64::from(flows), Duration::from_secs(5))?;
    }
    Ok(())
}

/// S3: uploads must stay at the shaper rate whatever the fast path does.
pub(super) fn shaping_check(
    plan: &Plan,
    tb: &mut Testbed,
    sc: Scenario,
    fp: bool,
) -> Result<ShapeCheck> {
    let size = 1518;
    let nat = sc.nat(Family::Ipv4);
    let spec = tb.spec(Path::Upload, Family::Ipv4, size, plan.flows, nat);
    let shaper_pps = f64::from(plan.shaper_mbit) * 1e6 / (size as f64 * 8.0);
    let t = tb.trial(
        Path::Upload,
        &spec,
        Some(3.0 * shaper_pps),
        plan.trial.max(Duration::from_secs(1)),
    )?;
    let delivered_mbps = mbps(t.delivered_pps, size);
    Ok(ShapeCheck {
        fastpath: fp,
        shaper_mbit: plan.shaper_mbit,
        offered_mbps: mbps(t.offered_pps, size),
        delivered_mbps,
        shaped: delivered_mbps <= 1.1 * f64::from(plan.shaper_mbit),
    })
}
