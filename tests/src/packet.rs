//! Test packets: Ethernet frames built with etherparse, variants made by patching bytes (the
//! malformed and unusual ones), and checksums recomputed from scratch to check a rewrite.
//!
//! Everything here panics with a message on misuse: it is test code building its own inputs.

use std::net::IpAddr;

use etherparse::{PacketBuilder, PacketBuilderStep, TcpHeader};
use xdp_router_testbed::checksum::internet_checksum;

/// Length of the Ethernet header of the frames built here (no VLAN tag).
pub const ETH_LEN: usize = 14;

/// Transport of a test packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// TCP with these flag bits (byte 13: 0x01 FIN, 0x02 SYN, 0x04 RST, 0x08 PSH, 0x10 ACK).
    Tcp(u8),
    /// UDP.
    Udp,
}

/// TCP flag bits as in the header's flags byte.
pub mod tcp_flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// PSH.
    pub const PSH: u8 = 0x08;
    /// ACK.
    pub const ACK: u8 = 0x10;
}

/// An Ethernet + IPv4/IPv6 + TCP/UDP packet, described by the fields the router looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    /// Source MAC.
    pub eth_src: [u8; 6],
    /// Destination MAC.
    pub eth_dst: [u8; 6],
    /// Source address (same family as `dst`).
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// IPv4 TTL or IPv6 hop limit.
    pub ttl: u8,
    /// TCP (with flags) or UDP.
    pub transport: Transport,
    /// Payload bytes after the transport header (a deterministic pattern).
    pub payload_len: usize,
}

impl Spec {
    /// The frame, with correct IPv4 header and TCP/UDP checksums.
    pub fn frame(&self) -> Vec<u8> {
        let eth = PacketBuilder::ethernet2(self.eth_src, self.eth_dst);
        let ip = match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => eth.ipv4(s.octets(), d.octets(), self.ttl),
            (IpAddr::V6(s), IpAddr::V6(d)) => eth.ipv6(s.octets(), d.octets(), self.ttl),
            _ => panic!("packet spec mixes address families: {self:?}"),
        };
        let payload = pattern(self.payload_len);
        let mut out = Vec::new();
        match self.transport {
            Transport::Udp => ip
                .udp(self.sport, self.dport)
                .write(&mut out, &payload)
                .unwrap_or_else(|e| panic!("build UDP packet: {e}")),
            Transport::Tcp(flags) => tcp(ip, self.sport, self.dport, flags)
                .write(&mut out, &payload)
                .unwrap_or_else(|e| panic!("build TCP packet: {e}")),
        }
        out
    }

    /// The frame with `marker` at the start of its payload (checksums fixed).
    pub fn marked(&self, marker: &[u8]) -> Vec<u8> {
        let mut f = self.frame();
        let at = l4_offset(&f)
            + if matches!(self.transport, Transport::Tcp(_)) {
                20
            } else {
                8
            };
        f[at..at + marker.len()].copy_from_slice(marker);
        fix_l4_checksum(&mut f);
        f
    }

    /// This packet after a router forwarded it: new MACs, TTL - 1, and the given addresses and
    /// ports (NAT), with checksums computed from scratch.
    pub fn forwarded(
        &self,
        eth_src: [u8; 6],
        eth_dst: [u8; 6],
        (src, sport): (IpAddr, u16),
        (dst, dport): (IpAddr, u16),
    ) -> Spec {
        Spec {
            eth_src,
            eth_dst,
            src,
            dst,
            sport,
            dport,
            ttl: self.ttl - 1,
            ..self.clone()
        }
    }
}

fn tcp(
    ip: PacketBuilderStep<etherparse::IpHeaders>,
    sport: u16,
    dport: u16,
    flags: u8,
) -> PacketBuilderStep<TcpHeader> {
    let mut t = ip.tcp(sport, dport, 0x0102_0304, 64_240);
    if flags & tcp_flags::FIN != 0 {
        t = t.fin();
    }
    if flags & tcp_flags::SYN != 0 {
        t = t.syn();
    }
    if flags & tcp_flags::RST != 0 {
        t = t.rst();
    }
    if flags & tcp_flags::PSH != 0 {
        t = t.psh();
    }
    if flags & tcp_flags::ACK != 0 {
        t = t.ack(0x0a0b_0c0d);
    }
    t
}

/// `len` payload bytes of a fixed pattern.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 3) as u8).collect()
}

/// An ARP request frame (EtherType 0x0806).
pub fn arp_request(eth_src: [u8; 6], sender: [u8; 4], target: [u8; 4]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&eth_src);
    f.extend_from_slice(&[0x08, 0x06]);
    f.extend_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&eth_src);
    f.extend_from_slice(&sender);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target);
    f.resize(60, 0);
    f
}

/// The frame with an 802.1Q tag (VLAN `vid`) inserted after the MAC addresses.
pub fn with_vlan_tag(frame: &[u8], vid: u16) -> Vec<u8> {
    with_tag(frame, 0x8100, vid & 0x0fff)
}

/// The frame with a VLAN tag of protocol `tpid` (0x8100, 0x88a8) and TCI `tci` (priority,
/// DEI, VLAN ID) inserted after the MAC addresses.
pub fn with_tag(frame: &[u8], tpid: u16, tci: u16) -> Vec<u8> {
    let mut f = frame[..12].to_vec();
    f.extend_from_slice(&tpid.to_be_bytes());
    f.extend_from_slice(&tci.to_be_bytes());
    f.extend_from_slice(&frame[12..]);
    f
}

/// The untagged IPv4/IPv6 frame as a PPPoE session frame of session `sid`: EtherType 0x8864,
/// the session header (length: the PPP protocol field and the datagram) and the PPP protocol
/// (0x0021 / 0x0057) inserted after the MACs, in place of the EtherType.
pub fn with_pppoe(frame: &[u8], sid: u16) -> Vec<u8> {
    let proto: u16 = match u16::from_be_bytes([frame[12], frame[13]]) {
        0x0800 => 0x0021,
        0x86dd => 0x0057,
        t => panic!("with_pppoe: EtherType {t:#06x} is not IP"),
    };
    let len = u16::try_from(frame.len() - 14 + 2).expect("datagram below 64 KiB");
    let mut f = frame[..12].to_vec();
    f.extend_from_slice(&0x8864u16.to_be_bytes());
    f.extend_from_slice(&[0x11, 0x00]);
    f.extend_from_slice(&sid.to_be_bytes());
    f.extend_from_slice(&len.to_be_bytes());
    f.extend_from_slice(&proto.to_be_bytes());
    f.extend_from_slice(&frame[14..]);
    f
}

/// An ICMPv4 echo request.
pub fn icmpv4_echo(eth_src: [u8; 6], eth_dst: [u8; 6], src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2(eth_src, eth_dst)
        .ipv4(src, dst, 64)
        .icmpv4_echo_request(7, 1)
        .write(&mut out, &pattern(16))
        .unwrap_or_else(|e| panic!("build ICMP packet: {e}"));
    out
}

/// An ICMPv6 echo request.
pub fn icmpv6_echo(eth_src: [u8; 6], eth_dst: [u8; 6], src: [u8; 16], dst: [u8; 16]) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2(eth_src, eth_dst)
        .ipv6(src, dst, 64)
        .icmpv6_echo_request(7, 1)
        .write(&mut out, &pattern(16))
        .unwrap_or_else(|e| panic!("build ICMPv6 packet: {e}"));
    out
}

/// Recomputes the IPv4 header checksum of a frame in place (after patching header bytes).
pub fn fix_ipv4_checksum(frame: &mut [u8]) {
    let ihl = usize::from(frame[ETH_LEN] & 0x0f) * 4;
    let hdr = &mut frame[ETH_LEN..ETH_LEN + ihl];
    hdr[10] = 0;
    hdr[11] = 0;
    let c = internet_checksum(&[hdr]);
    hdr[10..12].copy_from_slice(&c.to_be_bytes());
}

/// The frame with its IP header's DSCP/ECN byte (IPv4 TOS, IPv6 traffic class) set to `tos`,
/// the IPv4 header checksum computed from scratch. Neither is in the transport checksum.
pub fn with_tos(frame: &[u8], tos: u8) -> Vec<u8> {
    let mut f = frame.to_vec();
    match f[ETH_LEN] >> 4 {
        4 => {
            f[ETH_LEN + 1] = tos;
            fix_ipv4_checksum(&mut f);
        }
        6 => {
            // Version (4 bits), traffic class (8), flow label (20).
            f[ETH_LEN] = 0x60 | tos >> 4;
            f[ETH_LEN + 1] = (tos << 4) | (f[ETH_LEN + 1] & 0x0f);
        }
        v => panic!("with_tos: IP version {v}"),
    }
    f
}

/// Inserts IPv4 options (a multiple of 4 bytes) after the 20-byte header, fixing IHL, total
/// length and the header checksum. The transport checksum does not cover options.
pub fn with_ipv4_options(frame: &[u8], options: &[u8]) -> Vec<u8> {
    assert_eq!(options.len() % 4, 0, "IPv4 options must fill 32-bit words");
    let mut f = frame[..ETH_LEN + 20].to_vec();
    f.extend_from_slice(options);
    f.extend_from_slice(&frame[ETH_LEN + 20..]);
    f[ETH_LEN] = 0x40 | (5 + options.len() / 4) as u8;
    let tot = u16::from_be_bytes([f[ETH_LEN + 2], f[ETH_LEN + 3]]) + options.len() as u16;
    f[ETH_LEN + 2..ETH_LEN + 4].copy_from_slice(&tot.to_be_bytes());
    fix_ipv4_checksum(&mut f);
    f
}

/// Sets the IPv4 flags/fragment-offset word (host order) and fixes the header checksum.
pub fn with_ipv4_frag(frame: &[u8], flags_offset: u16) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[ETH_LEN + 6..ETH_LEN + 8].copy_from_slice(&flags_offset.to_be_bytes());
    fix_ipv4_checksum(&mut f);
    f
}

/// Inserts an IPv6 extension header `ext` (its first byte, the next header, is overwritten with
/// the packet's transport) between the fixed header and the transport, as next header `kind`.
pub fn with_ipv6_ext(frame: &[u8], kind: u8, ext: &[u8]) -> Vec<u8> {
    assert_eq!(
        ext.len() % 8,
        0,
        "IPv6 extension headers are multiples of 8 bytes"
    );
    let l3 = ETH_LEN;
    let mut ext = ext.to_vec();
    ext[0] = frame[l3 + 6];
    let mut f = frame[..l3 + 40].to_vec();
    f[l3 + 6] = kind;
    let plen = u16::from_be_bytes([f[l3 + 4], f[l3 + 5]]) + ext.len() as u16;
    f[l3 + 4..l3 + 6].copy_from_slice(&plen.to_be_bytes());
    f.extend_from_slice(&ext);
    f.extend_from_slice(&frame[l3 + 40..]);
    f
}

/// Offset of the transport header in a frame built here (IPv4 with any IHL, or IPv6 without
/// extension headers).
pub fn l4_offset(frame: &[u8]) -> usize {
    match u16::from_be_bytes([frame[12], frame[13]]) {
        0x0800 => ETH_LEN + usize::from(frame[ETH_LEN] & 0x0f) * 4,
        0x86dd => ETH_LEN + 40,
        t => panic!("l4_offset: EtherType {t:#06x}"),
    }
}

/// Length of the IP datagram a frame carries (IPv4 total length, IPv6 payload length + 40),
/// after any VLAN tags and a PPPoE session header: what the flow counters count per packet.
pub fn ip_len(frame: &[u8]) -> usize {
    let mut off = 12;
    loop {
        match u16::from_be_bytes([frame[off], frame[off + 1]]) {
            0x8100 | 0x88a8 => off += 4,
            // PPPoE session header (6 bytes), then the PPP protocol (0x0021 IPv4, 0x0057 IPv6).
            0x8864 => {
                let ppp = u16::from_be_bytes([frame[off + 8], frame[off + 9]]);
                let ip = off + 10;
                return match ppp {
                    0x0021 => usize::from(u16::from_be_bytes([frame[ip + 2], frame[ip + 3]])),
                    0x0057 => 40 + usize::from(u16::from_be_bytes([frame[ip + 4], frame[ip + 5]])),
                    p => panic!("ip_len: PPP protocol {p:#06x}"),
                };
            }
            0x0800 => {
                let ip = off + 2;
                return usize::from(u16::from_be_bytes([frame[ip + 2], frame[ip + 3]]));
            }
            0x86dd => {
                let ip = off + 2;
                return 40 + usize::from(u16::from_be_bytes([frame[ip + 4], frame[ip + 5]]));
            }
            t => panic!("ip_len: EtherType {t:#06x}"),
        }
    }
}

/// Sets the UDP checksum field of a frame to 0 ("no checksum", IPv4 only).
pub fn with_zero_udp_checksum(frame: &[u8]) -> Vec<u8> {
    let mut f = frame.to_vec();
    let off = l4_offset(&f) + 6;
    f[off..off + 2].copy_from_slice(&[0, 0]);
    f
}

/// Recomputes the IPv4 header checksum and the TCP/UDP checksum of `frame` from scratch and
/// compares them with the values in the frame. A UDP-over-IPv4 checksum of 0 ("none") is
/// accepted as such. A VLAN-tagged frame is checked as the frame behind its tag.
pub fn verify_checksums(frame: &[u8]) -> Result<(), String> {
    let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
    if ethertype == 0x8100 || ethertype == 0x88a8 {
        // One VLAN tag: the IP packet behind it, as if untagged.
        let mut untagged = frame[..12].to_vec();
        untagged.extend_from_slice(&frame[16..]);
        return verify_checksums(&untagged);
    }
    if ethertype == 0x8864 {
        // A PPPoE session frame: the IP packet behind the session header and PPP protocol.
        let ethertype: u16 = match u16::from_be_bytes([frame[20], frame[21]]) {
            0x0021 => 0x0800,
            0x0057 => 0x86dd,
            p => return Err(format!("PPP protocol {p:#06x} is not IP")),
        };
        let mut plain = frame[..12].to_vec();
        plain.extend_from_slice(&ethertype.to_be_bytes());
        plain.extend_from_slice(&frame[22..]);
        return verify_checksums(&plain);
    }
    let (pseudo, l4, proto) = match ethertype {
        0x0800 => {
            let ihl = usize::from(frame[ETH_LEN] & 0x0f) * 4;
            let mut hdr = frame[ETH_LEN..ETH_LEN + ihl].to_vec();
            let stored = u16::from_be_bytes([hdr[10], hdr[11]]);
            hdr[10] = 0;
            hdr[11] = 0;
            let want = internet_checksum(&[&hdr]);
            if stored != want {
                return Err(format!(
                    "IPv4 header checksum {stored:#06x}, from scratch {want:#06x}"
                ));
            }
            let tot = usize::from(u16::from_be_bytes([hdr[2], hdr[3]]));
            let l4 = frame[ETH_LEN + ihl..ETH_LEN + tot].to_vec();
            let mut pseudo = hdr[12..20].to_vec();
            pseudo.extend_from_slice(&[0, hdr[9]]);
            pseudo.extend_from_slice(&(l4.len() as u16).to_be_bytes());
            (pseudo, l4, hdr[9])
        }
        0x86dd => {
            let hdr = &frame[ETH_LEN..ETH_LEN + 40];
            let plen = usize::from(u16::from_be_bytes([hdr[4], hdr[5]]));
            let l4 = frame[ETH_LEN + 40..ETH_LEN + 40 + plen].to_vec();
            let mut pseudo = hdr[8..40].to_vec();
            pseudo.extend_from_slice(&(l4.len() as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, hdr[6]]);
            (pseudo, l4, hdr[6])
        }
        t => return Err(format!("not IP: EtherType {t:#06x}")),
    };
    let check_at = match proto {
        6 => 16,
        17 => 6,
        p => return Err(format!("transport {p} is neither TCP nor UDP")),
    };
    let mut seg = l4;
    let stored = u16::from_be_bytes([seg[check_at], seg[check_at + 1]]);
    if proto == 17 && ethertype == 0x0800 && stored == 0 {
        return Ok(());
    }
    seg[check_at] = 0;
    seg[check_at + 1] = 0;
    let mut want = internet_checksum(&[&pseudo, &seg]);
    if proto == 17 && want == 0 {
        want = 0xffff;
    }
    if stored != want {
        return Err(format!(
            "{} checksum {stored:#06x}, from scratch {want:#06x}",
            if proto == 6 { "TCP" } else { "UDP" }
        ));
    }
    Ok(())
}

/// The frame with another destination MAC.
pub fn with_eth_dst(frame: &[u8], mac: [u8; 6]) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[..6].copy_from_slice(&mac);
    f
}

/// The frame with `extra` bytes after the IP datagram (Ethernet padding or garbage; the IP
/// lengths are not changed).
pub fn with_trailer(frame: &[u8], extra: &[u8]) -> Vec<u8> {
    let mut f = frame.to_vec();
    f.extend_from_slice(extra);
    f
}

/// The frame with a wrong IPv4 header checksum.
pub fn with_bad_ipv4_checksum(frame: &[u8]) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[ETH_LEN + 11] ^= 0x5a;
    f
}

/// Offset of the TCP/UDP checksum field in a frame built here.
fn l4_check_offset(frame: &[u8]) -> usize {
    let proto = match u16::from_be_bytes([frame[12], frame[13]]) {
        0x0800 => frame[ETH_LEN + 9],
        _ => frame[ETH_LEN + 6],
    };
    l4_offset(frame) + if proto == 6 { 16 } else { 6 }
}

/// The frame with a wrong TCP/UDP checksum (never 0, which UDP reads as "none").
pub fn with_bad_l4_checksum(frame: &[u8]) -> Vec<u8> {
    let mut f = frame.to_vec();
    let off = l4_check_offset(&f);
    f[off + 1] = f[off + 1].wrapping_add(1);
    if f[off..off + 2] == [0, 0] {
        f[off + 1] = 1;
    }
    f
}

/// The frame with the payload changed so that its TCP/UDP checksum is 0x0000, then written as
/// 0xffff (the other one's-complement zero: valid, but never produced by a from-scratch
/// computation). Needs at least 2 payload bytes.
pub fn with_l4_checksum_ffff(frame: &[u8]) -> Vec<u8> {
    let mut f = frame.to_vec();
    let check = l4_check_offset(&f);
    let c = u16::from_be_bytes([f[check], f[check + 1]]);
    // The last two bytes of the frame are payload (frames built here end with it).
    let at = f.len() - 2;
    let w = u32::from(u16::from_be_bytes([f[at], f[at + 1]])) + u32::from(c);
    let w = ((w & 0xffff) + (w >> 16)) as u16;
    f[at..at + 2].copy_from_slice(&w.to_be_bytes());
    f[check..check + 2].copy_from_slice(&[0xff, 0xff]);
    f
}

/// The frame with the TCP data offset (32-bit words) set to `doff` (checksum not fixed).
pub fn with_tcp_doff(frame: &[u8], doff: u8) -> Vec<u8> {
    let mut f = frame.to_vec();
    let off = l4_offset(&f) + 12;
    f[off] = (doff << 4) | (f[off] & 0x0f);
    f
}

/// The frame with the UDP length field set to `len` (checksum not fixed).
pub fn with_udp_len(frame: &[u8], len: u16) -> Vec<u8> {
    let mut f = frame.to_vec();
    let off = l4_offset(&f) + 4;
    f[off..off + 2].copy_from_slice(&len.to_be_bytes());
    f
}

/// The TCP frame with flags byte `flags` (any combination, e.g. URG/ECE/CWR) and its checksum
/// recomputed.
pub fn with_tcp_flags(frame: &[u8], flags: u8) -> Vec<u8> {
    let mut f = frame.to_vec();
    let l4 = l4_offset(&f);
    f[l4 + 13] = flags;
    fix_l4_checksum(&mut f);
    f
}

/// Recomputes the TCP/UDP checksum of a frame built here in place (after patching it).
pub fn fix_l4_checksum(frame: &mut [u8]) {
    let l4 = l4_offset(frame);
    let (pseudo, end, proto) = match u16::from_be_bytes([frame[12], frame[13]]) {
        0x0800 => {
            let ip = &frame[ETH_LEN..];
            let end = ETH_LEN + usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            let mut p = ip[12..20].to_vec();
            p.extend_from_slice(&[0, ip[9]]);
            p.extend_from_slice(&((end - l4) as u16).to_be_bytes());
            (p, end, ip[9])
        }
        _ => {
            let ip = &frame[ETH_LEN..];
            let end = ETH_LEN + 40 + usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            let mut p = ip[8..40].to_vec();
            p.extend_from_slice(&((end - l4) as u32).to_be_bytes());
            p.extend_from_slice(&[0, 0, 0, ip[6]]);
            (p, end, ip[6])
        }
    };
    let check = l4 + if proto == 6 { 16 } else { 6 };
    frame[check..check + 2].copy_from_slice(&[0, 0]);
    let c = internet_checksum(&[&pseudo, &frame[l4..end]]);
    let c = if c == 0 && proto == 17 { 0xffff } else { c };
    frame[check..check + 2].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(src: &str, dst: &str, transport: Transport) -> Spec {
        Spec {
            eth_src: [2, 0, 0, 0, 0, 1],
            eth_dst: [2, 0, 0, 0, 0, 2],
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            sport: 40_000,
            dport: 443,
            ttl: 64,
            transport,
            payload_len: 33,
        }
    }

    #[test]
    fn built_frames_have_valid_checksums() {
        for s in [
            spec("192.0.2.10", "198.18.0.7", Transport::Tcp(tcp_flags::ACK)),
            spec("192.0.2.10", "198.18.0.7", Transport::Udp),
            spec(
                "2001:db8:1::10",
                "2001:db8:ff::7",
                Transport::Tcp(tcp_flags::ACK),
            ),
            spec("2001:db8:1::10", "2001:db8:ff::7", Transport::Udp),
        ] {
            let f = s.frame();
            verify_checksums(&f).unwrap();
            assert_eq!(
                f.len(),
                l4_offset(&f) + s.payload_len + if s.transport == Transport::Udp { 8 } else { 20 }
            );
        }
    }

    #[test]
    fn verify_detects_a_wrong_checksum() {
        let mut f = spec("192.0.2.10", "198.18.0.7", Transport::Tcp(tcp_flags::ACK)).frame();
        f[ETH_LEN + 8] -= 1; // TTL without header checksum update
        assert!(verify_checksums(&f).unwrap_err().contains("IPv4 header"));
        let mut f = spec("2001:db8:1::10", "2001:db8:ff::7", Transport::Udp).frame();
        let off = l4_offset(&f);
        f[off] ^= 1; // source port without checksum update
        assert!(verify_checksums(&f).unwrap_err().contains("UDP"));
    }

    #[test]
    fn variants_keep_checksums_and_lengths() {
        let f = spec("192.0.2.10", "198.18.0.7", Transport::Tcp(tcp_flags::ACK)).frame();
        let o = with_ipv4_options(&f, &[1, 1, 1, 0]);
        assert_eq!(o.len(), f.len() + 4);
        verify_checksums(&o).unwrap();
        let v6 = spec("2001:db8:1::10", "2001:db8:ff::7", Transport::Udp).frame();
        let e = with_ipv6_ext(&v6, 60, &[0, 0, 1, 4, 0, 0, 0, 0]);
        assert_eq!(e[ETH_LEN + 6], 60);
        assert_eq!(e[ETH_LEN + 40], 17);
        let z = with_zero_udp_checksum(&spec("192.0.2.10", "198.18.0.7", Transport::Udp).frame());
        verify_checksums(&z).unwrap();
        assert_eq!(with_vlan_tag(&f, 5).len(), f.len() + 4);
    }
}
