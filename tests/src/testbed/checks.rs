//! The checks the e2e tests share: waiting, transfers and ping-pongs that must be fast-pathed
//! (or left to the kernel), intact data, and the addresses they use.

use std::{
    net::{IpAddr, SocketAddr, UdpSocket},
    thread::sleep,
    time::{Duration, Instant},
};

use super::{
    addrs::{LAN_IF, ROUTER_WAN_V4, WAN_HOST_V4, WAN_HOST_V6, WAN_IF},
    status::{Snapshot, Status, fastpath_fraction},
    topology::Testbed,
    traffic::{Plan, Transfer, TransferResult, UdpEcho, download_offloaded, ping_pong, udp_socket},
};

/// Polls `cond` every 50 ms for up to `timeout`; returns whether it became true.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        sleep(Duration::from_millis(50));
    }
}

/// Share of the LAN host's packets the fast path forwarded over `window`, measured against the
/// packets the router's LAN port received on the wire, and that wire count.
pub fn lan_fast_share(tb: &Testbed, window: Duration) -> (f64, u64) {
    let before: Snapshot = tb.snapshot();
    sleep(window);
    let after = tb.snapshot();
    let wire = after.rx_lan_since(&before);
    let fwd = after.packets_since(&before, LAN_IF, "forwarded_original");
    (fastpath_fraction(fwd, wire), wire)
}

/// A full-size TCP segment on the wire (MTU 1500 + Ethernet header): a transfer of N bytes
/// needs at least N / this wire packets (fewer would mean GRO merged them and counters lie).
pub const MAX_FRAME: u64 = 1514;

/// LAN→WAN TCP transfer of `bytes` to `server` ([`Transfer::start_offloaded`]: the bulk waits
/// until the daemon lists the connection): the data arrives intact, the WAN host sees `peer`
/// as the client, and ≥ 90 % of the LAN wire packets were forwarded by the fast path.
/// Returns the counters before and after, for further checks.
pub fn bulk_is_fast_pathed(
    tb: &Testbed,
    server: SocketAddr,
    peer: IpAddr,
    bytes: u64,
) -> (Snapshot, Snapshot) {
    let before = tb.snapshot();
    let r = Transfer::start_offloaded(tb, server, Plan { bytes, rate: None }).finish();
    let after = tb.snapshot();
    assert_intact(&r);
    assert_eq!(
        r.peer.ip(),
        peer,
        "the WAN host saw {} as the client",
        r.peer
    );
    let wire = after.rx_lan_since(&before);
    let fwd = after.packets_since(&before, LAN_IF, "forwarded_original");
    let frac = fastpath_fraction(fwd, wire);
    eprintln!(
        "TCP {server}: {wire} packets in on {LAN_IF}, {fwd} fast-pathed ({:.1} %)",
        frac * 100.0
    );
    assert!(
        wire >= bytes / MAX_FRAME,
        "only {wire} packets received on {LAN_IF} for {bytes} bytes: GRO on the router veth?"
    );
    assert!(
        frac >= 0.9,
        "only {fwd} of {wire} LAN packets ({:.1} %) were forwarded by the fast path (want ≥ 90 %)",
        frac * 100.0
    );
    (before, after)
}

/// WAN→LAN TCP download of `bytes` from `server` through the reverse NAT
/// ([`download_offloaded`]: the bulk waits until the daemon lists the connection): the data
/// arrives intact and ≥ 90 % of the WAN wire packets were forwarded by the fast path. Returns
/// the counters before and after, for further checks.
pub fn download_is_fast_pathed(
    tb: &Testbed,
    server: SocketAddr,
    bytes: u64,
) -> (Snapshot, Snapshot) {
    let before = tb.snapshot();
    let (sent, received) = download_offloaded(tb, server, bytes);
    let after = tb.snapshot();
    assert_eq!(
        received, sent,
        "download {server}: bytes and SHA-256 (got, sent)"
    );
    let wire = after.rx_wan_since(&before);
    let fwd = after.packets_since(&before, WAN_IF, "forwarded_reply");
    let frac = fastpath_fraction(fwd, wire);
    eprintln!(
        "TCP download {server}: {wire} packets in on {WAN_IF}, {fwd} fast-pathed ({:.1} %)",
        frac * 100.0
    );
    assert!(
        wire >= bytes / MAX_FRAME,
        "only {wire} packets received on {WAN_IF} for {bytes} bytes: GRO on the router veth?"
    );
    assert!(
        frac >= 0.9,
        "only {fwd} of {wire} WAN packets ({:.1} %) were forwarded by the fast path (want ≥ 90 %)",
        frac * 100.0
    );
    (before, after)
}

/// The WAN host's IPv4 address with `port`.
pub fn wan_v4(port: u16) -> SocketAddr {
    SocketAddr::new(WAN_HOST_V4.into(), port)
}

/// The WAN host's IPv6 address with `port`.
pub fn wan_v6(port: u16) -> SocketAddr {
    SocketAddr::new(WAN_HOST_V6.into(), port)
}

/// Any IPv4 address, any port (a client's bind address).
pub fn any_v4() -> SocketAddr {
    SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), 0)
}

/// Any IPv6 address, any port (a client's bind address).
pub fn any_v6() -> SocketAddr {
    SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), 0)
}

/// The data arrived whole: same byte count and SHA-256 at both ends.
pub fn assert_intact(r: &TransferResult) {
    assert_eq!(
        r.received.bytes, r.sent.bytes,
        "receiver got {} bytes, sender sent {}",
        r.received.bytes, r.sent.bytes
    );
    assert_eq!(
        r.received.sha256,
        r.sent.sha256,
        "SHA-256 differs: sent {} received {}",
        hex(&r.sent.sha256),
        hex(&r.received.sha256)
    );
}

/// Lowercase hex of a digest (for messages).
pub fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Datagram size of [`offload_udp`] / [`udp_is_fast_pathed`].
pub const PING_DGRAM: usize = 200;
/// Interval of their ping-pong (50 datagrams per second).
pub const PING_TICK: Duration = Duration::from_millis(20);

/// Ping-pongs on `sock` until the daemon has offloaded exactly this one UDP connection (both
/// directions), 8 s at most: conntrack marks UDP ASSURED only after 2 s with replies. Every
/// datagram must come back while it waits.
pub fn offload_udp(tb: &Testbed, sock: &UdpSocket, server: SocketAddr, seq: &mut u64) {
    ping_until(tb, sock, server, seq, "offloaded", |st| {
        st.conntrack.offloaded == 1 && st.flows.ipv4 + st.flows.ipv6 == 2
    });
}

/// Ping-pongs on `sock` until `done` holds for the daemon's status (`what` it waits for, for
/// the failure message), 8 s at most (times [`time_scale`]); every datagram must come back
/// while it waits.
pub fn ping_until(
    tb: &Testbed,
    sock: &UdpSocket,
    server: SocketAddr,
    seq: &mut u64,
    what: &str,
    done: impl Fn(&Status) -> bool,
) {
    let limit = Duration::from_secs(8) * time_scale();
    let deadline = Instant::now() + limit;
    loop {
        let pp = ping_pong(sock, server, *seq, 10, PING_DGRAM, PING_TICK);
        *seq += pp.sent;
        assert_eq!(
            (pp.good, pp.lost, pp.corrupt),
            (pp.sent, 0, 0),
            "before {what}: {pp:?}"
        );
        let st = tb.daemon().status();
        if done(&st) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "UDP to {server} not {what} within {limit:?}: {:?} {:?} {:?}\nconntrack:\n{}\nflows: {}\n{}",
            st.flows,
            st.conntrack,
            st.per_packet,
            tb.router.exec_ok("conntrack", &["-L", "-p", "udp"]),
            tb.daemon().flows_json(),
            tb.daemon().log_tail()
        );
    }
}

/// Sends 20 datagrams on the offloaded connection and checks the fast path forwarded every one
/// of them, both ways: the datagrams arrive at the router on `orig_if`, the replies on
/// `reply_if`.
pub fn udp_is_fast_pathed(
    tb: &Testbed,
    sock: &UdpSocket,
    server: SocketAddr,
    seq: &mut u64,
    orig_if: &str,
    reply_if: &str,
) {
    // A newly (re-)offloaded direction is armed by its first packet the kernel forwards.
    let arm = ping_pong(sock, server, *seq, 1, PING_DGRAM, PING_TICK);
    *seq += arm.sent;
    assert_eq!((arm.good, arm.lost), (arm.sent, 0), "arming: {arm:?}");
    let before = tb.snapshot();
    let pp = ping_pong(sock, server, *seq, 20, PING_DGRAM, PING_TICK);
    *seq += pp.sent;
    let after = tb.snapshot();
    let orig = after.packets_since(&before, orig_if, "forwarded_original");
    let reply = after.packets_since(&before, reply_if, "forwarded_reply");
    eprintln!(
        "offloaded UDP: {} sent, {} good; fast path {orig} original, {reply} reply",
        pp.sent, pp.good
    );
    assert_eq!((pp.good, pp.lost), (pp.sent, 0), "offloaded: {pp:?}");
    assert_eq!(
        (orig, reply),
        (pp.sent, pp.sent),
        "the fast path should forward all {} datagrams each way while offloaded",
        pp.sent
    );
}

/// The config's `[[interface]]` tables for `wan` (role wan) and [`LAN_IF`] (role lan), for
/// [`Testbed::start_daemon_config`].
pub fn wan_lan_interfaces(wan: &str) -> String {
    interfaces_config(wan, LAN_IF)
}

/// The config's `[[interface]]` tables for `wan` (role wan) and `lan` (role lan).
pub fn interfaces_config(wan: &str, lan: &str) -> String {
    format!(
        "[[interface]]\nname = \"{wan}\"\nrole = \"wan\"\n\
         [[interface]]\nname = \"{lan}\"\nrole = \"lan\"\n"
    )
}

/// Moves the router's MASQUERADE and its `lan` → WAN FORWARD accept from [`WAN_IF`] onto
/// `wan`, a device that encapsulates over it (a VLAN, a tunnel), and checks that the LAN host
/// reaches the WAN host over IPv4 and IPv6 (`what` names the path when it does not).
pub fn route_wan_through(tb: &Testbed, lan: &str, wan: &str, what: &str) {
    tb.router.sh(&format!(
        "iptables -w -t nat -D POSTROUTING -o {WAN_IF} -j MASQUERADE
         iptables -w -t nat -A POSTROUTING -o {wan} -j MASQUERADE
         for t in iptables ip6tables; do
           $t -w -A FORWARD -i {lan} -o {wan} -j ACCEPT
         done"
    ));
    tb.lan.sh(&format!(
        "for i in 1 2 3 4 5; do ping -c1 -W1 {WAN_HOST_V4} >/dev/null && break; done
         for i in 1 2 3 4 5; do ping -6 -c1 -W1 {WAN_HOST_V6} >/dev/null && exit 0; done
         echo 'no path LAN -> WAN {what}' >&2; exit 1"
    ));
}

/// With the Ethernet port under an encapsulation (VLAN, PPPoE) managed as the WAN and the
/// encapsulating device not: between `before` and `after`, `frames` (e.g. "tagged") were counted
/// under `reason` (`not_ip`, `vlan_unknown`) on [`WAN_IF`], connections were skipped as
/// `path_not_managed`, and no packet was counted as forwarded.
pub fn assert_encapsulated_wan_left_to_kernel(
    before: &Status,
    after: &Status,
    frames: &str,
    reason: &str,
) {
    let d =
        |iface: &str, reason: &str| after.packets(iface, reason) - before.packets(iface, reason);
    let passed = d(WAN_IF, reason);
    let forwarded = d(LAN_IF, "forwarded_original") + d(WAN_IF, "forwarded_reply");
    let not_managed = after
        .conntrack
        .skipped
        .get("path_not_managed")
        .copied()
        .unwrap_or(0);
    eprintln!(
        "{frames} frames passed on {WAN_IF} ({reason}): {passed}; connections not offloaded \
         (path_not_managed): {not_managed}; packets forwarded by XDP: {forwarded}"
    );
    assert!(
        passed > 0,
        "no {frames} frame counted {reason} on {WAN_IF}: {after:?}"
    );
    assert!(
        not_managed > 0,
        "no connection skipped as path_not_managed: {after:?}"
    );
    assert_eq!(
        forwarded, 0,
        "packets counted as forwarded although the {frames} path is not managed"
    );
}

/// UDP exchanges (warm-up, a pause for the daemon to offload the flow, then 200 more) and a
/// 2 MiB TCP transfer from the LAN host to the WAN host on `port` and `port + 1`: every datagram
/// answered intact, the transfer intact and masqueraded to the router's WAN address. Returns
/// the daemon's status before and after. For topologies other than the plain one (`what` names
/// it in failures), where the fast path may not carry everything but nothing may break.
pub fn udp_and_tcp_are_intact(tb: &Testbed, port: u16, what: &str) -> (Status, Status) {
    let before = tb.daemon().status();
    let server = wan_v4(port);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, SocketAddr::from(([0, 0, 0, 0], 0)), 64);
    let warmup = ping_pong(&sock, server, 0, 5, 200, Duration::from_millis(100));
    sleep(Duration::from_millis(2500));
    let run = ping_pong(&sock, server, 5, 200, 200, Duration::from_millis(2));
    let stats = echo.finish();
    assert!(
        warmup.good == warmup.sent && run.good == run.sent && stats.corrupt == 0,
        "UDP over {what}: warm-up {warmup:?}, run {run:?}, server {stats:?}"
    );
    let r = Transfer::start(
        tb,
        wan_v4(port + 1),
        Plan {
            bytes: 2 << 20,
            rate: None,
        },
    )
    .finish();
    assert_intact(&r);
    assert_eq!(
        r.peer.ip(),
        IpAddr::from(ROUTER_WAN_V4),
        "TCP over {what}: not masqueraded to the router's WAN address"
    );
    (before, tb.daemon().status())
}

/// Ping-pongs from `sock` until the daemon has the connection to `server` offloaded (both
/// directions in the flow map of its family; 8 s at most).
pub fn offload_udp_family(tb: &Testbed, sock: &UdpSocket, server: SocketAddr, seq: &mut u64) {
    let v6 = server.is_ipv6();
    ping_until(tb, sock, server, seq, "offloaded", |st| {
        (if v6 { st.flows.ipv6 } else { st.flows.ipv4 }) >= 2
    });
}

/// What one measured exchange did.
pub struct Measured {
    pub sent: u64,
    /// Fast-path forwarded, original direction (counted on the LAN ingress).
    pub orig: u64,
    /// Fast-path forwarded, reply direction (counted on the WAN device the flow enters by).
    pub reply: u64,
    /// Packets on the router's LAN and WAN wires (rx_packets; GRO is off on them).
    pub wire_lan: u64,
    pub wire_wan: u64,
    /// FORWARD ESTABLISHED rule increase.
    pub established: u64,
    /// Every daemon counter that grew, `interface/reason +N` (where the packets went).
    pub counted: String,
}

/// 50 datagrams each way on the connection of `sock` (armed first), every one answered intact;
/// the XDP counters of the original direction on `lan` and of the reply on `wan` (the device
/// the kernel sees the replies arrive on: a VLAN or PPP device).
pub fn measure_udp(
    tb: &Testbed,
    sock: &UdpSocket,
    server: SocketAddr,
    seq: &mut u64,
    lan: &str,
    wan: &str,
) -> Measured {
    // A newly offloaded direction is armed by its first packet the kernel forwards.
    let arm = ping_pong(sock, server, *seq, 2, PING_DGRAM, PING_TICK);
    *seq += arm.sent;
    let before = tb.snapshot();
    let pp = ping_pong(sock, server, *seq, 50, PING_DGRAM, PING_TICK);
    *seq += pp.sent;
    let after = tb.snapshot();
    assert_eq!(
        (pp.good, pp.lost, pp.corrupt),
        (pp.sent, 0, 0),
        "every datagram must come back intact: {pp:?}"
    );
    Measured {
        sent: pp.sent,
        orig: after.packets_since(&before, lan, "forwarded_original"),
        reply: after.packets_since(&before, wan, "forwarded_reply"),
        wire_lan: after.rx_lan_since(&before),
        wire_wan: after.rx_wan_since(&before),
        established: after.established_since(&before, server.is_ipv6()),
        counted: after.grown_since(&before),
    }
}

/// UDP over IPv4 and IPv6 (servers on `port` and `port + 1`) and a 2 MiB TCP transfer over
/// IPv4 (`port + 3`) from the LAN host to the WAN host through a WAN that encapsulates (a VLAN,
/// a PPPoE session; `what` names it in the printed lines): the LAN side's packets are counted
/// on `lan` (where XDP runs: the LAN device or bridge port), the replies on `wan` (the device
/// the kernel sees them arrive on). Every datagram is fast-pathed both ways with netfilter's
/// ESTABLISHED rule not rising, then the negative control (fast path off) sends the same
/// exchange through netfilter; TCP arrives intact, masqueraded, fast-pathed both ways.
pub fn traffic_is_fast_pathed(tb: &Testbed, port: u16, lan: &str, wan: &str, what: &str) {
    for (server, sock) in [
        (wan_v4(port), udp_socket(&tb.lan, any_v4(), 64)),
        (wan_v6(port + 1), udp_socket(&tb.lan, any_v6(), 64)),
    ] {
        let echo = UdpEcho::start(&tb.wan, server);
        let mut seq = 0;
        offload_udp_family(tb, &sock, server, &mut seq);
        let m = measure_udp(tb, &sock, server, &mut seq, lan, wan);
        println!(
            "{server} {what}: {} datagrams each way; fast path forwarded {} original (on {lan}), \
             {} reply (on {wan}); wire packets {} on {}, {} on {}: fast-path share \
             {:.0} % / {:.0} %; FORWARD ESTABLISHED +{}",
            m.sent,
            m.orig,
            m.reply,
            m.wire_lan,
            tb.lan_wire,
            m.wire_wan,
            tb.wan_wire,
            100.0 * m.orig as f64 / m.wire_lan.max(1) as f64,
            100.0 * m.reply as f64 / m.wire_wan.max(1) as f64,
            m.established
        );
        assert_eq!(
            (m.orig, m.reply),
            (m.sent, m.sent),
            "every datagram fast-pathed both ways; counted: {}",
            m.counted
        );
        assert!(
            m.wire_wan >= m.sent && m.wire_lan >= m.sent,
            "fewer wire packets than datagrams: GRO on the router's veths?"
        );
        assert!(
            m.established <= 2,
            "netfilter saw {} packets of the offloaded flow",
            m.established
        );

        // Negative control: the fast path off, the same exchange goes through netfilter.
        tb.daemon().set_fastpath(false);
        let off = measure_udp(tb, &sock, server, &mut seq, lan, wan);
        tb.daemon().set_fastpath(true);
        println!(
            "{server} {what}, fast path off: fast path forwarded {} original, {} reply; FORWARD \
             ESTABLISHED +{} for {} datagrams each way",
            off.orig, off.reply, off.established, off.sent
        );
        assert_eq!((off.orig, off.reply), (0, 0), "fast path off");
        assert!(
            off.established >= 2 * off.sent,
            "with the fast path off netfilter must see every packet: +{}",
            off.established
        );
        assert_eq!(echo.finish().corrupt, 0);
    }

    // TCP: a 2 MiB transfer, intact and masqueraded; most of it fast-pathed once established.
    let before = tb.snapshot();
    let r = Transfer::start(
        tb,
        wan_v4(port + 3),
        Plan {
            bytes: 2 << 20,
            rate: None,
        },
    )
    .finish();
    let after = tb.snapshot();
    assert_intact(&r);
    assert_eq!(r.peer.ip(), IpAddr::from(ROUTER_WAN_V4), "not masqueraded");
    let orig = after.packets_since(&before, lan, "forwarded_original");
    let reply = after.packets_since(&before, wan, "forwarded_reply");
    let wire = after.rx_lan_since(&before) + after.rx_wan_since(&before);
    println!(
        "TCP 2 MiB {what}: fast path forwarded {orig} original + {reply} reply of {wire} \
         wire packets ({:.0} %; on TC a GRO aggregate counts once), FORWARD ESTABLISHED +{}; \
         counted: {}",
        100.0 * (orig + reply) as f64 / wire.max(1) as f64,
        after.established_since(&before, false),
        after.grown_since(&before)
    );
    assert!(
        orig > 0 && reply > 0,
        "TCP not fast-pathed both ways {what}: {orig} original, {reply} reply"
    );
}

/// How many times longer than on this machine a prompt reaction may take where the tests run:
/// `XDP_ROUTER_TIME_SCALE` (both guests, emulated CPUs, set 5), else 1. Limits that stand for
/// "promptly" (a ruleset change stopping a stream within 1 s, an offload within 8 s) are
/// multiplied by it; they check that something happens, not how fast.
pub fn time_scale() -> u32 {
    std::env::var("XDP_ROUTER_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n >= 1)
        .unwrap_or(1)
}
