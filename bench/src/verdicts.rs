//! `bench verdicts`: what verdict expiry costs. With `verdict_max_age_ms` set and a rule
//! established packets reach that can change its answer without a ruleset change (an ipset
//! match, a time rule: see the daemon's `flows::verdict_expiry`), each offloaded flow direction
//! hands one packet per interval back to the kernel's rules (which forward it and re-arm the
//! direction), so that those rules reach running flows. This measures that side by side on the
//! S2 router (MASQUERADE, established accept, 25 rules) with a fail2ban-style rule first in
//! FORWARD (`-m set --match-set` on an empty ipset, DROP): 64-byte UDP flat out over the
//! benchmark flows, the fast path on, with verdicts kept (0: until the ruleset changes) and
//! with each age asked for, interleaved over rounds in rotating order. Per mode:
//! delivered packets per second (median of the rounds), the ratio to verdicts kept, the share
//! of delivered packets the kernel forwarded, and the packets passed as `kernel_verdict_expired`.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::{
    Opts,
    latency::EchoServer,
    packet::Family,
    report::median,
    router::{self, Daemon, Scenario},
    run::{check_stop, prepare, prime},
    testbed::{Names, Path, Testbed},
};

/// Options of `bench verdicts`.
#[derive(Args, Clone, Debug)]
pub struct VerdictArgs {
    /// Verdict ages to compare with 0 (verdicts kept), in ms.
    #[arg(long, value_delimiter = ',', default_values_t = [500, 50])]
    ages_ms: Vec<u64>,
    /// Rounds; each measures every mode once.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Trial length in ms.
    #[arg(long, default_value_t = 2000)]
    trial_ms: u64,
}

/// One mode's trials.
struct ModeRuns {
    age_ms: u64,
    pps: Vec<f64>,
    delivered: u64,
    kernel_forwarded: u64,
    expired: u64,
}

/// Runs the comparison and prints its table.
pub fn run(o: &Opts, a: &VerdictArgs) -> Result<()> {
    prepare()?;
    if a.ages_ms.contains(&0) {
        bail!("--ages-ms: 0 (verdicts kept) is the baseline and always measured");
    }
    let bin = router::locate_daemon(o.daemon.as_deref(), o.daemon.is_none())?;
    let flows = o.flows.unwrap_or(64);
    let size = 64;
    let sc = Scenario::S2;
    let mut tb = Testbed::create(Names::bench()).context("building the testbed")?;
    router::apply_scenario(&tb.rtr, sc, &tb.names.rl, &tb.names.rw, 100)?;
    // Without a rule whose answer can change with no commit, verdicts never expire.
    tb.rtr
        .sh("ipset create xr-bench-blk hash:ip -exist && \
             iptables -w -I FORWARD 1 -m set --match-set xr-bench-blk src -j DROP")
        .context("installing the ipset rule (needs ipset)")?;
    let dir = std::env::temp_dir().join(format!("xdp-router-verdicts-{}", std::process::id()));
    let daemon = Daemon::start(&bin, &tb.rtr, &dir, &tb.names.rl, &tb.names.rw, false)?;
    tb.pin_napi_threads()?;
    let _echo = EchoServer::start(&tb.wan)?;
    prime(
        &mut tb,
        Some(&daemon),
        Family::Ipv4,
        flows,
        sc.nat(Family::Ipv4),
    )?;
    let spec = tb.spec(Path::Upload, Family::Ipv4, size, flows, true);
    let mut modes: Vec<ModeRuns> = std::iter::once(0)
        .chain(a.ages_ms.iter().copied())
        .map(|age_ms| ModeRuns {
            age_ms,
            pps: Vec::new(),
            delivered: 0,
            kernel_forwarded: 0,
            expired: 0,
        })
        .collect();
    eprintln!(
        "{} rounds of {} ms, 64 B UDP flat out over {flows} flows, S2, fast path on",
        a.rounds, a.trial_ms
    );
    for round in 0..a.rounds as usize {
        let n = modes.len();
        for i in 0..n {
            check_stop()?;
            let m = &mut modes[(i + round) % n];
            daemon.set_verdict_age(m.age_ms)?;
            let before = daemon.status()?;
            let t = tb.trial(Path::Upload, &spec, None, Duration::from_millis(a.trial_ms))?;
            let after = daemon.status()?;
            let expired = after
                .packets("kernel_verdict_expired")
                .saturating_sub(before.packets("kernel_verdict_expired"));
            eprintln!(
                "  round {round} verdict age {:>4} ms: {:>7.0} Kpps delivered, kernel forwarded \
                 {}, expired passes {expired}",
                m.age_ms,
                t.delivered_pps / 1e3,
                t.kernel_forwarded
            );
            m.pps.push(t.delivered_pps);
            m.delivered += t.delivered;
            m.kernel_forwarded += t.kernel_forwarded;
            m.expired += expired;
        }
    }
    daemon.set_verdict_age(500)?;
    let base = median(&modes[0].pps);
    println!(
        "\n=== verdict expiry cost: 64 B UDP flat out, {flows} flows, S2, fast path on, \
         {} rounds (medians)",
        a.rounds
    );
    println!(
        "{:<26} {:>12} {:>9} {:>16} {:>16}",
        "mode", "delivered", "ratio", "kernel forwarded", "expired passes"
    );
    for m in &modes {
        let name = if m.age_ms == 0 {
            "verdicts kept (age 0)".to_owned()
        } else {
            format!("verdict age {} ms", m.age_ms)
        };
        let share = if m.delivered == 0 {
            0.0
        } else {
            m.kernel_forwarded as f64 / m.delivered as f64
        };
        println!(
            "{name:<26} {:>8.0} Kpps {:>8.3}× {:>15.4}% {:>16}",
            median(&m.pps) / 1e3,
            if base > 0.0 {
                median(&m.pps) / base
            } else {
                0.0
            },
            share * 100.0,
            m.expired
        );
    }
    println!(
        "(kernel forwarded: share of the delivered packets the router's kernel forwarded, from \
         its ForwDatagrams; expired passes: packets the fast path handed to the kernel because \
         their direction's verdict had expired)"
    );
    daemon.stop()?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
