//! Which ruleset a firewall rule was read from (the nftables family of its table, or the
//! legacy tool) and where it is in it. Shared by the rules that hold flows in the kernel
//! ([`super::per_packet`]) and the DSCP rewrites the fast path applies
//! ([`super::dscp_rewrite`]).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Which ruleset a rule is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleOrigin {
    /// An nftables table of the `ip` family (iptables-nft's IPv4 tables too).
    NftIp,
    /// An nftables table of the `ip6` family (ip6tables-nft's too).
    NftIp6,
    /// An nftables table of the `inet` family.
    NftInet,
    /// An nftables table of the `netdev` family (device ingress/egress chains).
    NftNetdev,
    /// An nftables table of the `bridge` family.
    NftBridge,
    /// `iptables-legacy`.
    LegacyIpv4,
    /// `ip6tables-legacy`.
    LegacyIpv6,
}

impl RuleOrigin {
    /// How `status` names it: the nftables family, or the legacy tool.
    pub fn name(self) -> &'static str {
        match self {
            RuleOrigin::NftIp => "ip",
            RuleOrigin::NftIp6 => "ip6",
            RuleOrigin::NftInet => "inet",
            RuleOrigin::NftNetdev => "netdev",
            RuleOrigin::NftBridge => "bridge",
            RuleOrigin::LegacyIpv4 => "iptables-legacy",
            RuleOrigin::LegacyIpv6 => "ip6tables-legacy",
        }
    }
}

/// Where a rule is, as an admin finds it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RulePlace {
    pub origin: RuleOrigin,
    /// The table (`mangle`, an nftables table's name).
    pub table: String,
    /// The chain.
    pub chain: String,
    /// 1-based position in the chain (see `PerPacketRule::position`).
    pub position: u32,
}

impl fmt::Display for RulePlace {
    /// `inet mangle forward rule 2`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} rule {}",
            self.origin.name(),
            self.table,
            self.chain,
            self.position
        )
    }
}
