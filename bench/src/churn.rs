//! Connection churn through the router (part of `xdp-router-bench scale`): new short
//! connections per second, stepped up until one fails, with `xdp-routerd` running and, side by
//! side, with the kernel alone.
//!
//! Each connection is one of four kinds, in turn: TCP over IPv4 (masqueraded), TCP over IPv6,
//! a UDP exchange over IPv4 (masqueraded), a UDP exchange over IPv6. A TCP connection sends a
//! request of 16…3,016 bytes derived from its number ([`soak::request`]); the server checks it,
//! echoes it and closes first (the TIME_WAIT stays on the server, so the client's ports do not
//! run out); the client checks the echo. A UDP exchange sends one datagram of 16…1,216 bytes
//! from a fresh socket (a fresh source port, so a new conntrack entry) and checks the echo; like
//! a DNS client it sends the request again after a second without an answer (at most
//! [`UDP_TRIES`] times; the retries are counted and printed, as are the drop counters along the
//! path: TCP retransmits its own losses, UDP cannot).
//!
//! The generator is one async task loop (tokio, current-thread runtime) in the LAN host and
//! one in the WAN host, both on the generator CPU (with the daemon): connection `n` is due at
//! `n / rate` seconds; at most [`IN_FLIGHT`] are open at once (when the router or the server
//! falls behind, the achieved rate drops below the requested one, and the step fails).
//!
//! After each step with the daemon, the flow maps are compared with conntrack: every offloaded
//! direction must belong to a conntrack entry the fast path may carry (ESTABLISHED TCP,
//! ASSURED UDP), and every such entry of the benchmark must be offloaded; anything else after
//! [`CATCH_UP`] is a leaked (stale) or missing flow entry, and fails the run.

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::Path,
    rc::Rc,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream, UdpSocket},
    time::timeout,
};
use xdp_router_testbed::netns::{Netns, enter_netns};

use crate::{
    pin::pin_current_thread,
    router::Daemon,
    run::stopped,
    soak::{self, CONN_TIMEOUT, ECHO_PORT, FAILURE_KINDS, Failure},
    testbed::{GEN_CPU, Testbed},
};

/// Connections open at once, at most.
const IN_FLIGHT: usize = 8192;
/// Time the daemon gets after a step to bring its maps in step with conntrack.
const CATCH_UP: Duration = Duration::from_secs(10);
/// Tries of a UDP exchange, and the wait for the echo of each.
const UDP_TRIES: u32 = 3;
const UDP_RETRY: Duration = Duration::from_secs(1);
/// Longest UDP datagram (fits a 1,500-byte MTU: no fragments).
const DATAGRAM_MAX: usize = 1216;

/// One kind of connection of the mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    TcpV4,
    TcpV6,
    UdpV4,
    UdpV6,
}

/// The kinds, in turn, with their names.
const KINDS: [(Kind, &str); 4] = [
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
struct Counters {
    started: AtomicU64,
    ok: AtomicU64,
    failed: [AtomicU64; 5],
    /// UDP requests sent again (no echo within [`UDP_RETRY`]).
    udp_retries: AtomicU64,
    /// Failures by [`Kind`] (as [`KINDS`]).
    failed_kind: [AtomicU64; 4],
    /// Requests the servers received malformed.
    server_bad: AtomicU64,
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

/// What one step measured.
#[derive(Clone, Debug)]
pub struct Step {
    /// Requested new connections per second.
    pub rate: u32,
    /// Achieved: connections started per second of the step.
    pub achieved: f64,
    pub started: u64,
    pub ok: u64,
    /// Failures by kind, as [`FAILURE_KINDS`].
    pub failed: [u64; 5],
    /// Failures by connection kind, as [`KINDS`].
    pub failed_kind: [u64; 4],
    pub server_bad: u64,
    /// UDP requests sent again after a lost request or echo.
    pub udp_retries: u64,
    /// Drop counters that grew during the step (see [`drop_counters`]).
    pub drops: String,
    /// With the daemon: its CPU over the step (percent of a core).
    pub daemon_cpu: Option<f64>,
    /// With the daemon: connections offloaded during the step and fast-path packets.
    pub offloaded: Option<u64>,
    pub fast_packets: Option<u64>,
    /// With the daemon: flow directions without a carriable conntrack entry, carriable
    /// conntrack entries without flow directions, after [`CATCH_UP`].
    pub stale: Option<u64>,
    pub missing: Option<u64>,
}

impl Step {
    /// Every connection completed, at (nearly) the requested rate, and the maps are in step.
    pub fn passed(&self) -> bool {
        self.ok == self.started
            && self.server_bad == 0
            && self.achieved >= 0.95 * f64::from(self.rate)
            && self.stale.unwrap_or(0) == 0
            && self.missing.unwrap_or(0) == 0
    }

    /// Failures in words (`reset=3 timeout=1`), or `none`.
    pub fn failures(&self) -> String {
        let mut v: Vec<String> = FAILURE_KINDS
            .iter()
            .zip(self.failed)
            .filter(|(_, c)| *c > 0)
            .map(|((_, name), c)| format!("{name}={c}"))
            .collect();
        if v.is_empty() {
            return "none".into();
        }
        let by_kind: Vec<String> = KINDS
            .iter()
            .zip(self.failed_kind)
            .filter(|(_, c)| *c > 0)
            .map(|((_, name), c)| format!("{name}={c}"))
            .collect();
        v.push(format!("({})", by_kind.join(" ")));
        if self.server_bad > 0 {
            v.push(format!("server saw bad request={}", self.server_bad));
        }
        v.join(" ")
    }
}

/// The echo servers (TCP and UDP, IPv4 and IPv6) in the WAN host; stopped on drop.
pub struct Servers {
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
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
fn generate(lan: &Netns, rate: u32, dur: Duration) -> Result<(Counters, Duration)> {
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

/// Both tuples of a conntrack entry, as `(proto, "src:sport", "dst:dport")`.
type Tuple = (u8, String, String);

/// Carriable conntrack entries of the router (ESTABLISHED TCP, ASSURED UDP): their original
/// and reply tuples.
fn carriable(rtr: &Netns) -> Result<Vec<(Tuple, Tuple)>> {
    let out = rtr
        .sh("conntrack -L 2>/dev/null; conntrack -L -f ipv6 2>/dev/null; true")
        .context("listing conntrack (install conntrack)")?;
    Ok(out.lines().filter_map(parse_conntrack_line).collect())
}

/// The original and reply tuples of a `conntrack -L` line; `None` for an entry the fast path
/// does not carry.
fn parse_conntrack_line(l: &str) -> Option<(Tuple, Tuple)> {
    let proto = match l.split_whitespace().next()? {
        "tcp" if l.contains(" ESTABLISHED ") => 6,
        "udp" if l.contains("[ASSURED]") => 17,
        _ => return None,
    };
    // src=, dst=, sport=, dport= appear twice: the original tuple, then the reply tuple.
    let all = |key: &str| -> Vec<&str> {
        l.split_whitespace()
            .filter_map(|w| w.strip_prefix(key))
            .collect()
    };
    let (src, dst, sport, dport) = (all("src="), all("dst="), all("sport="), all("dport="));
    let sock = |i: usize, ip: &[&str], port: &[&str]| -> Option<String> {
        let ip: IpAddr = ip.get(i)?.parse().ok()?;
        Some(SocketAddr::new(ip, port.get(i)?.parse().ok()?).to_string())
    };
    let tuple = |i: usize| -> Option<Tuple> {
        Some((proto, sock(i, &src, &sport)?, sock(i, &dst, &dport)?))
    };
    Some((tuple(0)?, tuple(1)?))
}

/// The flow directions in the kernel's flow maps and the flow keys the arming maps point at,
/// read from the daemon's maps by id (what the fast path sees, not the daemon's bookkeeping).
struct Maps {
    flows: Vec<Tuple>,
    armed: Vec<Tuple>,
}

fn v4(addr: u32, port: u16) -> String {
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::from(u32::from_be(addr))),
        u16::from_be(port),
    )
    .to_string()
}

fn v6(addr: [u32; 4], port: u16) -> String {
    let mut b = [0u8; 16];
    for (chunk, w) in b.chunks_exact_mut(4).zip(addr) {
        chunk.copy_from_slice(&w.to_ne_bytes());
    }
    SocketAddr::new(IpAddr::V6(Ipv6Addr::from(b)), u16::from_be(port)).to_string()
}

fn read_maps(pid: u32) -> Result<Maps> {
    use aya::maps::{HashMap, Map, MapData, MapInfo};
    use xdp_router_common::{
        ArmKeyV4, ArmKeyV6, FlowKeyV4, FlowKeyV6, MAP_ARM_V4, MAP_ARM_V6, MAP_FLOWS_V4,
        MAP_FLOWS_V6,
    };
    let mut ids = Vec::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let text = std::fs::read_to_string(fd?.path()).unwrap_or_default();
        if let Some(id) = text
            .lines()
            .find_map(|l| l.strip_prefix("map_id:"))
            .and_then(|v| v.trim().parse::<u32>().ok())
        {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    ids.dedup();
    let mut maps = Maps {
        flows: Vec::new(),
        armed: Vec::new(),
    };
    // The map's own keys (any hash-map flavour: aya checks the type on conversion).
    fn keys<K: aya::Pod, V: aya::Pod>(id: u32) -> Result<Vec<K>> {
        let data = MapData::from_id(id)?;
        let map: HashMap<MapData, K, V> = match Map::from_map_data(data)? {
            Map::HashMap(d) => HashMap::try_from(Map::HashMap(d))?,
            Map::LruHashMap(d) => HashMap::try_from(Map::LruHashMap(d))?,
            _ => bail!("map {id} is not a hash map"),
        };
        Ok(map.keys().collect::<Result<Vec<K>, _>>()?)
    }
    fn values<K: aya::Pod, V: aya::Pod>(id: u32) -> Result<Vec<V>> {
        let data = MapData::from_id(id)?;
        let map: HashMap<MapData, K, V> = match Map::from_map_data(data)? {
            Map::HashMap(d) => HashMap::try_from(Map::HashMap(d))?,
            Map::LruHashMap(d) => HashMap::try_from(Map::LruHashMap(d))?,
            _ => bail!("map {id} is not a hash map"),
        };
        Ok(map
            .iter()
            .collect::<Result<Vec<(K, V)>, _>>()?
            .into_iter()
            .map(|(_, v)| v)
            .collect())
    }
    let mut seen = [false; 4];
    for id in ids {
        let name = MapInfo::from_id(id)?;
        let t4 = |k: &FlowKeyV4| (k.proto, v4(k.src_be, k.sport_be), v4(k.dst_be, k.dport_be));
        let t6 = |k: &FlowKeyV6| (k.proto, v6(k.src_be, k.sport_be), v6(k.dst_be, k.dport_be));
        match name.name_as_str() {
            Some(MAP_FLOWS_V4) => {
                seen[0] = true;
                let k = keys::<FlowKeyV4, xdp_router_common::FlowV4>(id)?;
                maps.flows.extend(k.iter().map(t4));
            }
            Some(MAP_FLOWS_V6) => {
                seen[1] = true;
                let k = keys::<FlowKeyV6, xdp_router_common::FlowV6>(id)?;
                maps.flows.extend(k.iter().map(t6));
            }
            Some(MAP_ARM_V4) => {
                seen[2] = true;
                maps.armed
                    .extend(values::<ArmKeyV4, FlowKeyV4>(id)?.iter().map(t4));
            }
            Some(MAP_ARM_V6) => {
                seen[3] = true;
                maps.armed
                    .extend(values::<ArmKeyV6, FlowKeyV6>(id)?.iter().map(t6));
            }
            _ => {}
        }
    }
    if seen != [true; 4] {
        bail!("xdp-routerd (pid {pid}) holds no flow or arming maps");
    }
    Ok(maps)
}

/// Compares the kernel's flow maps with conntrack until they agree or [`CATCH_UP`] passes;
/// returns the flow directions (and arming entries) without a carriable conntrack entry
/// (stale) and the carriable entries without both directions offloaded (missing).
fn in_step(rtr: &Netns, daemon: &Daemon, out: &Path) -> Result<(u64, u64)> {
    let deadline = Instant::now() + CATCH_UP;
    loop {
        let maps = read_maps(daemon.pid())?;
        let ct = carriable(rtr)?;
        let tuples: HashSet<&Tuple> = ct.iter().flat_map(|(o, r)| [o, r]).collect();
        let flows: HashSet<&Tuple> = maps.flows.iter().collect();
        let stale = maps.flows.iter().filter(|t| !tuples.contains(t)).count()
            + maps.armed.iter().filter(|t| !flows.contains(t)).count()
            + maps.flows.len().saturating_sub(maps.armed.len());
        let missing = ct
            .iter()
            .filter(|(o, r)| !flows.contains(o) || !flows.contains(r))
            .count();
        let (stale, missing) = (stale as u64, missing as u64);
        if (stale == 0 && missing == 0) || Instant::now() > deadline {
            if stale + missing > 0 {
                let _ = std::fs::write(
                    out.join("churn-flows.txt"),
                    daemon.flows_text().unwrap_or_default(),
                );
                let _ = std::fs::write(
                    out.join("churn-conntrack.txt"),
                    rtr.sh("conntrack -L 2>&1; conntrack -L -f ipv6 2>&1")
                        .unwrap_or_default(),
                );
            }
            return Ok((stale, missing));
        }
        thread::sleep(Duration::from_millis(500));
    }
}

/// Drop counters along the path: the veths' `rx_dropped`/`tx_dropped` and the hosts' UDP
/// errors (`/proc/net/snmp{,6}`), by name.
fn drop_counters(tb: &Testbed) -> Result<Vec<(String, u64)>> {
    let mut v = Vec::new();
    let (rl, rw) = (&tb.names.rl, &tb.names.rw);
    for (ns, host, dev) in [
        (&tb.lan, "lan", "l0"),
        (&tb.rtr, "rtr", rl.as_str()),
        (&tb.rtr, "rtr", rw.as_str()),
        (&tb.wan, "wan", "w0"),
    ] {
        let out = ns.sh(&format!(
            "cat /sys/class/net/{dev}/statistics/rx_dropped /sys/class/net/{dev}/statistics/tx_dropped"
        ))?;
        for (what, n) in ["rx_dropped", "tx_dropped"].iter().zip(out.lines()) {
            v.push((
                format!("{host} {dev} {what}"),
                n.trim().parse().unwrap_or(0),
            ));
        }
    }
    for (ns, host) in [(&tb.lan, "lan"), (&tb.wan, "wan")] {
        let snmp = ns.sh("cat /proc/net/snmp /proc/net/snmp6")?;
        // /proc/net/snmp: a header line of names, then a line of values, per protocol.
        let lines: Vec<&str> = snmp.lines().collect();
        for pair in lines.windows(2) {
            let (names, values) = (pair[0], pair[1]);
            if names.starts_with("Udp: ") && values.starts_with("Udp: ") && names != values {
                for (n, x) in names.split_whitespace().zip(values.split_whitespace()) {
                    if ["InErrors", "NoPorts", "RcvbufErrors", "SndbufErrors"].contains(&n) {
                        v.push((format!("{host} udp {n}"), x.parse().unwrap_or(0)));
                    }
                }
            }
        }
        for l in &lines {
            let mut w = l.split_whitespace();
            if let (Some(n), Some(x)) = (w.next(), w.next())
                && [
                    "Udp6InErrors",
                    "Udp6NoPorts",
                    "Udp6RcvbufErrors",
                    "Udp6SndbufErrors",
                ]
                .contains(&n)
            {
                v.push((format!("{host} {n}"), x.parse().unwrap_or(0)));
            }
        }
    }
    Ok(v)
}

/// The counters of `after` that grew since `before`, as `name +delta`.
fn grown(before: &[(String, u64)], after: &[(String, u64)]) -> String {
    let v: Vec<String> = after
        .iter()
        .filter_map(|(n, a)| {
            let b = before.iter().find(|(m, _)| m == n).map_or(0, |(_, b)| *b);
            (*a > b).then(|| format!("{n} +{}", a - b))
        })
        .collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// One step at `rate` for `dur`; with `daemon`, the flows are checked against conntrack after.
pub fn step(
    tb: &Testbed,
    servers: &Servers,
    daemon: Option<&Daemon>,
    rate: u32,
    dur: Duration,
    out: &Path,
) -> Result<Step> {
    let before = match daemon {
        Some(d) => Some((
            d.status()?.forwarded(),
            offloaded_total(d)?,
            crate::scale::proc::sample(d.pid())?.cpu_s,
        )),
        None => None,
    };
    let bad_before = servers.counters.server_bad.load(Ordering::Relaxed);
    let drops_before = drop_counters(tb)?;
    let t0 = Instant::now();
    let (c, took) = generate(&tb.lan, rate, dur)?;
    let wall = t0.elapsed();
    let drops = grown(&drops_before, &drop_counters(tb)?);
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let mut step = Step {
        rate,
        achieved: load(&c.started) as f64 / took.as_secs_f64().max(1e-9),
        started: load(&c.started),
        ok: load(&c.ok),
        failed: std::array::from_fn(|i| load(&c.failed[i])),
        failed_kind: std::array::from_fn(|i| load(&c.failed_kind[i])),
        daemon_cpu: None,
        udp_retries: load(&c.udp_retries),
        drops,
        server_bad: load(&servers.counters.server_bad) - bad_before,
        offloaded: None,
        fast_packets: None,
        stale: None,
        missing: None,
    };
    if let (Some(d), Some((fwd, off, cpu))) = (daemon, before) {
        step.daemon_cpu = Some(
            100.0 * (crate::scale::proc::sample(d.pid())?.cpu_s - cpu)
                / wall.as_secs_f64().max(1e-9),
        );
        let (stale, missing) = in_step(&tb.rtr, d, out)?;
        step.fast_packets = Some(d.status()?.forwarded().saturating_sub(fwd));
        step.offloaded = Some(offloaded_total(d)?.saturating_sub(off));
        step.stale = Some(stale);
        step.missing = Some(missing);
    }
    Ok(step)
}

fn offloaded_total(d: &Daemon) -> Result<u64> {
    d.status_json()?["conntrack"]["offloaded_total"]
        .as_u64()
        .context("status has no conntrack.offloaded_total")
}

/// Prepares the hosts for churn: the LAN host's ephemeral ports span 1024…65535 (the
/// generator opens tens of thousands of connections a second).
pub fn prepare_hosts(tb: &Testbed) -> Result<()> {
    tb.lan
        .sh("sysctl -qw net.ipv4.ip_local_port_range='1024 65535'")?;
    Ok(())
}

/// Steps through `rates` (`dur` each) until a step fails; returns the steps run.
pub fn ladder(
    tb: &Testbed,
    servers: &Servers,
    daemon: Option<&Daemon>,
    rates: &[u32],
    dur: Duration,
    out: &Path,
) -> Result<Vec<Step>> {
    let mut steps = Vec::new();
    for &rate in rates {
        crate::run::check_stop()?;
        let s = step(tb, servers, daemon, rate, dur, out)?;
        eprintln!(
            "  churn {} at {rate}/s: achieved {:.0}/s, {} of {} ok, failures: {}{}; UDP retries {}; drops: {}",
            if daemon.is_some() {
                "fast path"
            } else {
                "kernel alone"
            },
            s.achieved,
            s.ok,
            s.started,
            s.failures(),
            match (s.stale, s.missing, s.offloaded) {
                (Some(st), Some(m), Some(o)) => format!(
                    "; offloaded {o}; daemon CPU {:.0} %; flow entries stale {st}, missing {m}",
                    s.daemon_cpu.unwrap_or(0.0)
                ),
                _ => String::new(),
            },
            s.udp_retries,
            s.drops
        );
        let passed = s.passed();
        steps.push(s);
        if !passed {
            break;
        }
    }
    if steps.is_empty() {
        bail!("no churn step ran");
    }
    Ok(steps)
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

    #[test]
    fn conntrack_lines_parse_to_both_tuples() {
        let tcp = "tcp      6 431999 ESTABLISHED src=10.0.1.2 dst=10.0.2.2 sport=40000 \
                   dport=7000 src=10.0.2.2 dst=10.0.2.1 sport=7000 dport=40000 [ASSURED] \
                   mark=0 use=1";
        assert_eq!(
            parse_conntrack_line(tcp),
            Some((
                (6, "10.0.1.2:40000".into(), "10.0.2.2:7000".into()),
                (6, "10.0.2.2:7000".into(), "10.0.2.1:40000".into())
            ))
        );
        let tw = tcp.replace("ESTABLISHED", "TIME_WAIT");
        assert_eq!(parse_conntrack_line(&tw), None);
        let udp6 = "udp      17 119 src=fd00:1::2 dst=fd00:2::2 sport=5000 dport=7000 \
                    src=fd00:2::2 dst=fd00:1::2 sport=7000 dport=5000 [ASSURED] mark=0 use=1";
        assert_eq!(
            parse_conntrack_line(udp6),
            Some((
                (17, "[fd00:1::2]:5000".into(), "[fd00:2::2]:7000".into()),
                (17, "[fd00:2::2]:7000".into(), "[fd00:1::2]:5000".into())
            ))
        );
        assert_eq!(parse_conntrack_line(&udp6.replace("[ASSURED]", "")), None);
    }

    #[test]
    fn map_keys_print_as_conntrack_does() {
        let a = u32::from(Ipv4Addr::new(10, 0, 1, 2)).to_be();
        assert_eq!(v4(a, 7000u16.to_be()), "10.0.1.2:7000");
        let ip6: Ipv6Addr = "fd00:1::2".parse().unwrap();
        let o = ip6.octets();
        let words: [u32; 4] = std::array::from_fn(|i| {
            u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
        });
        assert_eq!(v6(words, 5000u16.to_be()), "[fd00:1::2]:5000");
    }
}
