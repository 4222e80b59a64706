//! The benchmark plan: generator ceiling, bare-redirect ceiling, then per scenario (fast path
//! off and on, interleaved) NDR searches per family and frame size, the S3 shaping check,
//! latency under load and TCP with iperf3.
//!
//! [`plan`] says what to run, [`measure`] runs it in order, [`trials`] holds its single
//! steps (an NDR search as a table cell, priming flows, the shaping check), [`load_latency`]
//! the latency comparison under load, [`targets`] judges the results; [`stop`] handles root,
//! signals and stale namespaces.

mod load_latency;
mod measure;
mod plan;
mod stop;
mod targets;
mod trials;

use std::{
    path::PathBuf,
    thread,
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result};

use crate::{
    Opts,
    report::{Meta, Report},
    router,
    testbed::{Names, Testbed},
};

use self::{
    measure::measure,
    plan::Plan,
    targets::{quick_checks, targets},
};
pub use self::{
    stop::{check_stop, prepare, stopped},
    trials::prime,
};

/// Runs the benchmark and writes results.{json,md} and throughput.svg; returns the report.
pub fn run(o: &Opts, quick: bool, command: String) -> Result<Report> {
    prepare()?;
    let plan = Plan::new(o, quick);
    let started = Instant::now();
    let daemon_bin = if plan.daemon {
        Some(router::locate_daemon(
            o.daemon.as_deref(),
            o.daemon.is_none(),
        )?)
    } else {
        None
    };
    let out_dir = match &o.out {
        Some(d) => d.clone(),
        None => default_out_dir(quick)?,
    };
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let mut report = Report {
        meta: meta(&plan, command, daemon_bin.as_ref()),
        ..Report::default()
    };
    eprintln!("results go to {}", out_dir.display());

    let mut tb = Testbed::create(Names::bench()).context("building the testbed")?;
    report.meta.generator = tb.generator().to_string();
    let result = measure(&plan, &mut tb, &mut report, daemon_bin.as_ref(), &out_dir);
    report.meta.duration_secs = started.elapsed().as_secs_f64();
    // A quick run is too short for NDR searches and targets to mean anything: it checks what it
    // can decide instead (and fails when a check fails).
    report.targets = if plan.quick {
        quick_checks(&report)
    } else {
        targets(&report)
    };
    write(&report, &out_dir)?;
    result?;
    drop(tb);
    Ok(report)
}

fn default_out_dir(quick: bool) -> Result<PathBuf> {
    let stamp = xdp_router_testbed::netns::run("date", &["+%Y%m%d-%H%M%S"])?;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("workspace root")?;
    Ok(root.join("target").join("bench").join(format!(
        "{}{}",
        if quick { "quick-" } else { "" },
        stamp.trim()
    )))
}

fn meta(plan: &Plan, command: String, daemon: Option<&PathBuf>) -> Meta {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    Meta {
        started_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        duration_secs: 0.0,
        kernel: xdp_router_testbed::netns::run("uname", &["-r"])
            .map(|s| s.trim().to_owned())
            .unwrap_or_default(),
        cpu_model: cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
            .unwrap_or_default(),
        cpus: thread::available_parallelism().map_or(1, usize::from),
        command,
        quick: plan.quick,
        trial_ms: plan.trial.as_millis() as u64,
        steps: plan.search.steps,
        retries: plan.search.retries,
        loss_limit_pct: plan.search.loss_limit * 100.0,
        flows: plan.flows,
        shaper_mbit: plan.shaper_mbit,
        daemon: daemon.map(|d| d.display().to_string()),
        datapath: daemon.map(|_| plan.datapath),
        // Known once the testbed has probed the kernel.
        generator: String::new(),
    }
}

fn write(report: &Report, dir: &std::path::Path) -> Result<()> {
    let json = serde_json::to_string_pretty(report)?;
    std::fs::write(dir.join("results.json"), json).context("writing results.json")?;
    std::fs::write(dir.join("results.md"), report.markdown()).context("writing results.md")?;
    std::fs::write(dir.join("throughput.svg"), report.svg()).context("writing throughput.svg")?;
    Ok(())
}
