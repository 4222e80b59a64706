//! The scale benchmark's idle part: a daemon with no flows, no traffic and no route changes
//! (its CPU share and its system calls per second).

use std::{fs, path::Path, time::Duration};

use anyhow::Result;

use super::{
    config::config,
    proc::{count_syscalls, cpu_over, settle, ticks_per_second},
    report::Report,
};
use crate::{
    router::{self, Daemon},
    testbed::Testbed,
};

/// The shortest window the idle CPU share is measured over (see [`idle_part`]).
const IDLE_CPU_WINDOW: Duration = Duration::from_secs(20);

/// An idle router: the daemon manages the testbed's two ports with no flows, no traffic and no
/// route changes, as a router spends most of its life. Its CPU share over `quiet` or
/// [`IDLE_CPU_WINDOW`], whichever is longer (after its start-up work), then its system calls per second over `quiet` counted by `strace -c -f`
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
    // /proc counts CPU time in clock ticks (10 ms): over 5 s one tick is already 0.2 %, the
    // target itself. Over at least 20 s a tick is 0.05 %, fine enough to tell the target from
    // a single wake-up.
    let window = quiet.max(IDLE_CPU_WINDOW);
    let cpu = cpu_over(pid, window)?;
    let tick_pct = 100.0 / (ticks_per_second() * window.as_secs_f64());
    report.target(
        "idle daemon CPU (no flows, no traffic)",
        format!(
            "{cpu:.2} % of a core over {} s ({:.0} clock ticks; one is {tick_pct:.2} %)",
            window.as_secs(),
            cpu / tick_pct
        ),
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
