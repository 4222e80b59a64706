//! The cases `prog-cost` measures: representative frames, the maps each needs, and the path
//! and counters every run of it must show (see the crate docs for why NAT cases use flow
//! pairs and forwarding cases a next-hop MAC on ingress).

use std::net::IpAddr;

use xdp_router_common::{IFACE_F_SHAPED, Reason, verdict_tick};
use xdp_router_tests::{
    fixture_net::{
        Bed, CLIENT_MAC, FlowEntry, GW_MAC, LAN_SLOT, Setup, WAN_SLOT, XDP_PASS, XDP_REDIRECT,
        coarse_monotonic_ns, flow, lan_pkt, v4, v6, wan_pkt,
    },
    packet::{
        Spec, Transport,
        tcp_flags::{ACK, PSH},
    },
};

/// TTL / hop limit of the benchmark frames.
const START_TTL: u8 = 255;
/// Second LAN host (permanent neighbour added on top of the fixture topology): the "public"
/// address of the reply case, see the module docs.
pub(super) const LAN_HOST2: &str = "192.0.2.11";

/// Name of the bare-redirect row.
pub(super) const BARE_REDIRECT: &str = "baseline: bare redirect";

/// What runs a case and what it must do.
pub(super) enum Subject {
    /// `xdp_router` with these maps; every run must be counted under `reason` in `slot`, and,
    /// when forwarded, on the flow entries of the setup.
    Router {
        setup: Setup,
        slot: u32,
        reason: Reason,
        verdict: u32,
    },
    /// A raw baseline program (index into the baselines) that must return `verdict`.
    Baseline { index: usize, verdict: u32 },
}

/// One row of the table.
pub(super) struct Case {
    pub(super) name: &'static str,
    pub(super) frame: Vec<u8>,
    pub(super) ingress: u32,
    pub(super) subject: Subject,
}

/// The flows that keep `pkt` forwarded across repeats: its flow (translating it to `new_src` →
/// `new_dst`) and, when that changes the tuple, the flow of the translated packet back.
fn flow_pair(
    ingress: u32,
    pkt: &Spec,
    new_src: (IpAddr, u16),
    new_dst: (IpAddr, u16),
    reply: bool,
) -> Vec<FlowEntry> {
    let there = flow(ingress, pkt, new_src, new_dst, reply);
    if new_src == (pkt.src, pkt.sport) && new_dst == (pkt.dst, pkt.dport) {
        return vec![there];
    }
    let translated = Spec {
        src: new_src.0,
        sport: new_src.1,
        dst: new_dst.0,
        dport: new_dst.1,
        ..pkt.clone()
    };
    let back = flow(
        ingress,
        &translated,
        (pkt.src, pkt.sport),
        (pkt.dst, pkt.dport),
        reply,
    );
    vec![there, back]
}

/// A forwarding case.
fn forward(
    bed: &Bed,
    name: &'static str,
    ingress: u32,
    pkt: Spec,
    new_src: (IpAddr, u16),
    new_dst: (IpAddr, u16),
    reply: bool,
) -> Case {
    let slot = if ingress == bed.lan {
        LAN_SLOT
    } else {
        WAN_SLOT
    };
    // Where the forwarded frame goes, hence where the next run's frame is addressed to.
    let next_hop = if ingress == bed.lan {
        GW_MAC
    } else {
        CLIENT_MAC
    };
    let pkt = Spec {
        eth_dst: next_hop,
        ..pkt
    };
    Case {
        name,
        frame: pkt.frame(),
        ingress,
        subject: Subject::Router {
            setup: with_verdict_age(
                Setup::managed(bed, flow_pair(ingress, &pkt, new_src, new_dst, reply))
                    .with_iface_mac(ingress, next_hop),
            ),
            slot,
            reason: if reply {
                Reason::ForwardedReply
            } else {
                Reason::ForwardedOriginal
            },
            verdict: XDP_REDIRECT,
        },
    }
}

/// `setup` with verdicts expiring, as the daemon runs it (`verdict_max_age_ms`), so that every
/// forward pays the age check: here after an hour, longer than any run, the flows armed now.
fn with_verdict_age(mut setup: Setup) -> Setup {
    let now = verdict_tick(coarse_monotonic_ns());
    setup.verdict_max_age = verdict_tick(3_600_000_000_000);
    setup.flows = setup.flows.into_iter().map(|f| f.armed_at(now)).collect();
    setup
}

/// `case` with TCP/UDP checksums not verified (`nf_conntrack_checksum = 0`).
fn unverified(mut case: Case) -> Case {
    if let Subject::Router { setup, .. } = &mut case.subject {
        setup.verify_l4_checksum = false;
    }
    case
}

/// A case passed to the kernel from `lan0` under `reason`.
fn pass(name: &'static str, pkt: &Spec, ingress: u32, setup: Setup, reason: Reason) -> Case {
    Case {
        name,
        frame: pkt.frame(),
        ingress,
        subject: Subject::Router {
            setup,
            slot: LAN_SLOT,
            reason,
            verdict: XDP_PASS,
        },
    }
}

/// Every row of the table; `baselines` are loaded in this order: XDP_PASS, bare redirect.
pub(super) fn cases(bed: &Bed) -> Vec<Case> {
    let b = bed;
    let udp = Transport::Udp;
    let tcp = Transport::Tcp(ACK | PSH);
    let (client4, client6) = (v4("192.0.2.10"), v6("2001:db8:1::10"));
    let (server4, server6) = (v4("198.18.0.7"), v6("2001:db8:ff::7"));
    let (router4, router6) = (v4("198.51.100.1"), v6("2001:db8:2::1"));
    // Minimum frames: 60 bytes + FCS = 64 on the wire for IPv4; IPv6 + UDP needs at least 62.
    let bench = |mut p: Spec| {
        p.ttl = START_TTL;
        p
    };
    let v4_udp = bench(lan_pkt(client4, server4, udp, 18));
    let v6_udp = bench(lan_pkt(client6, server6, udp, 2));
    // 1500-byte frames (the 1514-byte maximum of a 1500 MTU minus the Ethernet header's 14).
    let v4_1500 = bench(lan_pkt(client4, server4, udp, 1500 - 14 - 20 - 8));
    let v6_1500 = bench(lan_pkt(client6, server6, udp, 1500 - 14 - 40 - 8));
    let mut reply = bench(wan_pkt(server4, v4(LAN_HOST2), 61_000, udp));
    reply.payload_len = 18;
    vec![
        forward(
            b,
            "v4 udp snat original",
            b.lan,
            v4_udp.clone(),
            (router4, 61_000),
            (server4, 443),
            false,
        ),
        forward(
            b,
            "v4 udp reverse-nat reply",
            b.wan,
            reply,
            (server4, 443),
            (client4, 40_000),
            true,
        ),
        forward(
            b,
            "v4 tcp snat original",
            b.lan,
            bench(lan_pkt(client4, server4, tcp, 6)),
            (router4, 61_000),
            (server4, 443),
            false,
        ),
        forward(
            b,
            "v4 udp routed",
            b.lan,
            v4_udp.clone(),
            (client4, 40_000),
            (server4, 443),
            false,
        ),
        forward(
            b,
            "v6 udp routed",
            b.lan,
            v6_udp.clone(),
            (client6, 40_000),
            (server6, 443),
            false,
        ),
        forward(
            b,
            "v6 udp snat original",
            b.lan,
            v6_udp.clone(),
            (router6, 61_000),
            (server6, 443),
            false,
        ),
        // The TCP/UDP checksum verification (nf_conntrack_checksum = 1) by packet size.
        unverified(forward(
            b,
            "v4 udp snat, no l4 csum check",
            b.lan,
            v4_udp.clone(),
            (router4, 61_000),
            (server4, 443),
            false,
        )),
        unverified(forward(
            b,
            "v6 udp snat, no l4 csum check",
            b.lan,
            v6_udp.clone(),
            (router6, 61_000),
            (server6, 443),
            false,
        )),
        forward(
            b,
            "v4 udp snat 1500 B",
            b.lan,
            v4_1500.clone(),
            (router4, 61_000),
            (server4, 443),
            false,
        ),
        unverified(forward(
            b,
            "v4 udp snat 1500 B, no l4 check",
            b.lan,
            v4_1500,
            (router4, 61_000),
            (server4, 443),
            false,
        )),
        forward(
            b,
            "v6 udp snat 1500 B",
            b.lan,
            v6_1500.clone(),
            (router6, 61_000),
            (server6, 443),
            false,
        ),
        unverified(forward(
            b,
            "v6 udp snat 1500 B, no l4 check",
            b.lan,
            v6_1500,
            (router6, 61_000),
            (server6, 443),
            false,
        )),
        pass(
            "v4 pass: egress shaped",
            &v4_udp,
            b.lan,
            Setup::managed(
                b,
                flow_pair(b.lan, &v4_udp, (router4, 61_000), (server4, 443), false),
            )
            .with_iface_flags(b.wan, IFACE_F_SHAPED),
            Reason::PassEgressShaped,
        ),
        pass(
            "v6 pass: egress shaped",
            &v6_udp,
            b.lan,
            Setup::managed(
                b,
                flow_pair(b.lan, &v6_udp, (router6, 61_000), (server6, 443), false),
            )
            .with_iface_flags(b.wan, IFACE_F_SHAPED),
            Reason::PassEgressShaped,
        ),
        pass(
            "v6 pass: no flow",
            &v6_udp,
            b.lan,
            Setup::managed(b, Vec::new()),
            Reason::PassNoFlow,
        ),
        pass(
            "v4 pass: no flow",
            &v4_udp,
            b.lan,
            Setup::managed(b, Vec::new()),
            Reason::PassNoFlow,
        ),
        pass(
            "v4 pass: fast path disabled",
            &v4_udp,
            b.lan,
            Setup {
                fastpath: false,
                ..Setup::managed(b, Vec::new())
            },
            Reason::PassDisabled,
        ),
        Case {
            name: "baseline: XDP_PASS",
            frame: v4_udp.frame(),
            ingress: b.lan,
            subject: Subject::Baseline {
                index: 0,
                verdict: XDP_PASS,
            },
        },
        Case {
            name: BARE_REDIRECT,
            frame: v4_udp.frame(),
            ingress: b.lan,
            subject: Subject::Baseline {
                index: 1,
                verdict: XDP_REDIRECT,
            },
        },
    ]
}
