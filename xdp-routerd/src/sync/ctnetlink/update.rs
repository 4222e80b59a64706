//! Request encoding: [`CtUpdate`] (a change to one existing conntrack entry) and the
//! ctnetlink request datagrams built from it, with their wire tests.

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterProtoFamily,
    conntrack::{ConntrackAttribute, ConntrackMessage, ProtoInfo, ProtoInfoTCP, TCPFlags},
};

use crate::flows::conntrack::{
    CtEntry, CtTuple, IPPROTO_TCP, TCP_FLAG_BE_LIBERAL, TCP_FLAG_MAXACK_SET,
};
use crate::sync::conntrack::{CTA_ZONE, tuple_attributes};

/// A change to one existing conntrack entry, sent as one `IPCTNL_MSG_CT_NEW` without
/// `NLM_F_CREATE` (the kernel answers ENOENT instead of creating the entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtUpdate {
    /// The entry's original tuple.
    pub orig: CtTuple,
    /// The entry's zone.
    pub zone: u16,
    /// New timeout in seconds (`CTA_TIMEOUT`), if any.
    pub timeout: Option<u32>,
    /// Set `IP_CT_TCP_FLAG_BE_LIBERAL` and clear `IP_CT_TCP_FLAG_MAXACK_SET` on both
    /// directions (TCP only; no other flag is touched).
    ///
    /// Why: once the fast path carries the data, conntrack's TCP window tracking no longer sees
    /// the sequence numbers and ACKs. The closing FIN would look out of window, become INVALID
    /// and be dropped by a FORWARD chain that accepts only ESTABLISHED (hence "be liberal");
    /// and an RST would be checked against a stale `td_maxack` of the other direction, found
    /// not to match exactly and ignored ("keep established state to allow a possible challenge
    /// ACK"), leaving the entry ESTABLISHED for days (hence clearing MAXACK_SET, which skips
    /// that check until conntrack sees an ACK again). nf_flowtable does the same in
    /// `flow_offload_fixup_tcp()`. Conntrack sets MAXACK_SET again on the next ACK it sees, so
    /// the keep-alive repeats this with each refresh.
    pub tcp_liberal: bool,
}

impl CtUpdate {
    /// An update of the entry with this original tuple and zone that changes nothing yet.
    pub fn new(orig: CtTuple, zone: u16) -> Self {
        CtUpdate {
            orig,
            zone,
            timeout: None,
            tcp_liberal: false,
        }
    }

    /// The update for `entry` (keyed by its original tuple and zone).
    pub fn for_entry(entry: &CtEntry) -> Self {
        Self::new(entry.orig, entry.zone)
    }

    /// Also sets the timeout to `secs` seconds from now.
    pub fn timeout(mut self, secs: u32) -> Self {
        self.timeout = Some(secs);
        self
    }

    /// Also marks both TCP directions "be liberal" (see [`CtUpdate::tcp_liberal`]).
    pub fn tcp_liberal(mut self) -> Self {
        self.tcp_liberal = true;
        self
    }

    /// The request attributes.
    pub(super) fn attributes(&self) -> Vec<ConntrackAttribute> {
        let mut attrs = key_attributes(&self.orig, self.zone);
        if let Some(t) = self.timeout {
            attrs.push(ConntrackAttribute::CtaTimeout(t));
        }
        if self.tcp_liberal && self.orig.proto == IPPROTO_TCP {
            let flags = || {
                // struct nf_ct_tcp_flags { flags, mask }: the kernel clears the mask's bits,
                // then sets those of flags. TCPFlags is non-exhaustive; its parser is the
                // public constructor.
                TCPFlags::parse(&[
                    TCP_FLAG_BE_LIBERAL,
                    TCP_FLAG_BE_LIBERAL | TCP_FLAG_MAXACK_SET,
                ])
                .expect("two bytes always parse as TCP flags")
            };
            attrs.push(ConntrackAttribute::CtaProtoInfo(vec![ProtoInfo::TCP(
                vec![
                    ProtoInfoTCP::OriginalFlags(flags()),
                    ProtoInfoTCP::ReplyFlags(flags()),
                ],
            )]));
        }
        attrs
    }
}

/// `CTA_TUPLE_ORIG` (+ `CTA_ZONE` when not 0): what the kernel looks an entry up by.
pub(super) fn key_attributes(orig: &CtTuple, zone: u16) -> Vec<ConntrackAttribute> {
    let mut attrs = vec![ConntrackAttribute::CtaTupleOrig(tuple_attributes(orig))];
    if zone != 0 {
        attrs.push(ConntrackAttribute::Other(
            netlink_packet_core::DefaultNla::new(CTA_ZONE, zone.to_be_bytes().to_vec()),
        ));
    }
    attrs
}

pub(super) fn family_of(tuple: &CtTuple) -> NetfilterProtoFamily {
    if tuple.src.is_ipv6() {
        NetfilterProtoFamily::IPv6
    } else {
        NetfilterProtoFamily::IPv4
    }
}

/// Builds one ctnetlink request datagram.
pub fn encode_request(
    family: NetfilterProtoFamily,
    msg: ConntrackMessage,
    flags: u16,
    seq: u32,
) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let mut packet = NetlinkMessage::new(
        header,
        NetlinkPayload::from(NetfilterMessage::new(
            NetfilterHeader::new(family, 0, 0),
            msg,
        )),
    );
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf);
    buf
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use netlink_packet_core::{
        NLA_TYPE_MASK, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, Nla,
    };
    use netlink_packet_netfilter::{NetfilterMessageInner, conntrack::Tuple};

    use super::*;
    use crate::flows::conntrack::IPPROTO_UDP;
    use crate::sync::{conntrack::decode_message, datagram::messages};

    fn tcp4() -> CtTuple {
        CtTuple {
            src: IpAddr::V4(Ipv4Addr::new(10, 71, 1, 2)),
            dst: IpAddr::V4(Ipv4Addr::new(10, 71, 2, 2)),
            proto: IPPROTO_TCP,
            sport: 47252,
            dport: 5002,
        }
    }

    /// Encodes `update` as the socket would and decodes it back with the crate's parser.
    fn round_trip(update: &CtUpdate) -> (NetlinkHeader, NetfilterMessage) {
        let bytes = encode_request(
            family_of(&update.orig),
            ConntrackMessage::New(update.attributes()),
            NLM_F_REQUEST | NLM_F_ACK,
            42,
        );
        let msg = decode_message(&bytes).expect("request decodes");
        assert_eq!(msg.header.length as usize, bytes.len());
        match msg.payload {
            NetlinkPayload::InnerMessage(m) => (msg.header, m),
            other => panic!("unexpected payload {other:?}"),
        }
    }

    fn attrs(m: &NetfilterMessage) -> &[ConntrackAttribute] {
        match &m.inner {
            NetfilterMessageInner::Conntrack(ConntrackMessage::New(a)) => a,
            other => panic!("not IPCTNL_MSG_CT_NEW: {other:?}"),
        }
    }

    #[test]
    fn update_never_creates_and_carries_timeout_and_liberal_flags() {
        let update = CtUpdate::new(tcp4(), 0).timeout(120).tcp_liberal();
        let (header, msg) = round_trip(&update);
        // (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW
        assert_eq!(header.message_type, 0x0100);
        assert_eq!(
            header.flags & (NLM_F_CREATE | NLM_F_EXCL),
            0,
            "must not create"
        );
        assert_eq!(header.flags, NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(header.sequence_number, 42);
        assert_eq!(msg.header.family, NetfilterProtoFamily::IPv4);
        let attrs = attrs(&msg);
        assert_eq!(attrs.len(), 3, "tuple, timeout, protoinfo: {attrs:?}");
        let ConntrackAttribute::CtaTupleOrig(t) = &attrs[0] else {
            panic!("first attribute is CTA_TUPLE_ORIG: {attrs:?}");
        };
        assert_eq!(t, &tuple_attributes(&tcp4()));
        assert_eq!(attrs[1], ConntrackAttribute::CtaTimeout(120));
        let ConntrackAttribute::CtaProtoInfo(info) = &attrs[2] else {
            panic!("third attribute is CTA_PROTOINFO: {attrs:?}");
        };
        let [ProtoInfo::TCP(tcp)] = info.as_slice() else {
            panic!("CTA_PROTOINFO_TCP expected: {info:?}");
        };
        for (i, item) in tcp.iter().enumerate() {
            let f = match item {
                ProtoInfoTCP::OriginalFlags(f) | ProtoInfoTCP::ReplyFlags(f) => f,
                other => panic!("only flags are sent: {other:?}"),
            };
            // Sets BE_LIBERAL, clears MAXACK_SET; no other flag is touched.
            assert_eq!((f.flags, f.mask), (0x08, 0x28), "direction {i}");
        }
        assert_eq!(tcp.len(), 2);
    }

    #[test]
    fn update_keys_by_zone_and_family() {
        let udp6 = CtTuple {
            src: IpAddr::V6(Ipv6Addr::new(0xfd71, 1, 0, 0, 0, 0, 0, 2)),
            dst: IpAddr::V6(Ipv6Addr::new(0xfd71, 2, 0, 0, 0, 0, 0, 2)),
            proto: IPPROTO_UDP,
            sport: 40002,
            dport: 5001,
        };
        // Liberal flags are TCP-only; zone 0 is implicit, other zones are sent.
        let (_, msg) = round_trip(&CtUpdate::new(udp6, 9).timeout(30).tcp_liberal());
        assert_eq!(msg.header.family, NetfilterProtoFamily::IPv6);
        let attrs = attrs(&msg);
        assert!(matches!(&attrs[0], ConntrackAttribute::CtaTupleOrig(t)
            if matches!(&t[0], Tuple::Ip(_))));
        let zone = attrs
            .iter()
            .find_map(|a| match a {
                ConntrackAttribute::Other(n) if n.kind() & NLA_TYPE_MASK == CTA_ZONE => {
                    let mut v = [0u8; 2];
                    n.emit_value(&mut v);
                    Some(u16::from_be_bytes(v))
                }
                _ => None,
            })
            .expect("CTA_ZONE sent");
        assert_eq!(zone, 9);
        assert!(
            !attrs
                .iter()
                .any(|a| matches!(a, ConntrackAttribute::CtaProtoInfo(_)))
        );

        let (_, msg) = round_trip(&CtUpdate::new(tcp4(), 0));
        assert_eq!(
            super::tests::attrs(&msg).len(),
            1,
            "zone 0 and no changes: only the tuple"
        );
    }

    #[test]
    fn a_datagram_of_requests_splits_into_them() {
        let a = encode_request(
            NetfilterProtoFamily::Unspec,
            ConntrackMessage::Get(vec![]),
            NLM_F_REQUEST | NLM_F_DUMP,
            1,
        );
        let b = encode_request(
            NetfilterProtoFamily::IPv4,
            ConntrackMessage::New(CtUpdate::new(tcp4(), 0).timeout(5).attributes()),
            NLM_F_REQUEST,
            2,
        );
        let mut datagram = a.clone();
        datagram.extend_from_slice(&b);
        let parts: Vec<_> = messages(&datagram)
            .collect::<Result<_, _>>()
            .expect("splits");
        assert_eq!(parts, vec![a.as_slice(), b.as_slice()]);

        // A truncated trailing message is an error, not a panic or a silent stop.
        datagram.extend_from_slice(&[0x40, 0, 0, 0, 0]);
        let results: Vec<_> = messages(&datagram).collect();
        assert_eq!(results.len(), 3);
        assert!(results[2].is_err());
    }
}
