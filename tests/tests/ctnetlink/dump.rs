//! Dumps: masqueraded UDP and TCP, IPv4 and IPv6, as the daemon reads them.

use super::*;

#[test]
fn dump_sees_masqueraded_udp_and_tcp_v4_v6() {
    if !require_root("dump_sees_masqueraded_udp_and_tcp_v4_v6") {
        return;
    }
    let topo = Topology::new(&[]);
    let rt = runtime();
    let udp4: SocketAddr = (SERVER_V4, 5001).into();
    let udp6: SocketAddr = (SERVER_V6, 5001).into();
    let tcp4: SocketAddr = (SERVER_V4, 5002).into();
    let tcp6: SocketAddr = (SERVER_V6, 5002).into();
    let unreplied: SocketAddr = (SERVER_V4, 5009).into();
    for addr in [udp4, udp6] {
        udp_echo_server(&topo.server, addr);
    }
    for addr in [tcp4, tcp6] {
        tcp_echo_server(&topo.server, addr);
    }
    topo.server
        .sh("iptables -A INPUT -p udp --dport 5009 -j DROP");

    let u4 = udp_client(&topo.client, udp4);
    let u6 = udp_client(&topo.client, udp6);
    let lost = udp_client(&topo.client, unreplied);
    udp_round_trip(&u4);
    udp_round_trip(&u6);
    lost.send(b"anyone?").expect("UDP send");
    thread::sleep(UDP_ASSURE_DELAY);
    udp_round_trip(&u4);
    udp_round_trip(&u6);
    let t4 = tcp_client(&topo.client, tcp4);
    let t6 = tcp_client(&topo.client, tcp6);

    let mut ct = open_in(&topo.router, &rt, CtNetlink::new);
    let entries = rt.block_on(ct.dump()).expect("dump");

    let local = |s: &UdpSocket| s.local_addr().expect("local addr");
    let cases = [
        (
            orig_tuple(local(&u4), udp4, IPPROTO_UDP),
            IpAddr::V4(ROUTER_WAN_V4),
        ),
        (
            orig_tuple(local(&u6), udp6, IPPROTO_UDP),
            IpAddr::V6(ROUTER_WAN_V6),
        ),
        (
            orig_tuple(t4.local_addr().expect("local addr"), tcp4, IPPROTO_TCP),
            IpAddr::V4(ROUTER_WAN_V4),
        ),
        (
            orig_tuple(t6.local_addr().expect("local addr"), tcp6, IPPROTO_TCP),
            IpAddr::V6(ROUTER_WAN_V6),
        ),
    ];
    for (orig, wan) in &cases {
        let entry = find(&entries, orig)
            .unwrap_or_else(|| panic!("no conntrack entry for {orig} in {entries:#?}"));
        assert_snat_offloadable(entry, *wan);
        if orig.proto == IPPROTO_TCP {
            assert_eq!(entry.tcp_state, Some(tcp_state::ESTABLISHED), "{entry:?}");
        }
        // get() finds the same entry by its original tuple.
        let got = rt
            .block_on(ct.get(orig, 0))
            .expect("get")
            .unwrap_or_else(|| panic!("get({orig}) found nothing"));
        assert_eq!(got.id, entry.id);
        assert_eq!(got.reply, entry.reply);
    }
    let lost_tuple = orig_tuple(local(&lost), unreplied, IPPROTO_UDP);
    let lost_entry = find(&entries, &lost_tuple)
        .unwrap_or_else(|| panic!("no conntrack entry for {lost_tuple}"));
    assert!(!lost_entry.status.contains(CtStatus::SeenReply));
    assert_eq!(
        lost_entry.offload_decision(),
        Err(NotOffloadable::Unreplied)
    );

    // A tuple that does not exist is "None", not an error.
    let mut absent = lost_tuple;
    absent.dport = 5999;
    assert_eq!(rt.block_on(ct.get(&absent, 0)).expect("get"), None);
}
