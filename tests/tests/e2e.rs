//! End to end: real traffic through lan host ⇄ router ⇄ wan host namespaces, the router
//! configured with iptables like a home router and xdp-routerd started on it as a user would.
//! Each test builds its own topology (see `xdp_router_tests::testbed`). Run as root with one
//! test thread: `cargo xtask test` (or `cargo test -p xdp-router-tests --test e2e --
//! --test-threads=1` after building the daemon).
//!
//! The assertions look at what arrived (bytes, digests, addresses, TTL, checksums) and at where
//! it went: the daemon's per-reason counters against the router veths' rx_packets and the
//! FORWARD chain's counters.

use std::{
    io::{self, Read as _, Write as _},
    net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    thread::sleep,
    time::{Duration, Instant},
};

use xdp_router_tests::testbed::{
    self, Capture, HOST_IF, LAN_HOST_V4, LAN_HOST_V6, LAN_IF, MAX_FRAME, Plan, ROUTER_WAN_V4,
    Snapshot, Status, Testbed, Transfer, UdpEcho, WAN_IF, any_v4, any_v6, assert_intact,
    established_packets, fastpath_fraction, forward_total, parse_udp_frame, ping_pong, ready,
    udp_payload, udp_socket, wait_until, wan_v4, wan_v6,
};

/// Bytes of the bulk transfers: tens of MB.
const BULK: u64 = 32 << 20;

/// Waits (5 s at most) until the daemon has offloaded at least one flow of the family.
fn wait_offloaded(tb: &Testbed, v6: bool) {
    let (st, ok) = tb.daemon().wait_status(Duration::from_secs(5), |s| {
        (if v6 { s.flows.ipv6 } else { s.flows.ipv4 }) > 0
    });
    assert!(
        ok,
        "no {} flow offloaded within 5 s: flows {:?}, conntrack:\n{}\nflows: {}",
        if v6 { "IPv6" } else { "IPv4" },
        st.flows,
        tb.router.exec_ok("conntrack", &["-L"]),
        tb.daemon().flows_json()
    );
}

/// LAN→WAN bulk transfer: intact, from `expected_peer`, ≥ 90 % of the LAN packets fast-pathed,
/// and the FORWARD chain's ESTABLISHED rule saw < 10 % of them.
fn bulk_is_fast_pathed(tb: &Testbed, server: SocketAddr, expected_peer: IpAddr, v6: bool) {
    let (before, after) = testbed::bulk_is_fast_pathed(tb, server, expected_peer, BULK);
    let wire = after.rx_lan_since(&before);
    let established = after.established_since(&before, v6);
    eprintln!("{server}: FORWARD ESTABLISHED saw {established} of {wire}");
    assert!(
        (established as f64) < 0.1 * wire as f64,
        "the FORWARD ESTABLISHED rule saw {established} packets, ≥ 10 % of the {wire} data \
         packets"
    );
}

/// Test 1: TCP LAN→WAN, tens of MB: intact, masqueraded, ≥ 90 % fast-pathed, < 10 % seen by FORWARD.
#[test]
fn tcp_v4_bulk_is_fast_pathed_and_masqueraded() {
    if !ready("tcp_v4_bulk_is_fast_pathed_and_masqueraded") {
        return;
    }
    let mut tb = Testbed::new("e2e1");
    tb.start_daemon();
    bulk_is_fast_pathed(&tb, wan_v4(5001), ROUTER_WAN_V4.into(), false);
}

/// Test 2: UDP both ways: contents intact, replies reverse-NATed, fast-path counters rise in both
/// directions.
#[test]
fn udp_v4_both_directions_with_reverse_nat() {
    if !ready("udp_v4_both_directions_with_reverse_nat") {
        return;
    }
    let mut tb = Testbed::new("e2e2");
    tb.start_daemon();
    let server = wan_v4(7002);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    let before = tb.snapshot();
    // 8 s at 50 pps: conntrack marks UDP ASSURED only after 2 s with replies, then the daemon
    // offloads it; most datagrams come after that.
    let pp = ping_pong(&sock, server, 0, 400, 200, Duration::from_millis(20));
    let after = tb.snapshot();
    let seen = echo.finish();

    assert_eq!(
        (pp.good, pp.lost, pp.corrupt),
        (pp.sent, 0, 0),
        "LAN host: {} sent, {} good replies, {} lost, {} corrupt, wrong sources {:?}",
        pp.sent,
        pp.good,
        pp.lost,
        pp.corrupt,
        pp.wrong_source
    );
    assert!(
        pp.wrong_source.is_empty(),
        "replies from {:?}",
        pp.wrong_source
    );
    assert_eq!(
        (seen.received, seen.corrupt),
        (pp.sent, 0),
        "WAN host: received {} (sent {}), corrupt {}",
        seen.received,
        pp.sent,
        seen.corrupt
    );
    assert!(
        seen.peers.len() == 1 && seen.peers[0].ip() == IpAddr::from(ROUTER_WAN_V4),
        "the WAN host saw sources {:?}, expected only {ROUTER_WAN_V4}",
        seen.peers
    );
    let orig = after.packets_since(&before, LAN_IF, "forwarded_original");
    let reply = after.packets_since(&before, WAN_IF, "forwarded_reply");
    eprintln!(
        "UDP: {} each way; fast path: {orig} original, {reply} reply",
        pp.sent
    );
    assert!(
        orig * 2 >= pp.sent && reply * 2 >= pp.sent,
        "fast path forwarded {orig} LAN→WAN and {reply} WAN→LAN of {} each (want ≥ 50 % each)",
        pp.sent
    );
}

/// Test 3: IPv6 routed TCP (no NAT), fast-pathed like IPv4.
#[test]
fn tcp_v6_bulk_is_fast_pathed() {
    if !ready("tcp_v6_bulk_is_fast_pathed") {
        return;
    }
    let mut tb = Testbed::new("e2e3");
    tb.start_daemon();
    bulk_is_fast_pathed(&tb, wan_v6(5003), LAN_HOST_V6.into(), true);
}

/// Test 3b: TCP WAN→LAN through the reverse NAT, tens of MB: intact, ≥ 90 % of the WAN packets
/// fast-pathed, < 10 % seen by FORWARD.
#[test]
fn tcp_v4_download_is_fast_pathed_through_reverse_nat() {
    if !ready("tcp_v4_download_is_fast_pathed_through_reverse_nat") {
        return;
    }
    let mut tb = Testbed::new("e2e3b");
    tb.start_daemon();
    let (before, after) = testbed::download_is_fast_pathed(&tb, wan_v4(5008), BULK);
    let (wire, established) = (
        after.rx_wan_since(&before),
        after.established_since(&before, false),
    );
    eprintln!("download: FORWARD ESTABLISHED saw {established} of {wire}");
    assert!(
        (established as f64) < 0.1 * wire as f64,
        "the FORWARD ESTABLISHED rule saw {established} packets, ≥ 10 % of the {wire} data packets"
    );
}

/// A connection LAN→WAN carrying data through the fast path; returns the client and a server
/// thread that reads until EOF or error and returns (bytes, result).
fn offloaded_connection(
    tb: &Testbed,
    port: u16,
) -> (
    TcpStream,
    std::thread::JoinHandle<(TcpStream, u64, io::Result<()>)>,
) {
    let server = wan_v4(port);
    let listener = tb
        .wan
        .run(move || TcpListener::bind(server))
        .unwrap_or_else(|e| panic!("bind {server}: {e}"));
    let mut client = tb
        .lan
        .run(move || TcpStream::connect(server))
        .unwrap_or_else(|e| panic!("connect {server}: {e}"));
    let (mut conn, _) = listener.accept().expect("accept");
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        let mut total = 0u64;
        let _ = conn.set_read_timeout(Some(Duration::from_secs(20)));
        let res = loop {
            match conn.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => total += n as u64,
                Err(e) => break Err(e),
            }
        };
        (conn, total, res)
    });
    client
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    client.write_all(&[1u8; 64 * 1024]).expect("write");
    wait_offloaded(tb, false);
    let before = tb.snapshot();
    client.write_all(&[2u8; 4 << 20]).expect("write");
    let st = tb.daemon().status();
    // Let the last segments and their ACKs pass before reading counters.
    sleep(Duration::from_millis(200));
    let after = tb.snapshot();
    let fwd = after.packets_since(&before, LAN_IF, "forwarded_original");
    assert!(
        fwd >= 2000,
        "only {fwd} packets of a 4 MiB write were fast-pathed (status: {:?})",
        st.flows
    );
    (client, reader)
}

fn linger_zero(s: &TcpStream) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: valid socket fd; the option value is a linger struct of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_LINGER: {}", io::Error::last_os_error());
}

/// Waits up to 2 s for the daemon to have no IPv4 flow left.
fn assert_flows_drain(tb: &Testbed, what: &str, since: Instant) {
    let (st, ok) = tb
        .daemon()
        .wait_status(Duration::from_secs(2), |s| s.flows.ipv4 == 0);
    assert!(
        ok,
        "{what}: {} IPv4 flow entries still offloaded {:.1} s later; conntrack:\n{}\nflows: {}",
        st.flows.ipv4,
        since.elapsed().as_secs_f64(),
        tb.router.exec_ok("conntrack", &["-L"]),
        tb.daemon().flows_json()
    );
}

/// Test 4: FIN and RST go to the kernel: normal close completes, an RST resets the peer, and the
/// daemon drops the flows within 2 s.
#[test]
fn tcp_fin_and_rst_reach_the_kernel() {
    if !ready("tcp_fin_and_rst_reach_the_kernel") {
        return;
    }
    let mut tb = Testbed::new("e2e4");
    tb.start_daemon();

    // FIN: the client half-closes, the server reads EOF, answers and closes; the client reads
    // the answer and EOF.
    let before = tb.snapshot();
    let (mut client, reader) = offloaded_connection(&tb, 5004);
    client.shutdown(Shutdown::Write).expect("shutdown");
    let (mut conn, got, res) = reader.join().expect("reader");
    res.unwrap_or_else(|e| panic!("server did not see a clean EOF after the client's FIN: {e}"));
    assert_eq!(got, (64 << 10) + (4 << 20), "server received {got} bytes");
    conn.write_all(b"bye").expect("server write");
    drop(conn);
    let mut rest = Vec::new();
    client
        .read_to_end(&mut rest)
        .unwrap_or_else(|e| panic!("client did not see the server's FIN: {e}"));
    assert_eq!(rest, b"bye", "client read {rest:?} before EOF");
    let closed = Instant::now();
    drop(client);
    assert_flows_drain(&tb, "after FIN/FIN", closed);
    let after = tb.snapshot();
    for ifname in [LAN_IF, WAN_IF] {
        let ctl = after.packets_since(&before, ifname, "tcp_syn_fin_rst");
        assert!(
            ctl >= 2,
            "{ifname}: only {ctl} SYN/FIN/RST packets passed to the kernel (want SYN+FIN ≥ 2)"
        );
    }

    // RST: the client aborts (SO_LINGER 0); the server's read fails with ECONNRESET.
    let before = tb.snapshot();
    let (client, reader) = offloaded_connection(&tb, 5005);
    linger_zero(&client);
    drop(client);
    let reset = Instant::now();
    let (_conn, _got, res) = reader.join().expect("reader");
    match res {
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
        other => panic!("server should see ECONNRESET after the client's RST, got {other:?}"),
    }
    assert_flows_drain(&tb, "after RST", reset);
    let after = tb.snapshot();
    let ctl = after.packets_since(&before, LAN_IF, "tcp_syn_fin_rst");
    assert!(
        ctl >= 2,
        "{LAN_IF}: only {ctl} SYN/RST packets passed to the kernel"
    );
}

/// Snapshot, `secs` of traffic, snapshot.
fn window(tb: &Testbed, secs: f64) -> (Snapshot, Snapshot) {
    let a = tb.snapshot();
    sleep(Duration::from_secs_f64(secs));
    (a, tb.snapshot())
}

/// Test 5: `fastpath off` then `on` mid-transfer: the connection survives; forwarding stops while
/// off (counted as fastpath_disabled) and resumes after on.
#[test]
fn fastpath_toggle_mid_transfer() {
    if !ready("fastpath_toggle_mid_transfer") {
        return;
    }
    let mut tb = Testbed::new("e2e5");
    tb.start_daemon();
    let t = Transfer::start(
        &tb,
        wan_v4(5006),
        Plan {
            bytes: 1 << 34,
            rate: Some(30 << 20),
        },
    );
    wait_offloaded(&tb, false);
    let (a, b) = window(&tb, 1.0);
    let fwd = b.packets_since(&a, LAN_IF, "forwarded_original");
    assert!(
        fwd > 1000,
        "before the toggle only {fwd} packets fast-pathed in 1 s"
    );

    tb.daemon().set_fastpath(false);
    sleep(Duration::from_millis(300));
    let (a, b) = window(&tb, 1.5);
    let fwd = b.forwarded_since(&a);
    let disabled = b.packets_since(&a, LAN_IF, "fastpath_disabled");
    let wire = b.rx_lan_since(&a);
    let established = b.established_since(&a, false);
    eprintln!(
        "off: {wire} LAN packets, {fwd} forwarded, {disabled} disabled, {established} FORWARD"
    );
    assert_eq!(
        fwd, 0,
        "{fwd} packets fast-pathed while the fast path was off"
    );
    assert!(
        wire > 1000 && disabled * 10 >= wire * 9,
        "while off: {wire} LAN packets, only {disabled} counted as fastpath_disabled"
    );
    assert!(
        established * 10 >= wire * 9,
        "while off the kernel's FORWARD ESTABLISHED rule saw only {established} of {wire} LAN \
         packets"
    );

    tb.daemon().set_fastpath(true);
    sleep(Duration::from_millis(500));
    let (c, d) = window(&tb, 1.5);
    let fwd = d.packets_since(&c, LAN_IF, "forwarded_original");
    let wire = d.rx_lan_since(&c);
    let frac = fastpath_fraction(fwd, wire);
    eprintln!("on again: {wire} LAN packets, {fwd} fast-pathed");
    assert!(
        frac >= 0.9,
        "after `fastpath on` only {fwd} of {wire} LAN packets ({:.1} %) were fast-pathed",
        frac * 100.0
    );
    t.stop();
    let r = t.finish();
    assert_intact(&r);
}

/// Test 6: SIGKILL mid-transfer: the kernel carries the rest, data intact, no XDP left attached.
#[test]
fn sigkill_fails_open() {
    if !ready("sigkill_fails_open") {
        return;
    }
    let mut tb = Testbed::new("e2e6");
    tb.start_daemon();
    // Paced, and long enough for any machine (≈ 43 s at most): it is stopped 1 s after the
    // kill, so an emulated guest's slower checks before the kill cannot outlast it.
    let t = Transfer::start(
        &tb,
        wan_v4(5007),
        Plan {
            bytes: 1 << 30,
            rate: Some(24 << 20),
        },
    );
    wait_offloaded(&tb, false);
    let (a, b) = window(&tb, 1.0);
    let fwd = b.packets_since(&a, LAN_IF, "forwarded_original");
    assert!(
        fwd > 1000,
        "before the kill only {fwd} packets fast-pathed in 1 s"
    );

    // The detection below must see the attached programs first, or "nothing attached" means
    // nothing.
    let attached = tb.xdp_attached();
    assert!(
        attached
            .as_deref()
            .is_some_and(|a| a.contains(LAN_IF) && a.contains(WAN_IF)),
        "before the kill, ip/bpftool should show XDP on {LAN_IF} and {WAN_IF}: {attached:?}"
    );
    let est_before = tb.snapshot().established_v4;
    tb.daemon.as_mut().expect("daemon").kill9();
    let gone = wait_until(Duration::from_secs(2), || tb.xdp_attached().is_none());
    assert!(
        gone,
        "2 s after SIGKILL XDP is still attached: {}",
        tb.xdp_attached().unwrap_or_default()
    );
    assert!(
        !t.sender_done(),
        "the transfer ended before the kill; make it longer"
    );
    std::thread::sleep(Duration::from_secs(1));
    t.stop();
    let r = t.finish();
    assert_intact(&r);
    let est = established_packets(&tb.router, "iptables") - est_before;
    assert!(
        est > 1000,
        "after the kill the kernel's FORWARD ESTABLISHED rule saw only {est} packets"
    );
}

/// The conntrack id of the UDP entry to `dport` in the router namespace, if any.
fn conntrack_udp_id(tb: &Testbed, dport: u16) -> Option<String> {
    let out = tb.router.exec_ok(
        "conntrack",
        &["-L", "-p", "udp", "--dport", &dport.to_string(), "-o", "id"],
    );
    out.lines()
        .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("id=")))
        .map(str::to_owned)
}

/// Test 7: Keep-alive: with 10 s UDP conntrack timeouts, a flow carried only by the fast path for
/// 60 s keeps its conntrack entry (same id) and keeps flowing.
#[test]
fn keepalive_keeps_conntrack_entry() {
    if !ready("keepalive_keeps_conntrack_entry") {
        return;
    }
    let mut tb = Testbed::new("e2e7");
    tb.start_daemon();
    tb.router
        .sh("sysctl -qw net.netfilter.nf_conntrack_udp_timeout=10 \
         net.netfilter.nf_conntrack_udp_timeout_stream=10");
    let port = 7007;
    let server = wan_v4(port);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    // Warm up until ASSURED (2 s of two-way traffic) and offloaded.
    let warm = ping_pong(&sock, server, 0, 80, 100, Duration::from_millis(50));
    assert_eq!(warm.good, warm.sent, "warm-up: {warm:?}");
    wait_offloaded(&tb, false);
    let id = conntrack_udp_id(&tb, port).expect("no conntrack entry after the warm-up");
    let fwd_total_before = forward_total(&tb.router, "iptables");
    let before = tb.snapshot();

    let pp = ping_pong(&sock, server, 1000, 1200, 100, Duration::from_millis(50));
    let after = tb.snapshot();
    let fwd_total = forward_total(&tb.router, "iptables") - fwd_total_before;
    let fast = after.forwarded_since(&before);
    eprintln!(
        "60 s: {} sent, {} good; fast path {fast}; FORWARD chain {fwd_total}",
        pp.sent, pp.good
    );
    assert_eq!(pp.good, pp.sent, "during the 60 s: {pp:?}");
    assert!(
        fwd_total * 100 <= 2 * pp.sent,
        "the FORWARD chain saw {fwd_total} packets of {} during the 60 s (want ≤ 1 %)",
        2 * pp.sent
    );
    assert!(
        fast * 100 >= 99 * 2 * pp.sent,
        "the fast path forwarded {fast} of {} packets",
        2 * pp.sent
    );
    let id_after = conntrack_udp_id(&tb, port);
    assert_eq!(
        id_after.as_deref(),
        Some(id.as_str()),
        "the conntrack entry (id {id}) did not survive 60 s of fast-path-only traffic with a \
         10 s timeout; conntrack now:\n{}",
        tb.router.exec_ok("conntrack", &["-L", "-p", "udp"])
    );
    let tail = ping_pong(&sock, server, 9000, 20, 100, Duration::from_millis(50));
    assert_eq!(tail.good, tail.sent, "after 60 s: {tail:?}");
    let seen = echo.finish();
    assert_eq!(seen.corrupt, 0, "echo saw corrupt datagrams: {seen:?}");
}

/// Captures 20 fast-pathed datagrams each way and checks TTL and checksums at the receivers.
fn ttl_and_checksums(tb: &Testbed, server: SocketAddr, client_bind: SocketAddr) {
    let v6 = server.is_ipv6();
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, client_bind, 64);
    let warm = ping_pong(&sock, server, 0, 60, 100, Duration::from_millis(50));
    assert_eq!(warm.good, warm.sent, "warm-up: {warm:?}");
    wait_offloaded(tb, v6);
    let cap_wan = Capture::open(&tb.wan, HOST_IF);
    let cap_lan = Capture::open(&tb.lan, HOST_IF);
    let before = tb.snapshot();
    let n = 20u64;
    let pp = ping_pong(&sock, server, 100, n, 300, Duration::from_millis(20));
    let after = tb.snapshot();
    assert_eq!(pp.good, n, "{pp:?}");
    drop(echo);

    let orig = after.packets_since(&before, LAN_IF, "forwarded_original");
    let reply = after.packets_since(&before, WAN_IF, "forwarded_reply");
    let est = after.established_since(&before, v6);
    assert!(
        orig >= n && reply >= n && est == 0,
        "the captured datagrams were not all fast-pathed: {orig} original, {reply} reply of {n} \
         each, FORWARD ESTABLISHED saw {est}"
    );

    let client = sock.local_addr().expect("local addr");
    let lan_host: IpAddr = if v6 {
        LAN_HOST_V6.into()
    } else {
        LAN_HOST_V4.into()
    };
    // The WAN host's view of the client: the router's WAN address under NAT, the LAN host
    // itself without (IPv6).
    let wan_view: IpAddr = if v6 {
        LAN_HOST_V6.into()
    } else {
        ROUTER_WAN_V4.into()
    };
    for (what, cap, want_src, want_dst) in [
        ("LAN→WAN at the WAN host", &cap_wan, None, server),
        (
            "WAN→LAN at the LAN host",
            &cap_lan,
            Some(server),
            SocketAddr::new(lan_host, client.port()),
        ),
    ] {
        let mut frames = Vec::new();
        while let Some(f) = cap.next_incoming(Duration::from_millis(300)) {
            if let Some(u) = parse_udp_frame(&f)
                && (u.dst.port() == server.port() || u.src.port() == server.port())
            {
                frames.push(u);
            }
        }
        let ours: Vec<_> = frames
            .iter()
            .filter(|u| {
                u.payload
                    .get(..8)
                    .is_some_and(|s| u64::from_be_bytes(s.try_into().unwrap_or_default()) >= 100)
            })
            .collect();
        assert_eq!(
            ours.len() as u64,
            n,
            "{what}: captured {} of {n} datagrams",
            ours.len()
        );
        for u in ours {
            let seq = u64::from_be_bytes(u.payload[..8].try_into().unwrap_or_default());
            assert_eq!(
                u.ttl, 63,
                "{what} #{seq}: TTL/hop limit {} (sent with 64)",
                u.ttl
            );
            assert!(u.ip_checksum_ok, "{what} #{seq}: bad IPv4 header checksum");
            assert!(u.udp_checksum_ok, "{what} #{seq}: bad UDP checksum: {u:?}");
            assert_eq!(u.dst, want_dst, "{what} #{seq}: destination");
            match want_src {
                Some(src) => assert_eq!(u.src, src, "{what} #{seq}: source"),
                None => assert_eq!(u.src.ip(), wan_view, "{what} #{seq}: source"),
            }
            assert_eq!(u.payload, udp_payload(seq, 300), "{what} #{seq}: payload");
        }
        eprintln!("{what}: {n} datagrams, TTL 63, checksums valid");
    }
}

/// Test 8: Fast-pathed packets arrive with TTL/hop limit decremented by exactly one and valid IPv4
/// header and UDP checksums (checked on AF_PACKET captures at both receivers).
#[test]
fn ttl_and_checksums_at_the_receiver() {
    if !ready("ttl_and_checksums_at_the_receiver") {
        return;
    }
    let mut tb = Testbed::new("e2e8");
    tb.start_daemon();
    ttl_and_checksums(&tb, wan_v4(7008), any_v4());
    ttl_and_checksums(&tb, wan_v6(7009), any_v6());
}

/// Test 9: Negative control: the same bulk transfer with the fast path off: the forwarded counters
/// stay 0 and the "≥ 90 % fast-pathed" measure reads < 10 %, so the measurement can fail.
#[test]
fn negative_control_fastpath_off() {
    if !ready("negative_control_fastpath_off") {
        return;
    }
    let mut tb = Testbed::new("e2e9");
    tb.start_daemon();
    tb.daemon().set_fastpath(false);
    // The wire and the FORWARD chain are compared over the whole transfer, read while nothing
    // flows. The switch is checked from the moment the connection is offloaded (packets before
    // it are `no_flow`, however long the daemon takes: about a second in an emulated guest),
    // on the daemon's own counters, which one status read gives consistently.
    let before = tb.snapshot();
    let transfer = Transfer::start(
        &tb,
        wan_v4(5009),
        Plan {
            bytes: BULK,
            rate: Some(BULK / 4),
        },
    );
    wait_offloaded(&tb, false);
    let offloaded = tb.daemon().status();
    let r = transfer.finish();
    let after = tb.snapshot();
    assert_intact(&r);
    let wire = after.rx_lan_since(&before);
    let fwd = after.forwarded_since(&before);
    let established = after.established_since(&before, false);
    let frac = fastpath_fraction(
        after.packets_since(&before, LAN_IF, "forwarded_original"),
        wire,
    );
    let lan_total = |st: &Status| -> u64 {
        st.counters
            .iter()
            .filter(|c| c.interface == LAN_IF)
            .map(|c| c.packets)
            .sum()
    };
    let since_offload = lan_total(&after.status) - lan_total(&offloaded);
    let disabled = after.status.packets(LAN_IF, "fastpath_disabled")
        - offloaded.packets(LAN_IF, "fastpath_disabled");
    eprintln!(
        "fast path off: {wire} LAN packets, {fwd} forwarded, FORWARD ESTABLISHED \
         {established}; from the offload on {disabled} of {since_offload} fastpath_disabled"
    );
    assert!(
        wire >= BULK / MAX_FRAME,
        "only {wire} LAN packets for {BULK} bytes"
    );
    assert_eq!(fwd, 0, "{fwd} packets forwarded by a disabled fast path");
    assert!(
        frac < 0.1,
        "the fraction helper says {frac} with the fast path off"
    );
    assert!(
        since_offload >= wire / 4,
        "only {since_offload} of {wire} LAN packets came after the offload"
    );
    assert!(
        disabled >= since_offload - since_offload / 100,
        "{disabled} of the {since_offload} LAN packets after the offload counted as \
         fastpath_disabled"
    );
    assert!(
        established * 10 >= wire * 9,
        "the FORWARD ESTABLISHED rule saw only {established} of {wire} LAN packets"
    );
}

/// A TCP connection from the LAN host's `port` to `server` (SO_REUSEADDR, so a closed
/// connection's tuple can be reused at once).
fn connect_from(tb: &Testbed, port: u16, server: SocketAddr) -> TcpStream {
    tb.lan
        .run(move || -> io::Result<TcpStream> {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            s.set_reuse_address(true)?;
            s.bind(&SocketAddr::new(LAN_HOST_V4.into(), port).into())?;
            s.connect(&server.into())?;
            Ok(s.into())
        })
        .unwrap_or_else(|e| panic!("connect {server} from port {port}: {e}"))
}

/// A new connection on the tuple of a closed, offloaded one, while the daemon has not read
/// conntrack's events yet (stopped here, as a daemon far behind on a busy machine): the old
/// connection's entry is still in the map and armed. Its SYN, forwarded by the kernel, must
/// disarm that entry for good (`FLOW_F_STALE`), so the new connection is carried by the kernel
/// (conntrack sees it, marks it, refreshes it) until the daemon offloads it as itself; after
/// that it is fast-pathed again.
#[test]
fn a_reused_tuple_never_rides_the_old_connections_entry() {
    if !ready("a_reused_tuple_never_rides_the_old_connections_entry") {
        return;
    }
    let mut tb = Testbed::new("ru");
    tb.start_daemon();
    let server = wan_v4(7101);
    let listener = tb
        .wan
        .run(move || TcpListener::bind(server))
        .unwrap_or_else(|e| panic!("bind {server}: {e}"));
    let sink = std::thread::spawn(move || {
        let mut totals = Vec::new();
        for _ in 0..2 {
            let (mut conn, _) = listener.accept().expect("accept");
            let _ = conn.set_read_timeout(Some(Duration::from_secs(20)));
            let mut buf = vec![0u8; 65536];
            let mut total = 0u64;
            while let Ok(n) = conn.read(&mut buf) {
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
            totals.push(total);
        }
        totals
    });
    const PORT: u16 = 41234;
    let mut old = connect_from(&tb, PORT, server);
    old.write_all(&[1u8; 64 * 1024]).expect("write");
    wait_offloaded(&tb, false);
    let before = tb.snapshot();
    old.write_all(&[2u8; 1 << 20]).expect("write");
    sleep(Duration::from_millis(200));
    let fast_old = tb
        .snapshot()
        .packets_since(&before, LAN_IF, "forwarded_original");
    assert!(
        fast_old > 300,
        "the first connection should be fast-pathed: {fast_old}"
    );

    tb.daemon().pause(true);
    linger_zero(&old);
    drop(old);
    sleep(Duration::from_millis(200));
    let (rx0, est0) = (
        tb.rx_packets(LAN_IF),
        established_packets(&tb.router, "iptables"),
    );
    let mut new = connect_from(&tb, PORT, server);
    new.write_all(&[3u8; 1 << 20]).expect("write");
    sleep(Duration::from_millis(300));
    let (rx1, est1) = (
        tb.rx_packets(LAN_IF),
        established_packets(&tb.router, "iptables"),
    );
    tb.daemon().pause(false);
    let (wire, est) = (rx1 - rx0, est1 - est0);
    println!(
        "new connection on the old tuple, daemon stopped: {wire} LAN packets on the wire, \
         {est} seen by FORWARD ESTABLISHED ({:.0} % through the kernel)",
        100.0 * est as f64 / wire.max(1) as f64
    );
    assert!(
        est * 10 >= wire * 9,
        "the new connection rode the old connection's entry: only {est} of {wire} packets \
         reached netfilter"
    );

    // Once the daemon has read the events, the new connection is offloaded as itself.
    let (st, ok) = tb.daemon().wait_status(Duration::from_secs(10), |s| {
        s.conntrack.offloaded >= 1 && s.conntrack.removed_total >= 1
    });
    assert!(
        ok,
        "the new connection should be offloaded: {:?}",
        st.conntrack
    );
    new.write_all(&[4u8; 64 * 1024]).expect("write");
    sleep(Duration::from_millis(500));
    let before = tb.snapshot();
    new.write_all(&[5u8; 1 << 20]).expect("write");
    sleep(Duration::from_millis(200));
    let fast_new = tb
        .snapshot()
        .packets_since(&before, LAN_IF, "forwarded_original");
    println!("after the daemon caught up: {fast_new} packets of 1 MiB fast-pathed");
    assert!(
        fast_new > 300,
        "the new connection should be fast-pathed: {fast_new}"
    );
    new.shutdown(Shutdown::Write).expect("shutdown");
    let totals = sink.join().expect("sink");
    assert_eq!(
        totals.get(1).copied(),
        Some((1 << 20) + (64 << 10) + (1 << 20)),
        "the new connection's bytes must all arrive: {totals:?}"
    );
}
