//! The router network namespace and map plumbing shared by the BPF_PROG_RUN users: the
//! fixture table (`tests/prog_run/`) and the per-packet cost benchmark (`bin/prog_cost.rs`).
//!
//! `bpf_fib_lookup` consults the routes and neighbours of the namespace of the thread that runs
//! BPF_PROG_RUN (through the ingress device given in the `xdp_md` context), so both build the
//! same router namespace and run the program from a thread inside it ([`Netns::run`]).
//!
//! Router namespace, interfaces and what is behind them:
//! - `lan0` (MTU 3500: room for the longest checksum-verified segment) 192.0.2.1/24,
//!   2001:db8:1::1/64; client .10 / ::10 (permanent neighbour)
//! - `wan0` (MTU 3500) 198.51.100.1/24, 2001:db8:2::1/64; gateway .254 / ::fe (permanent neighbour);
//!   default routes via the gateway; 203.0.113.192/26 and 2001:db8:beef::/48 via a gateway
//!   without neighbour entry (.253 / ::fd)
//! - `mtu0` (MTU 1280) 203.0.113.129/26, 2001:db8:3::1/64; peer .130 / ::2
//! - blackhole 203.0.113.0/26 and 2001:db8:dead::/48, unreachable 203.0.113.64/26

use std::{
    ffi::CString,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, DevMapHash, HashMap, MapData, PerCpuArray},
    programs::{TestRun, TestRunOptions, Xdp},
};
use xdp_router_common::{
    BRIDGE_VLAN_F_UNTAGGED, BridgeVlanKey, Counter, FLOW_F_REPLY, FdbKey, FibCache, FlowCounters,
    FlowKeyV4, FlowKeyV6, FlowV4, FlowV6, GLOBAL_FIB_FLAGS, IFACE_F_BRIDGE_PORT,
    IFACE_F_BRIDGE_VLAN_FILTERING, IFACE_F_PPPOE, IFACE_F_PPPOE_LOWER, IFACE_F_VLAN,
    IFACE_F_VLAN_PARENT, IfaceInfo, MAP_BRIDGE_FDB, MAP_BRIDGE_VLANS, MAP_FLOWS_V4, MAP_FLOWS_V6,
    MAP_IFACES, MAP_PPPOE, MAP_SETTINGS, MAP_STATS, MAP_TX_PORTS, MAP_VLANS, PROG_NAME, PppoeKey,
    SETTINGS_F_FIB_MARK, Settings, VlanKey,
    checksum::{nat_diff_v4, nat_diff_v6},
};

use crate::{
    netns::Netns,
    packet::{Spec, Transport},
};

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

/// One flow map entry.
#[derive(Clone, Copy, Debug)]
pub enum FlowEntry {
    /// An IPv4 flow direction.
    V4(FlowKeyV4, FlowV4),
    /// An IPv6 flow direction.
    V6(FlowKeyV6, FlowV6),
}

/// A port as the raw network-order `u16` the maps hold.
pub fn raw_port(p: u16) -> u16 {
    p.to_be()
}

/// An IPv4 address as the raw network-order `u32` the maps hold.
pub fn raw_v4(a: IpAddr) -> u32 {
    match a {
        IpAddr::V4(a) => u32::from_ne_bytes(a.octets()),
        IpAddr::V6(a) => panic!("{a} is not IPv4"),
    }
}

/// An IPv6 address as the four raw network-order words the maps hold.
pub fn raw_v6(a: IpAddr) -> [u32; 4] {
    match a {
        IpAddr::V6(a) => {
            let o = a.octets();
            std::array::from_fn(|i| {
                u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
            })
        }
        IpAddr::V4(a) => panic!("{a} is not IPv6"),
    }
}

/// The flow entry the daemon would write for packets like `pkt` arriving on `ingress`, to be
/// translated to `new_src` → `new_dst` (the same as the packet's for no NAT).
pub fn flow(
    ingress: u32,
    pkt: &Spec,
    (new_src, new_sport): (IpAddr, u16),
    (new_dst, new_dport): (IpAddr, u16),
    reply: bool,
) -> FlowEntry {
    let proto = match pkt.transport {
        Transport::Tcp(_) => 6,
        Transport::Udp => 17,
    };
    let flags = if reply { FLOW_F_REPLY } else { 0 };
    let (sport, dport) = (raw_port(pkt.sport), raw_port(pkt.dport));
    let (nsport, ndport) = (raw_port(new_sport), raw_port(new_dport));
    match pkt.src {
        IpAddr::V4(_) => {
            let key = FlowKeyV4 {
                ifindex: ingress,
                src_be: raw_v4(pkt.src),
                dst_be: raw_v4(pkt.dst),
                sport_be: sport,
                dport_be: dport,
                proto,
                _pad: [0; 3],
            };
            let (l3, l4) = nat_diff_v4(
                key.src_be,
                key.dst_be,
                sport,
                dport,
                raw_v4(new_src),
                raw_v4(new_dst),
                nsport,
                ndport,
            );
            FlowEntry::V4(
                key,
                FlowV4 {
                    new_src_be: raw_v4(new_src),
                    new_dst_be: raw_v4(new_dst),
                    new_sport_be: nsport,
                    new_dport_be: ndport,
                    flags,
                    l3_csum_diff: l3,
                    l4_csum_diff: l4,
                    armed_generation: ARMED,
                    ..Default::default()
                },
            )
        }
        IpAddr::V6(_) => {
            let key = FlowKeyV6 {
                ifindex: ingress,
                src_be: raw_v6(pkt.src),
                dst_be: raw_v6(pkt.dst),
                sport_be: sport,
                dport_be: dport,
                proto,
                _pad: [0; 3],
            };
            let l4 = nat_diff_v6(
                key.src_be,
                key.dst_be,
                sport,
                dport,
                raw_v6(new_src),
                raw_v6(new_dst),
                nsport,
                ndport,
            );
            FlowEntry::V6(
                key,
                FlowV6 {
                    new_src_be: raw_v6(new_src),
                    new_dst_be: raw_v6(new_dst),
                    new_sport_be: nsport,
                    new_dport_be: ndport,
                    flags,
                    l4_csum_diff: l4,
                    armed_generation: ARMED,
                    ..Default::default()
                },
            )
        }
    }
}

impl FlowEntry {
    /// The entry with the DSCP the TC arming program recorded (`kernel_dscp`).
    pub fn with_kernel_dscp(self, kernel_dscp: u32) -> FlowEntry {
        match self {
            FlowEntry::V4(k, v) => FlowEntry::V4(k, FlowV4 { kernel_dscp, ..v }),
            FlowEntry::V6(k, v) => FlowEntry::V6(k, FlowV6 { kernel_dscp, ..v }),
        }
    }

    /// The entry with this `kernel_ttl` (`FLOW_TTL_KNOWN | ttl`, as the TC arming program
    /// records the TTL / hop limit the kernel sent the direction out with).
    pub fn with_kernel_ttl(self, kernel_ttl: u32) -> FlowEntry {
        match self {
            FlowEntry::V4(k, v) => FlowEntry::V4(k, FlowV4 { kernel_ttl, ..v }),
            FlowEntry::V6(k, v) => FlowEntry::V6(k, FlowV6 { kernel_ttl, ..v }),
        }
    }

    /// The entry with `armed_generation` and `fib_mark` as the TC arming program would have
    /// left them.
    pub fn armed(self, generation: u32, mark: u32) -> FlowEntry {
        match self {
            FlowEntry::V4(k, v) => FlowEntry::V4(
                k,
                FlowV4 {
                    armed_generation: generation,
                    fib_mark: mark,
                    ..v
                },
            ),
            FlowEntry::V6(k, v) => FlowEntry::V6(
                k,
                FlowV6 {
                    armed_generation: generation,
                    fib_mark: mark,
                    ..v
                },
            ),
        }
    }
}

/// The ruleset generation the fixtures' `SETTINGS` hold, and the one their flows are armed
/// with (as if the kernel had forwarded a packet of each under the current rules).
pub const ARMED: u32 = 1;

/// A flow that forwards `pkt` unchanged (routing only).
pub fn routed(ingress: u32, pkt: &Spec, reply: bool) -> FlowEntry {
    flow(
        ingress,
        pkt,
        (pkt.src, pkt.sport),
        (pkt.dst, pkt.dport),
        reply,
    )
}

/// Map contents of a case.
#[derive(Clone, Debug)]
pub struct Setup {
    /// `FLOWS_V4` / `FLOWS_V6` entries.
    pub flows: Vec<FlowEntry>,
    /// `IFACES` entries.
    pub ifaces: Vec<(u32, IfaceInfo)>,
    /// `TX_PORTS` entries.
    pub tx_ports: Vec<u32>,
    /// `BRIDGE_FDB` entries → port ifindex.
    pub fdb: Vec<(FdbKey, u32)>,
    /// `BRIDGE_VLANS` entries: (port or bridge ifindex, VLAN) → `BRIDGE_VLAN_F_*`.
    pub bridge_vlans: Vec<((u32, u16), u32)>,
    /// `VLANS` entries: tag on the parent → VLAN device ifindex.
    pub vlans: Vec<(VlanKey, u32)>,
    /// `PPPOE` entries: session on the lower device → PPP device ifindex.
    pub pppoe: Vec<(PppoeKey, u32)>,
    /// `SETTINGS[0].fastpath_enabled`.
    pub fastpath: bool,
    /// `SETTINGS[0].fib_generation` (0 disables the FIB cache).
    pub fib_generation: u32,
    /// `SETTINGS[0].fib_cache_ns` (0 disables the FIB cache).
    pub fib_cache_ns: u64,
    /// `SETTINGS_F_FIB_MARK`: `bpf_fib_lookup` takes the packet mark (as on this kernel).
    pub fib_mark: bool,
    /// `SETTINGS[0].verify_l4_checksum` (as with `nf_conntrack_checksum = 1`, the default).
    pub verify_l4_checksum: bool,
}

impl Setup {
    /// All three interfaces managed and redirectable, fast path on.
    pub fn managed(bed: &Bed, flows: Vec<FlowEntry>) -> Setup {
        Setup {
            flows,
            ifaces: vec![
                (
                    bed.lan,
                    IfaceInfo {
                        slot: LAN_SLOT,
                        flags: 0,
                        mac: LAN_MAC,
                        l3_ifindex: 0,
                        ..IfaceInfo::default()
                    },
                ),
                (
                    bed.wan,
                    IfaceInfo {
                        slot: WAN_SLOT,
                        flags: 0,
                        mac: WAN_MAC,
                        l3_ifindex: 0,
                        ..IfaceInfo::default()
                    },
                ),
                (
                    bed.mtu,
                    IfaceInfo {
                        slot: MTU_SLOT,
                        flags: 0,
                        mac: MTU_MAC,
                        l3_ifindex: 0,
                        ..IfaceInfo::default()
                    },
                ),
            ],
            tx_ports: vec![bed.lan, bed.wan, bed.mtu],
            fdb: Vec::new(),
            bridge_vlans: Vec::new(),
            vlans: Vec::new(),
            pppoe: Vec::new(),
            fastpath: true,
            // As the daemon runs it: the FIB cache on (here with a long enough age that every
            // repeated packet of a case uses it).
            fib_generation: 1,
            fib_cache_ns: 10_000_000_000,
            fib_mark: true,
            verify_l4_checksum: true,
        }
    }

    /// `ifindex`'s own MAC in `IFACES` replaced by `mac`.
    pub fn with_iface_mac(mut self, ifindex: u32, mac: [u8; 6]) -> Setup {
        for (i, info) in &mut self.ifaces {
            if *i == ifindex {
                info.mac = mac;
            }
        }
        self
    }

    /// TCP/UDP checksums not verified (`nf_conntrack_checksum = 0`).
    pub fn without_l4_checksum(mut self) -> Setup {
        self.verify_l4_checksum = false;
        self
    }

    /// The FIB cache off: every packet takes a full `bpf_fib_lookup` (`fib_cache_ms = 0`).
    pub fn without_fib_cache(mut self) -> Setup {
        self.fib_cache_ns = 0;
        self
    }

    pub fn without_iface(mut self, ifindex: u32) -> Setup {
        self.ifaces.retain(|(i, _)| *i != ifindex);
        self
    }

    pub fn without_tx_port(mut self, ifindex: u32) -> Setup {
        self.tx_ports.retain(|i| *i != ifindex);
        self
    }

    /// `port` made a port of the bridge `bridge` (`IFACE_F_BRIDGE_PORT`, its `l3_ifindex`).
    pub fn with_bridge_port(mut self, port: u32, bridge: u32) -> Setup {
        for (i, info) in &mut self.ifaces {
            if *i == port {
                info.flags |= IFACE_F_BRIDGE_PORT;
                info.l3_ifindex = bridge;
            }
        }
        self
    }

    /// A `BRIDGE_FDB` entry: `mac` is behind `port` of `bridge` (without VLAN filtering).
    pub fn with_fdb(self, bridge: u32, mac: [u8; 6], port: u32) -> Setup {
        self.with_fdb_vlan(bridge, mac, 0, port)
    }

    /// A `BRIDGE_FDB` entry: `mac` is behind `port` of `bridge` in VLAN `vid`.
    pub fn with_fdb_vlan(mut self, bridge: u32, mac: [u8; 6], vid: u16, port: u32) -> Setup {
        let key = FdbKey {
            bridge_ifindex: bridge,
            mac,
            vid,
        };
        self.fdb.push((key, port));
        self
    }

    /// `ifindex` (a bridge or its port) made VLAN-filtering with PVID `pvid` (0: none) and
    /// tag protocol 802.1Q, member of the VLANs `vlans` (VID, untagged).
    pub fn with_vlan_filtering(mut self, ifindex: u32, pvid: u16, vlans: &[(u16, bool)]) -> Setup {
        for (i, info) in &mut self.ifaces {
            if *i == ifindex {
                info.flags |= IFACE_F_BRIDGE_VLAN_FILTERING;
                info.vlan_tpid_be = 0x8100u16.to_be();
                info.vlan_tci_be = pvid.to_be();
            }
        }
        for &(vid, untagged) in vlans {
            let flags = if untagged { BRIDGE_VLAN_F_UNTAGGED } else { 0 };
            self.bridge_vlans.push(((ifindex, vid), flags));
        }
        self
    }

    /// `vlan` made the VLAN device `vid` (tag protocol `tpid`, host order) over `parent`
    /// (`IFACE_F_VLAN`, its `VLANS` entry). The parent keeps its own entry; `parent_only`
    /// marks it as managed only for its VLANs (`IFACE_F_VLAN_PARENT`).
    pub fn with_vlan(
        mut self,
        vlan: u32,
        parent: u32,
        vid: u16,
        tpid: u16,
        parent_only: bool,
    ) -> Setup {
        for (i, info) in &mut self.ifaces {
            if *i == vlan {
                info.flags |= IFACE_F_VLAN;
                info.lower_ifindex = parent;
                info.vlan_tci_be = vid.to_be();
                info.vlan_tpid_be = tpid.to_be();
            }
            if *i == parent && parent_only {
                info.flags |= IFACE_F_VLAN_PARENT;
            }
        }
        self.vlans.push((
            VlanKey {
                parent_ifindex: parent,
                vid,
                tpid_be: tpid.to_be(),
            },
            vlan,
        ));
        self
    }

    /// `ppp` made the PPP device of PPPoE session `sid` (host order) with the access
    /// concentrator `peer` over `lower` (`IFACE_F_PPPOE`: the lower device's MAC, no
    /// `TX_PORTS` entry; its `PPPOE` entry). `lower_only` marks the lower device as managed
    /// only for the session (`IFACE_F_PPPOE_LOWER`).
    pub fn with_pppoe(
        mut self,
        ppp: u32,
        lower: u32,
        sid: u16,
        peer: [u8; 6],
        lower_only: bool,
    ) -> Setup {
        let lower_mac = self
            .ifaces
            .iter()
            .find(|(i, _)| *i == lower)
            .map(|(_, info)| info.mac)
            .unwrap_or_else(|| panic!("lower device {lower} has no IFACES entry in the setup"));
        for (i, info) in &mut self.ifaces {
            if *i == ppp {
                info.flags |= IFACE_F_PPPOE;
                info.lower_ifindex = lower;
                info.pppoe_sid_be = sid.to_be();
                info.peer_mac = peer;
                info.mac = lower_mac;
            }
            if *i == lower && lower_only {
                info.flags |= IFACE_F_PPPOE_LOWER;
            }
        }
        self.tx_ports.retain(|i| *i != ppp);
        self.pppoe.push((
            PppoeKey {
                lower_ifindex: lower,
                sid_be: sid.to_be(),
                _pad: 0,
            },
            ppp,
        ));
        self
    }

    /// An `IFACES` entry (and `TX_PORTS` entry) for `ifindex` in stats slot `slot`.
    pub fn with_iface(mut self, ifindex: u32, slot: u32, mac: [u8; 6]) -> Setup {
        self.ifaces.push((
            ifindex,
            IfaceInfo {
                slot,
                mac,
                ..IfaceInfo::default()
            },
        ));
        self.tx_ports.push(ifindex);
        self
    }

    pub fn with_iface_flags(mut self, ifindex: u32, flags: u32) -> Setup {
        for (i, info) in &mut self.ifaces {
            if *i == ifindex {
                info.flags |= flags;
            }
        }
        self
    }
}

/// A LAN client's packet to a server behind the WAN.
pub fn lan_pkt(src: IpAddr, dst: IpAddr, transport: Transport, payload_len: usize) -> Spec {
    Spec {
        eth_src: CLIENT_MAC,
        eth_dst: LAN_MAC,
        src,
        dst,
        sport: 40_000,
        dport: 443,
        ttl: 64,
        transport,
        payload_len,
    }
}

/// A server's reply arriving on the WAN, addressed to the router (after SNAT) or the client.
pub fn wan_pkt(src: IpAddr, dst: IpAddr, dport: u16, transport: Transport) -> Spec {
    Spec {
        eth_src: GW_MAC,
        eth_dst: WAN_MAC,
        src,
        dst,
        sport: 443,
        dport,
        ttl: 57,
        transport,
        payload_len: 120,
    }
}

/// Typed handles on every map of the loaded object.
pub struct Maps {
    /// `FLOWS_V4`.
    pub flows_v4: HashMap<MapData, FlowKeyV4, FlowV4>,
    /// `FLOWS_V6`.
    pub flows_v6: HashMap<MapData, FlowKeyV6, FlowV6>,
    /// `IFACES`.
    pub ifaces: HashMap<MapData, u32, IfaceInfo>,
    /// `TX_PORTS`.
    pub tx_ports: DevMapHash<MapData>,
    /// `BRIDGE_FDB`.
    pub fdb: HashMap<MapData, FdbKey, u32>,
    /// `BRIDGE_VLANS` (`None` in an object built before it existed).
    pub bridge_vlans: Option<HashMap<MapData, BridgeVlanKey, u32>>,
    /// `VLANS`.
    pub vlans: HashMap<MapData, VlanKey, u32>,
    /// `PPPOE`.
    pub pppoe: HashMap<MapData, PppoeKey, u32>,
    /// `STATS`.
    pub stats: PerCpuArray<MapData, Counter>,
    /// `SETTINGS`.
    pub settings: Array<MapData, Settings>,
}

/// Takes map `name` out of the loaded object as the typed handle `T`.
pub fn take<T: TryFrom<aya::maps::Map>>(ebpf: &mut Ebpf, name: &str) -> T
where
    T::Error: std::fmt::Display,
{
    let map = ebpf
        .take_map(name)
        .unwrap_or_else(|| panic!("object has no map {name}"));
    T::try_from(map).unwrap_or_else(|e| panic!("map {name}: {e}"))
}

/// Loads the embedded object and the program (the verifier runs here).
pub fn load() -> (Ebpf, Maps) {
    load_object(xdp_routerd::datapath::EBPF_OBJECT, 0)
}

/// Loads an `xdp_router` object (e.g. an older build to compare with) and its program, with
/// `fib_flags` as its `GLOBAL_FIB_FLAGS` (ignored by objects without it).
pub fn load_object(object: &[u8], fib_flags: u32) -> (Ebpf, Maps) {
    let mut ebpf = EbpfLoader::new()
        .override_global(GLOBAL_FIB_FLAGS, &fib_flags, false)
        .load(object)
        .unwrap_or_else(|e| panic!("load eBPF object: {e:#}"));
    let prog: &mut Xdp = ebpf
        .program_mut(PROG_NAME)
        .unwrap_or_else(|| panic!("object has no program {PROG_NAME}"))
        .try_into()
        .unwrap_or_else(|e| panic!("{PROG_NAME} is not XDP: {e}"));
    if let Err(e) = prog.load() {
        panic!("verifier rejected {PROG_NAME}: {e}\n{:?}", e);
    }
    let maps = Maps {
        flows_v4: take(&mut ebpf, MAP_FLOWS_V4),
        flows_v6: take(&mut ebpf, MAP_FLOWS_V6),
        ifaces: take(&mut ebpf, MAP_IFACES),
        tx_ports: take(&mut ebpf, MAP_TX_PORTS),
        fdb: take(&mut ebpf, MAP_BRIDGE_FDB),
        bridge_vlans: ebpf
            .take_map(MAP_BRIDGE_VLANS)
            .map(|m| HashMap::try_from(m).expect("BRIDGE_VLANS map")),
        vlans: take(&mut ebpf, MAP_VLANS),
        pppoe: take(&mut ebpf, MAP_PPPOE),
        stats: take(&mut ebpf, MAP_STATS),
        settings: take(&mut ebpf, MAP_SETTINGS),
    };
    (ebpf, maps)
}

impl Maps {
    /// Empties every map, then writes the case's setup.
    pub fn apply(&mut self, s: &Setup) {
        let keys: Vec<_> = self
            .flows_v4
            .keys()
            .map(|k| k.expect("flows_v4 key"))
            .collect();
        for k in keys {
            self.flows_v4.remove(&k).expect("remove flow v4");
        }
        let keys: Vec<_> = self
            .flows_v6
            .keys()
            .map(|k| k.expect("flows_v6 key"))
            .collect();
        for k in keys {
            self.flows_v6.remove(&k).expect("remove flow v6");
        }
        let keys: Vec<_> = self.ifaces.keys().map(|k| k.expect("ifaces key")).collect();
        for k in keys {
            self.ifaces.remove(&k).expect("remove iface");
        }
        let keys: Vec<_> = self
            .tx_ports
            .keys()
            .map(|k| k.expect("tx_ports key"))
            .collect();
        for k in keys {
            self.tx_ports.remove(k).expect("remove tx port");
        }
        for f in &s.flows {
            match f {
                FlowEntry::V4(k, v) => self.flows_v4.insert(k, v, 0).expect("insert flow v4"),
                FlowEntry::V6(k, v) => self.flows_v6.insert(k, v, 0).expect("insert flow v6"),
            }
        }
        for (i, info) in &s.ifaces {
            self.ifaces.insert(i, info, 0).expect("insert iface");
        }
        for i in &s.tx_ports {
            self.tx_ports
                .insert(*i, *i, None, 0)
                .expect("insert tx port");
        }
        let keys: Vec<_> = self.fdb.keys().map(|k| k.expect("fdb key")).collect();
        for k in keys {
            self.fdb.remove(&k).expect("remove fdb entry");
        }
        for (key, port) in &s.fdb {
            self.fdb.insert(key, port, 0).expect("insert fdb entry");
        }
        if let Some(bridge_vlans) = &mut self.bridge_vlans {
            let keys: Vec<_> = bridge_vlans
                .keys()
                .map(|k| k.expect("bridge vlans key"))
                .collect();
            for k in keys {
                bridge_vlans.remove(&k).expect("remove bridge vlan entry");
            }
            for ((ifindex, vid), flags) in &s.bridge_vlans {
                let key = BridgeVlanKey {
                    ifindex: *ifindex,
                    vid: *vid,
                    _pad: 0,
                };
                bridge_vlans
                    .insert(key, flags, 0)
                    .expect("insert bridge vlan entry");
            }
        } else {
            assert!(
                s.bridge_vlans.is_empty(),
                "this object has no {MAP_BRIDGE_VLANS} map"
            );
        }
        let keys: Vec<_> = self.vlans.keys().map(|k| k.expect("vlans key")).collect();
        for k in keys {
            self.vlans.remove(&k).expect("remove vlan entry");
        }
        for (key, vlan) in &s.vlans {
            self.vlans.insert(key, vlan, 0).expect("insert vlan entry");
        }
        let keys: Vec<_> = self.pppoe.keys().map(|k| k.expect("pppoe key")).collect();
        for k in keys {
            self.pppoe.remove(&k).expect("remove pppoe entry");
        }
        for (key, ppp) in &s.pppoe {
            self.pppoe.insert(key, ppp, 0).expect("insert pppoe entry");
        }
        self.write_settings(s);
    }

    /// Writes only the setup's `SETTINGS` entry (fast path switch, FIB cache generation and age).
    pub fn write_settings(&mut self, s: &Setup) {
        let settings = Settings {
            fastpath_enabled: u32::from(s.fastpath),
            fib_generation: s.fib_generation,
            fib_cache_ns: s.fib_cache_ns,
            ruleset_generation: ARMED,
            flags: if s.fib_mark { SETTINGS_F_FIB_MARK } else { 0 },
            verify_l4_checksum: u32::from(s.verify_l4_checksum),
            _pad: 0,
            active_since_ns: 0,
        };
        self.settings.set(0, settings, 0).expect("write settings");
    }

    /// Every STATS entry, summed over CPUs.
    pub fn stats(&self) -> Vec<Counter> {
        self.stats
            .iter()
            .map(|per_cpu| {
                per_cpu
                    .expect("read stats")
                    .iter()
                    .fold(Counter::default(), |a, c| Counter {
                        packets: a.packets + c.packets,
                        bytes: a.bytes + c.bytes,
                    })
            })
            .collect()
    }

    /// Current counters of a flow entry.
    pub fn counters(&self, f: &FlowEntry) -> FlowCounters {
        match f {
            FlowEntry::V4(k, _) => self.flows_v4.get(k, 0).expect("flow v4 present").counters,
            FlowEntry::V6(k, _) => self.flows_v6.get(k, 0).expect("flow v6 present").counters,
        }
    }

    /// The flow entry's cached FIB answer.
    pub fn fib_cache(&self, f: &FlowEntry) -> FibCache {
        match f {
            FlowEntry::V4(k, _) => self.flows_v4.get(k, 0).expect("flow v4 present").fib,
            FlowEntry::V6(k, _) => self.flows_v6.get(k, 0).expect("flow v6 present").fib,
        }
    }

    /// Replaces the flow entry's cached FIB answer (the rest of the entry is kept).
    pub fn set_fib_cache(&mut self, f: &FlowEntry, fib: FibCache) {
        match f {
            FlowEntry::V4(k, _) => {
                let mut v = self.flows_v4.get(k, 0).expect("flow v4 present");
                v.fib = fib;
                self.flows_v4.insert(k, v, 0).expect("rewrite flow v4");
            }
            FlowEntry::V6(k, _) => {
                let mut v = self.flows_v6.get(k, 0).expect("flow v6 present");
                v.fib = fib;
                self.flows_v6.insert(k, v, 0).expect("rewrite flow v6");
            }
        }
    }
}

/// CLOCK_MONOTONIC_COARSE now, in ns: the clock of the flows' `last_seen_ns`
/// (`bpf_ktime_get_coarse_ns`), which advances once per tick.
pub fn coarse_monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The `struct xdp_md` context of a run: a frame of `len` bytes received on `ingress`.
pub fn xdp_md(ingress: u32, len: usize) -> Vec<u8> {
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index,
    // egress_ifindex. The kernel wants data = data_meta = 0 and data_end = frame length.
    let md: [u32; 6] = [0, len as u32, 0, ingress, 0, 0];
    md.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

/// Runs the program once on `frame` as received on `ingress`: (verdict, output frame).
pub fn run(prog: &Xdp, frame: &[u8], ingress: u32) -> (u32, Vec<u8>) {
    let ctx = xdp_md(ingress, frame.len());
    let mut out = vec![0u8; frame.len() + 512];
    let res = prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            ..TestRunOptions::default()
        })
        .unwrap_or_else(|e| panic!("BPF_PROG_RUN: {e}"));
    out.truncate(res.data_size_out as usize);
    (res.return_value, out)
}
