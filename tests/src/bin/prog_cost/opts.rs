//! `prog-cost`'s command-line options.

use std::path::PathBuf;

/// Command-line options.
pub(super) struct Opts {
    /// Samples per case (the median is reported).
    pub(super) samples: usize,
    /// BPF_PROG_RUN calls per sample (each `REPEAT` runs).
    pub(super) calls: u32,
    /// Threads measuring each case at once, on the same flow (CPU n for thread n).
    pub(super) threads: usize,
    /// Another `xdp_router` object file to measure side by side (A/B).
    pub(super) compare: Option<PathBuf>,
    /// Compare with this build loaded with `FIB_LOOKUP_DIRECT` instead.
    pub(super) compare_fib_direct: bool,
    /// Compare with this build with the FIB cache off.
    pub(super) compare_no_fib_cache: bool,
    /// Compare with this build's TC program (`xdp_router_tc`) on the same cases.
    pub(super) compare_tc: bool,
    /// Only the cases whose name contains this (the baselines always run), e.g. to profile one
    /// path with `perf record`.
    pub(super) only: Option<String>,
}

impl Opts {
    pub(super) fn parse() -> Result<Opts, String> {
        let mut opts = Opts {
            samples: 15,
            calls: 1000,
            threads: 1,
            compare: None,
            compare_fib_direct: false,
            compare_no_fib_cache: false,
            compare_tc: false,
            only: None,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = |name: &str| {
                args.next()
                    .and_then(|v| v.parse::<u32>().ok())
                    .filter(|v| *v > 0)
                    .ok_or_else(|| format!("{name} needs a positive integer"))
            };
            match arg.as_str() {
                "--samples" => opts.samples = value("--samples")? as usize,
                "--calls" => opts.calls = value("--calls")?,
                "--threads" => opts.threads = value("--threads")? as usize,
                "--compare-fib-direct" => opts.compare_fib_direct = true,
                "--compare-no-fib-cache" => opts.compare_no_fib_cache = true,
                "--compare-tc" => opts.compare_tc = true,
                "--only" => opts.only = Some(args.next().ok_or("--only needs a case name part")?),
                "--compare" => {
                    opts.compare = Some(
                        args.next()
                            .ok_or("--compare needs the path of an xdp-router object")?
                            .into(),
                    );
                }
                "-h" | "--help" => {
                    return Err(
                        "usage: prog-cost [--samples N (15)] [--calls N (1000)] [--threads N (1)] \
                         [--compare OBJECT | --compare-fib-direct | --compare-no-fib-cache | --compare-tc] \
                         [--only TEXT]"
                            .to_owned(),
                    );
                }
                other => return Err(format!("unknown argument {other} (try --help)")),
            }
        }
        Ok(opts)
    }
}
