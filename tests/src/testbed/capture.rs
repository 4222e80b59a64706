//! Frames on the wire: an AF_PACKET capture of one interface, and UDP frames parsed with their
//! checksums verified.

use std::{
    ffi::CString,
    io,
    net::{IpAddr, SocketAddr},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::{Duration, Instant},
};

use xdp_router_testbed::checksum::internet_checksum;

use crate::netns::Netns;

/// How long [`Capture::arrivals`] keeps listening for copies once a marked frame arrived: a
/// second copy (the bug it would show: a frame both forwarded and passed) follows the first
/// within microseconds, by either path.
pub const AFTER_ARRIVAL: Duration = Duration::from_millis(40);

/// An AF_PACKET socket capturing every frame of one interface of a namespace.
pub struct Capture {
    fd: OwnedFd,
}

impl Capture {
    /// Opens the capture on `ifname` in `ns`.
    pub fn open(ns: &Netns, ifname: &str) -> Capture {
        let name = CString::new(ifname).expect("interface name");
        let fd = ns.run(move || -> io::Result<OwnedFd> {
            let proto = (libc::ETH_P_ALL as u16).to_be();
            // SAFETY: plain socket(2) call; the fd is owned right away.
            let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto.into()) };
            if raw < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `raw` is a fresh fd that nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            // SAFETY: `name` is a valid NUL-terminated string.
            let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
            if ifindex == 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: sockaddr_ll is plain data; zeroed is a valid value.
            let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = proto;
            sll.sll_ifindex = ifindex as i32;
            // SAFETY: valid fd and a sockaddr_ll of the size passed.
            let rc = unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&sll as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                )
            };
            if rc < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(fd)
        });
        let fd = fd.unwrap_or_else(|e| panic!("AF_PACKET capture on {ifname}: {e}"));
        Capture { fd }
    }

    /// Sends `frame` (a whole Ethernet frame, as built) out of the interface.
    pub fn send(&self, frame: &[u8]) {
        // SAFETY: valid fd bound to the interface; buffer valid for its length.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        assert_eq!(
            n,
            frame.len() as isize,
            "AF_PACKET send: {}",
            io::Error::last_os_error()
        );
    }

    /// Frames with `marker` received on the interface: waits up to `wait` for the first, then
    /// until nothing more arrived for [`AFTER_ARRIVAL`] (a test whose cases mostly arrive does
    /// not wait out the whole window for each).
    pub fn arrivals(&self, marker: &[u8], wait: Duration) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        let deadline = Instant::now() + wait;
        loop {
            let left = if got.is_empty() {
                deadline.saturating_duration_since(Instant::now())
            } else {
                AFTER_ARRIVAL
            };
            if left.is_zero() {
                break;
            }
            let Some(f) = self.next_incoming(left) else {
                break;
            };
            if f.windows(marker.len()).any(|w| w == marker) {
                got.push(f);
            }
        }
        got
    }

    /// The next frame received on (not sent from) the interface, or None after `timeout`.
    pub fn next_incoming(&self, timeout: Duration) -> Option<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 65536];
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let tv = libc::timeval {
                tv_sec: left.as_secs() as libc::time_t,
                tv_usec: left.subsec_micros().max(1) as libc::suseconds_t,
            };
            // SAFETY: valid fd; option value is a timeval of the right size.
            unsafe {
                libc::setsockopt(
                    self.fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    (&tv as *const libc::timeval).cast(),
                    std::mem::size_of::<libc::timeval>() as libc::socklen_t,
                )
            };
            // SAFETY: sockaddr_ll is plain data; zeroed is a valid value.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut from_len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: buffer and address pointers are valid for the lengths passed.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut from_len,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) {
                    return None;
                }
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                panic!("AF_PACKET recvfrom: {e}");
            }
            if from.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            return Some(buf[..n as usize].to_vec());
        }
    }
}

/// A UDP datagram parsed from an Ethernet frame, with its checksums verified independently of
/// the project's own checksum code.
#[derive(Debug, Clone)]
pub struct UdpFrame {
    /// Source address.
    pub src: SocketAddr,
    /// Destination address.
    pub dst: SocketAddr,
    /// IPv4 TTL or IPv6 hop limit.
    pub ttl: u8,
    /// IPv4 header checksum verifies (always true for IPv6, which has none).
    pub ip_checksum_ok: bool,
    /// The UDP checksum is present and verifies over the pseudo-header.
    pub udp_checksum_ok: bool,
    /// The UDP payload.
    pub payload: Vec<u8>,
}

/// Parses an Ethernet frame carrying IPv4 or IPv6 UDP (no options/extension headers); None for
/// anything else.
pub fn parse_udp_frame(frame: &[u8]) -> Option<UdpFrame> {
    let ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let ip = frame.get(14..)?;
    let (src_ip, dst_ip, ttl, ip_ok, l4, pseudo): (IpAddr, IpAddr, u8, bool, &[u8], Vec<u8>) =
        match ethertype {
            0x0800 => {
                let ihl = usize::from(ip.first()? & 0x0f) * 4;
                let tot = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
                if ip.first()? >> 4 != 4 || ihl != 20 || *ip.get(9)? != 17 || tot > ip.len() {
                    return None;
                }
                let hdr = ip.get(..20)?;
                let ip_ok = internet_checksum(&[hdr]) == 0;
                let src: [u8; 4] = hdr[12..16].try_into().ok()?;
                let dst: [u8; 4] = hdr[16..20].try_into().ok()?;
                let l4 = ip.get(20..tot)?;
                let mut pseudo = Vec::with_capacity(12);
                pseudo.extend_from_slice(&src);
                pseudo.extend_from_slice(&dst);
                pseudo.extend_from_slice(&[0, 17]);
                pseudo.extend_from_slice(&(l4.len() as u16).to_be_bytes());
                (src.into(), dst.into(), hdr[8], ip_ok, l4, pseudo)
            }
            0x86dd => {
                let hdr = ip.get(..40)?;
                if hdr[0] >> 4 != 6 || hdr[6] != 17 {
                    return None;
                }
                let plen = usize::from(u16::from_be_bytes([hdr[4], hdr[5]]));
                let src: [u8; 16] = hdr[8..24].try_into().ok()?;
                let dst: [u8; 16] = hdr[24..40].try_into().ok()?;
                let l4 = ip.get(40..40 + plen)?;
                let mut pseudo = Vec::with_capacity(40);
                pseudo.extend_from_slice(&src);
                pseudo.extend_from_slice(&dst);
                pseudo.extend_from_slice(&(l4.len() as u32).to_be_bytes());
                pseudo.extend_from_slice(&[0, 0, 0, 17]);
                (src.into(), dst.into(), hdr[7], true, l4, pseudo)
            }
            _ => return None,
        };
    if l4.len() < 8 || usize::from(u16::from_be_bytes([l4[4], l4[5]])) != l4.len() {
        return None;
    }
    let sport = u16::from_be_bytes([l4[0], l4[1]]);
    let dport = u16::from_be_bytes([l4[2], l4[3]]);
    let stored = u16::from_be_bytes([l4[6], l4[7]]);
    let udp_ok = stored != 0 && internet_checksum(&[&pseudo, l4]) == 0;
    Some(UdpFrame {
        src: SocketAddr::new(src_ip, sport),
        dst: SocketAddr::new(dst_ip, dport),
        ttl,
        ip_checksum_ok: ip_ok,
        udp_checksum_ok: udp_ok,
        payload: l4[8..].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A captured-by-hand IPv4 UDP frame (checksums computed by the kernel) parses and verifies;
    /// flipping a payload bit breaks the UDP checksum, flipping the TTL breaks the IP checksum.
    #[test]
    fn udp_frame_checksums_are_verified() {
        // 10.0.2.1:40000 -> 10.0.2.2:9999, TTL 63, payload "hello".
        let mut f = vec![0u8; 14];
        f[12] = 0x08;
        let mut ip = vec![
            0x45, 0, 0, 33, 0x12, 0x34, 0x40, 0, 63, 17, 0, 0, 10, 0, 2, 1, 10, 0, 2, 2,
        ];
        let c = internet_checksum(&[&ip]);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let mut udp = vec![0x9c, 0x40, 0x27, 0x0f, 0, 13, 0, 0];
        udp.extend_from_slice(b"hello");
        let pseudo = [10, 0, 2, 1, 10, 0, 2, 2, 0, 17, 0, 13];
        let c = internet_checksum(&[&pseudo, &udp]);
        udp[6..8].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&udp);

        let p = parse_udp_frame(&f).expect("parses");
        assert!(p.ip_checksum_ok && p.udp_checksum_ok, "{p:?}");
        assert_eq!(p.ttl, 63);
        assert_eq!(p.src, "10.0.2.1:40000".parse().unwrap());
        assert_eq!(p.dst, "10.0.2.2:9999".parse().unwrap());
        assert_eq!(p.payload, b"hello");

        let mut bad = f.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(!parse_udp_frame(&bad).unwrap().udp_checksum_ok);
        let mut bad = f.clone();
        bad[14 + 8] = 62;
        assert!(!parse_udp_frame(&bad).unwrap().ip_checksum_ok);
    }
}
