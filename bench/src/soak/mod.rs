//! `xdp-router-bench soak`: does any connection get lost while flows churn, routes flap and the
//! fast path is toggled?
//!
//! On the benchmark's testbed with a home router's firewall (IPv4 MASQUERADE, FORWARD policy
//! DROP with `ESTABLISHED,RELATED` and LAN → WAN accepted), for `--minutes` each, first with
//! `xdp-routerd` running, then as the control with the kernel alone (no daemon at all: "fast
//! path off" with the daemon running is not the kernel alone, it leaves offloaded connections
//! marked liberal in conntrack):
//! - short TCP connections from the LAN host to the WAN host, IPv4 and IPv6 alternating, at
//!   `--rate` per second: each sends a request whose bytes are derived from its number, the
//!   server checks them and echoes them, and closes; the client checks the echo. Failures are
//!   told apart: reset, refused, timeout, data mismatch;
//! - long iperf3 streams (IPv4 upload and IPv6 download, rate-limited, back to back);
//! - a route flap every 10 s (a host route to the WAN host, IPv4 and IPv6, added or deleted:
//!   the daemon sees a route change, the kernel's path stays the same);
//! - the fast path switched off and, 2 s later, on again every 30 s (daemon run only);
//! - with `--ct-event-buffer` (a small conntrack event socket), the daemon frozen once
//!   (SIGSTOP, 1.5 s, a quarter into the run): the events of those connections overflow the
//!   socket whatever the host's speed, so the run surely goes through an overrun and a resync
//!   with connections in flight (without the freeze, whether one happened in a minute depended
//!   on how fast the host was).
//!
//! It reports connections ok and failed (by kind), the achieved connection rate, iperf3 streams
//! completed, the daemon's RSS over time, and the flow entries left in the maps after the run
//! against conntrack's established entries; it fails on any lost connection, any failed stream,
//! or any leaked flow entry.
//!
//! The short connections (client, server, failure kinds) are in [`conns`], the iperf3 streams
//! in [`streams`].

mod conns;
mod streams;

use std::{
    fmt::Write as _,
    path::PathBuf,
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use xdp_router_testbed::netns::Netns;

use crate::{
    Opts,
    router::{self, Daemon},
    run::{check_stop, prepare},
    testbed::{Names, Testbed},
};

pub(crate) use self::conns::{
    CONN_TIMEOUT, ECHO_PORT, FAILURE_KINDS, Failure, classify, payload, request,
};
use self::{
    conns::{Conns, start_clients, start_servers},
    streams::{IPERF_RATE, Streams, start_streams},
};

/// Options of `xdp-router-bench soak`.
#[derive(clap::Args, Clone, Debug)]
pub struct SoakArgs {
    /// Minutes of each run (fast path, then the kernel-alone control).
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// Short connections started per second (IPv4 and IPv6 alternating).
    #[arg(long, default_value_t = 600)]
    rate: u32,
    /// Skip the kernel-alone control run.
    #[arg(long)]
    no_control: bool,
    /// Capture the short connections (TCP port 7000, 96-byte snaplen) on the LAN and WAN hosts
    /// into `<out>/<run>-{lan,wan}.pcap`, to see which packet of a failed connection went
    /// wrong (≈ 0.5 MB/s per side).
    #[arg(long)]
    capture: bool,
    /// Receive buffer of the daemon's conntrack event socket, bytes (its
    /// `conntrack_event_buffer`; default: the daemon's). A small one forces event socket
    /// overruns and conntrack resyncs while connections come and go.
    #[arg(long)]
    ct_event_buffer: Option<usize>,
}

/// Interval of the route flaps.
const FLAP_EVERY: Duration = Duration::from_secs(10);
/// Interval of the fast-path toggles, and how long it stays off each time.
const TOGGLE_EVERY: Duration = Duration::from_secs(30);
const TOGGLE_OFF_FOR: Duration = Duration::from_secs(2);
/// How long the daemon is frozen to force a conntrack event socket overrun (at 600
/// connections/s that is ≈ 4,500 events; a 128 KiB socket holds a few hundred).
const FREEZE_FOR: Duration = Duration::from_millis(1500);
/// Interval of the daemon RSS samples.
const RSS_EVERY: Duration = Duration::from_secs(10);

/// Resident set size of process `pid`, KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Conntrack entries of the router by (family, state) that the fast path could carry
/// (ESTABLISHED TCP, ASSURED UDP), and all entries.
fn conntrack_counts(rtr: &Netns) -> Result<(u64, u64)> {
    let out = rtr
        .sh("conntrack -L 2>/dev/null")
        .context("listing conntrack (install conntrack)")?;
    let all = out.lines().count() as u64;
    let offloadable = out
        .lines()
        .filter(|l| {
            (l.starts_with("tcp") && l.contains(" ESTABLISHED "))
                || (l.starts_with("udp") && l.contains("[ASSURED]"))
        })
        .count() as u64;
    Ok((offloadable, all))
}

/// One run's result.
struct RunResult {
    label: &'static str,
    secs: f64,
    started: u64,
    ok: u64,
    failed: [u64; 5],
    server: (u64, u64, u64),
    shown: Vec<String>,
    streams_ok: u64,
    streams_failed: u64,
    stream_errors: Vec<String>,
    flaps: u64,
    toggles: u64,
    /// When the daemon was frozen to force an overrun, seconds into the run.
    frozen_at: Option<f64>,
    rss: Vec<(u64, u64)>,
    flows_after: Option<(u64, u64)>,
    ct_after: (u64, u64),
    reasons: String,
    /// Conntrack resyncs after event socket overruns (the start-up one not counted) and the
    /// duration of the last one, ms (daemon run only).
    resyncs: Option<(u64, u64)>,
}

impl RunResult {
    fn lost(&self) -> u64 {
        self.failed.iter().sum::<u64>() + self.server.0 + self.server.1
    }

    fn leaked(&self) -> u64 {
        self.flows_after
            .map_or(0, |(v4, v6)| (v4 + v6).saturating_sub(2 * self.ct_after.0))
    }
}

/// One run on a fresh testbed: with the daemon (`daemon` = its binary) or the kernel alone.
fn run_one(daemon_bin: Option<&PathBuf>, out: &std::path::Path, a: &SoakArgs) -> Result<RunResult> {
    let label = if daemon_bin.is_some() {
        "fast path (xdp-routerd)"
    } else {
        "kernel alone (no daemon)"
    };
    eprintln!("soak: {label}: {:.1} min at {}/s", a.minutes, a.rate);
    let tb = Testbed::create(Names::bench())?;
    let Names { rl, rw, .. } = tb.names.clone();
    router::apply_home_router(&tb.rtr, &rl, &rw)?;
    let daemon = match daemon_bin {
        Some(bin) => Some(Daemon::start_tuned(
            bin,
            &tb.rtr,
            &out.join("daemon"),
            &rl,
            &rw,
            false,
            &a.ct_event_buffer
                .map(|b| format!("conntrack_event_buffer = {b}\n"))
                .unwrap_or_default(),
        )?),
        None => None,
    };
    let mut captures = Vec::new();
    if a.capture {
        let tag = if daemon_bin.is_some() {
            "fastpath"
        } else {
            "kernel"
        };
        for (ns, dev, side) in [(&tb.lan, "l0", "lan"), (&tb.wan, "w0", "wan")] {
            let file = out.join(format!("{tag}-{side}.pcap"));
            captures.push(
                ns.command("tcpdump")
                    .args(["-i", dev, "-s", "96", "-U", "-w"])
                    .arg(&file)
                    .args(["tcp", "port", &ECHO_PORT.to_string()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .context("starting tcpdump (install tcpdump)")?,
            );
        }
        thread::sleep(Duration::from_millis(500));
    }
    let conns = Arc::new(Conns::default());
    let stop = Arc::new(AtomicBool::new(false));
    start_servers(&tb.wan, &conns, &stop)?;
    let dur = Duration::from_secs_f64(a.minutes * 60.0);
    let t0 = Instant::now();
    let until = t0 + dur;
    let streams = Arc::new(Streams {
        completed: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        errors: Mutex::new(Vec::new()),
    });
    let (mut iperf_servers, stream_loops) = start_streams(&tb.lan, &tb.wan, until, &streams)?;
    let clients = start_clients(&tb.lan, a.rate, until, &conns);

    // The churn: route flaps, fast-path toggles, RSS samples, until the end.
    let mut flaps = 0u64;
    let mut toggles = 0u64;
    let mut rss = Vec::new();
    let (mut next_flap, mut next_toggle, mut next_rss) = (FLAP_EVERY, TOGGLE_EVERY, Duration::ZERO);
    let mut back_on: Option<Duration> = None;
    // The freeze (a small event socket only), between the first route flap and the first
    // toggle of a 1-minute run; `thaw` is when it ends.
    let mut freeze_at = a.ct_event_buffer.and(daemon.as_ref()).map(|_| dur / 4);
    let mut thaw: Option<Duration> = None;
    let mut frozen_at = None;
    let mut host_route = false;
    let mut err = None;
    while t0.elapsed() < dur && err.is_none() {
        if check_stop().is_err() {
            err = Some(anyhow::anyhow!("interrupted"));
            break;
        }
        let now = t0.elapsed();
        let step = (|| -> Result<()> {
            if now >= next_flap {
                let op = if host_route { "del" } else { "add" };
                tb.rtr.sh(&format!(
                    "ip route {op} 10.0.2.2/32 dev {rw} && ip -6 route {op} fd00:2::2/128 dev {rw}"
                ))?;
                host_route = !host_route;
                flaps += 1;
                next_flap += FLAP_EVERY;
            }
            if let Some(d) = &daemon {
                // Not while frozen: the control socket would not answer.
                if now >= next_toggle && thaw.is_none() {
                    d.set_fastpath(false)?;
                    back_on = Some(now + TOGGLE_OFF_FOR);
                    next_toggle += TOGGLE_EVERY;
                }
                if back_on.is_some_and(|t| now >= t) && thaw.is_none() {
                    d.set_fastpath(true)?;
                    back_on = None;
                    toggles += 1;
                }
                if freeze_at.is_some_and(|t| now >= t) && back_on.is_none() {
                    freeze_at = None;
                    d.signal(libc::SIGSTOP)?;
                    thaw = Some(now + FREEZE_FOR);
                    frozen_at = Some(now.as_secs_f64());
                }
                if thaw.is_some_and(|t| now >= t) {
                    d.signal(libc::SIGCONT)?;
                    thaw = None;
                }
                if now >= next_rss {
                    if let Some(kib) = rss_kib(d.pid()) {
                        rss.push((now.as_secs(), kib));
                    }
                    next_rss += RSS_EVERY;
                }
            }
            Ok(())
        })();
        if let Err(e) = step {
            err = Some(e);
        }
        thread::sleep(Duration::from_millis(100));
    }
    if let Some(d) = &daemon
        && thaw.is_some()
    {
        d.signal(libc::SIGCONT)?;
    }
    if let Some(d) = &daemon
        && back_on.is_some()
    {
        d.set_fastpath(true)?;
        toggles += 1;
    }
    for c in clients {
        let _ = c.join();
    }
    let secs = t0.elapsed().as_secs_f64();
    for l in stream_loops {
        let _ = l.join();
    }
    stop.store(true, Ordering::Relaxed);
    for s in &mut iperf_servers {
        let _ = s.kill();
        let _ = s.wait();
    }
    for c in &mut captures {
        // SIGTERM: tcpdump flushes and closes its file.
        if let Ok(pid) = i32::try_from(c.id()) {
            // SAFETY: kill(2) on our own unreaped child.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let _ = c.wait();
    }
    if let Some(e) = err {
        return Err(e.context(format!("soak run {label}")));
    }

    // Flows left: every connection has ended, so no flow entry may remain beyond conntrack's
    // established entries (the daemon gets a few seconds to see the last events).
    let mut flows_after = None;
    let mut ct_after = conntrack_counts(&tb.rtr)?;
    let mut reasons = String::new();
    let mut resyncs = None;
    if let Some(d) = &daemon {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let st = d.status()?;
            ct_after = conntrack_counts(&tb.rtr)?;
            flows_after = Some((st.flows_v4, st.flows_v6));
            reasons = st.summary();
            resyncs = Some((st.ct_resyncs.saturating_sub(1), st.ct_last_resync_ms));
            if st.flows_v4 + st.flows_v6 <= 2 * ct_after.0 || Instant::now() > deadline {
                break;
            }
            thread::sleep(Duration::from_millis(500));
        }
        if let Some(kib) = rss_kib(d.pid()) {
            rss.push((secs as u64, kib));
        }
        if flows_after.is_some_and(|(v4, v6)| v4 + v6 > 2 * ct_after.0) {
            // Leaked entries: keep what the daemon and conntrack say about them.
            let flows = d.flows_text().unwrap_or_else(|e| format!("{e:#}"));
            let ct = tb
                .rtr
                .sh("conntrack -L 2>&1")
                .unwrap_or_else(|e| format!("{e:#}"));
            let _ = std::fs::write(out.join("leaked-flows.txt"), &flows);
            let _ = std::fs::write(out.join("conntrack-after.txt"), &ct);
            eprintln!(
                "soak: flow entries left after the run ({} and {} saved):\n{}",
                out.join("leaked-flows.txt").display(),
                out.join("conntrack-after.txt").display(),
                flows.lines().take(12).collect::<Vec<_>>().join("\n")
            );
        }
    }
    if let Some(d) = daemon {
        d.stop()?;
    }
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let r = RunResult {
        label,
        secs,
        started: load(&conns.started),
        ok: load(&conns.ok),
        failed: std::array::from_fn(|i| load(&conns.failed[i])),
        server: (
            load(&conns.server_mismatch),
            load(&conns.server_reset),
            load(&conns.server_other),
        ),
        shown: conns
            .shown
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone(),
        streams_ok: load(&streams.completed),
        streams_failed: load(&streams.failed),
        stream_errors: streams
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone(),
        flaps,
        toggles,
        frozen_at,
        rss,
        flows_after,
        ct_after,
        reasons,
        resyncs,
    };
    debug_assert_eq!(r.started, r.ok + conns.failed_total());
    Ok(r)
}

/// Runs the soak (both runs unless `--no-control`), prints the report, and fails on any lost
/// connection, failed stream or leaked flow.
pub fn run(o: &Opts, a: &SoakArgs) -> Result<()> {
    if a.minutes.is_nan() || a.minutes <= 0.0 || a.rate == 0 {
        bail!("--minutes and --rate must be positive");
    }
    prepare()?;
    let bin = router::locate_daemon(o.daemon.as_deref(), true)?;
    let out = o.out.clone().unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/bench")
            .join(format!("soak-{}", std::process::id()))
    });
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut runs = vec![run_one(Some(&bin), &out, a)?];
    if !a.no_control {
        check_stop()?;
        runs.push(run_one(None, &out, a)?);
    }
    let report = report(&runs, a);
    print!("{report}");
    let _ = std::fs::write(out.join("soak.md"), &report);
    let bad: Vec<String> = runs
        .iter()
        .filter(|r| r.lost() > 0 || r.streams_failed > 0 || r.leaked() > 0)
        .map(|r| r.label.to_owned())
        .collect();
    // A small event buffer is asked for to go through overruns: a run without any tested
    // nothing of the kind.
    if a.ct_event_buffer.is_some()
        && let Some(r) = runs.iter().find(|r| r.resyncs.is_some_and(|(n, _)| n == 0))
    {
        bail!(
            "{}: no conntrack event socket resync with --ct-event-buffer {} although the daemon \
             was frozen for {:.1} s while connections came and went: the overrun went unnoticed",
            r.label,
            a.ct_event_buffer.unwrap_or_default(),
            FREEZE_FOR.as_secs_f64()
        );
    }
    if !bad.is_empty() {
        bail!(
            "connections lost, streams failed or flows leaked in: {}",
            bad.join(", ")
        );
    }
    Ok(())
}

fn report(runs: &[RunResult], a: &SoakArgs) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n## Soak: short TCP connections at {}/s requested (IPv4 + IPv6), 2 iperf3 streams \
         at {IPERF_RATE}bit/s, route flap every {} s, fast path off/on every {} s; {:.1} min \
         per run\n",
        a.rate,
        FLAP_EVERY.as_secs(),
        TOGGLE_EVERY.as_secs(),
        a.minutes
    );
    let _ = write!(s, "| | ");
    for r in runs {
        let _ = write!(s, "{} | ", r.label);
    }
    let _ = write!(s, "\n|---|");
    for _ in runs {
        let _ = write!(s, "---|");
    }
    s.push('\n');
    let mut row = |name: &str, f: &dyn Fn(&RunResult) -> String| {
        let _ = write!(s, "| {name} | ");
        for r in runs {
            let _ = write!(s, "{} | ", f(r));
        }
        s.push('\n');
    };
    row("connections started", &|r| r.started.to_string());
    row("achieved rate, conn/s", &|r| {
        format!("{:.0}", r.started as f64 / r.secs.max(1e-9))
    });
    row("connections ok", &|r| r.ok.to_string());
    for (i, (_, name)) in FAILURE_KINDS.iter().enumerate() {
        row(&format!("failed: {name}"), &|r| r.failed[i].to_string());
    }
    row("server saw: bad request / reset / other", &|r| {
        format!("{} / {} / {}", r.server.0, r.server.1, r.server.2)
    });
    row("iperf3 streams completed / failed", &|r| {
        format!("{} / {}", r.streams_ok, r.streams_failed)
    });
    row("route flaps / fast-path toggles", &|r| {
        format!("{} / {}", r.flaps, r.toggles)
    });
    if a.ct_event_buffer.is_some() {
        row(
            "daemon frozen (SIGSTOP) to force an overrun",
            &|r| match r.frozen_at {
                Some(t) => format!("at {t:.1} s for {:.1} s", FREEZE_FOR.as_secs_f64()),
                None => "—".into(),
            },
        );
    }
    row("daemon RSS, MiB (every 10 s)", &|r| {
        if r.rss.is_empty() {
            "—".into()
        } else {
            r.rss
                .iter()
                .map(|(_, k)| format!("{:.1}", *k as f64 / 1024.0))
                .collect::<Vec<_>>()
                .join(" ")
        }
    });
    row(
        "flow entries left (v4 + v6) / conntrack established",
        &|r| match r.flows_after {
            Some((v4, v6)) => format!("{} / {}", v4 + v6, r.ct_after.0),
            None => format!("— / {}", r.ct_after.0),
        },
    );
    row(
        "conntrack overruns (resyncs) / per minute / last resync, ms",
        &|r| match r.resyncs {
            Some((n, ms)) => format!("{n} / {:.1} / {ms}", n as f64 * 60.0 / r.secs.max(1e-9)),
            None => "—".into(),
        },
    );
    row("conntrack entries after the run (all states)", &|r| {
        r.ct_after.1.to_string()
    });
    for r in runs {
        if !r.reasons.is_empty() {
            let _ = writeln!(s, "\n{}: datapath counters: {}", r.label, r.reasons);
        }
        for f in &r.shown {
            let _ = writeln!(s, "{}: failed: {f}", r.label);
        }
        for e in &r.stream_errors {
            let _ = writeln!(s, "{}: stream failed: {e}", r.label);
        }
    }
    s
}
