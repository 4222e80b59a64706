//! The soak test's long iperf3 streams: one client loop per stream, back to back, rate-limited.

use std::{
    process::{Child, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use xdp_router_testbed::netns::Netns;

use crate::{run::stopped, testbed::GEN_CPU};

/// Ports of the two iperf3 servers on the WAN host.
const IPERF_PORTS: [u16; 2] = [5211, 5212];
/// Rate of each iperf3 stream: long-lived flows, not a CPU hog on a 2-core machine.
pub(super) const IPERF_RATE: &str = "100M";
/// Seconds of each iperf3 stream (streams run back to back, across toggles and flaps).
const IPERF_SECS: u64 = 20;

/// iperf3 streams: one client loop per stream, back to back until `until`.
pub(super) struct Streams {
    pub(super) completed: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) errors: Mutex<Vec<String>>,
}

pub(super) fn start_streams(
    lan: &Netns,
    wan: &Netns,
    until: Instant,
    streams: &Arc<Streams>,
) -> Result<(Vec<Child>, Vec<thread::JoinHandle<()>>)> {
    let mut servers = Vec::new();
    for port in IPERF_PORTS {
        servers.push(
            wan.command("iperf3")
                .args(["-s", "-p", &port.to_string(), "-A", &GEN_CPU.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting iperf3 (install iperf3)")?,
        );
    }
    thread::sleep(Duration::from_millis(300));
    let clients = [
        ("10.0.2.2", IPERF_PORTS[0], false),
        ("fd00:2::2", IPERF_PORTS[1], true),
    ];
    let mut loops = Vec::new();
    for (addr, port, reverse) in clients {
        let lan_name = lan.name().to_owned();
        let streams = streams.clone();
        loops.push(thread::spawn(move || {
            loop {
                let left = until.saturating_duration_since(Instant::now()).as_secs();
                if left < 2 || stopped() {
                    return;
                }
                let secs = left.min(IPERF_SECS).to_string();
                let mut c = std::process::Command::new("ip");
                c.args(["netns", "exec", &lan_name, "iperf3", "-c", addr])
                    .args(["-p", &port.to_string(), "-t", &secs, "-b", IPERF_RATE])
                    .args(["-A", &GEN_CPU.to_string(), "-J"]);
                if reverse {
                    c.arg("-R");
                }
                let ok = match c.output() {
                    Ok(out) if out.status.success() => Ok(()),
                    Ok(out) => Err(String::from_utf8_lossy(&out.stdout)
                        .lines()
                        .find(|l| l.contains("\"error\""))
                        .unwrap_or("(no error message)")
                        .trim()
                        .to_owned()),
                    Err(e) => Err(e.to_string()),
                };
                match ok {
                    Ok(()) => streams.completed.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        streams
                            .errors
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(format!("iperf3 -c {addr}: {e}"));
                        streams.failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }));
    }
    Ok((servers, loops))
}
