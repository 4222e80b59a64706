//! The churn generator: the mix of connection kinds, their checked requests and datagrams,
//! the echo servers on the WAN host and the client loop on the LAN host, and a step's
//! counters.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    rc::Rc,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::Duration,
};

use anyhow::{Context as _, Result};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream, UdpSocket},
    time::timeout,
};
use xdp_router_testbed::netns::{Netns, enter_netns};

use crate::{
    pin::pin_current_thread,
    run::stopped,
    soak::{self, CONN_TIMEOUT, ECHO_PORT, FAILURE_KINDS, Failure},
    testbed::GEN_CPU,
};

/// Connections open at once, at most.
pub(super) const IN_FLIGHT: usize = 8192;

/// Tries of a UDP exchange, and the wait for the echo of each.
pub(super) const UDP_TRIES: u32 = 3;
const UDP_RETRY: Duration = Duration::from_secs(1);
/// Longest UDP datagram (fits a 1,500-byte MTU: no fragments).
const DATAGRAM_MAX: usize = 1216;

/// One kind of connection of the mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    TcpV4,
    TcpV6,
    UdpV4,
    UdpV6,
}

/// The kinds, in turn, with their names.
pub(super) const KINDS: [(Kind, &str); 4] = [
    (Kind::TcpV4, "tcp4"),
    (Kind::TcpV6, "tcp6"),
    (Kind::UdpV4, "udp4"),
    (Kind::UdpV6, "udp6"),
];

impl Kind {
    fn of(n: u64) -> Kind {
        KINDS[(n % 4) as usize].0
    }

    fn server(self) -> SocketAddr {
        let ip = match self {
            Kind::TcpV4 | Kind::UdpV4 => IpAddr::V4(Ipv4Addr::new(10, 0, 2, 2)),
            Kind::TcpV6 | Kind::UdpV6 => IpAddr::V6(Ipv6Addr::new(0xfd00, 2, 0, 0, 0, 0, 0, 2)),
        };
        SocketAddr::new(ip, ECHO_PORT)
    }
}

/// The datagram of UDP exchange `n`.
fn datagram(n: u64) -> Vec<u8> {
    soak::payload(
        n,
        16 + (n.wrapping_mul(7919) % (DATAGRAM_MAX as u64 - 16)) as usize,
    )
}

/// Whether `buf` is a well-formed request or datagram (it rebuilds itself from its header).
fn well_formed(buf: &[u8]) -> bool {
    let word = |i: usize| {
        buf.get(i..i + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes)
    };
    match (word(0), word(8)) {
        (Some(n), Some(len)) => len as usize == buf.len() && buf == soak::payload(n, buf.len()),
        _ => false,
    }
}

/// Counters of one step.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) started: AtomicU64,
    pub(super) ok: AtomicU64,
    pub(super) failed: [AtomicU64; 5],
    /// UDP requests sent again (no echo within [`UDP_RETRY`]).
    pub(super) udp_retries: AtomicU64,
    /// Failures by [`Kind`] (as [`KINDS`]).
    pub(super) failed_kind: [AtomicU64; 4],
    /// Requests the servers received malformed.
    pub(super) server_bad: AtomicU64,
}

impl Counters {
    fn fail(&self, conn: Kind, kind: Failure) {
        self.failed_kind[KINDS.iter().position(|k| k.0 == conn).unwrap_or(0)]
            .fetch_add(1, Ordering::Relaxed);
        let i = FAILURE_KINDS
            .iter()
            .position(|(k, _)| *k == kind)
            .unwrap_or(4);
        self.failed[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// The echo servers (TCP and UDP, IPv4 and IPv6) in the WAN host; stopped on drop.
pub struct Servers {
    stop: Arc<AtomicBool>,
    pub(super) counters: Arc<Counters>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Servers {
    pub fn start(wan: &Netns) -> Result<Servers> {
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let path = wan.path();
        let (s, c) = (stop.clone(), counters.clone());
        let thread = thread::spawn(move || {
            let rt = (|| -> Result<tokio::runtime::Runtime> {
                enter_netns(&path)?;
                pin_current_thread(GEN_CPU)?;
                Ok(tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?)
            })();
            let rt = match rt {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, async move {
                match bind_servers().await {
                    Ok(socks) => {
                        let _ = tx.send(Ok(()));
                        serve(socks, s, c).await;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            });
        });
        rx.recv().context("churn server thread")??;
        Ok(Servers {
            stop,
            counters,
            thread: Some(thread),
        })
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn bind_servers() -> Result<(Vec<TcpListener>, Vec<UdpSocket>)> {
    let mut tcp = Vec::new();
    let mut udp = Vec::new();
    for kind in [Kind::TcpV4, Kind::TcpV6] {
        let addr = kind.server();
        let sock = match addr {
            SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        sock.set_reuseaddr(true)?;
        sock.bind(addr)
            .with_context(|| format!("binding the churn server to {addr}"))?;
        tcp.push(sock.listen(4096)?);
    }
    for kind in [Kind::UdpV4, Kind::UdpV6] {
        let addr = kind.server();
        udp.push(
            UdpSocket::bind(addr)
                .await
                .with_context(|| format!("binding the churn UDP server to {addr}"))?,
        );
    }
    Ok((tcp, udp))
}

async fn serve(
    (tcp, udp): (Vec<TcpListener>, Vec<UdpSocket>),
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
) {
    for l in tcp {
        let counters = counters.clone();
        tokio::task::spawn_local(async move {
            loop {
                let Ok((s, _)) = l.accept().await else {
                    continue;
                };
                let counters = counters.clone();
                tokio::task::spawn_local(async move {
                    // A connection the client gave up on (it counts that) is not counted here.
                    if let Ok(Ok(false)) = timeout(CONN_TIMEOUT, echo_tcp(s)).await {
                        counters.server_bad.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
    }
    for u in udp {
        let counters = counters.clone();
        tokio::task::spawn_local(async move {
            let mut buf = vec![0u8; 2048];
            loop {
                let Ok((len, from)) = u.recv_from(&mut buf).await else {
                    continue;
                };
                let Some(got) = buf.get(..len) else { continue };
                if well_formed(got) {
                    let _ = u.send_to(got, from).await;
                } else {
                    counters.server_bad.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Server side of a TCP connection: reads the request (its length is in its header), checks
/// it, echoes it and closes. `Ok(false)`: the request was malformed.
async fn echo_tcp(mut s: TcpStream) -> std::io::Result<bool> {
    let mut head = [0u8; 16];
    s.read_exact(&mut head).await?;
    let len = u64::from_be_bytes(head[8..].try_into().unwrap_or([0; 8])) as usize;
    if !(16..=65_536).contains(&len) {
        return Ok(false);
    }
    let mut buf = vec![0u8; len];
    buf[..16].copy_from_slice(&head);
    s.read_exact(&mut buf[16..]).await?;
    let good = well_formed(&buf);
    s.write_all(&buf).await?;
    s.shutdown().await?;
    Ok(good)
}

/// Client side of connection `n`.
async fn exchange(n: u64, counters: &Counters) -> Result<(), Failure> {
    let kind = Kind::of(n);
    let to = kind.server();
    let io = |e: std::io::Error| soak::classify(&e);
    let run = async {
        match kind {
            Kind::TcpV4 | Kind::TcpV6 => {
                let req = soak::request(n);
                let mut s = TcpStream::connect(to).await.map_err(io)?;
                s.write_all(&req).await.map_err(io)?;
                let mut back = Vec::with_capacity(req.len());
                s.read_to_end(&mut back).await.map_err(io)?;
                if back == req {
                    Ok(())
                } else {
                    Err(Failure::Mismatch)
                }
            }
            Kind::UdpV4 | Kind::UdpV6 => {
                let any: SocketAddr = match to {
                    SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
                    SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
                };
                let req = datagram(n);
                let s = UdpSocket::bind(any).await.map_err(io)?;
                s.connect(to).await.map_err(io)?;
                let mut back = vec![0u8; DATAGRAM_MAX + 1];
                // Like a DNS client: the request again after a second without an answer.
                for attempt in 0..UDP_TRIES {
                    if attempt > 0 {
                        counters.udp_retries.fetch_add(1, Ordering::Relaxed);
                    }
                    // A send refused for a full queue (ENOBUFS) is a lost datagram too.
                    let _ = s.send(&req).await;
                    if let Ok(got) = timeout(UDP_RETRY, s.recv(&mut back)).await {
                        let len = got.map_err(io)?;
                        return if back.get(..len) == Some(&req[..]) {
                            Ok(())
                        } else {
                            Err(Failure::Mismatch)
                        };
                    }
                }
                Err(Failure::Timeout)
            }
        }
    };
    timeout(CONN_TIMEOUT, run)
        .await
        .unwrap_or(Err(Failure::Timeout))
}

/// Runs `rate` new connections per second for `dur` from the LAN host; returns the counters
/// once every started connection has finished.
pub(super) fn generate(lan: &Netns, rate: u32, dur: Duration) -> Result<(Counters, Duration)> {
    let path = lan.path();
    thread::scope(|s| {
        s.spawn(move || -> Result<(Counters, Duration)> {
            enter_netns(&path)?;
            pin_current_thread(GEN_CPU)?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let local = tokio::task::LocalSet::new();
            let counters = Rc::new(Counters::default());
            let c = counters.clone();
            let took = local.block_on(&rt, async move {
                let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
                let t0 = tokio::time::Instant::now();
                let end = t0 + dur;
                let mut n = 0u64;
                loop {
                    let due = t0 + Duration::from_secs_f64(n as f64 / f64::from(rate));
                    if due >= end || stopped() {
                        break;
                    }
                    tokio::time::sleep_until(due).await;
                    let Ok(slot) = slots.clone().acquire_owned().await else {
                        break;
                    };
                    if tokio::time::Instant::now() >= end {
                        break;
                    }
                    c.started.fetch_add(1, Ordering::Relaxed);
                    let c = c.clone();
                    tokio::task::spawn_local(async move {
                        match exchange(n, &c).await {
                            Ok(()) => c.ok.fetch_add(1, Ordering::Relaxed),
                            Err(kind) => {
                                c.fail(Kind::of(n), kind);
                                0
                            }
                        };
                        drop(slot);
                    });
                    n += 1;
                }
                let took = t0.elapsed();
                // Every started connection ends (done or timed out) before the step does.
                let _ = slots.acquire_many(IN_FLIGHT as u32).await;
                took
            });
            let counters = Rc::try_unwrap(counters).map_err(|_| {
                anyhow::anyhow!("churn generator: a connection task outlived the step")
            })?;
            Ok((counters, took))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("churn generator thread panicked"))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagrams_fit_the_mtu_and_check_themselves() {
        for n in 0..5000 {
            let d = datagram(n);
            assert!((16..=DATAGRAM_MAX).contains(&d.len()));
            assert!(well_formed(&d));
            assert!(well_formed(&soak::request(n)));
        }
        let mut d = datagram(7);
        d[20] ^= 1;
        assert!(!well_formed(&d));
        assert!(!well_formed(&datagram(7)[..20]));
    }
}
