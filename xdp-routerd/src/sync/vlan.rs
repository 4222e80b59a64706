//! 802.1Q / 802.1ad VLAN devices (`eth0.7`): a managed interface that is a VLAN device gets
//! the XDP program on its parent, where frames carrying its tag are routed as the VLAN
//! device's (tag popped), and packets routed out of it are tagged and redirected to the parent.
//!
//! What a VLAN device is comes from rtnetlink (`RTM_GETLINK` for its name): the parent
//! (`IFLA_LINK`), the VLAN ID (`IFLA_VLAN_ID`) and the tag protocol (`IFLA_VLAN_PROTOCOL`)
//! inside `IFLA_LINKINFO` / `IFLA_INFO_DATA`. A VLAN device cannot change parent or ID; one
//! that is deleted and created again is a new device (a link notification), read again by the
//! caller through [`super::bridge::read`].
//!
//! This module reads and parses; [`crate::state`] attaches.

use std::io;

use netlink_packet_core::{NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::{
    RouteNetlinkMessage,
    link::{InfoData, InfoVlan, LinkAttribute, LinkInfo, LinkMessage, VlanProtocol},
};
use netlink_sys::protocols::NETLINK_ROUTE;

/// A VLAN device as the kernel describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VlanLink {
    /// The parent device's ifindex (`IFLA_LINK`).
    pub parent: u32,
    /// VLAN ID, 1..4094.
    pub vid: u16,
    /// Tag protocol (host order): 0x8100 (802.1Q) or 0x88a8 (802.1ad).
    pub tpid: u16,
}

/// A managed VLAN device and its parent, as read before the state lock is taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VlanRead {
    pub link: VlanLink,
    /// The parent's name (what its attachment is logged and shown as).
    pub parent_name: String,
    /// The parent's link kind (see [`super::xdp_xmit::link_kind`]).
    pub parent_kind: Option<String>,
    /// The parent's MAC address.
    pub parent_mac: Option<[u8; 6]>,
}

/// [`read`] plus what the state needs of the parent; `None` when `name` is not a VLAN device
/// (or is gone, or cannot be read: logged).
pub fn read_with_parent(name: &str) -> Option<VlanRead> {
    let link = match read(name) {
        Ok(l) => l?,
        Err(e) => {
            tracing::error!(interface = name, error = %e, "{name}: cannot read the VLAN device (RTM_GETLINK): left to the kernel");
            return None;
        }
    };
    let parent_name = super::netdev::name(link.parent)?;
    Some(VlanRead {
        link,
        parent_kind: super::xdp_xmit::link_kind(&parent_name),
        parent_mac: super::netdev::hw_addr(&parent_name),
        parent_name,
    })
}

/// The VLAN a link message describes, if it is a VLAN device with a parent in the same
/// namespace (`IFLA_LINK_NETNSID` absent). Pure.
pub fn vlan_of(msg: &LinkMessage) -> Option<VlanLink> {
    let mut parent = None;
    let mut other_netns = false;
    let mut vid = None;
    let mut tpid = 0x8100;
    for a in &msg.attributes {
        match a {
            LinkAttribute::Link(p) => parent = Some(*p),
            LinkAttribute::LinkNetNsId(_) => other_netns = true,
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    if let LinkInfo::Data(InfoData::Vlan(data)) = i {
                        for d in data {
                            match d {
                                InfoVlan::Id(v) => vid = Some(*v),
                                InfoVlan::Protocol(VlanProtocol::Ieee8021Ad) => tpid = 0x88a8,
                                InfoVlan::Protocol(_) => tpid = 0x8100,
                                _ => {}
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let vid = vid.filter(|v| (1..4095).contains(v))?;
    let parent = parent.filter(|p| *p != 0 && !other_netns)?;
    Some(VlanLink { parent, vid, tpid })
}

/// Asks the kernel what the interface called `name` is (`RTM_GETLINK`); `None` when it is
/// not a VLAN device (or is gone). Blocking but short: one request on a fresh socket.
pub fn read(name: &str) -> io::Result<Option<VlanLink>> {
    let sock = super::nlsocket::request_socket(NETLINK_ROUTE)?;
    let mut msg = LinkMessage::default();
    msg.attributes.push(LinkAttribute::IfName(name.to_string()));
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    header.sequence_number = 1;
    let mut req = NetlinkMessage::new(
        header,
        NetlinkPayload::from(RouteNetlinkMessage::GetLink(msg)),
    );
    req.finalize();
    let mut buf = vec![0; req.buffer_len()];
    req.serialize(&mut buf);
    sock.send(&buf, 0)?;
    let (data, _) = sock.recv_from_full()?;
    for raw in super::datagram::messages(&data).map_while(Result::ok) {
        let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(raw)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        match msg.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l)) => {
                return Ok(vlan_of(&l));
            }
            // ENODEV: no such interface (any more).
            NetlinkPayload::Error(e) if e.to_io().raw_os_error() == Some(libc::ENODEV) => {
                return Ok(None);
            }
            NetlinkPayload::Error(e) => return Err(e.to_io()),
            _ => {}
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use netlink_packet_route::link::InfoKind;

    use super::*;

    fn vlan_msg(parent: Option<u32>, data: Vec<InfoVlan>) -> LinkMessage {
        let mut m = LinkMessage::default();
        m.header.index = 9;
        m.attributes.push(LinkAttribute::IfName("eth0.7".into()));
        if let Some(p) = parent {
            m.attributes.push(LinkAttribute::Link(p));
        }
        m.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Vlan),
            LinkInfo::Data(InfoData::Vlan(data)),
        ]));
        m
    }

    #[test]
    fn a_vlan_device_names_its_parent_id_and_protocol() {
        let m = vlan_msg(
            Some(3),
            vec![InfoVlan::Id(7), InfoVlan::Protocol(VlanProtocol::Ieee8021Q)],
        );
        assert_eq!(
            vlan_of(&m),
            Some(VlanLink {
                parent: 3,
                vid: 7,
                tpid: 0x8100
            })
        );
        let ad = vlan_msg(
            Some(3),
            vec![
                InfoVlan::Id(4094),
                InfoVlan::Protocol(VlanProtocol::Ieee8021Ad),
            ],
        );
        assert_eq!(vlan_of(&ad).map(|v| (v.vid, v.tpid)), Some((4094, 0x88a8)));
    }

    #[test]
    fn the_message_survives_the_wire() {
        // Serialised and parsed back as the kernel's answer would be.
        let l = crate::sync::link_over_the_wire(vlan_msg(Some(3), vec![InfoVlan::Id(35)]));
        assert_eq!(
            vlan_of(&l),
            Some(VlanLink {
                parent: 3,
                vid: 35,
                tpid: 0x8100
            })
        );
    }

    #[test]
    fn other_links_are_not_vlans() {
        let mut plain = LinkMessage::default();
        plain.attributes.push(LinkAttribute::IfName("eth0".into()));
        assert_eq!(vlan_of(&plain), None);
        // Without a parent, or with a parent in another namespace: not followed.
        assert_eq!(vlan_of(&vlan_msg(None, vec![InfoVlan::Id(7)])), None);
        let mut elsewhere = vlan_msg(Some(3), vec![InfoVlan::Id(7)]);
        elsewhere.attributes.push(LinkAttribute::LinkNetNsId(1));
        assert_eq!(vlan_of(&elsewhere), None);
        // VLAN ID 0 is priority tagging, not a VLAN.
        assert_eq!(vlan_of(&vlan_msg(Some(3), vec![InfoVlan::Id(0)])), None);
    }
}
