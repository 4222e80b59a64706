//! The benchmark plan in order: generator ceiling, bare-redirect ceiling, then per scenario
//! (fast path off and on, interleaved) NDR searches, the S3 shaping check, latency under load
//! and TCP with iperf3.

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use xdp_router_common::lab::RedirectConfig;

use crate::{
    generator::GenKind,
    lab::{Redirect, attach_pass},
    latency::EchoServer,
    report::{GenCeiling, Report, TcpRow},
    router::{self, Daemon},
    tcp::{self, Iperf3Server},
    testbed::{Path, Testbed},
};

use super::{
    load_latency::{latency_load, latency_run, record_latency},
    plan::{CEILING_ROW, Plan, row_name},
    stop::check_stop,
    trials::{check_offload, prime, search_cell, shaping_check, xdp_forwarded},
};

pub(super) fn measure(
    plan: &Plan,
    tb: &mut Testbed,
    report: &mut Report,
    daemon_bin: Option<&PathBuf>,
    out_dir: &std::path::Path,
) -> Result<()> {
    // 1. The generator alone.
    eprintln!("generator ceiling (direct pair into a bare sink, no router)");
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

    // Offered below these rates, the generator itself is disturbed: (its rate here when the
    // machine is quiet, the floor, the likely cause).
    let (quiet, floor, why) = match tb.generator() {
        GenKind::LiveFrames => (
            "≈ 5–10 Mpps",
            2e6,
            "another process is probably running XDP BPF_PROG_RUN or attaching XDP programs \
             (they serialise on the kernel's XDP dispatcher mutex) or hogging CPU0",
        ),
        GenKind::AfPacket { .. } => ("≈ 1 Mpps", 4e5, "another process is probably hogging CPU0"),
    };
    if let Some(g) = report
        .generator
        .iter()
        .map(|g| g.trial.offered_pps)
        .reduce(f64::min)
        && g < floor
    {
        let msg = format!(
            "the generator alone reached only {:.0} Kpps ({quiet} when the machine is quiet): \
             {why}; the numbers of this run are not meaningful",
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
        let _redirect = Redirect::attach(
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
            Some(bin) => Some(Daemon::start_tuned(
                bin,
                &tb.rtr,
                &out_dir.join(format!("daemon-{}", sc.id())),
                &sc.lan_if(&tb.names.rl),
                &tb.names.rw,
                sc.shaped(),
                plan.datapath.config_line(),
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
