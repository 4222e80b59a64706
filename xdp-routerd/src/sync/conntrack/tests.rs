//! Golden bytes: real ctnetlink messages captured from Linux 6.18 in a client ⇄ router
//! (iptables MASQUERADE) ⇄ server netns topology like `tests/tests/ctnetlink/`, read raw
//! from a dump and from an event socket in the router namespace (hex of whole netlink
//! messages, header included).

use std::net::{Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{DefaultNla, Emitable, NetlinkPayload, Nla};
use netlink_packet_netfilter::{
    NetfilterMessageInner,
    conntrack::{ConntrackAttribute, ConntrackMessage},
};

use super::*;
use crate::flows::conntrack::{IPPROTO_TCP, IPPROTO_UDP, NotOffloadable, tcp_state};

/// dump entry: TCP 10.71.1.2:47252 -> 10.71.2.2:5002, ESTABLISHED, ASSURED, masqueraded to 10.71.2.1.
const TCP_ESTABLISHED_SNAT_V4: &str = concat!(
    "d40000000001020007000000b67f899b020000003400018014000180080001000a470102080002000a470202",
    "1c000280050001000600000006000200b894000006000300138a00003400028014000180080001000a470202",
    "080002000a4702011c000280050001000600000006000200138a000006000300b8940000080003000000019e",
    "080008000000000008000c00922bacd508000b0000000001080007000006977f300004802c00018005000100",
    "03000000050002000a000000050003000a00000006000400230000000600050023000000",
);
/// dump entry: UDP 10.71.1.2:40001 -> 10.71.2.2:5001, SEEN_REPLY, ASSURED, masqueraded.
const UDP_ASSURED_V4: &str = concat!(
    "a40000000001020007000000b67f899b020000003400018014000180080001000a470102080002000a470202",
    "1c0002800500010011000000060002009c41000006000300138900003400028014000180080001000a470202",
    "080002000a4702011c00028005000100110000000600020013890000060003009c410000080003000000019e",
    "080008000000000008000c003399d01808000b00000000010800070000000077",
);
/// dump entry: UDP [fd71:1::2]:40002 -> [fd71:2::2]:5001, ASSURED, masqueraded to fd71:2::1.
const UDP_ASSURED_V6: &str = concat!(
    "d40000000001020007000000b67f899b0a0000004c0001802c00018014000300fd7100010000000000000000",
    "0000000214000400fd7100020000000000000000000000021c0002800500010011000000060002009c420000",
    "06000300138900004c0002802c00018014000300fd71000200000000000000000000000214000400fd710002",
    "0000000000000000000000011c00028005000100110000000600020013890000060003009c42000008000300",
    "0000019e080008000000000008000c00ec4d1f9408000b00000000010800070000000077",
);
/// dump entry: TCP [fd71:1::2]:34924 -> [fd71:2::2]:5002, ESTABLISHED, ASSURED.
const TCP_ESTABLISHED_V6: &str = concat!(
    "040100000001020007000000b67f899b0a0000004c0001802c00018014000300fd7100010000000000000000",
    "0000000214000400fd7100020000000000000000000000021c000280050001000600000006000200886c0000",
    "06000300138a00004c0002802c00018014000300fd71000200000000000000000000000214000400fd710002",
    "0000000000000000000000011c000280050001000600000006000200138a000006000300886c000008000300",
    "0000019e080008000000000008000c007d05ee6908000b0000000001080007000006977f300004802c000180",
    "0500010003000000050002000a000000050003000a00000006000400230000000600050023000000",
);
/// NEW event (NLM_F_CREATE|NLM_F_EXCL) for the UDP flow of UDP_ASSURED_V4, before any reply.
const EVENT_NEW_UDP: &str = concat!(
    "94000000000100060000000000000000020000003400018014000180080001000a470102080002000a470202",
    "1c0002800500010011000000060002009c41000006000300138900003400028014000180080001000a470202",
    "080002000a4702011c00028005000100110000000600020013890000060003009c41000008000c003399d018",
    "0800030000000198080007000000001e",
);
/// UPDATE event for the same flow: reply seen, not yet assured.
const EVENT_UPDATE_UDP_REPLIED: &str = concat!(
    "94000000000100000000000000000000020000003400018014000180080001000a470102080002000a470202",
    "1c0002800500010011000000060002009c41000006000300138900003400028014000180080001000a470202",
    "080002000a4702011c00028005000100110000000600020013890000060003009c41000008000c003399d018",
    "080003000000019a080007000000001e",
);
/// DESTROY event (`conntrack -D`) for the same flow.
const EVENT_DESTROY_UDP: &str = concat!(
    "9400000002010000000000000875b8f7020000003400018014000180080001000a470102080002000a470202",
    "1c0002800500010011000000060002009c41000006000300138900003400028014000180080001000a470202",
    "080002000a4702011c00028005000100110000000600020013890000060003009c41000008000c003399d018",
    "080003000000039e0800070000000077",
);
/// dump entry: TCP 10.71.1.2:39612 -> 10.71.2.2:5003 whose SYN the server drops.
const TCP_SYN_SENT: &str = concat!(
    "d40000000001020007000000b67f899b020000003400018014000180080001000a470102080002000a470202",
    "1c0002800500010006000000060002009abc000006000300138b00003400028014000180080001000a470202",
    "080002000a4702011c000280050001000600000006000200138b0000060003009abc00000800030000000198",
    "080008000000000008000c0047e6fdb408000b00000000010800070000000077300004802c00018005000100",
    "01000000050002000a000000050003000000000006000400030000000600050000000000",
);
/// dump entry: UDP 10.71.1.2:40003 -> 10.71.2.2:5004 that the server drops.
const UDP_UNREPLIED: &str = concat!(
    "a40000000001020007000000b67f899b020000003400018014000180080001000a470102080002000a470202",
    "1c0002800500010011000000060002009c43000006000300138c00003400028014000180080001000a470202",
    "080002000a4702011c000280050001001100000006000200138c0000060003009c4300000800030000000198",
    "080008000000000008000c002316767e08000b0000000001080007000000001b",
);
/// dump entry: TCP to port 21 with the ftp helper attached (`-j CT --helper ftp`).
const TCP_FTP_HELPER: &str = concat!(
    "e00000000001020007000000b67f899b020000003400018014000180080001000a470102080002000a470202",
    "1c000280050001000600000006000200aa6a000006000300001500003400028014000180080001000a470202",
    "080002000a4702011c0002800500010006000000060002000015000006000300aa6a0000080003000000219e",
    "080008000000000008000c00a74dc08f08000b0000000001080007000006977f300004802c00018005000100",
    "03000000050002000a000000050003000a000000060004002300000006000500230000000c00058008000100",
    "66747000",
);
/// dump entry: ICMP echo 10.71.1.2 -> 10.71.2.2.
const ICMP_ECHO: &str = concat!(
    "b40000000001020007000000b67f899b020000003c00018014000180080001000a470102080002000a470202",
    "24000280050001000100000006000400c68c0000050005000800000005000600000000003c00028014000180",
    "080001000a470202080002000a47020124000280050001000100000006000400c68c00000500050000000000",
    "0500060000000000080003000000019a080008000000000008000c00d72eab7708000b000000000108000700",
    "0000001d",
);

fn unhex(hex: &str) -> Vec<u8> {
    assert_eq!(hex.len() % 2, 0);
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

fn netfilter(hex: &str) -> NetfilterMessage {
    let msg = decode_message(&unhex(hex)).expect("golden message decodes");
    match msg.payload {
        NetlinkPayload::InnerMessage(m) => m,
        other => panic!("not a netfilter message: {other:?}"),
    }
}

/// The event a message translates to, with the flags of its own netlink header.
fn event_of(bytes: &[u8]) -> CtEvent {
    CtMessage::parse(bytes)
        .expect("message decodes")
        .expect("is a conntrack message")
        .event()
        .expect("translates")
}

/// The event a golden message translates to.
fn event(hex: &str) -> CtEvent {
    event_of(&unhex(hex))
}

/// A golden message with other netlink header flags.
fn with_flags(hex: &str, flags: u16) -> Vec<u8> {
    let mut bytes = unhex(hex);
    bytes[6..8].copy_from_slice(&flags.to_ne_bytes());
    bytes
}

/// Attributes as the kernel sends them (encoded by `netlink-packet-netfilter`, whose decoder
/// the daemon used before: the edited variants below check the in-place decoder against it).
fn emit<T: Nla>(attrs: &[T]) -> Vec<u8> {
    let mut buf = vec![0; attrs.buffer_len()];
    attrs.emit(&mut buf);
    buf
}

fn entry_of(attrs: &[ConntrackAttribute]) -> Result<CtEntry, CtParseError> {
    entry_from_attributes(&emit(attrs))
}

fn counters_of(attrs: &[ConntrackAttribute]) -> Result<Option<DirTraffic>, CtParseError> {
    counters_from_attributes(&emit(attrs))
}

/// The entry of a golden NEW/UPDATE event or dump entry.
fn upsert(hex: &str) -> CtEntry {
    match event(hex) {
        CtEvent::New(e) | CtEvent::Update(e) => e,
        other => panic!("expected an entry that exists, got {other:?}"),
    }
}

fn v4(a: [u8; 4]) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(a))
}

fn v6(s: &str) -> IpAddr {
    IpAddr::V6(s.parse::<Ipv6Addr>().expect("IPv6 literal"))
}

fn tuple(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, proto: u8) -> CtTuple {
    CtTuple {
        src,
        dst,
        proto,
        sport,
        dport,
    }
}

#[test]
fn tcp_established_snat_v4_is_offloadable() {
    let e = upsert(TCP_ESTABLISHED_SNAT_V4);
    let client = v4([10, 71, 1, 2]);
    let server = v4([10, 71, 2, 2]);
    let wan = v4([10, 71, 2, 1]);
    assert_eq!(e.orig, tuple(client, 47252, server, 5002, IPPROTO_TCP));
    assert_eq!(e.reply, tuple(server, 5002, wan, 47252, IPPROTO_TCP));
    assert_eq!(e.id, Some(2_452_335_829));
    assert_eq!(e.tcp_state, Some(tcp_state::ESTABLISHED));
    assert_eq!(e.tcp_flags, Some([0x23, 0x23]));
    assert_eq!(e.timeout, Some(431_999));
    assert_eq!((e.mark, e.zone, e.has_helper), (0, 0, false));
    assert!(e.is_snat() && !e.is_dnat());
    assert!(
        e.status
            .contains(CtStatus::SeenReply | CtStatus::Assured | CtStatus::Confirmed)
    );
    assert_eq!(e.offload_decision(), Ok(()));
}

#[test]
fn udp_assured_v4_is_offloadable() {
    let e = upsert(UDP_ASSURED_V4);
    let server = v4([10, 71, 2, 2]);
    assert_eq!(
        e.orig,
        tuple(v4([10, 71, 1, 2]), 40001, server, 5001, IPPROTO_UDP)
    );
    assert_eq!(
        e.reply,
        tuple(server, 5001, v4([10, 71, 2, 1]), 40001, IPPROTO_UDP)
    );
    assert_eq!(e.id, Some(865_718_296));
    assert_eq!(e.timeout, Some(119));
    assert_eq!((e.tcp_state, e.tcp_flags), (None, None));
    assert_eq!(e.offload_decision(), Ok(()));
}

#[test]
fn ipv6_entries_are_offloadable() {
    let u = upsert(UDP_ASSURED_V6);
    assert_eq!(
        u.orig,
        tuple(v6("fd71:1::2"), 40002, v6("fd71:2::2"), 5001, IPPROTO_UDP)
    );
    assert_eq!(
        u.reply,
        tuple(v6("fd71:2::2"), 5001, v6("fd71:2::1"), 40002, IPPROTO_UDP)
    );
    assert!(u.is_ipv6());
    assert_eq!(u.offload_decision(), Ok(()));

    let t = upsert(TCP_ESTABLISHED_V6);
    assert_eq!(
        t.orig,
        tuple(v6("fd71:1::2"), 34924, v6("fd71:2::2"), 5002, IPPROTO_TCP)
    );
    assert_eq!(t.reply.dst, v6("fd71:2::1"));
    assert_eq!(t.tcp_state, Some(tcp_state::ESTABLISHED));
    assert_eq!(t.offload_decision(), Ok(()));
}

#[test]
fn events_new_update_destroy_of_one_flow() {
    let new = upsert(EVENT_NEW_UDP);
    let update = upsert(EVENT_UPDATE_UDP_REPLIED);
    let CtEvent::Destroy(gone) = event(EVENT_DESTROY_UDP) else {
        panic!("DESTROY event must translate to CtEvent::Destroy");
    };
    let dumped = upsert(UDP_ASSURED_V4);
    for e in [&new, &update, &gone] {
        assert_eq!(e.id, dumped.id, "one entry, one CTA_ID");
        assert_eq!((e.orig, e.reply), (dumped.orig, dumped.reply));
    }
    assert_eq!(new.offload_decision(), Err(NotOffloadable::Unreplied));
    assert_eq!(update.offload_decision(), Err(NotOffloadable::NotAssured));
    assert!(gone.status.contains(CtStatus::Dying));
    assert_eq!(gone.offload_decision(), Err(NotOffloadable::Dying));
}

#[test]
fn new_update_and_destroy_are_told_apart_by_type_and_flags() {
    // The NEW event carries NLM_F_CREATE|NLM_F_EXCL; the UPDATE event no flags; a dump entry
    // NLM_F_MULTI (it exists, it is not new).
    assert!(matches!(event(EVENT_NEW_UDP), CtEvent::New(_)));
    assert!(matches!(
        event(EVENT_UPDATE_UDP_REPLIED),
        CtEvent::Update(_)
    ));
    assert!(matches!(event(UDP_ASSURED_V4), CtEvent::Update(_)));
    assert!(matches!(event(EVENT_DESTROY_UDP), CtEvent::Destroy(_)));
    let kinds: Vec<&str> = [EVENT_NEW_UDP, EVENT_UPDATE_UDP_REPLIED, EVENT_DESTROY_UDP]
        .map(|h| event(h).kind())
        .to_vec();
    assert_eq!(kinds, ["new", "update", "destroy"]);
    // Only both flags together mean NEW (NLM_F_EXCL alone is NLM_F_MATCH in GET requests).
    assert!(matches!(
        event_of(&with_flags(EVENT_NEW_UDP, NLM_F_EXCL)),
        CtEvent::Update(_)
    ));
    assert!(matches!(
        event_of(&with_flags(EVENT_NEW_UDP, NLM_F_CREATE | NLM_F_EXCL | 0x1)),
        CtEvent::New(_)
    ));
    // Replies: the entry whatever the flags; a DELETE message is not an entry.
    let reply = |hex| {
        let bytes = unhex(hex);
        let msg = CtMessage::parse(&bytes)
            .expect("decodes")
            .expect("conntrack");
        msg.entry()
    };
    assert_eq!(reply(UDP_ASSURED_V4), Ok(Some(upsert(UDP_ASSURED_V4))));
    assert_eq!(reply(EVENT_DESTROY_UDP), Ok(None));
}

#[test]
fn handshake_unreplied_helper_and_icmp_stay_in_the_kernel() {
    let syn = upsert(TCP_SYN_SENT);
    assert_eq!(syn.orig.dport, 5003);
    assert_eq!(
        syn.offload_decision(),
        Err(NotOffloadable::TcpState(tcp_state::SYN_SENT))
    );

    let lost = upsert(UDP_UNREPLIED);
    assert_eq!(lost.orig.dport, 5004);
    assert_eq!(lost.offload_decision(), Err(NotOffloadable::Unreplied));

    let ftp = upsert(TCP_FTP_HELPER);
    assert_eq!(ftp.orig.dport, 21);
    assert_eq!(ftp.tcp_state, Some(tcp_state::ESTABLISHED));
    assert!(ftp.has_helper);
    assert_eq!(ftp.offload_decision(), Err(NotOffloadable::Helper));

    let icmp = upsert(ICMP_ECHO);
    assert_eq!(icmp.orig.proto, 1);
    assert_eq!(icmp.reply.dst, v4([10, 71, 2, 1]));
    assert_eq!(icmp.offload_decision(), Err(NotOffloadable::Protocol(1)));
}

/// The attributes of a golden conntrack message, for edited variants.
fn attributes(hex: &str) -> Vec<ConntrackAttribute> {
    match netfilter(hex).inner {
        NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)) => attrs,
        other => panic!("not IPCTNL_MSG_CT_NEW: {other:?}"),
    }
}

#[test]
fn helper_is_seen_from_cta_help_or_the_status_bit() {
    let attrs = attributes(TCP_FTP_HELPER);
    // CTA_HELP alone (helper assigned automatically: no IPS_HELPER bit).
    let help_only: Vec<_> = attrs
        .iter()
        .map(|a| match a {
            ConntrackAttribute::CtaStatus(s) => {
                ConntrackAttribute::CtaStatus(s.difference(CtStatus::Helper))
            }
            a => a.clone(),
        })
        .collect();
    assert!(entry_of(&help_only).expect("parses").has_helper);
    // The status bit alone.
    let bit_only: Vec<_> = attrs
        .iter()
        .filter(
            |a| !matches!(a, ConntrackAttribute::Other(n) if n.kind() & NLA_TYPE_MASK == CTA_HELP),
        )
        .cloned()
        .collect();
    assert!(bit_only.len() < attrs.len(), "the golden carries CTA_HELP");
    assert!(entry_of(&bit_only).expect("parses").has_helper);
    // Neither.
    let neither: Vec<_> = help_only
        .iter()
        .filter(
            |a| !matches!(a, ConntrackAttribute::Other(n) if n.kind() & NLA_TYPE_MASK == CTA_HELP),
        )
        .cloned()
        .collect();
    let plain = entry_of(&neither).expect("parses");
    assert!(!plain.has_helper);
    assert_eq!(plain.offload_decision(), Ok(()));
}

#[test]
fn zone_and_mark_are_decoded() {
    let mut attrs = attributes(UDP_ASSURED_V4);
    attrs.push(ConntrackAttribute::Other(DefaultNla::new(
        CTA_ZONE,
        7u16.to_be_bytes().to_vec(),
    )));
    attrs.push(ConntrackAttribute::CtaMark(0x42));
    let e = entry_of(&attrs).expect("parses");
    assert_eq!((e.zone, e.mark), (7, 0x42));

    attrs.push(ConntrackAttribute::Other(DefaultNla::new(
        CTA_ZONE,
        vec![1],
    )));
    assert_eq!(
        entry_of(&attrs),
        Err(CtParseError::BadLength {
            name: "CTA_ZONE",
            len: 1,
            expected: 2
        })
    );
}

/// A nested `CTA_COUNTERS_*` attribute with these packets and bytes.
fn counters_attr(kind: u16, packets: u64, bytes: u64) -> ConntrackAttribute {
    let mut nested = Vec::new();
    for (k, v) in [(CTA_COUNTERS_PACKETS, packets), (CTA_COUNTERS_BYTES, bytes)] {
        nested.extend_from_slice(&12u16.to_ne_bytes());
        nested.extend_from_slice(&k.to_ne_bytes());
        nested.extend_from_slice(&v.to_be_bytes());
    }
    ConntrackAttribute::Other(DefaultNla::new(kind | 0x8000, nested))
}

#[test]
fn conntrack_counters_are_decoded_per_direction() {
    let mut attrs = attributes(TCP_ESTABLISHED_SNAT_V4);
    // Accounting off: the kernel sends no counters.
    assert_eq!(counters_of(&attrs), Ok(None));
    attrs.push(counters_attr(CTA_COUNTERS_ORIG, 71_000, 103_700_000));
    attrs.push(counters_attr(CTA_COUNTERS_REPLY, 35_000, 1_820_000));
    assert_eq!(
        counters_of(&attrs),
        Ok(Some([
            Traffic {
                packets: 71_000,
                bytes: 103_700_000
            },
            Traffic {
                packets: 35_000,
                bytes: 1_820_000
            },
        ]))
    );
    // A short value is an error, not a zero.
    let short = ConntrackAttribute::Other(DefaultNla::new(
        CTA_COUNTERS_ORIG,
        [8u16.to_ne_bytes(), CTA_COUNTERS_BYTES.to_ne_bytes(), [0, 1]].concat(),
    ));
    assert!(counters_of(&[short]).is_err());
}

#[test]
fn missing_tuples_are_errors() {
    let attrs = attributes(UDP_ASSURED_V4);
    let no_reply: Vec<_> = attrs
        .iter()
        .filter(|a| !matches!(a, ConntrackAttribute::CtaTupleReply(_)))
        .cloned()
        .collect();
    assert_eq!(
        entry_of(&no_reply),
        Err(CtParseError::Missing("CTA_TUPLE_REPLY"))
    );
    let no_proto: Vec<_> = attrs
        .iter()
        .map(|a| match a {
            ConntrackAttribute::CtaTupleOrig(t) => ConntrackAttribute::CtaTupleOrig(
                t.iter()
                    .filter(|p| !matches!(p, Tuple::Proto(_)))
                    .cloned()
                    .collect(),
            ),
            a => a.clone(),
        })
        .collect();
    assert_eq!(
        entry_of(&no_proto),
        Err(CtParseError::MissingInTuple {
            tuple: "CTA_TUPLE_ORIG",
            part: "CTA_PROTO_NUM"
        })
    );
}

#[test]
fn non_conntrack_messages_are_ignored() {
    // IPCTNL_MSG_CT_GET, another nfnetlink subsystem (NFNL_SUBSYS_CTNETLINK_EXP), NLMSG_DONE.
    for ty in [0x0101u16, 0x0200, 0x0003] {
        let mut bytes = unhex(EVENT_NEW_UDP);
        bytes[4..6].copy_from_slice(&ty.to_ne_bytes());
        assert!(matches!(CtMessage::parse(&bytes), Ok(None)), "type {ty:#x}");
    }
    // A conntrack message too short for its nfgenmsg is an error.
    let mut bytes = unhex(EVENT_NEW_UDP);
    bytes.truncate(18);
    bytes[0..4].copy_from_slice(&18u32.to_ne_bytes());
    assert!(CtMessage::parse(&bytes).is_err());
}

#[test]
fn attribute_lengths_past_their_nest_are_errors() {
    let mut attrs = emit(&attributes(UDP_ASSURED_V4));
    // The first attribute (CTA_TUPLE_ORIG) claims more bytes than there are.
    attrs[0..2].copy_from_slice(&u16::MAX.to_ne_bytes());
    assert_eq!(
        entry_from_attributes(&attrs),
        Err(CtParseError::Malformed("conntrack attributes"))
    );
}

#[test]
fn tuple_attributes_round_trip() {
    for t in [
        upsert(TCP_ESTABLISHED_SNAT_V4).orig,
        upsert(UDP_ASSURED_V6).reply,
    ] {
        assert_eq!(
            tuple_from(&emit(&tuple_attributes(&t)), "CTA_TUPLE_ORIG"),
            Ok(t)
        );
    }
}

#[test]
fn offload_rules_in_order() {
    let base = upsert(TCP_ESTABLISHED_SNAT_V4);
    let with = |f: &dyn Fn(&mut CtEntry)| {
        let mut e = base.clone();
        f(&mut e);
        e.offload_decision()
    };
    assert_eq!(with(&|_| {}), Ok(()));
    assert_eq!(
        with(&|e| e.reply.dst = v6("fd71:2::1")),
        Err(NotOffloadable::FamilyMismatch)
    );
    assert_eq!(
        with(&|e| e.status.remove(CtStatus::Assured)),
        Err(NotOffloadable::NotAssured)
    );
    assert_eq!(
        with(&|e| e.tcp_state = Some(tcp_state::FIN_WAIT)),
        Err(NotOffloadable::TcpState(tcp_state::FIN_WAIT))
    );
    assert_eq!(
        with(&|e| e.tcp_state = None),
        Err(NotOffloadable::TcpStateUnknown)
    );
    assert_eq!(
        with(&|e| {
            e.status.insert(CtStatus::Dying);
            e.has_helper = true;
        }),
        Err(NotOffloadable::Dying),
        "dying wins: the entry is about to go anyway"
    );
    assert_eq!(
        with(&|e| {
            e.orig.proto = 132;
            e.reply.proto = 132;
        }),
        Err(NotOffloadable::Protocol(132))
    );
    // UDP needs a reply even when assured (cannot happen in the kernel, but a crafted
    // status must not slip through).
    let mut udp = upsert(UDP_ASSURED_V4);
    udp.status.remove(CtStatus::SeenReply);
    assert_eq!(udp.offload_decision(), Err(NotOffloadable::Unreplied));
    assert_eq!(NotOffloadable::Unreplied.as_str(), "unreplied");
    assert_eq!(
        NotOffloadable::TcpState(tcp_state::SYN_SENT).to_string(),
        "TCP state SYN_SENT"
    );
}

/// Every golden message, for the mutation fuzzer below.
const GOLDEN: [&str; 7] = [
    EVENT_NEW_UDP,
    EVENT_UPDATE_UDP_REPLIED,
    EVENT_DESTROY_UDP,
    TCP_SYN_SENT,
    UDP_UNREPLIED,
    TCP_FTP_HELPER,
    ICMP_ECHO,
];

proptest::proptest! {
    /// Fuzz: ctnetlink messages from the kernel with bytes flipped, truncated or extended
    /// (attribute lengths, nesting, tuple contents) never panic the datagram splitter, the
    /// decoder or the translation into events; they become an error or an event.
    #[test]
    fn mutated_ctnetlink_messages_never_panic(
        which in 0..GOLDEN.len(),
        flips in proptest::collection::vec((0usize..512, proptest::num::u8::ANY), 1..8),
        cut in 0usize..512,
        tail in proptest::collection::vec(proptest::num::u8::ANY, 0..16),
    ) {
        let mut bytes = unhex(GOLDEN[which]);
        for (at, v) in flips {
            let n = bytes.len();
            bytes[at % n] = v;
        }
        bytes.truncate(cut.max(1).min(bytes.len()));
        bytes.extend(tail);
        for msg in crate::sync::datagram::messages(&bytes).flatten() {
            if let Ok(Some(msg)) = CtMessage::parse(msg) {
                let _ = msg.event();
                let _ = msg.entry();
                let _ = msg.counted();
            }
        }
    }
}
