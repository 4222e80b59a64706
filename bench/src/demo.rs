//! `xdp-router-bench lab` (run by `cargo xtask lab`, the README's first command): what the fast
//! path is worth, in under a minute.
//!
//! The benchmark's testbed with the router's interfaces named like the example config (`eth1`
//! LAN, `eth0` WAN), a home router's firewall, and `xdp-routerd run --config
//! config/xdp-routerd.toml` (the example config, unchanged). First the generator alone (live
//! frames, or AF_PACKET where the kernel refuses them): its own rate into a bare sink, the
//! ceiling of what the lab can measure. Then, fast path off, on (XDP on the lab's veths), and on
//! with the daemon restarted with `datapath = "tc"` (the path of ports without native XDP;
//! `--no-tc` leaves it out): 64-byte UDP over a few primed, offloaded flows at full offered
//! rate, an iperf3 TCP transfer, and the router's CPU at two fixed offered rates (a 100 Mbit/s
//! line full of 64-byte frames, a 1 Gbit/s line of 1518-byte ones: what a home router's owner
//! compares), each run's figures also as a ratio to the kernel's. Everything is removed at the
//! end, on error and on Ctrl-C.
use std::{
    fmt::Write as _,
    fs,
    path::{Path as FsPath, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    Opts,
    cpu::{CpuShare, CpuTimes},
    generator::generator_bound,
    latency::EchoServer,
    packet::Family,
    router::{self, Daemon, Datapath},
    run::{check_stop, prepare, prime, stopped},
    tcp::{self, Iperf3Server, TcpMode},
    testbed::{GEN_CPU, Names, Path, ROUTER_CPU, Testbed, Trial},
};

/// Options of `xdp-router-bench lab`.
#[derive(clap::Args, Clone, Debug)]
pub struct LabArgs {
    /// Seconds of each measurement (UDP and TCP; the kernel, the fast path as configured, and
    /// TC unless `--no-tc`).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=60))]
    seconds: u32,
    /// The daemon's config (default: the workspace's config/xdp-routerd.toml). Its interfaces
    /// must be `eth1` (LAN) and `eth0` (WAN), the names the lab gives the router's veths.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Leave out the third run, the fast path at TC ingress (the daemon restarted with
    /// `datapath = "tc"`, the path of ports without native XDP).
    #[arg(long)]
    no_tc: bool,
}

/// Flows of the UDP stream when `--flows` is not given.
const DEFAULT_FLOWS: u32 = 8;

/// Frame size of the UDP stream (FCS included).
const UDP_FRAME: usize = 64;

/// The fixed offered rates: (frame size with FCS, line rate in Mbit/s, label).
const FIXED_RATES: [(usize, u32, &str); 2] = [
    (64, 100, "100 Mbit/s of 64 B"),
    (1518, 1000, "1 Gbit/s of 1518 B"),
];

/// Frames per second that fill a line of `mbit` Mbit/s with `frame`-byte frames (FCS included),
/// counting the 20 bytes of preamble, start delimiter and inter-frame gap each frame costs on
/// the wire (RFC 2544's line rate: 148,810 frames/s of 64 B at 100 Mbit/s).
fn line_rate_pps(mbit: u32, frame: usize) -> f64 {
    f64::from(mbit) * 1e6 / ((frame + 20) as f64 * 8.0)
}

/// CPU of the iperf3 endpoints: the generator's, so CPU1 stays the router's (the receiving
/// host's softirq still runs there, after the router's NAPI poll).
const TCP_CPU: Option<usize> = Some(GEN_CPU);

/// One run of the lab: the kernel alone, or the fast path on one datapath.
struct Side {
    /// Its row label.
    label: String,
    udp: Trial,
    udp_xdp: u64,
    tcp_mbps: f64,
    tcp_kernel: u64,
    tcp_xdp: u64,
    /// CPU0 over the TCP transfer: both iperf3 processes.
    tcp_endpoints: CpuShare,
    /// CPU1 over the TCP transfer: its system time is the router's NAPI threads, its softirq
    /// time the endpoints' receive.
    tcp_router: CpuShare,
    /// One paced trial per [`FIXED_RATES`] entry.
    fixed: Vec<Trial>,
}

/// Runs the lab and prints its tables and `xdp-routerd status`.
pub fn run(o: &Opts, args: &LabArgs) -> Result<()> {
    prepare()?;
    let config = match &args.config {
        Some(c) => c.clone(),
        None => FsPath::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .context("workspace root")?
            .join("config/xdp-routerd.toml"),
    };
    if !config.is_file() {
        bail!("{}: no such config file", config.display());
    }
    let bin = router::locate_daemon(o.daemon.as_deref(), o.daemon.is_none())?;
    let flows = o.flows.unwrap_or(DEFAULT_FLOWS).max(1);
    let dir = std::env::temp_dir().join(format!("xr-lab-{}", std::process::id()));
    let started = Instant::now();
    let result = lab(args, &bin, &config, &dir, flows);
    match &result {
        Ok(()) => {
            let _ = fs::remove_dir_all(&dir);
            println!(
                "\nlab done in {:.1} s; namespaces removed",
                started.elapsed().as_secs_f64()
            );
        }
        Err(_) if stopped() => {
            let _ = fs::remove_dir_all(&dir);
            bail!("interrupted; namespaces removed");
        }
        Err(_) => eprintln!("the daemon's log is kept in {}", dir.display()),
    }
    result
}

fn lab(args: &LabArgs, bin: &FsPath, config: &FsPath, dir: &FsPath, flows: u32) -> Result<()> {
    let secs = Duration::from_secs(u64::from(args.seconds));
    eprintln!("building the lab: lan ⇄ eth1 router eth0 ⇄ wan (network namespaces)");
    let mut tb = Testbed::create(Names::example_config()).context("building the lab")?;
    let alone = generator_alone(&mut tb, secs, flows)?;
    let (rl, rw) = (tb.names.rl.clone(), tb.names.rw.clone());
    router::apply_home_router(&tb.rtr, &rl, &rw)?;
    eprintln!(
        "starting {} run --config {} in the router namespace",
        bin.display(),
        config.display()
    );
    let daemon = Daemon::start_with_config(bin, &tb.rtr, config, dir)?;
    tb.pin_napi_threads()?;
    let echo = EchoServer::start(&tb.wan)?;
    prime(&mut tb, Some(&daemon), Family::Ipv4, flows, true)?;
    let iperf = Iperf3Server::start(&tb.wan, TCP_CPU)?;

    let mut sides = Vec::new();
    for on in [false, true] {
        sides.push(side(&mut tb, &daemon, secs, flows, on)?);
    }
    let mut status = daemon.status_text()?;
    daemon.stop()?;
    if !args.no_tc {
        // The same router with the TC fast path: a fresh daemon over the same conntrack
        // entries (its start-up resync offloads them; priming arms them again).
        let tc_config = dir.join("xdp-routerd-tc.toml");
        let text =
            fs::read_to_string(config).with_context(|| format!("reading {}", config.display()))?;
        fs::write(&tc_config, force_tc(&text))
            .with_context(|| format!("writing {}", tc_config.display()))?;
        eprintln!("restarting the daemon with datapath = \"tc\"");
        let daemon = Daemon::start_with_config(bin, &tb.rtr, &tc_config, dir)?;
        prime(&mut tb, Some(&daemon), Family::Ipv4, flows, true)?;
        sides.push(side(&mut tb, &daemon, secs, flows, true)?);
        status = daemon.status_text()?;
        daemon.stop()?;
    }
    drop((iperf, echo));
    drop(tb);
    print!("{}", table(&sides, &alone, flows, args.seconds));
    println!(
        "\n=== xdp-routerd status (after the last run)\n{}",
        status.trim_end()
    );
    Ok(())
}

/// The generator on its own: which one the kernel allows, and its rate flat out over the direct
/// pair into a bare sink (no router), the ceiling of every rate measured through the router.
struct GeneratorAlone {
    /// Which generator (live frames, or AF_PACKET and why).
    kind: String,
    /// Delivered into the bare sink, frames/s.
    pps: f64,
}

/// Measures [`GeneratorAlone`] with the lab's UDP stream.
fn generator_alone(tb: &mut Testbed, secs: Duration, flows: u32) -> Result<GeneratorAlone> {
    eprintln!(
        "the generator alone: {UDP_FRAME}-byte UDP flat out over the direct pair into a bare sink"
    );
    let spec = tb.spec(Path::Direct, Family::Ipv4, UDP_FRAME, flows, false);
    let trial = tb.trial(Path::Direct, &spec, None, secs)?;
    if trial.delivered == 0 {
        bail!("nothing arrived at the bare sink over the direct pair: the generator is broken");
    }
    Ok(GeneratorAlone {
        kind: tb.generator().to_string(),
        pps: trial.delivered_pps,
    })
}

/// The config `text` with `datapath = "tc"` as its global setting (a global `datapath` line of
/// its own is dropped; an interface's own setting still wins, and the row's label says what
/// the LAN port ran).
fn force_tc(text: &str) -> String {
    let mut out = format!("{}\n", Datapath::Tc.config_line());
    let mut global = true;
    for line in text.lines() {
        let t = line.trim_start();
        global &= !t.starts_with('[');
        if global && t.starts_with("datapath") && t[8..].trim_start().starts_with('=') {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// One run with the fast path `on` or off, labelled with the datapath the LAN port runs.
fn side(tb: &mut Testbed, daemon: &Daemon, secs: Duration, flows: u32, on: bool) -> Result<Side> {
    check_stop()?;
    daemon.set_fastpath(on)?;
    let label = if on {
        let st = daemon.status_json()?;
        let mode = st["interfaces"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|i| i["name"].as_str() == Some(tb.names.rl.as_str()))
            .and_then(|i| i["attach_mode"].as_str())
            .unwrap_or("?");
        match mode {
            "tc" => "fast path on  (TC)".to_string(),
            "native" => "fast path on  (XDP)".to_string(),
            m => format!("fast path on  ({m})"),
        }
    } else {
        "fast path off (kernel)".to_string()
    };
    eprintln!("{label}: {UDP_FRAME}-byte UDP flat out, iperf3, then UDP at fixed rates");
    let mut side = measure(tb, daemon, secs, flows, on).map_err(|e| {
        e.context(format!(
            "{label}; datapath counters: {}",
            daemon
                .status()
                .map(|st| st.summary())
                .unwrap_or_else(|e| format!("(status failed: {e:#})"))
        ))
    })?;
    side.label = label;
    Ok(side)
}

/// The UDP trial and the TCP transfer with the fast path as it is now; fails when nothing
/// arrived, or, with the fast path on, when it carried nothing.
fn measure(
    tb: &mut Testbed,
    daemon: &Daemon,
    secs: Duration,
    flows: u32,
    on: bool,
) -> Result<Side> {
    let spec = tb.spec(Path::Upload, Family::Ipv4, UDP_FRAME, flows, true);
    let xdp0 = daemon.status()?.forwarded();
    let udp = tb.trial(Path::Upload, &spec, None, secs)?;
    let xdp1 = daemon.status()?.forwarded();
    if udp.delivered == 0 {
        bail!(
            "nothing arrived at the WAN host ({} frames offered through the router)",
            udp.sent
        );
    }
    let udp_xdp = xdp1.saturating_sub(xdp0);
    if on && pct(udp_xdp, udp.delivered) < 50.0 {
        bail!(
            "the fast path is on but forwarded only {udp_xdp} of the {} packets of the UDP \
             stream (the kernel forwarded {})",
            udp.delivered,
            udp.kernel_forwarded
        );
    }
    check_stop()?;
    let k0 = tb.kernel_forwarded()?;
    let cpu0 = both_cpus()?;
    let run = tcp::run(&tb.lan, 1, TcpMode::Upload, secs.as_secs() as u32, TCP_CPU)?;
    let cpu1 = both_cpus()?;
    let k1 = tb.kernel_forwarded()?;
    let xdp2 = daemon.status()?.forwarded();
    if run.upload_mbps <= 0.0 {
        bail!("iperf3 moved no data through the router");
    }
    if on && xdp2 == xdp1 {
        bail!("the fast path is on but forwarded none of the TCP transfer");
    }
    let mut fixed = Vec::new();
    for (frame, mbit, what) in FIXED_RATES {
        check_stop()?;
        let spec = tb.spec(Path::Upload, Family::Ipv4, frame, flows, true);
        let xdp0 = daemon.status()?.forwarded();
        let trial = tb.trial(Path::Upload, &spec, Some(line_rate_pps(mbit, frame)), secs)?;
        let fast = daemon.status()?.forwarded().saturating_sub(xdp0);
        if trial.delivered == 0 {
            bail!("{what}: nothing arrived at the WAN host");
        }
        if on && pct(fast, trial.delivered) < 50.0 {
            bail!(
                "{what}: the fast path is on but forwarded only {fast} of the {} packets \
                 (the kernel forwarded {})",
                trial.delivered,
                trial.kernel_forwarded
            );
        }
        fixed.push(trial);
    }
    Ok(Side {
        label: String::new(),
        udp,
        udp_xdp,
        tcp_mbps: run.upload_mbps,
        tcp_kernel: k1.saturating_sub(k0),
        tcp_xdp: xdp2.saturating_sub(xdp1),
        tcp_endpoints: cpu0[0].share_until(&cpu1[0]),
        tcp_router: cpu0[1].share_until(&cpu1[1]),
        fixed,
    })
}

/// `part / whole` in percent, at most 100.
fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        (100.0 * part as f64 / whole as f64).min(100.0)
    }
}

/// A fast-path run against the kernel's: its rate over the kernel's (×) and the kernel's
/// router CPU cost over its own (÷; per packet or per Gbit/s); "—" where one is unknown.
fn vs_kernel(rate: f64, kernel_rate: f64, cost: Option<f64>, kernel_cost: Option<f64>) -> String {
    let times = if kernel_rate > 0.0 {
        format!("×{:.2}", rate / kernel_rate)
    } else {
        "—".into()
    };
    let less = match (kernel_cost, cost) {
        (Some(k), Some(c)) if c > 0.0 => format!("÷{:.2}", k / c),
        _ => "—".into(),
    };
    format!("{times}  {less:>6}")
}

/// CPU0 and CPU1 now.
fn both_cpus() -> Result<[CpuTimes; 2]> {
    Ok([CpuTimes::read(GEN_CPU)?, CpuTimes::read(ROUTER_CPU)?])
}

/// The three small tables: the kernel's run first, then each fast-path run with its ratio to the
/// kernel's; UDP rates within 10 % of the generator's own (`alone`) are marked "≥".
fn table(sides: &[Side], alone: &GeneratorAlone, flows: u32, secs: u32) -> String {
    let mut s = String::new();
    let Some(off) = sides.first() else {
        return s;
    };
    let _ = writeln!(
        s,
        "\n=== {UDP_FRAME}-byte UDP LAN → WAN through the router: {flows} flows, generator flat \
         out ({:.1} Mpps offered), {secs} s each",
        sides.iter().map(|d| d.udp.offered_pps).sum::<f64>() / sides.len() as f64 / 1e6
    );
    let _ = writeln!(
        s,
        "generator: {}; alone, flat out into a bare sink (direct pair, no router): {:.0} Kpps",
        alone.kind,
        alone.pps / 1e3
    );
    let _ = writeln!(
        s,
        "{:<24}{:>14}{:>14}{:>16}{:>26}{:>22}",
        "", "delivered", "router CPU1", "router ns/pkt", "forwarded by kernel/fast", "vs kernel"
    );
    // The router's own CPU time per packet: CPU1's system share (the router's NAPI thread) over
    // the delivered rate; the sink's softirq and idle time are left out.
    let router_ns = |side: &Side| {
        side.udp
            .router_cpu
            .system_ns_per_packet(side.udp.delivered_pps)
    };
    for side in sides {
        let vs = if std::ptr::eq(side, off) {
            String::new()
        } else {
            vs_kernel(
                side.udp.delivered_pps,
                off.udp.delivered_pps,
                router_ns(side),
                router_ns(off),
            )
        };
        let bound = if generator_bound(side.udp.delivered_pps, alone.pps) {
            "≥"
        } else {
            ""
        };
        let row = format!(
            "{:<24}{:>9} Kpps{:>12.0} %{:>13.0} ns{:>17.0} % /{:>4.0} %{:>22}",
            side.label,
            format!("{bound}{:.0}", side.udp.delivered_pps / 1e3),
            side.udp.router_cpu.busy,
            router_ns(side).unwrap_or(0.0),
            pct(side.udp.kernel_forwarded, side.udp.delivered),
            pct(side.udp_xdp, side.udp.delivered),
            vs,
        );
        let _ = writeln!(s, "{}", row.trim_end());
    }
    s.push_str(
        "(≥: within 10 % of the generator's own rate, so generator-bound: the router may be \
         faster, and its × a lower bound; ×: delivered packets; ÷N: the kernel spent N times \
         this run's router ns/pkt, the router's own CPU per packet without the WAN host's \
         receive that shares CPU1)\n",
    );
    let _ = writeln!(
        s,
        "\n=== TCP LAN → WAN through the router: iperf3, 1 stream, {secs} s each"
    );
    let _ = writeln!(
        s,
        "{:<24}{:>14}{:>8}{:>8}{:>13}{:>13}{:>26}{:>22}",
        "",
        "throughput",
        "CPU0",
        "CPU1",
        "router CPU1",
        "per Gbit/s",
        "forwarded by kernel/fast",
        "vs kernel"
    );
    // The router's CPU1 system share (its NAPI threads) per Gbit/s of the TCP transfer.
    let router_per_gbit = |side: &Side| side.tcp_router.system_per_gbit(side.tcp_mbps);
    for side in sides {
        let total = side.tcp_kernel + side.tcp_xdp;
        let vs = if std::ptr::eq(side, off) {
            String::new()
        } else {
            vs_kernel(
                side.tcp_mbps,
                off.tcp_mbps,
                router_per_gbit(side),
                router_per_gbit(off),
            )
        };
        let row = format!(
            "{:<24}{:>7.2} Gbit/s{:>6.0} %{:>6.0} %{:>11.1} %{:>11.1} %{:>17.0} % /{:>4.0} %{:>22}",
            side.label,
            side.tcp_mbps / 1e3,
            side.tcp_endpoints.busy,
            side.tcp_router.busy,
            side.tcp_router.system,
            router_per_gbit(side).unwrap_or(0.0),
            pct(side.tcp_kernel, total),
            pct(side.tcp_xdp, total),
            vs,
        );
        let _ = writeln!(s, "{}", row.trim_end());
    }
    s.push_str(
        "(CPU0, CPU1: busy. CPU0 runs both iperf3 processes; CPU1 the router's NAPI threads and, \
         as softirq, the hosts' receive of what the router sends them (the WAN host's data, the \
         LAN host's ACKs): where CPU1 is near 100 % it bounds the stream, and the router has only \
         part of it. Router CPU1: its system time (the router's NAPI threads), also per Gbit/s \
         of the stream; ×: throughput, ÷N: the kernel spent N times this run's router CPU per Gbit/s; \
         forwarded: packets as each path counts them, a GRO aggregate as one in the kernel and on \
         TC)\n",
    );
    s.push_str(&fixed_table(sides, secs));
    s
}

/// The router's CPU at each fixed offered rate: CPU1's system share (the router's NAPI
/// thread), the loss, and how many times less CPU than the kernel the fast path needed.
fn fixed_table(sides: &[Side], secs: u32) -> String {
    let mut s = String::new();
    let Some(off) = sides.first() else {
        return s;
    };
    let _ = writeln!(
        s,
        "\n=== Router CPU at a fixed offered rate, UDP LAN → WAN: CPU1's system time (the \
         router's NAPI thread), {secs} s each"
    );
    let mut head = format!("{:<24}", "");
    for (frame, mbit, what) in FIXED_RATES {
        let col = format!("{what} ({:.0} Kpps)", line_rate_pps(mbit, frame) / 1e3);
        let _ = write!(head, "{col:>36}");
    }
    let _ = writeln!(s, "{head}");
    let mut sub = format!("{:<24}", "");
    for _ in FIXED_RATES {
        let _ = write!(sub, "{:>12}{:>12}{:>12}", "router CPU", "loss", "vs kernel");
    }
    let _ = writeln!(s, "{sub}");
    for side in sides {
        let mut row = format!("{:<24}", side.label);
        for (i, trial) in side.fixed.iter().enumerate() {
            let cpu = trial.router_cpu.system;
            let vs = match off.fixed.get(i) {
                Some(k) if !std::ptr::eq(side, off) && cpu > 0.0 => {
                    format!("÷{:.1}", k.router_cpu.system / cpu)
                }
                _ => String::new(),
            };
            let _ = write!(
                row,
                "{:>10.1} %{:>10.2} %{:>12}",
                cpu,
                100.0 * trial.loss,
                vs
            );
        }
        let _ = writeln!(s, "{}", row.trim_end());
    }
    s.push_str(
        "(÷N: the kernel needed N times this CPU for the same traffic; CPU1 also runs the WAN \
         host's receive, as softirq, which is left out)\n",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::{CpuShare, GeneratorAlone, Side, Trial, force_tc, line_rate_pps, table};

    /// A run whose router CPU1 had `system` % system time: at `pps` delivered 64 B packets
    /// (96 % busy), and over a TCP stream of `mbps` (`tcp_system` % system time).
    fn side(label: &str, pps: f64, system: f64, mbps: f64, tcp_system: f64) -> Side {
        let share = |busy, system| CpuShare {
            busy,
            system,
            softirq: busy - system,
        };
        let trial = Trial {
            requested_pps: None,
            sent: 0,
            delivered: pps as u64,
            secs: 1.0,
            offered_pps: 0.0,
            delivered_pps: pps,
            loss: 0.0,
            router_cpu: share(96.0, system),
            kernel_forwarded: 0,
        };
        Side {
            label: label.into(),
            udp_xdp: trial.delivered,
            udp: trial,
            tcp_mbps: mbps,
            tcp_kernel: 0,
            tcp_xdp: 1,
            tcp_endpoints: share(40.0, 30.0),
            tcp_router: share(96.0, tcp_system),
            fixed: Vec::new(),
        }
    }

    #[test]
    fn ratios_are_to_the_kernels_run() {
        // Kernel: 400 Kpps at 80 % system (2,000 ns/pkt); TCP 3 Gbit/s at 42 % (14 % per
        // Gbit/s). TC: 1,000 Kpps at 72 % (720 ns/pkt); 4.5 Gbit/s at 31.5 % (7 %).
        let sides = [
            side("kernel", 400e3, 80.0, 3000.0, 42.0),
            side("tc", 1000e3, 72.0, 4500.0, 31.5),
        ];
        // The generator alone delivers 1,050 Kpps: TC's 1,000 Kpps is generator-bound.
        let alone = GeneratorAlone {
            kind: "AF_PACKET TX ring".into(),
            pps: 1050e3,
        };
        let t = table(&sides, &alone, 8, 10);
        assert!(
            t.contains(
                "generator: AF_PACKET TX ring; alone, flat out into a bare sink (direct \
                        pair, no router): 1050 Kpps"
            ),
            "{t}"
        );
        let row = |label: &str, n: usize| {
            t.lines()
                .filter(|l| l.starts_with(label))
                .nth(n)
                .unwrap_or_else(|| panic!("no row {n} for {label} in\n{t}"))
                .to_string()
        };
        let udp = row("tc", 0);
        assert!(udp.contains("≥1000 Kpps"), "{udp}");
        assert!(udp.contains("720 ns"), "{udp}");
        assert!(row("kernel", 0).contains(" 400 Kpps"), "{t}");
        assert!(udp.ends_with("×2.50   ÷2.78"), "{udp}");
        let tcp = row("tc", 1);
        assert!(tcp.contains("31.5 %"), "{tcp}");
        assert!(tcp.contains("7.0 %"), "{tcp}");
        assert!(tcp.ends_with("×1.50   ÷2.00"), "{tcp}");
        // The kernel's own rows carry no ratio.
        assert!(row("kernel", 0).ends_with("0 %"), "{t}");
        assert!(row("kernel", 1).ends_with("0 %"), "{t}");
    }

    #[test]
    fn line_rates_count_preamble_and_gap() {
        assert_eq!(line_rate_pps(100, 64).round(), 148_810.0);
        assert_eq!(line_rate_pps(1000, 1518).round(), 81_274.0);
        assert_eq!(line_rate_pps(10_000, 64).round(), 14_880_952.0);
    }

    #[test]
    fn force_tc_replaces_the_global_datapath_only() {
        let text = "xdp_mode = \"native\"\n  datapath= \"xdp\" # mine\ndatapath_x = 1\n\
                    [[interface]]\nname = \"eth0\"\ndatapath = \"xdp\"\n";
        assert_eq!(
            force_tc(text),
            "datapath = \"tc\"\nxdp_mode = \"native\"\ndatapath_x = 1\n[[interface]]\n\
             name = \"eth0\"\ndatapath = \"xdp\"\n"
        );
        assert_eq!(force_tc(""), "datapath = \"tc\"\n");
    }
}
