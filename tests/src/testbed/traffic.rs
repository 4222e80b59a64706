//! Traffic between the hosts: checked TCP transfers, a UDP echo server and ping-pong client,
//! and sockets bound in a namespace.

use std::{
    io::{self, Read as _, Write as _},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket},
    os::fd::AsRawFd as _,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::{JoinHandle, sleep},
    time::{Duration, Instant},
};

use sha2::{Digest as _, Sha256};

use crate::netns::Netns;

use super::topology::Testbed;

/// Deterministic pseudo-random bytes (xorshift64*), so data corruption cannot hide in a
/// repeating pattern.
pub struct Pattern(u64);

impl Pattern {
    /// A stream seeded with `seed` (any value).
    pub fn new(seed: u64) -> Pattern {
        Pattern(seed | 1)
    }

    /// Fills `buf` with the next bytes of the stream.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            let v = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// What one end of a TCP transfer saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Side {
    /// Bytes sent or received.
    pub bytes: u64,
    /// SHA-256 of those bytes.
    pub sha256: [u8; 32],
}

/// How the sender sends.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Total bytes (the sender stops earlier when [`Transfer::stop`] is called).
    pub bytes: u64,
    /// Bytes per second, or as fast as possible.
    pub rate: Option<u64>,
}

/// A TCP transfer from a LAN-host client to a WAN-host server, running on threads.
pub struct Transfer {
    sender: JoinHandle<io::Result<Side>>,
    receiver: JoinHandle<io::Result<Side>>,
    stop: Arc<AtomicBool>,
    /// The server's view of the client's address (the router's WAN address under NAT).
    pub peer: SocketAddr,
}

/// What [`Transfer::finish`] returns.
#[derive(Debug)]
pub struct TransferResult {
    /// The client's side.
    pub sent: Side,
    /// The server's side.
    pub received: Side,
    /// The client address the server saw.
    pub peer: SocketAddr,
}

impl Transfer {
    /// Starts a server on `server` in the WAN namespace and a client in the LAN namespace
    /// that sends `plan.bytes` of [`Pattern`] data, then closes.
    pub fn start(tb: &Testbed, server: SocketAddr, plan: Plan) -> Transfer {
        Self::start_gated(tb, server, plan, None)
    }

    /// [`Transfer::start`] for a transfer the fast path should carry: the client sends its
    /// first 64 KiB, then waits until the daemon lists the connection (`flows --json`, 10 s at
    /// most) before the rest. A share of fast-pathed packets measured over the transfer then
    /// does not depend on how soon a loaded machine schedules the daemon (a 32 MiB transfer
    /// that outran it went one tenth through the kernel in a run beside a build).
    pub fn start_offloaded(tb: &Testbed, server: SocketAddr, plan: Plan) -> Transfer {
        let (open, gate) = std::sync::mpsc::channel();
        let t = Self::start_gated(tb, server, plan, Some(gate));
        let listed = super::checks::wait_until(Duration::from_secs(10), || {
            tb.daemon().original_flow(server.port()).is_some()
        });
        assert!(
            listed,
            "the daemon did not list the connection to {server} within 10 s: {}",
            tb.daemon().flows_json()
        );
        // The sender may have ended already (an error): `finish` reports it.
        let _ = open.send(());
        t
    }

    fn start_gated(
        tb: &Testbed,
        server: SocketAddr,
        plan: Plan,
        gate: Option<std::sync::mpsc::Receiver<()>>,
    ) -> Transfer {
        let listener = tb
            .wan
            .run(move || TcpListener::bind(server))
            .unwrap_or_else(|e| panic!("bind {server} in the WAN host: {e}"));
        let client = tb
            .lan
            .run(move || TcpStream::connect_timeout(&server, Duration::from_secs(5)))
            .unwrap_or_else(|e| panic!("connect to {server} from the LAN host: {e}"));
        let (conn, peer) = listener
            .accept()
            .unwrap_or_else(|e| panic!("accept on {server}: {e}"));
        let receiver = std::thread::spawn(move || receive_all(conn));
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let sender = std::thread::spawn(move || send_all(client, plan, &stop2, gate));
        Transfer {
            sender,
            receiver,
            stop,
            peer,
        }
    }

    /// Makes the sender stop early (it still closes the connection cleanly).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// True when the sender has finished.
    pub fn sender_done(&self) -> bool {
        self.sender.is_finished()
    }

    /// Waits for both ends; panics with the I/O errors of both when either failed.
    pub fn finish(self) -> TransferResult {
        let sent = self.sender.join().expect("sender thread panicked");
        let received = self.receiver.join().expect("receiver thread panicked");
        match (sent, received) {
            (Ok(sent), Ok(received)) => TransferResult {
                sent,
                received,
                peer: self.peer,
            },
            (s, r) => panic!(
                "TCP transfer failed: sender (LAN host): {}; receiver (WAN host): {}",
                s.map_or_else(|e| e.to_string(), |s| format!("ok, {} bytes", s.bytes)),
                r.map_or_else(|e| e.to_string(), |r| format!("ok, {} bytes", r.bytes)),
            ),
        }
    }
}

/// Sends per `plan`, then shuts down the write side and waits for the server's close. With a
/// `gate`, waits after the first chunk until it opens (or its sender is gone).
fn send_all(
    mut s: TcpStream,
    plan: Plan,
    stop: &AtomicBool,
    gate: Option<std::sync::mpsc::Receiver<()>>,
) -> io::Result<Side> {
    s.set_write_timeout(Some(Duration::from_secs(20)))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    let mut pattern = Pattern::new(plan.bytes ^ 0x5eed);
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut sent = 0u64;
    let t0 = Instant::now();
    while sent < plan.bytes && !stop.load(Ordering::SeqCst) {
        let n = (plan.bytes - sent).min(buf.len() as u64) as usize;
        pattern.fill(&mut buf[..n]);
        s.write_all(&buf[..n])
            .map_err(|e| io::Error::new(e.kind(), format!("write after {sent} bytes: {e}")))?;
        hash.update(&buf[..n]);
        sent += n as u64;
        if sent == n as u64
            && let Some(gate) = &gate
        {
            let _ = gate.recv_timeout(Duration::from_secs(15));
        }
        if let Some(rate) = plan.rate {
            let due = Duration::from_secs_f64(sent as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(t0.elapsed()) {
                sleep(wait);
            }
        }
    }
    s.shutdown(Shutdown::Write)?;
    // The server closes after reading everything: EOF here is the clean end of the connection.
    let mut rest = Vec::new();
    s.read_to_end(&mut rest)?;
    Ok(Side {
        bytes: sent,
        sha256: hash.finalize().into(),
    })
}

/// Reads to EOF, hashing, then closes.
fn receive_all(mut s: TcpStream) -> io::Result<Side> {
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut bytes = 0u64;
    loop {
        let n = s
            .read(&mut buf)
            .map_err(|e| io::Error::new(e.kind(), format!("read after {bytes} bytes: {e}")))?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        bytes += n as u64;
    }
    s.shutdown(Shutdown::Both)?;
    Ok(Side {
        bytes,
        sha256: hash.finalize().into(),
    })
}

/// A download: the LAN host connects to the WAN host's `server`, which sends `bytes` of [`Pattern`] data
/// and closes. Returns (bytes, SHA-256) as (sent, received).
pub fn download(
    tb: &Testbed,
    server: SocketAddr,
    bytes: u64,
) -> ((u64, [u8; 32]), (u64, [u8; 32])) {
    download_gated(tb, server, bytes, false)
}

/// [`download`] for a download the fast path should carry: the server sends its first 64 KiB,
/// then waits until the daemon lists the connection (`flows --json`, 10 s at most) before the
/// rest, as [`Transfer::start_offloaded`] does for an upload.
pub fn download_offloaded(
    tb: &Testbed,
    server: SocketAddr,
    bytes: u64,
) -> ((u64, [u8; 32]), (u64, [u8; 32])) {
    download_gated(tb, server, bytes, true)
}

/// The first chunk a gated sender writes before it waits for the gate.
const CHUNK: usize = 64 * 1024;

fn download_gated(
    tb: &Testbed,
    server: SocketAddr,
    bytes: u64,
    gated: bool,
) -> ((u64, [u8; 32]), (u64, [u8; 32])) {
    let listener = tb
        .wan
        .run(move || TcpListener::bind(server))
        .unwrap_or_else(|e| panic!("bind {server} in the WAN host: {e}"));
    let (open, gate) = std::sync::mpsc::channel::<()>();
    let sender = std::thread::spawn(move || -> io::Result<(u64, [u8; 32])> {
        let (mut s, _) = listener.accept()?;
        s.set_write_timeout(Some(Duration::from_secs(20)))?;
        let mut pattern = Pattern::new(bytes ^ 0xd0);
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; CHUNK];
        let mut sent = 0u64;
        while sent < bytes {
            let n = (bytes - sent).min(buf.len() as u64) as usize;
            pattern.fill(&mut buf[..n]);
            s.write_all(&buf[..n])?;
            hash.update(&buf[..n]);
            if gated && sent == 0 {
                // The receiver opens the gate (or hangs up, when it gave up waiting).
                let _ = gate.recv();
            }
            sent += n as u64;
        }
        s.shutdown(Shutdown::Write)?;
        Ok((sent, hash.finalize().into()))
    });
    let mut client = tb
        .lan
        .run(move || TcpStream::connect_timeout(&server, Duration::from_secs(5)))
        .unwrap_or_else(|e| panic!("connect to {server} from the LAN host: {e}"));
    client
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("SO_RCVTIMEO");
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    let mut open = gated.then_some(open);
    loop {
        let n = client
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("download read after {got} bytes: {e}"));
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        got += n as u64;
        if got >= CHUNK.min(bytes as usize) as u64
            && let Some(open) = open.take()
        {
            let listed = super::checks::wait_until(Duration::from_secs(10), || {
                tb.daemon().original_flow(server.port()).is_some()
            });
            assert!(
                listed,
                "the daemon did not list the download from {server} within 10 s: {}",
                tb.daemon().flows_json()
            );
            let _ = open.send(());
        }
    }
    let sent = sender
        .join()
        .expect("download sender panicked")
        .unwrap_or_else(|e| panic!("download sender (WAN host): {e}"));
    (sent, (got, hash.finalize().into()))
}

/// Datagram payload for sequence number `seq`: the number, then [`Pattern`] bytes seeded by it.
pub fn udp_payload(seq: u64, len: usize) -> Vec<u8> {
    let mut p = vec![0u8; len.max(8)];
    p[..8].copy_from_slice(&seq.to_be_bytes());
    Pattern::new(seq.wrapping_mul(0x9e37_79b9_7f4a_7c15)).fill(&mut p[8..]);
    p
}

/// A UDP echo server in the WAN host: checks every datagram against [`udp_payload`] and sends it
/// back unchanged to its source.
pub struct UdpEcho {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<io::Result<EchoStats>>>,
}

/// What the echo server saw.
#[derive(Debug, Default, Clone)]
pub struct EchoStats {
    /// Datagrams received.
    pub received: u64,
    /// Datagrams whose contents did not match their sequence number.
    pub corrupt: u64,
    /// Distinct source addresses.
    pub peers: Vec<SocketAddr>,
}

impl UdpEcho {
    /// Binds `addr` in `ns` and serves until [`UdpEcho::finish`]; replies leave with TTL / hop
    /// limit 64.
    pub fn start(ns: &Netns, addr: SocketAddr) -> UdpEcho {
        let sock = udp_socket(ns, addr, 64);
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            sock.set_read_timeout(Some(Duration::from_millis(100)))?;
            let mut st = EchoStats::default();
            // Jumbo datagrams too (tests/mtu.rs).
            let mut buf = vec![0u8; 65536];
            while !stop2.load(Ordering::SeqCst) {
                let (n, from) = match sock.recv_from(&mut buf) {
                    Ok(x) => x,
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) =>
                    {
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let data = &buf[..n];
                st.received += 1;
                let seq = data
                    .get(..8)
                    .map(|b| u64::from_be_bytes(b.try_into().unwrap_or_default()));
                if seq.is_none_or(|seq| udp_payload(seq, n) != data) {
                    st.corrupt += 1;
                }
                if !st.peers.contains(&from) {
                    st.peers.push(from);
                }
                sock.send_to(data, from)?;
            }
            Ok(st)
        });
        UdpEcho {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the server and returns what it saw.
    pub fn finish(mut self) -> EchoStats {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .take()
            .expect("finish once")
            .join()
            .expect("echo thread panicked")
            .unwrap_or_else(|e| panic!("UDP echo server failed: {e}"))
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// What a ping-pong run saw at the client.
#[derive(Debug, Default, Clone)]
pub struct PingPong {
    /// Datagrams sent.
    pub sent: u64,
    /// Replies equal to what was sent, from the expected source.
    pub good: u64,
    /// Replies that did not come back within a second.
    pub lost: u64,
    /// Replies with different contents.
    pub corrupt: u64,
    /// Reply sources other than the server's address.
    pub wrong_source: Vec<SocketAddr>,
}

/// How long [`ping_pong`] waits for each echo. It does not scale with
/// [`super::checks::time_scale`]: tests that expect the datagrams dropped (a blocked VLAN, a
/// ban) send many, and a longer wait per datagram let UDP conntrack entries time out in a
/// guest.
const ECHO_WAIT: Duration = Duration::from_secs(1);

/// Sends `count` datagrams of `len` bytes from `sock` to `server`, one every `interval`, each
/// waiting ([`ECHO_WAIT`]) for its echo; sequence numbers start at `first_seq`.
pub fn ping_pong(
    sock: &UdpSocket,
    server: SocketAddr,
    first_seq: u64,
    count: u64,
    len: usize,
    interval: Duration,
) -> PingPong {
    sock.set_read_timeout(Some(ECHO_WAIT))
        .expect("set_read_timeout");
    let mut r = PingPong::default();
    let mut buf = vec![0u8; 65536];
    let t0 = Instant::now();
    for i in 0..count {
        let seq = first_seq + i;
        let payload = udp_payload(seq, len);
        sock.send_to(&payload, server)
            .unwrap_or_else(|e| panic!("send to {server}: {e}"));
        r.sent += 1;
        // Skip stale replies (of earlier, lost, datagrams) until ours arrives or time runs out.
        let deadline = Instant::now() + ECHO_WAIT;
        loop {
            match sock.recv_from(&mut buf) {
                Ok((n, from)) => {
                    if buf.get(..8) != Some(&seq.to_be_bytes()[..]) && Instant::now() < deadline {
                        continue;
                    }
                    if from != server {
                        r.wrong_source.push(from);
                    } else if buf[..n] != payload[..] {
                        r.corrupt += 1;
                    } else {
                        r.good += 1;
                    }
                    break;
                }
                Err(_) => {
                    r.lost += 1;
                    break;
                }
            }
        }
        let due = interval * u32::try_from(i + 1).unwrap_or(u32::MAX);
        if let Some(wait) = due.checked_sub(t0.elapsed()) {
            sleep(wait);
        }
    }
    r
}

/// A UDP socket bound in `ns` to `addr` (port 0 for any) with the IP TTL / hop limit set.
pub fn udp_socket(ns: &Netns, addr: SocketAddr, ttl: u32) -> UdpSocket {
    let sock = ns
        .run(move || UdpSocket::bind(addr))
        .unwrap_or_else(|e| panic!("bind UDP {addr}: {e}"));
    match addr {
        SocketAddr::V4(_) => sock.set_ttl(ttl).expect("IP_TTL"),
        SocketAddr::V6(_) => set_hop_limit(&sock, ttl),
    }
    sock
}

fn set_hop_limit(sock: &UdpSocket, hops: u32) {
    let v = hops as libc::c_int;
    // SAFETY: valid socket fd; option value is a c_int of the right size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_UNICAST_HOPS,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "IPV6_UNICAST_HOPS: {}", io::Error::last_os_error());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_payload_is_deterministic_and_distinct() {
        assert_eq!(udp_payload(7, 100), udp_payload(7, 100));
        assert_ne!(udp_payload(7, 100), udp_payload(8, 100));
        assert_eq!(&udp_payload(7, 100)[..8], &7u64.to_be_bytes());
    }
}
