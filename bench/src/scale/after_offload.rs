//! The scale benchmark's window after the last offload: the daemon's CPU and the conntrack
//! resyncs it ran in the seconds right after every flow was offloaded, with no traffic (what
//! the start-up leaves behind: marking connections again after arming, and any event-socket
//! overrun that work causes), and the daemon's own phase log of its resyncs.

use std::{
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::{proc::cpu_over, report::Report};
use crate::router::Daemon;

/// The log line that reports one socket overrun (each starts a resync).
const OVERRUN_LINE: &str = "conntrack event socket overrun";

/// The message of the daemon's per-resync phase line (`tasks/conntrack.rs::resync`).
const RESYNC_LINE: &str = "conntrack resync ";

/// What the daemon did in the window.
struct Window {
    cpu_pct: f64,
    /// Resyncs finished in the window (`conntrack.resyncs` of `status --json`).
    resyncs: u64,
    /// Overruns logged in the window: a resync they started may end after it.
    overruns: usize,
}

/// Measures the `window` starting now (right after the last offload was seen) and reports its
/// CPU (target `< cpu_goal_pct`) and its resyncs (target 0).
pub(super) fn window_after_offload(
    daemon: &Daemon,
    window: Duration,
    cpu_goal_pct: f64,
    report: &mut Report,
) -> Result<()> {
    let w = measure(daemon, window)?;
    let secs = window.as_secs();
    report.target(
        &format!("daemon CPU in the {secs} s after the last offload (no traffic)"),
        format!("{:.2} % of a core", w.cpu_pct),
        format!("< {cpu_goal_pct} %"),
        w.cpu_pct < cpu_goal_pct,
    );
    report.target(
        &format!("conntrack resyncs in the {secs} s after the last offload"),
        format!(
            "{} (status conntrack.resyncs); {} event-socket overruns logged",
            w.resyncs, w.overruns
        ),
        "0".into(),
        w.resyncs == 0 && w.overruns == 0,
    );
    Ok(())
}

fn measure(daemon: &Daemon, window: Duration) -> Result<Window> {
    let overruns_before = daemon.log_text().matches(OVERRUN_LINE).count();
    let resyncs_before = resyncs_patiently(daemon)?;
    let cpu_pct = cpu_over(daemon.pid(), window)?;
    let overruns = daemon.log_text().matches(OVERRUN_LINE).count() - overruns_before;
    let resyncs = resyncs_patiently(daemon)? - resyncs_before;
    Ok(Window {
        cpu_pct,
        resyncs,
        overruns,
    })
}

/// `conntrack.resyncs` of `status --json`, asked again while the daemon is too busy to answer
/// within the client's timeout.
fn resyncs_patiently(daemon: &Daemon) -> Result<u64> {
    let started = Instant::now();
    loop {
        match daemon.status_json() {
            Ok(json) => {
                return json["conntrack"]["resyncs"]
                    .as_u64()
                    .context("status --json has no conntrack.resyncs");
            }
            Err(e) if started.elapsed() > Duration::from_secs(300) => return Err(e),
            Err(_) => thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// Adds each resync's phase line from the daemon's log (entries, changed, dump, lookups,
/// marks, map writes, total) to the report, in order.
pub(super) fn phase_log(daemon: &Daemon, which: &str, report: &mut Report) {
    for (i, fields) in resync_phases(&daemon.log_text()).into_iter().enumerate() {
        report.add(
            &format!("{which}resync {} phases (daemon log)", i + 1),
            fields,
        );
    }
}

/// The fields of every resync line in `log`, in order.
fn resync_phases(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| l.split_once(RESYNC_LINE))
        .map(|(_, fields)| fields.trim().to_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resync_lines_are_found_in_order() {
        let log = "\
2026-11-27T03:55:24Z  INFO xdp_routerd::startup: flow maps created\n\
2026-11-27T03:55:47Z  INFO xdp_routerd::tasks::conntrack: conntrack resync entries=3 changed=3 ms=9\n\
2026-11-27T03:55:48Z  WARN xdp_routerd::tasks::conntrack: conntrack event socket overrun: resyncing from a dump\n\
2026-11-27T03:55:50Z  INFO xdp_routerd::tasks::conntrack: conntrack resync entries=3 changed=0 ms=2\n";
        assert_eq!(
            resync_phases(log),
            vec!["entries=3 changed=3 ms=9", "entries=3 changed=0 ms=2"]
        );
        assert_eq!(log.matches(OVERRUN_LINE).count(), 1);
    }
}
