//! The TC datapath (`datapath = "tc"`): the fast path at TC ingress on socket buffers, forced
//! on the test bed's veths (which have native XDP: the TC program runs instead of it). Real
//! traffic through lan host ⇄ router ⇄ wan host, the router configured like a home router
//! (MASQUERADE, a FORWARD chain accepting ESTABLISHED); see `xdp_router_tests::testbed`.
//!
//! What proves the TC program forwarded the packets: the per-interface `forwarded_original` /
//! `forwarded_reply` counters rise by the packets sent while the FORWARD chain's ESTABLISHED
//! rule does not, and with the fast path off the counters stay at 0 and the FORWARD chain sees
//! everything. What proves the rewrite is right: every datagram comes back intact from the
//! right address, every transfer arrives intact (digest), and neither host's kernel counted a
//! checksum error (`InCsumErrors` in `/proc/net/snmp`, which counts what it dropped).
//!
//! Run as root with one test thread: `cargo test -p xdp-router-tests --test tc --
//! --test-threads=1` after building the daemon.

use std::net::IpAddr;

use xdp_router_tests::{
    netns::Netns,
    testbed::{
        self, LAN_IF, MACVLAN_LAN_IF, ROUTER_WAN_V4, Snapshot, Testbed, WAN_IF, fastpath_fraction,
        interfaces_config, ready, traffic_is_fast_pathed, wan_v4, wan_v6,
    },
};

/// Config for the WAN and `lan` with the TC datapath forced (globally).
fn tc_config(lan: &str) -> String {
    format!("datapath = \"tc\"\n{}", interfaces_config(WAN_IF, lan))
}

/// Starts the daemon with [`tc_config`] for the LAN veth and checks that both interfaces run
/// the TC datapath, say why, and that no XDP program is attached.
fn start_tc(tb: &mut Testbed) {
    tb.start_daemon_config(&tc_config(LAN_IF));
    let st = tb.daemon().status();
    for ifname in [LAN_IF, WAN_IF] {
        let i = st
            .interfaces
            .iter()
            .find(|i| i.name == ifname)
            .unwrap_or_else(|| panic!("status lists no interface {ifname}: {st:?}"));
        assert_eq!(
            i.attach_mode,
            "tc",
            "{ifname} should run the TC datapath; log:\n{}",
            tb.daemon().log_tail()
        );
    }
    let text = tb.daemon().ctl(&["status"]).expect("status");
    assert!(
        text.contains("tc ingress") && text.contains("datapath tc because: datapath = \"tc\""),
        "status should show the TC datapath and why:\n{text}"
    );
    if let Some(xdp) = tb.xdp_attached() {
        panic!("no XDP program should be attached with datapath = \"tc\": {xdp}");
    }
}

/// The `InCsumErrors` of TCP and UDP (IPv4) and UDP6 in the namespace: packets its kernel
/// dropped for a bad checksum.
fn csum_errors(ns: &Netns) -> u64 {
    let snmp = ns.exec_ok("cat", &["/proc/net/snmp"]);
    let mut total = 0;
    let lines: Vec<&str> = snmp.lines().collect();
    for pair in lines.windows(2) {
        let (head, vals) = (pair[0], pair[1]);
        let (Some((p1, names)), Some((p2, values))) = (head.split_once(':'), vals.split_once(':'))
        else {
            continue;
        };
        if p1 != p2 || !(p1 == "Tcp" || p1 == "Udp") || !names.contains("InCsumErrors") {
            continue;
        }
        for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
            if n == "InCsumErrors" {
                total += v.parse::<u64>().unwrap_or(0);
            }
        }
    }
    let snmp6 = ns.exec_ok("cat", &["/proc/net/snmp6"]);
    for l in snmp6.lines() {
        if let Some(v) = l.strip_prefix("Udp6InCsumErrors") {
            total += v.trim().parse::<u64>().unwrap_or(0);
        }
    }
    total
}

/// Both hosts' checksum error counters, summed.
fn host_csum_errors(tb: &Testbed) -> u64 {
    csum_errors(&tb.lan) + csum_errors(&tb.wan)
}

/// TCP bulk transfers over IPv4 (masqueraded) and IPv6: intact, ≥ 90 % of the LAN wire
/// packets forwarded by the TC program, the FORWARD chain's ESTABLISHED rule seeing < 10 %.
fn bulk_v4_v6(tb: &Testbed, port: u16) {
    for (server, peer, v6) in [
        (wan_v4(port), IpAddr::from(ROUTER_WAN_V4), false),
        (wan_v6(port + 1), IpAddr::from(testbed::LAN_HOST_V6), true),
    ] {
        let (before, after): (Snapshot, Snapshot) =
            testbed::bulk_is_fast_pathed(tb, server, peer, 16 << 20);
        let wire = after.rx_lan_since(&before);
        let established = after.established_since(&before, v6);
        let reply = after.packets_since(&before, WAN_IF, "forwarded_reply");
        println!(
            "TC datapath, TCP {server}: {wire} LAN wire packets, FORWARD ESTABLISHED +{established}, \
             {reply} ACKs forwarded as replies"
        );
        assert!(
            (established as f64) < 0.1 * wire as f64,
            "the FORWARD ESTABLISHED rule saw {established} packets, ≥ 10 % of the {wire}"
        );
        assert!(reply > 0, "no reply (ACK) forwarded by the TC program");
    }
}

/// UDP over IPv4 (MASQUERADE) and IPv6 forwarded by the TC program both ways (every datagram,
/// with the negative control: fast path off → 0 forwarded, FORWARD sees them), a TCP transfer
/// fast-pathed both ways, then bulk TCP over both families; no checksum error at either host.
/// Checksums here are full ones (the hosts' veths compute them: `tx off`), CHECKSUM_NONE skbs.
#[test]
fn tc_datapath_forwards_udp_and_tcp() {
    if !ready("tc_datapath_forwards_udp_and_tcp") {
        return;
    }
    let mut tb = Testbed::new("tc1");
    start_tc(&mut tb);
    let errors = host_csum_errors(&tb);
    traffic_is_fast_pathed(&tb, 7100, LAN_IF, WAN_IF, "over the TC datapath");
    bulk_v4_v6(&tb, 7110);
    assert_eq!(
        host_csum_errors(&tb) - errors,
        0,
        "the hosts dropped packets with bad checksums"
    );
}

/// The checksum trap: the hosts' veths offload checksums and segmentation (`tx on`, TSO) and
/// the router's veths aggregate (GRO), so the skbs the TC program sees are CHECKSUM_PARTIAL
/// (the checksum field holds only the pseudo-header's sum) and GSO aggregates larger than the
/// MTU. The NAT rewrite must update them through the skb helpers; the XDP path's direct
/// incremental update would leave every translated segment with a wrong checksum once the
/// router's egress computes it (dropped by the receiver: the transfer stalls and the checksum
/// error counters rise; checked by building the TC path with the direct update).
#[test]
fn tc_datapath_handles_partial_checksums_and_gso() {
    if !ready("tc_datapath_handles_partial_checksums_and_gso") {
        return;
    }
    let mut tb = Testbed::new("tc2");
    for host in [&tb.lan, &tb.wan] {
        host.sh(&format!(
            "ethtool -K {h} tx on tso on gso on gro on >/dev/null",
            h = testbed::HOST_IF
        ));
    }
    // The router's veths aggregate what they receive (GRO) but compute checksums in software
    // on transmit (`tx off`): a checksum field the rewrite left wrong becomes a wrong checksum
    // on the wire, which the receiving host drops. (With `tx on`, a CHECKSUM_PARTIAL skb
    // crosses the veth as such and its receiver trusts it whatever its field holds.)
    tb.router.sh(&format!(
        "for i in {LAN_IF} {WAN_IF}; do ethtool -K $i tx off rx on gro on gso on >/dev/null; done"
    ));
    start_tc(&mut tb);
    let errors = host_csum_errors(&tb);
    // UDP (CHECKSUM_PARTIAL datagrams, BPF_F_MARK_MANGLED_0) both ways with the negative
    // control, and a 2 MiB TCP transfer.
    traffic_is_fast_pathed(&tb, 7210, LAN_IF, WAN_IF, "over TC with offloads");
    for (port, v6) in [(7200, false), (7201, true)] {
        let server = if v6 { wan_v6(port) } else { wan_v4(port) };
        let peer = if v6 {
            IpAddr::from(testbed::LAN_HOST_V6)
        } else {
            IpAddr::from(ROUTER_WAN_V4)
        };
        let before = tb.snapshot();
        let r = testbed::Transfer::start_offloaded(
            &tb,
            server,
            testbed::Plan {
                bytes: 32 << 20,
                rate: None,
            },
        )
        .finish();
        let after = tb.snapshot();
        testbed::assert_intact(&r);
        assert_eq!(
            r.peer.ip(),
            peer,
            "the WAN host saw {} as the client",
            r.peer
        );
        let orig = after.packets_since(&before, LAN_IF, "forwarded_original");
        let reply = after.packets_since(&before, WAN_IF, "forwarded_reply");
        let established = after.established_since(&before, v6);
        let wire = after.rx_lan_since(&before);
        println!(
            "TC datapath with offloads, TCP {server}: {wire} LAN wire packets, the TC program \
             forwarded {orig} original skbs (GRO aggregates) and {reply} replies, FORWARD \
             ESTABLISHED +{established}"
        );
        assert!(orig > 0 && reply > 0, "not fast-pathed both ways");
        // With GRO both the fast path and netfilter count aggregates: compare the two.
        let share = fastpath_fraction(orig, orig + established);
        assert!(
            share >= 0.9,
            "only {:.1} % of the aggregates were forwarded by the TC program",
            share * 100.0
        );
    }
    assert_eq!(
        host_csum_errors(&tb) - errors,
        0,
        "the hosts dropped packets with bad checksums"
    );
}

/// The macvlan LAN port ([`Testbed::macvlan_lan_port`]).
const MV: &str = MACVLAN_LAN_IF;

/// [`Testbed::macvlan_lan_port`] with `datapath = "tc"` on both ports: the TC program forwards UDP
/// (v4 with MASQUERADE, v6) and TCP both ways, into the macvlan too (a TC redirect needs no XDP
/// transmit), with the negative control.
#[test]
fn tc_datapath_accelerates_a_macvlan_lan_port() {
    if !ready("tc_datapath_accelerates_a_macvlan_lan_port") {
        return;
    }
    let mut tb = Testbed::new("tc3");
    tb.macvlan_lan_port(WAN_IF);
    tb.start_daemon_config(&tc_config(MV));
    let mv = tb.daemon().status().iface(MV).clone();
    assert_eq!(mv.attach_mode, "tc", "log:\n{}", tb.daemon().log_tail());
    // The replies are redirected into it although it cannot transmit XDP frames.
    assert!(!mv.xdp_xmit, "a macvlan has no XDP transmit: {mv:?}");
    let errors = host_csum_errors(&tb);
    traffic_is_fast_pathed(&tb, 7300, MV, WAN_IF, "over a macvlan LAN port on TC");
    assert_eq!(
        host_csum_errors(&tb) - errors,
        0,
        "the hosts dropped packets with bad checksums"
    );
}

/// [`Testbed::macvlan_lan_port`] with the default `datapath = "auto"`: the macvlan refuses native
/// XDP, so it gets the TC fast path (not generic XDP, which forwards nothing), and the WAN veth
/// keeps native XDP with the TC program behind it. LAN → WAN: TC on the macvlan redirects to the
/// WAN. WAN → LAN: XDP cannot redirect into the macvlan (no XDP transmit), so it hands the packet
/// to the TC program on the same port (XDP metadata), which redirects it through the macvlan's
/// transmit path; every reply is counted `forwarded_reply` on the WAN although XDP alone could
/// forward none of them (it would count `egress_no_xdp_xmit`). With the fast path off, all of it
/// goes through netfilter (the negative control in `traffic_is_fast_pathed`).
#[test]
fn auto_datapath_puts_a_macvlan_lan_port_on_tc_behind_native_xdp() {
    if !ready("auto_datapath_puts_a_macvlan_lan_port_on_tc_behind_native_xdp") {
        return;
    }
    let mut tb = Testbed::new("tc4");
    tb.macvlan_lan_port(WAN_IF);
    tb.start_daemon_config(&interfaces_config(WAN_IF, MV));
    let st = tb.daemon().status();
    let (mv, wan) = (st.iface(MV), st.iface(WAN_IF));
    println!(
        "{MV}: {} ({:?}); {WAN_IF}: {}, TC hand-over {}",
        mv.attach_mode, mv.datapath_because, wan.attach_mode, wan.tc_handoff
    );
    assert_eq!(mv.attach_mode, "tc", "log:\n{}", tb.daemon().log_tail());
    assert!(
        mv.datapath_because
            .as_deref()
            .is_some_and(|w| w.contains("auto") && w.contains("native XDP was refused")),
        "status should say why: {:?}",
        mv.datapath_because
    );
    assert_eq!(
        (wan.attach_mode.as_str(), wan.tc_handoff),
        ("native", true),
        "the WAN keeps native XDP with the TC program behind it: {wan:?}"
    );
    st.note_unmarked_handoff("tc::auto_datapath_puts_a_macvlan_lan_port_on_tc_behind_native_xdp");
    let text = tb.daemon().ctl(&["status"]).expect("status");
    assert!(
        text.contains("xdp native + tc hand-over"),
        "status should show the hand-over:\n{text}"
    );
    let before = tb.snapshot();
    let errors = host_csum_errors(&tb);
    traffic_is_fast_pathed(
        &tb,
        7400,
        MV,
        WAN_IF,
        "over a macvlan LAN port on TC, WAN native XDP",
    );
    assert_eq!(
        host_csum_errors(&tb) - errors,
        0,
        "the hosts dropped packets with bad checksums"
    );
    let after = tb.snapshot();
    let no_xmit = after.packets_since(&before, WAN_IF, "egress_no_xdp_xmit");
    println!("{WAN_IF}: egress_no_xdp_xmit +{no_xmit} (handed to TC instead)");
    assert_eq!(no_xmit, 0, "XDP handed every such packet to TC");
}

/// A LAN veth whose peer transmits on more queues than it receives on refuses native XDP
/// (ENOSPC, as a driver refuses what it cannot do): with `datapath = "auto"` it gets the TC
/// fast path, and UDP and TCP through it are fast-pathed both ways (the WAN on native XDP
/// redirects into the LAN veth directly: it can transmit XDP frames). (A jumbo MTU was this
/// test's refusal until the program took multi-buffer frames: `mtu.rs` now runs jumbo frames
/// on native XDP.)
#[test]
fn auto_datapath_takes_tc_where_native_xdp_is_refused() {
    if !ready("auto_datapath_takes_tc_where_native_xdp_is_refused") {
        return;
    }
    let mut tb = Testbed::new("tc5");
    tb.refuse_native_xdp_on_the_lan_port();
    tb.start_daemon_config(&interfaces_config(WAN_IF, LAN_IF));
    let st = tb.daemon().status();
    let (lan, wan) = (st.iface(LAN_IF), st.iface(WAN_IF));
    println!(
        "{LAN_IF}: {} ({:?}); {WAN_IF}: {}",
        lan.attach_mode, lan.datapath_because, wan.attach_mode
    );
    assert_eq!(lan.attach_mode, "tc", "log:\n{}", tb.daemon().log_tail());
    assert!(
        lan.datapath_because
            .as_deref()
            .is_some_and(|w| w.contains("fewer RX queues")),
        "status should say why native XDP was refused: {:?}",
        lan.datapath_because
    );
    assert_eq!(wan.attach_mode, "native");
    let errors = host_csum_errors(&tb);
    traffic_is_fast_pathed(
        &tb,
        7500,
        LAN_IF,
        WAN_IF,
        "with a LAN veth that refused native XDP on TC",
    );
    assert_eq!(
        host_csum_errors(&tb) - errors,
        0,
        "the hosts dropped packets with bad checksums"
    );
}

/// The lines of `tc filter show dev <ifname> <dir>` in the router that name one of the daemon's
/// classic tc entry points (`xr_cls_*`): its filters on a kernel without TCX links.
fn classic_filters(tb: &Testbed, ifname: &str, dir: &str) -> Vec<String> {
    tb.router
        .exec_ok("tc", &["filter", "show", "dev", ifname, dir])
        .lines()
        .filter(|l| l.contains(" xr_cls_"))
        .map(str::to_owned)
        .collect()
}

/// SIGKILL with the TC datapath. With TCX links (Linux 6.6) the TC programs go with the
/// process. Without them (Debian 12's 6.1) they are classic tc filters, which stay: they must
/// then do nothing, since the daemon's program array empties with its last descriptor
/// (`datapath/tc_links.rs`), so the kernel's FORWARD chain carries the rest of a paced transfer
/// intact. The next daemon removes the filters left behind (one of each of its own remains),
/// and a clean exit leaves none.
#[test]
fn tc_datapath_fails_open_on_sigkill() {
    if !ready("tc_datapath_fails_open_on_sigkill") {
        return;
    }
    let mut tb = Testbed::new("tc6");
    start_tc(&mut tb);
    let hook = tb.daemon().status().iface(LAN_IF).tc_hook.clone();
    println!("{LAN_IF}: TC programs attached as {hook:?}");
    let classic = match hook.as_deref() {
        Some("classic tc") => true,
        Some("tcx") => false,
        other => panic!("status should say how the TC programs are attached, not {other:?}"),
    };
    let own = [
        (LAN_IF, "ingress", "xr_cls_tc"),
        (LAN_IF, "egress", "xr_cls_arm"),
        (WAN_IF, "ingress", "xr_cls_tc"),
        (WAN_IF, "egress", "xr_cls_arm"),
    ];
    let count = |tb: &Testbed, (ifname, dir, entry): (&str, &str, &str)| {
        classic_filters(tb, ifname, dir)
            .iter()
            .filter(|l| l.contains(&format!(" {entry} ")))
            .count()
    };
    println!(
        "tc filter show dev {LAN_IF} ingress:\n{}",
        tb.router
            .exec_ok("tc", &["filter", "show", "dev", LAN_IF, "ingress"])
    );
    for at in own {
        assert_eq!(count(&tb, at), usize::from(classic), "{at:?}");
    }
    // Paced and long (≈ 43 s at most): stopped 1 s after the kill.
    let t = testbed::Transfer::start_offloaded(
        &tb,
        wan_v4(7600),
        testbed::Plan {
            bytes: 1 << 30,
            rate: Some(24 << 20),
        },
    );
    let a = tb.snapshot();
    std::thread::sleep(std::time::Duration::from_secs(1));
    let fwd = tb
        .snapshot()
        .packets_since(&a, LAN_IF, "forwarded_original");
    assert!(
        fwd > 1000,
        "before the kill only {fwd} packets forwarded by the TC program in 1 s"
    );
    let est_before = testbed::established_packets(&tb.router, "iptables");
    tb.daemon.as_mut().expect("daemon").kill9();
    for at in own {
        assert_eq!(
            count(&tb, at),
            usize::from(classic),
            "after the kill, {at:?}: a classic filter stays, a TCX link goes"
        );
    }
    std::thread::sleep(std::time::Duration::from_secs(1));
    t.stop();
    let r = t.finish();
    testbed::assert_intact(&r);
    let est = testbed::established_packets(&tb.router, "iptables") - est_before;
    assert!(
        est > 1000,
        "after the kill the kernel's FORWARD ESTABLISHED rule saw only {est} packets: what is \
         left of the TC programs still forwards"
    );
    start_tc(&mut tb);
    for at in own {
        assert_eq!(
            count(&tb, at),
            usize::from(classic),
            "{at:?} after the restart: {:?}\n{}",
            classic_filters(&tb, at.0, at.1),
            tb.daemon().log_tail()
        );
    }
    assert!(tb.daemon.as_mut().expect("daemon").stop(), "a clean exit");
    for (ifname, dir, _) in own {
        let left = classic_filters(&tb, ifname, dir);
        assert!(
            left.is_empty(),
            "a clean exit left {ifname} {dir}: {left:?}"
        );
    }
}
