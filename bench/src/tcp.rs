//! TCP throughput with iperf3 between the LAN host (client) and the WAN host (server).

use std::process::{Child, Stdio};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;

use xdp_router_testbed::netns::Netns;

const PORT: &str = "5201";

/// Direction of an iperf3 run, seen from the LAN host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TcpMode {
    /// LAN → WAN.
    Upload,
    /// WAN → LAN (`-R`).
    Download,
    /// Both at once (`--bidir`).
    Bidir,
}

/// One iperf3 run.
#[derive(Clone, Debug, Serialize)]
pub struct TcpRun {
    /// Parallel streams.
    pub streams: u32,
    /// Direction.
    pub mode: TcpMode,
    /// LAN → WAN goodput as received, Mbit/s (0 for a download-only run).
    pub upload_mbps: f64,
    /// WAN → LAN goodput as received, Mbit/s (0 for an upload-only run).
    pub download_mbps: f64,
    /// TCP retransmissions reported by the sender(s).
    pub retransmits: u64,
}

/// The iperf3 server on the WAN host; killed on drop.
pub struct Iperf3Server {
    child: Child,
}

impl Iperf3Server {
    /// Starts `iperf3 -s` inside `wan` (on CPU `cpu` when given).
    pub fn start(wan: &Netns, cpu: Option<usize>) -> Result<Iperf3Server> {
        let child = iperf3(wan, cpu)
            .args(["-s", "-p", PORT])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting iperf3 (install iperf3)")?;
        // Give it time to listen.
        std::thread::sleep(std::time::Duration::from_millis(300));
        Ok(Iperf3Server { child })
    }
}

impl Drop for Iperf3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `iperf3` inside `ns`, pinned to `cpu` (`-A`) when given.
fn iperf3(ns: &Netns, cpu: Option<usize>) -> std::process::Command {
    let mut c = ns.command("iperf3");
    if let Some(cpu) = cpu {
        c.args(["-A", &cpu.to_string()]);
    }
    c
}

/// Runs the client inside `lan` for `secs` seconds (on CPU `cpu` when given).
pub fn run(
    lan: &Netns,
    streams: u32,
    mode: TcpMode,
    secs: u32,
    cpu: Option<usize>,
) -> Result<TcpRun> {
    let mut args = vec![
        "-c".to_owned(),
        "10.0.2.2".to_owned(),
        "-p".to_owned(),
        PORT.to_owned(),
        "-t".to_owned(),
        secs.to_string(),
        "-P".to_owned(),
        streams.to_string(),
        "-J".to_owned(),
    ];
    match mode {
        TcpMode::Upload => {}
        TcpMode::Download => args.push("-R".to_owned()),
        TcpMode::Bidir => args.push("--bidir".to_owned()),
    }
    // iperf3 now and then ends a short run without its closing summary (the control
    // connection races the test's end); such a run is repeated, up to three attempts in all.
    let mut last = None;
    for attempt in 1..=3 {
        let out = iperf3(lan, cpu)
            .args(&args)
            .output()
            .context("running the iperf3 client")?;
        let json = String::from_utf8_lossy(&out.stdout);
        let result = if out.status.success() {
            parse(&json, streams, mode)
        } else {
            Err(anyhow::anyhow!(
                "iperf3 {:?} -P {streams} failed: {}",
                mode,
                json.lines()
                    .find(|l| l.contains("\"error\""))
                    .unwrap_or("(no error message)")
                    .trim()
            ))
        };
        match result {
            Ok(run) => return Ok(run),
            Err(e) => {
                eprintln!("  iperf3 attempt {attempt}/3 failed: {e:#}");
                last = Some(e);
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("iperf3 did not run")))
}

fn parse(json: &str, streams: u32, mode: TcpMode) -> Result<TcpRun> {
    let v: serde_json::Value = serde_json::from_str(json).context("iperf3 -J output")?;
    if let Some(err) = v["error"].as_str() {
        bail!("iperf3 {mode:?} -P {streams}: {err}");
    }
    let end = &v["end"];
    let mbps = |k: &str| end[k]["bits_per_second"].as_f64().map(|b| b / 1e6);
    let retr = |k: &str| end[k]["retransmits"].as_u64().unwrap_or(0);
    let received = mbps("sum_received").context("iperf3 output has no end.sum_received")?;
    Ok(match mode {
        TcpMode::Upload => TcpRun {
            streams,
            mode,
            upload_mbps: received,
            download_mbps: 0.0,
            retransmits: retr("sum_sent"),
        },
        TcpMode::Download => TcpRun {
            streams,
            mode,
            upload_mbps: 0.0,
            download_mbps: received,
            retransmits: retr("sum_sent"),
        },
        TcpMode::Bidir => TcpRun {
            streams,
            mode,
            upload_mbps: received,
            download_mbps: mbps("sum_received_bidir_reverse")
                .context("iperf3 output has no end.sum_received_bidir_reverse")?,
            retransmits: retr("sum_sent") + retr("sum_sent_bidir_reverse"),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bidir_output_is_read() {
        let j = r#"{"end": {"sum_sent": {"bits_per_second": 2e9, "retransmits": 3},
                  "sum_received": {"bits_per_second": 1.5e9},
                  "sum_sent_bidir_reverse": {"bits_per_second": 1e9, "retransmits": 1},
                  "sum_received_bidir_reverse": {"bits_per_second": 9e8}}}"#;
        let r = parse(j, 8, TcpMode::Bidir).unwrap();
        assert_eq!(r.upload_mbps, 1500.0);
        assert_eq!(r.download_mbps, 900.0);
        assert_eq!(r.retransmits, 4);
        assert!(parse("{}", 1, TcpMode::Upload).is_err());
    }
}
