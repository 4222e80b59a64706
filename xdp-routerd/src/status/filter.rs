//! `xdp-routerd flows --addr/--port`: which flow rows to show.

use std::{
    net::{IpAddr, SocketAddr},
    str::FromStr,
};

use super::{FlowRow, Flows};

/// `flows --addr`: an address or a prefix (`10.0.0.7`, `10.0.0.0/24`, `2001:db8::/32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddrFilter {
    net: IpAddr,
    prefix: u8,
}

impl FromStr for AddrFilter {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            format!(
                "{s:?} is not an IP address or prefix (e.g. 192.0.2.7, 10.0.0.0/8, 2001:db8::/32)"
            )
        };
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p.parse::<u8>().map_err(|_| bad())?)),
            None => (s, None),
        };
        let addr = addr.trim_start_matches('[').trim_end_matches(']');
        let net: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        if prefix > max {
            return Err(bad());
        }
        Ok(AddrFilter { net, prefix })
    }
}

impl AddrFilter {
    /// True when `a` is inside the prefix (always false across address families).
    pub fn contains(&self, a: IpAddr) -> bool {
        match (self.net, a) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// `flows --addr/--port`: a flow direction matches when any of its four endpoints (before and
/// after the rewrite) has the address, and any has the port. Both must hold when both are given.
#[derive(Debug, Clone, Copy, Default)]
pub struct FlowFilter {
    /// Address or prefix to look for.
    pub addr: Option<AddrFilter>,
    /// Port to look for.
    pub port: Option<u16>,
}

impl FlowFilter {
    /// Whether `f` passes the filter.
    pub fn matches(&self, f: &FlowRow) -> bool {
        let eps: Vec<SocketAddr> = [&f.src, &f.dst, &f.new_src, &f.new_dst]
            .iter()
            .filter_map(|e| e.parse().ok())
            .collect();
        self.addr
            .is_none_or(|a| eps.iter().any(|e| a.contains(e.ip())))
            && self.port.is_none_or(|p| eps.iter().any(|e| e.port() == p))
    }
}

impl Flows {
    /// Keeps the rows that match `filter`.
    pub fn filtered(mut self, filter: &FlowFilter) -> Flows {
        self.flows.retain(|f| filter.matches(f));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(src: &str, dst: &str, new_src: &str, new_dst: &str) -> FlowRow {
        FlowRow {
            family: "ipv4".into(),
            ingress: "lan0".into(),
            proto: "tcp".into(),
            src: src.into(),
            dst: dst.into(),
            new_src: new_src.into(),
            new_dst: new_dst.into(),
            direction: "original".into(),
            packets: 1,
            bytes: 1,
            conntrack: None,
            total: Default::default(),
            idle_ms: None,
            awaiting_traffic: false,
        }
    }

    #[test]
    fn flow_filters_match_any_endpoint() {
        let nat = flow(
            "192.168.1.10:40000",
            "198.51.100.1:443",
            "203.0.113.5:40000",
            "198.51.100.1:443",
        );
        let mut v6 = flow(
            "[2001:db8::10]:5000",
            "[2001:db8:1::1]:53",
            "[2001:db8::10]:5000",
            "[2001:db8:1::1]:53",
        );
        v6.family = "ipv6".into();
        let f = |addr: Option<&str>, port: Option<u16>| FlowFilter {
            addr: addr.map(|a| a.parse().unwrap()),
            port,
        };
        assert!(f(None, None).matches(&nat));
        assert!(f(Some("192.168.1.10"), None).matches(&nat));
        assert!(
            f(Some("203.0.113.0/24"), None).matches(&nat),
            "rewritten source"
        );
        assert!(!f(Some("10.0.0.0/8"), None).matches(&nat));
        assert!(f(Some("0.0.0.0/0"), Some(443)).matches(&nat));
        assert!(!f(Some("192.168.1.10"), Some(80)).matches(&nat));
        assert!(
            !f(Some("0.0.0.0/0"), None).matches(&v6),
            "families never match"
        );
        assert!(f(Some("2001:db8:1::/48"), Some(53)).matches(&v6));
        assert!(f(Some("[2001:db8::10]"), None).matches(&v6));
        let flows = Flows {
            flows: vec![nat, v6],
            conntrack_note: None,
        }
        .filtered(&f(None, Some(5000)));
        assert_eq!(flows.flows.len(), 1);
        assert_eq!(flows.flows[0].family, "ipv6");
    }

    #[test]
    fn addr_filter_rejects_garbage() {
        for bad in [
            "",
            "10.0.0.1/33",
            "2001:db8::/129",
            "host.example",
            "10.0.0/8",
            "1.2.3.4/x",
        ] {
            let e = bad.parse::<AddrFilter>().unwrap_err();
            assert!(e.contains("not an IP address"), "{bad}: {e}");
        }
    }
}
