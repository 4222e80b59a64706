//! What the scale benchmark reads of a running process: CPU and memory from /proc, the kernel
//! memory of its BPF maps, when it goes quiet, and its system calls (`strace -c -f`).

use std::{
    fs,
    path::Path,
    process::Stdio,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// CPU seconds (user + system) and memory of one process, from /proc.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ProcSample {
    pub(crate) cpu_s: f64,
    pub(super) rss_kib: u64,
    pub(super) hwm_kib: u64,
}

/// The clock ticks per second that /proc counts CPU time in (`_SC_CLK_TCK`, 100 on Linux).
pub(super) fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64
}

/// `pid`'s CPU time so far and its memory (see [`ProcSample`]).
pub(crate) fn sample(pid: u32) -> Result<ProcSample> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat (did xdp-routerd exit?)"))?;
    // Fields after the command name (which may contain spaces) start at ") ".
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name.
    let cpu_s = (ticks(11) + ticks(12)) as f64 / ticks_per_second();
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Ok(ProcSample {
        cpu_s,
        rss_kib: kib("VmRSS:"),
        hwm_kib: kib("VmHWM:"),
    })
}

/// The CPUs `pid` may run on (`Cpus_allowed_list` of /proc/PID/status, e.g. `0-1`).
pub(super) fn cpus_allowed(pid: u32) -> Result<String> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status (did xdp-routerd exit?)"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_owned())
        .context("no Cpus_allowed_list in /proc/PID/status")
}

/// CPU time the hypervisor gave other guests while this one had work (`steal`, summed over
/// every CPU in /proc/stat), seconds: on a shared VM, what a slow run lost to its neighbours.
pub(super) fn stolen_s() -> Result<f64> {
    let stat = fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let steal = stat
        .lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .and_then(|v| v.split_whitespace().nth(7))
        .and_then(|v| v.parse::<u64>().ok())
        .context("no steal field in /proc/stat")?;
    Ok(steal as f64 / ticks_per_second())
}

/// Share of one core `pid` used over `dur`, percent.
pub(super) fn cpu_over(pid: u32, dur: Duration) -> Result<f64> {
    let a = sample(pid)?;
    thread::sleep(dur);
    let b = sample(pid)?;
    Ok(100.0 * (b.cpu_s - a.cpu_s) / dur.as_secs_f64())
}

/// Kernel memory of the daemon's BPF maps (sum of `memlock` over its map fds), bytes.
pub(super) fn map_memlock(pid: u32) -> Result<u64> {
    let mut total = 0;
    for fd in fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let text = fs::read_to_string(fd?.path()).unwrap_or_default();
        if !text.contains("map_type:") {
            continue;
        }
        total += text
            .lines()
            .find_map(|l| l.strip_prefix("memlock:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(total)
}

/// Waits until `pid` used less than 1 % of a core over 3 s in a row (a process starved by a
/// loaded machine can look quiet for a second); returns the time until that quiet stretch
/// began. Sampled every 0.5 s, judged on the last six samples together: CPU time comes in
/// 10 ms clock ticks, so a 0.5 s sample with one tick reads 2 %, and a daemon with a 10 ms
/// chore every 2 s (0.5 % of a core) would never have six quiet samples in a row.
pub(super) fn settle(pid: u32, limit: Duration) -> Result<Option<Duration>> {
    let started = Instant::now();
    let window = Duration::from_millis(500);
    let mut last = Rolling::default();
    while started.elapsed() < limit {
        if last.push(cpu_over(pid, window)?) < 1.0 {
            return Ok(Some(
                started
                    .elapsed()
                    .saturating_sub(window * QUIET_SAMPLES as u32),
            ));
        }
    }
    Ok(None)
}

/// Samples that make the 3 s of [`settle`].
const QUIET_SAMPLES: usize = 6;

/// The mean of the last [`QUIET_SAMPLES`] CPU shares (infinite until there are that many).
#[derive(Default)]
struct Rolling(std::collections::VecDeque<f64>);

impl Rolling {
    fn push(&mut self, share: f64) -> f64 {
        if self.0.len() == QUIET_SAMPLES {
            self.0.pop_front();
        }
        self.0.push_back(share);
        if self.0.len() < QUIET_SAMPLES {
            return f64::INFINITY;
        }
        self.0.iter().sum::<f64>() / QUIET_SAMPLES as f64
    }
}

/// System calls of `pid` and all its threads over `dur`, by name, most frequent first
/// (`strace -c -f`; its summary is kept in `keep`).
pub(super) fn count_syscalls(pid: u32, dur: Duration, keep: &Path) -> Result<Vec<(String, u64)>> {
    let mut child = std::process::Command::new("strace")
        .args(["-c", "-f", "-q", "-o"])
        .arg(keep)
        .args(["-p", &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting strace (cargo xtask setup installs it)")?;
    thread::sleep(dur);
    // strace writes its summary when interrupted.
    // SAFETY: kill(2) with a pid of a child this function started.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let status = child.wait().context("waiting for strace")?;
    let text = fs::read_to_string(keep)
        .with_context(|| format!("strace ({status}) wrote no summary to {}", keep.display()))?;
    parse_strace_summary(&text)
}

/// The rows of `strace -c`'s table: `% time  seconds  usecs/call  calls  [errors]  syscall`.
fn parse_strace_summary(text: &str) -> Result<Vec<(String, u64)>> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("------") {
            // The first rule opens the table, the second closes it before the total.
            if in_table {
                break;
            }
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        let f: Vec<&str> = t.split_whitespace().collect();
        let (Some(name), Some(calls)) = (f.last(), f.get(3)) else {
            continue;
        };
        let calls = calls
            .parse::<u64>()
            .with_context(|| format!("strace summary row {t:?}"))?;
        rows.push(((*name).to_owned(), calls));
    }
    if !in_table {
        bail!("no table in the strace summary:\n{text}");
    }
    rows.sort_by_key(|r| std::cmp::Reverse(r.1));
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_is_judged_over_the_last_three_seconds_together() {
        let mut r = Rolling::default();
        // One 10 ms tick every 1.5 s (0.67 % of a core): each tick's sample reads 2 %.
        let ticks = [2.0, 0.0, 0.0, 2.0, 0.0, 0.0];
        let means: Vec<f64> = ticks.iter().map(|&t| r.push(t)).collect();
        assert!(means[..5].iter().all(|m| m.is_infinite()), "{means:?}");
        assert!((means[5] - 4.0 / 6.0).abs() < 1e-9, "{means:?}");
        // A busy sample keeps the mean up for the next six.
        assert!(r.push(10.0) >= 1.0);
        for _ in 0..5 {
            assert!(r.push(0.0) >= 1.0);
        }
        assert!(r.push(0.0) < 1.0);
    }

    #[test]
    fn strace_summary_rows_are_read_most_frequent_first() {
        let text = "\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 61.27    0.001212           3       350           bpf
 20.00    0.000396          12        32         4 futex
 18.73    0.000371          18        20           epoll_wait
------ ----------- ----------- --------- --------- ----------------
100.00    0.001979           4       402         4 total
";
        let rows = parse_strace_summary(text).unwrap();
        assert_eq!(
            rows,
            [
                ("bpf".into(), 350),
                ("futex".into(), 32),
                ("epoll_wait".into(), 20)
            ]
        );
        assert!(parse_strace_summary("strace: attach: ptrace: EPERM").is_err());
        // A quiet process: strace prints the table with only the total.
        let empty = "\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
------ ----------- ----------- --------- --------- ----------------
100.00    0.000000           0         0           total
";
        assert!(parse_strace_summary(empty).unwrap().is_empty());
    }
}
