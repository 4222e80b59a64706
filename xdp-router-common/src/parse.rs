//! Pure per-packet decisions of the datapath, kept here so they are unit-tested on the host and
//! called unchanged from eBPF: which header fields send a packet to the kernel, and under which
//! [`Reason`].
//!
//! Every function takes header fields already converted to host order (or single bytes) and
//! returns `Ok` when the fast path may go on, or the reason to pass the packet to the kernel.

use crate::Reason;

/// EtherType of IPv4 (host order).
pub const ETH_P_IP: u16 = 0x0800;
/// EtherType of IPv6 (host order).
pub const ETH_P_IPV6: u16 = 0x86dd;
/// Length of an Ethernet II header without VLAN tags.
pub const ETH_HLEN: usize = 14;
/// Length of an 802.1Q / 802.1ad tag (TPID + TCI).
pub const VLAN_HLEN: usize = 4;
/// EtherType (TPID) of an 802.1Q VLAN tag (host order).
pub const ETH_P_8021Q: u16 = 0x8100;
/// EtherType (TPID) of an 802.1ad (service, "Q-in-Q" outer) VLAN tag (host order).
pub const ETH_P_8021AD: u16 = 0x88a8;
/// VLAN ID bits of a TCI (host order).
pub const VLAN_VID_MASK: u16 = 0x0fff;
/// Length of an IPv4 header without options.
pub const IPV4_HLEN: usize = 20;
/// Length of the fixed IPv6 header.
pub const IPV6_HLEN: usize = 40;
/// Length of a TCP header without options.
pub const TCP_HLEN: usize = 20;
/// Length of a UDP header.
pub const UDP_HLEN: usize = 8;
/// IP protocol number of TCP.
pub const IPPROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;

/// TCP flag bits in byte 13 of the TCP header.
pub const TCP_FIN: u8 = 0x01;
/// See [`TCP_FIN`].
pub const TCP_SYN: u8 = 0x02;
/// See [`TCP_FIN`].
pub const TCP_RST: u8 = 0x04;
/// See [`TCP_FIN`].
pub const TCP_ACK: u8 = 0x10;

/// IPv4 "more fragments" flag in the host-order flags/fragment-offset word.
pub const IPV4_MF: u16 = 0x2000;
/// IPv4 fragment offset mask in the host-order flags/fragment-offset word.
pub const IPV4_OFFSET_MASK: u16 = 0x1fff;

/// EtherType of PPPoE session frames (host order).
pub const ETH_P_PPP_SES: u16 = 0x8864;
/// Length of a PPPoE session header (version/type, code, session ID, length) plus the PPP
/// protocol field: what sits between the EtherType and the IP header.
pub const PPPOE_HLEN: usize = 8;
/// PPPoE version and type (both 1, RFC 2516), as the header's first byte.
pub const PPPOE_VER_TYPE: u8 = 0x11;
/// PPP protocol number of IPv4.
pub const PPP_IP: u16 = 0x0021;
/// PPP protocol number of IPv6.
pub const PPP_IPV6: u16 = 0x0057;
/// PPP protocol number of a compressed (or MPPE-encrypted) datagram.
pub const PPP_COMP: u16 = 0x00fd;
/// PPP protocol number of CCP (Compression Control Protocol).
pub const PPP_CCP: u16 = 0x80fd;
/// CCP code (the first byte of a CCP packet) of Configure-Ack.
pub const CCP_CONFACK: u8 = 2;

/// The fields of a PPPoE session header and the PPP protocol after it (host order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PppoeFields {
    /// Version (high nibble) and type (low nibble): 0x11.
    pub ver_type: u8,
    /// Code: 0 for session data.
    pub code: u8,
    /// Length of the PPPoE payload (the PPP protocol field and what follows).
    pub length: u16,
    /// PPP protocol field.
    pub proto: u16,
    /// Bytes in the frame after the 6-byte PPPoE header (PPP protocol field included).
    pub available: usize,
}

/// Decides whether a PPPoE session frame of a managed session may take the fast path: its
/// network layer and how many bytes of it the PPPoE length covers (what the kernel keeps:
/// `pppoe_rcv` trims the frame to the length, dropping shorter frames). LCP, IPCP, CCP,
/// compressed datagrams and a compressed protocol field are pppd's and the PPP layer's.
#[inline(always)]
pub const fn check_pppoe(h: &PppoeFields) -> Result<(L3, usize), Reason> {
    if h.ver_type != PPPOE_VER_TYPE || h.code != 0 {
        return Err(Reason::PassMalformed);
    }
    let len = h.length as usize;
    if len < 2 || len > h.available {
        return Err(Reason::PassMalformed);
    }
    match h.proto {
        PPP_IP => Ok((L3::V4, len - 2)),
        PPP_IPV6 => Ok((L3::V6, len - 2)),
        _ => Err(Reason::PassPppoeNotIp),
    }
}

/// Network layer of a frame, from its EtherType.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum L3 {
    /// IPv4 follows the Ethernet header.
    V4,
    /// IPv6 follows the Ethernet header.
    V6,
}

/// Whether a host-order EtherType is a VLAN tag protocol (802.1Q or 802.1ad).
#[inline(always)]
pub const fn is_vlan_tpid(ethertype: u16) -> bool {
    ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD
}

/// The VLAN ID of a tag (host-order TCI) followed by `inner` (host-order EtherType), if the
/// fast path may look the VLAN up: a second tag (Q-in-Q) and VLAN ID 0 (priority-tagged, which
/// the kernel treats as untagged) stay with the kernel. The caller then looks the ID up among
/// the managed VLAN devices of the ingress ([`Reason::PassVlanUnknown`] when none).
#[inline(always)]
pub const fn check_vlan_tag(tci: u16, inner: u16) -> Result<u16, Reason> {
    if is_vlan_tpid(inner) {
        return Err(Reason::PassVlanQinQ);
    }
    let vid = tci & VLAN_VID_MASK;
    if vid == 0 {
        return Err(Reason::PassVlanPriorityTagged);
    }
    Ok(vid)
}

/// Classifies a host-order EtherType (the one after any VLAN tag the caller stripped).
#[inline(always)]
pub const fn classify_ethertype(ethertype: u16) -> Result<L3, Reason> {
    match ethertype {
        ETH_P_IP => Ok(L3::V4),
        ETH_P_IPV6 => Ok(L3::V6),
        _ => Err(Reason::PassNotIp),
    }
}

/// Minimum header length of the transport protocol `proto` (TCP without options, UDP), or 0
/// for anything else.
#[inline(always)]
pub const fn l4_min_len(proto: u8) -> usize {
    match proto {
        IPPROTO_TCP => TCP_HLEN,
        IPPROTO_UDP => UDP_HLEN,
        _ => 0,
    }
}

/// The fields of an IPv4 header the fast path looks at (host order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Fields {
    /// First byte: version (high nibble) and IHL in 32-bit words (low nibble).
    pub version_ihl: u8,
    /// Total length of the datagram in bytes.
    pub tot_len: u16,
    /// Flags (3 bits) and fragment offset (13 bits).
    pub frag_off: u16,
    /// Time to live.
    pub ttl: u8,
    /// Transport protocol.
    pub proto: u8,
    /// Bytes in the frame from the start of the IPv4 header to the end of the frame.
    pub available: usize,
}

/// Decides whether an IPv4 header may take the fast path, in the datapath's order: malformed,
/// options, fragment, TTL, protocol.
#[inline(always)]
pub const fn check_ipv4(h: &Ipv4Fields) -> Result<(), Reason> {
    let ihl = (h.version_ihl & 0x0f) as usize;
    let tot_len = h.tot_len as usize;
    // The kernel drops these in ip_rcv_core(); let it do so and count them.
    if h.version_ihl >> 4 != 4 || ihl < 5 || tot_len < ihl * 4 || tot_len > h.available {
        return Err(Reason::PassMalformed);
    }
    // Options (record route, timestamps, ...) need the kernel's option processing on forward.
    if ihl > 5 {
        return Err(Reason::PassIpv4Options);
    }
    // Only the first fragment has ports; conntrack reassembles fragments (nf_defrag_ipv4).
    if h.frag_off & (IPV4_MF | IPV4_OFFSET_MASK) != 0 {
        return Err(Reason::PassIpv4Fragment);
    }
    // The kernel must answer with ICMP time exceeded (RFC 1812 5.3.1).
    if h.ttl <= 1 {
        return Err(Reason::PassTtlExpired);
    }
    if h.proto != IPPROTO_TCP && h.proto != IPPROTO_UDP {
        return Err(Reason::PassNotTcpUdp);
    }
    // A datagram too short to hold its transport header is the kernel's to drop.
    if tot_len < IPV4_HLEN + l4_min_len(h.proto) {
        return Err(Reason::PassMalformed);
    }
    Ok(())
}

/// True for IPv6 next-header values that are extension headers (RFC 8200 4, IANA "IPv6
/// Extension Header Types"): hop-by-hop, routing, fragment, ESP, AH, destination options,
/// mobility, HIP, shim6 and the experimental 253/254.
#[inline(always)]
pub const fn is_ipv6_ext_header(next_header: u8) -> bool {
    matches!(
        next_header,
        0 | 43 | 44 | 50 | 51 | 60 | 135 | 139 | 140 | 253 | 254
    )
}

/// The fields of an IPv6 header the fast path looks at (host order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv6Fields {
    /// First byte: version (high nibble) and the high nibble of the traffic class.
    pub version_tc: u8,
    /// Payload length in bytes (everything after the fixed 40-byte header).
    pub payload_len: u16,
    /// Next header.
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Bytes in the frame from the start of the IPv6 header to the end of the frame.
    pub available: usize,
}

/// Decides whether an IPv6 header may take the fast path, in the datapath's order: malformed,
/// extension header / protocol, hop limit.
#[inline(always)]
pub const fn check_ipv6(h: &Ipv6Fields) -> Result<(), Reason> {
    let payload_len = h.payload_len as usize;
    // Wrong version or a payload length beyond the frame: ip6_rcv_core() drops it.
    // (Jumbograms have payload length 0 and a hop-by-hop header, handled below.)
    if h.version_tc >> 4 != 6 || IPV6_HLEN + payload_len > h.available {
        return Err(Reason::PassMalformed);
    }
    if h.next_header != IPPROTO_TCP && h.next_header != IPPROTO_UDP {
        // Walking extension headers costs verifier complexity and cycles for a rare case; the
        // kernel handles them (and a fragment header means conntrack must reassemble).
        if is_ipv6_ext_header(h.next_header) {
            return Err(Reason::PassIpv6ExtHeader);
        }
        return Err(Reason::PassNotTcpUdp);
    }
    // The kernel must answer with ICMPv6 time exceeded (RFC 8200 3, RFC 4443 3.3).
    if h.hop_limit <= 1 {
        return Err(Reason::PassTtlExpired);
    }
    if payload_len < l4_min_len(h.next_header) {
        return Err(Reason::PassMalformed);
    }
    Ok(())
}

/// True when a TCP segment with these flags (byte 13 of the header) must go to the kernel:
/// SYN, FIN and RST drive conntrack's TCP state machine, which must see them.
#[inline(always)]
pub const fn is_tcp_control(flags: u8) -> bool {
    flags & (TCP_SYN | TCP_FIN | TCP_RST) != 0
}

/// Decides whether a TCP header may take the fast path, as conntrack's `tcp_error()` and state
/// machine would judge it: `doff_res` is byte 12 (data offset in the high nibble), `flags`
/// byte 13, `l4_len` the bytes of the segment (IP payload). A data offset below 5 or past the
/// segment is malformed; SYN/FIN/RST go to conntrack; a segment without ACK is INVALID to
/// conntrack in an established connection.
#[inline(always)]
pub const fn check_tcp(doff_res: u8, flags: u8, l4_len: usize) -> Result<(), Reason> {
    let doff = (doff_res >> 4) as usize;
    if doff < 5 || doff * 4 > l4_len {
        return Err(Reason::PassMalformed);
    }
    if is_tcp_control(flags) {
        return Err(Reason::PassTcpControl);
    }
    if flags & TCP_ACK == 0 {
        return Err(Reason::PassTcpNoAck);
    }
    Ok(())
}

/// Decides whether a UDP header may take the fast path: its length field (host order) must be
/// the IP payload length `l4_len` (conntrack marks a longer one INVALID; a shorter one leaves
/// bytes the datapath would forward as UDP payload, so the kernel gets both).
#[inline(always)]
pub const fn check_udp(len: u16, l4_len: usize) -> Result<(), Reason> {
    if len as usize != l4_len {
        return Err(Reason::PassMalformed);
    }
    Ok(())
}

/// `bpf_fib_lookup()` return codes (include/uapi/linux/bpf.h, `BPF_FIB_LKUP_RET_*`).
pub mod fib {
    /// Lookup successful: egress ifindex and MACs are filled in.
    pub const SUCCESS: i64 = 0;
    /// Destination is a blackhole route.
    pub const BLACKHOLE: i64 = 1;
    /// Destination is an unreachable route.
    pub const UNREACHABLE: i64 = 2;
    /// Destination is a prohibit route.
    pub const PROHIBIT: i64 = 3;
    /// Packet is not forwarded (local delivery, broadcast, multicast, ...).
    pub const NOT_FWDED: i64 = 4;
    /// Forwarding is disabled on the ingress interface.
    pub const FWD_DISABLED: i64 = 5;
    /// Forwarding needs a lightweight tunnel encap the helper does not support.
    pub const UNSUPP_LWT: i64 = 6;
    /// No valid neighbour entry for the next hop.
    pub const NO_NEIGH: i64 = 7;
    /// Packet size exceeds the egress MTU.
    pub const FRAG_NEEDED: i64 = 8;
}

/// Maps a `bpf_fib_lookup()` return code (flags 0, XDP: MTU checked against `tot_len`) to
/// `Ok` (forward) or the reason to pass the packet to the kernel.
#[inline(always)]
pub const fn check_fib_result(rc: i64) -> Result<(), Reason> {
    match rc {
        fib::SUCCESS => Ok(()),
        // "BPF_FIB_LKUP_RET_NO_NEIGH: no neighbor entry for nh" (uapi bpf.h). The helper only
        // reads the neighbour table; the kernel's output path resolves ARP/ND and queues.
        fib::NO_NEIGH => Err(Reason::PassNoNeighbour),
        // "BPF_FIB_LKUP_RET_FRAG_NEEDED: fragmentation required to fwd" (uapi bpf.h): for XDP
        // the helper compares tot_len with the route/device MTU (net/core/filter.c,
        // bpf_ipv{4,6}_fib_lookup with check_mtu); the kernel fragments or sends ICMP
        // frag-needed / packet-too-big.
        fib::FRAG_NEEDED => Err(Reason::PassFragNeeded),
        // BLACKHOLE / UNREACHABLE / PROHIBIT: the kernel drops and sends the right ICMP error.
        // NOT_FWDED: local delivery, broadcast or multicast, not routed. FWD_DISABLED: the
        // admin turned forwarding off on the ingress interface, the kernel decides.
        // UNSUPP_LWT: encap routes (MPLS, seg6, ...) the helper cannot follow. Negative values
        // are errors (e.g. -ENODEV for an unknown ingress ifindex). None is ours to forward.
        _ => Err(Reason::PassFibNotForwardable),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4() -> Ipv4Fields {
        Ipv4Fields {
            version_ihl: 0x45,
            tot_len: 60,
            frag_off: 0x4000, // DF only
            ttl: 64,
            proto: IPPROTO_TCP,
            available: 60,
        }
    }

    fn v6() -> Ipv6Fields {
        Ipv6Fields {
            version_tc: 0x60,
            payload_len: 20,
            next_header: IPPROTO_TCP,
            hop_limit: 64,
            available: 60,
        }
    }

    #[test]
    fn pppoe_session_headers() {
        let ok = PppoeFields {
            ver_type: 0x11,
            code: 0,
            length: 62,
            proto: PPP_IP,
            available: 62,
        };
        assert_eq!(check_pppoe(&ok), Ok((L3::V4, 60)));
        // Ethernet padding after the payload: the length decides.
        assert_eq!(
            check_pppoe(&PppoeFields {
                available: 100,
                ..ok
            }),
            Ok((L3::V4, 60))
        );
        assert_eq!(
            check_pppoe(&PppoeFields {
                proto: PPP_IPV6,
                ..ok
            }),
            Ok((L3::V6, 60))
        );
        // Shorter than its length says (the kernel drops it), or no room for the protocol.
        for length in [63, 1, 0] {
            assert_eq!(
                check_pppoe(&PppoeFields { length, ..ok }),
                Err(Reason::PassMalformed),
                "length {length}"
            );
        }
        // Another version/type, a discovery code on a session frame.
        for (ver_type, code) in [(0x12, 0), (0x21, 0), (0x11, 0x07), (0x11, 0xa7)] {
            assert_eq!(
                check_pppoe(&PppoeFields {
                    ver_type,
                    code,
                    ..ok
                }),
                Err(Reason::PassMalformed)
            );
        }
        // LCP, IPCP, IPV6CP, CCP, a compressed datagram, a compressed protocol field (one
        // byte: 0x21 followed by the IP header's 0x45).
        for proto in [0xc021, 0x8021, 0x8057, 0x80fd, 0x00fd, 0x2145] {
            assert_eq!(
                check_pppoe(&PppoeFields { proto, ..ok }),
                Err(Reason::PassPppoeNotIp),
                "{proto:#06x}"
            );
        }
    }

    #[test]
    fn ethertypes() {
        assert_eq!(classify_ethertype(0x0800), Ok(L3::V4));
        assert_eq!(classify_ethertype(0x86dd), Ok(L3::V6));
        for t in [0x0806, 0x8100, 0x88a8, 0x88cc, 0x8847, 0] {
            assert_eq!(classify_ethertype(t), Err(Reason::PassNotIp), "{t:#x}");
        }
    }

    #[test]
    fn vlan_tags() {
        assert!(is_vlan_tpid(0x8100) && is_vlan_tpid(0x88a8) && !is_vlan_tpid(0x0800));
        assert_eq!(check_vlan_tag(7, 0x0800), Ok(7));
        // The priority (PCP) and DEI bits are not part of the VLAN ID.
        assert_eq!(check_vlan_tag(0xe000 | 4094, 0x86dd), Ok(4094));
        assert_eq!(
            check_vlan_tag(0xa000, 0x0800),
            Err(Reason::PassVlanPriorityTagged)
        );
        assert_eq!(check_vlan_tag(7, 0x8100), Err(Reason::PassVlanQinQ));
        assert_eq!(check_vlan_tag(7, 0x88a8), Err(Reason::PassVlanQinQ));
    }

    #[test]
    fn ipv4_good_and_padding_allowed() {
        assert_eq!(check_ipv4(&v4()), Ok(()));
        // Ethernet padding after the datagram is fine.
        assert_eq!(
            check_ipv4(&Ipv4Fields {
                available: 100,
                ..v4()
            }),
            Ok(())
        );
        let udp = Ipv4Fields {
            proto: IPPROTO_UDP,
            tot_len: 28,
            ..v4()
        };
        assert_eq!(check_ipv4(&udp), Ok(()));
    }

    #[test]
    fn ipv4_malformed() {
        let m = Err(Reason::PassMalformed);
        assert_eq!(
            check_ipv4(&Ipv4Fields {
                version_ihl: 0x65,
                ..v4()
            }),
            m
        );
        assert_eq!(
            check_ipv4(&Ipv4Fields {
                version_ihl: 0x44,
                ..v4()
            }),
            m
        );
        assert_eq!(
            check_ipv4(&Ipv4Fields {
                tot_len: 19,
                ..v4()
            }),
            m
        );
        assert_eq!(
            check_ipv4(&Ipv4Fields {
                tot_len: 61,
                ..v4()
            }),
            m
        );
        // Options claimed longer than the datagram.
        assert_eq!(
            check_ipv4(&Ipv4Fields {
                version_ihl: 0x4f,
                tot_len: 56,
                ..v4()
            }),
            m
        );
        // Too short for the transport header.
        assert_eq!(
            check_ipv4(&Ipv4Fields {
                tot_len: 39,
                ..v4()
            }),
            m
        );
        let udp = Ipv4Fields {
            proto: IPPROTO_UDP,
            tot_len: 27,
            ..v4()
        };
        assert_eq!(check_ipv4(&udp), m);
    }

    #[test]
    fn ipv4_reasons_in_order() {
        assert_eq!(
            check_ipv4(&Ipv4Fields {
                version_ihl: 0x46,
                ttl: 1,
                ..v4()
            }),
            Err(Reason::PassIpv4Options)
        );
        assert_eq!(
            check_ipv4(&Ipv4Fields {
                frag_off: 0x2000,
                ttl: 1,
                ..v4()
            }),
            Err(Reason::PassIpv4Fragment)
        );
        assert_eq!(
            check_ipv4(&Ipv4Fields {
                frag_off: 0x0001,
                ..v4()
            }),
            Err(Reason::PassIpv4Fragment)
        );
        assert_eq!(
            check_ipv4(&Ipv4Fields {
                ttl: 1,
                proto: 1,
                ..v4()
            }),
            Err(Reason::PassTtlExpired)
        );
        assert_eq!(
            check_ipv4(&Ipv4Fields { ttl: 0, ..v4() }),
            Err(Reason::PassTtlExpired)
        );
        assert_eq!(check_ipv4(&Ipv4Fields { ttl: 2, ..v4() }), Ok(()));
        assert_eq!(
            check_ipv4(&Ipv4Fields { proto: 1, ..v4() }),
            Err(Reason::PassNotTcpUdp)
        );
        assert_eq!(
            check_ipv4(&Ipv4Fields { proto: 47, ..v4() }),
            Err(Reason::PassNotTcpUdp)
        );
    }

    #[test]
    fn ipv6_reasons() {
        assert_eq!(check_ipv6(&v6()), Ok(()));
        assert_eq!(
            check_ipv6(&Ipv6Fields {
                available: 100,
                ..v6()
            }),
            Ok(())
        );
        let m = Err(Reason::PassMalformed);
        assert_eq!(
            check_ipv6(&Ipv6Fields {
                version_tc: 0x40,
                ..v6()
            }),
            m
        );
        assert_eq!(
            check_ipv6(&Ipv6Fields {
                payload_len: 21,
                ..v6()
            }),
            m
        );
        assert_eq!(
            check_ipv6(&Ipv6Fields {
                payload_len: 19,
                ..v6()
            }),
            m
        );
        for nh in [0, 43, 44, 50, 51, 60, 135, 139, 140, 253, 254] {
            assert!(is_ipv6_ext_header(nh));
            assert_eq!(
                check_ipv6(&Ipv6Fields {
                    next_header: nh,
                    hop_limit: 1,
                    ..v6()
                }),
                Err(Reason::PassIpv6ExtHeader),
                "{nh}"
            );
        }
        for nh in [1, 6, 17, 41, 47, 58, 59, 132] {
            assert!(!is_ipv6_ext_header(nh));
        }
        assert_eq!(
            check_ipv6(&Ipv6Fields {
                next_header: 58,
                ..v6()
            }),
            Err(Reason::PassNotTcpUdp)
        );
        assert_eq!(
            check_ipv6(&Ipv6Fields {
                hop_limit: 1,
                ..v6()
            }),
            Err(Reason::PassTtlExpired)
        );
        assert_eq!(
            check_ipv6(&Ipv6Fields {
                hop_limit: 2,
                ..v6()
            }),
            Ok(())
        );
    }

    #[test]
    fn tcp_control_flags() {
        assert!(is_tcp_control(TCP_SYN));
        assert!(is_tcp_control(TCP_SYN | 0x10));
        assert!(is_tcp_control(TCP_FIN | 0x10));
        assert!(is_tcp_control(TCP_RST));
        assert!(!is_tcp_control(0x10)); // ACK
        assert!(!is_tcp_control(0x18)); // PSH|ACK
        assert!(!is_tcp_control(0x20 | 0x40 | 0x80)); // URG, ECE, CWR
    }

    #[test]
    fn tcp_headers() {
        let ack = TCP_ACK;
        assert_eq!(check_tcp(0x50, ack, 20), Ok(()));
        assert_eq!(check_tcp(0x80, ack | 0x08, 40), Ok(()));
        // URG, ECE, CWR with ACK are ordinary segments to conntrack.
        assert_eq!(check_tcp(0x50, ack | 0x20 | 0x40 | 0x80, 20), Ok(()));
        let m = Err(Reason::PassMalformed);
        assert_eq!(check_tcp(0x40, ack, 20), m);
        assert_eq!(check_tcp(0x00, ack, 20), m);
        assert_eq!(check_tcp(0x60, ack, 20), m);
        assert_eq!(check_tcp(0xf0, ack, 59), m);
        assert_eq!(
            check_tcp(0x50, TCP_SYN | ack, 20),
            Err(Reason::PassTcpControl)
        );
        for flags in [0, 0x08, 0x20, 0x40 | 0x80, 0x28] {
            assert_eq!(
                check_tcp(0x50, flags, 20),
                Err(Reason::PassTcpNoAck),
                "{flags:#x}"
            );
        }
    }

    #[test]
    fn udp_length() {
        assert_eq!(check_udp(8, 8), Ok(()));
        assert_eq!(check_udp(30, 30), Ok(()));
        assert_eq!(check_udp(29, 30), Err(Reason::PassMalformed));
        assert_eq!(check_udp(31, 30), Err(Reason::PassMalformed));
        assert_eq!(check_udp(0, 30), Err(Reason::PassMalformed));
    }

    #[test]
    fn fib_results() {
        assert_eq!(check_fib_result(fib::SUCCESS), Ok(()));
        assert_eq!(
            check_fib_result(fib::NO_NEIGH),
            Err(Reason::PassNoNeighbour)
        );
        assert_eq!(
            check_fib_result(fib::FRAG_NEEDED),
            Err(Reason::PassFragNeeded)
        );
        for rc in [1, 2, 3, 4, 5, 6, 9, -19, -22] {
            assert_eq!(
                check_fib_result(rc),
                Err(Reason::PassFibNotForwardable),
                "{rc}"
            );
        }
    }
}
