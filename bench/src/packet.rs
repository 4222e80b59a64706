//! Benchmark frames: a generator stream's initial frame and header template, with valid IPv4
//! and UDP checksums for every flow (see [`GenConfig`]).

use std::net::IpAddr;

use anyhow::{Result, bail};
use xdp_router_common::lab::{
    GEN_FAMILY_V4, GEN_FAMILY_V6, GEN_TEMPLATE_LEN, GEN_TEMPLATE_LEN_V4, GenConfig,
};
use xdp_router_testbed::checksum::internet_checksum;

/// Bytes of Ethernet FCS counted in a frame size (RFC 2544 sizes include it; the buffer the
/// generator sends does not).
pub const FCS_LEN: usize = 4;

/// IP address family of a benchmark stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// IPv4.
    Ipv4,
    /// IPv6.
    Ipv6,
}

impl Family {
    /// Smallest frame (FCS included) that holds the headers plus the 2-byte compensation word:
    /// 64 B for IPv4 (60 + FCS, padded), 68 B for IPv6 (64 + FCS).
    pub const fn min_frame(self) -> usize {
        match self {
            Family::Ipv4 => 64,
            Family::Ipv6 => GEN_TEMPLATE_LEN + FCS_LEN,
        }
    }

    /// `ipv4` / `ipv6`.
    pub const fn name(self) -> &'static str {
        match self {
            Family::Ipv4 => "ipv4",
            Family::Ipv6 => "ipv6",
        }
    }
}

/// What one generator stream sends.
#[derive(Clone, Debug)]
pub struct FrameSpec {
    /// Frame size in bytes, FCS included (the buffer is 4 bytes shorter).
    pub frame_size: usize,
    /// Source MAC (the generator's interface).
    pub src_mac: [u8; 6],
    /// Destination MAC (the next hop: the router's interface, or the sink directly).
    pub dst_mac: [u8; 6],
    /// Source address; its family picks IPv4 or IPv6.
    pub src_ip: IpAddr,
    /// Destination address (same family as `src_ip`).
    pub dst_ip: IpAddr,
    /// Fixed UDP port of every flow (the sink counts this port).
    pub fixed_port: u16,
    /// Port of flow 0; flow `i` uses `port_base + i`.
    pub port_base: u16,
    /// Number of flows.
    pub flows: u32,
    /// `false`: source port varies, destination port is `fixed_port` (LAN → WAN requests);
    /// `true`: source port is `fixed_port`, destination port varies (WAN → LAN replies).
    pub vary_dst: bool,
}

impl FrameSpec {
    /// The address family of this stream.
    pub fn family(&self) -> Family {
        match self.src_ip {
            IpAddr::V4(_) => Family::Ipv4,
            IpAddr::V6(_) => Family::Ipv6,
        }
    }

    /// The initial frame buffer (FCS excluded), headers of flow 0 in place.
    pub fn frame(&self) -> Result<Vec<u8>> {
        let family = self.family();
        if self.frame_size < family.min_frame() {
            bail!(
                "frame size {} B is below the {} minimum of {} B",
                self.frame_size,
                family.name(),
                family.min_frame()
            );
        }
        if self.frame_size > 1518 {
            bail!(
                "frame size {} B is above 1518 B (veth MTU 1500)",
                self.frame_size
            );
        }
        if self.flows == 0 || u32::from(self.port_base) + self.flows > 65_536 {
            bail!(
                "flows must be 1..={} with port base {}",
                65_536 - u32::from(self.port_base),
                self.port_base
            );
        }
        let len = self.frame_size - FCS_LEN;
        let mut f = vec![0u8; len];
        f[0..6].copy_from_slice(&self.dst_mac);
        f[6..12].copy_from_slice(&self.src_mac);
        let (sport, dport) = if self.vary_dst {
            (self.fixed_port, self.port_base)
        } else {
            (self.port_base, self.fixed_port)
        };
        let l4 = match (self.src_ip, self.dst_ip) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
                let ip = &mut f[14..34];
                ip[0] = 0x45;
                ip[2..4].copy_from_slice(&((len - 14) as u16).to_be_bytes());
                ip[6] = 0x40; // DF
                ip[8] = 64; // TTL
                ip[9] = 17; // UDP
                ip[12..16].copy_from_slice(&s.octets());
                ip[16..20].copy_from_slice(&d.octets());
                let c = internet_checksum(&[&ip[..]]);
                ip[10..12].copy_from_slice(&c.to_be_bytes());
                34
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
                let ip = &mut f[14..54];
                ip[0] = 0x60;
                ip[4..6].copy_from_slice(&((len - 54) as u16).to_be_bytes());
                ip[6] = 17; // UDP
                ip[7] = 64; // hop limit
                ip[8..24].copy_from_slice(&s.octets());
                ip[24..40].copy_from_slice(&d.octets());
                54
            }
            _ => bail!("source and destination address families differ"),
        };
        let udp_len = len - l4;
        f[l4..l4 + 2].copy_from_slice(&sport.to_be_bytes());
        f[l4 + 2..l4 + 4].copy_from_slice(&dport.to_be_bytes());
        f[l4 + 4..l4 + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        // Compensation word: the one's complement of the varying port, so their sum is the
        // same for every flow and the UDP checksum never changes.
        f[l4 + 8..l4 + 10].copy_from_slice(&(!self.port_base).to_be_bytes());
        let c = udp_checksum(&f, l4);
        f[l4 + 6..l4 + 8].copy_from_slice(&c.to_be_bytes());
        Ok(f)
    }

    /// The generator configuration for this stream, redirecting into `ifindex`.
    pub fn gen_config(&self, ifindex: u32) -> Result<GenConfig> {
        let frame = self.frame()?;
        let mut template = [0u8; GEN_TEMPLATE_LEN];
        let n = match self.family() {
            Family::Ipv4 => GEN_TEMPLATE_LEN_V4,
            Family::Ipv6 => GEN_TEMPLATE_LEN,
        };
        template[..n].copy_from_slice(&frame[..n]);
        Ok(GenConfig {
            template,
            ifindex,
            flows: self.flows,
            port_base: self.port_base,
            family: match self.family() {
                Family::Ipv4 => GEN_FAMILY_V4,
                Family::Ipv6 => GEN_FAMILY_V6,
            },
            vary_dst: u8::from(self.vary_dst),
        })
    }
}

/// The IPv4 or IPv6 pseudo-header of the UDP datagram at `l4` (34: IPv4, 54: IPv6) without
/// its length: the addresses and protocol 17. (Summed with the 16-bit UDP length, it adds up
/// as the IPv6 pseudo-header's 32-bit length and 3 zero bytes do for a datagram under 64 KiB.)
fn pseudo_addrs(frame: &[u8], l4: usize) -> &[u8] {
    if l4 == 34 {
        &frame[26..34]
    } else {
        &frame[22..54]
    }
}

/// UDP checksum of the datagram at `l4` in an Ethernet frame (IPv4 or IPv6 pseudo-header),
/// with a computed 0 sent as 0xffff.
fn udp_checksum(frame: &[u8], l4: usize) -> u16 {
    let udp = &frame[l4..];
    let len = (udp.len() as u16).to_be_bytes();
    // The checksum field itself is left out of the sum.
    let c = internet_checksum(&[
        pseudo_addrs(frame, l4),
        &[0, 17],
        &len,
        &udp[..6],
        &udp[8..],
    ]);
    if c == 0 { 0xffff } else { c }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::frames::FlowFrames;

    fn spec(src: &str, dst: &str, size: usize, vary_dst: bool) -> FrameSpec {
        FrameSpec {
            frame_size: size,
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_ip: src.parse().unwrap(),
            dst_ip: dst.parse().unwrap(),
            fixed_port: 9,
            port_base: 40_000,
            flows: 1000,
            vary_dst,
        }
    }

    fn udp_ok(frame: &[u8], l4: usize) -> bool {
        let udp = &frame[l4..];
        let len = (udp.len() as u16).to_be_bytes();
        internet_checksum(&[pseudo_addrs(frame, l4), &[0, 17], &len, udp]) == 0
    }

    #[test]
    fn every_flow_has_valid_checksums() {
        for (src, dst, l4) in [("10.0.1.2", "10.0.2.2", 34), ("fd00:1::2", "fd00:2::2", 54)] {
            for size in [68, 78, 128, 1518] {
                for vary_dst in [false, true] {
                    let s = spec(src, dst, size, vary_dst);
                    let cfg = s.gen_config(7).unwrap();
                    let initial = s.frame().unwrap();
                    assert_eq!(initial.len(), size - FCS_LEN);
                    let frames = FlowFrames::new(&cfg, &initial).unwrap();
                    let mut frame = vec![0; initial.len()];
                    for i in [0, 1, 2, 999, 1000, 123_456] {
                        frames.write(i, &mut frame);
                        assert!(udp_ok(&frame, l4), "{src} size {size} flow {i}");
                        if l4 == 34 {
                            assert_eq!(internet_checksum(&[&frame[14..34]]), 0);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn lengths_and_ports_are_on_the_wire() {
        let s = spec("10.0.1.2", "10.0.2.2", 64, false);
        let f = s.frame().unwrap();
        assert_eq!(u16::from_be_bytes([f[16], f[17]]), 46); // IPv4 total length
        assert_eq!(u16::from_be_bytes([f[34], f[35]]), 40_000);
        assert_eq!(u16::from_be_bytes([f[36], f[37]]), 9);
        assert_eq!(u16::from_be_bytes([f[38], f[39]]), 26); // UDP length
        let s = spec("fd00:2::2", "fd00:1::2", 78, true);
        let f = s.frame().unwrap();
        assert_eq!(u16::from_be_bytes([f[18], f[19]]), 20); // IPv6 payload length
        assert_eq!(u16::from_be_bytes([f[54], f[55]]), 9);
        assert_eq!(u16::from_be_bytes([f[56], f[57]]), 40_000);
    }

    #[test]
    fn bad_specs_are_rejected() {
        assert!(spec("fd00:1::2", "fd00:2::2", 64, false).frame().is_err());
        assert!(spec("10.0.1.2", "10.0.2.2", 1522, false).frame().is_err());
        assert!(spec("10.0.1.2", "fd00:2::2", 64, false).frame().is_err());
        let mut s = spec("10.0.1.2", "10.0.2.2", 64, false);
        s.flows = 30_000;
        assert!(s.frame().is_err());
    }
}
