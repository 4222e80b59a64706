//! `cargo xtask lab`: the README's first command. A home router in network namespaces:
//!
//! ```text
//!  lan-host eth0 ⇄ eth1 router eth0 ⇄ eth0 wan-host
//!  10.0.1.2        10.0.1.1  10.0.2.1    10.0.2.2
//! ```
//! with MASQUERADE on the WAN and a FORWARD policy of DROP, xdp-routerd started inside the router
//! namespace with `config/xdp-routerd.toml`, and one iperf3 TCP run LAN→WAN with the fast path
//! off and one with it on. Everything is torn down at the end, on failure and on Ctrl-C.
//! It runs `cargo xtask setup` first, so it also works on a machine that has only Rust.

use std::{
    fs,
    io::{Read as _, Seek as _, SeekFrom},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{cmd, workspace};

/// Options of `cargo xtask lab`.
#[derive(clap::Args)]
pub struct LabArgs {
    /// Seconds of each iperf3 run.
    #[arg(long, default_value_t = 5)]
    seconds: u32,
    /// Use the already built target/release/xdp-routerd instead of building it first.
    #[arg(long)]
    no_build: bool,
}

const WAN_HOST: &str = "10.0.2.2";

/// Runs the lab.
pub fn run(args: &LabArgs) -> anyhow::Result<()> {
    cmd::catch_interrupts();
    if !cmd::is_root() {
        bail!(
            "the lab needs root (network namespaces, XDP, iptables): run `sudo -E env \
             \"PATH=$PATH\" cargo xtask lab`"
        );
    }
    // First use installs what the lab needs (apt packages, rust-src, bpf-linker); a second
    // run only checks (well under a second).
    crate::setup::run()?;
    let config = workspace::root().join("config/xdp-routerd.toml");
    if !config.is_file() {
        bail!("{} is missing", config.display());
    }
    let bin = if args.no_build {
        let bin = workspace::Workspace::load()?.release_daemon();
        if !cmd::is_executable(&bin) {
            bail!("{} is not built (drop --no-build)", bin.display());
        }
        bin
    } else {
        workspace::build_release_daemon()?
    };
    cmd::check_interrupted()?;

    let started = Instant::now();
    let lab = Lab::new()?;
    let mut daemon = Daemon::start(&bin, &lab, &config)?;
    daemon.wait_ready()?;
    let server = Spawned::new(
        lab.wan
            .cmd("iperf3")
            .args(["-s", "-B", WAN_HOST])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start iperf3 server")?,
    );
    sleep(Duration::from_millis(500));

    daemon.ctl(&["fastpath", "off"])?;
    let off = iperf(&lab, args.seconds).context("iperf3 with the fast path off")?;
    daemon.ctl(&["fastpath", "on"])?;
    let on = iperf(&lab, args.seconds).context("iperf3 with the fast path on")?;
    let status = daemon.ctl(&["status"])?;
    drop(server);

    println!(
        "\n=== iperf3 TCP LAN→WAN through the router ({} s each)",
        args.seconds
    );
    println!("  fast path off (kernel):  {:>8.2} Gbit/s", off / 1e9);
    println!(
        "  fast path on  (XDP):     {:>8.2} Gbit/s   ×{:.2}",
        on / 1e9,
        on / off
    );
    println!("\n=== xdp-routerd status\n{}", status.trim_end());
    daemon.stop()?;
    drop(lab);
    println!(
        "\nlab done in {:.1} s (after the build); namespaces removed",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One iperf3 client run from the LAN host; returns the receiver's bits per second.
fn iperf(lab: &Lab, seconds: u32) -> anyhow::Result<f64> {
    cmd::check_interrupted()?;
    let mut last_err = None;
    for _attempt in 0..3 {
        let out = lab
            .lan
            .cmd("iperf3")
            .args(["-c", WAN_HOST, "-J", "-t", &seconds.to_string()])
            .stdin(Stdio::null())
            .output()
            .context("start iperf3 client")?;
        cmd::check_interrupted()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let v: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("iperf3 printed no JSON: {text}"))?;
        if let Some(e) = v["error"].as_str() {
            // The server may not listen yet on the first attempt.
            last_err = Some(e.to_owned());
            sleep(Duration::from_secs(1));
            continue;
        }
        return v["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .context("iperf3 JSON has no end.sum_received.bits_per_second");
    }
    bail!("iperf3: {}", last_err.unwrap_or_default())
}

/// A network namespace, deleted on drop (processes still inside are killed first).
struct Ns {
    name: String,
}

impl Ns {
    fn new(name: String) -> anyhow::Result<Ns> {
        cmd::output(Command::new("ip").args(["netns", "add", &name]))?;
        let ns = Ns { name };
        ns.sh("ip link set lo up")?;
        Ok(ns)
    }

    /// A command that runs `prog` inside the namespace.
    fn cmd(&self, prog: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, prog]);
        c
    }

    /// Runs a shell script inside the namespace (`set -e`).
    fn sh(&self, script: &str) -> anyhow::Result<String> {
        cmd::output(self.cmd("sh").args(["-ec", script]))
            .with_context(|| format!("in netns {}", self.name))
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        if let Ok(o) = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
        {
            for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    // SAFETY: kill has no memory-safety preconditions; these pids live in a
                    // namespace this process created.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// The three namespaces and their configuration; the temporary directory goes with them.
struct Lab {
    // Field order is drop order: namespaces first, then the directory.
    lan: Ns,
    router: Ns,
    wan: Ns,
    dir: TempDir,
}

impl Lab {
    fn new() -> anyhow::Result<Lab> {
        let pid = std::process::id();
        let dir = TempDir::new(&format!("xr-lab-{pid}"))?;
        let lab = Lab {
            lan: Ns::new(format!("xr-lab-{pid}-lan"))?,
            router: Ns::new(format!("xr-lab-{pid}-rtr"))?,
            wan: Ns::new(format!("xr-lab-{pid}-wan"))?,
            dir,
        };
        let r = &lab.router.name;
        // The router's interfaces carry the example config's names: eth1 = LAN, eth0 = WAN.
        lab.router.sh(&format!(
            "ip link add eth1 type veth peer name eth0 netns {lan}
             ip link add eth0 type veth peer name eth0 netns {wan}",
            lan = lab.lan.name,
            wan = lab.wan.name
        ))?;
        for (host, addr, gw) in [(&lab.lan, "10.0.1.2", "10.0.1.1"), (&lab.wan, WAN_HOST, "")] {
            // Hosts: GRO on, so that frames the router XDP_REDIRECTs into the veth are accepted;
            // checksum offload off, so rewritten packets carry real checksums.
            host.sh(&format!(
                "ip addr add {addr}/24 dev eth0
                 ip link set eth0 up
                 ethtool -K eth0 tx off rx off gro on >/dev/null
                 {route}",
                route = if gw.is_empty() {
                    String::new()
                } else {
                    format!("ip route add default via {gw}")
                }
            ))?;
        }
        // The router: a home router's firewall (MASQUERADE on the WAN, FORWARD policy DROP,
        // ESTABLISHED,RELATED and LAN→WAN accepted); GRO/GSO/TSO and checksum offload off.
        lab.router.sh("sysctl -qw net.ipv4.ip_forward=1
             ip addr add 10.0.1.1/24 dev eth1
             ip addr add 10.0.2.1/24 dev eth0
             for i in eth0 eth1; do
               ip link set $i up
               ethtool -K $i tx off rx off gro off gso off tso off >/dev/null
             done
             iptables -t nat -A POSTROUTING -o eth0 -j MASQUERADE
             iptables -P FORWARD DROP
             iptables -A FORWARD -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
             iptables -A FORWARD -i eth1 -o eth0 -j ACCEPT")?;
        lab.lan
            .sh(&format!("ping -c1 -W2 {WAN_HOST} >/dev/null"))
            .with_context(|| format!("the router ({r}) does not forward LAN→WAN"))?;
        Ok(lab)
    }
}

/// The daemon, stopped with SIGTERM on drop (SIGKILL if it does not exit within 5 s).
struct Daemon {
    child: Spawned,
    socket: PathBuf,
    bin: PathBuf,
    log: PathBuf,
}

impl Daemon {
    fn start(bin: &Path, lab: &Lab, config: &Path) -> anyhow::Result<Daemon> {
        let socket = lab.dir.0.join("control.sock");
        let log = lab.dir.0.join("xdp-routerd.log");
        let log_file = fs::File::create(&log).context("create the daemon log")?;
        let child = lab
            .router
            .cmd(&bin.to_string_lossy())
            .arg("run")
            .arg("--config")
            .arg(config)
            .arg("--socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .context("start xdp-routerd")?;
        println!(
            "xdp-routerd started in the router namespace; log: {}",
            log.display()
        );
        Ok(Daemon {
            child: Spawned::new(child),
            socket,
            bin: bin.to_owned(),
            log,
        })
    }

    /// Waits until `status` answers (15 s at most).
    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            cmd::check_interrupted()?;
            if let Some(st) = self
                .child
                .0
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("xdp-routerd exited ({st}):\n{}", self.log_tail());
            }
            if self.ctl(&["status"]).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "xdp-routerd did not answer `status` within 15 s:\n{}",
                    self.log_tail()
                );
            }
            sleep(Duration::from_millis(200));
        }
    }

    /// Runs `xdp-routerd ARGS --socket S` and returns its stdout.
    fn ctl(&self, args: &[&str]) -> anyhow::Result<String> {
        cmd::output(
            Command::new(&self.bin)
                .args(args)
                .arg("--socket")
                .arg(&self.socket),
        )
    }

    /// SIGTERM, then waits; an error (with the log) when it does not exit cleanly.
    fn stop(&mut self) -> anyhow::Result<()> {
        match self.child.terminate() {
            Some(st) if st.success() => Ok(()),
            Some(st) => bail!("xdp-routerd exited with {st}:\n{}", self.log_tail()),
            None => bail!("xdp-routerd ignored SIGTERM for 5 s:\n{}", self.log_tail()),
        }
    }

    fn log_tail(&self) -> String {
        tail(&self.log, 4000)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() || self.child.0.is_some() {
            let _ = self.child.terminate();
        }
    }
}

/// The last `max` bytes of a file.
fn tail(path: &Path, max: u64) -> String {
    let Ok(mut f) = fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    s
}

/// A child process that is terminated on drop.
struct Spawned(Option<Child>);

impl Spawned {
    fn new(c: Child) -> Spawned {
        Spawned(Some(c))
    }

    /// SIGTERM, wait up to 5 s, else SIGKILL. Returns the exit status when it exited by itself.
    fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let mut c = self.0.take()?;
        if let Ok(Some(st)) = c.try_wait() {
            return Some(st);
        }
        if let Ok(pid) = i32::try_from(c.id()) {
            // SAFETY: kill has no memory-safety preconditions; `pid` is our child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = c.try_wait() {
                return Some(st);
            }
            sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.terminate();
    }
}

/// A directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> anyhow::Result<TempDir> {
        let p = std::env::temp_dir().join(name);
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).with_context(|| format!("create {}", p.display()))?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
