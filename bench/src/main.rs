//! xdp-router-bench: A/B benchmark (RFC 2544 style) of xdp-router's XDP fast path against
//! kernel forwarding, on a netns testbed with a BPF_PROG_RUN live-frames generator (an AF_PACKET
//! TX ring where the kernel refuses live frames).
//!
//! `cargo xtask bench [args]` runs `xdp-router-bench [args]`; `cargo xtask test` runs
//! `xdp-router-bench quick`; `cargo xtask lab` runs `xdp-router-bench lab`. See
//! docs/benchmarks-method.md (and the results in docs/benchmarks.md).
mod churn;
mod cpu;
mod ctnl;
mod demo;
mod generator;
mod lab;
mod latency;
mod napi;
mod packet;
mod pin;
mod report;
mod responsive;
mod router;
mod run;
mod scale;
mod scrape;
mod search;
mod soak;
mod tcp;
mod testbed;
mod verdicts;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::{
    packet::Family,
    router::{Datapath, Scenario},
};

/// A/B benchmark of the xdp-router fast path (needs root).
#[derive(Parser)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    mode: Option<Mode>,
    #[command(flatten)]
    opts: Opts,
}

#[derive(Subcommand, Clone)]
enum Mode {
    /// The full benchmark (the default; ≈ 10–15 min).
    Run,
    /// Smoke test: S2, IPv4, 64 and 1518 B, short trials (< 2 min); fails loudly if nothing
    /// arrives or the fast path carries nothing.
    Quick,
    /// The README's demo (< 1 min): a home router running `xdp-routerd` with the example config,
    /// 64-byte UDP, an iperf3 TCP transfer and the router's CPU at two fixed UDP rates, with
    /// the fast path off, on (XDP) and on at TC ingress, side by side.
    Lab(demo::LabArgs),
    /// Soak (default 2 × 10 min): short TCP connections at ~600/s (IPv4 + IPv6, data checked),
    /// iperf3 streams, route flaps and fast-path toggles, with the fast path and, as the
    /// control, the kernel alone; fails on any lost connection or leaked flow.
    Soak(soak::SoakArgs),
    /// Internet-sized tables (≈ 15 min; `--small` ≈ 2 min, run by `cargo xtask test`): a full
    /// BGP table in the FIB, a million conntrack entries at daemon start, fast-path rate with
    /// the full table vs 10 routes, new connections per second (churn) with the daemon and
    /// with the kernel alone, the flow maps checked against conntrack. Fails when a check is
    /// missed.
    Scale(scale::ScaleArgs),
    /// Verdict expiry cost (≈ 1 min): 64-byte UDP through the fast path with verdicts kept
    /// and with `verdict_max_age_ms` set, side by side.
    Verdicts(verdicts::VerdictArgs),
    /// Responsiveness (≈ 2 min per build): `/metrics` and `xdp-routerd status` latency with
    /// 100,000 connections in conntrack while 100,000 routes flap and connections come and go;
    /// `--baseline BIN` measures another build first, side by side.
    Responsive(responsive::ResponsiveArgs),
}

/// Options of both modes (quick mode changes the defaults of the unset ones).
#[derive(Args, Clone, Debug)]
pub struct Opts {
    /// Output directory (default: target/bench/<timestamp>).
    #[arg(long, global = true)]
    out: Option<PathBuf>,
    /// Trial length in milliseconds (default 400; quick 300).
    #[arg(long, global = true)]
    trial_ms: Option<u64>,
    /// Paced search steps per NDR search after the flat-out trial (default 5; quick 3).
    #[arg(long, global = true)]
    steps: Option<u32>,
    /// Extra attempts of a lossy paced trial before its rate is rejected (shared-VM hiccups).
    #[arg(long, global = true, default_value_t = 2)]
    retries: u32,
    /// Loss limit of the no-drop rate, percent.
    #[arg(long, global = true, default_value_t = 0.05)]
    loss_pct: f64,
    /// Flows per stream (source ports spread over this many; default 64, lab 8).
    #[arg(long, global = true)]
    flows: Option<u32>,
    /// Frame sizes in bytes, FCS included (default: 64…1518; IPv6 starts at 78).
    #[arg(long, global = true, value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Address families (default: ipv4,ipv6; quick ipv4).
    #[arg(long, global = true, value_delimiter = ',', value_parser = parse_family)]
    families: Vec<Family>,
    /// Scenarios (default: s1,s2,s3; quick s2).
    #[arg(long, global = true, value_delimiter = ',')]
    scenarios: Vec<Scenario>,
    /// Seconds per iperf3 run (default 2; quick 1).
    #[arg(long, global = true)]
    tcp_secs: Option<u32>,
    /// Skip the iperf3 runs.
    #[arg(long, global = true)]
    no_tcp: bool,
    /// Latency probes per fast-path mode and background load, 1 ms apart (default 3000; quick
    /// 200). Off and on are measured interleaved, see --latency-rounds.
    #[arg(long, global = true)]
    latency_probes: Option<u32>,
    /// Rounds of the interleaved latency comparison: each round has one block of
    /// probes/rounds probes per mode, the mode order alternating (off on | on off | …).
    #[arg(long, global = true, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    latency_rounds: u32,
    /// Background load of the latency runs, 64 B frames/s (default: the scenario's kernel NDR
    /// at 64 B, the RFC 2544 latency load, at least 60 Kpps).
    #[arg(long, global = true)]
    latency_load_pps: Option<f64>,
    /// Latency only: skip the bare-redirect ceiling, the NDR searches and the S3 shaping check
    /// (the generator-alone check stays; without --latency-load-pps, one kernel NDR search at
    /// the smallest IPv4 size per scenario sets the background load).
    #[arg(long, global = true, conflicts_with = "no_latency")]
    only_latency: bool,
    /// Skip the latency runs.
    #[arg(long, global = true)]
    no_latency: bool,
    /// S3 upload shaper rate, Mbit/s.
    #[arg(long, global = true, default_value_t = 100)]
    shaper_mbit: u32,
    /// xdp-routerd binary (default: build and use target/release/xdp-routerd).
    #[arg(long, global = true)]
    daemon: Option<PathBuf>,
    /// Kernel rows only: do not start xdp-routerd (no fast-path rows).
    #[arg(long, global = true)]
    no_daemon: bool,
    /// The fast path of the "fast path" rows, on both router ports: `xdp` (native XDP) or `tc`
    /// (the TC fast path of ports without native XDP). The main run only; the lab runs both.
    #[arg(long, global = true, value_enum, default_value_t = Datapath::Xdp)]
    datapath: Datapath,
}

fn parse_family(s: &str) -> Result<Family, String> {
    match s {
        "ipv4" | "4" | "v4" => Ok(Family::Ipv4),
        "ipv6" | "6" | "v6" => Ok(Family::Ipv6),
        _ => Err(format!("unknown family {s} (ipv4 or ipv6)")),
    }
}

fn main() {
    let cli = Cli::parse();
    if let Some(Mode::Lab(args)) = &cli.mode {
        if let Err(e) = demo::run(&cli.opts, args) {
            eprintln!("xdp-router-bench lab: error: {e:#}");
            std::process::exit(if run::stopped() { 130 } else { 1 });
        }
        return;
    }
    if let Some(Mode::Soak(args)) = &cli.mode {
        if let Err(e) = soak::run(&cli.opts, args) {
            eprintln!("xdp-router-bench soak: error: {e:#}");
            std::process::exit(if run::stopped() { 130 } else { 1 });
        }
        return;
    }
    if let Some(Mode::Scale(args)) = &cli.mode {
        if let Err(e) = scale::run(&cli.opts, args) {
            eprintln!("xdp-router-bench scale: error: {e:#}");
            std::process::exit(if run::stopped() { 130 } else { 1 });
        }
        return;
    }
    if let Some(Mode::Verdicts(args)) = &cli.mode {
        if let Err(e) = verdicts::run(&cli.opts, args) {
            eprintln!("xdp-router-bench verdicts: error: {e:#}");
            std::process::exit(if run::stopped() { 130 } else { 1 });
        }
        return;
    }
    if let Some(Mode::Responsive(args)) = &cli.mode {
        if let Err(e) = responsive::run(&cli.opts, args) {
            eprintln!("xdp-router-bench responsive: error: {e:#}");
            std::process::exit(if run::stopped() { 130 } else { 1 });
        }
        return;
    }
    let quick = matches!(cli.mode, Some(Mode::Quick));
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    match run::run(&cli.opts, quick, command) {
        Ok(report) => {
            print!("{}", report.markdown());
            let missed = report
                .targets
                .iter()
                .filter(|t| t.met == Some(false))
                .count();
            if quick && missed > 0 {
                eprintln!("xdp-router-bench quick: {missed} check(s) failed (see Quick checks)");
                std::process::exit(1);
            }
            if missed > 0 {
                eprintln!("{missed} target(s) missed (see the Targets table)");
            }
        }
        Err(e) => {
            eprintln!("xdp-router-bench: error: {e:#}");
            std::process::exit(1);
        }
    }
}
