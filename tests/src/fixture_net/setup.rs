//! The map contents of a case: interfaces, TX ports, flows, bridges, VLANs and PPPoE sessions,
//! and the settings, built up from the managed router of the fixture namespace.

use xdp_router_common::{
    BRIDGE_VLAN_F_UNTAGGED, FdbKey, IFACE_F_BRIDGE_PORT, IFACE_F_BRIDGE_VLAN_FILTERING,
    IFACE_F_PPPOE, IFACE_F_PPPOE_LOWER, IFACE_F_VLAN, IFACE_F_VLAN_PARENT, IfaceInfo, PppoeKey,
    VlanKey,
};

use super::{
    flow::FlowEntry,
    topology::{Bed, LAN_MAC, LAN_SLOT, MTU_MAC, MTU_SLOT, WAN_MAC, WAN_SLOT},
};

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
    /// `SETTINGS_F_HOLD_ALL`: every packet held in the kernel (rules that must see every
    /// packet).
    pub hold_all: bool,
    /// `SETTINGS[0].fib_generation` (0 disables the FIB cache).
    pub fib_generation: u32,
    /// `SETTINGS[0].fib_cache_ns` (0 disables the FIB cache).
    pub fib_cache_ns: u64,
    /// `SETTINGS_F_FIB_MARK`: `bpf_fib_lookup` takes the packet mark (as on this kernel).
    pub fib_mark: bool,
    /// `SETTINGS[0].verify_l4_checksum` (as with `nf_conntrack_checksum = 1`, the default).
    pub verify_l4_checksum: bool,
    /// `SETTINGS[0].verdict_max_age`, in verdict ticks (0 = verdicts do not expire).
    pub verdict_max_age: u32,
    /// `SETTINGS_F_DSCP_REWRITE`: XDP applies the DSCP rewrites the kernel was seen making.
    pub dscp_rewrite: bool,
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
            hold_all: false,
            // As the daemon runs it: the FIB cache on (here with a long enough age that every
            // repeated packet of a case uses it).
            fib_generation: 1,
            fib_cache_ns: 10_000_000_000,
            fib_mark: true,
            verify_l4_checksum: true,
            verdict_max_age: 0,
            dscp_rewrite: false,
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
