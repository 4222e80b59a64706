//! Marks and policy routing are honoured by the fast path: a router with two WANs (WAN1 the
//! default route, WAN2 by `ip rule`), the same server address behind both. LAN host A is routed
//! to WAN2 — by `MARK` + `CONNMARK --save-mark/--restore-mark` and `ip rule fwmark 2 table 2`, or
//! by `ip rule from A table 2` — host B takes the default. With the fast path on, both flows are
//! fast-pathed and each arrives at its own WAN host. Run as root with one test thread.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::Duration,
};

use xdp_router_tests::{
    netns::Netns,
    testbed::{LAN_IF, Testbed, UdpEcho, WAN_IF, ready, udp_payload, udp_socket, wait_until},
};

/// The server address both WAN hosts carry.
const SERVER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 9);
const HOST_A: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 2);
const HOST_B: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 3);
const WAN2_IF: &str = "eth2";

/// The testbed plus a second WAN host behind `eth2` (10.0.3.0/24), `SERVER` on both WAN hosts,
/// host B's address on the LAN host, and table 2 routing to WAN2, selected by `rule`.
fn two_wans(tag: &str, rule: &str) -> (Testbed, Netns) {
    let tb = Testbed::new(tag);
    let wan2 = Netns::new(&format!("{tag}v"));
    tb.router.sh(&format!(
        "ip link add {WAN2_IF} type veth peer name eth0 netns {w2}
         ip addr add 10.0.3.1/24 dev {WAN2_IF}
         ip link set {WAN2_IF} up
         ethtool -K {WAN2_IF} tx off rx off gro off gso off tso off >/dev/null
         sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
         ip route add default via 10.0.2.2 dev {WAN_IF}
         ip route add default via 10.0.3.2 dev {WAN2_IF} table 2
         ip route add 10.0.1.0/24 dev {LAN_IF} table 2
         iptables -w -t nat -A POSTROUTING -o {WAN2_IF} -j MASQUERADE
         iptables -w -A FORWARD -i {LAN_IF} -o {WAN2_IF} -j ACCEPT
         {rule}",
        w2 = wan2.name()
    ));
    wan2.sh(&format!(
        "ip addr add 10.0.3.2/24 dev eth0
         ip link set eth0 up
         ethtool -K eth0 tx off rx off gro on >/dev/null
         ip link set lo up
         ip addr add {SERVER}/32 dev lo"
    ));
    tb.wan.sh(&format!("ip addr add {SERVER}/32 dev lo"));
    tb.lan.sh(&format!("ip addr add {HOST_B}/24 dev eth0"));
    (tb, wan2)
}

/// A's flow to SERVER:7001 must reach WAN2's host only, B's to SERVER:7002 WAN1's only, both
/// fast-pathed in both directions.
fn flows_follow_their_policy_route(tag: &str, rule: &str) {
    let (mut tb, wan2) = two_wans(tag, rule);
    tb.start_daemon_with(&format!(
        "[[interface]]\nname = \"{WAN2_IF}\"\nrole = \"wan\"\n"
    ));
    let server = |port| SocketAddr::new(IpAddr::V4(SERVER), port);
    let echo = [
        ("WAN1 A", UdpEcho::start(&tb.wan, server(7001))),
        ("WAN2 A", UdpEcho::start(&wan2, server(7001))),
        ("WAN1 B", UdpEcho::start(&tb.wan, server(7002))),
        ("WAN2 B", UdpEcho::start(&wan2, server(7002))),
    ];
    let a = udp_socket(&tb.lan, SocketAddr::new(HOST_A.into(), 0), 64);
    let b = udp_socket(&tb.lan, SocketAddr::new(HOST_B.into(), 0), 64);
    for s in [&a, &b] {
        s.set_read_timeout(Some(Duration::from_millis(5)))
            .expect("timeout");
    }
    let mut seq = 0u64;
    let mut replies = [0u64; 2];
    let mut exchange = |n: u64, replies: &mut [u64; 2]| {
        let mut buf = [0u8; 2048];
        for _ in 0..n {
            for (i, (s, port)) in [(&a, 7001), (&b, 7002)].into_iter().enumerate() {
                s.send_to(&udp_payload(seq, 200), server(port))
                    .expect("send");
                seq += 1;
                while s.recv_from(&mut buf).is_ok() {
                    replies[i] += 1;
                }
            }
        }
    };
    // Until both flows are offloaded, armed and fast-pathed (UDP: ASSURED after 2 s).
    let ok = wait_until(Duration::from_secs(12), || {
        exchange(20, &mut replies);
        let st = tb.daemon().status();
        st.packets(WAN2_IF, "forwarded_reply") > 20 && st.packets(WAN_IF, "forwarded_reply") > 20
    });
    let before = tb.snapshot();
    exchange(500, &mut replies);
    let after = tb.snapshot();
    let fwd_lan = after.packets_since(&before, LAN_IF, "forwarded_original");
    let wan2_replies = after.packets_since(&before, WAN2_IF, "forwarded_reply");
    let wan1_replies = after.packets_since(&before, WAN_IF, "forwarded_reply");
    let got: Vec<(&str, u64)> = echo
        .into_iter()
        .map(|(name, e)| (name, e.finish().received))
        .collect();
    eprintln!(
        "{rule:?}: 1000 datagrams: {fwd_lan} fast-pathed LAN→WAN, replies fast-pathed from \
         WAN2 {wan2_replies} / WAN1 {wan1_replies}; echo servers received {got:?}; LAN host got \
         {replies:?} replies (A, B)"
    );
    assert!(
        ok,
        "the flows were not fast-pathed both ways; status:\n{}",
        tb.daemon().ctl(&["status"]).unwrap_or_default()
    );
    let count = |n: &str| got.iter().find(|(name, _)| *name == n).map_or(0, |g| g.1);
    assert_eq!(count("WAN1 A"), 0, "host A's flow left by WAN1");
    assert_eq!(count("WAN2 B"), 0, "host B's flow left by WAN2");
    assert!(count("WAN2 A") >= 500 && count("WAN1 B") >= 500);
    assert!(
        fwd_lan >= 900,
        "only {fwd_lan} of 1000 LAN packets fast-pathed"
    );
    // Replies (marked 2 by --restore-mark) reach the LAN through table 2's LAN route.
    assert!(
        replies[0] >= 500 && replies[1] >= 500,
        "replies lost: {replies:?}"
    );
    assert!(wan2_replies >= 450 && wan1_replies >= 450);
}

#[test]
fn connmark_routed_flow_is_fast_pathed_by_its_wan() {
    if !ready("connmark_routed_flow_is_fast_pathed_by_its_wan") {
        return;
    }
    flows_follow_their_policy_route(
        "pol1",
        &format!(
            "iptables -w -t mangle -A PREROUTING -j CONNMARK --restore-mark
             iptables -w -t mangle -A PREROUTING -s {HOST_A} -m mark --mark 0 -j MARK --set-mark 2
             iptables -w -t mangle -A PREROUTING -j CONNMARK --save-mark
             ip rule add fwmark 2 table 2 pref 100"
        ),
    );
}

#[test]
fn source_routed_flow_is_fast_pathed_by_its_wan() {
    if !ready("source_routed_flow_is_fast_pathed_by_its_wan") {
        return;
    }
    flows_follow_their_policy_route(
        "pol2",
        &format!("ip rule add from {HOST_A} table 2 pref 100"),
    );
}
