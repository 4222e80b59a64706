//! The scale benchmark's idle part: a daemon with no flows, no traffic and no route changes
//! (its CPU share and its system calls per second).

use std::{fs, path::Path, time::Duration};

use anyhow::Result;

use super::{
    config::config,
    proc::{count_syscalls, cpu_over, settle},
    report::Report,
};
use crate::{
    router::{self, Daemon},
    testbed::Testbed,
};

/// An idle router: the daemon manages the testbed's two ports with no flows, no traffic and no
/// route changes, as a router spends most of its life. Its CPU share over `quiet` (after its
/// start-up work), then its system calls per second over `quiet` counted by `strace -c -f`
/// (run after the CPU figure: tracing slows the traced process), with the most frequent
/// calls named.
pub(super) fn idle_part(
    tb: &Testbed,
    bin: &Path,
    out: &Path,
    quiet: Duration,
    report: &mut Report,
) -> Result<()> {
    let dir = out.join("idle");
    fs::create_dir_all(&dir)?;
    router::flush_conntrack(&tb.rtr)?;
    let cfg = config(&dir, tb, "")?;
    let daemon = Daemon::start_waiting(bin, &tb.rtr, &cfg, &dir, Duration::from_secs(120))?;
    let pid = daemon.pid();
    // Start-up work (attaching, the first dumps) is not idleness.
    let _ = settle(pid, Duration::from_secs(30))?;
    let cpu = cpu_over(pid, quiet)?;
    report.target(
        "idle daemon CPU (no flows, no traffic)",
        format!("{cpu:.2} % of a core over {} s", quiet.as_secs()),
        "< 0.2 %".into(),
        cpu < 0.2,
    );
    let calls = count_syscalls(pid, quiet, &dir.join("strace.txt"))?;
    let total: u64 = calls.iter().map(|(_, n)| n).sum();
    let per_s = total as f64 / quiet.as_secs_f64();
    let top = calls
        .iter()
        .take(5)
        .map(|(name, n)| format!("{name} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    report.target(
        "idle daemon system calls",
        format!(
            "{per_s:.1} per second ({total} in {} s; most: {top})",
            quiet.as_secs()
        ),
        "< 20 per second".into(),
        per_s < 20.0,
    );
    daemon.stop()
}
