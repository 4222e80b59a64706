//! Route, neighbour and forwarding changes reach offloaded flows.

use super::*;

/// Test 2: the route to the WAN host moves to a third, unmanaged interface. The offloaded
/// connection is withdrawn within 2 s and keeps working through the kernel (counted on the new
/// interface; its replies, still arriving on the managed WAN interface, are not fast-pathed
/// either). With the route put back, a new connection is offloaded again.
///
/// IPv6, routed without NAT: for a masqueraded IPv4 connection the kernel itself kills the
/// conntrack entry and drops the packet when its output interface changes
/// (`nf_nat_oif_changed`), so only IPv6 shows one connection carrying on over the new path.
#[test]
fn route_via_unmanaged_interface_withdraws_the_flow() {
    if !ready("route_via_unmanaged_interface_withdraws_the_flow") {
        return;
    }
    let mut tb = Testbed::new("pa2");
    // router eth2 (fd00:3::1, unmanaged) ⇄ eth1 (fd00:3::2) of the WAN host: a second path.
    const ALT_IF: &str = "eth2";
    const ALT_HOST_IF: &str = "eth1";
    let alt_gw = Ipv6Addr::new(0xfd00, 3, 0, 0, 0, 0, 0, 2);
    tb.router.veth(ALT_IF, &tb.wan, ALT_HOST_IF);
    tb.router.sh(&format!(
        "ip addr add fd00:3::1/64 dev {ALT_IF} nodad
         ethtool -K {ALT_IF} tx off rx off gro off gso off tso off >/dev/null"
    ));
    tb.wan.sh(&format!(
        "ip addr add {alt_gw}/64 dev {ALT_HOST_IF} nodad
         ethtool -K {ALT_HOST_IF} tx off rx off gro on >/dev/null"
    ));
    tb.start_daemon();
    let server = wan_v6(7102);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, any_v6(), 64);
    let mut seq = 0;
    offload_udp(&tb, &sock, server, &mut seq);
    udp_is_fast_pathed(&tb, &sock, server, &mut seq, LAN_IF, WAN_IF);

    let host_route = format!("{WAN_HOST_V6}/128");
    let before_move = tb.daemon().status();
    let t0 = Instant::now();
    tb.router.exec_ok(
        "ip",
        &[
            "-6",
            "route",
            "replace",
            &host_route,
            "via",
            &alt_gw.to_string(),
            "dev",
            ALT_IF,
        ],
    );
    let (took, st) = wait_withdrawn(&tb, t0, &format!("route to {WAN_HOST_V6} via {ALT_IF}"));
    let not_managed = skipped(&st, "path_not_managed") - skipped(&before_move, "path_not_managed");
    eprintln!(
        "route via {ALT_IF}: withdrawn after {took:?} (removed_total +{}, path_not_managed \
         +{not_managed})",
        st.conntrack.removed_total - before_move.conntrack.removed_total
    );
    assert!(
        not_managed >= 1,
        "withdrawn, but not as path_not_managed: {:?}",
        st.conntrack
    );

    let alt_tx = link_stat(&tb.router, ALT_IF, "tx_packets");
    let alt_host_rx = link_stat(&tb.wan, ALT_HOST_IF, "rx_packets");
    let before = tb.snapshot();
    let pp = ping_pong(&sock, server, seq, 50, DGRAM, TICK);
    seq += pp.sent;
    let after = tb.snapshot();
    let alt_tx = link_stat(&tb.router, ALT_IF, "tx_packets") - alt_tx;
    let alt_host_rx = link_stat(&tb.wan, ALT_HOST_IF, "rx_packets") - alt_host_rx;
    let fast = after.forwarded_since(&before);
    let no_flow_wan = after.packets_since(&before, WAN_IF, "no_flow");
    eprintln!(
        "through the kernel: {} sent, {} good; {ALT_IF} sent {alt_tx}, the WAN host's \
         {ALT_HOST_IF} got {alt_host_rx}; replies in on {WAN_IF}: {} ({no_flow_wan} no_flow); \
         fast path {fast}",
        pp.sent,
        pp.good,
        after.rx_wan_since(&before)
    );
    assert_eq!(
        (pp.good, pp.lost, pp.corrupt),
        (pp.sent, 0, 0),
        "the connection should keep working through the kernel: {pp:?}"
    );
    assert!(
        alt_tx >= pp.sent && alt_host_rx >= pp.sent,
        "{ALT_IF} sent {alt_tx} and the WAN host's {ALT_HOST_IF} received {alt_host_rx}, want \
         ≥ {} each",
        pp.sent
    );
    assert_eq!(
        fast, 0,
        "the fast path forwarded {fast} packets after withdrawal"
    );
    assert!(
        no_flow_wan >= pp.sent,
        "{no_flow_wan} replies on {WAN_IF} counted no_flow, want ≥ {}",
        pp.sent
    );

    // Route back: the connection that was taken back returns to the fast path by itself (the
    // daemon re-checks withdrawn connections after every routing change), and new connections
    // go through the managed WAN and are offloaded too.
    let t1 = Instant::now();
    tb.router
        .exec_ok("ip", &["-6", "route", "del", &host_route]);
    loop {
        let st = tb.daemon().status();
        if st.flows.ipv6 >= 2 {
            eprintln!(
                "route back: the same connection offloaded again after {:?}",
                t1.elapsed()
            );
            break;
        }
        assert!(
            t1.elapsed() < WITHDRAW_WITHIN,
            "the withdrawn connection was not offloaded again within {WITHDRAW_WITHIN:?}: {:?}",
            st.conntrack
        );
        sleep(Duration::from_millis(20));
    }
    // Re-offloaded: each direction is armed by one kernel-forwarded packet first.
    let arm = ping_pong(&sock, server, seq, 1, DGRAM, TICK);
    seq += arm.sent;
    assert_eq!(
        arm.good, arm.sent,
        "arming after the route came back: {arm:?}"
    );
    let before = tb.snapshot();
    let pp = ping_pong(&sock, server, seq, 20, DGRAM, TICK);
    seq += pp.sent;
    let after = tb.snapshot();
    let fast = after.forwarded_since(&before);
    eprintln!(
        "after the route came back: {} sent, {} good, fast path {fast}",
        pp.sent, pp.good
    );
    assert_eq!(pp.good, pp.sent, "after the route came back: {pp:?}");
    assert!(
        fast >= 2 * pp.sent,
        "the re-offloaded connection carried {fast} fast-path packets for {} round trips",
        pp.sent
    );
    let _ = seq;
    let alt_tx = link_stat(&tb.router, ALT_IF, "tx_packets");
    let (before, after) = bulk_is_fast_pathed(&tb, wan_v6(5102), LAN_HOST_V6.into());
    let alt_tx = link_stat(&tb.router, ALT_IF, "tx_packets") - alt_tx;
    let offloaded =
        after.status.conntrack.offloaded_total - before.status.conntrack.offloaded_total;
    assert!(
        offloaded >= 1,
        "no new connection offloaded after the route came back: {:?}",
        after.status.conntrack
    );
    assert!(
        alt_tx < 10,
        "{ALT_IF} sent {alt_tx} packets during the transfer: the route did not come back"
    );
    drop(echo);
}

/// Test 5: the per-flow FIB cache follows the kernel. With answers kept up to 10 s
/// (`fib_cache_ms = 10000`), an offloaded UDP connection must still see, within a fraction of a
/// second, (a) the next hop's MAC changing (`ip neigh replace`: the fast path must send to the
/// new MAC, here a bogus one the WAN host ignores, then to the real one again) and (b)
/// forwarding switched off on the ingress interface (a netconf notification: the fast path must
/// stop forwarding, as the kernel does, and resume when it is back on). Without the daemon's
/// invalidation the cached answer would be used for 10 s and every check below would fail.
#[test]
fn fib_cache_follows_neighbour_and_forwarding_changes() {
    if !ready("paths::fib_cache_follows_neighbour_and_forwarding_changes") {
        return;
    }
    let mut tb = Testbed::new("xr-pc");
    tb.start_daemon_with("fib_cache_ms = 10000\n");
    let server = wan_v4(7105);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    let mut seq = 0;
    offload_udp(&tb, &sock, server, &mut seq);
    udp_is_fast_pathed(&tb, &sock, server, &mut seq, LAN_IF, WAN_IF);
    let st = tb.daemon().status();
    assert_eq!(st.fib_cache.max_age_ms, 10_000, "{:?}", st.fib_cache);
    let real_mac = tb
        .wan
        .exec_ok("cat", &[&format!("/sys/class/net/{HOST_IF}/address")])
        .trim()
        .to_owned();
    // Settle: no notification pending, then the changes one by one.
    sleep(Duration::from_millis(200));

    // (a) The next hop's MAC changes.
    let inval_before = tb.daemon().status().fib_cache.invalidations;
    let set_neigh = |mac: &str| {
        tb.router.exec_ok(
            "ip",
            &[
                "neigh",
                "replace",
                &WAN_HOST_V4.to_string(),
                "lladdr",
                mac,
                "dev",
                WAN_IF,
                "nud",
                "permanent",
            ],
        );
    };
    set_neigh("02:00:5e:00:53:99");
    sleep(Duration::from_millis(150));
    let before = tb.snapshot();
    let wan_rx_before = link_stat(&tb.wan, HOST_IF, "rx_packets");
    let pp = ping_pong(&sock, server, seq, 3, DGRAM, TICK);
    seq += pp.sent;
    let after = tb.snapshot();
    let orig = after.packets_since(&before, LAN_IF, "forwarded_original");
    let wan_rx = link_stat(&tb.wan, HOST_IF, "rx_packets") - wan_rx_before;
    let inval = tb.daemon().status().fib_cache.invalidations - inval_before;
    eprintln!(
        "neighbour MAC changed: {} of {} echoed, {orig} fast-pathed, {wan_rx} frames reached the \
         WAN veth (dropped there as not for its MAC), {inval} invalidations",
        pp.good, pp.sent
    );
    assert!(
        inval >= 1,
        "the neighbour change did not invalidate the FIB cache"
    );
    assert_eq!(
        (pp.good, orig),
        (0, pp.sent),
        "after the next hop's MAC changed, the fast path must send to the new MAC (which the \
         WAN host ignores): {pp:?}"
    );
    set_neigh(&real_mac);
    sleep(Duration::from_millis(150));
    udp_is_fast_pathed(&tb, &sock, server, &mut seq, LAN_IF, WAN_IF);

    // (b) Forwarding switched off on the ingress interface.
    let sysctl = |on: u8| {
        tb.router.exec_ok(
            "sysctl",
            &["-qw", &format!("net.ipv4.conf.{LAN_IF}.forwarding={on}")],
        );
    };
    sysctl(0);
    sleep(Duration::from_millis(150));
    let before = tb.snapshot();
    let pp = ping_pong(&sock, server, seq, 3, DGRAM, TICK);
    seq += pp.sent;
    let after = tb.snapshot();
    let orig = after.packets_since(&before, LAN_IF, "forwarded_original");
    let refused = after.packets_since(&before, LAN_IF, "fib_not_forwardable");
    eprintln!(
        "forwarding off on {LAN_IF}: {} of {} echoed, {orig} fast-pathed, {refused} counted \
         fib_not_forwardable",
        pp.good, pp.sent
    );
    assert_eq!(
        (pp.good, orig, refused),
        (0, 0, pp.sent),
        "with forwarding off the fast path must hand every datagram to the kernel: {pp:?}"
    );
    sysctl(1);
    sleep(Duration::from_millis(150));
    udp_is_fast_pathed(&tb, &sock, server, &mut seq, LAN_IF, WAN_IF);
    drop(echo);
}
