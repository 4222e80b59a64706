//! A DPI tool's rule that queues only each connection's first packets (`-m connbytes
//! --connbytes 1:6 --connbytes-dir original --connbytes-mode packets -j NFQUEUE`, iptables-nft)
//! holds a connection only until conntrack has counted its sixth packet: the queue reader sees
//! exactly six packets of each connection, with the fast path on as with it off, and the rest
//! of the connection is fast-pathed.

use std::{thread::sleep, time::Duration};

use xdp_router_tests::testbed::{
    LAN_IF, Testbed, UdpEcho, any_v4, fastpath_fraction, ping_pong, ping_until, ready, udp_socket,
    wan_v4,
};

use super::{PAYLOAD, QueueReader, blast, rule_or_skip, rule_seen};

/// Packets of each connection the rule queues.
const FIRST: u64 = 6;

/// One connection to `port` from a new socket: six datagrams one by one (each echoed), then,
/// with the fast path on, until the daemon offloads it, then 1,000 datagrams in a second.
/// Returns (packets the queue reader saw of it, share of the burst's LAN wire packets XDP
/// forwarded).
fn connection(tb: &Testbed, reader: &QueueReader, port: u16, fast_path: bool) -> (u64, f64) {
    let server = wan_v4(port);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    let queued_before = reader.counted();
    let mut seq = 0u64;
    let pp = ping_pong(
        &sock,
        server,
        seq,
        FIRST,
        PAYLOAD,
        Duration::from_millis(20),
    );
    seq += pp.sent;
    assert_eq!(pp.good, FIRST, "the first packets: {pp:?}");
    if fast_path {
        // Until the daemon offloads it (it reads conntrack's counters every 250 ms).
        let offloaded = tb.daemon().status().conntrack.offloaded;
        ping_until(tb, &sock, server, &mut seq, "offloaded", |st| {
            st.conntrack.offloaded > offloaded
        });
    }
    let before = tb.snapshot();
    blast(&sock, server, &mut seq, 1000, Duration::from_secs(1));
    sleep(Duration::from_millis(300));
    let after = tb.snapshot();
    let delivered = echo.finish().received;
    assert_eq!(
        delivered, seq,
        "every datagram must arrive (the reader accepts them)"
    );
    let share = fastpath_fraction(
        after.packets_since(&before, LAN_IF, "forwarded_original"),
        after.rx_lan_since(&before),
    );
    (reader.counted() - queued_before, share)
}

#[test]
fn a_first_packets_queue_rule_sees_six_packets_and_the_rest_is_fast_pathed() {
    let test = "a_first_packets_queue_rule_sees_six_packets_and_the_rest_is_fast_pathed";
    if !ready(test) {
        return;
    }
    let (p1, p2, p3) = (6121, 6122, 6123);
    let mut tb = Testbed::new("ppf");
    let reader = match QueueReader::start_ports(&tb, 8, &[p1, p2, p3]) {
        Ok(r) => r,
        Err(e) => {
            xdp_router_tests::netns::skip(test, &format!("cannot bind NFQUEUE 8: {e}"));
            return;
        }
    };
    if !rule_or_skip(
        &tb,
        test,
        "iptables -w -I FORWARD 1 -p udp -m connbytes --connbytes 1:6 --connbytes-dir original \
         --connbytes-mode packets -j NFQUEUE --queue-num 8",
    ) {
        return;
    }
    tb.start_daemon_with("per_packet_rules = \"hold\"\n");
    let st = rule_seen(&tb, "connbytes", true);
    eprintln!("{:?}", st.per_packet.rules);
    // The kernel alone: the oracle.
    tb.daemon().set_fastpath(false);
    let (off, off_share) = connection(&tb, &reader, p1, false);
    tb.daemon().set_fastpath(true);
    let (on, on_share) = connection(&tb, &reader, p2, true);
    let (on2, on2_share) = connection(&tb, &reader, p3, true);
    eprintln!(
        "queued per connection: fast path off {off} ({:.1} % of the burst by XDP), on {on} \
         ({:.1} %) and {on2} ({:.1} %)",
        off_share * 100.0,
        on_share * 100.0,
        on2_share * 100.0
    );
    assert_eq!(off, FIRST, "the kernel alone queues the first {FIRST}");
    assert_eq!((on, on2), (FIRST, FIRST), "with the fast path on");
    assert_eq!(off_share, 0.0);
    assert!(
        on_share >= 0.9 && on2_share >= 0.9,
        "the rest of each connection: {:.1} % and {:.1} % fast-pathed",
        on_share * 100.0,
        on2_share * 100.0
    );
}
