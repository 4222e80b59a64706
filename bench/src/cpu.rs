//! CPU time of one CPU from /proc/stat, to report where the router's CPU goes per trial.

use anyhow::{Context as _, Result, bail};
use serde::Serialize;

/// Cumulative jiffies of one CPU (the `cpuN` line of /proc/stat).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTimes {
    busy_other: u64,
    system: u64,
    softirq: u64,
    idle: u64,
}

impl CpuTimes {
    /// Reads the counters of CPU `cpu`.
    pub fn read(cpu: usize) -> Result<CpuTimes> {
        let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        parse(&stat, cpu)
    }

    /// Share of time between `self` (earlier) and `later`, in percent.
    pub fn share_until(&self, later: &CpuTimes) -> CpuShare {
        let d = |a: u64, b: u64| b.saturating_sub(a) as f64;
        let sys = d(self.system, later.system);
        let sirq = d(self.softirq, later.softirq);
        let other = d(self.busy_other, later.busy_other);
        let idle = d(self.idle, later.idle);
        let total = sys + sirq + other + idle;
        if total == 0.0 {
            return CpuShare::default();
        }
        CpuShare {
            busy: 100.0 * (sys + sirq + other) / total,
            system: 100.0 * sys / total,
            softirq: 100.0 * sirq / total,
        }
    }
}

/// How busy a CPU was over an interval, in percent (tick sampled: ±2–3 % over 0.5 s).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CpuShare {
    /// Everything but idle and iowait.
    pub busy: f64,
    /// Kernel time outside interrupts (threaded NAPI runs here).
    pub system: f64,
    /// Softirq time (a non-threaded NAPI poll, e.g. the sink's, runs here).
    pub softirq: f64,
}

impl CpuShare {
    /// System time (the router's threaded NAPI) per packet at `pps` packets/s, ns; `None`
    /// without packets or system time.
    pub fn system_ns_per_packet(&self, pps: f64) -> Option<f64> {
        ns_per_packet(self.system, pps)
    }

    /// System share (in percent) per Gbit/s of a stream of `mbps` Mbit/s; `None` without
    /// traffic or system time.
    pub fn system_per_gbit(&self, mbps: f64) -> Option<f64> {
        (mbps > 0.0 && self.system > 0.0).then(|| self.system / (mbps / 1e3))
    }

    /// Busy time per packet at `pps` packets/s, ns; `None` without packets or busy time.
    pub fn busy_ns_per_packet(&self, pps: f64) -> Option<f64> {
        ns_per_packet(self.busy, pps)
    }
}

/// `share` percent of one CPU spread over `pps` packets/s, in ns per packet.
fn ns_per_packet(share: f64, pps: f64) -> Option<f64> {
    (pps > 0.0 && share > 0.0).then(|| share / 100.0 * 1e9 / pps)
}

fn parse(stat: &str, cpu: usize) -> Result<CpuTimes> {
    let tag = format!("cpu{cpu}");
    let Some(line) = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some(tag.as_str()))
    else {
        bail!("/proc/stat has no line for {tag}");
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    if v.len() < 8 {
        bail!("/proc/stat line for {tag} is too short: {line}");
    }
    // user nice system idle iowait irq softirq steal [guest guest_nice]
    Ok(CpuTimes {
        busy_other: v[0] + v[1] + v[5] + v[7],
        system: v[2],
        softirq: v[6],
        idle: v[3] + v[4],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_from_two_samples() {
        let a =
            "cpu  1 2 3 4 5 6 7 8 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\ncpu1 10 0 100 200 0 0 50 0 0 0\n";
        let b =
            "cpu  1 2 3 4 5 6 7 8 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\ncpu1 10 0 160 220 0 0 70 0 0 0\n";
        let s = parse(a, 1).unwrap().share_until(&parse(b, 1).unwrap());
        assert!((s.busy - 80.0).abs() < 1e-9);
        assert!((s.system - 60.0).abs() < 1e-9);
        assert!((s.softirq - 20.0).abs() < 1e-9);
        assert!(parse(a, 7).is_err());
    }
}
