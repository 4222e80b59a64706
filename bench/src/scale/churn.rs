//! The scale benchmark's churn part: the connection-rate ladder of [`crate::churn`] with the
//! daemon and with the kernel alone, summed up as checks and a target.

use std::{fs, path::Path, time::Duration};

use anyhow::Result;

use super::{config::config, report::Report};
use crate::{
    churn,
    router::{self, Daemon},
    testbed::Testbed,
};

/// Connection churn (see [`churn`]): the rate ladder with `xdp-routerd` running (the maps
/// checked against conntrack after every step), then the same ladder with the kernel alone
/// (no daemon), on the home router's firewall.
pub(super) fn churn_part(
    tb: &Testbed,
    bin: &Path,
    out: &Path,
    rates: &[u32],
    secs: Duration,
    small: bool,
    report: &mut Report,
) -> Result<()> {
    let dir = out.join("churn");
    fs::create_dir_all(&dir)?;
    router::apply_home_router(&tb.rtr, &tb.names.rl, &tb.names.rw)?;
    churn::prepare_hosts(tb)?;
    let servers = churn::Servers::start(&tb.wan)?;
    let cfg = config(&dir, tb, "")?;
    // Maps sized from nf_conntrack_max take a while to create on a loaded machine.
    let daemon = Daemon::start_waiting(bin, &tb.rtr, &cfg, &dir, Duration::from_secs(120))?;
    // The daemon stays on the generator CPU, as in every other benchmark: on the router CPU it
    // made the router drop 2–4 times as many frames at 5,000/s (alternating runs, 09:44 UTC),
    // while its own CPU per step is reported.
    let fast = churn::ladder(tb, &servers, Some(&daemon), rates, secs, &dir)?;
    daemon.stop()?;
    router::flush_conntrack(&tb.rtr)?;
    let kernel = churn::ladder(tb, &servers, None, rates, secs, &dir)?;
    drop(servers);
    let best = |steps: &[churn::Step]| {
        steps
            .iter()
            .filter(|s| s.passed())
            .map(|s| s.rate)
            .max()
            .unwrap_or(0)
    };
    for s in &fast {
        let k = kernel.iter().find(|k| k.rate == s.rate);
        report.add(
            &format!("churn {}/s requested (mixed TCP/UDP, IPv4/IPv6)", s.rate),
            format!(
                "fast path: {:.0}/s achieved, {} of {} ok, failures {}, daemon CPU {:.0} % = \
                 {:.1} µs per new connection, {} offloaded, {} fast-path packets, flow entries \
                 stale {} / missing {}; kernel alone: {}",
                s.achieved,
                s.ok,
                s.started,
                s.failures(),
                s.daemon_cpu.unwrap_or(0.0),
                s.daemon_us_per_conn.unwrap_or(0.0),
                s.offloaded.unwrap_or(0),
                s.fast_packets.unwrap_or(0),
                s.stale.unwrap_or(0),
                s.missing.unwrap_or(0),
                k.map_or("not run (a lower rate failed)".into(), |k| format!(
                    "{:.0}/s achieved, {} of {} ok, failures {}",
                    k.achieved,
                    k.ok,
                    k.started,
                    k.failures()
                )),
            ),
        );
    }
    let (bf, bk) = (best(&fast), best(&kernel));
    // The maps must be in step at every rate run, whether or not the connections completed.
    let leaked: u64 = fast.iter().map(|s| s.stale.unwrap_or(0)).sum();
    let missing: u64 = fast.iter().map(|s| s.missing.unwrap_or(0)).sum();
    report.check(
        "churn: flow entries stale / missing against conntrack after the steps",
        format!("{leaked} / {missing}"),
        "0 / 0".into(),
        leaked == 0 && missing == 0,
    );
    let offloaded: u64 = fast.iter().map(|s| s.offloaded.unwrap_or(0)).sum();
    let fast_packets: u64 = fast.iter().map(|s| s.fast_packets.unwrap_or(0)).sum();
    report.check(
        "churn: connections offloaded / packets the fast path forwarded, fast-path steps",
        format!("{offloaded} / {fast_packets}"),
        "> 0 / > 0 (the fast path took part)".into(),
        offloaded > 0 && fast_packets > 0,
    );
    let top = rates.iter().copied().max().unwrap_or(0);
    let limit = if bk == 0 {
        " (no step passed with the kernel alone either: the generator and the hosts' stacks \
         did not sustain the first rate on this machine)"
            .to_owned()
    } else if bk < top && bf >= bk {
        format!(
            " (the kernel alone also failed above {bk}/s: the generator and the hosts' stacks \
             on one core are the limit here, not the router)"
        )
    } else {
        String::new()
    };
    let goal = if small { 1000 } else { 10_000 }.min(top);
    report.target(
        "churn: highest rate with every connection ok, fast path / kernel alone",
        format!("{bf}/s / {bk}/s{limit}"),
        format!("fast path ≥ {goal}/s"),
        bf >= goal,
    );
    Ok(())
}
