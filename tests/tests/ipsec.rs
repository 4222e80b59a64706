//! A site-to-site IPsec tunnel through the router (strongSwan-style, set up here with static
//! `ip xfrm` keys): traffic between the LAN and the remote network 10.9.0.0/24 behind the WAN
//! host is ESP on the WAN, and the kernel drops plaintext that claims to come from the remote
//! network (the `fwd` policy requires ESP). The fast path must never forward what the kernel
//! would have encrypted or dropped: the outgoing direction leaves as ESP (the arming program
//! never sees its tuple), and packets the kernel decrypted must not arm the incoming direction,
//! or a plaintext packet with the same tuple would be forwarded into the LAN.
//!
//! This host kernel has no ESP (`CONFIG_INET_ESP`), so the test is `#[ignore]`d here and
//! `cargo xtask test` runs it in a guest that boots Debian's kernel (see xtask/src/guest.rs).

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::Duration,
};

use xdp_router_tests::{
    netns::Netns,
    packet::{Spec, Transport},
    testbed::{
        Capture, HOST_IF, LAN_HOST_V4, LAN_IF, ROUTER_WAN_V4, Testbed, UdpEcho, WAN_HOST_V4,
        WAN_IF, ping_pong, ready, udp_socket,
    },
};

/// The remote network's host (on the WAN host's loopback), reached through the tunnel.
const REMOTE: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
const PORT: u16 = 6200;
/// AES-GCM keys (20 bytes: key + salt), one per direction.
const KEY_OUT: &str = "0x0102030405060708090a0b0c0d0e0f1011121314";
const KEY_IN: &str = "0x1112131415161718191a1b1c1d1e1f2021222324";

/// The ESP states and the tunnel policies of one end: `local`/`peer` are the tunnel
/// endpoints, `mine`/`theirs` the networks behind them; `deliver` is `in` for the WAN host
/// (its remote network is local) and `fwd` for the router.
fn tunnel_end(ns: &Netns, local: Ipv4Addr, peer: Ipv4Addr, mine: &str, theirs: &str) {
    let (key_out, key_in, deliver) = if local == ROUTER_WAN_V4 {
        (KEY_OUT, KEY_IN, "fwd")
    } else {
        (KEY_IN, KEY_OUT, "in")
    };
    let (spi_out, spi_in) = if local == ROUTER_WAN_V4 {
        ("0x100", "0x200")
    } else {
        ("0x200", "0x100")
    };
    let aead = "aead 'rfc4106(gcm(aes))'";
    ns.sh(&format!(
        "ip xfrm state add src {local} dst {peer} proto esp spi {spi_out} mode tunnel {aead} {key_out} 128
         ip xfrm state add src {peer} dst {local} proto esp spi {spi_in} mode tunnel {aead} {key_in} 128
         ip xfrm policy add src {mine} dst {theirs} dir out tmpl src {local} dst {peer} proto esp mode tunnel
         ip xfrm policy add src {theirs} dst {mine} dir {deliver} tmpl src {peer} dst {local} proto esp mode tunnel"
    ));
}

/// `XfrmInTmplMismatch` of `/proc/net/xfrm_stat`: packets dropped because they did not come
/// through the tunnel a policy requires.
fn tmpl_mismatches(ns: &Netns) -> u64 {
    ns.exec_ok("cat", &["/proc/net/xfrm_stat"])
        .lines()
        .find_map(|l| l.strip_prefix("XfrmInTmplMismatch"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn mac_of(ns: &Netns, ifname: &str) -> [u8; 6] {
    let text = ns.exec_ok("cat", &[&format!("/sys/class/net/{ifname}/address")]);
    let mut mac = [0u8; 6];
    for (b, part) in mac.iter_mut().zip(text.trim().split(':')) {
        *b = u8::from_str_radix(part, 16).expect("MAC address");
    }
    mac
}

/// Sends `n` plaintext datagrams from the WAN host's wire as if from REMOTE:PORT to the LAN
/// host's `lan_port` (AF_PACKET: the WAN host's own policy would encrypt them) and returns
/// how many the LAN host received.
fn spoof(tb: &Testbed, lan_sock: &std::net::UdpSocket, lan_port: u16, n: u64) -> u64 {
    let wire = Capture::open(&tb.wan, HOST_IF);
    let frame = Spec {
        eth_src: mac_of(&tb.wan, HOST_IF),
        eth_dst: mac_of(&tb.router, WAN_IF),
        src: REMOTE.into(),
        dst: LAN_HOST_V4.into(),
        sport: PORT,
        dport: lan_port,
        ttl: 64,
        transport: Transport::Udp,
        payload_len: 64,
    }
    .frame();
    for _ in 0..n {
        wire.send(&frame);
        std::thread::sleep(Duration::from_millis(20));
    }
    lan_sock
        .set_read_timeout(Some(Duration::from_millis(500)))
        .expect("set_read_timeout");
    let mut buf = [0u8; 2048];
    let mut got = 0;
    while lan_sock.recv_from(&mut buf).is_ok() {
        got += 1;
    }
    got
}

/// LAN ⇄ 10.9.0.0/24 through an ESP tunnel between the router's and the WAN host's WAN
/// addresses, with the fast path on: every datagram comes back, nothing of the stream crosses
/// the WAN in plaintext, and plaintext datagrams spoofed with the reply direction's tuple are
/// dropped by the kernel as without the fast path, never fast-pathed into the LAN.
#[test]
#[ignore = "needs ESP (esp4): cargo xtask test runs it in a Debian-kernel guest"]
fn ipsec_tunnel_traffic_is_never_fast_pathed_in_plaintext() {
    if !ready("ipsec_tunnel_traffic_is_never_fast_pathed_in_plaintext") {
        return;
    }
    let mut tb = Testbed::new("ips");
    tb.wan.sh(&format!(
        "ip addr add {REMOTE}/32 dev lo
         ip route add 10.0.1.0/24 via {ROUTER_WAN_V4}"
    ));
    tunnel_end(
        &tb.router,
        ROUTER_WAN_V4,
        WAN_HOST_V4,
        "10.0.1.0/24",
        "10.9.0.0/24",
    );
    tunnel_end(
        &tb.wan,
        WAN_HOST_V4,
        ROUTER_WAN_V4,
        "10.9.0.0/24",
        "10.0.1.0/24",
    );
    // Tunnelled traffic is not NATed (the usual exemption), and the remote network is
    // routed through the WAN host.
    tb.router.sh(&format!(
        "iptables -w -t nat -I POSTROUTING -m policy --dir out --pol ipsec -j ACCEPT
         ip route add 10.9.0.0/24 via {WAN_HOST_V4}"
    ));
    tb.start_daemon();

    let server = SocketAddr::new(REMOTE.into(), PORT);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, SocketAddr::new(IpAddr::V4(LAN_HOST_V4), 0), 64);
    let lan_port = sock.local_addr().expect("local address").port();
    let wan_wire = Capture::open(&tb.wan, HOST_IF);
    let (before, wan_mismatch0) = (tb.daemon().status(), tmpl_mismatches(&tb.wan));
    // Long enough for the daemon to offload the connection and the kernel to forward packets
    // of both directions after that.
    let pp = ping_pong(&sock, server, 0, 60, 64, Duration::from_millis(50));
    // ESP frames that reached the WAN host (the decrypted packets it re-injects show up on
    // the same socket as IPv4/UDP; a plaintext datagram from the router would be dropped by
    // the WAN host's `in` policy, counted as a template mismatch, and not echoed).
    let mut esp = 0;
    while let Some(f) = wan_wire.next_incoming(Duration::from_millis(100)) {
        // IPv4 (ethertype 0x0800) with protocol (byte 23) ESP.
        if f.get(12..14) == Some(&[8, 0]) && f.get(23) == Some(&50) {
            esp += 1;
        }
    }
    let st = tb.daemon().status();
    let fast_out =
        st.packets(LAN_IF, "forwarded_original") - before.packets(LAN_IF, "forwarded_original");
    let wan_dropped = tmpl_mismatches(&tb.wan) - wan_mismatch0;
    println!(
        "through the tunnel: {} of {} echoed; {esp} ESP frames reached the WAN host, which \
         dropped {wan_dropped} for lacking ESP; {fast_out} LAN datagrams fast-pathed; \
         conntrack {:?}",
        pp.good, pp.sent, st.conntrack
    );
    assert_eq!((pp.good, pp.lost, pp.corrupt), (pp.sent, 0, 0), "{pp:?}");
    assert_eq!(
        (fast_out, wan_dropped),
        (0, 0),
        "tunnelled traffic must not leave the router in plaintext"
    );
    assert!(esp >= pp.sent, "the stream should cross the WAN as ESP");

    // Plaintext with the reply direction's tuple: the kernel drops it (the fwd policy wants
    // ESP); so must the fast path.
    let before = tb.daemon().status();
    let mismatch0 = tmpl_mismatches(&tb.router);
    let got = spoof(&tb, &sock, lan_port, 20);
    let after = tb.daemon().status();
    let dropped = tmpl_mismatches(&tb.router) - mismatch0;
    let fast = after.packets(WAN_IF, "forwarded_reply") - before.packets(WAN_IF, "forwarded_reply");
    let deltas: Vec<String> = after
        .counters
        .iter()
        .filter(|c| c.interface == WAN_IF || c.interface == LAN_IF)
        .map(|c| (c, c.packets - before.packets(&c.interface, &c.reason)))
        .filter(|(_, d)| *d > 0)
        .map(|(c, d)| format!("{} {} +{d}", c.interface, c.reason))
        .collect();
    println!(
        "20 plaintext datagrams spoofed as {REMOTE}:{PORT} → {LAN_HOST_V4}:{lan_port}: {got} \
         reached the LAN host, {fast} fast-pathed, {dropped} dropped by the kernel's policy \
         check; counters: {}",
        deltas.join(", ")
    );
    assert_eq!(
        (got, fast),
        (0, 0),
        "plaintext posing as tunnel traffic must not reach the LAN"
    );
    assert!(
        dropped >= 20,
        "the kernel's policy check should have dropped the spoofed datagrams: {dropped}"
    );
    assert_eq!(echo.finish().corrupt, 0);
}
