//! The router under test: firewall/shaper scenarios as a user would configure them (iptables,
//! tc), and the real `xdp-routerd` started in the router namespace and driven through its CLI.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;

use xdp_router_testbed::{
    daemon::{self as shared, Stop},
    netns::Netns,
};

use crate::packet::Family;

/// The fast path the benchmark's "fast path" rows measure, on both router ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Datapath {
    /// Native XDP (the path of ports whose driver has it).
    Xdp,
    /// The TC fast path at TCX ingress (the path of ports without native XDP: Realtek, Wi-Fi,
    /// SoC switch ports, USB NICs).
    Tc,
}

impl Datapath {
    /// The daemon's global config line that selects it.
    pub fn config_line(self) -> &'static str {
        match self {
            Datapath::Xdp => "datapath = \"xdp\"",
            Datapath::Tc => "datapath = \"tc\"",
        }
    }

    /// What reports call it.
    pub fn label(self) -> &'static str {
        match self {
            Datapath::Xdp => "native XDP",
            Datapath::Tc => "TC (TCX ingress, on socket buffers)",
        }
    }
}

/// A router configuration under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// S1: routed, no filtering. One `ESTABLISHED,RELATED` accept rule (policy ACCEPT) keeps
    /// conntrack active, since the fast path learns flows from conntrack.
    S1,
    /// S2: routed + IPv4 MASQUERADE on the WAN side + `ESTABLISHED,RELATED` accept + 25
    /// non-matching FORWARD rules, policy DROP (new connections only from the LAN).
    S2,
    /// S3: S2 + HTB (pfifo leaf) on the WAN egress: uploads shaped, the WAN interface
    /// configured `shaped = true`; measured in the download direction.
    S3,
    /// S2 with the LAN as a bridge (`br-lan` over the LAN port, configured by the bridge's
    /// name): XDP on the port, downloads redirected to it through the bridge FDB; measured in
    /// the download direction.
    S4,
}

/// The bridge of [`Scenario::S4`].
pub const BRIDGE: &str = "br-lan";

impl Scenario {
    /// Short name (`S1`…).
    pub fn id(self) -> &'static str {
        match self {
            Scenario::S1 => "S1",
            Scenario::S2 => "S2",
            Scenario::S3 => "S3",
            Scenario::S4 => "S4",
        }
    }

    /// One-line description for reports.
    pub fn label(self) -> &'static str {
        match self {
            Scenario::S1 => "routed (conntrack on, no rules to walk)",
            Scenario::S2 => "routed + MASQUERADE + est. accept + 25 rules",
            Scenario::S3 => "S2 + HTB on upload (download measured)",
            Scenario::S4 => "S2 with a bridged LAN (br-lan; download measured)",
        }
    }

    /// Whether `family` is masqueraded (IPv4 only: IPv6 is routed, as usual).
    pub fn nat(self, family: Family) -> bool {
        family == Family::Ipv4 && self != Scenario::S1
    }

    /// Whether the WAN egress has a shaper.
    pub fn shaped(self) -> bool {
        self == Scenario::S3
    }

    /// Whether the download direction is measured (WAN → LAN).
    pub fn download(self) -> bool {
        matches!(self, Scenario::S3 | Scenario::S4)
    }

    /// The router's LAN interface as the kernel routes it (and the config names it): the
    /// bridge in S4, else the LAN port `rl`.
    pub fn lan_if(self, rl: &str) -> String {
        if self == Scenario::S4 {
            BRIDGE.into()
        } else {
            rl.into()
        }
    }
}

/// A FORWARD filter (and IPv4 NAT) as a user would write it.
#[derive(Clone, Copy, Debug)]
struct Firewall {
    /// FORWARD policy DROP with a LAN → WAN accept rule (else policy ACCEPT).
    drop_policy: bool,
    /// Non-matching rules between the `ESTABLISHED,RELATED` accept and the LAN → WAN accept.
    decoys: u32,
    /// IPv4 MASQUERADE out of the WAN interface.
    masquerade: bool,
}

impl Firewall {
    /// A home router: MASQUERADE, policy DROP, `ESTABLISHED,RELATED` and LAN → WAN accepted.
    const HOME: Firewall = Firewall {
        drop_policy: true,
        decoys: 0,
        masquerade: true,
    };

    fn of(sc: Scenario) -> Firewall {
        Firewall {
            drop_policy: sc != Scenario::S1,
            decoys: if sc == Scenario::S1 { 0 } else { 25 },
            masquerade: sc.nat(Family::Ipv4),
        }
    }

    /// The iptables-restore input (`v6` selects ip6tables, which gets the filter only).
    fn ruleset(self, v6: bool, rl: &str, rw: &str) -> String {
        let mut r = String::from("*filter\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n");
        let policy = if self.drop_policy { "DROP" } else { "ACCEPT" };
        let _ = writeln!(r, ":FORWARD {policy} [0:0]");
        r.push_str("-A FORWARD -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT\n");
        for i in 1..=self.decoys {
            let src = if v6 {
                format!("2001:db8::{i:x}/128")
            } else {
                format!("192.0.2.{i}/32")
            };
            let _ = writeln!(
                r,
                "-A FORWARD -s {src} -p tcp --dport {} -j DROP",
                10_000 + i
            );
        }
        if self.drop_policy {
            let _ = writeln!(r, "-A FORWARD -i {rl} -o {rw} -j ACCEPT");
        }
        r.push_str("COMMIT\n");
        if !v6 && self.masquerade {
            r.push_str(
                "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n",
            );
            r.push_str(":POSTROUTING ACCEPT [0:0]\n");
            let _ = writeln!(r, "-A POSTROUTING -o {rw} -j MASQUERADE");
            r.push_str("COMMIT\n");
        }
        r
    }

    /// Loads the rules into the router namespace with iptables-restore and ip6tables-restore.
    fn install(self, rtr: &Netns, rl: &str, rw: &str, what: &str) -> Result<()> {
        for (tool, v6) in [("iptables-restore", false), ("ip6tables-restore", true)] {
            let rules = self.ruleset(v6, rl, rw);
            let mut child = rtr
                .command(tool)
                .stdin(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .with_context(|| format!("cannot run {tool} (install iptables)"))?;
            if let Some(mut stdin) = child.stdin.take() {
                std::io::Write::write_all(&mut stdin, rules.as_bytes())?;
            }
            let out = child.wait_with_output()?;
            if !out.status.success() {
                bail!(
                    "{tool} rejected the {what} ruleset: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
        Ok(())
    }
}

/// Installs `sc` in the router namespace (replacing any previous scenario) and flushes
/// conntrack.
pub fn apply_scenario(
    rtr: &Netns,
    sc: Scenario,
    rl: &str,
    rw: &str,
    shaper_mbit: u32,
) -> Result<()> {
    clear_scenario(rtr, rl, rw)?;
    if sc == Scenario::S4 {
        bridge_lan(rtr, rl)?;
    }
    Firewall::of(sc).install(rtr, &sc.lan_if(rl), rw, sc.id())?;
    if sc.shaped() {
        rtr.sh(&format!(
            "tc qdisc replace dev {rw} root handle 1: htb default 10 && \
             tc class add dev {rw} parent 1: classid 1:10 htb rate {shaper_mbit}mbit \
             ceil {shaper_mbit}mbit && \
             tc qdisc add dev {rw} parent 1:10 handle 10: pfifo limit 1000"
        ))
        .context("installing the HTB shaper (needs sch_htb)")?;
    }
    flush_conntrack(rtr)
}

/// Installs a home router's firewall in the router namespace: IPv4 MASQUERADE out of `rw`,
/// FORWARD policy DROP, `ESTABLISHED,RELATED` and `rl` → `rw` accepted (the same filter in
/// ip6tables, without NAT).
pub fn apply_home_router(rtr: &Netns, rl: &str, rw: &str) -> Result<()> {
    clear_scenario(rtr, rl, rw)?;
    Firewall::HOME.install(rtr, rl, rw, "home router")?;
    flush_conntrack(rtr)
}

/// Removes firewall rules, NAT, the shaper and the LAN bridge from the router namespace (the
/// LAN port `rl` gets its addresses and the LAN host's neighbour entries back).
pub fn clear_scenario(rtr: &Netns, rl: &str, rw: &str) -> Result<()> {
    rtr.sh(&format!(
        "for t in iptables ip6tables; do $t -P FORWARD ACCEPT && $t -F && $t -t nat -F; done; \
         tc qdisc del dev {rw} root 2>/dev/null; true"
    ))?;
    if rtr.sh(&format!("test -d /sys/class/net/{BRIDGE}")).is_ok() {
        rtr.sh(&format!(
            "ip link del {BRIDGE} && ip link set {rl} up && \
             ip addr replace 10.0.1.1/24 dev {rl} && ip addr replace fd00:1::1/64 dev {rl} nodad && \
             ip neigh replace 10.0.1.2 lladdr 02:00:00:00:01:02 dev {rl} nud permanent && \
             ip neigh replace fd00:1::2 lladdr 02:00:00:00:01:02 dev {rl} nud permanent"
        ))?;
    }
    Ok(())
}

/// Makes the LAN a bridge, as OpenWrt has it: `br-lan` (with the LAN port's MAC, so the LAN
/// host's neighbour entry for the router holds) over the port `rl`, the router's LAN addresses
/// and its neighbour entries for the LAN host on the bridge, and the LAN host's MAC as a static
/// FDB entry on the port (the generator's frames reach the bridge only while the fast path is
/// off, so a learned entry could age out between trials).
fn bridge_lan(rtr: &Netns, rl: &str) -> Result<()> {
    rtr.sh(&format!(
        "ip link add {BRIDGE} address 02:00:00:00:01:01 type bridge && \
         ip addr flush dev {rl} && ip link set {rl} master {BRIDGE} && \
         sysctl -qw net.ipv4.conf.{BRIDGE}.rp_filter=0 net.ipv6.conf.{BRIDGE}.accept_ra=0 && \
         ip addr add 10.0.1.1/24 dev {BRIDGE} && ip addr add fd00:1::1/64 dev {BRIDGE} nodad && \
         ip link set {BRIDGE} up && \
         ip neigh replace 10.0.1.2 lladdr 02:00:00:00:01:02 dev {BRIDGE} nud permanent && \
         ip neigh replace fd00:1::2 lladdr 02:00:00:00:01:02 dev {BRIDGE} nud permanent && \
         bridge fdb replace 02:00:00:00:01:02 dev {rl} master static"
    ))
    .context("making the LAN a bridge (needs the bridge module)")?;
    Ok(())
}

/// Deletes every conntrack entry in the router namespace.
pub fn flush_conntrack(rtr: &Netns) -> Result<()> {
    // `conntrack -F` fails when the table was never used in this namespace; that is fine.
    rtr.sh("conntrack -F >/dev/null 2>&1; true")?;
    Ok(())
}

/// ASSURED UDP conntrack entries for benchmark flows (original destination port `port`).
pub fn assured_flows(rtr: &Netns, family: Family, port: u16) -> Result<usize> {
    let out = rtr
        .sh(&format!(
            "conntrack -L -f {} -p udp --dport {port} 2>/dev/null",
            family.name()
        ))
        .context("listing conntrack (install conntrack)")?;
    Ok(out.lines().filter(|l| l.contains("[ASSURED]")).count())
}

/// What `xdp-routerd status --json` reported (the fields the benchmark uses).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Status {
    /// Whether the fast path is on.
    pub fastpath: bool,
    /// Offloaded IPv4 flow entries.
    pub flows_v4: u64,
    /// Offloaded IPv6 flow entries.
    pub flows_v6: u64,
    /// Capacity of each flow map (directions).
    pub capacity: u64,
    /// Packets per datapath reason, summed over interfaces.
    pub reasons: Vec<(String, u64)>,
    /// Conntrack resyncs from a dump since start (the start-up one, then one per event
    /// socket overrun).
    pub ct_resyncs: u64,
    /// Duration of the last conntrack resync, ms.
    pub ct_last_resync_ms: u64,
}

impl Status {
    fn parse(json: &str) -> Result<Status> {
        let v: serde_json::Value =
            serde_json::from_str(json).context("xdp-routerd status --json is not JSON")?;
        let fastpath = v["fastpath"]
            .as_bool()
            .context("status has no boolean `fastpath`")?;
        let flows_v4 = v["flows"]["ipv4"]
            .as_u64()
            .context("status has no flows.ipv4")?;
        let flows_v6 = v["flows"]["ipv6"]
            .as_u64()
            .context("status has no flows.ipv6")?;
        let capacity = v["flows"]["capacity"].as_u64().unwrap_or(0);
        let mut reasons: Vec<(String, u64)> = Vec::new();
        for c in v["counters"].as_array().into_iter().flatten() {
            let (Some(reason), Some(packets)) = (c["reason"].as_str(), c["packets"].as_u64())
            else {
                continue;
            };
            match reasons.iter_mut().find(|(r, _)| r == reason) {
                Some((_, p)) => *p += packets,
                None => reasons.push((reason.to_owned(), packets)),
            }
        }
        Ok(Status {
            fastpath,
            flows_v4,
            flows_v6,
            capacity,
            reasons,
            ct_resyncs: v["conntrack"]["resyncs"].as_u64().unwrap_or(0),
            ct_last_resync_ms: v["conntrack"]["last_resync_ms"].as_u64().unwrap_or(0),
        })
    }

    /// Offloaded flow entries of `family`.
    pub fn flows(&self, family: Family) -> u64 {
        match family {
            Family::Ipv4 => self.flows_v4,
            Family::Ipv6 => self.flows_v6,
        }
    }

    /// `reason=packets` for every non-zero reason, and the flow counts.
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = self
            .reasons
            .iter()
            .filter(|(_, p)| *p > 0)
            .map(|(r, p)| format!("{r}={p}"))
            .collect();
        parts.push(format!(
            "fastpath={} flows ipv4={} ipv6={}",
            self.fastpath, self.flows_v4, self.flows_v6
        ));
        parts.join(" ")
    }

    /// Packets counted under `reason` (its stable name), summed over interfaces.
    pub fn packets(&self, reason: &str) -> u64 {
        self.reasons
            .iter()
            .filter(|(r, _)| r == reason)
            .map(|(_, p)| p)
            .sum()
    }

    /// Packets the datapath forwarded itself (`forwarded_*` reasons).
    pub fn forwarded(&self) -> u64 {
        self.reasons
            .iter()
            .filter(|(r, _)| r.starts_with("forwarded"))
            .map(|(_, p)| p)
            .sum()
    }
}

/// Which CPUs a benchmark's daemon runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DaemonCpus {
    /// The generator CPU only (`taskset`), away from the datapath CPU: the forwarding
    /// benchmarks' daemon, and a router with one CPU to spare for it.
    Generator,
    /// Every CPU, as the packaged service runs it (no CPU affinity).
    Every,
}

/// A running `xdp-routerd` in the router namespace (the shared [`shared::Daemon`]); stopped
/// (SIGTERM, then SIGKILL) on drop.
pub struct Daemon(shared::Daemon);

impl Daemon {
    /// Writes a config for the two router interfaces into `dir` and starts the daemon (pinned
    /// to the generator CPU, away from the datapath CPU), waiting until it answers `status`.
    pub fn start(
        bin: &Path,
        rtr: &Netns,
        dir: &Path,
        rl: &str,
        rw: &str,
        shaped_wan: bool,
    ) -> Result<Daemon> {
        Daemon::start_tuned(bin, rtr, dir, rl, rw, shaped_wan, "")
    }

    /// [`Daemon::start`] with `extra` top-level config lines (e.g. a small
    /// `conntrack_event_buffer`, to force event socket overruns).
    pub fn start_tuned(
        bin: &Path,
        rtr: &Netns,
        dir: &Path,
        rl: &str,
        rw: &str,
        shaped_wan: bool,
        extra: &str,
    ) -> Result<Daemon> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let socket = dir.join("control.sock");
        let config = dir.join("xdp-routerd.toml");
        let shaped = if shaped_wan { "shaped = true\n" } else { "" };
        fs::write(
            &config,
            format!(
                "control_socket = \"{}\"\nxdp_mode = \"native\"\nflow_capacity = 65536\n\
                 keepalive_interval_ms = 2000\nlog_level = \"info\"\n{extra}\n\
                 [[interface]]\nname = \"{rl}\"\nrole = \"lan\"\n\n\
                 [[interface]]\nname = \"{rw}\"\nrole = \"wan\"\n{shaped}",
                socket.display()
            ),
        )
        .with_context(|| format!("writing {}", config.display()))?;
        Daemon::start_with_config(bin, rtr, &config, dir)
    }

    /// Starts the daemon with the config file `config` and the control socket and log in `dir`
    /// (pinned to the generator CPU, away from the datapath CPU), waiting until it answers
    /// `status`. It runs in its own process group: a Ctrl-C reaches the benchmark, which then
    /// stops the daemon in order (SIGTERM, detach) while tearing the testbed down.
    pub fn start_with_config(bin: &Path, rtr: &Netns, config: &Path, dir: &Path) -> Result<Daemon> {
        Daemon::start_waiting(bin, rtr, config, dir, Duration::from_secs(15))
    }

    /// [`Daemon::start_with_config`], waiting up to `wait` for the first `status` answer (the
    /// daemon answers once its conntrack resync is done: long with a million entries).
    pub fn start_waiting(
        bin: &Path,
        rtr: &Netns,
        config: &Path,
        dir: &Path,
        wait: Duration,
    ) -> Result<Daemon> {
        Daemon::start_on(DaemonCpus::Generator, bin, rtr, config, dir, wait)
    }

    /// [`Daemon::start_waiting`] on the CPUs `cpus`.
    pub fn start_on(
        cpus: DaemonCpus,
        bin: &Path,
        rtr: &Netns,
        config: &Path,
        dir: &Path,
        wait: Duration,
    ) -> Result<Daemon> {
        use std::os::unix::process::CommandExt as _;
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let socket = dir.join("control.sock");
        let _ = fs::remove_file(&socket);
        let mut command = match cpus {
            DaemonCpus::Generator => {
                let mut taskset = rtr.command("taskset");
                taskset
                    .arg("-c")
                    .arg(crate::testbed::GEN_CPU.to_string())
                    .arg(bin);
                taskset
            }
            DaemonCpus::Every => rtr.command(&bin.to_string_lossy()),
        };
        command.process_group(0);
        let mut d =
            shared::Daemon::spawn(command, bin, config, &socket, &dir.join("xdp-routerd.log"))?;
        d.wait_answering(wait)?;
        Ok(Daemon(d))
    }

    /// The daemon's process id (`ip netns exec` and `taskset` exec in place).
    pub fn pid(&self) -> u32 {
        self.0
            .pid()
            .expect("the daemon runs until stop() or drop ends it")
    }

    /// Sends the daemon a signal (SIGSTOP/SIGCONT: a daemon descheduled for a while).
    pub fn signal(&self, sig: libc::c_int) -> Result<()> {
        let pid = libc::pid_t::try_from(self.pid()).context("daemon pid")?;
        // SAFETY: kill(2) on our own child, which has not been reaped (it runs until stop()).
        if unsafe { libc::kill(pid, sig) } != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("sending signal {sig} to the daemon"));
        }
        Ok(())
    }

    /// The ids of the BPF maps the daemon holds open.
    pub fn map_ids(&self) -> Result<Vec<u32>> {
        self.0.map_ids()
    }

    /// The last line of the daemon's log.
    fn log_tail(&self) -> String {
        fs::read_to_string(self.0.log())
            .ok()
            .and_then(|s| s.lines().last().map(str::to_owned))
            .unwrap_or_else(|| format!("(see {})", self.0.log().display()))
    }

    fn cli(&self, args: &[&str]) -> Result<String> {
        self.0.cli(args)
    }

    /// `xdp-routerd status` as a user sees it.
    pub fn status_text(&self) -> Result<String> {
        self.cli(&["status"])
    }

    /// `xdp-routerd flows` as a user sees it.
    pub fn flows_text(&self) -> Result<String> {
        self.cli(&["flows"])
    }

    /// `xdp-routerd status --json`.
    pub fn status(&self) -> Result<Status> {
        Status::parse(&self.cli(&["status", "--json"])?)
    }

    /// `xdp-routerd status --json`, all of it.
    pub fn status_json(&self) -> Result<serde_json::Value> {
        serde_json::from_str(&self.cli(&["status", "--json"])?)
            .context("xdp-routerd status --json is not JSON")
    }

    /// The daemon's log so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(self.0.log()).unwrap_or_default()
    }

    /// `xdp-routerd fastpath on|off`, then checks that `status` agrees.
    pub fn set_fastpath(&self, on: bool) -> Result<()> {
        self.cli(&["fastpath", if on { "on" } else { "off" }])?;
        let st = self.status()?;
        if st.fastpath != on {
            bail!(
                "xdp-routerd fastpath {on}: status still says fastpath={}",
                st.fastpath
            );
        }
        Ok(())
    }

    /// `xdp-routerd verdict-age MS`, then checks that `status` agrees.
    pub fn set_verdict_age(&self, ms: u64) -> Result<()> {
        self.cli(&["verdict-age", &ms.to_string()])?;
        let now = self.status_json()?["ruleset"]["verdict_max_age_ms"].as_u64();
        if now != Some(ms) {
            bail!("xdp-routerd verdict-age {ms}: status says {now:?}");
        }
        Ok(())
    }

    /// Waits until at least `n` flow entries of `family` are offloaded (at most `timeout`).
    pub fn wait_flows(&self, family: Family, n: u64, timeout: Duration) -> Result<Status> {
        let deadline = Instant::now() + timeout;
        loop {
            let st = self.status()?;
            if st.flows(family) >= n {
                return Ok(st);
            }
            if Instant::now() > deadline {
                bail!(
                    "xdp-routerd offloaded only {} {} flow entries of the {n} primed flows \
                     within {timeout:?} (conntrack has them ASSURED); log: {}",
                    st.flows(family),
                    family.name(),
                    self.0.log().display()
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the daemon with SIGTERM (it detaches its programs) and waits for it.
    pub fn stop(mut self) -> Result<()> {
        self.terminate()
    }

    fn terminate(&mut self) -> Result<()> {
        match self.0.terminate()? {
            Stop::NotRunning | Stop::ExitedBefore(_) => Ok(()),
            Stop::Exited(st) if st.success() => Ok(()),
            Stop::Exited(st) => bail!(
                "xdp-routerd exited with {st} on SIGTERM; log: {}",
                self.log_tail()
            ),
            Stop::Killed => bail!("xdp-routerd ignored SIGTERM for 5 s and was killed"),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Err(e) = self.terminate() {
            eprintln!("warning: {e:#}");
        }
    }
}

/// Finds (and with `build`, first builds) the release `xdp-routerd` of this workspace.
pub fn locate_daemon(explicit: Option<&Path>, build: bool) -> Result<PathBuf> {
    if let Some(p) = explicit {
        if !p.is_file() {
            bail!("--daemon {}: no such file", p.display());
        }
        return Ok(p.to_owned());
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("workspace root")?
        .to_owned();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    if build {
        eprintln!("building the daemon: cargo build --release -p xdp-routerd");
        let st = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .args(["build", "--release", "-p", "xdp-routerd"])
            .current_dir(&root)
            .status()
            .context("running cargo")?;
        if !st.success() {
            bail!("cargo build --release -p xdp-routerd failed");
        }
    }
    let bin = target.join("release").join("xdp-routerd");
    if !bin.is_file() {
        bail!(
            "{} not found: run `cargo build --release -p xdp-routerd`",
            bin.display()
        );
    }
    Ok(bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rulesets_match_the_scenarios() {
        let s1 = Firewall::of(Scenario::S1).ruleset(false, "rl", "rw");
        assert!(s1.contains(":FORWARD ACCEPT"));
        assert!(!s1.contains("MASQUERADE"));
        assert!(!s1.contains("-i rl"));
        let s2 = Firewall::of(Scenario::S2).ruleset(false, "rl", "rw");
        assert_eq!(s2.matches("-j DROP").count(), 25);
        assert!(s2.contains("-A POSTROUTING -o rw -j MASQUERADE"));
        assert!(s2.find("ESTABLISHED").unwrap() < s2.find("192.0.2.1/32").unwrap());
        assert!(s2.find("192.0.2.25/32").unwrap() < s2.find("-i rl -o rw -j ACCEPT").unwrap());
        let s3v6 = Firewall::of(Scenario::S3).ruleset(true, "rl", "rw");
        assert!(s3v6.contains("2001:db8::19/128"));
        assert!(!s3v6.contains("*nat"));
        let home = Firewall::HOME.ruleset(false, "eth1", "eth0");
        assert!(home.contains(":FORWARD DROP"));
        assert!(!home.contains("-j DROP"));
        assert!(home.contains("-A FORWARD -i eth1 -o eth0 -j ACCEPT"));
        assert!(home.contains("-A POSTROUTING -o eth0 -j MASQUERADE"));
    }

    #[test]
    fn status_json_is_read() {
        let st = Status::parse(
            r#"{"fastpath": true, "interfaces": [],
               "flows": {"ipv4": 2, "ipv6": 1, "capacity": 65536},
               "counters": [{"interface": "a", "reason": "forwarded_original", "packets": 10, "bytes": 1},
                            {"interface": "b", "reason": "forwarded_reply", "packets": 5, "bytes": 1},
                            {"interface": "b", "reason": "no_flow", "packets": 7, "bytes": 1}],
               "conntrack": {"events": 1}}"#,
        )
        .unwrap();
        assert!(st.fastpath);
        assert_eq!(st.flows(Family::Ipv6), 1);
        assert_eq!(st.forwarded(), 15);
        assert!(st.summary().contains("no_flow=7"));
        assert!(Status::parse(r#"{"flows": {}}"#).is_err());
    }
}
