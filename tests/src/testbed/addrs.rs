//! The names and addresses of the test bed: the router's interfaces and each host's, as in
//! the example config.

use std::net::{Ipv4Addr, Ipv6Addr};

/// The router's LAN interface (as in the example config).
pub const LAN_IF: &str = "eth1";
/// The router's WAN interface (as in the example config).
pub const WAN_IF: &str = "eth0";
/// The router's LAN port as a macvlan over [`LAN_IF`] (see `Testbed::macvlan_lan_port`).
pub const MACVLAN_LAN_IF: &str = "mv1";
/// The only interface of each host.
pub const HOST_IF: &str = "eth0";

/// LAN host.
pub const LAN_HOST_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 2);
/// Router, LAN side.
pub const ROUTER_LAN_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 1);
/// Router, WAN side (the MASQUERADE address).
pub const ROUTER_WAN_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 1);
/// WAN host.
pub const WAN_HOST_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
/// LAN host, IPv6.
pub const LAN_HOST_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 1, 0, 0, 0, 0, 0, 2);
/// Router, LAN side, IPv6.
pub const ROUTER_LAN_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 1, 0, 0, 0, 0, 0, 1);
/// Router, WAN side, IPv6 (no NAT for IPv6).
pub const ROUTER_WAN_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 2, 0, 0, 0, 0, 0, 1);
/// WAN host, IPv6.
pub const WAN_HOST_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 2, 0, 0, 0, 0, 0, 2);
