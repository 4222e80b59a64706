//! `xdp-router-bench scale`: the daemon and the fast path with Internet-sized tables.
//!
//! - Routes: a BGP-sized table (1,000,000 IPv4 + 200,000 IPv6 prefixes, `ip -batch`) loaded
//!   into and withdrawn from the router's FIB while `xdp-routerd` runs: its CPU while routes
//!   change, the time it takes to go quiet after the last change, its CPU when routes are quiet,
//!   its peak RSS; and the fast path's packet rate with the full table against a 10-route table
//!   (both loaded, as routing tables 100 and 101; an `ip rule` picks one, alternating round by
//!   round in one run; the FIB cache is off so that every packet takes a full
//!   `bpf_fib_lookup`).
//! - Flows: 1,000,000 established conntrack entries created through ctnetlink before the
//!   daemon starts: time until every one is offloaded, the daemon's CPU and conntrack resyncs
//!   in the 30 s after the last offload ([`after_offload`]) with its resync phase log, RSS,
//!   the kernel memory of the flow maps (`memlock` of the daemon's map fds), the daemon's CPU
//!   with no traffic (keep-alive passes);
//!   then the table is flushed and every flow must leave the maps (no leaked entries).
//!
//! - Churn: new connections per second through the router (short TCP connections and UDP
//!   exchanges, IPv4 and IPv6, data checked), stepped up until a step fails, with the daemon
//!   and with the kernel alone; after every step the kernel's flow maps are checked against
//!   conntrack (see [`crate::churn`]).
//!
//! Two kinds of figure are checked. A *check* is correctness (every flow offloaded at all, none
//! left after `conntrack -F`, the maps in step with conntrack under churn, capacity limits
//! honoured): a failed check fails the command. A *target* is a time, a rate, a CPU share or a
//! memory size: it is printed as met or missed, and a missed target is a finding, never an
//! error: on a shared, noisy 2-core VM a timing must not decide whether the test command passes.
//! `--small` (50 k routes, 50 k flows, churn at 1,000/s for 3 s) runs in `cargo xtask test`.
//!
//! The parts live in their own modules: [`idle`], [`routes`], [`flows`] (with the capacity
//! check) and [`churn`](mod@churn); [`proc`] samples the daemon's CPU, memory and system
//! calls; [`report`] collects the figures with their checks and targets.

mod after_offload;
mod churn;
mod config;
mod flows;
mod idle;
pub(crate) mod proc;
mod report;
mod routes;

use std::{fs, path::PathBuf, time::Duration};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::{
    Opts,
    router::{self, Scenario},
    run,
    testbed::{Names, Testbed},
};

use self::{
    churn::churn_part,
    flows::{capacity_part, flows_part},
    idle::idle_part,
    report::Report,
    routes::routes_part,
};

/// Options of `xdp-router-bench scale`.
#[derive(Args, Clone, Debug)]
pub struct ScaleArgs {
    /// The test-suite size: 50,000 IPv4 + 10,000 IPv6 routes, 50,000 flows.
    #[arg(long)]
    small: bool,
    /// IPv4 routes of the full table (default 1,000,000; small 50,000).
    #[arg(long)]
    routes_v4: Option<u32>,
    /// IPv6 routes of the full table (default 200,000; small 10,000).
    #[arg(long)]
    routes_v6: Option<u32>,
    /// Conntrack entries present at daemon start (default 1,000,000; small 50,000); one in
    /// five is IPv6, half are UDP.
    #[arg(long)]
    flows: Option<u32>,
    /// Seconds of each quiet-CPU measurement (default 10; small 5).
    #[arg(long)]
    quiet_secs: Option<u64>,
    /// Skip the idle part (a daemon with nothing to do: CPU and system calls).
    #[arg(long)]
    no_idle: bool,
    /// Skip the routes part.
    #[arg(long)]
    no_routes: bool,
    /// Skip the flows part.
    #[arg(long)]
    no_flows: bool,
    /// New connections per second of the churn steps, comma-separated, tried in order until
    /// one fails (default 2000,5000,10000,15000,20000,30000; small 1000).
    #[arg(long, value_delimiter = ',')]
    churn_rates: Option<Vec<u32>>,
    /// Seconds of each churn step (default 5; small 3).
    #[arg(long)]
    churn_secs: Option<u64>,
    /// Skip the churn part.
    #[arg(long)]
    no_churn: bool,
}

/// Runs the scale benchmark; prints the figures as a Markdown table. Errors when a correctness
/// check failed; missed targets are reported only.
pub fn run(opts: &Opts, args: &ScaleArgs) -> Result<()> {
    run::prepare()?;
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let small = args.small;
    let routes_v4 = args
        .routes_v4
        .unwrap_or(if small { 50_000 } else { 1_000_000 });
    let routes_v6 = args
        .routes_v6
        .unwrap_or(if small { 10_000 } else { 200_000 });
    let flows = args.flows.unwrap_or(if small { 50_000 } else { 1_000_000 });
    let quiet = Duration::from_secs(args.quiet_secs.unwrap_or(if small { 5 } else { 10 }));
    let bin = router::locate_daemon(opts.daemon.as_deref(), true)?;
    let out = opts
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/bench/scale"));
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut report = Report::default();
    let mut tb = Testbed::create(Names::bench())?;
    router::apply_scenario(
        &tb.rtr,
        Scenario::S1,
        &tb.names.rl,
        &tb.names.rw,
        opts.shaper_mbit,
    )?;
    if !args.no_idle {
        eprintln!("idle: a daemon with no flows, no traffic, no route changes");
        idle_part(&tb, &bin, &out, quiet, &mut report)?;
    }
    if !args.no_routes {
        eprintln!("routes: {routes_v4} IPv4 + {routes_v6} IPv6");
        routes_part(
            &mut tb,
            &bin,
            &out,
            routes_v4,
            routes_v6,
            quiet,
            small,
            &mut report,
        )?;
    }
    if !args.no_flows {
        eprintln!("flows: {flows} conntrack entries");
        router::flush_conntrack(&tb.rtr)?;
        flows_part(&tb, &bin, &out, flows, quiet, small, &mut report)?;
        router::flush_conntrack(&tb.rtr)?;
        capacity_part(&tb, &bin, &out, flows.min(20_000), &mut report)?;
    }
    if !args.no_churn {
        let rates = args.churn_rates.clone().unwrap_or_else(|| {
            if small {
                vec![1000]
            } else {
                vec![2000, 5000, 10_000, 15_000, 20_000, 30_000]
            }
        });
        let secs = Duration::from_secs(args.churn_secs.unwrap_or(if small { 3 } else { 5 }));
        eprintln!(
            "churn: {rates:?} new connections/s, {} s each",
            secs.as_secs()
        );
        churn_part(&tb, &bin, &out, &rates, secs, small, &mut report)?;
    }
    drop(tb);
    let md = report.markdown(&command);
    print!("{md}");
    let _ = fs::write(out.join("scale.md"), &md);
    match report.failed() {
        0 => Ok(()),
        n => bail!("{n} scale correctness check(s) failed (see the table)"),
    }
}
