//! Latency statistics: nearest-rank percentiles, and the bootstrap confidence interval of a
//! quantile difference between two modes (rounds resampled as pairs, probes within them in
//! short blocks) with its verdict.

use serde::Serialize;

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
    use super::*;

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
}
