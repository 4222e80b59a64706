//! `cargo xtask bench responsive`: does the daemon keep answering while it is busy?
//!
//! A router namespace with a LAN and a WAN veth runs `xdp-routerd` with metrics on. The daemon
//! is first measured nearly idle (a hundred connections), then loaded: `--conns` established,
//! masqueraded connections are created in conntrack (with the `conntrack` tool, no sockets),
//! then, while `/metrics` and `xdp-routerd status` are timed, `--routes` /32 routes are added and
//! deleted in a loop (`ip -batch`, a BGP session reset every few seconds) and `--churn`
//! connections per second are created and deleted. Reported: p50/p99/max latency of both, how
//! many of the connections were offloaded, the load that was actually applied, and how long
//! the daemon took to exit on a SIGTERM sent at the end of the loaded phase, load running. With
//! `--baseline BIN` another daemon build (e.g. the previous main) runs the same, right before,
//! for a side-by-side comparison on the same (noisy, shared) machine.

use std::{
    fmt::Write as _,
    fs,
    io::{BufRead as _, BufReader, Write as _},
    net::Ipv4Addr,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use xdp_router_testbed::netns::{self, Netns};

use crate::{
    Opts,
    ctnl::{self, Conn, Writer},
    router::{self, Daemon},
    scrape::{self, METRICS_ADDR},
};

/// Options of `responsive`.
#[derive(Args, Clone, Debug)]
pub struct ResponsiveArgs {
    /// Established connections in conntrack during the loaded phase.
    #[arg(long, default_value_t = 100_000)]
    conns: u32,
    /// Routes added then deleted, over and over, during the loaded phase.
    #[arg(long, default_value_t = 100_000)]
    routes: u32,
    /// Connections created and deleted per second during the loaded phase.
    #[arg(long, default_value_t = 2_000)]
    churn: u32,
    /// Seconds of timed requests in the loaded phase (the idle phase takes a quarter).
    #[arg(long, default_value_t = 30)]
    secs: u64,
    /// Another xdp-routerd build to measure first, the same way (e.g. the previous main).
    #[arg(long)]
    baseline: Option<PathBuf>,
}

/// The target: p99 of both requests under load.
const TARGET_P99: Duration = Duration::from_millis(50);
const NAT: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
const WAN_GW: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 2);
/// A request that takes longer than this counts as this long (and is reported as timed out).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs the benchmark for the baseline (if any) and the daemon under test; prints the report.
pub fn run(o: &Opts, a: &ResponsiveArgs) -> Result<()> {
    crate::run::prepare()?;
    let bin = router::locate_daemon(o.daemon.as_deref(), o.daemon.is_none())?;
    let out = o.out.clone().unwrap_or_else(|| {
        PathBuf::from(format!(
            "target/bench/responsive-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        ))
    });
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut results = Vec::new();
    let mut builds: Vec<(&str, PathBuf)> = Vec::new();
    if let Some(b) = &a.baseline {
        builds.push(("baseline", b.clone()));
    }
    builds.push(("this build", bin));
    for (label, bin) in &builds {
        eprintln!("== {label}: {}", bin.display());
        let r = measure(bin, a, &out.join(label.replace(' ', "-")))
            .with_context(|| format!("{label} ({})", bin.display()))?;
        results.push((*label, bin.clone(), r));
        crate::run::check_stop()?;
    }
    let report = render(a, &results);
    fs::write(out.join("responsive.md"), &report)?;
    print!("{report}");
    eprintln!("written to {}", out.join("responsive.md").display());
    Ok(())
}

/// Latencies of one kind of request in one phase.
#[derive(Default, Debug)]
struct Samples {
    ms: Vec<f64>,
    failed: u64,
}

impl Samples {
    fn pct(&self, p: usize) -> Option<f64> {
        let mut v = self.ms.clone();
        v.sort_by(f64::total_cmp);
        (!v.is_empty()).then(|| v[(v.len() * p / 100).min(v.len() - 1)])
    }
}

#[derive(Debug, Default)]
struct Phase {
    metrics: Samples,
    status: Samples,
}

#[derive(Debug, Default)]
struct Measured {
    idle: Phase,
    loaded: Phase,
    /// Connections offloaded when the loaded phase started, and how long after creating them.
    offloaded: u64,
    total: u64,
    offload_secs: f64,
    /// Applied load: route changes and connections created + deleted, per second.
    routes_per_sec: f64,
    conns_per_sec: f64,
    loaded_secs: f64,
    /// From SIGTERM, sent at the end of the loaded phase with the load still running, until
    /// the daemon had exited.
    exit: String,
}

fn measure(bin: &Path, a: &ResponsiveArgs, dir: &Path) -> Result<Measured> {
    let pid = std::process::id();
    let rtr = Netns::create(&format!("xr-bench-{pid}-resp-r"))?;
    let peer = Netns::create(&format!("xr-bench-{pid}-resp-p"))?;
    rtr.sh(&format!(
        "ip link add rl type veth peer name pl netns {p} && \
         ip link add rw type veth peer name pw netns {p} && \
         ip addr add 10.0.1.1/16 dev rl && ip addr add {NAT}/24 dev rw && \
         ip link set rl up && ip link set rw up && \
         ip route add default via {WAN_GW} && \
         sysctl -qw net.ipv4.ip_forward=1",
        p = peer.name()
    ))?;
    peer.sh("ip link set pl up && ip link set pw up")?;
    fs::create_dir_all(dir)?;
    let config = dir.join("xdp-routerd.toml");
    let capacity = (2 * (a.conns + 4 * a.churn + 1000)).next_power_of_two();
    fs::write(
        &config,
        format!(
            "control_socket = \"{}\"\nxdp_mode = \"native\"\nflow_capacity = {capacity}\n\
             metrics_listen = \"{METRICS_ADDR}\"\nlog_level = \"info\"\n\n\
             [[interface]]\nname = \"rl\"\nrole = \"lan\"\n\n\
             [[interface]]\nname = \"rw\"\nrole = \"wan\"\n",
            dir.join("control.sock").display()
        ),
    )?;
    let daemon = Daemon::start_with_config(bin, &rtr, &config, dir)?;
    let mut m = Measured::default();

    // Idle: a hundred connections, nothing changing.
    insert(&rtr, conns(0, 100, 1))?;
    let idle = Duration::from_secs((a.secs / 4).max(3));
    let socket = dir.join("control.sock");
    m.idle = timed(&rtr, &socket, idle)?;
    crate::run::check_stop()?;

    // Loaded: create the connections and wait (bounded) until the daemon offloaded them.
    eprintln!("creating {} connections", a.conns);
    let started = Instant::now();
    insert(&rtr, conns(100, a.conns, 1))?;
    let total = u64::from(a.conns) + 100;
    m.total = total;
    let want = total * 99 / 100;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let st = daemon.status();
        if let Ok(st) = &st {
            // Two flow directions per connection.
            m.offloaded = st.flows_v4 / 2;
        }
        if m.offloaded >= want || Instant::now() > deadline || crate::run::stopped() {
            break;
        }
        thread::sleep(Duration::from_millis(250));
    }
    m.offload_secs = started.elapsed().as_secs_f64();
    // For the record (skipped connections by reason, conntrack sync counters).
    if let Ok(text) = daemon.status_text() {
        let _ = fs::write(dir.join("status-after-offload.txt"), text);
    }
    eprintln!(
        "{} of {} connections offloaded after {:.1} s",
        m.offloaded, total, m.offload_secs
    );
    crate::run::check_stop()?;

    let stop = Arc::new(AtomicBool::new(false));
    let route_changes = Arc::new(AtomicU64::new(0));
    let conn_changes = Arc::new(AtomicU64::new(0));
    let load_started = Instant::now();
    let (m_loaded, stopped, flapper, churner) = thread::scope(|s| {
        let flapper = s.spawn(|| flap_routes(&rtr, a.routes, &stop, &route_changes));
        let churner = s.spawn(|| churn_conns(&rtr, a.churn, &stop, &conn_changes));
        // Let both loads get going before timing.
        thread::sleep(Duration::from_secs(2));
        let r = timed(&rtr, &socket, Duration::from_secs(a.secs));
        // SIGTERM while the load still runs: how long until the daemon has detached and exited.
        let sigterm = Instant::now();
        let stopped = daemon.stop().map(|()| sigterm.elapsed());
        stop.store(true, Ordering::Relaxed);
        (r, stopped, flapper.join(), churner.join())
    });
    let secs = load_started.elapsed().as_secs_f64();
    m.loaded = m_loaded?;
    flapper.map_err(|_| anyhow::anyhow!("route flapper panicked"))??;
    churner.map_err(|_| anyhow::anyhow!("connection churner panicked"))??;
    m.loaded_secs = secs;
    m.routes_per_sec = route_changes.load(Ordering::Relaxed) as f64 / secs;
    m.conns_per_sec = conn_changes.load(Ordering::Relaxed) as f64 / secs;
    m.exit = match stopped {
        Ok(d) => format!("{:.2} s", d.as_secs_f64()),
        // Killed after 5 s, or exited with an error: said in the table, not fatal to the run.
        Err(e) => format!("failed: {e:#}"),
    };
    drop(peer);
    drop(rtr);
    Ok(m)
}

/// `n` connections numbered from `first` (unique tuples): LAN hosts in 10.0.1-2.x, remote hosts
/// spread over 100.64.0.0/10 (`spread` = 1) or 198.18.0.0/15 (churn), port 443.
fn conns(first: u32, n: u32, spread: u8) -> Vec<Conn> {
    (first..first + n)
        .map(|i| {
            // 500 LAN hosts, each with its own source ports.
            let host = i % 500;
            let src = Ipv4Addr::new(10, 0, 1 + (host / 250) as u8, (host % 250) as u8 + 2);
            let sport = 1024 + (i / 500 % 60_000) as u16;
            let dst = if spread == 1 {
                Ipv4Addr::from(u32::from(Ipv4Addr::new(100, 64, 0, 0)) + i % 65_000)
            } else {
                Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + i % 60_000)
            };
            Conn::masqueraded_tcp(src, sport, dst, 443, NAT)
        })
        .collect()
}

/// Adds then deletes `n` routes, over and over, until `stop`; counts route changes.
fn flap_routes(rtr: &Netns, n: u32, stop: &AtomicBool, changes: &AtomicU64) -> Result<()> {
    let add = route_batch("add", n, WAN_GW);
    let del = route_batch("del", n, WAN_GW);
    while !stop.load(Ordering::Relaxed) {
        ip_batch(rtr, &add)?;
        changes.fetch_add(u64::from(n), Ordering::Relaxed);
        ip_batch(rtr, &del)?;
        changes.fetch_add(u64::from(n), Ordering::Relaxed);
    }
    Ok(())
}

/// Every second: creates `per_sec` new connections and deletes those of the second before;
/// counts creations and deletions.
fn churn_conns(rtr: &Netns, per_sec: u32, stop: &AtomicBool, changes: &AtomicU64) -> Result<()> {
    let path = rtr.path();
    thread::scope(|s| {
        s.spawn(|| -> Result<()> {
            netns::enter_netns(&path)?;
            let mut writer = Writer::open()?;
            let mut previous: Vec<Conn> = Vec::new();
            let mut next = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let tick = Instant::now();
                let batch = conns(next, per_sec, 2);
                next = next.wrapping_add(per_sec) % 10_000_000;
                let created = writer.create(batch.iter().copied())?;
                let deleted = writer.delete(previous.iter().copied())?;
                changes.fetch_add(created.created + deleted.created, Ordering::Relaxed);
                previous = batch;
                if let Some(rest) = Duration::from_secs(1).checked_sub(tick.elapsed()) {
                    thread::sleep(rest);
                }
            }
            writer.delete(previous)?;
            Ok(())
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

/// Times `/metrics` (every 50 ms, from inside the router namespace) and the request
/// `xdp-routerd status` makes on the control socket (every 50 ms) for `dur`, each one request
/// at a time.
fn timed(rtr: &Netns, socket: &Path, dur: Duration) -> Result<Phase> {
    let path = rtr.path();
    let end = Instant::now() + dur;
    thread::scope(|s| {
        let metrics = s.spawn(|| -> Result<Samples> {
            netns::enter_netns(&path)?;
            let mut out = Samples::default();
            while Instant::now() < end && !crate::run::stopped() {
                let t = Instant::now();
                match scrape::get(REQUEST_TIMEOUT) {
                    Ok(_) => out.ms.push(t.elapsed().as_secs_f64() * 1e3),
                    Err(_) => out.failed += 1,
                }
                thread::sleep(Duration::from_millis(50));
            }
            Ok(out)
        });
        let mut status = Samples::default();
        while Instant::now() < end && !crate::run::stopped() {
            let t = Instant::now();
            match status_request(socket) {
                Ok(()) => status.ms.push(t.elapsed().as_secs_f64() * 1e3),
                Err(_) => status.failed += 1,
            }
            thread::sleep(Duration::from_millis(50));
        }
        let metrics = metrics
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))?;
        Ok(Phase { metrics, status })
    })
}

/// The request `xdp-routerd status` sends, answered in full; fails unless the daemon says ok.
fn status_request(socket: &Path) -> Result<()> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    s.write_all(b"{\"cmd\":\"status\"}\n")?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    if !line.starts_with("{\"ok\":true") {
        bail!("status failed: {}", line.trim());
    }
    Ok(())
}

fn fmt_ms(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| {
        if v >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.1}")
        }
    })
}

fn render(a: &ResponsiveArgs, results: &[(&str, PathBuf, Measured)]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## Responsiveness: /metrics and `xdp-routerd status` under load\n\n\
         Loaded phase: {} connections in conntrack, {} routes added and deleted in a loop, \
         {} connections created and deleted per second. Latencies in ms (one request at a \
         time, every 50 ms each; `status` is the control-socket request `xdp-routerd status` makes, \
         without the CLI's process start). Target: p99 < {} ms under load.\n",
        a.conns,
        a.routes,
        a.churn,
        TARGET_P99.as_millis()
    );
    let _ = writeln!(
        s,
        "| build | phase | /metrics p50 | p99 | max | n (failed) | status p50 | p99 | max | n (failed) |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
    for (label, _, m) in results {
        for (phase, p) in [("idle", &m.idle), ("loaded", &m.loaded)] {
            let _ = writeln!(
                s,
                "| {label} | {phase} | {} | {} | {} | {} ({}) | {} | {} | {} | {} ({}) |",
                fmt_ms(p.metrics.pct(50)),
                fmt_ms(p.metrics.pct(99)),
                fmt_ms(p.metrics.pct(100)),
                p.metrics.ms.len(),
                p.metrics.failed,
                fmt_ms(p.status.pct(50)),
                fmt_ms(p.status.pct(99)),
                fmt_ms(p.status.pct(100)),
                p.status.ms.len(),
                p.status.failed,
            );
        }
    }
    let _ = writeln!(
        s,
        "\n| build | connections offloaded before the loaded phase | time from creating them | route changes/s | connections created+deleted/s | exit after SIGTERM under load | target met |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for (label, _, m) in results {
        let p99 = [m.loaded.metrics.pct(99), m.loaded.status.pct(99)];
        let met = p99
            .iter()
            .all(|p| p.is_some_and(|p| p < TARGET_P99.as_secs_f64() * 1e3))
            && m.loaded.metrics.failed == 0
            && m.loaded.status.failed == 0;
        let _ = writeln!(
            s,
            "| {label} | {} of {} | {:.1} s | {:.0} | {:.0} | {} | {} |",
            m.offloaded,
            m.total,
            m.offload_secs,
            m.routes_per_sec,
            m.conns_per_sec,
            m.exit,
            if met { "yes" } else { "no" }
        );
    }
    for (label, bin, _) in results {
        let _ = writeln!(s, "\n{label}: `{}`", bin.display());
    }
    s
}

/// Creates `conns` in the conntrack table of `ns` (all of them, or an error).
fn insert(ns: &Netns, conns: Vec<Conn>) -> Result<()> {
    let n = conns.len();
    let done = ns.enter(|| ctnl::create(conns))?;
    if done.failed > 0 {
        bail!(
            "ctnetlink refused {} of {n} entries (first error: {})",
            done.failed,
            std::io::Error::from_raw_os_error(done.first_error.unwrap_or(0))
        );
    }
    Ok(())
}

/// `ip -batch` lines adding (`add`) or deleting routes to `n` /32 destinations from
/// 172.16.0.0 on, via `gw`.
fn route_batch(verb: &str, n: u32, gw: Ipv4Addr) -> String {
    let mut s = String::with_capacity(n as usize * 48);
    for i in 0..n {
        let dst = Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 16, 0, 0)) + i);
        let _ = writeln!(s, "route {verb} {dst}/32 via {gw}");
    }
    s
}

/// Runs `ip -batch -` in `ns` with `script` on stdin.
fn ip_batch(ns: &Netns, script: &str) -> Result<()> {
    let mut child = ns
        .command("ip")
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running ip -batch")?;
    child
        .stdin
        .take()
        .context("ip stdin")?
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "ip -batch: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .next()
                .unwrap_or("")
        );
    }
    Ok(())
}
