//! A rule narrowed by its port test holds only its port's connections: the other ports' streams
//! stay on the fast path, and the same rule for every UDP port (the negative control) holds them.

use std::{
    thread::sleep,
    time::{Duration, Instant},
};

use xdp_router_tests::testbed::{
    LAN_IF, Testbed, UdpEcho, any_v4, fastpath_fraction, offload_udp, ready, udp_socket, wan_v4,
};

use super::{BURST, LIMIT, RATE, SECS, assert_limited, blast, held_udp, rule_or_skip, rule_seen};

/// What [`one_port_run`] measured: the other port's stream, then the rule's port's.
struct OnePort {
    /// Share of the LAN wire packets of the other port's stream that XDP forwarded.
    other_share: f64,
    /// Datagrams per second of the rule's port's stream the WAN host received, and sent.
    limited_pps: f64,
    limited_sent_pps: f64,
    /// LAN packets of the rule's port's stream that XDP forwarded.
    limited_fwd: u64,
    /// The connections `status` says the hashlimit rule holds, and the same from `/metrics`.
    rule_held: (Option<u64>, Option<f64>),
}

/// A hashlimit DROP rule first in FORWARD for UDP to `ports.0` (`dport`) or to every port,
/// then two UDP streams at [`RATE`] for [`SECS`] s one after the other: to `ports.1` (another
/// port), then to `ports.0`. `None` when the test cannot run here.
fn one_port_run(test: &str, tag: &str, ports: (u16, u16), dport: bool) -> Option<OnePort> {
    let mut tb = Testbed::new(tag);
    let port_test = if dport {
        format!("--dport {}", ports.0)
    } else {
        String::new()
    };
    if !rule_or_skip(
        &tb,
        test,
        &format!(
            "iptables -w -I FORWARD 1 -p udp {port_test} -m hashlimit --hashlimit-above \
             {LIMIT}/sec --hashlimit-burst {BURST} --hashlimit-mode srcip --hashlimit-name t \
             -j DROP"
        ),
    ) {
        return None;
    }
    tb.start_daemon_with("per_packet_rules = \"hold\"\n");
    rule_seen(&tb, "hashlimit", true);
    let (limited, other) = (wan_v4(ports.0), wan_v4(ports.1));
    let echo_limited = UdpEcho::start(&tb.wan, limited);
    let _echo_other = UdpEcho::start(&tb.wan, other);
    let (sock_limited, sock_other) = (
        udp_socket(&tb.lan, any_v4(), 64),
        udp_socket(&tb.lan, any_v4(), 64),
    );
    let (mut seq_other, mut seq_limited) = (0u64, 0u64);
    if dport {
        offload_udp(&tb, &sock_other, other, &mut seq_other);
    } else {
        held_udp(&tb, &sock_other, other, &mut seq_other, 1);
    }
    let before = tb.snapshot();
    blast(
        &sock_other,
        other,
        &mut seq_other,
        RATE,
        Duration::from_secs(SECS),
    );
    sleep(Duration::from_millis(200));
    let after = tb.snapshot();
    let other_share = fastpath_fraction(
        after.packets_since(&before, LAN_IF, "forwarded_original"),
        after.rx_lan_since(&before),
    );
    held_udp(
        &tb,
        &sock_limited,
        limited,
        &mut seq_limited,
        if dport { 1 } else { 2 },
    );
    let before_rule = seq_limited;
    let before = tb.snapshot();
    let t0 = Instant::now();
    let sent = blast(
        &sock_limited,
        limited,
        &mut seq_limited,
        RATE,
        Duration::from_secs(SECS),
    );
    let elapsed = t0.elapsed().as_secs_f64();
    sleep(Duration::from_millis(200));
    let after = tb.snapshot();
    let delivered = echo_limited.finish().received.saturating_sub(before_rule);
    let r = OnePort {
        other_share,
        limited_pps: delivered as f64 / elapsed,
        limited_sent_pps: sent as f64 / elapsed,
        limited_fwd: after.packets_since(&before, LAN_IF, "forwarded_original"),
        rule_held: rule_held(&tb),
    };
    let status = tb.daemon().ctl(&["status"]).unwrap_or_default();
    eprintln!(
        "hashlimit on UDP {}: port {}: {:.1} % fast-pathed; port {}: sent {:.0} pkt/s, \
         delivered {:.0} pkt/s, {} forwarded by XDP; status: {}",
        if dport {
            format!("port {}", ports.0)
        } else {
            "every port".into()
        },
        ports.1,
        r.other_share * 100.0,
        ports.0,
        r.limited_sent_pps,
        r.limited_pps,
        r.limited_fwd,
        status
            .lines()
            .find(|l| l.contains("uses hashlimit"))
            .unwrap_or("")
    );
    Some(r)
}

/// The connections `status` and `/metrics` say the hashlimit rule (FORWARD rule 1) holds.
fn rule_held(tb: &Testbed) -> (Option<u64>, Option<f64>) {
    let st = tb.daemon().status();
    let status = st
        .per_packet
        .rules
        .iter()
        .find(|r| r.kinds.iter().any(|k| k == "hashlimit"))
        .and_then(|r| r.held_connections);
    let series =
        "xdp_router_ruleset_per_packet_rule_held_connections{rule=\"ip filter FORWARD rule 1\"} ";
    let metrics = tb
        .metrics()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok());
    (status, metrics)
}

/// `-p udp --dport P -m hashlimit … -j DROP` before the ESTABLISHED accept holds only the
/// connections to port P: a stream to another port is fast-pathed, the stream to P is limited
/// by the kernel as without the fast path.
#[test]
fn a_hashlimit_on_one_port_leaves_other_ports_fast_pathed() {
    let test = "a_hashlimit_on_one_port_leaves_other_ports_fast_pathed";
    if !ready(test) {
        return;
    }
    let Some(r) = one_port_run(test, "ppo", (6111, 6112), true) else {
        return;
    };
    assert!(
        r.other_share >= 0.9,
        "the other port's stream: {:.1} % fast-pathed",
        r.other_share * 100.0
    );
    assert_limited(r.limited_sent_pps, r.limited_pps);
    assert_eq!(r.limited_fwd, 0, "the rule's port was fast-pathed");
    assert_eq!(
        r.rule_held,
        (Some(1), Some(1.0)),
        "the connections status and /metrics say the rule holds"
    );
}

/// The negative control: the same rule for UDP to every port holds the other port's stream
/// too.
#[test]
fn a_hashlimit_on_every_udp_port_holds_every_udp_stream() {
    let test = "a_hashlimit_on_every_udp_port_holds_every_udp_stream";
    if !ready(test) {
        return;
    }
    let Some(r) = one_port_run(test, "ppe", (6113, 6114), false) else {
        return;
    };
    assert_eq!(
        r.other_share, 0.0,
        "a stream the rule matches was fast-pathed"
    );
    assert_eq!(r.limited_fwd, 0);
    assert_eq!(
        r.rule_held,
        (Some(2), Some(2.0)),
        "the connections status and /metrics say the rule holds"
    );
}
