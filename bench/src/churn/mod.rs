//! Connection churn through the router (part of `xdp-router-bench scale`): new short
//! connections per second, stepped up until one fails, with `xdp-routerd` running and, side by
//! side, with the kernel alone.
//!
//! Each connection is one of four kinds, in turn: TCP over IPv4 (masqueraded), TCP over IPv6,
//! a UDP exchange over IPv4 (masqueraded), a UDP exchange over IPv6. A TCP connection sends a
//! request of 16…3,016 bytes derived from its number ([`soak::request`]); the server checks it,
//! echoes it and closes first (the TIME_WAIT stays on the server, so the client's ports do not
//! run out); the client checks the echo. A UDP exchange sends one datagram of 16…1,216 bytes
//! from a fresh socket (a fresh source port, so a new conntrack entry) and checks the echo; like
//! a DNS client it sends the request again after a second without an answer (at most
//! [`UDP_TRIES`](traffic::UDP_TRIES) times; the retries are counted and printed, as are the
//! drop counters along the path: TCP retransmits its own losses, UDP cannot).
//!
//! The generator is one async task loop (tokio, current-thread runtime) in the LAN host and
//! one in the WAN host, both on the generator CPU (with the daemon): connection `n` is due at
//! `n / rate` seconds; at most [`IN_FLIGHT`](traffic::IN_FLIGHT) are open at once (when the
//! router or the server falls behind, the achieved rate drops below the requested one, and the
//! step fails).
//!
//! After each step with the daemon, the flow maps are compared with conntrack: every offloaded
//! direction must belong to a conntrack entry the fast path may carry (ESTABLISHED TCP,
//! ASSURED UDP), and every such entry of the benchmark must be offloaded; anything else after
//! [`CATCH_UP`](map_check::CATCH_UP) is a leaked (stale) or missing flow entry, and fails the
//! run.
//!
//! The generator and the echo servers are in [`traffic`], the comparison of the maps with
//! conntrack in [`map_check`]; this module runs the steps and the ladder.

mod map_check;
mod traffic;

use std::{
    path::Path,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{router::Daemon, soak::FAILURE_KINDS, testbed::Testbed};

pub use self::traffic::Servers;
use self::{
    map_check::in_step,
    traffic::{KINDS, generate},
};

/// What one step measured.
#[derive(Clone, Debug)]
pub struct Step {
    /// Requested new connections per second.
    pub rate: u32,
    /// Achieved: connections started per second of the step.
    pub achieved: f64,
    pub started: u64,
    pub ok: u64,
    /// Failures by kind, as [`FAILURE_KINDS`].
    pub failed: [u64; 5],
    /// Failures by connection kind, as [`KINDS`](traffic::KINDS).
    pub failed_kind: [u64; 4],
    pub server_bad: u64,
    /// UDP requests sent again after a lost request or echo.
    pub udp_retries: u64,
    /// Drop counters that grew during the step (see [`drop_counters`]).
    pub drops: String,
    /// With the daemon: its CPU over the step (percent of a core).
    pub daemon_cpu: Option<f64>,
    /// With the daemon: its CPU time over the step divided by the connections started, in µs
    /// (the cost of one new connection; the generator's speed does not enter).
    pub daemon_us_per_conn: Option<f64>,
    /// With the daemon: connections offloaded during the step and fast-path packets.
    pub offloaded: Option<u64>,
    pub fast_packets: Option<u64>,
    /// With the daemon: flow directions without a carriable conntrack entry, carriable
    /// conntrack entries without flow directions, after [`CATCH_UP`](map_check::CATCH_UP).
    pub stale: Option<u64>,
    pub missing: Option<u64>,
}

impl Step {
    /// Every connection completed, at (nearly) the requested rate, and the maps are in step.
    pub fn passed(&self) -> bool {
        self.ok == self.started
            && self.server_bad == 0
            && self.achieved >= 0.95 * f64::from(self.rate)
            && self.stale.unwrap_or(0) == 0
            && self.missing.unwrap_or(0) == 0
    }

    /// Failures in words (`reset=3 timeout=1`), or `none`.
    pub fn failures(&self) -> String {
        let mut v: Vec<String> = FAILURE_KINDS
            .iter()
            .zip(self.failed)
            .filter(|(_, c)| *c > 0)
            .map(|((_, name), c)| format!("{name}={c}"))
            .collect();
        if v.is_empty() {
            return "none".into();
        }
        let by_kind: Vec<String> = KINDS
            .iter()
            .zip(self.failed_kind)
            .filter(|(_, c)| *c > 0)
            .map(|((_, name), c)| format!("{name}={c}"))
            .collect();
        v.push(format!("({})", by_kind.join(" ")));
        if self.server_bad > 0 {
            v.push(format!("server saw bad request={}", self.server_bad));
        }
        v.join(" ")
    }
}

/// Drop counters along the path: the veths' `rx_dropped`/`tx_dropped` and the hosts' UDP
/// errors (`/proc/net/snmp{,6}`), by name.
fn drop_counters(tb: &Testbed) -> Result<Vec<(String, u64)>> {
    let mut v = Vec::new();
    let (rl, rw) = (&tb.names.rl, &tb.names.rw);
    for (ns, host, dev) in [
        (&tb.lan, "lan", "l0"),
        (&tb.rtr, "rtr", rl.as_str()),
        (&tb.rtr, "rtr", rw.as_str()),
        (&tb.wan, "wan", "w0"),
    ] {
        let out = ns.sh(&format!(
            "cat /sys/class/net/{dev}/statistics/rx_dropped /sys/class/net/{dev}/statistics/tx_dropped"
        ))?;
        for (what, n) in ["rx_dropped", "tx_dropped"].iter().zip(out.lines()) {
            v.push((
                format!("{host} {dev} {what}"),
                n.trim().parse().unwrap_or(0),
            ));
        }
    }
    for (ns, host) in [(&tb.lan, "lan"), (&tb.wan, "wan")] {
        let snmp = ns.sh("cat /proc/net/snmp /proc/net/snmp6")?;
        // /proc/net/snmp: a header line of names, then a line of values, per protocol.
        let lines: Vec<&str> = snmp.lines().collect();
        for pair in lines.windows(2) {
            let (names, values) = (pair[0], pair[1]);
            if names.starts_with("Udp: ") && values.starts_with("Udp: ") && names != values {
                for (n, x) in names.split_whitespace().zip(values.split_whitespace()) {
                    if ["InErrors", "NoPorts", "RcvbufErrors", "SndbufErrors"].contains(&n) {
                        v.push((format!("{host} udp {n}"), x.parse().unwrap_or(0)));
                    }
                }
            }
        }
        for l in &lines {
            let mut w = l.split_whitespace();
            if let (Some(n), Some(x)) = (w.next(), w.next())
                && [
                    "Udp6InErrors",
                    "Udp6NoPorts",
                    "Udp6RcvbufErrors",
                    "Udp6SndbufErrors",
                ]
                .contains(&n)
            {
                v.push((format!("{host} {n}"), x.parse().unwrap_or(0)));
            }
        }
    }
    Ok(v)
}

/// The counters of `after` that grew since `before`, as `name +delta`.
fn grown(before: &[(String, u64)], after: &[(String, u64)]) -> String {
    let v: Vec<String> = after
        .iter()
        .filter_map(|(n, a)| {
            let b = before.iter().find(|(m, _)| m == n).map_or(0, |(_, b)| *b);
            (*a > b).then(|| format!("{n} +{}", a - b))
        })
        .collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// One step at `rate` for `dur`; with `daemon`, the flows are checked against conntrack after.
pub fn step(
    tb: &Testbed,
    servers: &Servers,
    daemon: Option<&Daemon>,
    rate: u32,
    dur: Duration,
    out: &Path,
) -> Result<Step> {
    let before = match daemon {
        Some(d) => Some((
            d.status()?.forwarded(),
            offloaded_total(d)?,
            crate::scale::proc::sample(d.pid())?.cpu_s,
        )),
        None => None,
    };
    let bad_before = servers.counters.server_bad.load(Ordering::Relaxed);
    let drops_before = drop_counters(tb)?;
    let t0 = Instant::now();
    let (c, took) = generate(&tb.lan, rate, dur)?;
    let wall = t0.elapsed();
    let drops = grown(&drops_before, &drop_counters(tb)?);
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let mut step = Step {
        rate,
        achieved: load(&c.started) as f64 / took.as_secs_f64().max(1e-9),
        started: load(&c.started),
        ok: load(&c.ok),
        failed: std::array::from_fn(|i| load(&c.failed[i])),
        failed_kind: std::array::from_fn(|i| load(&c.failed_kind[i])),
        daemon_cpu: None,
        daemon_us_per_conn: None,
        udp_retries: load(&c.udp_retries),
        drops,
        server_bad: load(&servers.counters.server_bad) - bad_before,
        offloaded: None,
        fast_packets: None,
        stale: None,
        missing: None,
    };
    if let (Some(d), Some((fwd, off, cpu))) = (daemon, before) {
        let used = crate::scale::proc::sample(d.pid())?.cpu_s - cpu;
        step.daemon_cpu = Some(100.0 * used / wall.as_secs_f64().max(1e-9));
        step.daemon_us_per_conn = Some(1e6 * used / (step.started.max(1) as f64));
        let (stale, missing) = in_step(&tb.rtr, d, out)?;
        step.fast_packets = Some(d.status()?.forwarded().saturating_sub(fwd));
        step.offloaded = Some(offloaded_total(d)?.saturating_sub(off));
        step.stale = Some(stale);
        step.missing = Some(missing);
    }
    Ok(step)
}

fn offloaded_total(d: &Daemon) -> Result<u64> {
    d.status_json()?["conntrack"]["offloaded_total"]
        .as_u64()
        .context("status has no conntrack.offloaded_total")
}

/// Prepares the hosts for churn: the LAN host's ephemeral ports span 1024…65535 (the
/// generator opens tens of thousands of connections a second).
pub fn prepare_hosts(tb: &Testbed) -> Result<()> {
    tb.lan
        .sh("sysctl -qw net.ipv4.ip_local_port_range='1024 65535'")?;
    Ok(())
}

/// Steps through `rates` (`dur` each) until a step fails; returns the steps run.
pub fn ladder(
    tb: &Testbed,
    servers: &Servers,
    daemon: Option<&Daemon>,
    rates: &[u32],
    dur: Duration,
    out: &Path,
) -> Result<Vec<Step>> {
    let mut steps = Vec::new();
    for &rate in rates {
        crate::run::check_stop()?;
        let s = step(tb, servers, daemon, rate, dur, out)?;
        eprintln!(
            "  churn {} at {rate}/s: achieved {:.0}/s, {} of {} ok, failures: {}{}; UDP retries {}; drops: {}",
            if daemon.is_some() {
                "fast path"
            } else {
                "kernel alone"
            },
            s.achieved,
            s.ok,
            s.started,
            s.failures(),
            match (s.stale, s.missing, s.offloaded) {
                (Some(st), Some(m), Some(o)) => format!(
                    "; offloaded {o}; daemon CPU {:.0} % ({:.1} µs per new connection); flow \
                     entries stale {st}, missing {m}",
                    s.daemon_cpu.unwrap_or(0.0),
                    s.daemon_us_per_conn.unwrap_or(0.0)
                ),
                _ => String::new(),
            },
            s.udp_retries,
            s.drops
        );
        let passed = s.passed();
        steps.push(s);
        if !passed {
            break;
        }
    }
    if steps.is_empty() {
        bail!("no churn step ran");
    }
    Ok(steps)
}
