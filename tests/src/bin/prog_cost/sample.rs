//! Running a case: BPF_PROG_RUN calls on one or more pinned threads, the check that every run
//! took the case's path and was counted, and the summary of a case's samples.

use std::mem::size_of;

use aya::programs::{SchedClassifier, TestRun, TestRunOptions, Xdp};
use xdp_router_common::{PROG_NAME, TC_PROG_NAME, stats_index};
use xdp_router_tests::fixture_net::{
    Maps, TC_ACT_REDIRECT, TC_ACT_UNSPEC, XDP_PASS, XDP_REDIRECT, sk_buff_ctx, xdp_md,
};

use crate::{
    cases::{Case, Subject},
    raw,
};

/// Program runs per BPF_PROG_RUN call: below the 254 TTL decrements a 255 frame allows.
pub(super) const REPEAT: u32 = 250;

/// The program a case runs on: the XDP program, or the same pipeline at TC ingress, on an skb
/// the kernel builds from the frame for each call (linear, `CHECKSUM_NONE`).
#[derive(Clone, Copy)]
pub(super) enum Prog<'a> {
    Xdp(&'a Xdp),
    Tc(&'a SchedClassifier),
}

impl Prog<'_> {
    /// The verdict this program returns where the XDP program returns `xdp`.
    fn verdict(self, xdp: u32) -> u32 {
        match (self, xdp) {
            (Prog::Tc(_), XDP_REDIRECT) => TC_ACT_REDIRECT,
            (Prog::Tc(_), XDP_PASS) => TC_ACT_UNSPEC,
            _ => xdp,
        }
    }

    /// `REPEAT` runs on `case`'s frame: (verdict, ns per run as the kernel measured it).
    fn run(self, case: &Case) -> Result<(u32, u128), String> {
        let (res, name) = match self {
            Prog::Xdp(p) => (
                p.test_run(TestRunOptions {
                    data_in: Some(&case.frame),
                    ctx_in: Some(&xdp_md(case.ingress, case.frame.len())),
                    repeat: REPEAT,
                    ..TestRunOptions::default()
                }),
                PROG_NAME,
            ),
            Prog::Tc(p) => (
                p.test_run(TestRunOptions {
                    data_in: Some(&case.frame),
                    ctx_in: Some(&sk_buff_ctx(case.ingress)),
                    repeat: REPEAT,
                    ..TestRunOptions::default()
                }),
                TC_PROG_NAME,
            ),
        };
        let res = res.map_err(|e| format!("BPF_PROG_RUN of {name}: {e}"))?;
        Ok((res.return_value, res.duration.as_nanos()))
    }
}

/// One thread's share of a sample: `calls` BPF_PROG_RUN calls of `REPEAT` runs each; returns
/// the total ns the kernel measured.
fn drive(prog: Prog, baselines: &[raw::RawXdp], case: &Case, calls: u32) -> Result<u128, String> {
    let ctx = xdp_md(case.ingress, case.frame.len());
    let mut total_ns: u128 = 0;
    for _ in 0..calls {
        let (ret, ns, want) = match &case.subject {
            Subject::Router { verdict, .. } => {
                let (ret, ns) = prog.run(case)?;
                (ret, ns, prog.verdict(*verdict))
            }
            Subject::Baseline { index, verdict } => {
                let base = baselines
                    .get(*index)
                    .ok_or_else(|| format!("no baseline program {index}"))?;
                let (ret, ns) = base.test_run(&case.frame, &ctx, REPEAT)?;
                (ret, u128::from(ns), *verdict)
            }
        };
        if ret != want {
            return Err(format!("verdict {ret}, want {want}"));
        }
        total_ns += ns * u128::from(REPEAT);
    }
    Ok(total_ns)
}

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) -> Result<(), String> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET stays inside it for cpu < 1024.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(format!(
            "pinning a thread to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// One sample of a case: `calls` calls on each of `threads` threads at once (thread n pinned to
/// CPU n when there are several, all on the same flow); returns the mean ns per run. Checks
/// that every run took the case's path and was counted (see the module docs).
pub(super) fn sample(
    prog: Prog,
    baselines: &[raw::RawXdp],
    maps: &mut Maps,
    case: &Case,
    fib_cache: bool,
    calls: u32,
    threads: usize,
) -> Result<f64, String> {
    let runs = u64::from(calls) * u64::from(REPEAT) * threads as u64;
    let counted_before = match &case.subject {
        Subject::Router {
            setup,
            slot,
            reason,
            ..
        } => {
            if fib_cache {
                maps.apply(setup);
            } else {
                maps.apply(&setup.clone().without_fib_cache());
            }
            let idx = stats_index(*slot, *reason) as usize;
            Some(maps.stats().get(idx).map_or(0, |c| c.packets))
        }
        Subject::Baseline { .. } => None,
    };
    let totals: Vec<Result<u128, String>> = if threads == 1 {
        vec![drive(prog, baselines, case, calls)]
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|cpu| {
                    s.spawn(move || {
                        pin_to(cpu)?;
                        drive(prog, baselines, case, calls)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("a measuring thread panicked".to_owned()))
                })
                .collect()
        })
    };
    let mut total_ns = 0;
    for t in totals {
        total_ns += t?;
    }
    if let (
        Some(before),
        Subject::Router {
            setup,
            slot,
            reason,
            verdict,
        },
    ) = (counted_before, &case.subject)
    {
        let idx = stats_index(*slot, *reason) as usize;
        let counted = maps.stats().get(idx).map_or(0, |c| c.packets) - before;
        if counted != runs {
            return Err(format!(
                "{counted} of {runs} runs counted under {}: the case does not stay on its \
                 path across repeats",
                reason.name()
            ));
        }
        if *verdict == XDP_REDIRECT {
            let on_flows: u64 = setup.flows.iter().map(|f| maps.counters(f).packets).sum();
            if on_flows != runs {
                return Err(format!(
                    "flow counters saw {on_flows} of {runs} runs (lost updates?)"
                ));
            }
        }
    }
    Ok(total_ns as f64 / runs as f64)
}

/// Median, min and max of a case's samples.
pub(super) struct Summary {
    pub(super) median: f64,
    pub(super) min: f64,
    pub(super) max: f64,
}

pub(super) fn summarize(samples: &mut [f64]) -> Summary {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    let median = if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    };
    Summary {
        median,
        min: samples[0],
        max: samples[n - 1],
    }
}
