//! Incremental Internet checksum arithmetic (RFC 1624), shared by the datapath (per packet) and
//! the daemon (per flow: the NAT diff is computed once when a flow is offloaded).
//!
//! All values are *raw*: 16/32-bit words exactly as they sit in packet memory, read as native
//! integers. The one's-complement sum is byte-order independent, so as long as every word is
//! taken the same way the result is correct on the wire.

/// Folds a 64-bit one's-complement accumulator to 16 bits.
#[inline(always)]
pub const fn fold(mut sum: u64) -> u16 {
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// Diff contribution of replacing the raw 16-bit word `old` by `new`.
#[inline(always)]
pub const fn diff16(old: u16, new: u16) -> u32 {
    (!old) as u32 + new as u32
}

/// Diff contribution of replacing the raw 32-bit word `old` by `new`.
#[inline(always)]
pub const fn diff32(old: u32, new: u32) -> u32 {
    let o = !old;
    (o & 0xffff) + (o >> 16) + (new & 0xffff) + (new >> 16)
}

/// Sums several diffs into one folded 16-bit diff (kept in a u32 for the map ABI).
#[inline(always)]
pub const fn combine(a: u32, b: u32) -> u32 {
    fold(a as u64 + b as u64) as u32
}

/// Whether `diff` adds nothing: 0, or 0xffff (one's-complement -0, what an unchanged word
/// gives).
#[inline(always)]
pub const fn is_noop(diff: u32) -> bool {
    diff == 0 || fold(diff as u64) == 0xffff
}

/// Applies `diff` to the raw checksum field `check`: `~(~check + diff)` in one's complement.
///
/// A diff that adds nothing ([`is_noop`]) leaves the field as it is: `~(~0xffff + 0xffff)`
/// would turn a checksum field of 0xffff into 0x0000 (the same value in one's complement, but
/// not the bytes the kernel forwards).
#[inline(always)]
pub const fn apply(check: u16, diff: u32) -> u16 {
    if is_noop(diff) {
        return check;
    }
    !fold((!check) as u64 + diff as u64)
}

/// One's-complement sum (unfolded) of the IPv4 pseudo-header: raw addresses, protocol and the
/// transport length (host order).
#[inline(always)]
pub const fn pseudo_v4(src: u32, dst: u32, proto: u8, len: u16) -> u64 {
    let words = (src & 0xffff) + (src >> 16) + (dst & 0xffff) + (dst >> 16);
    words as u64 + u16::from_be_bytes([0, proto]).to_be() as u64 + len.to_be() as u64
}

/// One's-complement sum (unfolded) of the IPv6 pseudo-header: raw addresses, the upper-layer
/// length (host order) and next header.
#[inline(always)]
pub const fn pseudo_v6(src: [u32; 4], dst: [u32; 4], proto: u8, len: u16) -> u64 {
    let mut sum = u16::from_be_bytes([0, proto]).to_be() as u64 + len.to_be() as u64;
    let mut i = 0;
    while i < 4 {
        sum += (src[i] & 0xffff) as u64 + (src[i] >> 16) as u64;
        sum += (dst[i] & 0xffff) as u64 + (dst[i] >> 16) as u64;
        i += 1;
    }
    sum
}

/// True when the one's-complement sum of a whole checksummed block (checksum field included)
/// says the checksum is right: it folds to all ones.
#[inline(always)]
pub const fn sum_is_valid(sum: u64) -> bool {
    fold(sum) == 0xffff
}

/// Applies `diff` to a UDP-over-IPv4 checksum, where 0 means "no checksum" and must stay 0, and
/// a computed 0 is sent as 0xffff (RFC 768).
#[inline(always)]
pub const fn apply_udp(check: u16, diff: u32) -> u16 {
    if check == 0 {
        return 0;
    }
    let c = apply(check, diff);
    if c == 0 { 0xffff } else { c }
}

/// Per-flow NAT checksum diffs for IPv4: `(l3, l4)`, where `l3` covers the address rewrite in the
/// IPv4 header and `l4` covers addresses (pseudo-header) and ports in the TCP/UDP header.
#[inline(always)]
#[expect(
    clippy::too_many_arguments,
    reason = "old and new 4-tuple, spelled out for the eBPF side"
)]
pub const fn nat_diff_v4(
    old_src: u32,
    old_dst: u32,
    old_sport: u16,
    old_dport: u16,
    new_src: u32,
    new_dst: u32,
    new_sport: u16,
    new_dport: u16,
) -> (u32, u32) {
    let l3 = combine(diff32(old_src, new_src), diff32(old_dst, new_dst));
    let ports = combine(diff16(old_sport, new_sport), diff16(old_dport, new_dport));
    (l3, combine(l3, ports))
}

/// Per-flow NAT checksum diff for IPv6 TCP/UDP (addresses in the pseudo-header, and ports).
#[inline(always)]
#[expect(
    clippy::too_many_arguments,
    reason = "old and new 4-tuple, spelled out for the eBPF side"
)]
pub const fn nat_diff_v6(
    old_src: [u32; 4],
    old_dst: [u32; 4],
    old_sport: u16,
    old_dport: u16,
    new_src: [u32; 4],
    new_dst: [u32; 4],
    new_sport: u16,
    new_dport: u16,
) -> u32 {
    let mut sum = combine(diff16(old_sport, new_sport), diff16(old_dport, new_dport));
    let mut i = 0;
    while i < 4 {
        sum = combine(sum, diff32(old_src[i], new_src[i]));
        sum = combine(sum, diff32(old_dst[i], new_dst[i]));
        i += 1;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    /// From-scratch Internet checksum over big-endian bytes.
    fn full(bytes: &[u8]) -> u16 {
        let mut sum: u64 = 0;
        for c in bytes.chunks(2) {
            let w = if c.len() == 2 {
                u16::from_be_bytes([c[0], c[1]])
            } else {
                u16::from_be_bytes([c[0], 0])
            };
            sum += w as u64;
        }
        !fold(sum)
    }

    fn raw16(b: [u8; 2]) -> u16 {
        u16::from_ne_bytes(b)
    }

    fn raw32(b: [u8; 4]) -> u32 {
        u32::from_ne_bytes(b)
    }

    #[test]
    fn incremental_nat_matches_from_scratch() {
        // A pseudo "header": src, dst, sport, dport, some payload words.
        let mut pkt = [
            10, 0, 1, 2, 198, 51, 100, 7, 0x9c, 0x40, 0x00, 0x50, 0xde, 0xad, 0xbe, 0xef,
        ];
        let before = full(&pkt);
        let (old_src, old_dst) = (raw32([10, 0, 1, 2]), raw32([198, 51, 100, 7]));
        let (old_sp, old_dp) = (raw16([0x9c, 0x40]), raw16([0x00, 0x50]));
        let (new_src, new_sp) = (raw32([203, 0, 113, 1]), raw16([0xea, 0x61]));
        let (_, l4) = nat_diff_v4(
            old_src, old_dst, old_sp, old_dp, new_src, old_dst, new_sp, old_dp,
        );
        pkt[0..4].copy_from_slice(&[203, 0, 113, 1]);
        pkt[8..10].copy_from_slice(&[0xea, 0x61]);
        let after = full(&pkt);
        // Raw checksum field as read from memory is the big-endian value's bytes.
        let raw_before = u16::from_ne_bytes(before.to_be_bytes());
        let raw_after = apply(raw_before, l4);
        assert_eq!(u16::from_be_bytes(raw_after.to_ne_bytes()), after);
    }

    #[test]
    fn udp_zero_checksum_stays_zero() {
        assert_eq!(apply_udp(0, 0x1234), 0);
    }

    #[test]
    fn checksum_ffff_survives_an_identity_rewrite() {
        let (_, l4) = nat_diff_v4(1, 2, 3, 4, 1, 2, 3, 4);
        assert_eq!(apply(0xffff, l4), 0xffff);
        assert_eq!(apply(0xffff, 0), 0xffff);
        // A real change still updates it.
        assert_ne!(apply(0xffff, diff16(1, 2)), 0xffff);
    }

    #[test]
    fn pseudo_headers_verify_a_from_scratch_checksum() {
        // UDP 10.0.0.1:4660 -> 10.0.0.2:80, payload "abc".
        let (src, dst) = ([10, 0, 0, 1], [10, 0, 0, 2]);
        let mut seg = [0x12, 0x34, 0x00, 0x50, 0x00, 0x0b, 0, 0, b'a', b'b', b'c'];
        let mut ph = [0u8; 23];
        ph[0..4].copy_from_slice(&src);
        ph[4..8].copy_from_slice(&dst);
        ph[8..12].copy_from_slice(&[0, 17, 0, 11]);
        ph[12..].copy_from_slice(&seg);
        let c = full(&ph);
        seg[6..8].copy_from_slice(&c.to_be_bytes());
        let raw_sum = |bytes: &[u8]| {
            bytes
                .chunks(2)
                .map(|c| u16::from_ne_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u64)
                .sum::<u64>()
        };
        let p4 = pseudo_v4(raw32(src), raw32(dst), 17, 11);
        assert!(sum_is_valid(p4 + raw_sum(&seg)));
        seg[9] ^= 1;
        assert!(!sum_is_valid(p4 + raw_sum(&seg)));
        seg[9] ^= 1;
        // IPv6: the same segment with v4-mapped-like addresses checks the same way.
        let s6 = [0, 0, 0, raw32(src)];
        let d6 = [0, 0, 0, raw32(dst)];
        assert!(sum_is_valid(pseudo_v6(s6, d6, 17, 11) + raw_sum(&seg)));
    }

    #[test]
    fn identity_diff_is_neutral() {
        let (l3, l4) = nat_diff_v4(1, 2, 3, 4, 1, 2, 3, 4);
        assert_eq!(apply(0x1234, l3), 0x1234);
        assert_eq!(apply(0x1234, l4), 0x1234);
    }
}
