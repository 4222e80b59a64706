//! Bridged LANs: a managed interface that is a bridge (`br-lan`) gets the XDP program on its
//! ports, and the bridge's forwarding database (FDB) is copied into `BRIDGE_FDB` so packets
//! routed out of the bridge are redirected to the port their destination MAC is behind.
//!
//! - Ports come from `/sys/class/net/<bridge>/brif/`, with their STP state
//!   (`brport/state`, 3 = forwarding), read again after every link notification (a port added,
//!   removed, or changing state is one).
//! - FDB entries come from rtnetlink `AF_BRIDGE` neighbour messages (`bridge fdb`): a dump at
//!   start, then `RTM_NEWNEIGH` / `RTM_DELNEIGH` notifications on the neighbour group, which the
//!   kernel sends when a MAC is learned, moves to another port, or ages out. Only the bridge's
//!   own learned/static entries (with `NDA_MASTER`, pointing at a port) count, each in its VLAN
//!   (`NDA_VLAN`; none, 0, on a bridge without VLAN filtering); local entries (the bridge's and
//!   its ports' own addresses) are left out.
//! - A VLAN-filtering bridge (`vlan_filtering 1`, the OpenWrt DSA layout) has a tag protocol
//!   (sysfs `bridge/vlan_protocol`) and a VLAN table for itself (its `self` VLANs) and for each
//!   port: an `AF_BRIDGE` `RTM_GETLINK` dump with `IFLA_EXT_MASK = RTEXT_FILTER_BRVLAN`
//!   (`bridge vlan show`), read again with the ports: `bridge vlan add/del` and a
//!   `vlan_filtering` toggle come as link notifications (`RTM_NEWLINK`, `AF_BRIDGE` for the
//!   former).
//! - A bridge under a managed VLAN device (`br-lan.20`) that is not in the config itself is
//!   read too, under its own name: it is managed as the VLAN device's parent.
//!
//! This module reads and parses (sysfs, rtnetlink); the ports are attached and their flags
//! kept by [`crate::state::bridge`], from a [`read`] done before the state lock is taken.

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
};

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    link::{AfSpecBridge, BridgeVlanInfoFlags, LinkAttribute, LinkExtentMask, LinkMessage},
    neighbour::{NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState},
};
use netlink_sys::protocols::NETLINK_ROUTE;
use tracing::error;

/// `BR_STATE_FORWARDING` (`uapi/linux/if_bridge.h`).
const BR_STATE_FORWARDING: u32 = 3;

/// A port of a bridge as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    pub name: String,
    pub ifindex: u32,
    /// STP state is forwarding (always, without STP).
    pub forwarding: bool,
    /// Its link kind (see [`super::xdp_xmit::link_kind`]).
    pub kind: Option<String>,
}

fn sysfs(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Whether the interface called `name` is a bridge.
pub fn is_bridge(name: &str) -> bool {
    std::path::Path::new(&format!("/sys/class/net/{name}/bridge")).is_dir()
}

/// Whether the bridge called `name` filters by VLAN (`vlan_filtering = 1`).
pub fn vlan_filtering(name: &str) -> bool {
    sysfs(&format!("/sys/class/net/{name}/bridge/vlan_filtering")).as_deref() == Some("1")
}

/// The tag protocol of the bridge called `name` (`vlan_protocol`, host order); `None` when it
/// cannot be read or is neither 802.1Q nor 802.1ad.
pub fn vlan_protocol(name: &str) -> Option<u16> {
    parse_tpid(&sysfs(&format!(
        "/sys/class/net/{name}/bridge/vlan_protocol"
    ))?)
}

/// `0x8100` / `0x88a8` as sysfs shows a bridge's `vlan_protocol`. Pure.
fn parse_tpid(s: &str) -> Option<u16> {
    let tpid = u16::from_str_radix(s.trim().strip_prefix("0x")?, 16).ok()?;
    matches!(tpid, 0x8100 | 0x88a8).then_some(tpid)
}

/// The ports of the bridge called `bridge`, by name order.
pub fn ports(bridge: &str) -> Vec<PortInfo> {
    let Ok(dir) = std::fs::read_dir(format!("/sys/class/net/{bridge}/brif")) else {
        return Vec::new();
    };
    let mut out: Vec<PortInfo> = dir
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let ifindex = sysfs(&format!("/sys/class/net/{name}/ifindex"))?
                .parse()
                .ok()?;
            let state: u32 = sysfs(&format!("/sys/class/net/{name}/brport/state"))?
                .parse()
                .ok()?;
            Some(PortInfo {
                kind: super::xdp_xmit::link_kind(&name),
                name,
                ifindex,
                forwarding: state == BR_STATE_FORWARDING,
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// A change of a bridge FDB. `vid` is the VLAN the entry is in (`NDA_VLAN`): 0 for an entry
/// without one (every entry of a bridge without VLAN filtering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FdbEvent {
    /// `mac` is behind `port` of `bridge` in VLAN `vid` (learned, moved, or static).
    Learned {
        bridge: u32,
        mac: [u8; 6],
        vid: u16,
        port: u32,
    },
    /// `mac` is no longer known to `bridge` in VLAN `vid` (aged out, flushed, port removed).
    Forgotten { bridge: u32, mac: [u8; 6], vid: u16 },
}

/// The FDB change an `AF_BRIDGE` neighbour message means (`new`: RTM_NEWNEIGH), if it is one
/// of a bridge's own entries that points at a port. Pure; unit-tested.
pub fn fdb_event(msg: &NeighbourMessage, new: bool) -> Option<FdbEvent> {
    let h = &msg.header;
    // The bridge's own entries carry NDA_MASTER and not NTF_SELF (which marks a device's own
    // address list, e.g. its multicast addresses); the kernel does not set NTF_MASTER in them.
    if h.family != AddressFamily::Bridge || h.flags.contains(NeighbourFlags::Own) {
        return None;
    }
    let mut mac = None;
    let mut bridge = None;
    let mut vid = 0;
    for a in &msg.attributes {
        match a {
            NeighbourAttribute::LinkLayerAddress(m) => mac = <[u8; 6]>::try_from(m.as_slice()).ok(),
            NeighbourAttribute::Controller(b) => bridge = Some(*b),
            NeighbourAttribute::Vlan(v) => vid = *v,
            _ => {}
        }
    }
    let (mac, bridge) = (mac?, bridge?);
    // Local entries (the bridge's own and its ports' addresses) are delivered to the host.
    let local = h.state == NeighbourState::Permanent || h.ifindex == bridge;
    if !new || local {
        return Some(FdbEvent::Forgotten { bridge, mac, vid });
    }
    Some(FdbEvent::Learned {
        bridge,
        mac,
        vid,
        port: h.ifindex,
    })
}

/// Every bridge FDB entry of the namespace (`bridge fdb show`), as [`FdbEvent::Learned`].
pub fn fdb_dump() -> io::Result<Vec<FdbEvent>> {
    let mut msg = NeighbourMessage::default();
    msg.header.family = AddressFamily::Bridge;
    let mut out = Vec::new();
    dump(RouteNetlinkMessage::GetNeighbour(msg), |m| {
        if let RouteNetlinkMessage::NewNeighbour(n) = m
            && let Some(ev @ FdbEvent::Learned { .. }) = fdb_event(&n, true)
        {
            out.push(ev);
        }
    })?;
    Ok(out)
}

/// Sends the dump request `req` on a fresh rtnetlink socket and hands every message of the
/// answer to `each`. Blocking; as long as the table is.
fn dump(req: RouteNetlinkMessage, mut each: impl FnMut(RouteNetlinkMessage)) -> io::Result<()> {
    let sock = super::nlsocket::request_socket(NETLINK_ROUTE)?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = 1;
    let mut req = NetlinkMessage::new(header, NetlinkPayload::from(req));
    req.finalize();
    let mut buf = vec![0; req.buffer_len()];
    req.serialize(&mut buf);
    sock.send(&buf, 0)?;
    loop {
        let (data, _) = sock.recv_from_full()?;
        for raw in super::datagram::messages(&data).map_while(Result::ok) {
            let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(raw)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok(()),
                NetlinkPayload::Error(e) => return Err(e.to_io()),
                NetlinkPayload::InnerMessage(m) => each(m),
                _ => {}
            }
        }
    }
}

/// One VLAN a port of a VLAN-filtering bridge, or the bridge itself, is a member of (a line of
/// `bridge vlan show`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VlanMember {
    /// Untagged frames it receives are in this VLAN (`PVID`; one VLAN at most).
    pub pvid: bool,
    /// It sends this VLAN's frames untagged (`Egress Untagged`). For the bridge itself: its
    /// own IP layer sees the VLAN on the bridge device, not on a VLAN device over it.
    pub untagged: bool,
}

/// A device's VLAN memberships, by VLAN ID (1..4094).
pub type VlanTable = BTreeMap<u16, VlanMember>;

/// The PVID of a VLAN table, if it has one.
pub fn pvid(table: &VlanTable) -> Option<u16> {
    table.iter().find(|(_, m)| m.pvid).map(|(v, _)| *v)
}

/// A VLAN-filtering bridge as read: its tag protocol and VLAN tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VlanFiltering {
    /// Its `vlan_protocol` (host order): 0x8100 (802.1Q) or 0x88a8 (802.1ad); 0 when it
    /// cannot be read, and then the tables are left empty (its frames go to the kernel).
    pub tpid: u16,
    /// Its own VLANs (`bridge vlan add dev br-lan vid 20 self`).
    pub own: VlanTable,
    /// Each port's VLANs, by ifindex; a port missing here is a member of none.
    pub ports: BTreeMap<u32, VlanTable>,
}

/// The VLAN table an `AF_BRIDGE` link message carries (`IFLA_AF_SPEC` /
/// `IFLA_BRIDGE_VLAN_INFO`): the device's ifindex, its bridge's (`IFLA_MASTER`: the bridge's
/// own for the bridge itself) and its VLANs. Ranges (`RTEXT_FILTER_BRVLAN_COMPRESSED`, as in
/// notifications) are expanded; VLAN IDs outside 1..4094 and broken ranges are left out.
/// `None` for other families and for devices that are in no bridge. Pure.
pub fn vlan_table_of(msg: &LinkMessage) -> Option<(u32, u32, VlanTable)> {
    if msg.header.interface_family != AddressFamily::Bridge {
        return None;
    }
    let mut bridge = None;
    let mut table = VlanTable::new();
    let mut range_start = None;
    let valid = |vid: u16| (1..4095).contains(&vid);
    for a in &msg.attributes {
        match a {
            LinkAttribute::Controller(b) => bridge = Some(*b),
            LinkAttribute::AfSpecBridge(spec) => {
                for info in spec.iter().filter_map(|s| match s {
                    AfSpecBridge::VlanInfo(i) => Some(i),
                    _ => None,
                }) {
                    let member = VlanMember {
                        pvid: info.flags.contains(BridgeVlanInfoFlags::Pvid),
                        untagged: info.flags.contains(BridgeVlanInfoFlags::Untagged),
                    };
                    if info.flags.contains(BridgeVlanInfoFlags::RangeBegin) {
                        range_start = Some(info.vid);
                    } else if info.flags.contains(BridgeVlanInfoFlags::RangeEnd) {
                        if let Some(start) = range_start.take() {
                            for vid in (start..=info.vid).filter(|v| valid(*v)) {
                                table.insert(vid, member);
                            }
                        }
                    } else if valid(info.vid) {
                        range_start = None;
                        table.insert(info.vid, member);
                    }
                }
            }
            _ => {}
        }
    }
    Some((msg.header.index, bridge.filter(|b| *b != 0)?, table))
}

/// The VLAN tables of every bridge and bridge port of the namespace (`bridge vlan show`), by
/// ifindex, each with its bridge's ifindex.
pub fn vlan_dump() -> io::Result<BTreeMap<u32, (u32, VlanTable)>> {
    let mut msg = LinkMessage::default();
    msg.header.interface_family = AddressFamily::Bridge;
    msg.attributes
        .push(LinkAttribute::ExtMask(vec![LinkExtentMask::Brvlan]));
    let mut out = BTreeMap::new();
    dump(RouteNetlinkMessage::GetLink(msg), |m| {
        if let RouteNetlinkMessage::NewLink(l) = m
            && let Some((ifindex, bridge, table)) = vlan_table_of(&l)
        {
            out.insert(ifindex, (bridge, table));
        }
    })?;
    Ok(out)
}

/// The VLANs of each bridge and port (by name) whose own STP state is not forwarding
/// (`bridge vlan set dev p1 vid 20 state blocking`, or an MST instance's state): the bridge
/// drops their frames there as if the device were no member, so they are left out of its
/// table. The state is only in the kernel's `RTM_GETVLAN` dump, which netlink-packet-route
/// does not parse; iproute2's `bridge -d -j vlan show` prints it. Blocking (a child process).
pub fn vlans_not_forwarding() -> io::Result<BTreeMap<String, BTreeSet<u16>>> {
    let out = crate::signals::unblocked_in_std_child(
        std::process::Command::new("bridge").args(["-d", "-j", "vlan", "show"]),
    )
    .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "bridge -d -j vlan show: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    not_forwarding_in(&out.stdout).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// [`vlans_not_forwarding`] from `bridge -d -j vlan show`'s output: `[{"ifname": "p1",
/// "vlans": [{"vlan": 20, "vlanEnd": 22, "state": "blocking", …}]}]`. An entry without a state
/// (an iproute2 or kernel without per-VLAN STP) counts as forwarding, as the kernel then
/// forwards by the port's state alone. Pure.
pub fn not_forwarding_in(
    json: &[u8],
) -> Result<BTreeMap<String, BTreeSet<u16>>, serde_json::Error> {
    #[derive(serde::Deserialize)]
    struct Device {
        ifname: String,
        #[serde(default)]
        vlans: Vec<Vlan>,
    }
    #[derive(serde::Deserialize)]
    struct Vlan {
        vlan: u16,
        #[serde(rename = "vlanEnd")]
        vlan_end: Option<u16>,
        state: Option<String>,
    }
    let devices: Vec<Device> = if json.iter().all(u8::is_ascii_whitespace) {
        // No bridge VLAN in the namespace: iproute2 prints nothing at all.
        Vec::new()
    } else {
        serde_json::from_slice(json)?
    };
    let mut out = BTreeMap::new();
    for d in devices {
        let vids: BTreeSet<u16> = d
            .vlans
            .iter()
            .filter(|v| v.state.as_deref().is_some_and(|s| s != "forwarding"))
            .flat_map(|v| v.vlan..=v.vlan_end.unwrap_or(v.vlan).max(v.vlan))
            .collect();
        if !vids.is_empty() {
            out.insert(d.ifname, vids);
        }
    }
    Ok(out)
}

/// The VLAN filtering of the bridge `ifindex` from a [`vlan_dump`] (`tpid`: its protocol):
/// its own table and its ports'. Pure.
pub fn filtering_of(
    ifindex: u32,
    tpid: u16,
    tables: &BTreeMap<u32, (u32, VlanTable)>,
) -> VlanFiltering {
    let mut f = VlanFiltering {
        tpid,
        ..VlanFiltering::default()
    };
    for (i, (bridge, table)) in tables {
        if *bridge != ifindex {
            continue;
        }
        if *i == ifindex {
            f.own = table.clone();
        } else {
            f.ports.insert(*i, table.clone());
        }
    }
    f
}

/// What sysfs says a configured interface is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BridgeKind {
    /// Not a bridge (or missing).
    #[default]
    NotBridge,
    /// A bridge: the program runs on its ports.
    Bridge,
}

/// A configured interface (or a bridge under a configured VLAN device) as read before the
/// state lock is taken: what it is, and for a bridge its MAC address, ports and VLAN
/// filtering.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BridgeRead {
    pub kind: BridgeKind,
    /// Its link kind (see [`super::xdp_xmit::link_kind`]).
    pub link_kind: Option<String>,
    pub mac: Option<[u8; 6]>,
    pub ports: Vec<PortInfo>,
    /// For a bridge with `vlan_filtering 1`: its protocol and VLAN tables (`None`: it does
    /// not filter by VLAN).
    pub filtering: Option<VlanFiltering>,
    /// For a VLAN device: its VLAN and parent (see [`super::vlan`]).
    pub vlan: Option<super::vlan::VlanRead>,
}

/// [`BridgeRead`]s by interface name.
pub type BridgeReads = BTreeMap<String, BridgeRead>;

/// Reads what every interface in `names` is (sysfs, `SIOCGIFHWADDR` for a bridge's MAC,
/// `RTM_GETLINK` for a VLAN device), and the same for the bridges under VLAN devices among
/// them that are not in `names` (by their own names); the VLAN tables of the VLAN-filtering
/// bridges come from one [`vlan_dump`] (when it fails: logged, and read as empty, so the fast
/// path leaves their frames to the kernel until the next read).
/// What the state needs from sysfs comes from here, so it never reads sysfs under its lock.
/// Blocking but short: a few sysfs files per interface, one dump when a bridge filters.
pub fn read(names: &[String]) -> BridgeReads {
    let mut reads: BridgeReads = names.iter().map(|n| (n.clone(), read_one(n))).collect();
    let parents: Vec<String> = reads
        .values()
        .filter_map(|r| r.vlan.as_ref())
        .filter(|v| v.parent_kind.as_deref() == Some("bridge"))
        .map(|v| v.parent_name.clone())
        .collect();
    for p in parents {
        if let std::collections::btree_map::Entry::Vacant(e) = reads.entry(p) {
            let read = read_one(e.key());
            e.insert(read);
        }
    }
    if reads.values().any(|r| r.filtering.is_some()) {
        let mut tables = vlan_dump()
            .inspect_err(|e| error!(error = %e, "cannot read the bridges' VLAN tables (AF_BRIDGE RTM_GETLINK): their frames stay in the kernel until they are read"))
            .unwrap_or_default();
        match vlans_not_forwarding() {
            Ok(blocked) => {
                for (name, vids) in blocked {
                    if let Some(ifindex) = super::netdev::ifindex(&name)
                        && let Some((_, table)) = tables.get_mut(&ifindex)
                    {
                        table.retain(|vid, _| !vids.contains(vid));
                    }
                }
            }
            Err(e) => {
                error!(error = %e, "cannot read the bridges' per-VLAN STP states (`bridge -d -j vlan show`): their frames stay in the kernel until they are read");
                tables.clear();
            }
        }
        for (name, r) in &mut reads {
            if let (Some(f), Some(ifindex)) = (&mut r.filtering, super::netdev::ifindex(name))
                && f.tpid != 0
            {
                *f = filtering_of(ifindex, f.tpid, &tables);
            }
        }
    }
    reads
}

/// [`read`] for one interface, without the VLAN tables.
fn read_one(name: &str) -> BridgeRead {
    let link_kind = super::xdp_xmit::link_kind(name);
    if !is_bridge(name) {
        let vlan = if link_kind.as_deref() == Some("vlan") {
            super::vlan::read_with_parent(name)
        } else {
            None
        };
        return BridgeRead {
            link_kind,
            vlan,
            ..BridgeRead::default()
        };
    }
    let filtering = vlan_filtering(name).then(|| VlanFiltering {
        tpid: vlan_protocol(name).unwrap_or_else(|| {
            error!(
                interface = name,
                "{name}: cannot read its vlan_protocol: its frames stay in the kernel"
            );
            0
        }),
        ..VlanFiltering::default()
    });
    BridgeRead {
        kind: BridgeKind::Bridge,
        link_kind,
        mac: super::netdev::hw_addr(name),
        ports: ports(name),
        filtering,
        vlan: None,
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_route::link::BridgeVlanInfo;

    use super::*;

    fn fdb(
        family: AddressFamily,
        flags: NeighbourFlags,
        port: u32,
        vlan: Option<u16>,
    ) -> NeighbourMessage {
        let mut m = NeighbourMessage::default();
        m.header.family = family;
        m.header.ifindex = port;
        m.header.flags = flags;
        m.header.state = NeighbourState::Reachable;
        m.attributes
            .push(NeighbourAttribute::LinkLayerAddress(vec![2, 0, 0, 0, 0, 7]));
        m.attributes.push(NeighbourAttribute::Controller(5));
        if let Some(v) = vlan {
            m.attributes.push(NeighbourAttribute::Vlan(v));
        }
        m
    }

    #[test]
    fn bridge_fdb_entries_become_events() {
        let mac = [2, 0, 0, 0, 0, 7];
        // As `bridge fdb` shows the bridge's entries on Linux 6.18: no flags, NDA_MASTER.
        let learned = fdb(AddressFamily::Bridge, NeighbourFlags::empty(), 9, None);
        assert_eq!(
            fdb_event(&learned, true),
            Some(FdbEvent::Learned {
                bridge: 5,
                mac,
                vid: 0,
                port: 9
            })
        );
        assert_eq!(
            fdb_event(&learned, false),
            Some(FdbEvent::Forgotten {
                bridge: 5,
                mac,
                vid: 0
            })
        );
        // The port's own address (local, permanent) is delivered to the host: not a target.
        let mut local = learned.clone();
        local.header.state = NeighbourState::Permanent;
        assert_eq!(
            fdb_event(&local, true),
            Some(FdbEvent::Forgotten {
                bridge: 5,
                mac,
                vid: 0
            })
        );
        // A VLAN-filtering bridge's entries are in a VLAN (NDA_VLAN), each on its own.
        let vlan = fdb(AddressFamily::Bridge, NeighbourFlags::empty(), 9, Some(10));
        assert_eq!(
            fdb_event(&vlan, true),
            Some(FdbEvent::Learned {
                bridge: 5,
                mac,
                vid: 10,
                port: 9
            })
        );
        assert_eq!(
            fdb_event(&vlan, false),
            Some(FdbEvent::Forgotten {
                bridge: 5,
                mac,
                vid: 10
            })
        );
        // Device-level (NTF_SELF) entries and other families are not the bridge's FDB.
        let own = fdb(AddressFamily::Bridge, NeighbourFlags::Own, 9, None);
        assert_eq!(fdb_event(&own, true), None);
        let arp = fdb(AddressFamily::Inet, NeighbourFlags::empty(), 9, None);
        assert_eq!(fdb_event(&arp, true), None);
    }

    /// An `AF_BRIDGE` link message as the kernel's `br_fill_ifinfo` builds it.
    fn bridge_link(ifindex: u32, master: Option<u32>, vlans: &[(u16, u16)]) -> LinkMessage {
        let mut m = LinkMessage::default();
        m.header.interface_family = AddressFamily::Bridge;
        m.header.index = ifindex;
        m.attributes
            .push(LinkAttribute::IfName(format!("dev{ifindex}")));
        if let Some(b) = master {
            m.attributes.push(LinkAttribute::Controller(b));
        }
        m.attributes.push(LinkAttribute::AfSpecBridge(
            vlans
                .iter()
                .map(|&(flags, vid)| {
                    AfSpecBridge::VlanInfo(BridgeVlanInfo {
                        flags: BridgeVlanInfoFlags::from_bits_retain(flags),
                        vid,
                    })
                })
                .collect(),
        ));
        m
    }

    const PVID: u16 = 1 << 1;
    const UNTAGGED: u16 = 1 << 2;
    const RANGE_BEGIN: u16 = 1 << 3;
    const RANGE_END: u16 = 1 << 4;

    fn member(pvid: bool, untagged: bool) -> VlanMember {
        VlanMember { pvid, untagged }
    }

    #[test]
    fn a_bridge_ports_vlan_table_is_read_from_its_af_spec() {
        // `bridge vlan add dev p1 vid 1 pvid untagged; ... vid 20`, as dumped with
        // RTEXT_FILTER_BRVLAN: one entry per VLAN.
        let m = crate::sync::link_over_the_wire(bridge_link(
            10,
            Some(4),
            &[(PVID | UNTAGGED, 1), (0, 20)],
        ));
        let (ifindex, bridge, table) = vlan_table_of(&m).unwrap();
        assert_eq!((ifindex, bridge), (10, 4));
        assert_eq!(
            table,
            VlanTable::from([(1, member(true, true)), (20, member(false, false))])
        );
        assert_eq!(pvid(&table), Some(1));
        // The bridge's own entry names itself as master.
        let own = crate::sync::link_over_the_wire(bridge_link(4, Some(4), &[(UNTAGGED, 1)]));
        let (ifindex, bridge, table) = vlan_table_of(&own).unwrap();
        assert_eq!((ifindex, bridge), (4, 4));
        assert_eq!(pvid(&table), None);
    }

    #[test]
    fn compressed_ranges_are_expanded_and_bad_entries_left_out() {
        // As notifications carry them (RTEXT_FILTER_BRVLAN_COMPRESSED): 2-5 tagged.
        let m = crate::sync::link_over_the_wire(bridge_link(
            10,
            Some(4),
            &[
                (PVID | UNTAGGED, 1),
                (RANGE_BEGIN, 2),
                (RANGE_END, 5),
                // An end without a beginning, and IDs that are no VLAN: ignored.
                (RANGE_END, 9),
                (0, 0),
                (0, 4095),
            ],
        ));
        let table = vlan_table_of(&m).unwrap().2;
        assert_eq!(table.keys().copied().collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
        assert_eq!(table[&3], member(false, false));
        // A range reaching past 4094 keeps only the valid IDs.
        let m = bridge_link(10, Some(4), &[(RANGE_BEGIN, 4093), (RANGE_END, 4095)]);
        assert_eq!(
            vlan_table_of(&m)
                .unwrap()
                .2
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            [4093, 4094]
        );
    }

    #[test]
    fn links_in_no_bridge_or_of_other_families_have_no_vlan_table() {
        assert_eq!(vlan_table_of(&bridge_link(10, None, &[(0, 1)])), None);
        assert_eq!(vlan_table_of(&bridge_link(10, Some(0), &[(0, 1)])), None);
        let mut inet = bridge_link(10, Some(4), &[(0, 1)]);
        inet.header.interface_family = AddressFamily::Unspec;
        assert_eq!(vlan_table_of(&inet), None);
        // A port without VLANs: an empty table.
        assert_eq!(
            vlan_table_of(&bridge_link(10, Some(4), &[])),
            Some((10, 4, VlanTable::new()))
        );
    }

    #[test]
    fn a_dump_is_split_by_bridge() {
        let t = |vid| VlanTable::from([(vid, member(true, true))]);
        let dump = BTreeMap::from([
            (4, (4, t(1))),
            (10, (4, t(1))),
            (11, (4, t(20))),
            // Another bridge and its port.
            (5, (5, t(7))),
            (12, (5, t(7))),
        ]);
        let f = filtering_of(4, 0x88a8, &dump);
        assert_eq!(f.tpid, 0x88a8);
        assert_eq!(f.own, t(1));
        assert_eq!(f.ports, BTreeMap::from([(10, t(1)), (11, t(20))]));
    }

    #[test]
    fn vlans_whose_stp_state_is_not_forwarding_are_found() {
        // As `bridge -d -j vlan show` (iproute2 6.1) prints it on Debian's 6.12 kernel, with
        // `bridge vlan set dev d0 vid 20 state blocking`.
        let json = br#"[{"ifname":"br0","vlans":[{"vlan":1,"flags":["PVID","Egress Untagged"],"state":"forwarding","mcast_router":1}]},{"ifname":"d0","vlans":[{"vlan":1,"flags":["PVID","Egress Untagged"],"state":"forwarding","mcast_router":1},{"vlan":20,"state":"blocking","mcast_router":1}]},{"ifname":"d1","vlans":[{"vlan":1,"flags":["PVID","Egress Untagged"],"state":"forwarding","mcast_router":1},{"vlan":100,"vlanEnd":102,"state":"learning","mcast_router":1}]}]"#;
        let found = not_forwarding_in(json).unwrap();
        assert_eq!(
            found,
            BTreeMap::from([
                ("d0".to_string(), BTreeSet::from([20])),
                ("d1".to_string(), BTreeSet::from([100, 101, 102])),
            ])
        );
        // No state printed (older iproute2 or kernel): forwarding; nothing at all: no VLANs.
        let plain = br#"[{"ifname":"d0","vlans":[{"vlan":20}]}]"#;
        assert!(not_forwarding_in(plain).unwrap().is_empty());
        assert!(not_forwarding_in(b"\n").unwrap().is_empty());
        assert!(not_forwarding_in(b"[{").is_err());
    }

    #[test]
    fn vlan_protocol_as_sysfs_shows_it() {
        assert_eq!(parse_tpid("0x8100\n"), Some(0x8100));
        assert_eq!(parse_tpid("0x88a8"), Some(0x88a8));
        assert_eq!(parse_tpid("0x9100"), None);
        assert_eq!(parse_tpid("8100"), None);
        assert_eq!(parse_tpid(""), None);
    }
}
