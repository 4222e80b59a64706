//! Round-trip latency through the router: a UDP echo server on the WAN host and a client on the
//! LAN host with fixed ports, so the echo flow is itself an established (offloadable) flow.
//!
//! The fast path off/on comparison is interleaved ([`interleave`]): the probes of both modes are
//! taken in alternating blocks (ABBA order), with the background load running throughout, and
//! each mode's samples are pooled. This VM's speed drifts within seconds, so two blocks taken one
//! after the other would compare the VM's moods, not the modes. The p99 difference is judged by
//! a bootstrap confidence interval that resamples the rounds as pairs and the
//! probes within them in short runs ([`quantile_diff_ci`]).
//!
//! The statistics (percentiles, the bootstrap interval and its verdict) are in [`stats`].

mod stats;

use std::{
    net::{SocketAddr, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};
use serde::Serialize;

use xdp_router_testbed::netns::{Netns, enter_netns};

pub use self::stats::{Bootstrap, DiffCi, Verdict, percentile, quantile_diff_ci};

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

/// Summary of one set of probes.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    /// Probes counted (sent and not discarded).
    pub probes: u32,
    /// Probes without an answer within 200 ms.
    pub lost: u32,
    /// 50th percentile of the round trips, microseconds.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest round trip.
    pub max_us: f64,
}

/// One echo probe.
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    /// When it was sent.
    pub sent: Instant,
    /// Round trip in microseconds; `None` if no answer came within 200 ms.
    pub rtt_us: Option<f64>,
}

/// A connected echo client on the LAN host. The socket is created inside the LAN namespace and
/// stays there, so the client can be used from any thread afterwards.
pub struct Prober {
    sock: UdpSocket,
    seq: u64,
}

impl Prober {
    /// Binds the client inside `lan` and connects it to the echo server.
    pub fn new(lan: &Netns) -> Result<Prober> {
        let sock = lan.enter(|| {
            let sock = UdpSocket::bind(CLIENT).context("binding the echo client")?;
            let server: SocketAddr = SERVER.parse()?;
            sock.connect(server).context("connecting the echo client")?;
            sock.set_read_timeout(Some(PROBE_TIMEOUT))?;
            Ok(sock)
        })?;
        Ok(Prober { sock, seq: 0 })
    }

    /// Sends `n` echo requests, one every `interval` (the first at once), and returns them
    /// with their round trips.
    pub fn probe(&mut self, n: u32, interval: Duration) -> Result<Vec<Probe>> {
        let mut rtts = Vec::with_capacity(n as usize);
        let mut buf = [0u8; 64];
        let start = Instant::now();
        for i in 0..n {
            let due = start + interval * i;
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                thread::sleep(wait);
            }
            // The sequence number runs on across calls, so a late answer to an earlier block
            // is never taken for this one.
            self.seq += 1;
            let tag = self.seq.to_be_bytes();
            let t0 = Instant::now();
            self.sock.send(&tag).context("sending an echo probe")?;
            let mut rtt = None;
            // Skip stale answers of earlier (timed out) probes.
            while let Ok(len) = self.sock.recv(&mut buf) {
                if len == 8 && buf[..8] == tag {
                    rtt = Some(t0.elapsed().as_secs_f64() * 1e6);
                    break;
                }
            }
            rtts.push(Probe {
                sent: t0,
                rtt_us: rtt,
            });
        }
        Ok(rtts)
    }
}

/// Sends `probes` echo requests from the LAN host, one every `interval`, and summarizes them.
pub fn probe(lan: &Netns, probes: u32, interval: Duration) -> Result<Latency> {
    let mut p = Prober::new(lan)?;
    let rtts = p.probe(probes, interval)?;
    Ok(summarize(
        probes,
        rtts.into_iter().filter_map(|p| p.rtt_us).collect(),
    ))
}

/// How an interleaved off/on comparison is taken.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Schedule {
    /// Probes counted per mode (discarded ones not included).
    pub probes: u32,
    /// Rounds; each round has one block per mode, and the order of the modes alternates from
    /// round to round (off on | on off | off on …), so a linear drift of the VM's speed over two
    /// rounds cancels out.
    pub rounds: u32,
    /// Probes sent and not counted after each switch of the fast path.
    pub discard: u32,
    /// Time between probes.
    #[serde(serialize_with = "micros")]
    pub interval: Duration,
}

fn micros<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_micros() as u64)
}

/// One mode's pooled probes of an interleaved comparison.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ModeSamples {
    /// Fast path on/off.
    pub fastpath: bool,
    /// Round trips (µs) of the counted probes, in the order they were taken (lost ones left
    /// out).
    pub rtts_us: Vec<f64>,
    /// When each of `rtts_us` was sent, ms since the start of the run (to look for periodic
    /// disturbances, e.g. the daemon's keep-alive pass every 2 s).
    pub sent_ms: Vec<f64>,
    /// Counted probes that got no answer.
    pub lost: u32,
    /// Round trips (µs) of the probes discarded right after switching to this mode.
    pub discarded_us: Vec<f64>,
    /// Blocks this mode was measured in.
    pub blocks: u32,
    /// Answered probes per block, in order (they cut `rtts_us` into the blocks).
    pub block_lens: Vec<usize>,
}

impl ModeSamples {
    /// Percentiles of the counted probes.
    pub fn summary(&self) -> Latency {
        let probes = self.rtts_us.len() as u32 + self.lost;
        summarize(probes, self.rtts_us.clone())
    }
}

/// Probes `modes` (fast path off/on; one or two of them) interleaved per `sched`: `set(mode)`
/// switches the fast path (called only when the mode changes, and once at the start), then
/// `sched.discard` probes are sent and set aside, then the block's probes are counted.
/// `probe(mode, n)` sends `n` probes and returns them. Returns the pooled samples per mode, in
/// the order of `modes`.
pub fn interleave(
    modes: &[bool],
    sched: &Schedule,
    mut set: impl FnMut(bool) -> Result<()>,
    mut probe: impl FnMut(bool, u32) -> Result<Vec<Probe>>,
) -> Result<Vec<ModeSamples>> {
    if modes.is_empty() || sched.rounds == 0 {
        bail!("latency schedule needs at least one mode and one round");
    }
    let mut out: Vec<ModeSamples> = modes
        .iter()
        .map(|&fastpath| ModeSamples {
            fastpath,
            ..ModeSamples::default()
        })
        .collect();
    let mut current = None;
    let start = Instant::now();
    let rounds = sched.rounds.min(sched.probes.max(1));
    for r in 0..rounds {
        // Probes of this round's block: the split of `probes` over `rounds`, exact in total.
        let n = sched.probes * (r + 1) / rounds - sched.probes * r / rounds;
        let order: Vec<usize> = if r % 2 == 0 {
            (0..modes.len()).collect()
        } else {
            (0..modes.len()).rev().collect()
        };
        for i in order {
            let mode = modes[i];
            let slot = &mut out[i];
            if current != Some(mode) {
                set(mode)?;
                current = Some(mode);
                if sched.discard > 0 {
                    slot.discarded_us.extend(
                        probe(mode, sched.discard)?
                            .into_iter()
                            .filter_map(|p| p.rtt_us),
                    );
                }
            }
            let got = probe(mode, n)?;
            let before = slot.rtts_us.len();
            for p in got {
                match p.rtt_us {
                    Some(rtt) => {
                        slot.rtts_us.push(rtt);
                        slot.sent_ms
                            .push(p.sent.saturating_duration_since(start).as_secs_f64() * 1e3);
                    }
                    None => slot.lost += 1,
                }
            }
            slot.block_lens.push(slot.rtts_us.len() - before);
            slot.blocks += 1;
        }
    }
    Ok(out)
}

/// Percentiles of `rtts` (µs) out of `probes` sent; the missing ones count as lost.
pub fn summarize(probes: u32, mut rtts: Vec<f64>) -> Latency {
    rtts.sort_by(f64::total_cmp);
    Latency {
        probes,
        lost: probes.saturating_sub(rtts.len() as u32),
        p50_us: percentile(&rtts, 50.0),
        p90_us: percentile(&rtts, 90.0),
        p99_us: percentile(&rtts, 99.0),
        p999_us: percentile(&rtts, 99.9),
        max_us: rtts.last().copied().unwrap_or(f64::NAN),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    #[test]
    fn percentiles() {
        let l = summarize(102, (1..=100).map(f64::from).collect());
        assert_eq!(l.lost, 2);
        assert_eq!(l.p50_us, 51.0);
        assert_eq!(l.p90_us, 90.0);
        assert_eq!(l.p99_us, 99.0);
        assert_eq!(l.p999_us, 100.0);
        assert_eq!(l.max_us, 100.0);
        assert!(summarize(3, vec![]).p50_us.is_nan());
        // Unsorted input, and a percentile of 1000 samples.
        let mut v: Vec<f64> = (0..1000).rev().map(f64::from).collect();
        v.swap(3, 500);
        let l = summarize(1000, v);
        assert_eq!(
            (l.p50_us, l.p99_us, l.p999_us, l.lost),
            (500.0, 989.0, 998.0, 0)
        );
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
    }

    #[test]
    fn interleave_alternates_discards_after_switches_and_pools() {
        let state = RefCell::new((None::<bool>, Vec::<String>::new()));
        let sched = Schedule {
            probes: 10,
            rounds: 4,
            discard: 2,
            interval: Duration::from_millis(1),
        };
        let out = interleave(
            &[false, true],
            &sched,
            |fp| {
                let mut s = state.borrow_mut();
                s.0 = Some(fp);
                s.1.push(format!("set {fp}"));
                Ok(())
            },
            |fp, n| {
                let mut s = state.borrow_mut();
                // Probes always run in the mode last set.
                assert_eq!(s.0, Some(fp));
                s.1.push(format!("{n}"));
                // On: 100 µs, off: 50 µs, and the third probe of an "off" block is lost.
                Ok((0..n)
                    .map(|i| Probe {
                        sent: Instant::now(),
                        rtt_us: if fp {
                            Some(100.0)
                        } else {
                            (i != 2).then_some(50.0)
                        },
                    })
                    .collect())
            },
        )
        .expect("interleave");
        let log = state.into_inner().1.join(" ");
        // Rounds of 2, 3, 2, 3 probes (10 / 4), order off on | on off | off on | on off; a
        // switch is followed by 2 discarded probes, a repeated mode is not switched.
        assert_eq!(
            log,
            "set false 2 2 set true 2 2 3 set false 2 3 2 set true 2 2 3 set false 2 3"
        );
        let (off, on) = (&out[0], &out[1]);
        assert!(!off.fastpath && on.fastpath);
        assert_eq!((on.rtts_us.len(), on.lost, on.blocks), (10, 0, 4));
        assert_eq!(on.discarded_us.len(), 4);
        assert_eq!(on.block_lens, [2, 3, 2, 3]);
        assert_eq!(off.block_lens, [2, 2, 2, 2]);
        assert_eq!(on.sent_ms.len(), on.rtts_us.len());
        assert!(on.sent_ms.windows(2).all(|w| w[0] <= w[1]));
        // Off counted blocks of 2, 3, 2, 3 probes lose one probe each in the 3-probe blocks.
        assert_eq!((off.rtts_us.len(), off.lost, off.blocks), (8, 2, 4));
        let s = off.summary();
        assert_eq!((s.probes, s.lost, s.p99_us), (10, 2, 50.0));
    }
}
