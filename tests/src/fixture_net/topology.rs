//! The router namespace of the fixtures: its interfaces, addresses, neighbours and routes (see
//! the module docs of [`crate::fixture_net`]), the MACs and map slots of its ports.

use std::{
    ffi::CString,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use crate::netns::Netns;

/// `XDP_PASS` verdict.
pub const XDP_PASS: u32 = 2;
/// `XDP_REDIRECT` verdict.
pub const XDP_REDIRECT: u32 = 4;

/// MAC of the router's `lan0`.
pub const LAN_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x01];
/// MAC of the router's `wan0`.
pub const WAN_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x02, 0x01];
/// MAC of the router's `mtu0`.
pub const MTU_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x03, 0x01];
/// MAC of the LAN client (permanent neighbour on `lan0`).
pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x0a];
/// MAC of the WAN gateway (permanent neighbour on `wan0`).
pub const GW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x02, 0xfe];
/// MAC of the peer behind `mtu0`.
pub const MTU_PEER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x03, 0x02];

/// STATS slot of `lan0` in [`Setup::managed`].
pub const LAN_SLOT: u32 = 1;
/// STATS slot of `wan0` in [`Setup::managed`].
pub const WAN_SLOT: u32 = 2;
/// STATS slot of `mtu0` in [`Setup::managed`].
pub const MTU_SLOT: u32 = 3;

/// `aa:bb:cc:dd:ee:ff` form of a MAC address.
pub fn mac(m: [u8; 6]) -> String {
    m.map(|b| format!("{b:02x}")).join(":")
}

/// An IPv4 address from a literal (panics on a typo in the test source).
pub fn v4(s: &str) -> IpAddr {
    IpAddr::V4(s.parse::<Ipv4Addr>().unwrap_or_else(|e| panic!("{s}: {e}")))
}

/// An IPv6 address from a literal (panics on a typo in the test source).
pub fn v6(s: &str) -> IpAddr {
    IpAddr::V6(s.parse::<Ipv6Addr>().unwrap_or_else(|e| panic!("{s}: {e}")))
}

/// Interface indexes of the router namespace.
#[derive(Clone, Copy, Debug)]
pub struct Bed {
    /// `lan0`.
    pub lan: u32,
    /// `wan0`.
    pub wan: u32,
    /// `mtu0` (MTU 1280).
    pub mtu: u32,
    /// `sub0`: no addresses, no routes; stands in for a device the datapath only needs an
    /// ifindex of (a VLAN device under a PPPoE session).
    pub sub: u32,
}

impl Bed {
    /// The interface indexes as seen from the calling thread (which must be inside the router
    /// namespace built by [`build_topology`]).
    pub fn here() -> Bed {
        Bed {
            lan: ifindex("lan0"),
            wan: ifindex("wan0"),
            mtu: ifindex("mtu0"),
            sub: ifindex("sub0"),
        }
    }
}

/// Builds the router namespace (see the module docs); `hosts` holds the veth peers.
pub fn build_topology(router: &Netns, hosts: &Netns) {
    router.veth("lan0", hosts, "lan0p");
    router.veth("wan0", hosts, "wan0p");
    router.veth("mtu0", hosts, "mtu0p");
    router.veth("sub0", hosts, "sub0p");
    router.sh(&format!(
        "set -e
        ip link set lan0 address {lan}
        ip link set wan0 address {wan}
        ip link set mtu0 address {mtu}
        ip link set mtu0 mtu 1280
        ip link set lan0 mtu 3500
        ip link set wan0 mtu 3500
        ip addr add 192.0.2.1/24 dev lan0
        ip addr add 2001:db8:1::1/64 dev lan0 nodad
        ip addr add 198.51.100.1/24 dev wan0
        ip addr add 2001:db8:2::1/64 dev wan0 nodad
        ip addr add 203.0.113.129/26 dev mtu0
        ip addr add 2001:db8:3::1/64 dev mtu0 nodad
        ip neigh replace 192.0.2.10 lladdr {client} dev lan0 nud permanent
        ip neigh replace 2001:db8:1::10 lladdr {client} dev lan0 nud permanent
        ip neigh replace 198.51.100.254 lladdr {gw} dev wan0 nud permanent
        ip neigh replace 2001:db8:2::fe lladdr {gw} dev wan0 nud permanent
        ip neigh replace 203.0.113.130 lladdr {peer} dev mtu0 nud permanent
        ip neigh replace 2001:db8:3::2 lladdr {peer} dev mtu0 nud permanent
        ip route add default via 198.51.100.254 dev wan0
        ip -6 route add default via 2001:db8:2::fe dev wan0
        ip route add blackhole 203.0.113.0/26
        ip route add unreachable 203.0.113.64/26
        ip route add 203.0.113.192/26 via 198.51.100.253 dev wan0
        ip -6 route add blackhole 2001:db8:dead::/48
        ip -6 route add 2001:db8:beef::/48 via 2001:db8:2::fd dev wan0
        sysctl -qw net.ipv4.ip_forward=1
        sysctl -qw net.ipv6.conf.all.forwarding=1",
        lan = mac(LAN_MAC),
        wan = mac(WAN_MAC),
        mtu = mac(MTU_MAC),
        client = mac(CLIENT_MAC),
        gw = mac(GW_MAC),
        peer = mac(MTU_PEER_MAC),
    ));
}

/// ifindex of `name` in the calling thread's namespace.
pub fn ifindex(name: &str) -> u32 {
    let c = CString::new(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    // SAFETY: c is a valid NUL-terminated string.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    assert_ne!(
        idx,
        0,
        "no interface {name}: {}",
        std::io::Error::last_os_error()
    );
    idx
}
