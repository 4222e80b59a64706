//! Keeping the datapath maps in step with the kernel.
pub mod bridge;
pub mod conntrack;
pub mod ctnetlink;
pub mod hooks;
pub mod nftables;
pub mod nlsocket;
pub mod ppp_compression;
pub mod pppoe;
pub mod qdisc;
pub mod routes;
pub mod rtnl;
pub mod vlan;
pub mod xdp_xmit;

/// The whole messages (header included) of one netlink datagram, in order; stops at the first
/// message whose length field does not fit (a truncated or corrupt datagram). Pure.
pub fn netlink_messages(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut offset = 0;
    std::iter::from_fn(move || {
        let rest = data.get(offset..).filter(|r| r.len() >= 16)?;
        // nlmsg_len, the first 4 bytes of every message.
        let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if len < 16 || len > rest.len() {
            return None;
        }
        // Messages are 4-byte aligned (NLMSG_ALIGN).
        offset += (len + 3) & !3;
        Some(&rest[..len])
    })
}

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
