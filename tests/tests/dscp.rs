//! DSCP rewrites on offloaded flows: a forward-chain rule that sets a constant DSCP on
//! flow-constant matches (`oifname "eth0" ip dscp set cs3`) is applied by the fast path itself
//! — every datagram leaves with CS3, the rule's own counter sees only the few packets the
//! kernel still carries — and changing or deleting the rule takes effect as any ruleset change
//! does. The negative control: the same rule with a per-packet match (`meta length`) keeps
//! the flow in the kernel, which applies the rewrite to every packet. Run as root
//! with one test thread (`cargo xtask test`).

use std::{collections::BTreeSet, net::UdpSocket, time::Duration};

use xdp_router_tests::testbed::{
    Capture, HOST_IF, LAN_IF, Testbed, UdpEcho, any_v4, ready, udp_payload, udp_socket, wait_until,
    wan_v4,
};

/// The mangle table's forward chain; `RULE` is added to it.
const CHAIN: &str = "nft add table inet mangle
     nft add chain inet mangle dscp_out '{ type filter hook forward priority -150; }'";

/// CS3, AF41.
const CS3: u8 = 24;
const AF41: u8 = 34;

/// Datagrams per measured round.
const ROUND: u64 = 100;

/// What one round of `ROUND` LAN → WAN datagrams looked like.
#[derive(Debug)]
struct Round {
    /// Distinct DSCPs captured at the WAN host.
    dscps: BTreeSet<u8>,
    /// Datagrams captured at the WAN host (the capture may miss some).
    captured: u64,
    /// Echoes received back: the datagrams reached the echo server intact (its kernel checks
    /// the UDP checksum).
    echoed: u64,
    /// LAN → WAN datagrams the fast path forwarded.
    fast_pathed: u64,
    /// LAN → WAN datagrams passed up as `dscp_rewritten_by_kernel`.
    kernel_rewrote: u64,
    /// LAN → WAN datagrams held in the kernel for a per-packet rule.
    held: u64,
    /// Packets the DSCP rule's counter saw (the kernel's forward hook).
    rule_saw: u64,
}

/// A UDP flow from the LAN host to an echo server on the WAN host, through the router.
struct Flow {
    sock: UdpSocket,
    server: std::net::SocketAddr,
    seq: u64,
    _echo: UdpEcho,
}

impl Flow {
    fn start(tb: &Testbed, port: u16) -> Flow {
        let server = wan_v4(port);
        let echo = UdpEcho::start(&tb.wan, server);
        let sock = udp_socket(&tb.lan, any_v4(), 64);
        sock.set_read_timeout(Some(Duration::from_millis(20)))
            .expect("timeout");
        Flow {
            sock,
            server,
            seq: 0,
            _echo: echo,
        }
    }

    /// Reads and drops the echoes still on their way.
    fn drain(&self) {
        let mut buf = [0u8; 2048];
        while self.sock.recv_from(&mut buf).is_ok() {}
    }

    /// Sends `n` datagrams, draining the echoes; returns how many came back.
    fn send(&mut self, n: u64) -> u64 {
        let mut buf = [0u8; 2048];
        let mut echoed = 0;
        for _ in 0..n {
            self.sock
                .send_to(&udp_payload(self.seq, 200), self.server)
                .expect("send");
            self.seq += 1;
            while self.sock.recv_from(&mut buf).is_ok() {
                echoed += 1;
            }
        }
        echoed
    }
}

/// Packets the counter of the chain's rules has counted (0 when the chain has none).
fn rule_packets(tb: &Testbed) -> u64 {
    let text = tb.router.sh("nft -j list chain inet mangle dscp_out");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("nft JSON");
    let mut total = 0;
    for item in doc["nftables"].as_array().into_iter().flatten() {
        for expr in item["rule"]["expr"].as_array().into_iter().flatten() {
            total += expr["counter"]["packets"].as_u64().unwrap_or(0);
        }
    }
    total
}

/// Sends until the flow's LAN → WAN direction is fast-pathed again (after an offload or a
/// ruleset change), then measures one round.
fn round(tb: &Testbed, flow: &mut Flow, what: &str) -> Round {
    let fast = || tb.daemon().status().packets(LAN_IF, "forwarded_original");
    let start = fast();
    let resumed = wait_until(Duration::from_secs(10), || {
        flow.send(10);
        fast() > start + 5
    });
    assert!(resumed, "{what}: the flow was not fast-pathed within 10 s");
    measure(tb, flow, what)
}

/// Sends until the flow is offloaded and its packets are held in the kernel for a per-packet
/// rule, then measures one round (the negative control).
fn kernel_round(tb: &Testbed, flow: &mut Flow, what: &str) -> Round {
    let offloaded = wait_until(Duration::from_secs(10), || {
        flow.send(10);
        let st = tb.daemon().status();
        st.conntrack.offloaded >= 1 && st.packets(LAN_IF, "per_packet_rule_in_ruleset") > 5
    });
    assert!(offloaded, "{what}: the flow was not offloaded within 10 s");
    measure(tb, flow, what)
}

/// Sends one round, capturing at the WAN host.
fn measure(tb: &Testbed, flow: &mut Flow, what: &str) -> Round {
    flow.drain();
    let capture = Capture::open(&tb.wan, HOST_IF);
    let before = tb.snapshot();
    let rule_before = rule_packets(tb);
    let echoed = flow.send(ROUND);
    let after = tb.snapshot();
    let rule_after = rule_packets(tb);
    let (mut dscps, mut captured) = (BTreeSet::new(), 0);
    while let Some(frame) = capture.next_incoming(Duration::from_millis(200)) {
        // IPv4 UDP to the echo port: the DSCP is the top 6 bits of the TOS byte.
        if frame.get(12..14) == Some(&[0x08, 0x00]) && frame.get(23) == Some(&17) {
            dscps.extend(frame.get(15).map(|tos| tos >> 2));
            captured += 1;
        }
    }
    let r = Round {
        dscps,
        captured,
        echoed,
        fast_pathed: after.packets_since(&before, LAN_IF, "forwarded_original"),
        kernel_rewrote: after.packets_since(&before, LAN_IF, "dscp_rewritten_by_kernel"),
        held: after.packets_since(&before, LAN_IF, "per_packet_rule_in_ruleset"),
        rule_saw: rule_after.saturating_sub(rule_before),
    };
    eprintln!("{what}: {r:?}");
    r
}

/// The fast path forwarded (nearly) every datagram of `r`, each captured with `dscp`, and the
/// rule's hook saw only the few the kernel carried.
fn assert_fast_with(r: &Round, dscp: u8, what: &str) {
    assert_eq!(
        r.dscps,
        BTreeSet::from([dscp]),
        "{what}: DSCPs at the WAN host"
    );
    assert!(
        r.captured >= ROUND / 2,
        "{what}: too few datagrams captured"
    );
    assert_eq!(r.echoed, ROUND, "{what}: datagrams echoed back");
    assert!(
        r.fast_pathed >= ROUND * 9 / 10 && r.kernel_rewrote <= ROUND / 10,
        "{what}: only {} of {ROUND} fast-pathed, {} rewritten by the kernel",
        r.fast_pathed,
        r.kernel_rewrote
    );
}

#[test]
fn a_constant_dscp_rule_is_applied_by_the_fast_path() {
    if !ready("a_constant_dscp_rule_is_applied_by_the_fast_path") {
        return;
    }
    let mut tb = Testbed::new("dsc1");
    tb.router.sh(&format!(
        "{CHAIN}\n nft add rule inet mangle dscp_out oifname eth0 counter ip dscp set cs3"
    ));
    tb.start_daemon();
    let mut flow = Flow::start(&tb, 6101);
    let set = round(&tb, &mut flow, "rule sets CS3");
    assert_fast_with(&set, CS3, "rule sets CS3");
    assert!(
        set.rule_saw <= ROUND / 10,
        "the forward hook saw {} of {ROUND} datagrams: not accelerated",
        set.rule_saw
    );
    let status = tb.daemon().ctl(&["status"]).expect("status");
    assert!(
        status.contains("dscp rewrites: applied by the fast path (inet mangle dscp_out rule 1)"),
        "status does not say the rewrite is applied:\n{status}"
    );

    // Changed: AF41 from the next packet the kernel judges on.
    tb.router.sh("nft flush chain inet mangle dscp_out
             nft add rule inet mangle dscp_out oifname eth0 counter ip dscp set af41");
    let changed = round(&tb, &mut flow, "rule changed to AF41");
    assert_fast_with(&changed, AF41, "rule changed to AF41");

    // Deleted: the DSCP the datagrams are sent with (0).
    tb.router.sh("nft flush chain inet mangle dscp_out");
    let deleted = round(&tb, &mut flow, "rule deleted");
    assert_fast_with(&deleted, 0, "rule deleted");
}

/// The negative control: a per-packet match in the rewriting rule (`meta length`) means the
/// rewrite may differ between packets of a flow, so the kernel applies it to each one (the
/// match also holds every packet in the kernel, as any match on packet content does), and the
/// fast path forwards none of the rewritten direction.
#[test]
fn a_dscp_rule_with_a_per_packet_match_stays_in_the_kernel() {
    if !ready("a_dscp_rule_with_a_per_packet_match_stays_in_the_kernel") {
        return;
    }
    let mut tb = Testbed::new("dsc2");
    tb.router.sh(&format!(
        "{CHAIN}\n nft add rule inet mangle dscp_out oifname eth0 meta length 0-1500 counter \
             ip dscp set cs3"
    ));
    tb.start_daemon();
    let mut flow = Flow::start(&tb, 6102);
    let r = kernel_round(&tb, &mut flow, "rule with meta length sets CS3");
    assert_eq!(r.dscps, BTreeSet::from([CS3]));
    assert!(r.captured >= ROUND / 2);
    assert_eq!(r.echoed, ROUND);
    assert_eq!(r.fast_pathed, 0, "no datagram may skip the per-packet rule");
    assert!(
        r.held >= ROUND && r.rule_saw >= ROUND,
        "every datagram goes through the kernel's rule: {r:?}"
    );
    let status = tb.daemon().ctl(&["status"]).expect("status");
    assert!(
        status.contains(
            "dscp rewrites: left to the kernel, inet mangle dscp_out rule 1 matches meta length"
        ),
        "status does not name the blocker:\n{status}"
    );
}
