//! Whether CCP runs on a PPP device: compression (Deflate, BSD-Compress) or MPPE encryption.
//! A compressor and decompressor keep state across packets (a dictionary fed with every
//! packet of the unit, `incomp` for the ones sent or received uncompressed; MPPE's key and
//! coherency count), so a packet the XDP fast path carried around the kernel's PPP layer would
//! desynchronise the two ends (and under MPPE would leave unencrypted). A PPP device on which
//! CCP has run ([`crate::sync::pppoe::SessionRead::ccp`]) is therefore carried only by the TC
//! fast path on the PPP device itself, after the kernel's decompression and before its
//! compression, or else left to the kernel.
//!
//! The kernel says so through `SIOCGPPPCSTATS` on the PPP device (`ppp_get_compstats` in
//! `drivers/net/ppp/ppp_generic.c`): a `struct ppp_comp_stats`, all zero unless a compressor
//! (`c`) or decompressor (`d`) state exists, whose counters move once it has handled a packet.

use std::{io, mem::size_of};

/// `SIOCGPPPCSTATS` (`SIOCDEVPRIVATE + 2`, include/uapi/linux/ppp-ioctl.h); libc has no
/// `SIOCDEVPRIVATE` for Linux.
const SIOCGPPPCSTATS: libc::Ioctl = 0x89F2;

/// `struct compstat` (include/uapi/linux/ppp_defs.h): one direction's compression counters.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CompStat {
    /// Uncompressed bytes.
    pub unc_bytes: u32,
    /// Uncompressed packets.
    pub unc_packets: u32,
    /// Compressed bytes.
    pub comp_bytes: u32,
    /// Compressed packets.
    pub comp_packets: u32,
    /// Incompressible bytes (sent as they were, still fed to the dictionary).
    pub inc_bytes: u32,
    /// Incompressible packets.
    pub inc_packets: u32,
    /// Bytes in.
    pub in_count: u32,
    /// Bytes out.
    pub bytes_out: u32,
    /// Not computed by the kernel.
    pub ratio: f64,
}

const _: () = assert!(size_of::<CompStat>() == 40);

/// `struct ppp_comp_stats`: the compressor's (`c`, packets sent) and the decompressor's (`d`,
/// packets received) counters.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PppCompStats {
    pub c: CompStat,
    pub d: CompStat,
}

const _: () = assert!(size_of::<PppCompStats>() == 80);

impl CompStat {
    /// Whether any counter moved (`ratio` is never set by the kernel).
    fn has_run(&self) -> bool {
        [
            self.unc_bytes,
            self.unc_packets,
            self.comp_bytes,
            self.comp_packets,
            self.inc_bytes,
            self.inc_packets,
            self.in_count,
            self.bytes_out,
        ]
        .iter()
        .any(|&n| n != 0)
    }
}

impl PppCompStats {
    /// Whether compression or decompression has handled a packet of the unit: a state that
    /// was set up (CCP opened) but never used, or none at all, reads all zero. Pure.
    pub fn compression_has_run(&self) -> bool {
        self.c.has_run() || self.d.has_run()
    }
}

/// Reads the compression counters of the PPP device `name` (`SIOCGPPPCSTATS`; needs
/// CAP_NET_ADMIN). `ENODEV`: no such device; `ENOTTY`/`EOPNOTSUPP`/`EINVAL`: not a PPP device.
/// Blocking but short.
pub fn read(name: &str) -> io::Result<PppCompStats> {
    let bytes = name.as_bytes();
    if bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::from_raw_os_error(libc::ENODEV));
    }
    // SAFETY: a plain socket call; the descriptor is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut stats = PppCompStats::default();
    // SAFETY: ifreq is plain old data; all zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    req.ifr_ifru.ifru_data = (&raw mut stats).cast();
    // SAFETY: fd is a socket, req a valid ifreq with a NUL-terminated name whose ifr_data
    // points at a `struct ppp_comp_stats` (layout asserted above) that outlives the call.
    let rc = unsafe { libc::ioctl(fd, SIOCGPPPCSTATS, &mut req) };
    let err = io::Error::last_os_error();
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    if rc != 0 {
        return Err(err);
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_state_and_an_unused_state_read_as_not_run() {
        assert!(!PppCompStats::default().compression_has_run());
        // ratio is not a counter.
        let mut s = PppCompStats::default();
        s.c.ratio = 1.5;
        assert!(!s.compression_has_run());
    }

    #[test]
    fn any_moved_counter_either_way_means_compression_runs() {
        // Deflate feeding an incompressible datagram to its dictionary (`incomp`) counts it.
        let mut sent = PppCompStats::default();
        sent.c.unc_packets = 1;
        sent.c.unc_bytes = 84;
        sent.c.inc_packets = 1;
        sent.c.inc_bytes = 84;
        assert!(sent.compression_has_run());
        let mut received = PppCompStats::default();
        received.d.comp_packets = 3;
        assert!(received.compression_has_run());
        let mut bytes_only = PppCompStats::default();
        bytes_only.d.bytes_out = 7;
        assert!(bytes_only.compression_has_run());
    }

    #[test]
    fn the_layout_is_the_kernels() {
        // Offsets of include/uapi/linux/ppp_defs.h on every Linux ABI: eight __u32, a double.
        assert_eq!(std::mem::offset_of!(CompStat, bytes_out), 28);
        assert_eq!(std::mem::offset_of!(CompStat, ratio), 32);
        assert_eq!(std::mem::offset_of!(PppCompStats, d), 40);
    }

    #[test]
    fn a_name_no_device_can_have_is_enodev() {
        let e = read("a-name-longer-than-ifnamsiz").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENODEV));
    }
}
