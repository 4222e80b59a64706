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
//!   own learned/static entries (with `NDA_MASTER`, pointing at a port) count; local entries (the
//!   bridge's and its ports' own addresses) and entries with a VLAN are left out.
//! - A VLAN-filtering bridge is not accelerated (its ports are not managed): the fast path does
//!   not know the VLAN a frame is bridged in.
//!
//! This module reads and parses (sysfs, rtnetlink); the ports are attached and their flags
//! kept by [`crate::state::bridge`], from a [`read`] done before the state lock is taken.

use std::{collections::BTreeMap, io};

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    neighbour::{NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

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

/// A change of a bridge FDB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FdbEvent {
    /// `mac` is behind `port` of `bridge` (learned, moved, or static).
    Learned {
        bridge: u32,
        mac: [u8; 6],
        port: u32,
    },
    /// `mac` is no longer known to `bridge` (aged out, flushed, port removed).
    Forgotten { bridge: u32, mac: [u8; 6] },
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
    for a in &msg.attributes {
        match a {
            NeighbourAttribute::LinkLayerAddress(m) => mac = <[u8; 6]>::try_from(m.as_slice()).ok(),
            NeighbourAttribute::Controller(b) => bridge = Some(*b),
            // VLAN-aware entries: the fast path does not bridge by VLAN.
            NeighbourAttribute::Vlan(_) => return None,
            _ => {}
        }
    }
    let (mac, bridge) = (mac?, bridge?);
    // Local entries (the bridge's own and its ports' addresses) are delivered to the host.
    let local = h.state == NeighbourState::Permanent || h.ifindex == bridge;
    if !new || local {
        return Some(FdbEvent::Forgotten { bridge, mac });
    }
    Some(FdbEvent::Learned {
        bridge,
        mac,
        port: h.ifindex,
    })
}

/// Every bridge FDB entry of the namespace (`bridge fdb show`), as [`FdbEvent::Learned`].
pub fn fdb_dump() -> io::Result<Vec<FdbEvent>> {
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    let mut msg = NeighbourMessage::default();
    msg.header.family = AddressFamily::Bridge;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = 1;
    let mut req = NetlinkMessage::new(
        header,
        NetlinkPayload::from(RouteNetlinkMessage::GetNeighbour(msg)),
    );
    req.finalize();
    let mut buf = vec![0; req.buffer_len()];
    req.serialize(&mut buf);
    sock.send(&buf, 0)?;
    let mut out = Vec::new();
    loop {
        let (data, _) = sock.recv_from_full()?;
        for raw in super::netlink_messages(&data) {
            let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(raw)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok(out),
                NetlinkPayload::Error(e) => {
                    return Err(e.to_io());
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNeighbour(n)) => {
                    if let Some(ev @ FdbEvent::Learned { .. }) = fdb_event(&n, true) {
                        out.push(ev);
                    }
                }
                _ => {}
            }
        }
    }
}

/// What sysfs says a configured interface is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BridgeKind {
    /// Not a bridge (or missing).
    #[default]
    NotBridge,
    /// A bridge: the program runs on its ports.
    Bridge,
    /// A VLAN-filtering bridge: not accelerated as a bridge (the fast path does not know a
    /// frame's VLAN).
    VlanFiltering,
}

/// Whether the interface called `name` is a bridge, and which kind (sysfs).
pub fn probe(name: &str) -> BridgeKind {
    match (is_bridge(name), vlan_filtering(name)) {
        (false, _) => BridgeKind::NotBridge,
        (true, false) => BridgeKind::Bridge,
        (true, true) => BridgeKind::VlanFiltering,
    }
}

/// A configured interface as read before the state lock is taken: what it is, and for a
/// bridge its MAC address and ports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BridgeRead {
    pub kind: BridgeKind,
    /// Its link kind (see [`super::xdp_xmit::link_kind`]).
    pub link_kind: Option<String>,
    pub mac: Option<[u8; 6]>,
    pub ports: Vec<PortInfo>,
    /// For a VLAN device: its VLAN and parent (see [`super::vlan`]).
    pub vlan: Option<super::vlan::VlanRead>,
}

/// [`BridgeRead`]s by interface name.
pub type BridgeReads = BTreeMap<String, BridgeRead>;

/// Reads what every interface in `names` is (sysfs, `SIOCGIFHWADDR` for a bridge's MAC, and
/// `RTM_GETLINK` for a VLAN device).
/// What the state needs from sysfs comes from here, so it never reads sysfs under its lock.
/// Blocking but short: a few sysfs files per interface.
pub fn read(names: &[String]) -> BridgeReads {
    names
        .iter()
        .map(|n| {
            let kind = probe(n);
            let read = match kind {
                BridgeKind::Bridge => BridgeRead {
                    kind,
                    link_kind: super::xdp_xmit::link_kind(n),
                    mac: super::rtnl::hw_addr(n),
                    ports: ports(n),
                    vlan: None,
                },
                _ => {
                    let link_kind = super::xdp_xmit::link_kind(n);
                    let vlan = if link_kind.as_deref() == Some("vlan") {
                        super::vlan::read_with_parent(n)
                    } else {
                        None
                    };
                    BridgeRead {
                        kind,
                        link_kind,
                        vlan,
                        ..BridgeRead::default()
                    }
                }
            };
            (n.clone(), read)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fdb(
        family: AddressFamily,
        flags: NeighbourFlags,
        port: u32,
        vlan: bool,
    ) -> NeighbourMessage {
        let mut m = NeighbourMessage::default();
        m.header.family = family;
        m.header.ifindex = port;
        m.header.flags = flags;
        m.header.state = NeighbourState::Reachable;
        m.attributes
            .push(NeighbourAttribute::LinkLayerAddress(vec![2, 0, 0, 0, 0, 7]));
        m.attributes.push(NeighbourAttribute::Controller(5));
        if vlan {
            m.attributes.push(NeighbourAttribute::Vlan(10));
        }
        m
    }

    #[test]
    fn bridge_fdb_entries_become_events() {
        let mac = [2, 0, 0, 0, 0, 7];
        // As `bridge fdb` shows the bridge's entries on Linux 6.18: no flags, NDA_MASTER.
        let learned = fdb(AddressFamily::Bridge, NeighbourFlags::empty(), 9, false);
        assert_eq!(
            fdb_event(&learned, true),
            Some(FdbEvent::Learned {
                bridge: 5,
                mac,
                port: 9
            })
        );
        assert_eq!(
            fdb_event(&learned, false),
            Some(FdbEvent::Forgotten { bridge: 5, mac })
        );
        // The port's own address (local, permanent) is delivered to the host: not a target.
        let mut local = learned.clone();
        local.header.state = NeighbourState::Permanent;
        assert_eq!(
            fdb_event(&local, true),
            Some(FdbEvent::Forgotten { bridge: 5, mac })
        );
        // Device-level (NTF_SELF) entries, other families and VLAN entries are not the
        // bridge's VLAN-unaware FDB.
        let own = fdb(AddressFamily::Bridge, NeighbourFlags::Own, 9, false);
        assert_eq!(fdb_event(&own, true), None);
        let arp = fdb(AddressFamily::Inet, NeighbourFlags::empty(), 9, false);
        assert_eq!(fdb_event(&arp, true), None);
        let vlan = fdb(AddressFamily::Bridge, NeighbourFlags::empty(), 9, true);
        assert_eq!(fdb_event(&vlan, true), None);
    }
}
