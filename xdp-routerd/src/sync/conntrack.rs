//! The pure translation from ctnetlink messages to conntrack entries and events (the domain
//! values of [`crate::flows::conntrack`]), and of a tuple back to attributes for requests.
//!
//! [`event_from_message`] is the one place where a parsed ctnetlink message from the event
//! groups becomes a [`CtEvent`] (and [`entry_from_message`] the one for dump and get replies).
//!
//! The parsing of tuples, status, timeout, mark and TCP protoinfo comes from
//! `netlink-packet-netfilter`; CTA_ID, CTA_ZONE, CTA_HELP and the CTA_COUNTERS_* (which that
//! crate leaves as raw attributes) are decoded here.

use std::net::IpAddr;

use netlink_packet_core::{
    DecodeError, DefaultNla, NLA_TYPE_MASK, NetlinkMessage, Nla, NlaBuffer, NlasIterator,
};
use netlink_packet_netfilter::{
    NetfilterMessage, NetfilterMessageInner,
    conntrack::{
        ConntrackAttribute, ConntrackMessage, IPTuple, ProtoInfo, ProtoInfoTCP, ProtoTuple, Tuple,
    },
};

use crate::flows::{
    accounting::{DirTraffic, Traffic},
    conntrack::{CtEntry, CtEvent, CtStatus, CtTuple},
};

/// `CTA_HELP` (nested helper name): present when a helper (ftp, sip, ...) is attached.
pub const CTA_HELP: u16 = 5;
/// `CTA_ID`: the entry's 32-bit id (network byte order), stable for the entry's lifetime.
pub const CTA_ID: u16 = 12;
/// `CTA_ZONE`: the conntrack zone (u16, network byte order); absent means zone 0.
pub const CTA_ZONE: u16 = 18;

/// `CTA_COUNTERS_ORIG`: the original direction's packets and bytes (nested), sent while
/// `net.netfilter.nf_conntrack_acct` is 1. Bytes are the IP datagrams' lengths (`skb->len` at
/// the conntrack hook).
pub const CTA_COUNTERS_ORIG: u16 = 9;
/// `CTA_COUNTERS_REPLY`: the reply direction's, likewise.
pub const CTA_COUNTERS_REPLY: u16 = 10;
/// `CTA_COUNTERS_PACKETS` (u64, network byte order) inside a `CTA_COUNTERS_*`.
const CTA_COUNTERS_PACKETS: u16 = 1;
/// `CTA_COUNTERS_BYTES` (u64, network byte order).
const CTA_COUNTERS_BYTES: u16 = 2;

/// `tuple` as `CTA_TUPLE_*` sub-attributes, for requests keyed by it.
pub fn tuple_attributes(tuple: &CtTuple) -> Vec<Tuple> {
    vec![
        Tuple::Ip(vec![
            IPTuple::SourceAddress(tuple.src),
            IPTuple::DestinationAddress(tuple.dst),
        ]),
        Tuple::Proto(vec![
            ProtoTuple::Protocol(tuple.proto.into()),
            ProtoTuple::SourcePort(tuple.sport),
            ProtoTuple::DestinationPort(tuple.dport),
        ]),
    ]
}

/// A ctnetlink message that cannot be turned into a [`CtEntry`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CtParseError {
    /// A required attribute is missing.
    #[error("conntrack message without {0}")]
    Missing(&'static str),
    /// A tuple lacks an address or the protocol number.
    #[error("conntrack {tuple} without {part}")]
    MissingInTuple {
        /// Which tuple (`CTA_TUPLE_ORIG` or `CTA_TUPLE_REPLY`).
        tuple: &'static str,
        /// What is missing.
        part: &'static str,
    },
    /// An attribute has an unexpected size.
    #[error("conntrack attribute {name} has {len} bytes, expected {expected}")]
    BadLength {
        /// Attribute name.
        name: &'static str,
        /// Received length.
        len: usize,
        /// Expected length.
        expected: usize,
    },
}

/// `NLM_F_CREATE` (`uapi/linux/netlink.h`).
const NLM_F_CREATE: u16 = 0x400;
/// `NLM_F_EXCL`.
const NLM_F_EXCL: u16 = 0x200;

/// Decodes one netlink message from ctnetlink (a message of [`super::datagram::messages`]).
pub fn decode_message(bytes: &[u8]) -> Result<NetlinkMessage<NetfilterMessage>, DecodeError> {
    NetlinkMessage::<NetfilterMessage>::deserialize(bytes)
}

/// Turns a parsed nfnetlink message and the flags of its netlink header into a conntrack
/// event: `IPCTNL_MSG_CT_NEW` becomes [`CtEvent::New`] when flagged `NLM_F_CREATE|NLM_F_EXCL`
/// (how `ctnetlink_conntrack_event()` marks NEW events) and [`CtEvent::Update`] otherwise
/// (UPDATE events, dump and get replies); `IPCTNL_MSG_CT_DELETE` (DESTROY events) becomes
/// [`CtEvent::Destroy`]; anything else (other subsystems, GET requests, stats) is `Ok(None)`.
pub fn event_from_message(
    msg: &NetfilterMessage,
    nlmsg_flags: u16,
) -> Result<Option<CtEvent>, CtParseError> {
    let NetfilterMessageInner::Conntrack(ct) = &msg.inner else {
        return Ok(None);
    };
    let created = nlmsg_flags & (NLM_F_CREATE | NLM_F_EXCL) == NLM_F_CREATE | NLM_F_EXCL;
    Ok(match ct {
        ConntrackMessage::New(attrs) if created => {
            Some(CtEvent::New(entry_from_attributes(attrs)?))
        }
        ConntrackMessage::New(attrs) => Some(CtEvent::Update(entry_from_attributes(attrs)?)),
        ConntrackMessage::Delete(attrs) => Some(CtEvent::Destroy(entry_from_attributes(attrs)?)),
        _ => None,
    })
}

/// The entry of a dump or get reply (`IPCTNL_MSG_CT_NEW`); `Ok(None)` for anything else.
pub fn entry_from_message(msg: &NetfilterMessage) -> Result<Option<CtEntry>, CtParseError> {
    match &msg.inner {
        NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)) => {
            entry_from_attributes(attrs).map(Some)
        }
        _ => Ok(None),
    }
}

/// Builds a [`CtEntry`] from the top-level `CTA_*` attributes of a conntrack message.
pub fn entry_from_attributes(attrs: &[ConntrackAttribute]) -> Result<CtEntry, CtParseError> {
    let mut orig = None;
    let mut reply = None;
    let mut entry = CtEntry {
        id: None,
        // Placeholders, replaced below (both tuples are required).
        orig: UNSPECIFIED_TUPLE,
        reply: UNSPECIFIED_TUPLE,
        status: CtStatus::empty(),
        tcp_state: None,
        tcp_flags: None,
        timeout: None,
        mark: 0,
        zone: 0,
        has_helper: false,
    };
    for attr in attrs {
        match attr {
            ConntrackAttribute::CtaTupleOrig(t) => orig = Some(tuple_from(t, "CTA_TUPLE_ORIG")?),
            ConntrackAttribute::CtaTupleReply(t) => reply = Some(tuple_from(t, "CTA_TUPLE_REPLY")?),
            ConntrackAttribute::CtaStatus(s) => entry.status = *s,
            ConntrackAttribute::CtaTimeout(t) => entry.timeout = Some(*t),
            ConntrackAttribute::CtaMark(m) => entry.mark = *m,
            ConntrackAttribute::CtaProtoInfo(infos) => {
                for info in infos {
                    if let ProtoInfo::TCP(tcp) = info {
                        read_tcp_protoinfo(tcp, &mut entry);
                    }
                }
            }
            ConntrackAttribute::Other(nla) => match nla.kind() & NLA_TYPE_MASK {
                CTA_ID => {
                    entry.id = Some(u32::from_be_bytes(fixed_value(nla, "CTA_ID")?));
                }
                CTA_ZONE => entry.zone = u16::from_be_bytes(fixed_value(nla, "CTA_ZONE")?),
                CTA_HELP => entry.has_helper = true,
                _ => {}
            },
            _ => {}
        }
    }
    entry.orig = orig.ok_or(CtParseError::Missing("CTA_TUPLE_ORIG"))?;
    entry.reply = reply.ok_or(CtParseError::Missing("CTA_TUPLE_REPLY"))?;
    if entry.status.contains(CtStatus::Helper) {
        entry.has_helper = true;
    }
    Ok(entry)
}

/// A dump entry's original tuple, zone and conntrack's own `[original, reply]` counters;
/// `Ok(None)` for anything else, and for an entry without counters (`nf_conntrack_acct` off).
pub fn counted_from_message(
    msg: &NetfilterMessage,
) -> Result<Option<(CtTuple, u16, DirTraffic)>, CtParseError> {
    let NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)) = &msg.inner else {
        return Ok(None);
    };
    let entry = entry_from_attributes(attrs)?;
    Ok(counters_from_attributes(attrs)?.map(|c| (entry.orig, entry.zone, c)))
}

/// The `CTA_COUNTERS_ORIG` / `CTA_COUNTERS_REPLY` of a conntrack message; `None` when it has
/// neither.
pub fn counters_from_attributes(
    attrs: &[ConntrackAttribute],
) -> Result<Option<DirTraffic>, CtParseError> {
    let mut found = false;
    let mut counters = DirTraffic::default();
    for attr in attrs {
        let ConntrackAttribute::Other(nla) = attr else {
            continue;
        };
        let (dir, name) = match nla.kind() & NLA_TYPE_MASK {
            CTA_COUNTERS_ORIG => (0, "CTA_COUNTERS_ORIG"),
            CTA_COUNTERS_REPLY => (1, "CTA_COUNTERS_REPLY"),
            _ => continue,
        };
        let mut nested = vec![0; nla.value_len()];
        nla.emit_value(&mut nested);
        counters[dir] = traffic_from_nested(&nested, name)?;
        found = true;
    }
    Ok(found.then_some(counters))
}

/// The packets and bytes inside one `CTA_COUNTERS_*`.
fn traffic_from_nested(nested: &[u8], name: &'static str) -> Result<Traffic, CtParseError> {
    let mut t = Traffic::default();
    for nla in NlasIterator::new(nested) {
        let nla: NlaBuffer<&[u8]> = nla.map_err(|_| CtParseError::BadLength {
            name,
            len: nested.len(),
            expected: 24,
        })?;
        let value = |field| {
            <[u8; 8]>::try_from(nla.value())
                .map(u64::from_be_bytes)
                .map_err(|_| CtParseError::BadLength {
                    name: field,
                    len: nla.value().len(),
                    expected: 8,
                })
        };
        match nla.kind() & NLA_TYPE_MASK {
            CTA_COUNTERS_PACKETS => t.packets = value("CTA_COUNTERS_PACKETS")?,
            CTA_COUNTERS_BYTES => t.bytes = value("CTA_COUNTERS_BYTES")?,
            _ => {}
        }
    }
    Ok(t)
}

const UNSPECIFIED_TUPLE: CtTuple = CtTuple {
    src: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
    dst: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
    proto: 0,
    sport: 0,
    dport: 0,
};

fn read_tcp_protoinfo(tcp: &[ProtoInfoTCP], entry: &mut CtEntry) {
    let mut flags = [0u8; 2];
    let mut have_flags = false;
    for item in tcp {
        match item {
            ProtoInfoTCP::State(s) => entry.tcp_state = Some(*s),
            ProtoInfoTCP::OriginalFlags(f) => {
                flags[0] = f.flags;
                have_flags = true;
            }
            ProtoInfoTCP::ReplyFlags(f) => {
                flags[1] = f.flags;
                have_flags = true;
            }
            _ => {}
        }
    }
    if have_flags {
        entry.tcp_flags = Some(flags);
    }
}

fn tuple_from(parts: &[Tuple], name: &'static str) -> Result<CtTuple, CtParseError> {
    let (mut src, mut dst, mut proto) = (None, None, None);
    let (mut sport, mut dport) = (0, 0);
    for part in parts {
        match part {
            Tuple::Ip(ips) => {
                for ip in ips {
                    match ip {
                        IPTuple::SourceAddress(a) => src = Some(*a),
                        IPTuple::DestinationAddress(a) => dst = Some(*a),
                        _ => {}
                    }
                }
            }
            Tuple::Proto(ps) => {
                for p in ps {
                    match p {
                        ProtoTuple::Protocol(n) => proto = Some(u8::from(*n)),
                        ProtoTuple::SourcePort(s) => sport = *s,
                        ProtoTuple::DestinationPort(d) => dport = *d,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let missing = |part| CtParseError::MissingInTuple { tuple: name, part };
    Ok(CtTuple {
        src: src.ok_or_else(|| missing("source address"))?,
        dst: dst.ok_or_else(|| missing("destination address"))?,
        proto: proto.ok_or_else(|| missing("CTA_PROTO_NUM"))?,
        sport,
        dport,
    })
}

fn fixed_value<const N: usize>(
    nla: &DefaultNla,
    name: &'static str,
) -> Result<[u8; N], CtParseError> {
    let len = nla.value_len();
    if len != N {
        return Err(CtParseError::BadLength {
            name,
            len,
            expected: N,
        });
    }
    let mut out = [0u8; N];
    nla.emit_value(&mut out);
    Ok(out)
}

#[cfg(test)]
mod tests;
