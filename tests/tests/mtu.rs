//! An MTU mismatch on the path, as in the kernel flowtable selftest: the router's WAN link has
//! an MTU of 1280, its LAN 1500. A LAN host's datagram that is too big for the WAN and may not
//! be fragmented (DF, the Linux default for UDP) must meet the kernel, which drops it and
//! answers "fragmentation needed" (PMTU discovery); the host then fragments what it sends and
//! every later datagram arrives. With the fast path on, the same must happen as with it off:
//! the offloaded flow's oversized packet goes to the kernel (`frag_needed`) instead of being
//! forwarded or lost silently.

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use xdp_router_tests::testbed::{
    HOST_IF, LAN_IF, Testbed, UdpEcho, WAN_HOST_V4, WAN_IF, ping_pong, ready, udp_socket, wan_v4,
};

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
    let sock = udp_socket(&tb.lan, SocketAddr::new(IpAddr::from([0, 0, 0, 0]), 0), 64);
    // Offload (and arm) the flow with small datagrams, then measure them.
    ping_pong(&sock, server, 0, 5, 100, Duration::from_millis(100));
    std::thread::sleep(Duration::from_millis(2500));
    ping_pong(&sock, server, 5, 3, 100, Duration::from_millis(20));
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
