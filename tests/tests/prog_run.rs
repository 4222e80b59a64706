//! BPF_PROG_RUN fixture table for the `xdp_router` program.
//!
//! Each case is: an input frame, the map contents (flows, interfaces, redirect ports, settings),
//! the expected verdict, the expected output frame, and the expected `STATS` delta. The program
//! runs with `Xdp::test_run` on a thread inside a network namespace that holds a real FIB:
//! `bpf_fib_lookup` consults the routes and neighbours of the namespace of the calling thread
//! (through the ingress device given in the `xdp_md` context).
//!
//! Router namespace (`xr-dp-<pid>-<n>`), interfaces and what is behind them:
//! - `lan0` 192.0.2.1/24, 2001:db8:1::1/64; client .10 / ::10 (permanent neighbour)
//! - `wan0` 198.51.100.1/24, 2001:db8:2::1/64; gateway .254 / ::fe (permanent neighbour);
//!   default routes via the gateway; 203.0.113.192/26 and 2001:db8:beef::/48 via a gateway
//!   without neighbour entry (.253 / ::fd)
//! - `mtu0` (MTU 1280) 203.0.113.129/26, 2001:db8:3::1/64; peer .130 / ::2
//! - blackhole 203.0.113.0/26 and 2001:db8:dead::/48, unreachable 203.0.113.64/26
//!
//! Run: `cargo test -p xdp-router-tests --test prog_run -- --test-threads=1` (as root).

use std::{
    collections::BTreeSet,
    ffi::CString,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, DevMapHash, HashMap, MapData, PerCpuArray},
    programs::{TestRun, TestRunOptions, Xdp},
};
use xdp_router_common::{
    Counter, FLOW_F_REPLY, FLOW_F_REWRITE_DST, FLOW_F_REWRITE_SRC, FlowKeyV4, FlowKeyV6, FlowV4,
    FlowV6, IFACE_F_LAN, IFACE_F_SHAPED, IFACE_F_WAN, IfaceInfo, MAP_FLOWS_V4, MAP_FLOWS_V6,
    MAP_IFACES, MAP_SETTINGS, MAP_STATS, MAP_TX_PORTS, PROG_NAME, Reason, Settings,
    checksum::{nat_diff_v4, nat_diff_v6},
    stats_index,
};
use xdp_router_tests::{
    netns::{Netns, require_root},
    packet::{
        ETH_LEN, Spec, Transport, arp_request, fix_ipv4_checksum, icmpv4_echo, icmpv6_echo,
        tcp_flags::{ACK, FIN, PSH, RST, SYN},
        verify_checksums, with_ipv4_frag, with_ipv4_options, with_ipv6_ext, with_vlan_tag,
        with_zero_udp_checksum,
    },
};

const XDP_PASS: u32 = 2;
const XDP_REDIRECT: u32 = 4;

const LAN_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x01];
const WAN_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x02, 0x01];
const MTU_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x03, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x0a];
const GW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x02, 0xfe];
const MTU_PEER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x03, 0x02];

const LAN_SLOT: u32 = 1;
const WAN_SLOT: u32 = 2;
const MTU_SLOT: u32 = 3;

fn mac(m: [u8; 6]) -> String {
    m.map(|b| format!("{b:02x}")).join(":")
}

fn v4(s: &str) -> IpAddr {
    IpAddr::V4(s.parse::<Ipv4Addr>().unwrap_or_else(|e| panic!("{s}: {e}")))
}

fn v6(s: &str) -> IpAddr {
    IpAddr::V6(s.parse::<Ipv6Addr>().unwrap_or_else(|e| panic!("{s}: {e}")))
}

/// Interface indexes of the router namespace.
#[derive(Clone, Copy, Debug)]
struct Bed {
    lan: u32,
    wan: u32,
    mtu: u32,
}

/// Builds the router namespace (see the module docs); `hosts` holds the veth peers.
fn build_topology(router: &Netns, hosts: &Netns) {
    router.veth("lan0", hosts, "lan0p");
    router.veth("wan0", hosts, "wan0p");
    router.veth("mtu0", hosts, "mtu0p");
    router.sh(&format!(
        "set -e
        ip link set lan0 address {lan}
        ip link set wan0 address {wan}
        ip link set mtu0 address {mtu}
        ip link set mtu0 mtu 1280
        ip addr add 192.0.2.1/24 dev lan0
        ip addr add 2001:db8:1::1/64 dev lan0 nodad
        ip addr add 198.51.100.1/24 dev wan0
        ip addr add 2001:db8:2::1/64 dev wan0 nodad
        ip addr add 203.0.113.129/26 dev mtu0
        ip addr add 2001:db8:3::1/64 dev mtu0 nodad
        ip neigh replace 192.0.2.10 lladdr {client} dev lan0 nud permanent
        ip neigh replace 2001:db8:1::10 lladdr {client} dev lan0 nud permanent
        ip neigh replace 198.51.100.254 lladdr {gw} dev wan0 nud permanent
        ip neigh replace 2001:db8:2::fe lladdr {gw} dev wan0 nud permanent
        ip neigh replace 203.0.113.130 lladdr {peer} dev mtu0 nud permanent
        ip neigh replace 2001:db8:3::2 lladdr {peer} dev mtu0 nud permanent
        ip route add default via 198.51.100.254 dev wan0
        ip -6 route add default via 2001:db8:2::fe dev wan0
        ip route add blackhole 203.0.113.0/26
        ip route add unreachable 203.0.113.64/26
        ip route add 203.0.113.192/26 via 198.51.100.253 dev wan0
        ip -6 route add blackhole 2001:db8:dead::/48
        ip -6 route add 2001:db8:beef::/48 via 2001:db8:2::fd dev wan0
        sysctl -qw net.ipv4.ip_forward=1
        sysctl -qw net.ipv6.conf.all.forwarding=1",
        lan = mac(LAN_MAC),
        wan = mac(WAN_MAC),
        mtu = mac(MTU_MAC),
        client = mac(CLIENT_MAC),
        gw = mac(GW_MAC),
        peer = mac(MTU_PEER_MAC),
    ));
}

/// ifindex of `name` in the calling thread's namespace.
fn ifindex(name: &str) -> u32 {
    let c = CString::new(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    // SAFETY: c is a valid NUL-terminated string.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    assert_ne!(
        idx,
        0,
        "no interface {name}: {}",
        std::io::Error::last_os_error()
    );
    idx
}

// ---------------------------------------------------------------------------------------------
// Map setup of a case
// ---------------------------------------------------------------------------------------------

/// One flow map entry.
#[derive(Clone, Copy, Debug)]
enum FlowEntry {
    V4(FlowKeyV4, FlowV4),
    V6(FlowKeyV6, FlowV6),
}

fn raw_port(p: u16) -> u16 {
    p.to_be()
}

fn raw_v4(a: IpAddr) -> u32 {
    match a {
        IpAddr::V4(a) => u32::from_ne_bytes(a.octets()),
        IpAddr::V6(a) => panic!("{a} is not IPv4"),
    }
}

fn raw_v6(a: IpAddr) -> [u32; 4] {
    match a {
        IpAddr::V6(a) => {
            let o = a.octets();
            std::array::from_fn(|i| {
                u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
            })
        }
        IpAddr::V4(a) => panic!("{a} is not IPv6"),
    }
}

/// The flow entry the daemon would write for packets like `pkt` arriving on `ingress`, to be
/// translated to `new_src` → `new_dst` (the same as the packet's for no NAT).
fn flow(
    ingress: u32,
    pkt: &Spec,
    (new_src, new_sport): (IpAddr, u16),
    (new_dst, new_dport): (IpAddr, u16),
    reply: bool,
) -> FlowEntry {
    let proto = match pkt.transport {
        Transport::Tcp(_) => 6,
        Transport::Udp => 17,
    };
    let mut flags = if reply { FLOW_F_REPLY } else { 0 };
    if (new_src, new_sport) != (pkt.src, pkt.sport) {
        flags |= FLOW_F_REWRITE_SRC;
    }
    if (new_dst, new_dport) != (pkt.dst, pkt.dport) {
        flags |= FLOW_F_REWRITE_DST;
    }
    let (sport, dport) = (raw_port(pkt.sport), raw_port(pkt.dport));
    let (nsport, ndport) = (raw_port(new_sport), raw_port(new_dport));
    match pkt.src {
        IpAddr::V4(_) => {
            let key = FlowKeyV4 {
                ifindex: ingress,
                src_be: raw_v4(pkt.src),
                dst_be: raw_v4(pkt.dst),
                sport_be: sport,
                dport_be: dport,
                proto,
                _pad: [0; 3],
            };
            let (l3, l4) = nat_diff_v4(
                key.src_be,
                key.dst_be,
                sport,
                dport,
                raw_v4(new_src),
                raw_v4(new_dst),
                nsport,
                ndport,
            );
            FlowEntry::V4(
                key,
                FlowV4 {
                    new_src_be: raw_v4(new_src),
                    new_dst_be: raw_v4(new_dst),
                    new_sport_be: nsport,
                    new_dport_be: ndport,
                    flags,
                    l3_csum_diff: l3,
                    l4_csum_diff: l4,
                    ..Default::default()
                },
            )
        }
        IpAddr::V6(_) => {
            let key = FlowKeyV6 {
                ifindex: ingress,
                src_be: raw_v6(pkt.src),
                dst_be: raw_v6(pkt.dst),
                sport_be: sport,
                dport_be: dport,
                proto,
                _pad: [0; 3],
            };
            let l4 = nat_diff_v6(
                key.src_be,
                key.dst_be,
                sport,
                dport,
                raw_v6(new_src),
                raw_v6(new_dst),
                nsport,
                ndport,
            );
            FlowEntry::V6(
                key,
                FlowV6 {
                    new_src_be: raw_v6(new_src),
                    new_dst_be: raw_v6(new_dst),
                    new_sport_be: nsport,
                    new_dport_be: ndport,
                    flags,
                    l4_csum_diff: l4,
                    ..Default::default()
                },
            )
        }
    }
}

/// A flow that forwards `pkt` unchanged (routing only).
fn routed(ingress: u32, pkt: &Spec, reply: bool) -> FlowEntry {
    flow(
        ingress,
        pkt,
        (pkt.src, pkt.sport),
        (pkt.dst, pkt.dport),
        reply,
    )
}

/// Map contents of a case.
#[derive(Clone, Debug)]
struct Setup {
    flows: Vec<FlowEntry>,
    ifaces: Vec<(u32, IfaceInfo)>,
    tx_ports: Vec<u32>,
    fastpath: bool,
}

impl Setup {
    /// All three interfaces managed and redirectable, fast path on.
    fn managed(bed: &Bed, flows: Vec<FlowEntry>) -> Setup {
        Setup {
            flows,
            ifaces: vec![
                (
                    bed.lan,
                    IfaceInfo {
                        slot: LAN_SLOT,
                        flags: IFACE_F_LAN,
                    },
                ),
                (
                    bed.wan,
                    IfaceInfo {
                        slot: WAN_SLOT,
                        flags: IFACE_F_WAN,
                    },
                ),
                (
                    bed.mtu,
                    IfaceInfo {
                        slot: MTU_SLOT,
                        flags: IFACE_F_WAN,
                    },
                ),
            ],
            tx_ports: vec![bed.lan, bed.wan, bed.mtu],
            fastpath: true,
        }
    }

    fn without_iface(mut self, ifindex: u32) -> Setup {
        self.ifaces.retain(|(i, _)| *i != ifindex);
        self
    }

    fn without_tx_port(mut self, ifindex: u32) -> Setup {
        self.tx_ports.retain(|i| *i != ifindex);
        self
    }

    fn with_iface_flags(mut self, ifindex: u32, flags: u32) -> Setup {
        for (i, info) in &mut self.ifaces {
            if *i == ifindex {
                info.flags |= flags;
            }
        }
        self
    }
}

// ---------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Expect {
    /// XDP_PASS, frame unchanged, counted under this reason.
    Pass(Reason),
    /// XDP_REDIRECT with exactly this output frame, counted under this reason; `Setup::flows[0]`
    /// is the flow that must count the packet.
    Redirect(Reason, Vec<u8>),
}

#[derive(Clone, Debug)]
struct Case {
    name: String,
    ingress: u32,
    /// STATS slot the packet must be counted in.
    slot: u32,
    frame: Vec<u8>,
    setup: Setup,
    expect: Expect,
}

impl Case {
    fn reason(&self) -> Reason {
        match &self.expect {
            Expect::Pass(r) | Expect::Redirect(r, _) => *r,
        }
    }
}

fn slot_of(bed: &Bed, ingress: u32) -> u32 {
    match ingress {
        i if i == bed.lan => LAN_SLOT,
        i if i == bed.wan => WAN_SLOT,
        i if i == bed.mtu => MTU_SLOT,
        _ => 0,
    }
}

fn pass(bed: &Bed, name: &str, ingress: u32, frame: Vec<u8>, setup: Setup, r: Reason) -> Case {
    Case {
        name: name.to_owned(),
        ingress,
        slot: slot_of(bed, ingress),
        frame,
        setup,
        expect: Expect::Pass(r),
    }
}

/// A forwarding case: `pkt` arrives on `ingress`, its flow translates it to `new_src` →
/// `new_dst`, and it must leave with `egress_macs` (router MAC, next-hop MAC) and TTL - 1.
#[expect(clippy::too_many_arguments, reason = "one row of the fixture table")]
fn forward(
    bed: &Bed,
    name: &str,
    ingress: u32,
    pkt: &Spec,
    new_src: (IpAddr, u16),
    new_dst: (IpAddr, u16),
    reply: bool,
    (smac, dmac): ([u8; 6], [u8; 6]),
) -> Case {
    let out = pkt.forwarded(smac, dmac, new_src, new_dst).frame();
    let reason = if reply {
        Reason::ForwardedReply
    } else {
        Reason::ForwardedOriginal
    };
    Case {
        name: name.to_owned(),
        ingress,
        slot: slot_of(bed, ingress),
        frame: pkt.frame(),
        setup: Setup::managed(bed, vec![flow(ingress, pkt, new_src, new_dst, reply)]),
        expect: Expect::Redirect(reason, out),
    }
}

/// A LAN client's packet to a server behind the WAN.
fn lan_pkt(src: IpAddr, dst: IpAddr, transport: Transport, payload_len: usize) -> Spec {
    Spec {
        eth_src: CLIENT_MAC,
        eth_dst: LAN_MAC,
        src,
        dst,
        sport: 40_000,
        dport: 443,
        ttl: 64,
        transport,
        payload_len,
    }
}

/// A server's reply arriving on the WAN, addressed to the router (after SNAT) or the client.
fn wan_pkt(src: IpAddr, dst: IpAddr, dport: u16, transport: Transport) -> Spec {
    Spec {
        eth_src: GW_MAC,
        eth_dst: WAN_MAC,
        src,
        dst,
        sport: 443,
        dport,
        ttl: 57,
        transport,
        payload_len: 120,
    }
}

/// Every case of the table.
fn cases(bed: &Bed) -> Vec<Case> {
    let b = bed;
    let tcp = Transport::Tcp(ACK | PSH);
    let udp = Transport::Udp;
    let (client4, client6) = (v4("192.0.2.10"), v6("2001:db8:1::10"));
    let (server4, server6) = (v4("198.18.0.7"), v6("2001:db8:ff::7"));
    let (router4, router6) = (v4("198.51.100.1"), v6("2001:db8:2::1"));
    let to_wan = (WAN_MAC, GW_MAC);
    let to_lan = (LAN_MAC, CLIENT_MAC);
    let mut c = Vec::new();

    // --- Forwarded -----------------------------------------------------------------------
    let p = lan_pkt(client4, server4, tcp, 100);
    c.push(forward(
        b,
        "v4 tcp snat original",
        b.lan,
        &p,
        (router4, 61_000),
        (server4, 443),
        false,
        to_wan,
    ));
    let p = wan_pkt(server4, router4, 61_000, tcp);
    c.push(forward(
        b,
        "v4 tcp reverse nat reply",
        b.wan,
        &p,
        (server4, 443),
        (client4, 40_000),
        true,
        to_lan,
    ));
    let p = lan_pkt(client4, server4, udp, 64);
    c.push(forward(
        b,
        "v4 udp snat original",
        b.lan,
        &p,
        (router4, 61_001),
        (server4, 443),
        false,
        to_wan,
    ));
    let p = wan_pkt(server4, router4, 61_001, udp);
    c.push(forward(
        b,
        "v4 udp reverse nat reply",
        b.wan,
        &p,
        (server4, 443),
        (client4, 40_000),
        true,
        to_lan,
    ));
    let p = lan_pkt(client4, server4, tcp, 100);
    c.push(forward(
        b,
        "v4 tcp routed, no nat",
        b.lan,
        &p,
        (client4, 40_000),
        (server4, 443),
        false,
        to_wan,
    ));
    {
        // UDP over IPv4 without checksum (0): after SNAT it must still be 0, not a bogus value.
        let p = lan_pkt(client4, server4, udp, 64);
        let mut case = forward(
            b,
            "v4 udp zero checksum stays zero",
            b.lan,
            &p,
            (router4, 61_002),
            (server4, 443),
            false,
            to_wan,
        );
        case.frame = with_zero_udp_checksum(&case.frame);
        if let Expect::Redirect(_, out) = &mut case.expect {
            *out = with_zero_udp_checksum(out);
        }
        c.push(case);
    }
    {
        // Exactly the egress MTU (1280) still fits.
        let mut p = lan_pkt(client4, v4("203.0.113.130"), tcp, 1280 - 40);
        p.dport = 8080;
        c.push(forward(
            b,
            "v4 tcp at egress mtu",
            b.lan,
            &p,
            (p.src, p.sport),
            (p.dst, p.dport),
            false,
            (MTU_MAC, MTU_PEER_MAC),
        ));
    }
    let p = lan_pkt(client6, server6, tcp, 100);
    c.push(forward(
        b,
        "v6 tcp routed original",
        b.lan,
        &p,
        (client6, 40_000),
        (server6, 443),
        false,
        to_wan,
    ));
    let p = wan_pkt(server6, client6, 40_000, udp);
    c.push(forward(
        b,
        "v6 udp routed reply",
        b.wan,
        &p,
        (server6, 443),
        (client6, 40_000),
        true,
        to_lan,
    ));
    let p = lan_pkt(client6, server6, tcp, 100);
    c.push(forward(
        b,
        "v6 tcp snat original",
        b.lan,
        &p,
        (router6, 61_000),
        (server6, 443),
        false,
        to_wan,
    ));
    let p = wan_pkt(server6, router6, 61_000, tcp);
    c.push(forward(
        b,
        "v6 tcp reverse nat reply",
        b.wan,
        &p,
        (server6, 443),
        (client6, 40_000),
        true,
        to_lan,
    ));
    let p = lan_pkt(client6, server6, udp, 80);
    c.push(forward(
        b,
        "v6 udp snat original",
        b.lan,
        &p,
        (router6, 61_003),
        (server6, 443),
        false,
        to_wan,
    ));
    let p = wan_pkt(server6, router6, 61_003, udp);
    c.push(forward(
        b,
        "v6 udp reverse nat reply",
        b.wan,
        &p,
        (server6, 443),
        (client6, 40_000),
        true,
        to_lan,
    ));

    // --- Passed, with the flow that would otherwise forward them present ------------------
    let good4 = lan_pkt(client4, server4, tcp, 100);
    let good6 = lan_pkt(client6, server6, tcp, 100);
    let flows4 = || vec![routed(b.lan, &good4, false)];
    let flows6 = || vec![routed(b.lan, &good6, false)];
    let m4 = || Setup::managed(b, flows4());
    let m6 = || Setup::managed(b, flows6());

    let mut off = m4();
    off.fastpath = false;
    c.push(pass(
        b,
        "fast path disabled",
        b.lan,
        good4.frame(),
        off,
        Reason::PassDisabled,
    ));

    c.push(pass(
        b,
        "arp",
        b.lan,
        arp_request(CLIENT_MAC, [192, 0, 2, 10], [192, 0, 2, 1]),
        m4(),
        Reason::PassNotIp,
    ));
    c.push(pass(
        b,
        "vlan tagged ipv4",
        b.lan,
        with_vlan_tag(&good4.frame(), 7),
        m4(),
        Reason::PassNotIp,
    ));

    {
        let f = good4.frame();
        c.push(pass(
            b,
            "truncated ipv4 header",
            b.lan,
            f[..ETH_LEN + 10].to_vec(),
            m4(),
            Reason::PassMalformed,
        ));
        c.push(pass(
            b,
            "ipv4 total length beyond frame",
            b.lan,
            f[..f.len() - 1].to_vec(),
            m4(),
            Reason::PassMalformed,
        ));
        let mut short = f[..ETH_LEN + 30].to_vec();
        short[ETH_LEN + 2..ETH_LEN + 4].copy_from_slice(&30u16.to_be_bytes());
        fix_ipv4_checksum(&mut short);
        c.push(pass(
            b,
            "tcp header truncated",
            b.lan,
            short,
            m4(),
            Reason::PassMalformed,
        ));
        let mut ihl = f.clone();
        ihl[ETH_LEN] = 0x44;
        c.push(pass(
            b,
            "ipv4 ihl below 5",
            b.lan,
            ihl,
            m4(),
            Reason::PassMalformed,
        ));
        let mut ver = f.clone();
        ver[ETH_LEN] = 0x65;
        c.push(pass(
            b,
            "ipv4 ethertype with version 6",
            b.lan,
            ver,
            m4(),
            Reason::PassMalformed,
        ));
        let f6 = good6.frame();
        c.push(pass(
            b,
            "truncated ipv6 header",
            b.lan,
            f6[..ETH_LEN + 39].to_vec(),
            m6(),
            Reason::PassMalformed,
        ));
        c.push(pass(
            b,
            "ipv6 payload beyond frame",
            b.lan,
            f6[..f6.len() - 1].to_vec(),
            m6(),
            Reason::PassMalformed,
        ));
    }

    c.push(pass(
        b,
        "ipv4 options",
        b.lan,
        with_ipv4_options(&good4.frame(), &[1, 1, 1, 0]),
        m4(),
        Reason::PassIpv4Options,
    ));
    c.push(pass(
        b,
        "ipv4 more fragments",
        b.lan,
        with_ipv4_frag(&good4.frame(), 0x2000),
        m4(),
        Reason::PassIpv4Fragment,
    ));
    c.push(pass(
        b,
        "ipv4 fragment offset",
        b.lan,
        with_ipv4_frag(&good4.frame(), 0x0010),
        m4(),
        Reason::PassIpv4Fragment,
    ));

    // Fragment header (44) and destination options (60, PadN) before TCP.
    c.push(pass(
        b,
        "ipv6 fragment header",
        b.lan,
        with_ipv6_ext(&good6.frame(), 44, &[0, 0, 0, 1, 0, 0, 0x12, 0x34]),
        m6(),
        Reason::PassIpv6ExtHeader,
    ));
    c.push(pass(
        b,
        "ipv6 destination options",
        b.lan,
        with_ipv6_ext(&good6.frame(), 60, &[0, 0, 1, 4, 0, 0, 0, 0]),
        m6(),
        Reason::PassIpv6ExtHeader,
    ));

    {
        let mut t = good4.clone();
        t.ttl = 1;
        c.push(pass(
            b,
            "ipv4 ttl 1",
            b.lan,
            t.frame(),
            Setup::managed(b, vec![routed(b.lan, &t, false)]),
            Reason::PassTtlExpired,
        ));
        let mut t = good6.clone();
        t.ttl = 1;
        c.push(pass(
            b,
            "ipv6 hop limit 1",
            b.lan,
            t.frame(),
            Setup::managed(b, vec![routed(b.lan, &t, false)]),
            Reason::PassTtlExpired,
        ));
    }

    c.push(pass(
        b,
        "icmpv4",
        b.lan,
        icmpv4_echo(CLIENT_MAC, LAN_MAC, [192, 0, 2, 10], [198, 18, 0, 7]),
        m4(),
        Reason::PassNotTcpUdp,
    ));
    {
        let (IpAddr::V6(s), IpAddr::V6(d)) = (client6, server6) else {
            unreachable!()
        };
        c.push(pass(
            b,
            "icmpv6",
            b.lan,
            icmpv6_echo(CLIENT_MAC, LAN_MAC, s.octets(), d.octets()),
            m6(),
            Reason::PassNotTcpUdp,
        ));
    }

    for (name, flags) in [
        ("tcp syn", SYN),
        ("tcp syn ack", SYN | ACK),
        ("tcp fin", FIN | ACK),
        ("tcp rst", RST),
    ] {
        let mut t = good4.clone();
        t.transport = Transport::Tcp(flags);
        c.push(pass(
            b,
            name,
            b.lan,
            t.frame(),
            Setup::managed(b, vec![routed(b.lan, &t, false)]),
            Reason::PassTcpControl,
        ));
    }
    {
        let mut t = good6.clone();
        t.transport = Transport::Tcp(SYN);
        c.push(pass(
            b,
            "ipv6 tcp syn",
            b.lan,
            t.frame(),
            Setup::managed(b, vec![routed(b.lan, &t, false)]),
            Reason::PassTcpControl,
        ));
    }

    c.push(pass(
        b,
        "no flow v4",
        b.lan,
        good4.frame(),
        Setup::managed(b, vec![]),
        Reason::PassNoFlow,
    ));
    c.push(pass(
        b,
        "no flow v6",
        b.lan,
        good6.frame(),
        Setup::managed(b, vec![]),
        Reason::PassNoFlow,
    ));
    c.push(pass(
        b,
        "flow of the other interface",
        b.lan,
        good4.frame(),
        Setup::managed(b, vec![routed(b.wan, &good4, false)]),
        Reason::PassNoFlow,
    ));
    {
        let mut other_port = good4.clone();
        other_port.sport += 1;
        c.push(pass(
            b,
            "flow of another port",
            b.lan,
            good4.frame(),
            Setup::managed(b, vec![routed(b.lan, &other_port, false)]),
            Reason::PassNoFlow,
        ));
        let mut t = good4.clone();
        t.transport = Transport::Udp;
        c.push(pass(
            b,
            "flow of the other protocol",
            b.lan,
            t.frame(),
            m4(),
            Reason::PassNoFlow,
        ));
    }
    {
        // The ingress interface is not in IFACES: counted in slot 0.
        let mut case = pass(
            b,
            "unmanaged ingress counted in slot 0",
            b.lan,
            good4.frame(),
            Setup::managed(b, vec![]).without_iface(b.lan),
            Reason::PassNoFlow,
        );
        case.slot = 0;
        c.push(case);
    }

    // FIB answers, each with a routed flow towards the destination in question.
    let to = |dst: &str| {
        let mut p = good4.clone();
        p.dst = v4(dst);
        let s = Setup::managed(b, vec![routed(b.lan, &p, false)]);
        (p.frame(), s)
    };
    let to6 = |dst: &str| {
        let mut p = good6.clone();
        p.dst = v6(dst);
        let s = Setup::managed(b, vec![routed(b.lan, &p, false)]);
        (p.frame(), s)
    };
    let (f, s) = to("203.0.113.7");
    c.push(pass(
        b,
        "blackhole route",
        b.lan,
        f,
        s,
        Reason::PassFibNotForwardable,
    ));
    let (f, s) = to("203.0.113.70");
    c.push(pass(
        b,
        "unreachable route",
        b.lan,
        f,
        s,
        Reason::PassFibNotForwardable,
    ));
    let (f, s) = to("198.51.100.1");
    c.push(pass(
        b,
        "local destination",
        b.lan,
        f,
        s,
        Reason::PassFibNotForwardable,
    ));
    let (f, s) = to6("2001:db8:dead::1");
    c.push(pass(
        b,
        "ipv6 blackhole route",
        b.lan,
        f,
        s,
        Reason::PassFibNotForwardable,
    ));
    {
        // The flow's *translated* destination decides: the packet is to a routable server,
        // but the flow rewrites it into the blackhole.
        let s = Setup::managed(
            b,
            vec![flow(
                b.lan,
                &good4,
                (client4, 40_000),
                (v4("203.0.113.8"), 443),
                false,
            )],
        );
        c.push(pass(
            b,
            "translated destination blackholed",
            b.lan,
            good4.frame(),
            s,
            Reason::PassFibNotForwardable,
        ));
    }
    let (f, s) = to("203.0.113.200");
    c.push(pass(
        b,
        "no neighbour",
        b.lan,
        f,
        s,
        Reason::PassNoNeighbour,
    ));
    let (f, s) = to6("2001:db8:beef::1");
    c.push(pass(
        b,
        "ipv6 no neighbour",
        b.lan,
        f,
        s,
        Reason::PassNoNeighbour,
    ));
    {
        let mut p = lan_pkt(client4, v4("203.0.113.130"), tcp, 1300);
        p.dport = 8080;
        c.push(pass(
            b,
            "frag needed",
            b.lan,
            p.frame(),
            Setup::managed(b, vec![routed(b.lan, &p, false)]),
            Reason::PassFragNeeded,
        ));
        let mut p = lan_pkt(client6, v6("2001:db8:3::2"), udp, 1300);
        p.dport = 8080;
        c.push(pass(
            b,
            "ipv6 packet too big",
            b.lan,
            p.frame(),
            Setup::managed(b, vec![routed(b.lan, &p, false)]),
            Reason::PassFragNeeded,
        ));
    }

    c.push(pass(
        b,
        "egress not in IFACES",
        b.lan,
        good4.frame(),
        m4().without_iface(b.wan),
        Reason::PassEgressNotManaged,
    ));
    c.push(pass(
        b,
        "egress not in TX_PORTS",
        b.lan,
        good4.frame(),
        m4().without_tx_port(b.wan),
        Reason::PassEgressNotManaged,
    ));
    c.push(pass(
        b,
        "ipv6 egress not in IFACES",
        b.lan,
        good6.frame(),
        m6().without_iface(b.wan),
        Reason::PassEgressNotManaged,
    ));
    c.push(pass(
        b,
        "egress shaped",
        b.lan,
        good4.frame(),
        m4().with_iface_flags(b.wan, IFACE_F_SHAPED),
        Reason::PassEgressShaped,
    ));
    c.push(pass(
        b,
        "ipv6 egress shaped",
        b.lan,
        good6.frame(),
        m6().with_iface_flags(b.wan, IFACE_F_SHAPED),
        Reason::PassEgressShaped,
    ));

    c
}

// ---------------------------------------------------------------------------------------------
// Running the table
// ---------------------------------------------------------------------------------------------

/// Typed handles on every map of the loaded object.
struct Maps {
    flows_v4: HashMap<MapData, FlowKeyV4, FlowV4>,
    flows_v6: HashMap<MapData, FlowKeyV6, FlowV6>,
    ifaces: HashMap<MapData, u32, IfaceInfo>,
    tx_ports: DevMapHash<MapData>,
    stats: PerCpuArray<MapData, Counter>,
    settings: Array<MapData, Settings>,
}

fn take<T: TryFrom<aya::maps::Map>>(ebpf: &mut Ebpf, name: &str) -> T
where
    T::Error: std::fmt::Display,
{
    let map = ebpf
        .take_map(name)
        .unwrap_or_else(|| panic!("object has no map {name}"));
    T::try_from(map).unwrap_or_else(|e| panic!("map {name}: {e}"))
}

/// Loads the embedded object and the program (the verifier runs here).
fn load() -> (Ebpf, Maps) {
    let mut ebpf = EbpfLoader::new()
        .load(xdp_routerd::datapath::EBPF_OBJECT)
        .unwrap_or_else(|e| panic!("load eBPF object: {e:#}"));
    let prog: &mut Xdp = ebpf
        .program_mut(PROG_NAME)
        .unwrap_or_else(|| panic!("object has no program {PROG_NAME}"))
        .try_into()
        .unwrap_or_else(|e| panic!("{PROG_NAME} is not XDP: {e}"));
    if let Err(e) = prog.load() {
        panic!("verifier rejected {PROG_NAME}: {e}\n{:?}", e);
    }
    let maps = Maps {
        flows_v4: take(&mut ebpf, MAP_FLOWS_V4),
        flows_v6: take(&mut ebpf, MAP_FLOWS_V6),
        ifaces: take(&mut ebpf, MAP_IFACES),
        tx_ports: take(&mut ebpf, MAP_TX_PORTS),
        stats: take(&mut ebpf, MAP_STATS),
        settings: take(&mut ebpf, MAP_SETTINGS),
    };
    (ebpf, maps)
}

impl Maps {
    /// Empties every map, then writes the case's setup.
    fn apply(&mut self, s: &Setup) {
        let keys: Vec<_> = self
            .flows_v4
            .keys()
            .map(|k| k.expect("flows_v4 key"))
            .collect();
        for k in keys {
            self.flows_v4.remove(&k).expect("remove flow v4");
        }
        let keys: Vec<_> = self
            .flows_v6
            .keys()
            .map(|k| k.expect("flows_v6 key"))
            .collect();
        for k in keys {
            self.flows_v6.remove(&k).expect("remove flow v6");
        }
        let keys: Vec<_> = self.ifaces.keys().map(|k| k.expect("ifaces key")).collect();
        for k in keys {
            self.ifaces.remove(&k).expect("remove iface");
        }
        let keys: Vec<_> = self
            .tx_ports
            .keys()
            .map(|k| k.expect("tx_ports key"))
            .collect();
        for k in keys {
            self.tx_ports.remove(k).expect("remove tx port");
        }
        for f in &s.flows {
            match f {
                FlowEntry::V4(k, v) => self.flows_v4.insert(k, v, 0).expect("insert flow v4"),
                FlowEntry::V6(k, v) => self.flows_v6.insert(k, v, 0).expect("insert flow v6"),
            }
        }
        for (i, info) in &s.ifaces {
            self.ifaces.insert(i, info, 0).expect("insert iface");
        }
        for i in &s.tx_ports {
            self.tx_ports
                .insert(*i, *i, None, 0)
                .expect("insert tx port");
        }
        let settings = Settings {
            fastpath_enabled: u32::from(s.fastpath),
            _pad: 0,
        };
        self.settings.set(0, settings, 0).expect("write settings");
    }

    /// Every STATS entry, summed over CPUs.
    fn stats(&self) -> Vec<Counter> {
        self.stats
            .iter()
            .map(|per_cpu| {
                per_cpu
                    .expect("read stats")
                    .iter()
                    .fold(Counter::default(), |a, c| Counter {
                        packets: a.packets + c.packets,
                        bytes: a.bytes + c.bytes,
                    })
            })
            .collect()
    }

    /// Current counters of a flow entry.
    fn counters(&self, f: &FlowEntry) -> xdp_router_common::FlowCounters {
        match f {
            FlowEntry::V4(k, _) => self.flows_v4.get(k, 0).expect("flow v4 present").counters,
            FlowEntry::V6(k, _) => self.flows_v6.get(k, 0).expect("flow v6 present").counters,
        }
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer; CLOCK_MONOTONIC is what bpf_ktime_get_ns() reads.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Runs the program once on `frame` as received on `ingress`: (verdict, output frame).
fn run(prog: &Xdp, frame: &[u8], ingress: u32) -> (u32, Vec<u8>) {
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index,
    // egress_ifindex. The kernel wants data = data_meta = 0 and data_end = frame length.
    let md: [u32; 6] = [0, frame.len() as u32, 0, ingress, 0, 0];
    let ctx: Vec<u8> = md.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let mut out = vec![0u8; frame.len() + 512];
    let res = prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            ..TestRunOptions::default()
        })
        .unwrap_or_else(|e| panic!("BPF_PROG_RUN: {e}"));
    out.truncate(res.data_size_out as usize);
    (res.return_value, out)
}

fn hex(b: &[u8]) -> String {
    b.chunks(16)
        .map(|c| {
            c.iter()
                .map(|x| format!("{x:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n      ")
}

/// Runs one case; returns what went wrong, if anything.
fn check_case(prog: &Xdp, maps: &mut Maps, case: &Case) -> Result<(), String> {
    maps.apply(&case.setup);
    let before = maps.stats();
    let flows_before: Vec<_> = case.setup.flows.iter().map(|f| maps.counters(f)).collect();
    let t0 = monotonic_ns();
    let (verdict, out) = run(prog, &case.frame, case.ingress);
    let t1 = monotonic_ns();

    let mut errs = Vec::new();
    match &case.expect {
        Expect::Pass(_) => {
            if verdict != XDP_PASS {
                errs.push(format!("verdict {verdict}, want XDP_PASS"));
            }
            if out != case.frame {
                errs.push(format!(
                    "passed frame was modified:\n  in  {}\n  out {}",
                    hex(&case.frame),
                    hex(&out)
                ));
            }
        }
        Expect::Redirect(_, want) => {
            if verdict != XDP_REDIRECT {
                errs.push(format!("verdict {verdict}, want XDP_REDIRECT"));
            }
            if &out != want {
                errs.push(format!(
                    "output frame differs:\n  got  {}\n  want {}",
                    hex(&out),
                    hex(want)
                ));
            }
            if let Err(e) = verify_checksums(&out) {
                errs.push(format!("output checksums: {e}"));
            }
        }
    }

    // STATS: exactly one entry moved, by one packet of this frame's length.
    let after = maps.stats();
    let want_idx = stats_index(case.slot, case.reason()) as usize;
    for (i, (a, b)) in before.iter().zip(&after).enumerate() {
        let delta = (b.packets - a.packets, b.bytes - a.bytes);
        let want = if i == want_idx {
            (1, case.frame.len() as u64)
        } else {
            (0, 0)
        };
        if delta != want {
            let (slot, reason) = (
                i as u32 / Reason::COUNT,
                Reason::from_u32(i as u32 % Reason::COUNT),
            );
            errs.push(format!(
                "STATS[slot {slot}, {reason:?}] moved by {delta:?}, want {want:?}"
            ));
        }
    }

    // Flow counters: only the forwarding flow counts, with a fresh timestamp.
    for (n, (f, old)) in case.setup.flows.iter().zip(&flows_before).enumerate() {
        let now = maps.counters(f);
        let forwarded = n == 0 && matches!(case.expect, Expect::Redirect(..));
        if forwarded {
            if now.packets != old.packets + 1 || now.bytes != old.bytes + case.frame.len() as u64 {
                errs.push(format!(
                    "flow counters {now:?}, want +1 packet +{} bytes over {old:?}",
                    case.frame.len()
                ));
            }
            if !(t0..=t1).contains(&now.last_seen_ns) {
                errs.push(format!(
                    "flow last_seen_ns {} not within the run [{t0}, {t1}]",
                    now.last_seen_ns
                ));
            }
        } else if now != *old {
            errs.push(format!(
                "flow {n} counters changed on a passed packet: {old:?} -> {now:?}"
            ));
        }
    }

    // A second packet of a forwarded flow advances the counters again.
    if let (Expect::Redirect(_, want), Some(f)) = (&case.expect, case.setup.flows.first()) {
        let first = maps.counters(f);
        let (verdict, out) = run(prog, &case.frame, case.ingress);
        let second = maps.counters(f);
        if verdict != XDP_REDIRECT || &out != want {
            errs.push("second run differs from the first".to_owned());
        }
        if second.packets != first.packets + 1
            || second.bytes != first.bytes + case.frame.len() as u64
            || second.last_seen_ns < first.last_seen_ns
        {
            errs.push(format!(
                "counters did not advance on the second packet: {first:?} -> {second:?}"
            ));
        }
    }

    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("\n    "))
    }
}

#[test]
fn fixture_table() {
    if !require_root("prog_run::fixture_table") {
        return;
    }
    let router = Netns::new("dp");
    let hosts = Netns::new("dph");
    build_topology(&router, &hosts);
    let results = router.run(|| {
        let bed = Bed {
            lan: ifindex("lan0"),
            wan: ifindex("wan0"),
            mtu: ifindex("mtu0"),
        };
        let (ebpf, mut maps) = load();
        let prog: &Xdp = ebpf
            .program(PROG_NAME)
            .expect("program present")
            .try_into()
            .expect("XDP program");
        cases(&bed)
            .iter()
            .map(|case| {
                (
                    case.name.clone(),
                    case.reason(),
                    check_case(prog, &mut maps, case),
                )
            })
            .collect::<Vec<_>>()
    });
    let mut failed = Vec::new();
    for (name, reason, res) in &results {
        match res {
            Ok(()) => println!("ok   {name} ({})", reason.name()),
            Err(e) => {
                println!("FAIL {name} ({})\n    {e}", reason.name());
                failed.push(name.as_str());
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} cases failed: {failed:?}",
        failed.len(),
        results.len()
    );
}

/// The table names every reason at least once (checked without running anything).
#[test]
fn table_covers_every_reason() {
    let bed = Bed {
        lan: 11,
        wan: 12,
        mtu: 13,
    };
    let covered: BTreeSet<u32> = cases(&bed).iter().map(|c| c.reason() as u32).collect();
    let missing: Vec<_> = Reason::ALL
        .iter()
        .filter(|r| !covered.contains(&(**r as u32)))
        .collect();
    assert!(missing.is_empty(), "reasons without a case: {missing:?}");
}
