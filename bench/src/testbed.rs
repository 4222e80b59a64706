//! The testbed: LAN host ⇄ router ⇄ WAN host namespaces, a direct LAN ⇄ WAN pair for the
//! generator's own ceiling, generators on both hosts and counting sinks on every receiver.
//!
//! ```text
//!  lan ns                              rtr ns (router under test)                wan ns
//!  l0  10.0.1.2  fd00:1::2  <-veth->  rl<pid> 10.0.1.1 | rw<pid> 10.0.2.1  <-veth->  w0 10.0.2.2 fd00:2::2
//!  gd  10.0.9.1  fd00:9::1  <----------------- veth (no router) ---------------->  sd<pid> 10.0.9.2
//!  lk/lk1 spare veth (down)                                                  wk/wk1 spare veth (down)
//! ```
//! The spare pairs keep the live-frames generator program attached (see `Generator::new`); where
//! the kernel refuses live frames, the AF_PACKET generator sends into `lk`/`wk` and the bare
//! redirect on `lk1`/`wk1` forwards the frames out of `l0`/`gd`/`w0`, so they reach the router
//! as XDP frames, as live frames do.
//!
//! CPU0 runs the generators, CPU1 the router: the NAPI threads of `rl`/`rw` (and `sd` for the
//! generator ceiling) are threaded and pinned there; the sinks on `l0`/`w0` run as softirq right
//! after the router's poll on the same CPU.

use std::{net::IpAddr, thread, time::Duration};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use xdp_router_common::lab::LAB_PORT;
use xdp_router_testbed::netns::{self, Netns};

use crate::{
    cpu::{CpuShare, CpuTimes},
    generator::{GenKind, Generator},
    lab::{Sink, ifindex},
    packet::{Family, FrameSpec},
    pin::{pin_pid, set_fifo},
    search::Outcome,
};

/// CPU of the generators (and of the orchestration and the daemon).
pub const GEN_CPU: usize = 0;
/// CPU of the router's datapath (its NAPI threads) and the sinks.
pub const ROUTER_CPU: usize = 1;

/// Real-time priority of the router's NAPI threads (see [`set_fifo`]).
const NAPI_PRIO: i32 = 50;

/// Port of flow 0 of the benchmark streams.
pub const PORT_BASE: u16 = 20_000;

/// Time for frames still in rings to reach the sink after the generator stops.
const SETTLE: Duration = Duration::from_millis(30);

const MAC_L0: [u8; 6] = [2, 0, 0, 0, 1, 2];
const MAC_RL: [u8; 6] = [2, 0, 0, 0, 1, 1];
const MAC_RW: [u8; 6] = [2, 0, 0, 0, 2, 1];
const MAC_W0: [u8; 6] = [2, 0, 0, 0, 2, 2];
const MAC_GD: [u8; 6] = [2, 0, 0, 0, 9, 1];
const MAC_SD: [u8; 6] = [2, 0, 0, 0, 9, 2];

fn mac(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn ip(s: &str) -> IpAddr {
    s.parse()
        .unwrap_or_else(|_| unreachable!("constant address {s}"))
}

/// Which way a stream goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Path {
    /// LAN host → router → WAN host (original direction: "upload").
    Upload,
    /// WAN host → router → LAN host (reply direction: "download").
    Download,
    /// LAN host → WAN host over the direct pair, no router (the generator's own ceiling).
    Direct,
}

/// Interface names of the router and of the ceiling sink.
#[derive(Clone, Debug)]
pub struct Names {
    /// Router interface towards the LAN host.
    pub rl: String,
    /// Router interface towards the WAN host.
    pub rw: String,
    /// WAN-side end of the direct pair.
    pub sd: String,
}

impl Names {
    /// The benchmark's names: `rl<pid>`, `rw<pid>`, `sd<pid>` (unique on the machine, so even
    /// a kernel without NAPI thread reporting lets [`Testbed::pin_napi_threads`] find ours).
    pub fn bench() -> Names {
        let pid = std::process::id();
        Names {
            rl: format!("rl{pid}"),
            rw: format!("rw{pid}"),
            sd: format!("sd{pid}"),
        }
    }

    /// The names of the example config (`config/xdp-routerd.toml`): `eth1` (LAN), `eth0` (WAN).
    pub fn example_config() -> Names {
        Names {
            rl: "eth1".into(),
            rw: "eth0".into(),
            sd: format!("sd{}", std::process::id()),
        }
    }
}

/// One measured trial.
#[derive(Clone, Debug, Serialize)]
pub struct Trial {
    /// Requested rate (frames/s), `None` when the generator ran flat out.
    pub requested_pps: Option<f64>,
    /// Frames sent.
    pub sent: u64,
    /// Frames counted at the sink.
    pub delivered: u64,
    /// Length of the generator run, seconds.
    pub secs: f64,
    /// Offered rate (frames/s).
    pub offered_pps: f64,
    /// Delivered rate (frames/s).
    pub delivered_pps: f64,
    /// Lost fraction (0.0–1.0).
    pub loss: f64,
    /// Router CPU during the run.
    pub router_cpu: CpuShare,
    /// Packets the router's kernel forwarded during the run (IPv4 + IPv6 ForwDatagrams): the
    /// share of the stream that did not take the fast path.
    pub kernel_forwarded: u64,
}

impl Outcome for Trial {
    fn offered_pps(&self) -> f64 {
        self.offered_pps
    }
    fn delivered_pps(&self) -> f64 {
        self.delivered_pps
    }
    fn loss(&self) -> f64 {
        self.loss
    }
}

/// The running testbed; dropping it removes everything (programs first, then namespaces).
pub struct Testbed {
    lan_gen: Generator,
    wan_gen: Generator,
    lan_sink: Sink,
    wan_sink: Sink,
    direct_sink: Sink,
    /// Interface names.
    pub names: Names,
    l0_idx: u32,
    w0_idx: u32,
    gd_idx: u32,
    /// ifindex of the router's WAN interface (for the bare redirect).
    pub rw_idx: u32,
    /// The LAN host.
    pub lan: Netns,
    /// The router.
    pub rtr: Netns,
    /// The WAN host.
    pub wan: Netns,
}

impl Testbed {
    /// Builds the topology in three new namespaces `xr-bench-<pid>-{lan,rtr,wan}`, the router's
    /// and the ceiling sink's interfaces named as `names` says.
    pub fn create(names: Names) -> Result<Testbed> {
        let cpus = thread::available_parallelism().map_or(1, usize::from);
        if cpus <= ROUTER_CPU {
            bail!("the benchmark needs at least 2 CPUs (generator on CPU0, router on CPU1)");
        }
        let pid = std::process::id();
        let lan = Netns::create(&format!("xr-bench-{pid}-lan"))?;
        let rtr = Netns::create(&format!("xr-bench-{pid}-rtr"))?;
        let wan = Netns::create(&format!("xr-bench-{pid}-wan"))?;
        let Names { rl, rw, sd } = &names;
        let pair = |a: &str, ma: [u8; 6], na: &Netns, b: &str, mb: [u8; 6], nb: &Netns| {
            netns::run(
                "ip",
                &[
                    "link",
                    "add",
                    a,
                    "address",
                    &mac(ma),
                    "netns",
                    na.name(),
                    "type",
                    "veth",
                    "peer",
                    "name",
                    b,
                    "address",
                    &mac(mb),
                    "netns",
                    nb.name(),
                ],
            )
        };
        pair("l0", MAC_L0, &lan, rl, MAC_RL, &rtr)?;
        pair(rw, MAC_RW, &rtr, "w0", MAC_W0, &wan)?;
        pair("gd", MAC_GD, &lan, sd, MAC_SD, &wan)?;
        lan.run(
            "ip",
            &["link", "add", "lk", "type", "veth", "peer", "name", "lk1"],
        )?;
        wan.run(
            "ip",
            &["link", "add", "wk", "type", "veth", "peer", "name", "wk1"],
        )?;

        let host_sysctls = "net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 \
             net.ipv6.conf.all.accept_ra=0 net.ipv6.conf.default.accept_ra=0";
        for ns in [&lan, &wan] {
            ns.sh(&format!("sysctl -qw {host_sysctls}"))?;
        }
        rtr.sh(&format!(
            "sysctl -qw {host_sysctls} net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1"
        ))?;
        let addrs: [(&Netns, &str, &str, &str); 6] = [
            (&lan, "l0", "10.0.1.2/24", "fd00:1::2/64"),
            (&lan, "gd", "10.0.9.1/24", "fd00:9::1/64"),
            (&rtr, rl, "10.0.1.1/24", "fd00:1::1/64"),
            (&rtr, rw, "10.0.2.1/24", "fd00:2::1/64"),
            (&wan, "w0", "10.0.2.2/24", "fd00:2::2/64"),
            (&wan, sd, "10.0.9.2/24", "fd00:9::2/64"),
        ];
        for (ns, dev, v4, v6) in addrs {
            ns.sh(&format!(
                "sysctl -qw net.ipv4.conf.{dev}.rp_filter=0 net.ipv6.conf.{dev}.accept_ra=0 && \
                 ip addr add {v4} dev {dev} && ip addr add {v6} dev {dev} nodad && \
                 ethtool -K {dev} tx off rx off >/dev/null 2>&1; ip link set {dev} up"
            ))?;
        }
        // Router side: GRO gives the veth a NAPI instance, so it accepts redirected frames even
        // when no XDP program is attached, and the NAPI (and its pinned thread) survives XDP
        // attach/detach. GSO/TSO off so that nothing aggregates benchmark packets.
        for dev in [rl, rw] {
            rtr.sh(&format!(
                "ethtool -K {dev} gro on gso off tso off >/dev/null && \
                 echo 1 > /sys/class/net/{dev}/threaded"
            ))?;
        }
        lan.sh(
            "ip route add default via 10.0.1.1 && ip -6 route add default via fd00:1::1 && \
             ip neigh replace 10.0.1.1 lladdr 02:00:00:00:01:01 dev l0 nud permanent && \
             ip neigh replace fd00:1::1 lladdr 02:00:00:00:01:01 dev l0 nud permanent && \
             ip neigh replace 10.0.9.2 lladdr 02:00:00:00:09:02 dev gd nud permanent && \
             ip neigh replace fd00:9::2 lladdr 02:00:00:00:09:02 dev gd nud permanent",
        )?;
        wan.sh(
            "ip route add 10.0.1.0/24 via 10.0.2.1 && ip -6 route add fd00:1::/64 via fd00:2::1 && \
             ip neigh replace 10.0.2.1 lladdr 02:00:00:00:02:01 dev w0 nud permanent && \
             ip neigh replace fd00:2::1 lladdr 02:00:00:00:02:01 dev w0 nud permanent",
        )?;
        wan.sh(&format!(
            "ip neigh replace 10.0.9.1 lladdr 02:00:00:00:09:01 dev {sd} nud permanent && \
             ip neigh replace fd00:9::1 lladdr 02:00:00:00:09:01 dev {sd} nud permanent"
        ))?;
        rtr.sh(&format!(
            "ip neigh replace 10.0.1.2 lladdr 02:00:00:00:01:02 dev {rl} nud permanent && \
             ip neigh replace fd00:1::2 lladdr 02:00:00:00:01:02 dev {rl} nud permanent && \
             ip neigh replace 10.0.2.2 lladdr 02:00:00:00:02:02 dev {rw} nud permanent && \
             ip neigh replace fd00:2::2 lladdr 02:00:00:00:02:02 dev {rw} nud permanent"
        ))?;

        let lan_sink = Sink::attach(&lan, "l0")?;
        let wan_sink = Sink::attach(&wan, "w0")?;
        let direct_sink = Sink::attach(&wan, sd)?;
        // The ceiling sink's NAPI exists now (XDP attached): thread it and pin it to the router
        // CPU, so the generator has CPU0 to itself in the ceiling measurement.
        wan.sh(&format!("echo 1 > /sys/class/net/{sd}/threaded"))?;
        let lan_gen = Generator::new(&lan, "lk", "lk1", GEN_CPU)?;
        let wan_gen = Generator::new(&wan, "wk", "wk1", GEN_CPU)?;
        eprintln!("generator: {}", lan_gen.kind());
        let (l0_idx, gd_idx) = lan.enter(|| Ok((ifindex("l0")?, ifindex("gd")?)))?;
        let w0_idx = wan.enter(|| ifindex("w0"))?;
        let rw_idx = rtr.enter(|| ifindex(rw))?;
        let tb = Testbed {
            lan_gen,
            wan_gen,
            lan_sink,
            wan_sink,
            direct_sink,
            names,
            l0_idx,
            w0_idx,
            gd_idx,
            rw_idx,
            lan,
            rtr,
            wan,
        };
        tb.pin_napi_threads()?;
        Ok(tb)
    }

    /// Which generator sends the frames (the same on both hosts: one kernel probed twice).
    pub fn generator(&self) -> &GenKind {
        self.lan_gen.kind()
    }

    /// MACs of the router's interfaces towards the LAN and WAN hosts and of the WAN host.
    pub fn redirect_macs(&self) -> ([u8; 6], [u8; 6]) {
        (MAC_RW, MAC_W0)
    }

    /// Pins the NAPI threads of the router's interfaces and the ceiling sink to the router CPU
    /// and gives them SCHED_FIFO.
    /// Call again whenever something may have re-created them.
    pub fn pin_napi_threads(&self) -> Result<()> {
        let pid = std::process::id().to_string();
        for (ns, dev) in [
            (&self.rtr, &self.names.rl),
            (&self.rtr, &self.names.rw),
            (&self.wan, &self.names.sd),
        ] {
            let threads = match ns.enter(|| crate::napi::thread_pids(ifindex(dev)?)) {
                Ok(t) => t,
                // Kernels before 6.8 do not report NAPI threads; a name that carries our PID
                // still identifies ours among the `napi/<dev>-<id>` threads of the machine.
                Err(e) if dev.contains(&pid) => {
                    eprintln!("note: {e:#}; finding the NAPI thread of {dev} by name");
                    napi_threads_by_name(dev)?
                }
                // Names like `eth0` are not unique on the machine: leave the threads alone
                // rather than pin (and make real-time) another testbed's.
                Err(e) => {
                    eprintln!(
                        "warning: cannot tell which NAPI thread is {dev}'s ({e:#}): left \
                         unpinned, so the numbers are noisier"
                    );
                    continue;
                }
            };
            if threads.is_empty() {
                bail!("no NAPI thread found for {dev}: threaded NAPI did not start");
            }
            for t in threads {
                pin_pid(t, ROUTER_CPU)?;
                set_fifo(t, NAPI_PRIO)?;
            }
        }
        Ok(())
    }

    /// The stream for `path`, `family`, frame `size` and `flows`; `nat` says whether the router
    /// masquerades this family (download frames then go to the router's WAN address).
    pub fn spec(
        &self,
        path: Path,
        family: Family,
        size: usize,
        flows: u32,
        nat: bool,
    ) -> FrameSpec {
        let v4 = family == Family::Ipv4;
        let a = |x4: &str, x6: &str| if v4 { ip(x4) } else { ip(x6) };
        let (src_mac, dst_mac, src_ip, dst_ip, vary_dst) = match path {
            Path::Upload => (
                MAC_L0,
                MAC_RL,
                a("10.0.1.2", "fd00:1::2"),
                a("10.0.2.2", "fd00:2::2"),
                false,
            ),
            Path::Download => (
                MAC_W0,
                MAC_RW,
                a("10.0.2.2", "fd00:2::2"),
                if nat {
                    a("10.0.2.1", "fd00:2::1")
                } else {
                    a("10.0.1.2", "fd00:1::2")
                },
                true,
            ),
            Path::Direct => (
                MAC_GD,
                MAC_SD,
                a("10.0.9.1", "fd00:9::1"),
                a("10.0.9.2", "fd00:9::2"),
                false,
            ),
        };
        FrameSpec {
            frame_size: size,
            src_mac,
            dst_mac,
            src_ip,
            dst_ip,
            fixed_port: LAB_PORT,
            port_base: PORT_BASE,
            flows,
            vary_dst,
        }
    }

    fn parts(&mut self, path: Path) -> (&mut Generator, &Sink, u32) {
        match path {
            Path::Upload => (&mut self.lan_gen, &self.wan_sink, self.l0_idx),
            Path::Download => (&mut self.wan_gen, &self.lan_sink, self.w0_idx),
            Path::Direct => (&mut self.lan_gen, &self.direct_sink, self.gd_idx),
        }
    }

    /// Sends `count` frames of `spec` along `path` at `rate` (priming, background load).
    pub fn send(&mut self, path: Path, spec: &FrameSpec, rate: f64, count: u64) -> Result<()> {
        let frame = spec.frame()?;
        let (generator, _, idx) = self.parts(path);
        let cfg = spec.gen_config(idx)?;
        generator.send(&cfg, &frame, rate, count)?;
        Ok(())
    }

    /// Runs a generator along `path` for `dur` without measuring (background load).
    pub fn load(&mut self, path: Path, spec: &FrameSpec, rate: f64, dur: Duration) -> Result<()> {
        let frame = spec.frame()?;
        let (generator, _, idx) = self.parts(path);
        let cfg = spec.gen_config(idx)?;
        generator.run(&cfg, &frame, Some(rate), dur)?;
        Ok(())
    }

    /// One trial: offers `spec` along `path` (flat out when `rate` is `None`) for `dur` and
    /// counts what arrived.
    pub fn trial(
        &mut self,
        path: Path,
        spec: &FrameSpec,
        rate: Option<f64>,
        dur: Duration,
    ) -> Result<Trial> {
        let frame = spec.frame()?;
        let fwd_before = self.kernel_forwarded()?;
        let (generator, sink, idx) = self.parts(path);
        let cfg = spec.gen_config(idx)?;
        let before = sink.read()?;
        let cpu_before = CpuTimes::read(ROUTER_CPU)?;
        let run = generator.run(&cfg, &frame, rate, dur)?;
        let cpu_after = CpuTimes::read(ROUTER_CPU)?;
        thread::sleep(SETTLE);
        let after = sink.read()?;
        let fwd_after = self.kernel_forwarded()?;
        let delivered = after.packets.saturating_sub(before.packets);
        let secs = run.elapsed.as_secs_f64();
        Ok(Trial {
            requested_pps: rate,
            sent: run.sent,
            delivered,
            secs,
            offered_pps: run.pps(),
            delivered_pps: delivered as f64 / secs.max(1e-9),
            loss: if run.sent == 0 {
                1.0
            } else {
                run.sent.saturating_sub(delivered) as f64 / run.sent as f64
            },
            router_cpu: cpu_before.share_until(&cpu_after),
            kernel_forwarded: fwd_after.saturating_sub(fwd_before),
        })
    }

    /// IPv4 + IPv6 datagrams the router's kernel has forwarded so far.
    pub fn kernel_forwarded(&self) -> Result<u64> {
        self.rtr.enter(|| {
            let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp")
                .context("reading the router's /proc/net/snmp")?;
            let snmp6 = std::fs::read_to_string("/proc/thread-self/net/snmp6")
                .context("reading the router's /proc/net/snmp6")?;
            Ok(forw_datagrams(&snmp)? + forw_datagrams6(&snmp6)?)
        })
    }
}

/// PIDs of the kernel threads named `napi/<dev>-…` (their comm is cut at 15 bytes).
fn napi_threads_by_name(dev: &str) -> Result<Vec<i32>> {
    let prefix = format!("napi/{dev}-");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").context("listing /proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) else {
            continue;
        };
        let comm = comm.trim_end();
        if comm.starts_with(&prefix) || comm == &prefix[..prefix.len().min(15)] {
            found.push(pid);
        }
    }
    Ok(found)
}

/// `Ip: … ForwDatagrams …` from /proc/net/snmp (a header line, then a value line).
fn forw_datagrams(snmp: &str) -> Result<u64> {
    let mut lines = snmp.lines().filter(|l| l.starts_with("Ip:"));
    let (Some(head), Some(vals)) = (lines.next(), lines.next()) else {
        bail!("/proc/net/snmp has no Ip: lines");
    };
    let col = head
        .split_whitespace()
        .position(|c| c == "ForwDatagrams")
        .context("/proc/net/snmp has no ForwDatagrams")?;
    vals.split_whitespace()
        .nth(col)
        .and_then(|v| v.parse().ok())
        .context("/proc/net/snmp: bad ForwDatagrams value")
}

/// `Ip6OutForwDatagrams` from /proc/net/snmp6 (one `name value` per line).
fn forw_datagrams6(snmp6: &str) -> Result<u64> {
    snmp6
        .lines()
        .find_map(|l| {
            let mut it = l.split_whitespace();
            (it.next() == Some("Ip6OutForwDatagrams")).then(|| it.next()?.parse().ok())?
        })
        .context("/proc/net/snmp6 has no Ip6OutForwDatagrams")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_forwarding_counters() {
        let snmp = "Ip: Forwarding DefaultTTL InReceives InHdrErrors InAddrErrors ForwDatagrams\n\
                    Ip: 1 64 100 0 0 42\nIcmp: InMsgs\nIcmp: 0\n";
        assert_eq!(forw_datagrams(snmp).unwrap(), 42);
        let snmp6 = "Ip6InReceives 7\nIp6OutForwDatagrams 13\nIp6InDelivers 1\n";
        assert_eq!(forw_datagrams6(snmp6).unwrap(), 13);
        assert!(forw_datagrams("Tcp: x\n").is_err());
    }
}
