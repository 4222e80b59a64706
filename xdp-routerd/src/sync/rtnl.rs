//! Links, addresses and routes over rtnetlink.
//!
//! The datapath itself asks the live kernel FIB (`bpf_fib_lookup`) and neighbour table for every
//! packet, so routes and neighbours are not copied into maps. What the daemon needs from
//! rtnetlink is (1) route queries (`ip route get`, see [`super::routes`]) to decide whether a
//! connection's endpoints sit behind managed interfaces, and (2) change notifications: a link that appears or disappears,
//! or an address or route change that may invalidate an offloaded flow's NAT or path.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    link::LinkAttribute,
    route::{RouteAddress, RouteAttribute, RouteMessage},
};
use netlink_sys::{Socket, protocols::NETLINK_ROUTE};
use tokio::sync::mpsc;

use super::nlsocket::notification_socket;
use crate::paths::prefix::Prefix;

/// A change the daemon reacts to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RtEvent {
    /// A link exists (new or changed), with its MAC address when it has a 6-byte one.
    LinkUp {
        ifindex: u32,
        name: String,
        mac: Option<[u8; 6]>,
    },
    /// A link was deleted.
    LinkGone { ifindex: u32, name: String },
    /// An address was added or removed (or a route of another family): every offloaded flow
    /// must be revalidated.
    PathsChanged,
    /// An IPv4 or IPv6 route to this destination was added, replaced or removed: the route
    /// answers for addresses inside it may change, no others (longest-prefix match).
    RouteChanged(Prefix),
    /// A qdisc of this interface was added, replaced or deleted: re-read its egress qdiscs
    /// (`shaped = "auto"`, see [`crate::sync::qdisc`]).
    QdiscChanged { ifindex: u32 },
    /// A neighbour, policy rule or forwarding setting changed (or a notification could not be
    /// parsed): only cached FIB answers are affected.
    FibChanged,
    /// A bridge VLAN's options changed (`RTM_NEWVLAN` / `RTM_DELVLAN` on `RTNLGRP_BRVLAN`: a
    /// per-VLAN STP state set with `bridge vlan set … state`): the bridges are read again.
    BridgeVlan,
    /// A bridge FDB entry was learned, moved or forgotten (`AF_BRIDGE` neighbour messages).
    Fdb(super::bridge::FdbEvent),
    /// Notifications were lost (socket overrun): re-read everything.
    Overrun,
}

/// The destination of an IPv4 or IPv6 route message (no `RTA_DST`: the default route);
/// `None` for other families.
fn prefix_of_route(r: &RouteMessage) -> Option<Prefix> {
    let dst = r.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(a)) => Some(IpAddr::V4(*a)),
        RouteAttribute::Destination(RouteAddress::Inet6(a)) => Some(IpAddr::V6(*a)),
        _ => None,
    });
    let addr = match (r.header.address_family, dst) {
        (AddressFamily::Inet, Some(a @ IpAddr::V4(_)))
        | (AddressFamily::Inet6, Some(a @ IpAddr::V6(_))) => a,
        (AddressFamily::Inet, None) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        (AddressFamily::Inet6, None) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        _ => return None,
    };
    Prefix::new(addr, r.header.destination_prefix_length)
}

/// Turns one rtnetlink notification into a domain event (pure; unit-tested).
pub fn translate(msg: &RouteNetlinkMessage) -> Option<RtEvent> {
    let link_name = |attrs: &[LinkAttribute]| {
        attrs.iter().find_map(|a| match a {
            LinkAttribute::IfName(n) => Some(n.clone()),
            _ => None,
        })
    };
    match msg {
        RouteNetlinkMessage::NewLink(l) => Some(RtEvent::LinkUp {
            ifindex: l.header.index,
            name: link_name(&l.attributes)?,
            mac: l.attributes.iter().find_map(|a| match a {
                LinkAttribute::Address(m) => <[u8; 6]>::try_from(m.as_slice()).ok(),
                _ => None,
            }),
        }),
        RouteNetlinkMessage::DelLink(l) => Some(RtEvent::LinkGone {
            ifindex: l.header.index,
            name: link_name(&l.attributes)?,
        }),
        RouteNetlinkMessage::NewRoute(r) | RouteNetlinkMessage::DelRoute(r) => {
            Some(prefix_of_route(r).map_or(RtEvent::PathsChanged, RtEvent::RouteChanged))
        }
        RouteNetlinkMessage::NewAddress(_) | RouteNetlinkMessage::DelAddress(_) => {
            Some(RtEvent::PathsChanged)
        }
        // Bridge FDB entries (AF_BRIDGE) do not change FIB answers.
        RouteNetlinkMessage::NewNeighbour(n)
            if n.header.family == netlink_packet_route::AddressFamily::Bridge =>
        {
            super::bridge::fdb_event(n, true).map(RtEvent::Fdb)
        }
        RouteNetlinkMessage::DelNeighbour(n)
            if n.header.family == netlink_packet_route::AddressFamily::Bridge =>
        {
            super::bridge::fdb_event(n, false).map(RtEvent::Fdb)
        }
        RouteNetlinkMessage::NewNeighbour(_)
        | RouteNetlinkMessage::DelNeighbour(_)
        | RouteNetlinkMessage::NewRule(_)
        | RouteNetlinkMessage::DelRule(_) => Some(RtEvent::FibChanged),
        // A tc filter added or removed: re-read the interface's qdiscs and hooks.
        RouteNetlinkMessage::NewTrafficFilter(q)
        | RouteNetlinkMessage::DelTrafficFilter(q)
        | RouteNetlinkMessage::NewQueueDiscipline(q)
        | RouteNetlinkMessage::DelQueueDiscipline(q) => Some(RtEvent::QdiscChanged {
            ifindex: u32::try_from(q.header.index).ok()?,
        }),
        _ => None,
    }
}

/// The events in one datagram of notifications (pure; unit-tested). A message the crate cannot
/// parse (e.g. RTM_NEWNETCONF, a forwarding sysctl change) still drops cached FIB answers.
pub fn events_in(data: &[u8]) -> Vec<RtEvent> {
    super::datagram::messages(data)
        .map_while(Result::ok)
        .filter_map(|msg| {
            // nlmsg_type, after nlmsg_len: RTM_NEWVLAN / RTM_DELVLAN, which netlink-packet-route
            // does not parse.
            let kind = u16::from_ne_bytes([msg[4], msg[5]]);
            if kind == RTM_NEWVLAN || kind == RTM_DELVLAN {
                return Some(RtEvent::BridgeVlan);
            }
            match NetlinkMessage::<RouteNetlinkMessage>::deserialize(msg) {
                Ok(msg) => match &msg.payload {
                    NetlinkPayload::InnerMessage(inner) => translate(inner),
                    _ => None,
                },
                Err(_) => Some(RtEvent::FibChanged),
            }
        })
        .collect()
}

/// `RTM_NEWVLAN`, `RTM_DELVLAN` (`uapi/linux/rtnetlink.h`).
const RTM_NEWVLAN: u16 = 112;
const RTM_DELVLAN: u16 = 113;
/// `RTNLGRP_BRVLAN`: bridge VLAN notifications (a group above 32: joined, not bound).
const RTNLGRP_BRVLAN: u32 = 33;

const RTMGRP_LINK: u32 = 0x1;
const RTMGRP_TC: u32 = 0x8;
const RTMGRP_IPV4_IFADDR: u32 = 0x10;
const RTMGRP_IPV4_ROUTE: u32 = 0x40;
const RTMGRP_IPV6_IFADDR: u32 = 0x100;
const RTMGRP_IPV6_ROUTE: u32 = 0x400;
// RTNLGRP_NEIGH (3), RTNLGRP_IPV4_RULE (8), RTNLGRP_IPV6_RULE (19), RTNLGRP_IPV4_NETCONF (24),
// RTNLGRP_IPV6_NETCONF (25): group n is bit n - 1 of the bind mask.
const RTMGRP_NEIGH: u32 = 1 << (3 - 1);
const RTMGRP_IPV4_RULE: u32 = 1 << (8 - 1);
const RTMGRP_IPV6_RULE: u32 = 1 << (19 - 1);
const RTMGRP_IPV4_NETCONF: u32 = 1 << (24 - 1);
const RTMGRP_IPV6_NETCONF: u32 = 1 << (25 - 1);

/// Subscribes to link, address, route, qdisc, neighbour, rule and netconf notifications. A thread
/// reads the socket (in
/// the caller's network namespace) and sends [`RtEvent`]s; the receiver closes if the socket
/// fails.
pub fn subscribe() -> io::Result<mpsc::UnboundedReceiver<RtEvent>> {
    let sock = notification_socket(
        NETLINK_ROUTE,
        RTMGRP_LINK
            | RTMGRP_TC
            | RTMGRP_IPV4_IFADDR
            | RTMGRP_IPV4_ROUTE
            | RTMGRP_IPV6_IFADDR
            | RTMGRP_IPV6_ROUTE
            | RTMGRP_NEIGH
            | RTMGRP_IPV4_RULE
            | RTMGRP_IPV6_RULE
            | RTMGRP_IPV4_NETCONF
            | RTMGRP_IPV6_NETCONF,
        4 << 20,
    )?;
    // Per-VLAN STP states of VLAN-filtering bridges: a kernel without bridge VLAN filtering
    // has nothing to send here, and refuses nothing either.
    sock.add_membership(RTNLGRP_BRVLAN)?;
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("rtnl-events".into())
        .spawn(move || {
            loop {
                let data = match sock.recv_from_full() {
                    Ok((data, _)) => data,
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                        discard_queued(&sock);
                        if tx.send(RtEvent::Overrun).is_err() {
                            return;
                        }
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        tracing::error!(error = %e, "rtnetlink event socket failed");
                        return;
                    }
                };
                for ev in events_in(&data) {
                    if tx.send(ev).is_err() {
                        return;
                    }
                }
            }
        })?;
    Ok(rx)
}

/// At an overrun, throws away every notification still queued on `sock`. The kernel reports
/// ENOBUFS ahead of them, but they are older than the ones it dropped: applied after the
/// overrun's re-read (links, MACs, bridge ports and FDB, qdiscs), they would bring back what
/// the lost notifications had superseded, e.g. a bridge FDB entry for a MAC that has moved
/// to another port since, or a link's old ifindex. Also clears the socket's congestion
/// (`NETLINK_S_CONGESTED`), without which the kernel keeps dropping notifications for it
/// until the queue has drained. Returns how many datagrams were discarded.
fn discard_queued(sock: &Socket) -> usize {
    let mut discarded = 0;
    // MSG_TRUNC: each datagram is dequeued whole whatever the buffer's size. Bounded: a queue
    // refilled as fast as it drains must not hold the reader forever.
    let mut byte = Vec::with_capacity(1);
    for _ in 0..1_000_000 {
        byte.clear();
        match sock.recv(&mut byte, libc::MSG_DONTWAIT | libc::MSG_TRUNC) {
            Ok(_) => discarded += 1,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            // Another overrun report (or an interrupted call): keep draining.
            Err(_) => {}
        }
    }
    discarded
}

#[cfg(test)]
mod tests {
    use netlink_packet_route::{link::LinkMessage, route::RouteMessage};

    use super::*;
    use crate::sync::nlsocket::request_socket;

    #[test]
    fn link_messages_become_link_events() {
        let mut l = LinkMessage::default();
        l.header.index = 7;
        l.attributes.push(LinkAttribute::IfName("eth1".into()));
        assert_eq!(
            translate(&RouteNetlinkMessage::NewLink(l.clone())),
            Some(RtEvent::LinkUp {
                ifindex: 7,
                name: "eth1".into(),
                mac: None,
            })
        );
        let mut with_mac = l.clone();
        with_mac
            .attributes
            .push(LinkAttribute::Address(vec![2, 0, 0, 0, 1, 1]));
        assert_eq!(
            translate(&RouteNetlinkMessage::NewLink(with_mac)),
            Some(RtEvent::LinkUp {
                ifindex: 7,
                name: "eth1".into(),
                mac: Some([2, 0, 0, 0, 1, 1]),
            })
        );
        assert_eq!(
            translate(&RouteNetlinkMessage::DelLink(l)),
            Some(RtEvent::LinkGone {
                ifindex: 7,
                name: "eth1".into()
            })
        );
    }

    #[test]
    fn a_bridge_vlan_state_change_rereads_the_bridges() {
        // `bridge vlan set dev p1 vid 20 state blocking`: RTM_NEWVLAN on RTNLGRP_BRVLAN, a
        // br_vlan_msg (family, ifindex) and its entry, which netlink-packet-route cannot parse.
        let mut msg = Vec::new();
        msg.extend_from_slice(&24u32.to_ne_bytes());
        msg.extend_from_slice(&112u16.to_ne_bytes());
        msg.extend_from_slice(&[0; 10]);
        msg.extend_from_slice(&[7, 0, 0, 0]);
        msg.extend_from_slice(&10u32.to_ne_bytes());
        assert_eq!(events_in(&msg), [RtEvent::BridgeVlan]);
        msg[4..6].copy_from_slice(&113u16.to_ne_bytes());
        assert_eq!(events_in(&msg), [RtEvent::BridgeVlan]);
    }

    #[test]
    fn bridge_vlan_changes_come_as_link_events() {
        // `bridge vlan add dev p1 vid 20`: RTM_NEWLINK, AF_BRIDGE, for the port (IFLA_MASTER,
        // IFLA_AF_SPEC with the port's VLANs), as parsed from the wire: a link event, so the
        // bridges and their VLANs are read again.
        use netlink_packet_route::link::{AfSpecBridge, BridgeVlanInfo, BridgeVlanInfoFlags};
        let mut l = LinkMessage::default();
        l.header.interface_family = AddressFamily::Bridge;
        l.header.index = 10;
        l.attributes.push(LinkAttribute::IfName("p1".into()));
        l.attributes.push(LinkAttribute::Controller(4));
        l.attributes
            .push(LinkAttribute::AfSpecBridge(vec![AfSpecBridge::VlanInfo(
                BridgeVlanInfo {
                    flags: BridgeVlanInfoFlags::Pvid | BridgeVlanInfoFlags::Untagged,
                    vid: 20,
                },
            )]));
        let mut msg = NetlinkMessage::new(
            netlink_packet_core::NetlinkHeader::default(),
            NetlinkPayload::from(RouteNetlinkMessage::NewLink(l)),
        );
        msg.finalize();
        let mut buf = vec![0; msg.buffer_len()];
        msg.serialize(&mut buf);
        assert_eq!(
            events_in(&buf),
            [RtEvent::LinkUp {
                ifindex: 10,
                name: "p1".into(),
                mac: None
            }]
        );
    }

    #[test]
    fn route_and_address_changes_invalidate_paths() {
        // A route of an unknown family: everything.
        assert_eq!(
            translate(&RouteNetlinkMessage::DelRoute(RouteMessage::default())),
            Some(RtEvent::PathsChanged)
        );
        let route = |family, dst: Option<IpAddr>, len| {
            let mut r = RouteMessage::default();
            r.header.address_family = family;
            r.header.destination_prefix_length = len;
            r.attributes
                .extend(dst.map(|d| RouteAttribute::Destination(RouteAddress::from(d))));
            r
        };
        let prefix = |a: &str, len| Prefix::new(a.parse().unwrap(), len).unwrap();
        assert_eq!(
            translate(&RouteNetlinkMessage::NewRoute(route(
                AddressFamily::Inet,
                Some("172.16.3.7".parse().unwrap()),
                24
            ))),
            Some(RtEvent::RouteChanged(prefix("172.16.3.0", 24)))
        );
        assert_eq!(
            translate(&RouteNetlinkMessage::DelRoute(route(
                AddressFamily::Inet6,
                Some("2001:db8::1".parse().unwrap()),
                128
            ))),
            Some(RtEvent::RouteChanged(prefix("2001:db8::1", 128)))
        );
        // The default route: no RTA_DST.
        assert_eq!(
            translate(&RouteNetlinkMessage::DelRoute(route(
                AddressFamily::Inet,
                None,
                0
            ))),
            Some(RtEvent::RouteChanged(prefix("0.0.0.0", 0)))
        );
        // A prefix longer than the address cannot be judged: everything.
        assert_eq!(
            translate(&RouteNetlinkMessage::NewRoute(route(
                AddressFamily::Inet,
                Some("10.0.0.1".parse().unwrap()),
                33
            ))),
            Some(RtEvent::PathsChanged)
        );
        assert_eq!(
            translate(&RouteNetlinkMessage::NewAddress(Default::default())),
            Some(RtEvent::PathsChanged)
        );
    }

    #[test]
    fn neighbour_and_rule_changes_only_touch_the_fib_cache() {
        for msg in [
            RouteNetlinkMessage::NewNeighbour(Default::default()),
            RouteNetlinkMessage::DelNeighbour(Default::default()),
            RouteNetlinkMessage::NewRule(Default::default()),
            RouteNetlinkMessage::DelRule(Default::default()),
        ] {
            assert_eq!(translate(&msg), Some(RtEvent::FibChanged), "{msg:?}");
        }
    }

    /// RTM_NEWNETCONF (type 80) as `sysctl net.ipv4.conf.a0.forwarding=0` sends it: family
    /// AF_INET, NETCONFA_IFINDEX 7, NETCONFA_FORWARDING 0.
    const NETCONF_NOTIFICATION: &str = concat!(
        "2c000000500000000000000000000000", // nlmsghdr: len 44, type 80
        "02000000",                         // struct netconfmsg: AF_INET + padding
        "0800010007000000",                 // NETCONFA_IFINDEX 7
        "0800020000000000",                 // NETCONFA_FORWARDING 0
        "0800040000000000",                 // NETCONFA_MC_FORWARDING 0 (padding to 44)
    );

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn a_datagram_yields_every_event_including_unparsed_ones() {
        let mut link = LinkMessage::default();
        link.header.index = 7;
        link.attributes.push(LinkAttribute::IfName("a0".into()));
        let mut msg = NetlinkMessage::from(RouteNetlinkMessage::NewLink(link));
        msg.finalize();
        let mut data = vec![0; msg.buffer_len()];
        msg.serialize(&mut data);
        data.resize(data.len().next_multiple_of(4), 0);
        data.extend(hex(NETCONF_NOTIFICATION));
        assert_eq!(
            events_in(&data),
            vec![
                RtEvent::LinkUp {
                    ifindex: 7,
                    name: "a0".into(),
                    mac: None,
                },
                RtEvent::FibChanged
            ]
        );
        // A truncated message ends the datagram without a panic.
        assert_eq!(events_in(&data[..20]), vec![]);
    }

    /// RTM_DELQDISC notification of `tc qdisc del dev a0 root` (the htb).
    const A0_DEL_HTB_NOTIFICATION: &str = concat!(
        "b4000000250000003f37026bb4440000000000000300000000000100ffffffff010000000800010068746200",
        "2400020018000200110003000a00000010000000000000000100000008000500e803000005000c0000000000",
        "30000700140001005a0000000000000001000000000000001800030000000000000000000000000000000000",
        "000000002c0003005a0000000000000001000000000000000000000000000000000000000000000000000000",
        "00000000",
    );

    #[test]
    fn qdisc_notifications_name_their_interface() {
        let raw: Vec<u8> = (0..A0_DEL_HTB_NOTIFICATION.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&A0_DEL_HTB_NOTIFICATION[i..i + 2], 16).unwrap())
            .collect();
        let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&raw).unwrap();
        let NetlinkPayload::InnerMessage(inner) = msg.payload else {
            panic!("not an rtnetlink message");
        };
        assert!(matches!(inner, RouteNetlinkMessage::DelQueueDiscipline(_)));
        assert_eq!(
            translate(&inner),
            Some(RtEvent::QdiscChanged { ifindex: 3 })
        );
        let RouteNetlinkMessage::DelQueueDiscipline(q) = inner else {
            unreachable!()
        };
        assert_eq!(
            translate(&RouteNetlinkMessage::NewQueueDiscipline(q.clone())),
            Some(RtEvent::QdiscChanged { ifindex: 3 })
        );
        // Classes and filters change no qdisc kind.
        assert_eq!(translate(&RouteNetlinkMessage::NewTrafficClass(q)), None);
    }

    #[test]
    fn an_overrun_discards_every_queued_datagram() {
        // A link dump stands in for queued notifications (no privileges needed): its replies
        // wait on the socket, a part per read, like notifications after an overrun.
        let sock = request_socket(NETLINK_ROUTE).expect("rtnetlink socket");
        let mut header = netlink_packet_core::NetlinkHeader::default();
        header.flags = netlink_packet_core::NLM_F_REQUEST | netlink_packet_core::NLM_F_DUMP;
        let mut req = NetlinkMessage::new(
            header,
            NetlinkPayload::from(RouteNetlinkMessage::GetLink(LinkMessage::default())),
        );
        req.finalize();
        let mut buf = vec![0; req.buffer_len()];
        req.serialize(&mut buf);
        sock.send(&buf, 0).expect("send the dump request");
        assert!(discard_queued(&sock) >= 1, "the dump's replies were queued");
        let mut rest = Vec::with_capacity(64 << 10);
        let after = sock.recv(&mut rest, libc::MSG_DONTWAIT);
        assert!(
            matches!(&after, Err(e) if e.kind() == io::ErrorKind::WouldBlock),
            "nothing left to read: {after:?}"
        );
    }
}
