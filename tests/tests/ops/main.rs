//! Operations, end to end: a real Prometheus server scraping the daemon during a fast-pathed
//! transfer, the operator CLI (`stats`, `flows` filters, `check-config`, no-daemon errors), the
//! systemd unit's ExecStartPre/ExecStart run as written with exactly its user, capabilities and
//! no-new-privs, and shutdown on SIGTERM/SIGINT under load within 2 s.
//!
//! Topology: `xdp_router_tests::testbed` (lan host ⇄ router ⇄ wan host). Run as root with one
//! test thread: `cargo xtask test` (or `cargo test -p xdp-router-tests --test ops --
//! --test-threads=1 --nocapture` after building the daemon). Needs the Debian packages
//! `prometheus`, `curl` and `systemd` (for `systemd-analyze`) besides the testbed's tools.

mod cli;
mod prometheus;
mod shutdown;
mod systemd;

use std::{
    collections::BTreeMap,
    fs,
    net::SocketAddr,
    os::unix::fs::{PermissionsExt as _, chown},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Output, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::sleep,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use xdp_router_tests::{
    netns::{self, Netns},
    testbed::{
        LAN_HOST_V4, LAN_IF, Plan, TempDir, Testbed, Transfer, WAN_HOST_V4, WAN_IF, daemon_binary,
        ready, wait_until,
    },
};
use xdp_routerd::status::{Flows, Status};

/// Where the daemon's metrics listen inside the router namespace (the default).
const METRICS: &str = "127.0.0.1:9824";
/// Prometheus' own API inside the router namespace.
const PROM: &str = "127.0.0.1:9090";
/// The unprivileged user the systemd unit's `DynamicUser=yes` is emulated with (`nobody`).
const NOBODY: u32 = 65534;

/// Root, the testbed's tools, and `extra` commands; otherwise a loud skip (a failure in CI).
fn ready_with(test: &str, extra: &[&str]) -> bool {
    if !ready(test) {
        return false;
    }
    for tool in extra {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return netns::skip(
                test,
                &format!("`{tool}` not found (apt-get install prometheus curl systemd)"),
            );
        }
    }
    true
}

/// A process this test started (in a namespace); SIGKILLed on drop if still running.
struct Proc {
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    /// Spawns `cmd` with stdout and stderr appended to `log`.
    fn spawn(mut cmd: Command, log: &Path) -> Proc {
        let f = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("open {}: {e}", log.display()));
        let f2 = f.try_clone().expect("dup log fd");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f)
            .stderr(f2)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        Proc {
            child: Some(child),
            log: log.to_owned(),
        }
    }

    fn pid(&self) -> i32 {
        let c = self.child.as_ref().expect("process already reaped");
        i32::try_from(c.id()).expect("pid fits i32")
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
        let rc = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(
            rc,
            0,
            "kill {}: {}",
            self.pid(),
            std::io::Error::last_os_error()
        );
    }

    /// Waits up to `timeout` for the exit; None when it is still running.
    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let c = self.child.as_mut()?;
            if let Ok(Some(st)) = c.try_wait() {
                self.child = None;
                return Some(st);
            }
            if Instant::now() > deadline {
                return None;
            }
            sleep(Duration::from_millis(10));
        }
    }

    fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    fn log(&self) -> String {
        let s = fs::read(&self.log).unwrap_or_default();
        let start = s.len().saturating_sub(8000);
        String::from_utf8_lossy(&s[start..]).into_owned()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `xdp-routerd ARGS` (a CLI command, run in the host namespace).
fn cli(args: &[&str]) -> Output {
    Command::new(daemon_binary())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn xdp-routerd {}: {e}", args.join(" ")))
}

/// `xdp-routerd ARGS --socket S`; stdout, or a panic with stderr and the daemon log.
fn ctl(socket: &Path, args: &[&str], daemon: &Proc) -> String {
    let mut full = args.to_vec();
    let s = socket.to_string_lossy();
    full.extend(["--socket", &s]);
    let out = cli(&full);
    assert!(
        out.status.success(),
        "xdp-routerd {}: {}\ndaemon log:\n{}",
        full.join(" "),
        String::from_utf8_lossy(&out.stderr),
        daemon.log()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn status(socket: &Path, daemon: &Proc) -> Status {
    let out = ctl(socket, &["status", "--json"], daemon);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("status --json: {e}: {out}"))
}

/// Waits until the daemon answers `status` (it exits or 20 s pass: panic with its log).
fn wait_up(socket: &Path, daemon: &mut Proc) -> Status {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(
            daemon.running(),
            "xdp-routerd exited at start; log:\n{}",
            daemon.log()
        );
        let s = socket.to_string_lossy();
        let out = cli(&["status", "--json", "--socket", &s]);
        if out.status.success() {
            return serde_json::from_slice(&out.stdout).expect("status --json parses");
        }
        assert!(
            Instant::now() < deadline,
            "xdp-routerd did not come up within 20 s; log:\n{}",
            daemon.log()
        );
        sleep(Duration::from_millis(100));
    }
}

/// Writes a daemon config for the testbed's router into `dir`; returns (config, socket).
fn write_config(dir: &Path, socket_dir: &Path, extra: &str) -> (PathBuf, PathBuf) {
    let socket = socket_dir.join("control.sock");
    let config = dir.join("xdp-routerd.toml");
    fs::write(
        &config,
        format!(
            "control_socket = \"{}\"\nmetrics_listen = \"{METRICS}\"\n{extra}\n\
             [[interface]]\nname = \"{WAN_IF}\"\nrole = \"wan\"\n\
             [[interface]]\nname = \"{LAN_IF}\"\nrole = \"lan\"\n",
            socket.display()
        ),
    )
    .unwrap_or_else(|e| panic!("write {}: {e}", config.display()));
    fs::set_permissions(&config, fs::Permissions::from_mode(0o644)).expect("chmod config");
    (config, socket)
}

/// `xdp-routerd run --config C` in the router namespace, as a user starts it.
fn start_daemon(tb: &Testbed, config: &Path, socket: &Path) -> Proc {
    let mut cmd = tb.router.command(&daemon_binary().to_string_lossy());
    cmd.arg("run").arg("--config").arg(config);
    let mut p = Proc::spawn(cmd, &tb.dir.path().join("xdp-routerd.log"));
    wait_up(socket, &mut p);
    p
}

/// Runs curl inside `ns`; the body, or None when the request failed.
fn curl(ns: &Netns, args: &[&str]) -> Option<String> {
    let mut full = vec!["-sf", "--max-time", "5"];
    full.extend_from_slice(args);
    let out = ns.exec("curl", &full);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Prometheus instant query: (labels, value) of every series.
fn prom_query(ns: &Netns, q: &str) -> Vec<(serde_json::Value, f64)> {
    let body = curl(
        ns,
        &[
            "-G",
            "--data-urlencode",
            &format!("query={q}"),
            &format!("http://{PROM}/api/v1/query"),
        ],
    )
    .unwrap_or_else(|| panic!("Prometheus query {q} failed"));
    let v: serde_json::Value = serde_json::from_str(&body).expect("Prometheus answers JSON");
    assert_eq!(v["status"], "success", "{q}: {body}");
    v["data"]["result"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .map(|r| {
                    let val = r["value"][1]
                        .as_str()
                        .unwrap_or("NaN")
                        .parse()
                        .unwrap_or(f64::NAN);
                    (r["metric"].clone(), val)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The single value of an instant query (panics when there is not exactly one series).
fn prom_value(ns: &Netns, q: &str) -> f64 {
    let r = prom_query(ns, q);
    assert_eq!(r.len(), 1, "{q}: expected one series, got {r:?}");
    r[0].1
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn counter(st: &Status, iface: &str, reason: &str) -> (u64, u64) {
    st.counters
        .iter()
        .find(|c| c.interface == iface && c.reason.name() == reason)
        .map(|c| (c.packets, c.bytes))
        .unwrap_or_else(|| panic!("no counter row ({iface}, {reason})"))
}
