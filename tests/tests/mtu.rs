//! An MTU mismatch on the path, as in the kernel flowtable selftest: the router's WAN link has
//! an MTU of 1280, its LAN 1500. A LAN host's datagram that is too big for the WAN and may not
//! be fragmented (DF, the Linux default for UDP) must meet the kernel, which drops it and
//! answers "fragmentation needed" (PMTU discovery); the host then fragments what it sends and
//! every later datagram arrives. With the fast path on, the same must happen as with it off:
//! the offloaded flow's oversized packet goes to the kernel (`frag_needed`) instead of being
//! forwarded or lost silently.
//!
//! And a jumbo-frame network (MTU 9000 on both router links): the ports keep native XDP, frames
//! that fit one buffer take the fast path, longer ones (multi-buffer) meet the kernel whole.

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use xdp_router_tests::testbed::{
    HOST_IF, LAN_IF, Testbed, UdpEcho, WAN_HOST_V4, WAN_IF, ping_pong, ready, udp_socket, wan_v4,
};

/// A LAN host socket whose UDP flow to the echo `server` is offloaded (if the fast path is on)
/// and armed: small datagrams over 2.5 s (conntrack assures UDP after 2 s with replies),
/// sequence numbers 0…7.
fn offloaded_client(tb: &Testbed, server: SocketAddr) -> std::net::UdpSocket {
    let sock = udp_socket(&tb.lan, SocketAddr::new(IpAddr::from([0, 0, 0, 0]), 0), 64);
    ping_pong(&sock, server, 0, 5, 100, Duration::from_millis(100));
    std::thread::sleep(Duration::from_millis(2500));
    ping_pong(&sock, server, 5, 3, 100, Duration::from_millis(20));
    sock
}

/// What one run saw.
#[derive(Debug)]
struct Run {
    /// Small datagrams echoed (of 20), after which the flow is offloaded (fast path on).
    small: (u64, u64),
    /// Large (1400-byte) datagrams echoed, of 10.
    large: (u64, u64),
    /// Large datagrams counted `frag_needed` on the LAN interface.
    frag_needed: u64,
    /// Small datagrams forwarded by XDP on the LAN interface.
    fast: u64,
    /// The LAN host's route to the WAN host learned the WAN link's MTU.
    pmtu_learned: bool,
}

fn run(fast_path: bool, port: u16) -> Run {
    let mut tb = Testbed::new(if fast_path { "mtn" } else { "mtf" });
    tb.router.sh(&format!("ip link set {WAN_IF} mtu 1280"));
    tb.wan.sh(&format!("ip link set {HOST_IF} mtu 1280"));
    tb.start_daemon();
    tb.daemon().set_fastpath(fast_path);
    let server = wan_v4(port);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = offloaded_client(&tb, server);
    let before = tb.daemon().status();
    let small = ping_pong(&sock, server, 10, 20, 100, Duration::from_millis(10));
    let large = ping_pong(&sock, server, 100, 10, 1400, Duration::from_millis(10));
    let after = tb.daemon().status();
    let d = |r: &str| after.packets(LAN_IF, r) - before.packets(LAN_IF, r);
    let route = tb
        .lan
        .exec_ok("ip", &["route", "get", &WAN_HOST_V4.to_string()]);
    assert_eq!(echo.finish().corrupt, 0);
    Run {
        small: (small.good, small.sent),
        large: (large.good, large.sent),
        frag_needed: d("frag_needed"),
        fast: d("forwarded_original"),
        pmtu_learned: route.contains("mtu 1280"),
    }
}

/// The same datagrams with the fast path off and on: the same ones arrive, the first large
/// one is dropped by the kernel with a "fragmentation needed" in both, and the LAN host learns
/// the path MTU in both.
#[test]
fn mtu_mismatch_meets_the_kernel_like_without_the_fast_path() {
    if !ready("mtu::mtu_mismatch_meets_the_kernel_like_without_the_fast_path") {
        return;
    }
    let off = run(false, 6401);
    let on = run(true, 6403);
    println!(
        "WAN MTU 1280, LAN 1500, 1400-byte DF datagrams:\n  fast path off: {off:?}\n  fast path on:  {on:?}"
    );
    for r in [&off, &on] {
        assert_eq!(r.small.0, r.small.1, "small datagrams: {r:?}");
        assert!(
            r.pmtu_learned,
            "the LAN host should learn the path MTU: {r:?}"
        );
    }
    assert_eq!(
        on.large, off.large,
        "the same large datagrams must arrive with the fast path on as off"
    );
    assert!(
        on.large.0 >= on.large.1 - 1,
        "after the first, every large datagram arrives (fragmented by the host): {on:?}"
    );
    assert_eq!(
        on.fast, on.small.1,
        "the small datagrams should take the fast path: {on:?}"
    );
    assert!(
        on.frag_needed >= 1,
        "the oversized datagram of the offloaded flow should go to the kernel as frag_needed: \
         {on:?}"
    );
    assert_eq!(off.fast, 0);
}

/// What one jumbo run saw.
#[derive(Debug)]
struct JumboRun {
    /// The LAN port's attach mode and why it is not native, if it is not.
    lan_mode: (String, Option<String>),
    /// Datagrams of 100 and of 3,000 bytes echoed (one buffer each: ≤ ≈ 3,500-byte frames).
    one_buffer: (u64, u64),
    /// Datagrams of 8,000 bytes echoed (longer than a page: several buffers).
    multi: (u64, u64),
    /// Forwarded by the fast path on the LAN port, and counted `multi_buffer_frame` there,
    /// while the datagrams went out.
    fast: u64,
    multi_counted: u64,
    /// The LAN port's received packets, and the FORWARD ESTABLISHED rule's packets (both
    /// directions).
    wire: u64,
    netfilter: u64,
    counters: String,
}

fn jumbo_run(fast_path: bool, port: u16) -> JumboRun {
    let mut tb = Testbed::new(if fast_path { "jbn" } else { "jbf" });
    tb.router.sh(&format!(
        "ip link set {LAN_IF} mtu 9000 && ip link set {WAN_IF} mtu 9000"
    ));
    tb.lan.sh(&format!("ip link set {HOST_IF} mtu 9000"));
    tb.wan.sh(&format!("ip link set {HOST_IF} mtu 9000"));
    tb.start_daemon();
    tb.daemon().set_fastpath(fast_path);
    let lan = tb.daemon().status().iface(LAN_IF).clone();
    let server = wan_v4(port);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = offloaded_client(&tb, server);
    let before = tb.snapshot();
    let small = ping_pong(&sock, server, 10, 20, 100, Duration::from_millis(10));
    let mid = ping_pong(&sock, server, 100, 10, 3000, Duration::from_millis(10));
    let multi = ping_pong(&sock, server, 200, 10, 8000, Duration::from_millis(10));
    let after = tb.snapshot();
    let stats = echo.finish();
    assert_eq!(stats.corrupt, 0, "the WAN host received corrupt datagrams");
    JumboRun {
        lan_mode: (lan.attach_mode, lan.generic_because),
        one_buffer: (small.good + mid.good, small.sent + mid.sent),
        multi: (multi.good, multi.sent),
        fast: after.packets_since(&before, LAN_IF, "forwarded_original"),
        multi_counted: after.packets_since(&before, LAN_IF, "multi_buffer_frame"),
        wire: after.rx_lan_since(&before),
        netfilter: after.established_since(&before, false),
        counters: after.grown_since(&before),
    }
}

/// Jumbo frames on both router links (MTU 9000). A veth, like many drivers, refuses a native
/// XDP program without multi-buffer support once its peer's MTU is above what a page holds; the
/// program is loaded with it, so the ports stay native. With the fast path on, the datagrams of
/// 100 and 3,000 bytes (one buffer) are forwarded by XDP and never reach netfilter; those of
/// 8,000 bytes (several buffers) go to the kernel as `multi_buffer_frame` and arrive whole,
/// every one, as with the fast path off, where XDP forwards nothing.
#[test]
fn a_jumbo_mtu_keeps_native_xdp_and_long_frames_meet_the_kernel() {
    if !ready("mtu::a_jumbo_mtu_keeps_native_xdp_and_long_frames_meet_the_kernel") {
        return;
    }
    let off = jumbo_run(false, 6405);
    let on = jumbo_run(true, 6407);
    println!("MTU 9000 on both links:\n  fast path off: {off:?}\n  fast path on:  {on:?}");
    for r in [&off, &on] {
        assert_eq!(
            r.lan_mode.0, "native",
            "the LAN port should run native XDP: {r:?}"
        );
        assert_eq!(
            r.one_buffer.0, r.one_buffer.1,
            "one-buffer datagrams lost: {r:?}"
        );
        assert_eq!(r.multi.0, r.multi.1, "8,000-byte datagrams lost: {r:?}");
        assert_eq!(
            r.multi_counted, r.multi.1,
            "each 8,000-byte datagram should reach the LAN port's XDP program as one \
             multi-buffer frame and go to the kernel: {r:?}"
        );
    }
    assert_eq!(
        on.fast, on.one_buffer.1,
        "every one-buffer datagram should take the fast path (counters grown: {}): {on:?}",
        on.counters
    );
    // Each datagram and its echo: the multi-buffer ones (and their echoes, multi-buffer on the
    // WAN port) pass netfilter, the others not.
    assert!(
        on.wire >= on.one_buffer.1 + on.multi.1,
        "the LAN port received fewer frames than datagrams were sent: {on:?}"
    );
    assert_eq!(
        on.netfilter,
        2 * on.multi.1,
        "only the multi-buffer datagrams and their echoes should pass netfilter: {on:?}"
    );
    assert_eq!(off.fast, 0, "fast path off: {off:?}");
    assert!(
        off.netfilter >= 2 * (off.one_buffer.1 + off.multi.1),
        "fast path off: the kernel forwards every datagram and echo: {off:?}"
    );
}
