//! `GET /metrics` as a Prometheus scrape makes it, from inside the router namespace: its
//! answer and how long it took.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};

/// Where the daemon serves `/metrics` inside the router namespace (its default).
pub const METRICS_ADDR: &str = "127.0.0.1:9824";

/// One `GET /metrics`, read to the end (the caller is in the router namespace); fails unless
/// it answers 200 with samples. Returns the whole answer.
pub fn get(timeout: Duration) -> Result<String> {
    let mut s = TcpStream::connect(METRICS_ADDR)?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut body = Vec::new();
    s.read_to_end(&mut body)?;
    if !body.starts_with(b"HTTP/1.1 200") || !body.windows(10).any(|w| w == b"xdp_router") {
        bail!("unexpected /metrics answer");
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// Scrape latencies in ms, sorted.
#[derive(Debug, Default)]
pub struct Latencies(Vec<f64>);

impl Latencies {
    /// The `p`-th percentile (nearest rank; 100 = the slowest), `None` without samples.
    pub fn pct(&self, p: usize) -> Option<f64> {
        let v = &self.0;
        (!v.is_empty()).then(|| v[(v.len() * p / 100).min(v.len() - 1)])
    }

    /// How many scrapes were timed.
    pub fn count(&self) -> usize {
        self.0.len()
    }

    /// "p50 X ms, p99 Y ms (n scrapes)".
    pub fn figure(&self) -> String {
        let ms = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.1} ms"));
        format!(
            "p50 {}, p99 {} ({} scrapes, one at a time)",
            ms(self.pct(50)),
            ms(self.pct(99)),
            self.count()
        )
    }
}

/// Times up to `n` scrapes one after another, `gap` apart, until `budget` has passed (at least
/// one); each must succeed.
pub fn timed(n: usize, gap: Duration, budget: Duration) -> Result<Latencies> {
    let start = Instant::now();
    let mut ms = Vec::with_capacity(n);
    while ms.len() < n && (ms.is_empty() || start.elapsed() < budget) {
        let t = Instant::now();
        get(Duration::from_secs(30))?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        std::thread::sleep(gap);
    }
    ms.sort_by(f64::total_cmp);
    Ok(Latencies(ms))
}
