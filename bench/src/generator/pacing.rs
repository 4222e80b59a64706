//! When a generator's bursts are due: flat out, or a rate in short bursts, until a run's time
//! or frame count is used up. Both generators send through a [`Pacer`].

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// Largest burst of a paced run: the veth ring holds 256 frames, so a burst never overflows it
/// by itself.
const MAX_PACED_BURST: u32 = 256;

/// Burst size for a paced rate: about 200 µs of frames, 16..=256.
pub fn burst_for(rate: f64) -> u32 {
    ((rate * 200e-6).round() as u32).clamp(16, MAX_PACED_BURST)
}

/// Time after the start of a run at which the burst following `sent` frames is due at `rate`
/// frames/s: when the frames sent so far have used up their time share.
fn due_after(sent: u64, rate: f64) -> Duration {
    Duration::from_secs_f64(sent as f64 / rate)
}

/// The bursts of one run.
pub struct Pacer {
    start: Instant,
    rate: Option<f64>,
    duration: Duration,
    max_frames: u64,
    burst: u32,
}

impl Pacer {
    /// A run of `duration` or `max_frames` frames, whichever ends first: flat out in bursts of
    /// `flat_out_burst` when `rate` is `None`, else paced at `rate` frames/s in bursts of
    /// [`burst_for`]. The run starts now.
    pub fn new(
        rate: Option<f64>,
        duration: Duration,
        max_frames: u64,
        flat_out_burst: u32,
    ) -> Result<Pacer> {
        if let Some(r) = rate
            && !(r.is_finite() && r >= 1.0)
        {
            bail!("generator rate must be at least 1 frame/s, got {r}");
        }
        Ok(Pacer {
            start: Instant::now(),
            rate,
            duration,
            max_frames,
            burst: rate.map_or(flat_out_burst, burst_for),
        })
    }

    /// The full burst size of this run.
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// The frames of the burst after `sent` frames (the last burst is cut to `max_frames`),
    /// once it is due; `None` when the run is over.
    pub fn next(&self, sent: u64) -> Option<u32> {
        let left = self.max_frames.checked_sub(sent).filter(|&n| n > 0)?;
        let now = Instant::now();
        if now - self.start >= self.duration {
            return None;
        }
        if let Some(r) = self.rate {
            let due = self.start + due_after(sent, r);
            if due > now {
                let wait = due - now;
                if wait > Duration::from_micros(300) {
                    std::thread::sleep(wait - Duration::from_micros(150));
                }
                while Instant::now() < due {
                    std::hint::spin_loop();
                }
            }
        }
        Some(self.burst.min(u32::try_from(left).unwrap_or(u32::MAX)))
    }

    /// Wall time since the start of the run.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_stay_within_the_ring() {
        assert_eq!(burst_for(1_000.0), 16);
        assert_eq!(burst_for(500_000.0), 100);
        assert_eq!(burst_for(10_000_000.0), MAX_PACED_BURST);
    }

    #[test]
    fn bursts_are_due_when_their_time_share_is_used() {
        assert_eq!(due_after(0, 1e6), Duration::ZERO);
        assert_eq!(due_after(1_000, 500_000.0), Duration::from_millis(2));
        assert_eq!(due_after(148_810, 148_810.0), Duration::from_secs(1));
    }

    #[test]
    fn the_last_burst_is_cut_to_the_frame_count() {
        let p = Pacer::new(None, Duration::from_secs(60), 100, 64).unwrap();
        assert_eq!(p.next(0), Some(64));
        assert_eq!(p.next(64), Some(36));
        assert_eq!(p.next(100), None);
    }

    #[test]
    fn a_paced_run_takes_its_time() {
        // 2,000 frames at 100,000/s in bursts of 20: the last burst is due after 19.8 ms.
        let p = Pacer::new(Some(100_000.0), Duration::from_secs(60), 2_000, 64).unwrap();
        assert_eq!(p.burst(), 20);
        let mut sent = 0;
        while let Some(n) = p.next(sent) {
            sent += u64::from(n);
        }
        assert_eq!(sent, 2_000);
        assert!(
            p.elapsed() >= Duration::from_micros(19_800),
            "{:?}",
            p.elapsed()
        );
    }

    #[test]
    fn a_run_ends_after_its_duration() {
        let p = Pacer::new(None, Duration::ZERO, u64::MAX, 64).unwrap();
        assert_eq!(p.next(0), None);
    }

    #[test]
    fn rates_below_one_frame_per_second_are_refused() {
        for r in [0.0, 0.5, -3.0, f64::NAN, f64::INFINITY] {
            assert!(
                Pacer::new(Some(r), Duration::from_secs(1), 1, 64).is_err(),
                "{r}"
            );
        }
    }
}
