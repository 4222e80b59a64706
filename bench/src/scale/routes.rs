//! The scale benchmark's routes part: a BGP-sized table loaded into and withdrawn from the
//! router's FIB while the daemon runs (its CPU, settling time and RSS), and the fast path's
//! packet rate with the full table against a 10-route table.

use std::{
    collections::HashSet,
    fs,
    io::Write as _,
    net::{Ipv4Addr, Ipv6Addr},
    path::Path,
    process::Stdio,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use xdp_router_testbed::netns::Netns;

use super::{
    config::config,
    proc::{cpu_over, sample, settle},
    report::Report,
};
use crate::{
    packet::Family,
    report::median,
    router::Daemon,
    run,
    testbed::{Path as StreamPath, Testbed},
};

/// A BGP-like table: IPv4 prefixes of /16…/24 (most /24) and IPv6 /32…/48 spread over the
/// unicast space by a fixed pseudo-random sequence, all via the WAN host. Skips 10/8 (the
/// testbed's) and duplicates.
fn table(v4: u32, v6: u32) -> (Vec<String>, Vec<String>) {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        // xorshift64*
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut seen = HashSet::new();
    let mut out4 = Vec::with_capacity(v4 as usize);
    while out4.len() < v4 as usize {
        let r = next();
        let len = [24u32, 24, 24, 24, 23, 22, 20, 16][(r >> 61) as usize];
        let addr = ((r >> 8) as u32) & (u32::MAX << (32 - len));
        let first = addr >> 24;
        if !(1..224).contains(&first) || first == 10 || first == 127 {
            continue;
        }
        if seen.insert((addr, len)) {
            out4.push(format!("{}/{len}", Ipv4Addr::from(addr)));
        }
    }
    let mut out6 = Vec::with_capacity(v6 as usize);
    let mut seen6 = HashSet::new();
    while out6.len() < v6 as usize {
        let r = next();
        let len = [48u32, 48, 48, 48, 44, 40, 36, 32][(r >> 61) as usize];
        // 2000::/3, then 45 random bits, masked to the length.
        let top = (0x2000u128 << 112) | (u128::from(r & ((1 << 45) - 1)) << 80);
        let addr = top & (u128::MAX << (128 - len));
        if seen6.insert((addr, len)) {
            out6.push(format!("{}/{len}", Ipv6Addr::from(addr)));
        }
    }
    (out4, out6)
}

/// Runs `ip -batch -` in `ns` with `lines`; returns how long it took.
fn ip_batch(ns: &Netns, lines: impl Iterator<Item = String>) -> Result<Duration> {
    let started = Instant::now();
    let mut child = ns
        .command("ip")
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting ip -batch")?;
    {
        let mut stdin = std::io::BufWriter::new(child.stdin.take().context("ip stdin")?);
        for l in lines {
            writeln!(stdin, "{l}")?;
        }
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "ip -batch failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .next()
                .unwrap_or("")
        );
    }
    Ok(started.elapsed())
}

/// Routing table of the full table (and the testbed's WAN subnet).
const FULL_TABLE: u32 = 100;
/// Routing table of 10 routes (and the testbed's WAN subnet).
const SMALL_TABLE: u32 = 101;

/// Makes the router look up `table` first (`ip rule` at preference 100). The kernel and the
/// fast path (whose `bpf_fib_lookup` goes through the rules) then both route by it.
fn use_table(rtr: &Netns, table: u32) -> Result<()> {
    rtr.sh(&format!(
        "ip rule del pref 100 2>/dev/null; ip -6 rule del pref 100 2>/dev/null; \
         ip rule add pref 100 lookup {table} && ip -6 rule add pref 100 lookup {table}"
    ))?;
    Ok(())
}

/// Flat-out fast-path upload rates (64-byte IPv4 frames) with the 10-route and the full table,
/// interleaved round by round (the machine's load changes between rounds, not within one).
fn compare_tables(tb: &mut Testbed, rounds: usize) -> Result<(Vec<f64>, Vec<f64>)> {
    let spec = tb.spec(StreamPath::Upload, Family::Ipv4, 64, 64, false);
    let (mut small, mut full) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // Alternate which table goes first.
        let order = if round % 2 == 0 {
            [SMALL_TABLE, FULL_TABLE]
        } else {
            [FULL_TABLE, SMALL_TABLE]
        };
        for table in order {
            run::check_stop()?;
            use_table(&tb.rtr, table)?;
            // A short warm-up first: caches are cold after the switch.
            tb.trial(StreamPath::Upload, &spec, None, Duration::from_millis(100))?;
            let t = tb.trial(StreamPath::Upload, &spec, None, Duration::from_millis(400))?;
            // Packets the kernel forwarded did not take the fast path: such a round measures
            // something else.
            if t.kernel_forwarded * 20 > t.delivered {
                bail!(
                    "table {table}: the kernel forwarded {} of {} delivered frames (the fast \
                     path should carry them all)",
                    t.kernel_forwarded,
                    t.delivered
                );
            }
            if table == FULL_TABLE {
                full.push(t.delivered_pps);
            } else {
                small.push(t.delivered_pps);
            }
        }
    }
    Ok((small, full))
}

/// Whether the rounds agree well enough for their median to mean something: without the
/// highest and the lowest, every round within 25 % of the median.
fn steady(v: &[f64]) -> bool {
    let m = median(v);
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let inner = v.get(1..v.len().saturating_sub(1)).unwrap_or(&[]);
    m > 0.0 && inner.iter().all(|x| (x - m).abs() <= 0.25 * m)
}

#[expect(
    clippy::too_many_arguments,
    reason = "one call site, the run's parameters"
)]
pub(super) fn routes_part(
    tb: &mut Testbed,
    bin: &Path,
    out: &Path,
    v4: u32,
    v6: u32,
    quiet: Duration,
    small: bool,
    report: &mut Report,
) -> Result<()> {
    let dir = out.join("routes");
    fs::create_dir_all(&dir)?;
    // Every packet takes a full bpf_fib_lookup: the table's size shows in each one.
    let cfg = config(&dir, tb, "fib_cache_ms = 0\n")?;
    let daemon = Daemon::start_with_config(bin, &tb.rtr, &cfg, &dir)?;
    let pid = daemon.pid();
    run::prime(tb, Some(&daemon), Family::Ipv4, 64, false)?;
    // Both tables hold the testbed's WAN subnet, so the benchmark stream is routed by either.
    let rw = tb.names.rw.clone();
    tb.rtr.sh(&format!(
        "ip route add 10.0.2.0/24 dev {rw} table {FULL_TABLE} && \
         ip -6 route add fd00:2::/64 dev {rw} table {FULL_TABLE} && \
         ip route add 10.0.2.0/24 dev {rw} table {SMALL_TABLE} && \
         ip -6 route add fd00:2::/64 dev {rw} table {SMALL_TABLE} && \
         for i in 1 2 3 4 5 6 7 8 9; do \
         ip route add 172.16.$i.0/24 via 10.0.2.2 table {SMALL_TABLE} || exit 1; done"
    ))?;
    use_table(&tb.rtr, SMALL_TABLE)?;
    let (t4, t6) = table(v4, v6);
    let base = sample(pid)?;
    let add = t4
        .iter()
        .map(|p| format!("route add {p} via 10.0.2.2 table {FULL_TABLE}"))
        .chain(
            t6.iter()
                .map(|p| format!("route add {p} via fd00:2::2 table {FULL_TABLE}")),
        );
    let took = ip_batch(&tb.rtr, add)?;
    let after_add = sample(pid)?;
    let settled = settle(pid, Duration::from_secs(60))?;
    let loaded = sample(pid)?;
    report.add(
        "routes loaded",
        format!(
            "{} IPv4 + {} IPv6 in {:.1} s (ip -batch)",
            t4.len(),
            t6.len(),
            took.as_secs_f64()
        ),
    );
    let add_cpu = 100.0 * (after_add.cpu_s - base.cpu_s) / took.as_secs_f64();
    report.add(
        "daemon CPU while routes are added",
        format!(
            "{add_cpu:.1} % of a core ({:.2} s CPU)",
            after_add.cpu_s - base.cpu_s
        ),
    );
    let settle_goal = Duration::from_secs(10);
    match settled {
        Some(d) => report.target(
            "daemon settles after the last route added",
            format!("{:.1} s", d.as_secs_f64()),
            format!("≤ {} s", settle_goal.as_secs()),
            d <= settle_goal,
        ),
        None => report.target(
            "daemon settles after the last route added",
            "not within 60 s".into(),
            format!("≤ {} s", settle_goal.as_secs()),
            false,
        ),
    }
    let quiet_cpu = cpu_over(pid, quiet)?;
    report.target(
        "daemon CPU, full table, routes quiet",
        format!("{quiet_cpu:.2} % of a core"),
        "< 1 %".into(),
        quiet_cpu < 1.0,
    );
    // The kernel frees the replaced FIB nodes after the load (RCU): let that pass first.
    thread::sleep(Duration::from_secs(5));
    let (pps_small, pps_full) = compare_tables(tb, if small { 3 } else { 10 })?;
    use_table(&tb.rtr, SMALL_TABLE)?;
    let del = t4
        .iter()
        .map(|p| format!("route del {p} via 10.0.2.2 table {FULL_TABLE}"))
        .chain(
            t6.iter()
                .map(|p| format!("route del {p} via fd00:2::2 table {FULL_TABLE}")),
        );
    let before_del = sample(pid)?;
    let took_del = ip_batch(&tb.rtr, del)?;
    let after_del = sample(pid)?;
    let settled_del = settle(pid, Duration::from_secs(60))?;
    report.add(
        "daemon CPU while routes are withdrawn",
        format!(
            "{:.1} % of a core over {:.1} s; settled {}",
            100.0 * (after_del.cpu_s - before_del.cpu_s) / took_del.as_secs_f64(),
            took_del.as_secs_f64(),
            settled_del.map_or("not within 60 s".into(), |d| format!(
                "{:.1} s after",
                d.as_secs_f64()
            ))
        ),
    );
    let peak = sample(pid)?;
    report.add(
        "daemon RSS, full table",
        format!(
            "{:.1} MiB (peak {:.1} MiB)",
            loaded.rss_kib as f64 / 1024.0,
            peak.hwm_kib as f64 / 1024.0
        ),
    );
    let (m_small, m_full) = (median(&pps_small), median(&pps_full));
    // Each round's two trials ran back to back: their ratio cancels the machine's drift
    // between rounds.
    // A round in which either trial ran below half its table's median was disturbed (on a
    // shared VM the generator is sometimes starved for a whole trial): it is left out.
    let ratios: Vec<f64> = pps_full
        .iter()
        .zip(&pps_small)
        .filter(|(f, s)| **f >= m_full / 2.0 && **s >= m_small / 2.0)
        .map(|(f, s)| f / s.max(1.0))
        .collect();
    let ratio = median(&ratios);
    let kpps = |v: &[f64]| {
        v.iter()
            .map(|p| format!("{:.0}", p / 1e3))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let name = "fast-path rate, full table / 10 routes (64 B IPv4 flat out, FIB cache off)";
    let rounds = format!(
        "rounds, Kpps: full {}; 10 routes {}",
        kpps(&pps_full),
        kpps(&pps_small)
    );
    if ratios.len() * 2 < pps_full.len() || !steady(&ratios) {
        // A shared machine's load changed under the rounds: no ratio is printed then.
        let value = format!(
            "not measured: the rounds' ratios disagree by more than 25 % or half the rounds \
             were disturbed (machine loaded?); {rounds}"
        );
        if small {
            report.add(name, value);
        } else {
            report.target(name, value, "≥ 80 %".into(), false);
        }
    } else if small {
        // 50 k routes do not slow a lookup measurably: the figure is shown, not checked.
        report.add(
            name,
            format!(
                "{:.0} % (median of {} rounds' ratios; medians {:.0} / {:.0} Kpps; {rounds})",
                100.0 * ratio,
                ratios.len(),
                m_full / 1e3,
                m_small / 1e3
            ),
        );
    } else {
        report.target(
            name,
            format!(
                "{:.0} % (median of {} rounds' ratios; medians {:.0} / {:.0} Kpps; {rounds})",
                100.0 * ratio,
                ratios.len(),
                m_full / 1e3,
                m_small / 1e3
            ),
            "≥ 80 %".into(),
            ratio >= 0.8,
        );
    }
    tb.rtr
        .sh("ip rule del pref 100; ip -6 rule del pref 100; true")?;
    daemon.stop()
}
