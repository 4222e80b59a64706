//! The kernel as the oracle over PPPoE over VLAN 7: the same datagrams (same connection, same
//! payloads) sent with the fast path off and on leave the router byte for byte the same, on
//! the WAN wire (encapsulated: MACs, PPPoE header, PPP protocol, IP header, NAT, checksums)
//! and on the LAN wire (the decapsulated replies); with it on, every one of them was forwarded
//! by XDP, with it off none. The one thing that differs between the halves is what the
//! sending hosts put in the IPv4 identification (a counter of their own), so that field and
//! the header checksum covering it are compared as zero, after every frame's checksums are
//! checked in full. Checks of `session_over_vlan_7` (main.rs), on its test bed.

use std::time::Duration;

use xdp_router_tests::{
    packet::verify_checksums,
    testbed::{
        Capture, HOST_IF, LAN_IF, MACVLAN_LAN_IF, PING_DGRAM, PING_TICK, Testbed, UdpEcho, any_v4,
        interfaces_config, offload_udp, ping_pong, udp_payload, udp_socket, wan_v4,
    },
};

use super::bed::PPP_IF;

/// The frames carrying one datagram's payload on the WAN wire and on the LAN wire.
type Wires = (Vec<Vec<u8>>, Vec<Vec<u8>>);

/// The differential with the fast path on the native LAN port (XDP both ways).
pub(super) fn fast_path_sends_what_the_kernel_sends_over_pppoe(tb: &mut Testbed) {
    pppoe_differential(tb, "", LAN_IF);
}

/// [`fast_path_sends_what_the_kernel_sends_over_pppoe`] with `datapath = "tc"`: the TC fast path
/// on the LAN port and on ppp0 itself (the kernel's PPPoE and VLAN code encapsulating what it
/// redirects into ppp0) sends what the kernel sends, byte for byte.
pub(super) fn fast_path_sends_what_the_kernel_sends_over_pppoe_on_tc(tb: &mut Testbed) {
    pppoe_differential(tb, "datapath = \"tc\"\n", LAN_IF);
}

/// [`fast_path_sends_what_the_kernel_sends_over_pppoe`] with a LAN port that has neither native
/// XDP nor XDP transmit (a macvlan, as a Wi-Fi or Realtek port is; the caller made it with
/// `Testbed::macvlan_lan_port`) and `datapath = "auto"`: uploads leave the macvlan's TC
/// program into ppp0; replies arrive as session frames on the native eth0, whose XDP hands
/// them to the TC program behind it, which takes the session header and the VLAN tag off the
/// skb and redirects it through the macvlan. Both wires' bytes are the kernel's.
pub(super) fn fast_path_sends_what_the_kernel_sends_from_pppoe_into_a_port_without_xdp_transmit(
    tb: &mut Testbed,
) {
    pppoe_differential(tb, "", MACVLAN_LAN_IF);
}

/// The differential over the test bed's PPPoE session (over VLAN 7), with `global` at the top
/// of the config and `lan` as the router's LAN port ([`LAN_IF`], or [`MACVLAN_LAN_IF`] set up
/// over it).
fn pppoe_differential(tb: &mut Testbed, global: &str, lan: &str) {
    const N: u64 = 10;
    const FIRST: u64 = 1_000_000;
    tb.start_daemon_config(&format!(
        "{global}xdp_mode = \"native\"\n{}",
        interfaces_config(PPP_IF, lan)
    ));
    let st = tb.daemon().status();
    let expected = match (global.is_empty(), lan == MACVLAN_LAN_IF) {
        (false, _) => ("tc", "tc"),
        (true, true) => ("tc", "lower"),
        (true, false) => ("native", "lower"),
    };
    assert_eq!(
        (
            st.iface(lan).attach_mode.as_str(),
            st.iface(PPP_IF).attach_mode.as_str()
        ),
        expected,
        "{:?}",
        st.interfaces
    );
    let server = wan_v4(6250);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    let echo = UdpEcho::start(&tb.wan, server);
    let mut seq = 0;
    offload_udp(tb, &sock, server, &mut seq);
    // What left the router, per half (off, on): for each datagram, the frames carrying its
    // payload on the WAN host's wire and on the LAN host's.
    let mut seen: Vec<Vec<Wires>> = Vec::new();
    for on in [false, true] {
        tb.daemon().set_fastpath(on);
        // (Re-)armed by a packet each way the kernel forwards.
        let arm = ping_pong(&sock, server, seq, 2, PING_DGRAM, PING_TICK);
        seq += arm.sent;
        let wan_cap = Capture::open(&tb.wan, HOST_IF);
        let lan_cap = Capture::open(&tb.lan, HOST_IF);
        let before = tb.snapshot();
        // The same sequence numbers in both halves: the same payloads.
        let pp = ping_pong(&sock, server, FIRST, N, PING_DGRAM, PING_TICK);
        let after = tb.snapshot();
        assert_eq!((pp.good, pp.lost, pp.corrupt), (N, 0, 0), "{pp:?}");
        let (orig, reply) = (
            after.packets_since(&before, lan, "forwarded_original"),
            after.packets_since(&before, PPP_IF, "forwarded_reply"),
        );
        println!(
            "fast path {}: forwarded {orig} original, {reply} reply of {N} each way",
            if on { "on" } else { "off" }
        );
        assert_eq!((orig, reply), if on { (N, N) } else { (0, 0) });
        let frames = |cap: &Capture| {
            let mut got = Vec::new();
            while let Some(f) = cap.next_incoming(Duration::from_millis(300)) {
                got.push(f);
            }
            got
        };
        let (wan, lan) = (frames(&wan_cap), frames(&lan_cap));
        seen.push(
            (FIRST..FIRST + N)
                .map(|s| {
                    let payload = udp_payload(s, PING_DGRAM);
                    let carrying = |all: &[Vec<u8>]| -> Vec<Vec<u8>> {
                        all.iter()
                            .filter(|f| f.windows(payload.len()).any(|w| w == payload))
                            .cloned()
                            .collect()
                    };
                    (carrying(&wan), carrying(&lan))
                })
                .collect(),
        );
    }
    // The sender's identification and the header checksum over it, zeroed (the checksums were
    // verified first).
    let without_ident = |f: &Vec<u8>| {
        verify_checksums(f).unwrap_or_else(|e| panic!("{e}: {f:?}"));
        let ip = match u16::from_be_bytes([f[12], f[13]]) {
            0x8864 => 22,
            _ => 14,
        };
        let mut f = f.clone();
        f[ip + 4..ip + 6].fill(0);
        f[ip + 10..ip + 12].fill(0);
        f
    };
    let seen: Vec<Vec<Wires>> = seen
        .iter()
        .map(|half| {
            half.iter()
                .map(|(wan, lan)| {
                    (
                        wan.iter().map(without_ident).collect(),
                        lan.iter().map(without_ident).collect(),
                    )
                })
                .collect()
        })
        .collect();
    for (i, (off, on)) in seen[0].iter().zip(&seen[1]).enumerate() {
        assert_eq!(
            (off.0.len(), off.1.len()),
            (1, 1),
            "datagram {i}: kernel's frames on the WAN / LAN wire"
        );
        assert_eq!(
            off.0, on.0,
            "datagram {i}: WAN wire frame differs (off, then on)"
        );
        assert_eq!(
            off.1, on.1,
            "datagram {i}: LAN wire frame differs (off, then on)"
        );
    }
    println!(
        "{N} datagrams each way: the same {} WAN-wire and {} LAN-wire bytes with the fast path \
         off and on",
        seen[0].iter().map(|d| d.0[0].len()).sum::<usize>(),
        seen[0].iter().map(|d| d.1[0].len()).sum::<usize>()
    );
    assert_eq!(echo.finish().corrupt, 0);
}
