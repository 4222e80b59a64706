//! The RFC 1071 Internet checksum, for the frames the tests and the benchmark build and check.

/// RFC 1071 Internet checksum over the concatenation of `parts` (each of even length except
/// possibly the last), computed from scratch. A header or datagram whose checksum field is
/// included verifies when this is 0.
pub fn internet_checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u64 = 0;
    let mut odd: Option<u8> = None;
    for part in parts {
        for &b in *part {
            match odd.take() {
                None => odd = Some(b),
                Some(hi) => sum += u64::from(u16::from_be_bytes([hi, b])),
            }
        }
    }
    if let Some(hi) = odd {
        sum += u64::from(u16::from_be_bytes([hi, 0]));
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::internet_checksum;

    /// The example of RFC 1071 section 3 (sum 0xddf2), split at an odd offset, and a header
    /// that carries its own checksum verifies to 0.
    #[test]
    fn rfc1071_example_and_verification() {
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(internet_checksum(&[&data]), !0xddf2);
        assert_eq!(internet_checksum(&[&data[..4], &data[4..]]), !0xddf2);
        let mut ip = [
            0x45, 0, 0, 33, 0x12, 0x34, 0x40, 0, 63, 17, 0, 0, 10, 0, 2, 1, 10, 0, 2, 2,
        ];
        let c = internet_checksum(&[&ip]);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        assert_eq!(internet_checksum(&[&ip]), 0);
        // An odd last byte is padded with zero.
        assert_eq!(internet_checksum(&[&[0x12, 0x34, 0x56]]), !0x6834);
    }
}
