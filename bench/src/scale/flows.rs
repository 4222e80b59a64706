//! The scale benchmark's flows parts: a million established conntrack entries offloaded at
//! daemon start (time, RSS, map memory, quiet CPU, none left after a flush), and a full flow
//! map (the connections that do not fit stay in the kernel and are counted).

use std::{
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use xdp_router_testbed::netns::Netns;

use super::{
    after_offload::{phase_log, window_after_offload},
    config::config,
    proc::{cpu_over, cpus_allowed, map_memlock, sample, settle, stolen_s},
    report::Report,
};
use crate::{
    ctnl::{self, Conn, TCP, Tuple5, UDP},
    router::{self, Daemon, DaemonCpus},
    scrape,
    testbed::Testbed,
};

/// A full flow map: `n` entries present at start, a capacity of 1,024 directions per family.
/// The connections that do not fit stay in the kernel, counted under `flow_table_full`, and
/// the log says so once (not once per connection).
pub(super) fn capacity_part(
    tb: &Testbed,
    bin: &Path,
    out: &Path,
    n: u32,
    report: &mut Report,
) -> Result<()> {
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

pub(super) fn flows_part(
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
    let deadline = Duration::from_secs(if small { 120 } else { 600 });
    let goal_s = if small { 30.0 } else { 10.0 };
    // As the packaged service runs it: on every CPU.
    let started = start_and_offload(tb, bin, &cfg, &dir, DaemonCpus::Every, (v4, v6), deadline)?;
    report.check(
        &format!("all {n} entries offloaded"),
        started.figure(),
        format!("within {} s", deadline.as_secs()),
        started.offload.is_ok(),
    );
    report.target(
        &format!(
            "all {n} entries offloaded after daemon start (daemon on CPUs {})",
            started.cpus
        ),
        started.figure(),
        format!("≤ {goal_s} s"),
        started
            .offload
            .as_ref()
            .is_ok_and(|d| d.as_secs_f64() <= goal_s),
    );
    let daemon = started.daemon;
    let pid = daemon.pid();
    // The window right after the last offload: what the start-up leaves behind (the marks
    // after arming) and whatever it costs (an event-socket overrun, a resync) lands in it.
    let window = Duration::from_secs(if small { 10 } else { 30 });
    window_after_offload(&daemon, window, 5.0, report)?;
    phase_log(&daemon, "", report);
    // Let any start-up work left finish before measuring the quiet daemon.
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
    // What a Prometheus scrape costs with the table full (per-host series on, the default),
    // after the quiet measurements so its CPU is not in them.
    let scrapes = tb
        .rtr
        .enter(|| scrape::timed(20, Duration::from_millis(100), Duration::from_secs(60)))?;
    let scrape_goal_ms = 50.0;
    report.target(
        &format!("/metrics scrape with {n} flows offloaded (quiet)"),
        scrapes.figure(),
        format!("p99 < {scrape_goal_ms} ms"),
        scrapes.pct(99).is_some_and(|ms| ms < scrape_goal_ms),
    );
    let capacity = status_patiently(&daemon)?.capacity;
    // The same table, the daemon started again on one CPU: a router with a single core to
    // spare, and what the start-up costs without its stages overlapping.
    daemon.stop()?;
    let again = start_and_offload(
        tb,
        bin,
        &cfg,
        &dir.join("one-cpu"),
        DaemonCpus::Generator,
        (v4, v6),
        deadline,
    )?;
    report.check(
        &format!(
            "all {n} entries offloaded after daemon start again (daemon on CPU {})",
            again.cpus
        ),
        again.figure(),
        format!("within {} s", deadline.as_secs()),
        again.offload.is_ok(),
    );
    let daemon = again.daemon;
    phase_log(&daemon, "one CPU: ", report);
    let pid = daemon.pid();
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

/// A daemon started over a full conntrack table, and how its start-up went.
struct Started {
    daemon: Daemon,
    /// From the daemon's start until every entry was offloaded, or what was offloaded at the
    /// deadline.
    offload: Result<Duration, String>,
    /// The CPUs it may run on (`Cpus_allowed_list`).
    cpus: String,
    /// The CPU time it used until then (or until the deadline).
    cpu_s: f64,
    /// CPU time the hypervisor took from this VM meanwhile ([`stolen_s`]).
    stolen_s: f64,
}

impl Started {
    /// The time to offload everything, the CPU time and the time stolen meanwhile, or what was
    /// offloaded at the deadline.
    fn figure(&self) -> String {
        match &self.offload {
            Ok(d) => format!(
                "{:.1} s; {:.1} s of CPU, {:.1} s stolen by the hypervisor",
                d.as_secs_f64(),
                self.cpu_s,
                self.stolen_s
            ),
            Err(left) => left.clone(),
        }
    }
}

/// Starts the daemon on `cpus` and waits until both directions of all `v4` + `v6`
/// connections are in its flow maps, at most `deadline`.
fn start_and_offload(
    tb: &Testbed,
    bin: &Path,
    cfg: &Path,
    dir: &Path,
    cpus: DaemonCpus,
    (v4, v6): (u64, u64),
    deadline: Duration,
) -> Result<Started> {
    let stolen_before = stolen_s()?;
    let t0 = Instant::now();
    let daemon = Daemon::start_on(cpus, bin, &tb.rtr, cfg, dir, Duration::from_secs(600))?;
    let pid = daemon.pid();
    let allowed = cpus_allowed(pid)?;
    let offload = loop {
        // An error is a busy daemon (see below): asked again.
        let st = daemon.status().unwrap_or_default();
        if st.flows_v4 >= 2 * v4 && st.flows_v6 >= 2 * v6 {
            break Ok(t0.elapsed());
        }
        if t0.elapsed() > deadline {
            break Err(format!(
                "not within {} s: {} IPv4 + {} IPv6 directions of {} + {}",
                deadline.as_secs(),
                st.flows_v4,
                st.flows_v6,
                2 * v4,
                2 * v6
            ));
        }
        thread::sleep(Duration::from_millis(200));
    };
    let cpu_s = sample(pid)?.cpu_s;
    Ok(Started {
        daemon,
        offload,
        cpus: allowed,
        cpu_s,
        stolen_s: stolen_s()? - stolen_before,
    })
}
