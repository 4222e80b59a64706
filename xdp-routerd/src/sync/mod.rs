//! The kernel-facing side: reading the kernel (netlink dumps, notifications and requests,
//! sysfs, `/proc`) and decoding what it says into values the deciding side owns (conntrack
//! entries: [`crate::flows::conntrack`]; route prefixes and answers: [`crate::paths`]) or
//! into this folder's read types, which [`crate::state`] applies. Nothing here decides or
//! writes a datapath map, and [`crate::flows`] and [`crate::paths`] import nothing from here.
//!
//! Shared by every reader: [`nlsocket`] (opening netlink sockets), [`datagram`] (splitting a
//! netlink datagram into messages) and [`netdev`] (a device's ifindex, name and MAC).
pub mod bridge;
pub mod conntrack;
mod ct_state;
pub mod ctnetlink;
pub mod datagram;
pub mod dscp_rewrite;
pub mod hooks;
pub mod netdev;
pub mod nftables;
pub mod nlsocket;
pub mod per_packet;
pub mod ppp_compression;
pub mod pppoe;
pub mod qdisc;
pub mod routes;
pub mod rtnl;
mod ruleset_listing;
mod ruleset_walk;
pub mod sysctl;
pub mod vlan;
pub mod xdp_xmit;

/// A link message serialised and parsed back, as the kernel's answer would arrive (tests).
#[cfg(test)]
pub fn link_over_the_wire(
    m: netlink_packet_route::link::LinkMessage,
) -> netlink_packet_route::link::LinkMessage {
    use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};
    use netlink_packet_route::RouteNetlinkMessage;
    let mut msg = NetlinkMessage::new(
        NetlinkHeader::default(),
        NetlinkPayload::from(RouteNetlinkMessage::NewLink(m)),
    );
    msg.finalize();
    let mut buf = vec![0; msg.buffer_len()];
    msg.serialize(&mut buf);
    let back = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf).expect("parse back");
    let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l)) = back.payload else {
        panic!("not a link message");
    };
    l
}
