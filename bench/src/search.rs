//! RFC 2544 throughput search: the highest offered rate whose loss stays under a limit (the
//! no-drop rate, NDR), by bisection between zero and what the device delivers at saturation.

use anyhow::{Result, bail};

/// What the search needs to know about one trial.
pub trait Outcome {
    /// Rate the generator actually offered (frames/s).
    fn offered_pps(&self) -> f64;
    /// Rate that arrived at the sink (frames/s).
    fn delivered_pps(&self) -> f64;
    /// Lost fraction of the offered frames (0.0–1.0).
    fn loss(&self) -> f64;
}

/// Knobs of the search.
#[derive(Clone, Copy, Debug)]
pub struct SearchParams {
    /// Highest loss fraction that still counts as "no drop" (RFC 2544 uses 0; we use 0.05 %).
    pub loss_limit: f64,
    /// Paced search steps after the saturation trial; each one halves the search interval.
    pub steps: u32,
    /// Extra attempts of a failed paced trial before its rate counts as lossy. On a shared VM a
    /// single scheduling hiccup of another tenant drops a few frames at any rate; a rate must
    /// lose in `1 + retries` trials in a row to be rejected.
    pub retries: u32,
}

/// Result of one search; `T` is the caller's trial record.
#[derive(Clone, Debug)]
pub struct SearchResult<T> {
    /// No-drop rate (frames/s): the offered rate of the best passing trial, 0 if none passed.
    pub ndr_pps: f64,
    /// The unpaced trial (maximum offered load): its delivered rate is the forwarding rate
    /// under overload.
    pub saturation: T,
    /// The trial that set `ndr_pps`.
    pub ndr_trial: Option<T>,
    /// Every trial in the order run, the saturation trial first.
    pub trials: Vec<T>,
    /// True when even the unpaced generator lost nothing: the device under test was faster
    /// than the generator, so `ndr_pps` is the generator's rate, a lower bound.
    pub generator_limited: bool,
}

/// Runs the search. `trial(None)` must offer load flat out, `trial(Some(r))` paced at `r`.
pub fn ndr_search<T: Outcome + Clone>(
    p: &SearchParams,
    mut trial: impl FnMut(Option<f64>) -> Result<T>,
) -> Result<SearchResult<T>> {
    let sat = trial(None)?;
    let mut trials = vec![sat.clone()];
    if sat.delivered_pps() <= 0.0 {
        bail!(
            "nothing arrived at the sink ({:.0} frames/s offered): the path is broken",
            sat.offered_pps()
        );
    }
    if sat.loss() <= p.loss_limit {
        return Ok(SearchResult {
            ndr_pps: sat.offered_pps(),
            ndr_trial: Some(sat.clone()),
            saturation: sat,
            trials,
            generator_limited: true,
        });
    }
    // Under overload a device delivers about its capacity; allow a little above it, since some
    // devices forward less when flooded than at their no-drop rate.
    let mut hi = sat.offered_pps().min(sat.delivered_pps() * 1.1);
    let mut lo = 0.0;
    let mut best: Option<T> = None;
    let mut rate = 0.9 * sat.delivered_pps();
    for _ in 0..p.steps {
        let mut t = trial(Some(rate))?;
        for _ in 0..p.retries {
            if t.loss() <= p.loss_limit {
                break;
            }
            trials.push(t);
            t = trial(Some(rate))?;
        }
        if t.loss() <= p.loss_limit {
            lo = rate;
            if best
                .as_ref()
                .is_none_or(|b| t.offered_pps() > b.offered_pps())
            {
                best = Some(t.clone());
            }
        } else {
            hi = rate;
        }
        trials.push(t);
        rate = (lo + hi) / 2.0;
    }
    Ok(SearchResult {
        ndr_pps: best.as_ref().map_or(0.0, Outcome::offered_pps),
        ndr_trial: best,
        saturation: sat,
        trials,
        generator_limited: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug)]
    struct Fake {
        offered: f64,
        delivered: f64,
    }

    impl Outcome for Fake {
        fn offered_pps(&self) -> f64 {
            self.offered
        }
        fn delivered_pps(&self) -> f64 {
            self.delivered
        }
        fn loss(&self) -> f64 {
            1.0 - self.delivered / self.offered
        }
    }

    /// A device that forwards up to `cap` frames/s, fed by a generator of at most `gen_max`.
    fn device(cap: f64, gen_max: f64) -> impl FnMut(Option<f64>) -> Result<Fake> {
        move |rate| {
            let offered = rate.unwrap_or(gen_max).min(gen_max);
            Ok(Fake {
                offered,
                delivered: offered.min(cap),
            })
        }
    }

    const P: SearchParams = SearchParams {
        loss_limit: 0.0005,
        steps: 7,
        retries: 0,
    };

    #[test]
    fn finds_capacity_within_resolution() {
        for cap in [100_000.0, 573_000.0, 2_400_000.0] {
            let r = ndr_search(&P, device(cap, 5_000_000.0)).unwrap();
            assert!(!r.generator_limited);
            assert!(r.ndr_pps <= cap, "{cap}: {}", r.ndr_pps);
            // 1.1·cap / 2^7 ≈ 0.9 % resolution after 7 halvings.
            assert!(r.ndr_pps >= cap * 0.985, "{cap}: {}", r.ndr_pps);
            assert_eq!(r.trials.len(), 1 + P.steps as usize);
        }
    }

    #[test]
    fn a_single_lossy_trial_is_retried() {
        // Every third trial suffers a hiccup; with one retry the search still finds capacity.
        let mut n = 0;
        let mut dev = device(500_000.0, 5_000_000.0);
        let flaky = |rate: Option<f64>| {
            n += 1;
            let mut t = dev(rate)?;
            if n % 3 == 0 {
                t.delivered *= 0.99;
            }
            Ok(t)
        };
        let p = SearchParams { retries: 1, ..P };
        let r = ndr_search(&p, flaky).unwrap();
        assert!(r.ndr_pps >= 500_000.0 * 0.985, "{}", r.ndr_pps);
        assert!(r.trials.len() > 1 + P.steps as usize);
    }

    #[test]
    fn generator_limited_is_flagged() {
        let r = ndr_search(&P, device(9e9, 3_000_000.0)).unwrap();
        assert!(r.generator_limited);
        assert_eq!(r.ndr_pps, 3_000_000.0);
        assert_eq!(r.trials.len(), 1);
    }

    #[test]
    fn constant_loss_gives_zero_and_nothing_arriving_fails() {
        let lossy = |rate: Option<f64>| {
            let offered = rate.unwrap_or(1e6);
            Ok(Fake {
                offered,
                delivered: offered * 0.99,
            })
        };
        let r = ndr_search(&P, lossy).unwrap();
        assert_eq!(r.ndr_pps, 0.0);
        assert!(r.ndr_trial.is_none());
        let dead = |_: Option<f64>| {
            Ok(Fake {
                offered: 1e6,
                delivered: 0.0,
            })
        };
        assert!(ndr_search(&P, dead).is_err());
    }
}
