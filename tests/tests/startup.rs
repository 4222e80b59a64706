//! Connections present when the daemon starts (a restart on a busy router, or a million
//! idle entries in conntrack): the start-up writes them awaiting traffic
//! (`FLOW_F_AWAITING_TRAFFIC`: no arming index entry, no "be liberal" mark), the kernel carries
//! them, and the keep-alive takes each in once it carries traffic; from then on the fast path
//! does. Run as root with one test thread (`cargo xtask test`).

use std::{
    io::{self, Read as _, Write as _},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    thread::sleep,
    time::{Duration, Instant},
};

use xdp_router_tests::testbed::{
    self, LAN_IF, Testbed, UdpEcho, WAN_IF, any_v4, fastpath_fraction, ping_pong, ready,
    udp_socket, wait_until, wan_v4,
};

/// One 512-byte request of a TCP ping-pong, numbered `seq`.
fn request(seq: u64) -> [u8; 512] {
    let mut m = [0u8; 512];
    testbed::Pattern::new(seq).fill(&mut m);
    m[..8].copy_from_slice(&seq.to_be_bytes());
    m
}

/// Sends request `seq` on `client` and reads its echo; `Err` when it does not come back intact.
fn echo_round(client: &mut TcpStream, seq: u64) -> Result<(), String> {
    let m = request(seq);
    client
        .write_all(&m)
        .map_err(|e| format!("request {seq}: {e}"))?;
    let mut back = [0u8; 512];
    client
        .read_exact(&mut back)
        .map_err(|e| format!("echo {seq}: {e}"))?;
    if back != m {
        return Err(format!("echo {seq} came back altered"));
    }
    Ok(())
}

/// Starts the daemon over an existing connection to `server` and checks that it is offloaded
/// awaiting traffic (idle since the daemon's start).
fn start_over_existing(tb: &mut Testbed, server: SocketAddr) {
    tb.start_daemon();
    let listed = wait_until(Duration::from_secs(10), || {
        tb.daemon().original_flow(server.port()).is_some()
    });
    assert!(listed, "not offloaded: {}", tb.daemon().flows_json());
    let row = tb.daemon().original_flow(server.port()).expect("listed");
    assert_eq!(
        row["awaiting_traffic"], true,
        "idle since the daemon's start, so awaiting traffic: {row}"
    );
    assert_eq!(tb.daemon().status().conntrack.joined_on_traffic, 0);
}

/// Runs `round(seq)` for `seq` from `first` on, every 20 ms, until the keep-alive has taken the
/// connection in (10 s at most, else the test fails); returns the next `seq`.
fn rounds_until_joined(tb: &Testbed, first: u64, mut round: impl FnMut(u64)) -> u64 {
    let mut seq = first;
    let joined = wait_until(Duration::from_secs(10), || {
        round(seq);
        seq += 1;
        sleep(Duration::from_millis(20));
        tb.daemon().status().conntrack.joined_on_traffic >= 1
    });
    assert!(
        joined,
        "not taken in within 10 s of traffic: {}",
        tb.daemon().flows_json()
    );
    seq
}

/// A TCP connection found in conntrack when the daemon starts (established and used before
/// it) is offloaded without the "be liberal" mark: its row says `awaiting_traffic` and the
/// kernel forwards it. Once it carries traffic again, the keep-alive marks it (`joined_on_traffic`),
/// the kernel arms it, and the fast path takes the rest: every echo intact, and after the mark
/// ≥ 90 % of the LAN port's packets forwarded by XDP, the FORWARD chain's ESTABLISHED rule
/// seeing at most a tenth of them.
#[test]
fn a_connection_found_at_start_is_marked_once_it_carries_traffic() {
    if !ready("a_connection_found_at_start_is_marked_once_it_carries_traffic") {
        return;
    }
    let mut tb = Testbed::new("st1");
    let server = wan_v4(7012);
    let listener = tb
        .wan
        .run(move || TcpListener::bind(server))
        .expect("bind in the WAN host");
    let echo = std::thread::spawn(move || -> io::Result<u64> {
        let (mut c, _) = listener.accept()?;
        let mut buf = [0u8; 512];
        let mut n = 0;
        loop {
            match c.read_exact(&mut buf) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(n),
                Err(e) => return Err(e),
            }
            c.write_all(&buf)?;
            n += 1;
        }
    });
    let mut client = tb
        .lan
        .run(move || TcpStream::connect_timeout(&server, Duration::from_secs(5)))
        .expect("connect from the LAN host");
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    for seq in 0..20 {
        echo_round(&mut client, seq).expect("before the daemon");
    }

    start_over_existing(&mut tb, server);

    // The first two rounds after the start go through the kernel whenever the keep-alive
    // marks the connection: the first request is what tells it (the connection recorded as
    // active), and after the mark each direction's next packet is the kernel's, which arms it.
    let idle = tb.snapshot();
    echo_round(&mut client, 100).expect("first round after the start");
    echo_round(&mut client, 101).expect("second round after the start");
    let first = tb.snapshot();
    let (kernel, fast) = (
        first.packets_since(&idle, LAN_IF, "awaiting_kernel_verdict"),
        first.packets_since(&idle, LAN_IF, "forwarded_original")
            + first.packets_since(&idle, WAN_IF, "forwarded_reply"),
    );
    assert!(
        kernel >= 2 && fast == 0,
        "the first two rounds should reach the kernel unforwarded: {}",
        first.grown_since(&idle)
    );
    // Traffic goes on: marked by the keep-alive's next pass (every 2 s).
    let t0 = Instant::now();
    let mut seq = rounds_until_joined(&tb, 102, |seq| {
        echo_round(&mut client, seq).expect("while waiting for the mark");
    });
    let row = tb.daemon().original_flow(server.port()).expect("listed");
    assert_eq!(row["awaiting_traffic"], false, "{row}");
    eprintln!(
        "marked after {:.1} s of traffic ({} rounds)",
        t0.elapsed().as_secs_f64(),
        seq - 102
    );
    // The kernel arms each direction with its next packet; then the fast path carries it.
    for _ in 0..5 {
        echo_round(&mut client, seq).expect("arming rounds");
        seq += 1;
    }
    let before = tb.snapshot();
    let rounds = 200;
    for _ in 0..rounds {
        echo_round(&mut client, seq).expect("after the mark");
        seq += 1;
        sleep(Duration::from_millis(5));
    }
    let after = tb.snapshot();
    let wire = after.rx_lan_since(&before);
    let fwd = after.packets_since(&before, LAN_IF, "forwarded_original");
    let est = after.established_since(&before, false);
    eprintln!(
        "after the mark: {rounds} rounds, {wire} packets in on {LAN_IF}, {fwd} forwarded by \
         XDP, {est} seen by the FORWARD chain's ESTABLISHED rule"
    );
    assert!(
        wire >= rounds,
        "only {wire} packets on the wire for {rounds} rounds"
    );
    assert!(
        fastpath_fraction(fwd, wire) >= 0.9,
        "only {fwd} of {wire} LAN packets fast-pathed after the mark"
    );
    assert!(est * 10 <= wire, "netfilter saw {est} of {wire} packets");
    client.shutdown(Shutdown::Write).expect("shutdown");
    let served = echo.join().expect("echo thread").expect("echo server");
    // Requests 0..20 before the daemon, 100..seq after.
    let sent = 20 + (seq - 100);
    assert_eq!(
        served, sent,
        "the server echoed {served} of {sent} requests"
    );
}

/// The same for UDP: an ASSURED UDP connection found at start awaits traffic (no arming index
/// entry), the kernel forwards its next datagrams, the keep-alive takes it in
/// (`joined_on_traffic`), and the fast path carries it from then on.
#[test]
fn a_udp_connection_found_at_start_joins_once_it_carries_traffic() {
    if !ready("a_udp_connection_found_at_start_joins_once_it_carries_traffic") {
        return;
    }
    let mut tb = Testbed::new("st2");
    let server = wan_v4(7013);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    // ASSURED (two-way traffic for a while) before the daemon runs.
    let warm = ping_pong(&sock, server, 0, 60, 100, Duration::from_millis(50));
    assert_eq!(warm.good, warm.sent, "warm-up: {warm:?}");

    start_over_existing(&mut tb, server);

    // Two rounds go through the kernel whenever the keep-alive takes it in (see the TCP test).
    let idle = tb.snapshot();
    let first = ping_pong(&sock, server, 100, 2, 100, Duration::ZERO);
    assert_eq!(first.good, 2, "{first:?}");
    let after_first = tb.snapshot();
    let fast = after_first.packets_since(&idle, LAN_IF, "forwarded_original")
        + after_first.packets_since(&idle, WAN_IF, "forwarded_reply");
    assert_eq!(
        fast,
        0,
        "fast-pathed before it was taken in: {}",
        after_first.grown_since(&idle)
    );
    let seq = rounds_until_joined(&tb, 102, |seq| {
        let r = ping_pong(&sock, server, seq, 1, 100, Duration::ZERO);
        assert_eq!(r.good, 1, "{r:?}");
    });
    // Each direction is armed by its next datagram through the kernel.
    let arm = ping_pong(&sock, server, seq, 3, 100, Duration::from_millis(10));
    assert_eq!(arm.good, 3, "{arm:?}");
    let before = tb.snapshot();
    let pp = ping_pong(&sock, server, 1000, 200, 100, Duration::from_millis(5));
    let after = tb.snapshot();
    assert_eq!(pp.good, pp.sent, "{pp:?}");
    let fwd = after.packets_since(&before, LAN_IF, "forwarded_original");
    let back = after.packets_since(&before, WAN_IF, "forwarded_reply");
    let est = after.established_since(&before, false);
    eprintln!(
        "after joining: {} datagrams, {fwd} + {back} fast-pathed, {est} in netfilter",
        pp.sent
    );
    assert!(
        fwd >= pp.sent && back >= pp.sent && est == 0,
        "not fast-pathed after joining: {fwd} original, {back} reply of {} each, netfilter {est}",
        pp.sent
    );
    assert_eq!(echo.finish().corrupt, 0);
}
