//! Round-trip latency through the router: a UDP echo server on the WAN host and a client on the
//! LAN host with fixed ports, so the echo flow is itself an established (offloadable) flow.
//!
//! The fast path off/on comparison is interleaved ([`interleave`]): the probes of both modes are
//! taken in alternating blocks (ABBA order), with the background load running throughout, and
//! each mode's samples are pooled. This VM's speed drifts within seconds, so two blocks taken one
//! after the other would compare the VM's moods, not the modes. The p99 difference is judged by
//! a bootstrap confidence interval that resamples the rounds as pairs and the
//! probes within them in short runs ([`quantile_diff_ci`]).

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

/// Echo server address (WAN host).
const SERVER: &str = "10.0.2.2:7007";
/// Echo client address (LAN host); fixed so every probe run uses the same conntrack entry.
const CLIENT: &str = "10.0.1.2:7008";
/// How long a probe may take before it counts as lost.
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);

/// Parameters of the bootstrap confidence intervals.
#[derive(Clone, Copy, Debug)]
pub struct Bootstrap {
    /// Block length (probes) of the moving-block resampling.
    pub block: usize,
    /// Resamples per interval.
    pub resamples: u32,
    /// PRNG seed: the same samples always give the same interval.
    pub seed: u64,
}

impl Bootstrap {
    /// What the benchmark uses: blocks of 10 probes, because a hiccup of this VM (a
    /// descheduled vCPU, another tenant's burst) slows several consecutive 1 ms probes, so
    /// single probes are not independent; resampling runs of 10 keeps such clusters together
    /// and widens the interval accordingly (1 would be the plain i.i.d. bootstrap, too narrow
    /// here). 2000 resamples, a fixed seed.
    pub const BENCH: Bootstrap = Bootstrap {
        block: 10,
        resamples: 2000,
        seed: 0x5eed_1a7e_c0de_0099,
    };
}

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

/// The `p`-th percentile of ascending `sorted` samples: the sample at rank
/// round(p/100 · (n − 1)) (nearest rank, no interpolation); NaN when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[rank(sorted.len(), p)]
}

/// Index of the `p`-th percentile in `n` sorted samples (n > 0).
fn rank(n: usize, p: f64) -> usize {
    let i = ((p / 100.0).clamp(0.0, 1.0) * (n - 1) as f64).round() as usize;
    i.min(n - 1)
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

/// SplitMix64: a tiny, fixed-seed PRNG (enough for resampling indices).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0; the multiply-shift bias is < n / 2^64).
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

/// Samples prepared for resampling one percentile: sorted values, the rank of each sample in
/// time order, and the strata (contiguous runs of samples: the blocks of an interleaved run).
struct Resampler {
    sorted: Vec<f64>,
    rank_of: Vec<usize>,
    counts: Vec<u32>,
    /// (start, length) of each stratum, empty ones included (they pair with the other mode's).
    strata: Vec<(usize, usize)>,
    block: usize,
}

impl Resampler {
    /// `strata`: lengths of consecutive strata of `samples`; if they do not add up to the
    /// number of samples (e.g. empty), all samples form one stratum.
    fn new(samples: &[f64], strata: &[usize], block: usize) -> Resampler {
        let mut order: Vec<usize> = (0..samples.len()).collect();
        order.sort_by(|&a, &b| samples[a].total_cmp(&samples[b]));
        let mut rank_of = vec![0; samples.len()];
        for (r, &i) in order.iter().enumerate() {
            rank_of[i] = r;
        }
        let strata = if !strata.is_empty() && strata.iter().sum::<usize>() == samples.len() {
            let mut start = 0;
            strata
                .iter()
                .map(|&len| {
                    let s = start;
                    start += len;
                    (s, len)
                })
                .collect()
        } else {
            vec![(0, samples.len())]
        };
        Resampler {
            sorted: order.iter().map(|&i| samples[i]).collect(),
            rank_of,
            counts: vec![0; samples.len()],
            strata,
            block: block.max(1),
        }
    }

    /// Samples in the strata `picks` (indices, repeats allowed).
    fn len_of(&self, picks: &[usize]) -> usize {
        picks.iter().map(|&i| self.strata[i].1).sum()
    }

    /// The `p`-th percentile of one resample made of the strata `picks` (their total length
    /// must be > 0): each picked stratum of length m contributes m samples, ⌈m / block⌉ runs of
    /// `block` consecutive samples of that stratum (circularly) starting at uniform random
    /// positions, the last run cut.
    fn percentile(&mut self, rng: &mut SplitMix64, p: f64, picks: &[usize]) -> f64 {
        self.counts.iter_mut().for_each(|c| *c = 0);
        let mut total = 0;
        for &i in picks {
            let (start, m) = self.strata[i];
            let block = self.block.min(m);
            let mut drawn = 0;
            while drawn < m {
                let first = rng.below(m);
                let take = block.min(m - drawn);
                for j in 0..take {
                    self.counts[self.rank_of[start + (first + j) % m]] += 1;
                }
                drawn += take;
            }
            total += m;
        }
        let k = rank(total.max(1), p);
        let mut seen = 0usize;
        for (r, &c) in self.counts.iter().enumerate() {
            seen += c as usize;
            if seen > k {
                return self.sorted[r];
            }
        }
        self.sorted[self.sorted.len() - 1]
    }
}

/// What a difference's confidence interval says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The whole interval is below 0: the first sample set (fast path on) is faster.
    Lower,
    /// The interval contains 0: no measurable difference.
    NoDifference,
    /// The whole interval is above 0: the first sample set (fast path on) is slower.
    Higher,
}

/// A percentile difference a − b with its bootstrap confidence interval.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct DiffCi {
    /// The percentile compared (e.g. 99).
    pub percentile: f64,
    /// The percentile of a (fast path on), µs.
    pub a_us: f64,
    /// The percentile of b (fast path off), µs.
    pub b_us: f64,
    /// a − b, µs.
    pub diff_us: f64,
    /// Lower bound of the 95 % interval of a − b, µs.
    pub lo_us: f64,
    /// Upper bound of the 95 % interval, µs.
    pub hi_us: f64,
    /// Bootstrap resamples.
    pub resamples: u32,
    /// Block length of the moving-block bootstrap (probes; shorter strata use their length).
    pub block: usize,
    /// Strata of a and b (the blocks of the interleaved run; equal counts ≥ 2 = resampled as
    /// paired rounds).
    pub strata: (usize, usize),
    /// Whether the interval lies below, around or above 0.
    pub verdict: Verdict,
}

/// The `p`-th percentile of `a` minus that of `b`, with a 95 % percentile-bootstrap interval:
/// `boot.resamples` times, a resample of each set is drawn and the difference of their
/// percentiles recorded; the interval is the 2.5th to 97.5th percentile of those differences.
///
/// Each set is given in the order taken, cut into strata of the lengths `a_strata` /
/// `b_strata`: the blocks of an interleaved run, stratum i of `a` and of `b` being the two
/// modes' blocks of round i. With the same number (≥ 2) of strata on both sides the resampling
/// has two stages: first the rounds, with replacement, the same rounds for both sets (a round
/// is one paired comparison: whatever slowed the VM in it weighed on both of its blocks, or on
/// one of them only, and the interval has to cover how much the difference varies from round
/// to round); then, within each picked round, each block in moving runs of `boot.block`
/// consecutive probes. Otherwise (no strata, e.g. `&[]`, or lengths that do not add up) each
/// set is one stratum, resampled in moving runs only. Deterministic for a given seed. `None`
/// when either set is empty or there are no resamples.
pub fn quantile_diff_ci(
    a: &[f64],
    a_strata: &[usize],
    b: &[f64],
    b_strata: &[usize],
    p: f64,
    boot: &Bootstrap,
) -> Option<DiffCi> {
    let Bootstrap {
        block,
        resamples,
        seed,
    } = *boot;
    if a.is_empty() || b.is_empty() || resamples == 0 {
        return None;
    }
    let mut ra = Resampler::new(a, a_strata, block);
    let mut rb = Resampler::new(b, b_strata, block);
    let a_us = percentile(&ra.sorted, p);
    let b_us = percentile(&rb.sorted, p);
    let rounds = ra.strata.len();
    let paired = rounds >= 2 && rb.strata.len() == rounds;
    let mut rng = SplitMix64(seed);
    let mut picks: Vec<usize> = (0..rounds).collect();
    let mut diffs = Vec::with_capacity(resamples as usize);
    while diffs.len() < resamples as usize {
        if paired {
            picks.iter_mut().for_each(|i| *i = rng.below(rounds));
            // Rounds whose blocks lost every probe can leave a side empty: draw again.
            if ra.len_of(&picks) == 0 || rb.len_of(&picks) == 0 {
                continue;
            }
        }
        let (pa, pb) = if paired {
            (picks.as_slice(), picks.as_slice())
        } else {
            (&[0][..], &[0][..])
        };
        diffs.push(ra.percentile(&mut rng, p, pa) - rb.percentile(&mut rng, p, pb));
    }
    diffs.sort_by(f64::total_cmp);
    let lo_us = percentile(&diffs, 2.5);
    let hi_us = percentile(&diffs, 97.5);
    let verdict = if hi_us < 0.0 {
        Verdict::Lower
    } else if lo_us > 0.0 {
        Verdict::Higher
    } else {
        Verdict::NoDifference
    };
    Some(DiffCi {
        percentile: p,
        a_us,
        b_us,
        diff_us: a_us - b_us,
        lo_us,
        hi_us,
        resamples,
        block: ra.block,
        strata: (ra.strata.len(), rb.strata.len()),
        verdict,
    })
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

    /// The p99 difference of two sample sets without rounds, with the bench's block length and
    /// 1000 resamples.
    fn p99_ci(a: &[f64], b: &[f64], seed: u64) -> Option<DiffCi> {
        quantile_diff_ci(
            a,
            &[],
            b,
            &[],
            99.0,
            &boot(Bootstrap::BENCH.block, 1000, seed),
        )
    }

    fn boot(block: usize, resamples: u32, seed: u64) -> Bootstrap {
        Bootstrap {
            block,
            resamples,
            seed,
        }
    }

    /// Deterministic pseudo-latencies: a 10 µs floor plus an exponential-ish tail.
    fn latencies(n: usize, seed: u64, shift: f64) -> Vec<f64> {
        let mut rng = SplitMix64(seed);
        (0..n)
            .map(|_| {
                let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                10.0 + shift - 8.0 * (1.0 - u).ln()
            })
            .collect()
    }

    #[test]
    fn prng_is_fixed_and_uniform_enough() {
        let mut r = SplitMix64(1);
        let first: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        let mut r2 = SplitMix64(1);
        assert_eq!(first, (0..3).map(|_| r2.next_u64()).collect::<Vec<_>>());
        let mut hist = [0u32; 10];
        for _ in 0..100_000 {
            hist[r.below(10)] += 1;
        }
        assert!(
            hist.iter().all(|&h| (9_500..10_500).contains(&h)),
            "{hist:?}"
        );
    }

    #[test]
    fn same_distribution_gives_an_interval_around_zero() {
        let a = latencies(3000, 11, 0.0);
        let b = latencies(3000, 22, 0.0);
        let ci = p99_ci(&a, &b, 7).expect("samples");
        assert!(ci.lo_us < 0.0 && ci.hi_us > 0.0, "{ci:?}");
        assert_eq!(ci.verdict, Verdict::NoDifference);
        assert!(ci.lo_us <= ci.diff_us && ci.diff_us <= ci.hi_us, "{ci:?}");
        // Deterministic: the same seed gives the same interval, another seed another one.
        let again = p99_ci(&a, &b, 7).expect("samples");
        assert_eq!((ci.lo_us, ci.hi_us), (again.lo_us, again.hi_us));
        let other = p99_ci(&a, &b, 8).expect("samples");
        assert_ne!((ci.lo_us, ci.hi_us), (other.lo_us, other.hi_us));
    }

    #[test]
    fn a_shift_is_detected_in_both_directions() {
        let base = latencies(3000, 11, 0.0);
        let slower = latencies(3000, 22, 15.0);
        let ci = p99_ci(&slower, &base, 7).expect("s");
        assert_eq!(ci.verdict, Verdict::Higher, "{ci:?}");
        assert!(ci.lo_us > 0.0 && (ci.diff_us - 15.0).abs() < 15.0, "{ci:?}");
        let ci = p99_ci(&base, &slower, 7).expect("s");
        assert_eq!(ci.verdict, Verdict::Lower, "{ci:?}");
        assert!(ci.hi_us < 0.0, "{ci:?}");
    }

    #[test]
    fn blocks_widen_the_interval_of_clustered_samples() {
        // Slow probes come in runs of 20 (a VM hiccup): 2 % of the probes in 3 runs. The
        // i.i.d. bootstrap treats them as independent and is too sure; moving blocks are not.
        let mut a = latencies(3000, 5, 0.0);
        for start in [400, 1500, 2600] {
            for x in &mut a[start..start + 20] {
                *x += 200.0;
            }
        }
        let b = latencies(3000, 6, 0.0);
        let iid = quantile_diff_ci(&a, &[], &b, &[], 99.0, &boot(1, 1000, 3)).expect("s");
        let blk = quantile_diff_ci(&a, &[], &b, &[], 99.0, &boot(20, 1000, 3)).expect("s");
        assert!(
            blk.hi_us - blk.lo_us > 1.5 * (iid.hi_us - iid.lo_us),
            "iid {iid:?} block {blk:?}"
        );
    }

    /// Ten rounds of 300 probes per mode.
    const ROUNDS: [usize; 10] = [300; 10];

    #[test]
    fn paired_rounds_cancel_a_shared_slowdown() {
        // In rounds 3 and 7 the VM was slow (+300 µs) for both modes alike, as interleaving
        // intends. Resampled as unrelated sets, one mode can draw more slow-round probes than
        // the other, noise the design removed; resampled as paired rounds it cannot.
        let slow = |v: &mut Vec<f64>| {
            for r in [3, 7] {
                for x in &mut v[r * 300..r * 300 + 300] {
                    *x += 300.0;
                }
            }
        };
        let (mut a, mut b) = (latencies(3000, 31, 0.0), latencies(3000, 32, 0.0));
        slow(&mut a);
        slow(&mut b);
        let flat = quantile_diff_ci(&a, &[], &b, &[], 95.0, &boot(10, 1000, 4)).expect("s");
        let paired =
            quantile_diff_ci(&a, &ROUNDS, &b, &ROUNDS, 95.0, &boot(10, 1000, 4)).expect("s");
        assert_eq!((paired.strata, flat.strata), ((10, 10), (1, 1)));
        assert_eq!(paired.verdict, Verdict::NoDifference, "{paired:?}");
        assert!(
            1.2 * (paired.hi_us - paired.lo_us) < flat.hi_us - flat.lo_us,
            "paired {paired:?} flat {flat:?}"
        );
        // Lengths that do not add up fall back to one stratum each.
        let odd = quantile_diff_ci(&a, &[5, 5], &b, &ROUNDS, 95.0, &boot(10, 10, 4)).expect("s");
        assert_eq!(odd.strata, (1, 10));
    }

    #[test]
    fn one_disturbed_block_is_not_a_difference_a_steady_one_is() {
        // A disturbance that hit one block of one mode (a 300 ms burst of another tenant) is
        // not a property of the mode: resampling the rounds shows the difference depends on
        // that one round. Resampling probes only (moving runs within each block, the blocks
        // kept) would call it significant.
        let b = latencies(3000, 41, 0.0);
        let mut a = latencies(3000, 42, 0.0);
        for x in &mut a[5 * 300..6 * 300] {
            *x += 300.0;
        }
        let ci = quantile_diff_ci(&a, &ROUNDS, &b, &ROUNDS, 95.0, &boot(10, 1000, 5)).expect("s");
        assert!(ci.diff_us > 100.0, "{ci:?}");
        assert_eq!(ci.verdict, Verdict::NoDifference, "{ci:?}");
        // The same +15 µs in every round is a difference.
        let a = latencies(3000, 42, 15.0);
        let ci = quantile_diff_ci(&a, &ROUNDS, &b, &ROUNDS, 95.0, &boot(10, 1000, 5)).expect("s");
        assert_eq!(ci.verdict, Verdict::Higher, "{ci:?}");
        // Rounds that lost every probe on one side are skipped, not a crash.
        let mut lens = ROUNDS;
        lens[0] = 0;
        lens[1] = 600;
        let ci = quantile_diff_ci(&a, &lens, &b, &ROUNDS, 95.0, &boot(10, 200, 5)).expect("s");
        assert_eq!(ci.strata, (10, 10));
    }

    #[test]
    fn degenerate_inputs() {
        assert!(quantile_diff_ci(&[], &[], &[1.0], &[], 99.0, &boot(10, 100, 1)).is_none());
        assert!(quantile_diff_ci(&[1.0], &[], &[1.0], &[], 99.0, &boot(10, 0, 1)).is_none());
        // Block longer than the samples, single samples: still an answer.
        let ci = quantile_diff_ci(&[5.0], &[], &[3.0], &[], 99.0, &boot(10, 50, 1)).expect("s");
        assert_eq!(
            (ci.diff_us, ci.lo_us, ci.hi_us, ci.strata),
            (2.0, 2.0, 2.0, (1, 1))
        );
        assert_eq!(ci.verdict, Verdict::Higher);
        // Identical constant samples: the interval is [0, 0], which counts as no difference.
        let ci =
            quantile_diff_ci(&[4.0; 30], &[], &[4.0; 40], &[], 99.0, &boot(10, 50, 1)).expect("s");
        assert_eq!(
            (ci.lo_us, ci.hi_us, ci.verdict),
            (0.0, 0.0, Verdict::NoDifference)
        );
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
