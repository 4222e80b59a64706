//! How long the state lock is waited for and held, by call site: the first thing to look at
//! when a request is slow under load. Recorded only while the `xdp_routerd::lock` log target
//! is enabled at debug level (`RUST_LOG=info,xdp_routerd::lock=debug`); then each call site's
//! figures are logged every [`REPORT_EVERY`] and individual holds or waits over [`SLOW`] at once.

use std::{
    collections::HashMap,
    panic::Location,
    time::{Duration, Instant},
};

use parking_lot::Mutex;
use tracing::debug;

/// A single wait or hold longer than this is logged when it ends.
pub const SLOW: Duration = Duration::from_millis(10);
/// How often the aggregated figures are logged.
pub const REPORT_EVERY: Duration = Duration::from_secs(5);

/// Whether lock timings are recorded (decided per acquisition: cheap when off).
pub fn enabled() -> bool {
    tracing::enabled!(target: "xdp_routerd::lock", tracing::Level::DEBUG)
}

#[derive(Default, Clone, Copy)]
struct Site {
    count: u64,
    wait: Duration,
    max_wait: Duration,
    hold: Duration,
    max_hold: Duration,
}

static SITES: Mutex<Option<(Instant, HashMap<&'static Location<'static>, Site>)>> =
    Mutex::new(None);

/// Records one acquisition at `at`: `wait` to get the lock, `hold` while it was held.
pub fn record(at: &'static Location<'static>, wait: Duration, hold: Duration) {
    if wait > SLOW || hold > SLOW {
        debug!(
            target: "xdp_routerd::lock",
            site = %at,
            wait_ms = wait.as_secs_f64() * 1e3,
            hold_ms = hold.as_secs_f64() * 1e3,
            "slow state lock"
        );
    }
    let report = {
        let mut sites = SITES.lock();
        let (since, map) = sites.get_or_insert_with(|| (Instant::now(), HashMap::new()));
        let s = map.entry(at).or_default();
        s.count += 1;
        s.wait += wait;
        s.max_wait = s.max_wait.max(wait);
        s.hold += hold;
        s.max_hold = s.max_hold.max(hold);
        (since.elapsed() >= REPORT_EVERY).then(|| sites.take())
    };
    if let Some(Some((since, map))) = report {
        let secs = since.elapsed().as_secs_f64();
        let mut sites: Vec<_> = map.into_iter().collect();
        sites.sort_by_key(|(_, s)| std::cmp::Reverse(s.hold));
        for (at, s) in sites {
            debug!(
                target: "xdp_routerd::lock",
                site = %at,
                count = s.count,
                hold_pct = s.hold.as_secs_f64() / secs * 100.0,
                max_hold_ms = s.max_hold.as_secs_f64() * 1e3,
                wait_pct = s.wait.as_secs_f64() / secs * 100.0,
                max_wait_ms = s.max_wait.as_secs_f64() * 1e3,
                "state lock over the last {secs:.1} s"
            );
        }
    }
}
