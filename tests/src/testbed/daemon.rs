//! The daemon binary the tests start, and xdp-routerd as the tests drive it.

use std::{
    path::{Path, PathBuf},
    thread::sleep,
    time::{Duration, Instant},
};

use xdp_router_testbed::daemon::{self as shared, Stop};

use crate::netns::Netns;

use super::status::Status;

/// The daemon binary: `$XDP_ROUTERD_BIN` (set by `cargo xtask test`), else the newer of
/// `target/release/xdp-routerd` and `target/debug/xdp-routerd`.
pub fn daemon_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("XDP_ROUTERD_BIN") {
        return PathBuf::from(p);
    }
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target");
    ["release", "debug"]
        .iter()
        .map(|p| target.join(p).join("xdp-routerd"))
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p)
        .unwrap_or_else(|| {
            panic!(
                "no xdp-routerd binary in {}/{{release,debug}}: run `cargo build --release -p \
                 xdp-routerd` (cargo xtask test does) or set XDP_ROUTERD_BIN",
                target.display()
            )
        })
}

/// xdp-routerd running in the router namespace (the shared [`shared::Daemon`], with calls that
/// panic with the failure); SIGTERM on drop (and its log printed when the test is failing).
pub struct Daemon(shared::Daemon);

impl Daemon {
    /// Starts `xdp-routerd run` in `router` with `config`, its control socket at `socket` and its
    /// log in `dir`, and waits (up to 60 s) until `status` answers.
    pub fn start(router: &Netns, config: &Path, socket: &Path, dir: &Path) -> Daemon {
        let bin = daemon_binary();
        let log = dir.join("xdp-routerd.log");
        let mut d = shared::Daemon::spawn(
            router.command(&bin.to_string_lossy()),
            &bin,
            config,
            socket,
            &log,
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        // The host answers within a second or two; in the guest (qemu without KVM) the
        // verifier alone can take tens of seconds when the host is busy.
        if let Err(e) = d.wait_answering(Duration::from_secs(60)) {
            panic!("{e:#}");
        }
        Daemon(d)
    }

    /// Runs `xdp-routerd ARGS --socket S`; Ok(stdout) or Err(one line + stderr).
    pub fn ctl(&self, args: &[&str]) -> Result<String, String> {
        self.0.cli(args).map_err(|e| format!("{e:#}"))
    }

    /// `status --json`, parsed.
    pub fn try_status(&self) -> Result<Status, String> {
        let out = self.ctl(&["status", "--json"])?;
        serde_json::from_str(&out).map_err(|e| format!("status --json: {e}: {out}"))
    }

    /// `status --json`, parsed; panics (with the log) when the daemon does not answer.
    pub fn status(&self) -> Status {
        self.try_status()
            .unwrap_or_else(|e| panic!("{e}; daemon log:\n{}", self.log_tail()))
    }

    /// `flows --json`, raw (for failure messages).
    pub fn flows_json(&self) -> String {
        self.ctl(&["flows", "--json"]).unwrap_or_else(|e| e)
    }

    /// The original direction's row of a connection to `port` in `flows --json`, if the daemon
    /// lists one (`None` also while it cannot answer).
    pub fn original_flow(&self, port: u16) -> Option<serde_json::Value> {
        let flows: serde_json::Value = serde_json::from_str(&self.flows_json()).ok()?;
        let suffix = format!(":{port}");
        flows["flows"]
            .as_array()?
            .iter()
            .find(|f| {
                f["direction"] == "original"
                    && f["dst"].as_str().is_some_and(|d| d.ends_with(&suffix))
            })
            .cloned()
    }

    /// `fastpath on|off`; panics when it fails or `status` does not reflect it.
    pub fn set_fastpath(&self, on: bool) {
        let word = if on { "on" } else { "off" };
        if let Err(e) = self.ctl(&["fastpath", word]) {
            panic!("{e}; daemon log:\n{}", self.log_tail());
        }
        assert_eq!(self.status().fastpath, on, "status after `fastpath {word}`");
    }

    /// Waits up to `timeout` until `cond(status)` holds; returns the last status and whether
    /// it held.
    pub fn wait_status(&self, timeout: Duration, cond: impl Fn(&Status) -> bool) -> (Status, bool) {
        let deadline = Instant::now() + timeout;
        loop {
            let st = self.status();
            if cond(&st) {
                return (st, true);
            }
            if Instant::now() > deadline {
                return (st, false);
            }
            sleep(Duration::from_millis(50));
        }
    }

    /// Stops (SIGSTOP, `true`) or continues (SIGCONT) the daemon: while stopped it reads no
    /// events, as a daemon far behind on a busy machine.
    pub fn pause(&self, stop: bool) {
        let sig = if stop { libc::SIGSTOP } else { libc::SIGCONT };
        if let Err(e) = self.0.signal(sig) {
            panic!("{e:#}");
        }
    }

    /// SIGKILL (no cleanup chance: the kernel must detach when its link fds close).
    pub fn kill9(&mut self) {
        self.0.kill();
    }

    /// SIGTERM and wait (5 s, then SIGKILL); returns whether it exited with status 0.
    pub fn stop(&mut self) -> bool {
        matches!(
            self.0.terminate(),
            Ok(Stop::Exited(st) | Stop::ExitedBefore(st)) if st.success()
        )
    }

    /// The datapath's count of packets of offloaded flow directions the kernel forwarded
    /// (`MAP_KERNEL_FORWARDED`, found among the maps the daemon holds open, summed over the
    /// CPUs); panics when the daemon holds no such map.
    pub fn kernel_forwarded_packets(&self) -> u64 {
        use aya::maps::{Map, MapData, MapInfo, PerCpuArray};
        use xdp_router_common::MAP_KERNEL_FORWARDED;
        let ids = self.0.map_ids().unwrap_or_else(|e| panic!("{e:#}"));
        for id in ids {
            let named = MapInfo::from_id(id)
                .is_ok_and(|info| info.name_as_str() == Some(MAP_KERNEL_FORWARDED));
            if !named {
                continue;
            }
            let map = MapData::from_id(id)
                .and_then(Map::from_map_data)
                .unwrap_or_else(|e| panic!("map {id}: {e}"));
            let counts: PerCpuArray<MapData, u64> =
                PerCpuArray::try_from(map).unwrap_or_else(|e| panic!("map {id}: {e}"));
            let per_cpu = counts
                .get(&0, 0)
                .unwrap_or_else(|e| panic!("map {id}, index 0: {e}"));
            return per_cpu.iter().sum();
        }
        panic!("the daemon holds no {MAP_KERNEL_FORWARDED} map")
    }

    /// The last 6000 bytes of the daemon's log, without its periodic lock statistics
    /// (`xdp_routerd::lock`, several lines every few seconds at debug level): what a failed
    /// test prints, and the events that explain the failure must not be pushed out of it.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.0.log()).unwrap_or_default();
        let kept: Vec<&str> = log
            .lines()
            .filter(|l| !l.contains(" xdp_routerd::lock: "))
            .collect();
        let text = kept.join("\n");
        let start = text.len().saturating_sub(6000);
        let start = (start..=text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        format!(
            "({} lock statistics lines left out)\n{}",
            log.lines().count() - kept.len(),
            &text[start..]
        )
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let clean = self.stop();
        if std::thread::panicking() {
            eprintln!(
                "---- xdp-routerd log (stopped cleanly: {clean}) ----\n{}\n---- end of log ----",
                self.log_tail()
            );
        }
    }
}
