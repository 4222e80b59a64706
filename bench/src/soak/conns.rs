//! The soak test's short TCP connections: an echo server on the WAN host, client threads on
//! the LAN host, requests derived from their number and checked both ways, and the kinds of
//! failure told apart.

use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use xdp_router_testbed::netns::{Netns, enter_netns};

use crate::{pin::pin_current_thread, run::stopped, testbed::GEN_CPU};

/// Port of the short-connection echo server on the WAN host.
pub(crate) const ECHO_PORT: u16 = 7000;

/// Client threads opening the short connections.
const WORKERS: usize = 48;
/// Connect/read/write timeout of one short connection.
pub(crate) const CONN_TIMEOUT: Duration = Duration::from_secs(5);

/// Failures printed in full (the rest are only counted).
const SHOWN_FAILURES: usize = 20;

/// How a short connection failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    Reset,
    Refused,
    Timeout,
    Mismatch,
    Other,
}

pub(crate) const FAILURE_KINDS: [(Failure, &str); 5] = [
    (Failure::Reset, "reset"),
    (Failure::Refused, "refused"),
    (Failure::Timeout, "timeout"),
    (Failure::Mismatch, "data mismatch"),
    (Failure::Other, "other error"),
];

pub(crate) fn classify(e: &std::io::Error) -> Failure {
    match e.kind() {
        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe => {
            Failure::Reset
        }
        ErrorKind::ConnectionRefused => Failure::Refused,
        ErrorKind::TimedOut | ErrorKind::WouldBlock => Failure::Timeout,
        _ => Failure::Other,
    }
}

/// Request of connection `n`: its number, then a length and content derived from it.
pub(crate) fn request(n: u64) -> Vec<u8> {
    payload(n, 16 + (n.wrapping_mul(7919) % 3000) as usize)
}

/// `len` (at least 16) bytes: `n`, `len`, then content derived from `n`; a receiver checks it
/// by rebuilding it from its first 16 bytes.
pub(crate) fn payload(n: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&n.to_be_bytes());
    v.extend_from_slice(&(len as u64).to_be_bytes());
    let mut x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x as u8);
    }
    v
}

/// Counters of one run's short connections.
#[derive(Default)]
pub(super) struct Conns {
    pub(super) started: AtomicU64,
    pub(super) ok: AtomicU64,
    pub(super) failed: [AtomicU64; 5],
    /// Server side: requests that arrived wrong, and connections the server saw reset.
    pub(super) server_mismatch: AtomicU64,
    pub(super) server_reset: AtomicU64,
    pub(super) server_other: AtomicU64,
    pub(super) shown: Mutex<Vec<String>>,
}

impl Conns {
    fn fail(&self, kind: Failure, what: String) {
        let i = FAILURE_KINDS
            .iter()
            .position(|(k, _)| *k == kind)
            .unwrap_or(4);
        self.failed[i].fetch_add(1, Ordering::Relaxed);
        let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        if shown.len() < SHOWN_FAILURES {
            shown.push(what);
        }
    }

    pub(super) fn failed_total(&self) -> u64 {
        self.failed.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

/// One short connection: connect, send the request, half-close, read the echo, compare.
fn one_connection(n: u64, to: SocketAddr, conns: &Conns, t0: Instant) {
    let req = request(n);
    let mut local = None;
    let res = (|| -> std::io::Result<Result<(), String>> {
        let mut s = TcpStream::connect_timeout(&to, CONN_TIMEOUT)?;
        local = s.local_addr().ok();
        s.set_read_timeout(Some(CONN_TIMEOUT))?;
        s.set_write_timeout(Some(CONN_TIMEOUT))?;
        s.write_all(&req)?;
        s.shutdown(Shutdown::Write)?;
        let mut back = Vec::with_capacity(req.len());
        s.read_to_end(&mut back)?;
        Ok(if back == req {
            Ok(())
        } else {
            Err(format!(
                "echo of {} bytes differs (got {} bytes)",
                req.len(),
                back.len()
            ))
        })
    })();
    let at = t0.elapsed().as_secs_f64();
    let who =
        |local: Option<SocketAddr>| local.map_or_else(|| "(unbound)".to_owned(), |a| a.to_string());
    match res {
        Ok(Ok(())) => {
            conns.ok.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Err(why)) => conns.fail(
            Failure::Mismatch,
            format!("t={at:.1}s #{n} {} -> {to}: {why}", who(local)),
        ),
        Err(e) => {
            let kind = classify(&e);
            conns.fail(kind, format!("t={at:.1}s #{n} {} -> {to}: {e}", who(local)));
        }
    }
}

/// Server side of one connection: read the whole request, check it, echo it, close.
fn serve(mut s: TcpStream, conns: &Conns) {
    let res = (|| -> std::io::Result<bool> {
        s.set_read_timeout(Some(CONN_TIMEOUT))?;
        s.set_write_timeout(Some(CONN_TIMEOUT))?;
        let mut buf = Vec::with_capacity(4096);
        s.read_to_end(&mut buf)?;
        let n = buf
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes);
        let good = n.is_some_and(|n| buf == request(n));
        s.write_all(&buf)?;
        Ok(good)
    })();
    match res {
        Ok(true) => {}
        Ok(false) => {
            conns.server_mismatch.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) if classify(&e) == Failure::Reset => {
            conns.server_reset.fetch_add(1, Ordering::Relaxed);
        }
        Err(_) => {
            conns.server_other.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The echo servers on the WAN host (IPv4 and IPv6), one thread per connection.
pub(super) fn start_servers(wan: &Netns, conns: &Arc<Conns>, stop: &Arc<AtomicBool>) -> Result<()> {
    for addr in ["10.0.2.2", "fd00:2::2"] {
        let ip: IpAddr = addr.parse().context("server address")?;
        let path = wan.path();
        let (conns, stop) = (conns.clone(), stop.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        thread::spawn(move || {
            let listener = (|| -> Result<TcpListener> {
                enter_netns(&path)?;
                pin_current_thread(GEN_CPU)?;
                let l = TcpListener::bind(SocketAddr::new(ip, ECHO_PORT))
                    .with_context(|| format!("binding the echo server to {ip}"))?;
                l.set_nonblocking(true)?;
                Ok(l)
            })();
            let listener = match listener {
                Ok(l) => {
                    let _ = tx.send(Ok(()));
                    l
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        let _ = s.set_nonblocking(false);
                        let conns = conns.clone();
                        // Threads spawned here inherit the namespace and the CPU pin.
                        thread::spawn(move || serve(s, &conns));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_micros(500));
                    }
                    Err(_) => {
                        conns.server_other.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        rx.recv().context("echo server thread")??;
    }
    Ok(())
}

/// The connection generator: `WORKERS` threads in the LAN host, connection `n` due at
/// `n / rate` seconds after the start (started late when every worker is busy: the achieved
/// rate is what the report prints).
pub(super) fn start_clients(
    lan: &Netns,
    rate: u32,
    until: Instant,
    conns: &Arc<Conns>,
) -> Vec<thread::JoinHandle<()>> {
    let next = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let v4: SocketAddr = SocketAddr::new(IpAddr::from([10, 0, 2, 2]), ECHO_PORT);
    let v6: SocketAddr = SocketAddr::new(IpAddr::from([0xfd00, 2, 0, 0, 0, 0, 0, 2u16]), ECHO_PORT);
    (0..WORKERS)
        .map(|_| {
            let (path, conns, next) = (lan.path(), conns.clone(), next.clone());
            thread::spawn(move || {
                if enter_netns(&path).is_err() || pin_current_thread(GEN_CPU).is_err() {
                    conns.fail(Failure::Other, "client thread setup failed".into());
                    return;
                }
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let due = t0 + Duration::from_secs_f64(n as f64 / f64::from(rate));
                    if due >= until || stopped() {
                        return;
                    }
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        thread::sleep(wait);
                    }
                    conns.started.fetch_add(1, Ordering::Relaxed);
                    one_connection(n, if n % 2 == 0 { v4 } else { v6 }, &conns, t0);
                }
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_distinct_and_self_describing() {
        let a = request(1);
        let b = request(2);
        assert_ne!(a, b);
        assert_eq!(u64::from_be_bytes(a[..8].try_into().unwrap()), 1);
        assert_eq!(
            u64::from_be_bytes(a[8..16].try_into().unwrap()),
            a.len() as u64
        );
        assert!((16..3016).contains(&request(12345).len()));
    }
}
