//! A route's destination prefix (`10.1.0.0/16`): the unit in which a route change touches
//! the route answers cached for offloaded flows (longest-prefix match: addresses inside it may
//! change, no others).

use std::net::IpAddr;

/// A route's destination prefix (`addr` has its host bits cleared).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Prefix {
    pub addr: IpAddr,
    pub len: u8,
}

impl Prefix {
    /// `addr/len`, host bits cleared; `None` when `len` is longer than the address.
    pub fn new(addr: IpAddr, len: u8) -> Option<Prefix> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (len <= max).then(|| Prefix {
            addr: Prefix::mask(addr, len),
            len,
        })
    }

    /// `addr` with everything after its first `len` bits cleared.
    pub fn mask(addr: IpAddr, len: u8) -> IpAddr {
        match addr {
            IpAddr::V4(a) => {
                let m = u32::MAX
                    .checked_shl(32 - u32::from(len.min(32)))
                    .unwrap_or(0);
                IpAddr::V4((u32::from(a) & m).into())
            }
            IpAddr::V6(a) => {
                let m = u128::MAX
                    .checked_shl(128 - u32::from(len.min(128)))
                    .unwrap_or(0);
                IpAddr::V6((u128::from(a) & m).into())
            }
        }
    }

    /// Its last address (all host bits set).
    pub fn last(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(a) => {
                let host = u32::MAX.checked_shr(u32::from(self.len)).unwrap_or(0);
                IpAddr::V4((u32::from(a) | host).into())
            }
            IpAddr::V6(a) => {
                let host = u128::MAX.checked_shr(u32::from(self.len)).unwrap_or(0);
                IpAddr::V6((u128::from(a) | host).into())
            }
        }
    }

    /// Whether `addr` is inside it.
    pub fn contains(&self, addr: IpAddr) -> bool {
        addr.is_ipv4() == self.addr.is_ipv4() && Prefix::mask(addr, self.len) == self.addr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_contain_exactly_their_addresses() {
        let p = Prefix::new("10.1.2.3".parse().unwrap(), 16).unwrap();
        assert_eq!(p.addr, "10.1.0.0".parse::<IpAddr>().unwrap());
        assert!(p.contains("10.1.255.255".parse().unwrap()));
        assert!(!p.contains("10.2.0.0".parse().unwrap()));
        assert!(!p.contains("::a01:0".parse().unwrap()));
        let default = Prefix::new("0.0.0.0".parse().unwrap(), 0).unwrap();
        assert!(default.contains("203.0.113.9".parse().unwrap()));
        assert!(!default.contains("2001:db8::1".parse().unwrap()));
        let host = Prefix::new("2001:db8::1".parse().unwrap(), 128).unwrap();
        assert!(host.contains("2001:db8::1".parse().unwrap()));
        assert!(!host.contains("2001:db8::2".parse().unwrap()));
        assert_eq!(Prefix::new("10.0.0.0".parse().unwrap(), 33), None);
        assert_eq!(p.last(), "10.1.255.255".parse::<IpAddr>().unwrap());
        assert_eq!(host.last(), host.addr);
        assert_eq!(default.last(), "255.255.255.255".parse::<IpAddr>().unwrap());
        let v6 = Prefix::new("2001:db8:1::".parse().unwrap(), 48).unwrap();
        assert_eq!(
            v6.last(),
            "2001:db8:1:ffff:ffff:ffff:ffff:ffff"
                .parse::<IpAddr>()
                .unwrap()
        );
    }
}
