//! A UDP flow with traffic both ways at a fixed rate, whose echoes are counted live: for tests
//! that watch a running offloaded flow stop (a rule starts dropping it) and resume.

use std::{
    io,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::{JoinHandle, sleep},
    time::{Duration, Instant},
};

use super::{
    any_v4, checks::wait_until, topology::Testbed, traffic::UdpEcho, udp_payload, udp_socket,
};

/// Datagram payload size.
const DGRAM: usize = 200;

/// How long no echo must arrive for the flow to count as stopped.
const QUIET: Duration = Duration::from_millis(300);

/// A LAN-host client sending `pps` datagrams per second to a [`UdpEcho`] server in the WAN
/// host, counting the echoes and the time of the last one. Both directions carry traffic, so
/// conntrack marks the flow ASSURED and the daemon offloads it.
pub struct UdpFlow {
    echoes: Arc<AtomicU64>,
    /// Nanoseconds from `t0` to the latest echo.
    last_echo_ns: Arc<AtomicU64>,
    t0: Instant,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    _echo: UdpEcho,
}

impl UdpFlow {
    /// Starts the echo server on `server` (in the WAN host) and the client.
    pub fn start(tb: &Testbed, server: SocketAddr, pps: u32) -> UdpFlow {
        let echo = UdpEcho::start(&tb.wan, server);
        let sock = udp_socket(&tb.lan, any_v4(), 64);
        sock.connect(server)
            .unwrap_or_else(|e| panic!("connect {server}: {e}"));
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .expect("read timeout");
        let rx = sock.try_clone().expect("clone the UDP socket");
        let (echoes, last_echo_ns) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let t0 = Instant::now();
        let interval = Duration::from_secs(1) / pps.max(1);
        let stop_tx = stop.clone();
        let sender = std::thread::spawn(move || {
            let mut seq = 0u64;
            while !stop_tx.load(Ordering::SeqCst) {
                // Errors (an ICMP error queued on the socket) do not stop the flow.
                let _ = sock.send(&udp_payload(seq, DGRAM));
                seq += 1;
                let due = t0 + interval * u32::try_from(seq).unwrap_or(u32::MAX);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    sleep(wait);
                }
            }
        });
        let (n, last, stop_rx) = (echoes.clone(), last_echo_ns.clone(), stop.clone());
        let receiver = std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !stop_rx.load(Ordering::SeqCst) {
                match rx.recv(&mut buf) {
                    Ok(_) => {
                        last.store(t0.elapsed().as_nanos() as u64, Ordering::SeqCst);
                        n.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) => {}
                    // ECONNREFUSED from an ICMP error: keep listening.
                    Err(_) => {}
                }
            }
        });
        UdpFlow {
            echoes,
            last_echo_ns,
            t0,
            stop,
            threads: vec![sender, receiver],
            _echo: echo,
        }
    }

    /// Echoes received so far.
    pub fn echoes(&self) -> u64 {
        self.echoes.load(Ordering::SeqCst)
    }

    fn last_echo(&self) -> Instant {
        self.t0 + Duration::from_nanos(self.last_echo_ns.load(Ordering::SeqCst))
    }

    /// Time from `since` to the last echo, once none has arrived for 300 ms; `None` if echoes
    /// still arrive `limit` after `since`. A flow that had already stopped before `since`
    /// reports zero.
    pub fn time_to_stop(&self, since: Instant, limit: Duration) -> Option<Duration> {
        while since.elapsed() < limit + QUIET {
            sleep(Duration::from_millis(10));
            if self.last_echo().elapsed() >= QUIET {
                return Some(self.last_echo().saturating_duration_since(since));
            }
        }
        None
    }

    /// Whether echoes arrive again within `limit` after `since`.
    pub fn resumes_within(&self, since: Instant, limit: Duration) -> bool {
        wait_until(limit.saturating_sub(since.elapsed()), || {
            self.last_echo() > since
        })
    }

    /// Echoes that arrive over `window`.
    pub fn grows_over(&self, window: Duration) -> u64 {
        let before = self.echoes();
        sleep(window);
        self.echoes() - before
    }
}

impl Drop for UdpFlow {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
