//! Round-trip latency through the router: a UDP echo server on the WAN host and a client on the
//! LAN host with fixed ports, so the echo flow is itself an established (offloadable) flow.

use std::{
    net::{SocketAddr, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow};
use serde::Serialize;

use crate::netns::{Netns, enter_netns};

/// Echo server address (WAN host).
const SERVER: &str = "10.0.2.2:7007";
/// Echo client address (LAN host); fixed so every probe run uses the same conntrack entry.
const CLIENT: &str = "10.0.1.2:7008";
/// How long a probe may take before it counts as lost.
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);

/// The echo server thread; stopped on drop.
pub struct EchoServer {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Result<()>>>,
}

impl EchoServer {
    /// Starts the server inside `wan`.
    pub fn start(wan: &Netns) -> Result<EchoServer> {
        let path = wan.path();
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let flag = Arc::clone(&stop);
        let handle = thread::spawn(move || -> Result<()> {
            let setup = || -> Result<UdpSocket> {
                enter_netns(&path)?;
                let s = UdpSocket::bind(SERVER).context("binding the echo server")?;
                s.set_read_timeout(Some(Duration::from_millis(50)))?;
                Ok(s)
            };
            let sock = match setup() {
                Ok(s) => {
                    let _ = tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return Ok(());
                }
            };
            let mut buf = [0u8; 64];
            while !flag.load(Ordering::Relaxed) {
                if let Ok((n, from)) = sock.recv_from(&mut buf) {
                    let _ = sock.send_to(&buf[..n], from);
                }
            }
            Ok(())
        });
        rx.recv()
            .map_err(|_| anyhow!("echo server thread died"))??;
        Ok(EchoServer {
            stop,
            handle: Some(handle),
        })
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Result of one probe run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    /// Probes sent.
    pub probes: u32,
    /// Probes without an answer within 200 ms.
    pub lost: u32,
    /// Round-trip percentiles and maximum, microseconds.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Largest round trip.
    pub max_us: f64,
}

/// Sends `probes` echo requests from the LAN host, one every `interval`, and measures RTTs.
pub fn probe(lan: &Netns, probes: u32, interval: Duration) -> Result<Latency> {
    lan.enter(|| probe_here(probes, interval))
}

/// Like [`probe`], from a thread that has already entered the LAN host's namespace.
pub fn probe_here(probes: u32, interval: Duration) -> Result<Latency> {
    let sock = UdpSocket::bind(CLIENT).context("binding the echo client")?;
    let server: SocketAddr = SERVER.parse()?;
    sock.connect(server)?;
    sock.set_read_timeout(Some(PROBE_TIMEOUT))?;
    let mut rtts = Vec::with_capacity(probes as usize);
    let mut buf = [0u8; 64];
    let start = Instant::now();
    for seq in 0..probes {
        let due = start + interval * seq;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        let t0 = Instant::now();
        sock.send(&u64::from(seq).to_be_bytes())?;
        // Skip stale answers of earlier (timed out) probes.
        while let Ok(n) = sock.recv(&mut buf) {
            if n == 8 && buf[..8] == u64::from(seq).to_be_bytes() {
                rtts.push(t0.elapsed().as_secs_f64() * 1e6);
                break;
            }
        }
    }
    Ok(summarize(probes, rtts))
}

fn summarize(probes: u32, mut rtts: Vec<f64>) -> Latency {
    rtts.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if rtts.is_empty() {
            return f64::NAN;
        }
        let i = ((p / 100.0) * (rtts.len() - 1) as f64).round() as usize;
        rtts[i.min(rtts.len() - 1)]
    };
    Latency {
        probes,
        lost: probes - rtts.len() as u32,
        p50_us: pct(50.0),
        p90_us: pct(90.0),
        p99_us: pct(99.0),
        max_us: rtts.last().copied().unwrap_or(f64::NAN),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let l = summarize(102, (1..=100).map(f64::from).collect());
        assert_eq!(l.lost, 2);
        assert_eq!(l.p50_us, 51.0);
        assert_eq!(l.p99_us, 99.0);
        assert_eq!(l.max_us, 100.0);
        assert!(summarize(3, vec![]).p50_us.is_nan());
    }
}
