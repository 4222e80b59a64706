//! Port forwards with real traffic: a DNAT port forward from the WAN to a LAN server, and the
//! hairpin a LAN client takes to the router's WAN address (DNAT to the LAN server plus SNAT back
//! into the LAN, so the packets enter and leave the router on the same interface). Both must be
//! delivered exactly as the kernel delivers them (contents, addresses seen by each end) and, once
//! conntrack has offloaded them, forwarded by the fast path in both directions (per-reason
//! counters against what was sent). Run as root with one test thread (`cargo xtask test`).

use std::net::{IpAddr, SocketAddr};

use xdp_router_tests::testbed::{
    LAN_HOST_V4, LAN_IF, ROUTER_LAN_V4, ROUTER_WAN_V4, Testbed, UdpEcho, WAN_HOST_V4, WAN_IF,
    any_v4, offload_udp, ready, udp_is_fast_pathed, udp_socket,
};

/// The router's forwarded port on its WAN address.
const PUBLIC_PORT: u16 = 8053;
/// Where the LAN server listens.
const SERVER_PORT: u16 = 5353;

/// Adds the port forward to the testbed's router: DNAT of `WAN address:PUBLIC_PORT` (from any
/// interface, as a hairpin needs) to the LAN server, its FORWARD accept, and the hairpin's
/// MASQUERADE so the server answers through the router.
fn add_port_forward(tb: &Testbed) {
    tb.router.sh(&format!(
        "iptables -w -t nat -A PREROUTING -d {ROUTER_WAN_V4} -p udp --dport {PUBLIC_PORT} \
           -j DNAT --to-destination {LAN_HOST_V4}:{SERVER_PORT}
         iptables -w -A FORWARD -d {LAN_HOST_V4} -p udp --dport {SERVER_PORT} \
           -m conntrack --ctstate NEW,DNAT -j ACCEPT
         iptables -w -t nat -A POSTROUTING -o {LAN_IF} -s {LAN_HOST_V4}/24 -d {LAN_HOST_V4} \
           -p udp --dport {SERVER_PORT} -j MASQUERADE"
    ));
}

#[test]
fn dnat_port_forward_is_fast_pathed() {
    if !ready("portforward::dnat_port_forward_is_fast_pathed") {
        return;
    }
    let mut tb = Testbed::new("pf");
    add_port_forward(&tb);
    tb.start_daemon();
    let echo = UdpEcho::start(&tb.lan, SocketAddr::new(LAN_HOST_V4.into(), SERVER_PORT));
    let public = SocketAddr::new(ROUTER_WAN_V4.into(), PUBLIC_PORT);
    let sock = udp_socket(&tb.wan, any_v4(), 64);
    let mut seq = 0;
    // ping_pong only counts replies from `public`: the reverse DNAT must hold on every path.
    offload_udp(&tb, &sock, public, &mut seq);
    udp_is_fast_pathed(&tb, &sock, public, &mut seq, WAN_IF, LAN_IF);
    let seen = echo.finish();
    println!(
        "port forward: server saw {} datagrams ({} corrupt) from {:?}",
        seen.received, seen.corrupt, seen.peers
    );
    assert_eq!(seen.corrupt, 0);
    // DNAT only: the LAN server sees the WAN client's own address.
    assert!(
        seen.peers
            .iter()
            .all(|p| p.ip() == IpAddr::from(WAN_HOST_V4)),
        "the server should see the WAN client's address: {:?}",
        seen.peers
    );
}

#[test]
fn hairpin_port_forward_is_fast_pathed() {
    if !ready("portforward::hairpin_port_forward_is_fast_pathed") {
        return;
    }
    let mut tb = Testbed::new("hp");
    add_port_forward(&tb);
    // Without this the kernel also answers every hairpinned packet's sender with an ICMP
    // redirect (in = out interface, sender on-link); the fast path sends none. Routers that
    // hairpin usually turn them off; the difference is documented in the manual
    // (docs/manual/src/limitations.md).
    tb.router
        .sh("sysctl -qw net.ipv4.conf.all.send_redirects=0 net.ipv4.conf.eth1.send_redirects=0");
    tb.start_daemon();
    let echo = UdpEcho::start(&tb.lan, SocketAddr::new(LAN_HOST_V4.into(), SERVER_PORT));
    let public = SocketAddr::new(ROUTER_WAN_V4.into(), PUBLIC_PORT);
    // The client is on the LAN (the same host as the server, another socket): it reaches the
    // service by the router's public address, like a user typing the public name at home.
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    let mut seq = 0;
    offload_udp(&tb, &sock, public, &mut seq);
    // Both directions enter and leave the router on the LAN interface.
    udp_is_fast_pathed(&tb, &sock, public, &mut seq, LAN_IF, LAN_IF);
    let seen = echo.finish();
    println!(
        "hairpin: server saw {} datagrams ({} corrupt) from {:?}",
        seen.received, seen.corrupt, seen.peers
    );
    assert_eq!(seen.corrupt, 0);
    // DNAT + SNAT: the server sees the router's LAN address, so its answers go back through
    // the router, which restores the public address as their source.
    assert!(
        seen.peers
            .iter()
            .all(|p| p.ip() == IpAddr::from(ROUTER_LAN_V4)),
        "the server should see the router's LAN address: {:?}",
        seen.peers
    );
}
