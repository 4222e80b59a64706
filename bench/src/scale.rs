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
//!   daemon starts: time until every one is offloaded, RSS, the kernel memory of the flow maps
//!   (`memlock` of the daemon's map fds), the daemon's CPU with no traffic (keep-alive passes);
//!   then the table is flushed and every flow must leave the maps (no leaked entries).
//!
//! - Churn: new connections per second through the router (short TCP connections and UDP
//!   exchanges, IPv4 and IPv6, data checked), stepped up until a step fails, with the daemon
//!   and with the kernel alone; after every step the kernel's flow maps are checked against
//!   conntrack (see [`churn`]).
//!
//! Two kinds of figure are checked. A *check* is correctness (every flow offloaded at all, none
//! left after `conntrack -F`, the maps in step with conntrack under churn, capacity limits
//! honoured): a failed check fails the command. A *target* is a time, a rate, a CPU share or a
//! memory size: it is printed as met or missed, and a missed target is a finding, never an
//! error: on a shared, noisy 2-core VM a timing must not decide whether the test command passes.
//! `--small` (50 k routes, 50 k flows, churn at 1,000/s for 3 s) runs in `cargo xtask test`.

use std::{
    collections::HashSet,
    fmt::Write as _,
    fs,
    io::Write as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
    process::Stdio,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use xdp_router_testbed::netns::Netns;

use crate::{
    Opts, churn,
    ctnl::{self, Conn, TCP, Tuple5, UDP},
    packet::Family,
    router::{self, Daemon, Scenario},
    run,
    testbed::{Names, Path as StreamPath, Testbed},
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

/// What a figure is compared with.
enum Bound {
    /// Shown only.
    None,
    /// Correctness: missing it fails the command.
    Check { goal: String, met: bool },
    /// A time, rate, CPU or memory target: reported, never an error.
    Target { goal: String, met: bool },
}

/// One printed figure and what it is compared with.
struct Figure {
    name: String,
    value: String,
    bound: Bound,
}

#[derive(Default)]
struct Report {
    figures: Vec<Figure>,
}

impl Report {
    fn push(&mut self, name: &str, value: String, bound: Bound) {
        match &bound {
            Bound::None => eprintln!("  {name}: {value}"),
            Bound::Check { goal, met } => eprintln!(
                "  {name}: {value} (check {goal}: {})",
                if *met { "passed" } else { "FAILED" }
            ),
            Bound::Target { goal, met } => eprintln!(
                "  {name}: {value} (target {goal}: {})",
                if *met { "met" } else { "missed" }
            ),
        }
        self.figures.push(Figure {
            name: name.into(),
            value,
            bound,
        });
    }

    fn add(&mut self, name: &str, value: String) {
        self.push(name, value, Bound::None);
    }

    /// A correctness check: the command fails when it is not met.
    fn check(&mut self, name: &str, value: String, goal: String, met: bool) {
        self.push(name, value, Bound::Check { goal, met });
    }

    /// A time, rate, CPU or memory target: reported, never an error.
    fn target(&mut self, name: &str, value: String, goal: String, met: bool) {
        self.push(name, value, Bound::Target { goal, met });
    }

    fn markdown(&self, command: &str) -> String {
        let mut s = format!(
            "# xdp-router scale benchmark\n\n`{command}`\n\n| figure | value | check or target |\n|---|---|---|\n"
        );
        for f in &self.figures {
            let bound = match &f.bound {
                Bound::None => String::new(),
                Bound::Check { goal, met: true } => format!("check {goal}: passed"),
                Bound::Check { goal, met: false } => format!("check {goal}: **FAILED**"),
                Bound::Target { goal, met: true } => format!("target {goal}: met"),
                Bound::Target { goal, met: false } => format!("target {goal}: **missed**"),
            };
            let _ = writeln!(s, "| {} | {} | {bound} |", f.name, f.value);
        }
        let (failed, missed) = (self.failed(), self.missed_targets());
        let _ = writeln!(
            s,
            "\n{failed} check(s) failed, {missed} target(s) missed (a missed target is a finding, \
             not an error)."
        );
        s
    }

    fn failed(&self) -> usize {
        self.figures
            .iter()
            .filter(|f| matches!(f.bound, Bound::Check { met: false, .. }))
            .count()
    }

    fn missed_targets(&self) -> usize {
        self.figures
            .iter()
            .filter(|f| matches!(f.bound, Bound::Target { met: false, .. }))
            .count()
    }
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

/// CPU seconds (user + system) and memory of one process, from /proc.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ProcSample {
    pub(crate) cpu_s: f64,
    rss_kib: u64,
    hwm_kib: u64,
}

pub(crate) fn sample(pid: u32) -> Result<ProcSample> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat (did xdp-routerd exit?)"))?;
    // Fields after the command name (which may contain spaces) start at ") ".
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name.
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let cpu_s = (ticks(11) + ticks(12)) as f64 / hz;
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

/// Share of one core `pid` used over `dur`, percent.
fn cpu_over(pid: u32, dur: Duration) -> Result<f64> {
    let a = sample(pid)?;
    thread::sleep(dur);
    let b = sample(pid)?;
    Ok(100.0 * (b.cpu_s - a.cpu_s) / dur.as_secs_f64())
}

/// Kernel memory of the daemon's BPF maps (sum of `memlock` over its map fds), bytes.
fn map_memlock(pid: u32) -> Result<u64> {
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

fn config(dir: &Path, tb: &Testbed, extra: &str) -> Result<PathBuf> {
    let path = dir.join("xdp-routerd.toml");
    fs::write(
        &path,
        format!(
            "control_socket = \"{}\"\nxdp_mode = \"native\"\nkeepalive_interval_ms = 2000\n\
             log_level = \"info\"\n{extra}\n\
             [[interface]]\nname = \"{}\"\nrole = \"lan\"\n\n\
             [[interface]]\nname = \"{}\"\nrole = \"wan\"\n",
            dir.join("control.sock").display(),
            tb.names.rl,
            tb.names.rw
        ),
    )?;
    Ok(path)
}

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

/// Waits until `pid` used less than 1 % of a core over 3 s in a row (a process starved by a
/// loaded machine can look quiet for a second); returns the time until that quiet stretch
/// began.
fn settle(pid: u32, limit: Duration) -> Result<Option<Duration>> {
    let started = Instant::now();
    let window = Duration::from_millis(500);
    let mut quiet = 0u32;
    while started.elapsed() < limit {
        if cpu_over(pid, window)? < 1.0 {
            quiet += 1;
            if quiet == 6 {
                return Ok(Some(started.elapsed().saturating_sub(window * 6)));
            }
        } else {
            quiet = 0;
        }
    }
    Ok(None)
}

/// An idle router: the daemon manages the testbed's two ports with no flows, no traffic and no
/// route changes, as a router spends most of its life. Its CPU share over `quiet` (after its
/// start-up work), then its system calls per second over `quiet` counted by `strace -c -f`
/// (run after the CPU figure: tracing slows the traced process), with the most frequent
/// calls named.
fn idle_part(
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

/// System calls of `pid` and all its threads over `dur`, by name, most frequent first
/// (`strace -c -f`; its summary is kept in `keep`).
fn count_syscalls(pid: u32, dur: Duration, keep: &Path) -> Result<Vec<(String, u64)>> {
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

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[expect(
    clippy::too_many_arguments,
    reason = "one call site, the run's parameters"
)]
fn routes_part(
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

/// A full flow map: `n` entries present at start, a capacity of 1,024 directions per family.
/// The connections that do not fit stay in the kernel, counted under `flow_table_full`, and
/// the log says so once (not once per connection).
fn capacity_part(tb: &Testbed, bin: &Path, out: &Path, n: u32, report: &mut Report) -> Result<()> {
    const CAPACITY: u64 = 1024;
    let dir = out.join("capacity");
    fs::create_dir_all(&dir)?;
    let created = tb.rtr.enter(|| ctnl::create((0..n).map(conn)))?;
    if created.failed > 0 {
        bail!("ctnetlink refused {} of {n} entries", created.failed);
    }
    let cfg = config(&dir, tb, &format!("flow_capacity = {CAPACITY}\n"))?;
    let daemon = Daemon::start_waiting(bin, &tb.rtr, &cfg, &dir, Duration::from_secs(300))?;
    let v6 = u64::from(n / 5);
    let v4 = u64::from(n) - v6;
    // Each family's map holds CAPACITY / 2 connections; the others stay in the kernel.
    let fit = CAPACITY / 2 * 2;
    let st = status_patiently(&daemon)?;
    let json = daemon.status_json()?;
    let full = json["conntrack"]["skipped"]["flow_table_full"]
        .as_u64()
        .unwrap_or(0);
    let offloaded = json["conntrack"]["offloaded"].as_u64().unwrap_or(0);
    let warnings = daemon.log_text().matches("flow map full").count();
    let expect_full = v4.saturating_sub(CAPACITY / 2) + v6.saturating_sub(CAPACITY / 2);
    report.check(
        &format!("{n} entries, flow_capacity {CAPACITY}: offloaded / flow_table_full / log lines"),
        format!(
            "{offloaded} / {full} / {warnings} (maps: {} + {} directions)",
            st.flows_v4, st.flows_v6
        ),
        format!("{fit} / {expect_full} / 1"),
        offloaded == fit
            && full == expect_full
            && warnings == 1
            && st.flows_v4 == CAPACITY
            && st.flows_v6 == CAPACITY,
    );
    daemon.stop()
}

/// `status`, asked again while the daemon is too busy to answer within the client's timeout
/// (a million conntrack events take a while).
fn status_patiently(daemon: &Daemon) -> Result<router::Status> {
    let started = Instant::now();
    loop {
        match daemon.status() {
            Ok(st) => return Ok(st),
            Err(e) if started.elapsed() > Duration::from_secs(300) => return Err(e),
            Err(_) => thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// The `i`-th benchmark connection: LAN host → WAN host, masqueraded IPv4 or routed IPv6,
/// alternating TCP and UDP. Unique per `i` below 250 × 55,000.
fn conn(i: u32) -> Conn {
    let (host, port) = ((i % 250) as u8 + 2, 10_000 + (i / 250) as u16);
    let proto = if i.is_multiple_of(2) { TCP } else { UDP };
    let dport = if proto == TCP { 443 } else { 4433 };
    if i % 5 == 4 {
        let lan = IpAddr::V6(Ipv6Addr::new(0xfd00, 1, 0, 0, 0, 0, 0, u16::from(host)));
        let wan = IpAddr::V6(Ipv6Addr::new(0xfd00, 2, 0, 0, 0, 0, 0, u16::from(host)));
        let orig = Tuple5 {
            src: lan,
            dst: wan,
            proto,
            sport: port,
            dport,
        };
        return Conn {
            orig,
            reply: Tuple5 {
                src: wan,
                dst: lan,
                proto,
                sport: dport,
                dport: port,
            },
            timeout: 3600,
        };
    }
    let lan = IpAddr::V4(Ipv4Addr::new(10, 0, 1, host));
    let wan = IpAddr::V4(Ipv4Addr::new(10, 0, 2, host));
    Conn {
        orig: Tuple5 {
            src: lan,
            dst: wan,
            proto,
            sport: port,
            dport,
        },
        // Masqueraded to the router's WAN address, source port kept.
        reply: Tuple5 {
            src: wan,
            dst: IpAddr::V4(Ipv4Addr::new(10, 0, 2, 1)),
            proto,
            sport: dport,
            dport: port,
        },
        timeout: 3600,
    }
}

/// Raises the (global) `nf_conntrack_max` to at least `n` for the run; restores it on drop.
struct ConntrackMax(Option<String>);

impl ConntrackMax {
    const PATH: &'static str = "/proc/sys/net/netfilter/nf_conntrack_max";

    fn at_least(n: u64) -> Result<ConntrackMax> {
        let old = fs::read_to_string(Self::PATH)
            .context("reading nf_conntrack_max (is nf_conntrack loaded?)")?;
        if old.trim().parse::<u64>().unwrap_or(0) >= n {
            return Ok(ConntrackMax(None));
        }
        fs::write(Self::PATH, n.to_string()).context("raising nf_conntrack_max")?;
        Ok(ConntrackMax(Some(old)))
    }
}

impl Drop for ConntrackMax {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            let _ = fs::write(Self::PATH, old.trim());
        }
    }
}

fn conntrack_count(ns: &Netns) -> Result<u64> {
    let out = ns.run("conntrack", &["-C"])?;
    out.trim()
        .parse()
        .with_context(|| format!("conntrack -C said {out:?}"))
}

fn flows_part(
    tb: &Testbed,
    bin: &Path,
    out: &Path,
    n: u32,
    quiet: Duration,
    small: bool,
    report: &mut Report,
) -> Result<()> {
    let dir = out.join("flows");
    fs::create_dir_all(&dir)?;
    let _max = ConntrackMax::at_least(u64::from(n) + u64::from(n) / 4)?;
    let started = Instant::now();
    let created = tb.rtr.enter(|| ctnl::create((0..n).map(conn)))?;
    if created.failed > 0 {
        bail!(
            "ctnetlink refused {} of {n} entries (first error: {})",
            created.failed,
            std::io::Error::from_raw_os_error(created.first_error.unwrap_or(0))
        );
    }
    let present = conntrack_count(&tb.rtr)?;
    report.add(
        "conntrack entries created (ctnetlink)",
        format!(
            "{} in {:.1} s; conntrack -C: {present}",
            created.created,
            started.elapsed().as_secs_f64()
        ),
    );
    let v6 = u64::from(n / 5);
    let v4 = u64::from(n) - v6;
    // No flow_capacity: sized from nf_conntrack_max, as a user's daemon would be.
    let cfg = config(&dir, tb, "")?;
    let t0 = Instant::now();
    let daemon = Daemon::start_waiting(bin, &tb.rtr, &cfg, &dir, Duration::from_secs(600))?;
    let pid = daemon.pid();
    let deadline = Duration::from_secs(if small { 120 } else { 600 });
    let offload_s = loop {
        // An error is a busy daemon (see below): asked again.
        let st = daemon.status().unwrap_or_default();
        if st.flows_v4 >= 2 * v4 && st.flows_v6 >= 2 * v6 {
            break Some(t0.elapsed());
        }
        if t0.elapsed() > deadline {
            report.add(
                "offloaded at the deadline",
                format!(
                    "{} IPv4 + {} IPv6 directions of {} + {}",
                    st.flows_v4,
                    st.flows_v6,
                    2 * v4,
                    2 * v6
                ),
            );
            break None;
        }
        thread::sleep(Duration::from_millis(200));
    };
    let goal_s = if small { 30.0 } else { 10.0 };
    let took = offload_s.map_or(format!("not within {deadline:?}"), |d| {
        format!("{:.1} s", d.as_secs_f64())
    });
    report.check(
        &format!("all {n} entries offloaded"),
        took.clone(),
        format!("within {} s", deadline.as_secs()),
        offload_s.is_some(),
    );
    report.target(
        &format!("all {n} entries offloaded after daemon start"),
        took,
        format!("≤ {goal_s} s"),
        offload_s.is_some_and(|d| d.as_secs_f64() <= goal_s),
    );
    // Let the start-up work (marking every TCP connection liberal, one ctnetlink update each)
    // finish before measuring the quiet daemon.
    let busy = Instant::now();
    let settle_limit = Duration::from_secs(if small { 60 } else { 600 });
    let settled = settle(pid, settle_limit)?;
    report.add(
        "start-up work done (daemon quiet) after offload",
        settled.map_or(
            format!("still busy after {} s", settle_limit.as_secs()),
            |_| format!("{:.1} s", busy.elapsed().as_secs_f64()),
        ),
    );
    let idle_cpu = cpu_over(pid, quiet)?;
    let mem = sample(pid)?;
    let maps = map_memlock(pid)?;
    report.target(
        "daemon CPU with the flows and no traffic (keep-alive)",
        format!("{idle_cpu:.2} % of a core over {} s", quiet.as_secs()),
        if small { "< 3 %" } else { "< 10 %" }.into(),
        idle_cpu < if small { 3.0 } else { 10.0 },
    );
    let rss_mib = mem.rss_kib as f64 / 1024.0;
    let rss_goal = if small { 64.0 } else { 256.0 };
    report.target(
        "daemon RSS with the flows",
        format!(
            "{rss_mib:.1} MiB (peak {:.1} MiB; {:.0} B per connection above a 0-flow daemon's ~8 MiB)",
            mem.hwm_kib as f64 / 1024.0,
            (rss_mib - 8.0).max(0.0) * 1024.0 * 1024.0 / f64::from(n)
        ),
        format!("< {rss_goal} MiB"),
        rss_mib < rss_goal,
    );
    let capacity = status_patiently(&daemon)?.capacity;
    report.add(
        "BPF map memory (memlock of the daemon's maps)",
        format!(
            "{:.1} MiB with the flows: flow capacity {capacity} directions per family \
             (2 × nf_conntrack_max), {:.0} B per direction of capacity over all the maps",
            maps as f64 / (1024.0 * 1024.0),
            maps as f64 / capacity.max(1) as f64
        ),
    );
    // Conntrack forgets everything: so must the maps.
    let flushed = Instant::now();
    router::flush_conntrack(&tb.rtr)?;
    let leaked = loop {
        // The daemon may be too busy with a million DESTROY events to answer within the
        // client's timeout: that is not a leak, ask again.
        let left = daemon.status().ok().map(|st| st.flows_v4 + st.flows_v6);
        if left == Some(0) || flushed.elapsed() > Duration::from_secs(300) {
            break left;
        }
        thread::sleep(Duration::from_millis(200));
    };
    // The kernel frees deleted entries after an RCU grace period.
    thread::sleep(Duration::from_secs(2));
    let maps_empty = map_memlock(pid)?;
    report.add(
        "BPF map memory with no flows (after conntrack -F)",
        format!(
            "{:.1} MiB; {:.0} B of map memory per offloaded connection (two directions) above it",
            maps_empty as f64 / (1024.0 * 1024.0),
            maps.saturating_sub(maps_empty) as f64 / f64::from(n)
        ),
    );
    report.check(
        "flow entries left after conntrack -F",
        match leaked {
            Some(n) => format!("{n} ({:.1} s to empty)", flushed.elapsed().as_secs_f64()),
            None => "no status answer within 300 s".into(),
        },
        "0".into(),
        leaked == Some(0),
    );
    daemon.stop()
}

/// Connection churn (see [`churn`]): the rate ladder with `xdp-routerd` running (the maps
/// checked against conntrack after every step), then the same ladder with the kernel alone
/// (no daemon), on the home router's firewall.
fn churn_part(
    tb: &Testbed,
    bin: &Path,
    out: &Path,
    rates: &[u32],
    secs: Duration,
    small: bool,
    report: &mut Report,
) -> Result<()> {
    let dir = out.join("churn");
    fs::create_dir_all(&dir)?;
    router::apply_home_router(&tb.rtr, &tb.names.rl, &tb.names.rw)?;
    churn::prepare_hosts(tb)?;
    let servers = churn::Servers::start(&tb.wan)?;
    let cfg = config(&dir, tb, "")?;
    // Maps sized from nf_conntrack_max take a while to create on a loaded machine.
    let daemon = Daemon::start_waiting(bin, &tb.rtr, &cfg, &dir, Duration::from_secs(120))?;
    // The daemon stays on the generator CPU, as in every other benchmark: on the router CPU it
    // made the router drop 2–4 times as many frames at 5,000/s (alternating runs, 09:44 UTC),
    // while its own CPU per step is reported.
    let fast = churn::ladder(tb, &servers, Some(&daemon), rates, secs, &dir)?;
    daemon.stop()?;
    router::flush_conntrack(&tb.rtr)?;
    let kernel = churn::ladder(tb, &servers, None, rates, secs, &dir)?;
    drop(servers);
    let best = |steps: &[churn::Step]| {
        steps
            .iter()
            .filter(|s| s.passed())
            .map(|s| s.rate)
            .max()
            .unwrap_or(0)
    };
    for s in &fast {
        let k = kernel.iter().find(|k| k.rate == s.rate);
        report.add(
            &format!("churn {}/s requested (mixed TCP/UDP, IPv4/IPv6)", s.rate),
            format!(
                "fast path: {:.0}/s achieved, {} of {} ok, failures {}, {} offloaded, {} \
                 fast-path packets, flow entries stale {} / missing {}; kernel alone: {}",
                s.achieved,
                s.ok,
                s.started,
                s.failures(),
                s.offloaded.unwrap_or(0),
                s.fast_packets.unwrap_or(0),
                s.stale.unwrap_or(0),
                s.missing.unwrap_or(0),
                k.map_or("not run (a lower rate failed)".into(), |k| format!(
                    "{:.0}/s achieved, {} of {} ok, failures {}",
                    k.achieved,
                    k.ok,
                    k.started,
                    k.failures()
                )),
            ),
        );
    }
    let (bf, bk) = (best(&fast), best(&kernel));
    // The maps must be in step at every rate run, whether or not the connections completed.
    let leaked: u64 = fast.iter().map(|s| s.stale.unwrap_or(0)).sum();
    let missing: u64 = fast.iter().map(|s| s.missing.unwrap_or(0)).sum();
    report.check(
        "churn: flow entries stale / missing against conntrack after the steps",
        format!("{leaked} / {missing}"),
        "0 / 0".into(),
        leaked == 0 && missing == 0,
    );
    let offloaded: u64 = fast.iter().map(|s| s.offloaded.unwrap_or(0)).sum();
    let fast_packets: u64 = fast.iter().map(|s| s.fast_packets.unwrap_or(0)).sum();
    report.check(
        "churn: connections offloaded / packets the fast path forwarded, fast-path steps",
        format!("{offloaded} / {fast_packets}"),
        "> 0 / > 0 (the fast path took part)".into(),
        offloaded > 0 && fast_packets > 0,
    );
    let top = rates.iter().copied().max().unwrap_or(0);
    let limit = if bk == 0 {
        " (no step passed with the kernel alone either: the generator and the hosts' stacks \
         did not sustain the first rate on this machine)"
            .to_owned()
    } else if bk < top && bf >= bk {
        format!(
            " (the kernel alone also failed above {bk}/s: the generator and the hosts' stacks \
             on one core are the limit here, not the router)"
        )
    } else {
        String::new()
    };
    let goal = if small { 1000 } else { 10_000 }.min(top);
    report.target(
        "churn: highest rate with every connection ok, fast path / kernel alone",
        format!("{bf}/s / {bk}/s{limit}"),
        format!("fast path ≥ {goal}/s"),
        bf >= goal,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
