//! The benchmark plan: generator ceiling, bare-redirect ceiling, then per scenario (fast path
//! off and on, interleaved) NDR searches per family and frame size, the S3 shaping check,
//! latency under load and TCP with iperf3.

use std::{
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result, bail};
use xdp_router_common::lab::{LAB_PORT, RedirectConfig};

use crate::{
    Opts,
    lab::{attach_pass, attach_redirect},
    latency::{self, EchoServer, ModeSamples, Prober, Schedule},
    packet::Family,
    report::{
        Cell, GenCeiling, LatencyDiff, LatencyRow, Meta, Report, ShapeCheck, Target, TcpRow, mbps,
    },
    router::{self, Daemon, Scenario},
    search::{SearchParams, ndr_search},
    tcp::{self, Iperf3Server, TcpMode},
    testbed::{Names, Path, Testbed},
};

/// Set by SIGINT/SIGTERM: the run stops at the next trial and cleans up.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// An error once SIGINT/SIGTERM arrived (after [`prepare`]); call between steps.
pub fn check_stop() -> Result<()> {
    if stopped() {
        bail!("interrupted");
    }
    Ok(())
}

/// True once SIGINT/SIGTERM arrived (after [`prepare`]).
pub fn stopped() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// What every privileged mode does first: checks for root, turns SIGINT/SIGTERM into a stop at
/// the next step (so cleanup runs), removes namespaces of killed earlier runs.
pub fn prepare() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the benchmark needs root (network namespaces, BPF, iptables); run it with sudo");
    }
    // SAFETY: installing an async-signal-safe handler (it only stores to an atomic).
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    xdp_router_testbed::netns::cleanup_stale("xr-bench-")
}

/// Below this flat-out rate the generator itself is disturbed (see the warning in `measure`).
const GEN_SANE_PPS: f64 = 2e6;

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
struct Plan {
    quick: bool,
    trial: Duration,
    search: SearchParams,
    flows: u32,
    families: Vec<Family>,
    sizes_v4: Vec<usize>,
    sizes_v6: Vec<usize>,
    scenarios: Vec<Scenario>,
    ceiling_sizes: usize,
    tcp_secs: u32,
    tcp_streams: Vec<u32>,
    tcp_modes: Vec<TcpMode>,
    latency_probes: u32,
    latency_rounds: u32,
    latency_load_pps: Option<f64>,
    only_latency: bool,
    shaper_mbit: u32,
    daemon: bool,
}

impl Plan {
    fn new(o: &Opts, quick: bool) -> Plan {
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
        }
    }

    fn sizes(&self, f: Family) -> &[usize] {
        match f {
            Family::Ipv4 => &self.sizes_v4,
            Family::Ipv6 => &self.sizes_v6,
        }
    }
}

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
    }
}

fn write(report: &Report, dir: &std::path::Path) -> Result<()> {
    let json = serde_json::to_string_pretty(report)?;
    std::fs::write(dir.join("results.json"), json).context("writing results.json")?;
    std::fs::write(dir.join("results.md"), report.markdown()).context("writing results.md")?;
    std::fs::write(dir.join("throughput.svg"), report.svg()).context("writing throughput.svg")?;
    Ok(())
}

fn measure(
    plan: &Plan,
    tb: &mut Testbed,
    report: &mut Report,
    daemon_bin: Option<&PathBuf>,
    out_dir: &std::path::Path,
) -> Result<()> {
    // 1. The generator alone.
    eprintln!("generator ceiling (direct pair, no router)");
    for &family in &plan.families {
        for &size in plan.sizes(family) {
            check_stop()?;
            let spec = tb.spec(Path::Direct, family, size, plan.flows, false);
            let trial = tb.trial(Path::Direct, &spec, None, plan.trial)?;
            if trial.delivered == 0 {
                bail!("nothing arrived at the sink over the direct pair: the generator is broken");
            }
            report.generator.push(GenCeiling {
                family,
                size,
                trial,
            });
        }
    }

    if let Some(g) = report
        .generator
        .iter()
        .map(|g| g.trial.offered_pps)
        .reduce(f64::min)
        && g < GEN_SANE_PPS
    {
        let msg = format!(
            "the generator alone reached only {:.0} Kpps (≈ 5–10 Mpps when the machine is \
             quiet): another process is probably running XDP BPF_PROG_RUN or attaching XDP \
             programs (they serialise on the kernel's XDP dispatcher mutex) or hogging CPU0; \
             the numbers of this run are not meaningful",
            g / 1e3
        );
        eprintln!("warning: {msg}");
        report.warnings.push(msg);
    }

    // 2. The XDP ceiling: bare redirect between the router's interfaces.
    router::clear_scenario(&tb.rtr, &tb.names.rl, &tb.names.rw)?;
    if !plan.only_latency {
        eprintln!(
            "XDP ceiling (bare redirect {} → {})",
            tb.names.rl, tb.names.rw
        );
        let (src_mac, dst_mac) = tb.redirect_macs();
        let _redirect = attach_redirect(
            &tb.rtr,
            &tb.names.rl,
            RedirectConfig {
                ifindex: tb.rw_idx,
                src_mac,
                dst_mac,
            },
        )?;
        tb.pin_napi_threads()?;
        for &family in &plan.families {
            for &size in plan.sizes(family).iter().take(plan.ceiling_sizes) {
                let cell = search_cell(plan, tb, CEILING_ROW, None, family, size, Path::Upload)?;
                report.throughput.push(cell);
            }
        }
    }

    // 3. The scenarios, fast path off and on.
    for &sc in &plan.scenarios {
        check_stop()?;
        eprintln!("{}: {}", sc.id(), sc.label());
        router::apply_scenario(&tb.rtr, sc, &tb.names.rl, &tb.names.rw, plan.shaper_mbit)?;
        // Without the daemon, an XDP_PASS program on both router interfaces stands in for the
        // daemon's program with the fast path off, so kernel rows cost the same either way.
        let _pass = if daemon_bin.is_none() {
            vec![
                attach_pass(&tb.rtr, &tb.names.rl)?,
                attach_pass(&tb.rtr, &tb.names.rw)?,
            ]
        } else {
            vec![]
        };
        let daemon = match daemon_bin {
            Some(bin) => Some(Daemon::start(
                bin,
                &tb.rtr,
                &out_dir.join(format!("daemon-{}", sc.id())),
                &sc.lan_if(&tb.names.rl),
                &tb.names.rw,
                sc.shaped(),
            )?),
            None => None,
        };
        tb.pin_napi_threads()?;
        let _echo = EchoServer::start(&tb.wan)?;
        let modes: &[bool] = if daemon.is_some() {
            &[false, true]
        } else {
            &[false]
        };
        let set = |fp: bool| -> Result<()> {
            if let Some(d) = &daemon {
                d.set_fastpath(fp)?;
            }
            Ok(())
        };
        let path = if sc.download() {
            Path::Download
        } else {
            Path::Upload
        };
        for &family in &plan.families {
            prime(tb, daemon.as_ref(), family, plan.flows, sc.nat(family))
                .with_context(|| sc.id())?;
            if plan.only_latency {
                continue;
            }
            for (i, &size) in plan.sizes(family).iter().enumerate() {
                // Alternate the order so that slow drift of the VM does not favour one mode.
                let order: Vec<bool> = if i % 2 == 0 {
                    modes.to_vec()
                } else {
                    modes.iter().rev().copied().collect()
                };
                for fp in order {
                    set(fp)?;
                    let row = row_name(sc, fp);
                    let cell = search_cell(plan, tb, &row, Some((sc, fp)), family, size, path)
                        .map_err(|e| match &daemon {
                            // Say where the datapath sent the packets it did not forward.
                            Some(d) => e.context(format!(
                                "xdp-routerd datapath counters: {}",
                                d.status()
                                    .map(|st| st.summary())
                                    .unwrap_or_else(|e| format!("(status failed: {e:#})"))
                            )),
                            None => e,
                        })?;
                    check_offload(plan, report, &cell)?;
                    report.throughput.push(cell);
                }
            }
        }
        if sc.shaped() && !plan.only_latency {
            for &fp in modes {
                check_stop()?;
                set(fp)?;
                report.shaping.push(shaping_check(plan, tb, sc, fp)?);
            }
        }
        if plan.latency_probes > 0 {
            let load = latency_load(plan, tb, report, sc, path, &set)?;
            for load_pps in [0.0, load] {
                check_stop()?;
                let run = latency_run(plan, tb, sc, path, load_pps, modes, &set)?;
                record_latency(report, sc, load_pps, &run);
            }
        }
        if !plan.tcp_streams.is_empty() {
            let _server = Iperf3Server::start(&tb.wan, None)?;
            for &fp in modes {
                set(fp)?;
                for &streams in &plan.tcp_streams {
                    for &mode in &plan.tcp_modes {
                        check_stop()?;
                        let before = tb.kernel_forwarded()?;
                        let xdp_before = xdp_forwarded(daemon.as_ref())?;
                        let run = tcp::run(&tb.lan, streams, mode, plan.tcp_secs, None)?;
                        let after = tb.kernel_forwarded()?;
                        let xdp_after = xdp_forwarded(daemon.as_ref())?;
                        report.tcp.push(TcpRow {
                            scenario: sc,
                            fastpath: fp,
                            run,
                            kernel_forwarded: after.saturating_sub(before),
                            xdp_forwarded: xdp_after.saturating_sub(xdp_before),
                        });
                    }
                }
            }
        }
        if let Some(d) = daemon {
            d.stop()?;
        }
    }
    router::clear_scenario(&tb.rtr, &tb.names.rl, &tb.names.rw)?;
    Ok(())
}

/// Packets the daemon's datapath forwarded so far (0 without a daemon).
fn xdp_forwarded(daemon: Option<&Daemon>) -> Result<u64> {
    daemon.map_or(Ok(0), |d| Ok(d.status()?.forwarded()))
}

/// One NDR search, recorded as a table cell.
fn search_cell(
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
fn check_offload(plan: &Plan, report: &mut Report, cell: &Cell) -> Result<()> {
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
fn shaping_check(plan: &Plan, tb: &mut Testbed, sc: Scenario, fp: bool) -> Result<ShapeCheck> {
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

/// Probes discarded after each switch of the fast path (10 ms at 1 ms apart). The switch runs
/// two short-lived processes (`xdp-routerd fastpath on|off`, `status --json`) next to the probe
/// client and the echo server, and the first packets after it meet the caches of the other
/// path; whatever that costs would land on the first probes of a block and be charged to the
/// mode switched to. The discarded round trips are kept in results.json (`discarded_us`) so
/// this can be checked.
const LATENCY_DISCARD: u32 = 10;

/// Time the background load runs before the first probe (steady state).
const LOAD_SETTLE: Duration = Duration::from_millis(200);

/// One interleaved latency comparison.
struct LatencyRun {
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
fn latency_load(
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
fn latency_run(
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
fn record_latency(report: &mut Report, sc: Scenario, load_pps: f64, run: &LatencyRun) {
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

/// Minimum fast path / kernel ratio of the delivered rate under overload that a quick run
/// requires (full runs measure up to 4x here; a fast path that forwards no faster than the
/// kernel is broken, whatever the machine's load).
const QUICK_MIN_OVERLOAD_RATIO: f64 = 1.2;

/// What a quick run can decide: per family and frame size with both S2 cells, the fast path
/// delivers clearly more than the kernel under overload; with the fast path on, iperf3's TCP
/// packets were forwarded by XDP, not by the kernel.
fn quick_checks(r: &Report) -> Vec<Target> {
    let mut checks = Vec::new();
    for on in r.throughput.iter().filter(|c| c.fastpath == Some(true)) {
        let Some(sc) = on.scenario else { continue };
        let Some(off) = r.cell(&row_name(sc, false), on.family, on.size) else {
            continue;
        };
        let ratio = if off.overload_pps > 0.0 {
            on.overload_pps / off.overload_pps
        } else {
            0.0
        };
        checks.push(Target {
            name: format!(
                "{} {} {} B: fast path vs kernel, rate under overload",
                sc.id(),
                on.family.name(),
                on.size
            ),
            goal: format!("> {QUICK_MIN_OVERLOAD_RATIO}×"),
            measured: format!(
                "{ratio:.2}× ({:.0} vs {:.0} Kpps)",
                on.overload_pps / 1e3,
                off.overload_pps / 1e3
            ),
            met: Some(ratio > QUICK_MIN_OVERLOAD_RATIO),
        });
    }
    for t in r.tcp.iter().filter(|t| t.fastpath) {
        let total = t.xdp_forwarded + t.kernel_forwarded;
        checks.push(Target {
            name: format!(
                "{} TCP {} streams {:?}: packets forwarded by XDP",
                t.scenario.id(),
                t.run.streams,
                t.run.mode
            ),
            goal: "> 90 %".into(),
            measured: format!("{} of {total}", t.xdp_forwarded),
            met: Some(t.xdp_forwarded * 10 > total * 9),
        });
    }
    checks
}

/// Evaluates the project's targets on the rows this run has.
fn targets(r: &Report) -> Vec<Target> {
    let mut t = Vec::new();
    let s4 = r
        .throughput
        .iter()
        .filter(|c| c.family == Family::Ipv4)
        .map(|c| c.size)
        .min();
    if let Some(s4) = s4 {
        let on = r.cell(&row_name(Scenario::S2, true), Family::Ipv4, s4);
        let off = r.cell(&row_name(Scenario::S2, false), Family::Ipv4, s4);
        let name = format!("S2 {s4} B IPv4: fast path vs kernel NDR");
        t.push(match (on, off) {
            (Some(a), Some(b)) if b.ndr_pps > 0.0 => {
                let x = a.ndr_pps / b.ndr_pps;
                Target {
                    name,
                    goal: "≥ 4×".into(),
                    measured: format!(
                        "{x:.2}× ({:.0} vs {:.0} Kpps)",
                        a.ndr_pps / 1e3,
                        b.ndr_pps / 1e3
                    ),
                    met: Some(x >= 4.0),
                }
            }
            (Some(a), Some(_)) => Target {
                name,
                goal: "≥ 4×".into(),
                measured: format!(
                    "kernel lost > limit at every rate tried; fast path {:.0} Kpps",
                    a.ndr_pps / 1e3
                ),
                met: Some(a.ndr_pps > 0.0),
            },
            _ => missing(name, "≥ 4×"),
        });
        // The same ratio on the forwarding rate under overload, which scheduling noise of
        // other tenants does not zero out, and on the router's own CPU time per packet (CPU1
        // system time over the delivered rate, overload trial): a fast path quick enough that
        // the generator cannot keep CPU1 busy, and the sink's share of CPU1, both understate it
        // in delivered rates.
        for m in [Measure::Overload, Measure::RouterNs] {
            t.extend(secondary(
                format!("S2 {s4} B IPv4: fast path vs kernel, {}", m.label()),
                Compare::Times(4.0),
                m,
                on,
                off,
            ));
        }
        let ceil = r.cell(CEILING_ROW, Family::Ipv4, s4);
        for sc in [Scenario::S1, Scenario::S2] {
            let fp = r.cell(&row_name(sc, true), Family::Ipv4, s4);
            let name = format!(
                "{} {s4} B IPv4: fast path vs bare-redirect ceiling",
                sc.id()
            );
            t.push(match ratio(fp, ceil) {
                Some((x, a, b)) => Target {
                    name,
                    goal: "≥ 60 %".into(),
                    measured: format!(
                        "{:.0} % ({:.0} vs {:.0} Kpps)",
                        x * 100.0,
                        a.ndr_pps / 1e3,
                        b.ndr_pps / 1e3
                    ),
                    met: Some(x >= 0.6),
                },
                None => missing(name, "≥ 60 %"),
            });
            t.extend(secondary(
                format!(
                    "{} {s4} B IPv4: fast path vs ceiling, {}",
                    sc.id(),
                    Measure::Overload.label()
                ),
                Compare::Share(0.6),
                Measure::Overload,
                fp,
                ceil,
            ));
        }
        let s6 = r
            .throughput
            .iter()
            .filter(|c| c.family == Family::Ipv6)
            .map(|c| c.size)
            .min();
        let name = "S2 fast path: IPv6 vs IPv4 NDR at the smallest frames".to_owned();
        let v6 = s6.and_then(|s6| r.cell(&row_name(Scenario::S2, true), Family::Ipv6, s6));
        t.push(match ratio(v6, on) {
            Some((x, a, b)) => Target {
                name,
                goal: "within 10 %".into(),
                measured: format!(
                    "{:+.0} % ({} B: {:.0} vs {} B: {:.0} Kpps)",
                    (x - 1.0) * 100.0,
                    a.size,
                    a.ndr_pps / 1e3,
                    b.size,
                    b.ndr_pps / 1e3
                ),
                met: Some((x - 1.0).abs() <= 0.1),
            },
            None => missing(name, "within 10 %"),
        });
        for m in [Measure::Overload, Measure::RouterNs] {
            t.extend(secondary(
                format!("S2 fast path: IPv6 vs IPv4, {}", m.label()),
                Compare::Within(0.1),
                m,
                v6,
                on,
            ));
        }
    }
    for d in r.latency_diff.iter().filter(|d| d.load_pps > 0.0) {
        let name = format!(
            "{} p99 latency under load: fast path on vs off",
            d.scenario.id()
        );
        let goal = "on ≤ off (95 % CI of on − off not above 0)".to_owned();
        t.push(match &d.p99 {
            Some(ci) => Target {
                name,
                goal,
                measured: format!(
                    "{:.0} µs vs {:.0} µs: {:+.1} µs, CI [{:+.1}, {:+.1}] µs, {}",
                    ci.a_us,
                    ci.b_us,
                    ci.diff_us,
                    ci.lo_us,
                    ci.hi_us,
                    crate::report::verdict_text(ci.verdict)
                ),
                met: Some(ci.verdict != latency::Verdict::Higher),
            },
            None => Target {
                name,
                goal,
                measured: "no answered probes in one of the modes".into(),
                met: None,
            },
        });
    }
    t
}

/// What a secondary target compares, from a cell's overload trial.
#[derive(Clone, Copy)]
enum Measure {
    /// The delivered rate, Kpps.
    Overload,
    /// The router's CPU time per packet, ns ([`Cell::router_ns_per_pkt`]).
    RouterNs,
}

impl Measure {
    fn label(self) -> &'static str {
        match self {
            Measure::Overload => "rate under overload",
            Measure::RouterNs => "router CPU time per packet",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Measure::Overload => "Kpps",
            Measure::RouterNs => "ns",
        }
    }

    fn of(self, c: &Cell) -> Option<f64> {
        match self {
            Measure::Overload => Some(c.overload_pps / 1e3),
            Measure::RouterNs => c.router_ns_per_pkt(),
        }
    }

    /// How many times faster `a` is than `b` by this measure.
    fn speedup(self, a: f64, b: f64) -> f64 {
        match self {
            Measure::Overload => a / b,
            Measure::RouterNs => b / a,
        }
    }
}

/// How a secondary target judges cell `a` against cell `b`.
#[derive(Clone, Copy)]
enum Compare {
    /// `a` at least this many times faster.
    Times(f64),
    /// `a` at least this share of `b`'s speed.
    Share(f64),
    /// `a`'s value within this fraction of `b`'s.
    Within(f64),
}

/// A secondary target: measure `m` of cells `a` and `b`, when both have it (and `b`'s is not 0).
fn secondary(
    name: String,
    compare: Compare,
    m: Measure,
    a: Option<&Cell>,
    b: Option<&Cell>,
) -> Option<Target> {
    let (a, b) = (a?, b?);
    let (va, vb) = (m.of(a)?, m.of(b)?);
    if vb <= 0.0 {
        return None;
    }
    let unit = m.unit();
    let (goal, measured, met) = match compare {
        Compare::Times(min) => {
            let x = m.speedup(va, vb);
            (
                format!("≥ {min:.0}× (secondary)"),
                format!("{x:.2}× ({va:.0} vs {vb:.0} {unit})"),
                x >= min,
            )
        }
        Compare::Share(min) => {
            let x = m.speedup(va, vb);
            (
                format!("≥ {:.0} % (secondary)", min * 100.0),
                format!("{:.0} % ({va:.0} vs {vb:.0} {unit})", x * 100.0),
                x >= min,
            )
        }
        Compare::Within(tol) => {
            let x = va / vb;
            (
                format!("within {:.0} % (secondary)", tol * 100.0),
                format!(
                    "{:+.0} % ({} B: {va:.0} vs {} B: {vb:.0} {unit})",
                    (x - 1.0) * 100.0,
                    a.size,
                    b.size
                ),
                (x - 1.0).abs() <= tol,
            )
        }
    };
    Some(Target {
        name,
        goal,
        measured,
        met: Some(met),
    })
}

/// `a / b` of two NDR cells, with both cells, when both exist and `b` is non-zero.
fn ratio<'a>(a: Option<&'a Cell>, b: Option<&'a Cell>) -> Option<(f64, &'a Cell, &'a Cell)> {
    match (a, b) {
        (Some(a), Some(b)) if b.ndr_pps > 0.0 => Some((a.ndr_pps / b.ndr_pps, a, b)),
        _ => None,
    }
}

fn missing(name: String, goal: &str) -> Target {
    Target {
        name,
        goal: goal.into(),
        measured: "not measured in this run".into(),
        met: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latency::{DiffCi, Verdict};

    fn diff(sc: Scenario, load_pps: f64, lo_us: f64, hi_us: f64, verdict: Verdict) -> LatencyDiff {
        let ci = DiffCi {
            percentile: 99.0,
            a_us: 70.0,
            b_us: 65.0,
            diff_us: 5.0,
            lo_us,
            hi_us,
            resamples: 2000,
            block: 10,
            strata: (10, 10),
            verdict,
        };
        LatencyDiff {
            scenario: sc,
            load_pps,
            schedule: Schedule {
                probes: 3000,
                rounds: 10,
                discard: LATENCY_DISCARD,
                interval: Duration::from_millis(1),
            },
            p50: None,
            p99: Some(ci),
        }
    }

    #[test]
    fn latency_target_is_missed_only_when_the_whole_interval_is_above_zero() {
        let r = Report {
            latency_diff: vec![
                diff(Scenario::S1, 0.0, 1.0, 9.0, Verdict::Higher),
                diff(Scenario::S1, 60e3, -2.0, 9.0, Verdict::NoDifference),
                diff(Scenario::S2, 60e3, 1.0, 9.0, Verdict::Higher),
                diff(Scenario::S3, 60e3, -9.0, -1.0, Verdict::Lower),
            ],
            ..Report::default()
        };
        let t = targets(&r);
        let lat: Vec<&Target> = t.iter().filter(|t| t.name.contains("p99")).collect();
        // Idle runs are not a target; one row per loaded scenario.
        assert_eq!(lat.len(), 3);
        assert_eq!(lat[0].met, Some(true));
        assert!(
            lat[0].measured.contains("no measurable difference"),
            "{}",
            lat[0].measured
        );
        assert_eq!(lat[1].met, Some(false));
        assert!(
            lat[1].measured.contains("CI [+1.0, +9.0] µs"),
            "{}",
            lat[1].measured
        );
        assert_eq!(lat[2].met, Some(true));
    }
}
