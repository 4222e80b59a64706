//! The pure translation from ctnetlink messages to conntrack entries and events (the domain
//! values of [`crate::flows::conntrack`]), and of a tuple back to attributes for requests.
//!
//! [`CtMessage::event`] is the one place where a ctnetlink message from the event groups
//! becomes a [`CtEvent`] (and [`CtMessage::entry`] the one for dump and get replies).
//!
//! The attributes are decoded here, in place from the received datagram, with the attribute
//! iterator of `netlink-packet-core` and only the attributes the daemon reads: the owned
//! attribute trees of `netlink-packet-netfilter` cost an allocation per attribute, a dozen per
//! message, on the path every new connection takes (see docs/benchmarks.md, connection
//! churn). That crate still encodes the daemon's requests and decodes the control messages
//! (errors, end of dump) of their answers.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{
    DecodeError, NLA_TYPE_MASK, NetlinkBuffer, NetlinkMessage, NlaBuffer, NlasIterator,
};
use netlink_packet_netfilter::{
    NetfilterMessage,
    conntrack::{IPTuple, ProtoTuple, Tuple},
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
    /// An attribute's header is cut off or its length runs past the end of its nest.
    #[error("malformed attribute in {0}")]
    Malformed(&'static str),
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

/// `NFNL_SUBSYS_CTNETLINK`: the high byte of a conntrack message's netlink type.
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
/// `IPCTNL_MSG_CT_NEW`: NEW and UPDATE events, dump and get replies.
const IPCTNL_MSG_CT_NEW: u16 = 0;
/// `IPCTNL_MSG_CT_DELETE`: DESTROY events.
const IPCTNL_MSG_CT_DELETE: u16 = 2;
/// `struct nfgenmsg` ahead of the attributes: family, version, resource id.
const NFGENMSG_LEN: usize = 4;

/// `CTA_TUPLE_ORIG`, `CTA_TUPLE_REPLY` (nested tuples).
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
/// `CTA_STATUS` (u32, network byte order).
const CTA_STATUS: u16 = 3;
/// `CTA_PROTOINFO` (nested), holding `CTA_PROTOINFO_TCP` (nested).
const CTA_PROTOINFO: u16 = 4;
const CTA_PROTOINFO_TCP: u16 = 1;
const CTA_PROTOINFO_TCP_STATE: u16 = 1;
const CTA_PROTOINFO_TCP_FLAGS_ORIGINAL: u16 = 4;
const CTA_PROTOINFO_TCP_FLAGS_REPLY: u16 = 5;
/// `CTA_TIMEOUT`, `CTA_MARK` (u32, network byte order).
const CTA_TIMEOUT: u16 = 7;
const CTA_MARK: u16 = 8;
/// Inside a tuple: `CTA_TUPLE_IP` (addresses) and `CTA_TUPLE_PROTO` (protocol and ports).
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;

/// Decodes the control messages of a request's answer (`NLMSG_ERROR`, `NLMSG_DONE`); the
/// conntrack messages themselves are read in place with [`CtMessage::parse`].
pub fn decode_message(bytes: &[u8]) -> Result<NetlinkMessage<NetfilterMessage>, DecodeError> {
    NetlinkMessage::<NetfilterMessage>::deserialize(bytes)
}

/// What a ctnetlink conntrack message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtMessageKind {
    /// `IPCTNL_MSG_CT_NEW`: a NEW or UPDATE event, a dump or get reply.
    New,
    /// `IPCTNL_MSG_CT_DELETE`: a DESTROY event.
    Delete,
}

/// One ctnetlink conntrack message, read in place from the received datagram: its header's
/// flags and sender, and its attributes, decoded only when asked for (no allocation).
#[derive(Debug, Clone, Copy)]
pub struct CtMessage<'a> {
    pub kind: CtMessageKind,
    /// The netlink header's flags.
    pub flags: u16,
    /// The netlink port of the socket whose request caused it (0: the kernel's own events).
    pub port: u32,
    attrs: &'a [u8],
}

impl<'a> CtMessage<'a> {
    /// Reads one whole netlink message (header included); `Ok(None)` for anything that is not
    /// a conntrack NEW or DELETE message (control messages, other subsystems, GET requests,
    /// statistics).
    pub fn parse(raw: &'a [u8]) -> Result<Option<Self>, DecodeError> {
        let nl = NetlinkBuffer::new_checked(raw)?;
        let ty = nl.message_type();
        if ty >> 8 != NFNL_SUBSYS_CTNETLINK {
            return Ok(None);
        }
        let kind = match ty & 0xff {
            IPCTNL_MSG_CT_NEW => CtMessageKind::New,
            IPCTNL_MSG_CT_DELETE => CtMessageKind::Delete,
            _ => return Ok(None),
        };
        let payload = nl.payload();
        let attrs = payload
            .get(NFGENMSG_LEN..)
            .ok_or_else(|| DecodeError::from("conntrack message shorter than its nfgenmsg"))?;
        Ok(Some(CtMessage {
            kind,
            flags: nl.flags(),
            port: nl.port_number(),
            attrs,
        }))
    }

    /// The conntrack event it reports: `IPCTNL_MSG_CT_NEW` becomes [`CtEvent::New`] when
    /// flagged `NLM_F_CREATE|NLM_F_EXCL` (how `ctnetlink_conntrack_event()` marks NEW events)
    /// and [`CtEvent::Update`] otherwise (UPDATE events, dump and get replies);
    /// `IPCTNL_MSG_CT_DELETE` (DESTROY events) becomes [`CtEvent::Destroy`].
    pub fn event(&self) -> Result<CtEvent, CtParseError> {
        let created = self.flags & (NLM_F_CREATE | NLM_F_EXCL) == NLM_F_CREATE | NLM_F_EXCL;
        let entry = entry_from_attributes(self.attrs)?;
        Ok(match self.kind {
            CtMessageKind::New if created => CtEvent::New(entry),
            CtMessageKind::New => CtEvent::Update(entry),
            CtMessageKind::Delete => CtEvent::Destroy(entry),
        })
    }

    /// The entry of a dump or get reply (`IPCTNL_MSG_CT_NEW`); `Ok(None)` for a DELETE.
    pub fn entry(&self) -> Result<Option<CtEntry>, CtParseError> {
        match self.kind {
            CtMessageKind::New => entry_from_attributes(self.attrs).map(Some),
            CtMessageKind::Delete => Ok(None),
        }
    }

    /// A dump entry's original tuple, zone and conntrack's own `[original, reply]` counters;
    /// `Ok(None)` for a DELETE, and for an entry without counters (`nf_conntrack_acct` off).
    pub fn counted(&self) -> Result<Option<(CtTuple, u16, DirTraffic)>, CtParseError> {
        let Some(entry) = self.entry()? else {
            return Ok(None);
        };
        Ok(counters_from_attributes(self.attrs)?.map(|c| (entry.orig, entry.zone, c)))
    }
}

/// The attributes (`NLA_TYPE_MASK`ed kind, value) of a nest; a malformed one ends the walk with
/// an error naming the nest.
fn attributes<'a>(
    nest: &'a [u8],
    name: &'static str,
) -> impl Iterator<Item = Result<(u16, &'a [u8]), CtParseError>> {
    NlasIterator::new(nest).map(move |nla| {
        let nla: NlaBuffer<&'a [u8]> = nla.map_err(|_| CtParseError::Malformed(name))?;
        let (kind, len) = (nla.kind() & NLA_TYPE_MASK, usize::from(nla.length()));
        // The attribute header is 4 bytes; new_checked (in the iterator) bounded the length.
        let value = nla
            .into_inner()
            .get(4..len)
            .ok_or(CtParseError::Malformed(name))?;
        Ok((kind, value))
    })
}

/// Builds a [`CtEntry`] from the top-level `CTA_*` attributes of a conntrack message.
pub fn entry_from_attributes(attrs: &[u8]) -> Result<CtEntry, CtParseError> {
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
    for attr in attributes(attrs, "conntrack attributes") {
        let (kind, value) = attr?;
        match kind {
            CTA_TUPLE_ORIG => orig = Some(tuple_from(value, "CTA_TUPLE_ORIG")?),
            CTA_TUPLE_REPLY => reply = Some(tuple_from(value, "CTA_TUPLE_REPLY")?),
            CTA_STATUS => {
                entry.status =
                    CtStatus::from_bits_retain(u32::from_be_bytes(fixed(value, "CTA_STATUS")?));
            }
            CTA_TIMEOUT => entry.timeout = Some(u32::from_be_bytes(fixed(value, "CTA_TIMEOUT")?)),
            CTA_MARK => entry.mark = u32::from_be_bytes(fixed(value, "CTA_MARK")?),
            CTA_PROTOINFO => {
                for info in attributes(value, "CTA_PROTOINFO") {
                    let (kind, tcp) = info?;
                    if kind == CTA_PROTOINFO_TCP {
                        read_tcp_protoinfo(tcp, &mut entry)?;
                    }
                }
            }
            CTA_ID => entry.id = Some(u32::from_be_bytes(fixed(value, "CTA_ID")?)),
            CTA_ZONE => entry.zone = u16::from_be_bytes(fixed(value, "CTA_ZONE")?),
            CTA_HELP => entry.has_helper = true,
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

/// The `CTA_COUNTERS_ORIG` / `CTA_COUNTERS_REPLY` of a conntrack message's attributes; `None`
/// when it has neither.
pub fn counters_from_attributes(attrs: &[u8]) -> Result<Option<DirTraffic>, CtParseError> {
    let mut found = false;
    let mut counters = DirTraffic::default();
    for attr in attributes(attrs, "conntrack attributes") {
        let (kind, value) = attr?;
        let (dir, name) = match kind {
            CTA_COUNTERS_ORIG => (0, "CTA_COUNTERS_ORIG"),
            CTA_COUNTERS_REPLY => (1, "CTA_COUNTERS_REPLY"),
            _ => continue,
        };
        counters[dir] = traffic_from_nested(value, name)?;
        found = true;
    }
    Ok(found.then_some(counters))
}

/// The packets and bytes inside one `CTA_COUNTERS_*`.
fn traffic_from_nested(nested: &[u8], name: &'static str) -> Result<Traffic, CtParseError> {
    let mut t = Traffic::default();
    for attr in attributes(nested, name) {
        let (kind, value) = attr?;
        match kind {
            CTA_COUNTERS_PACKETS => {
                t.packets = u64::from_be_bytes(fixed(value, "CTA_COUNTERS_PACKETS")?);
            }
            CTA_COUNTERS_BYTES => t.bytes = u64::from_be_bytes(fixed(value, "CTA_COUNTERS_BYTES")?),
            _ => {}
        }
    }
    Ok(t)
}

const UNSPECIFIED_TUPLE: CtTuple = CtTuple {
    src: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    dst: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    proto: 0,
    sport: 0,
    dport: 0,
};

/// The state and the `[original, reply]` flags of a `CTA_PROTOINFO_TCP`.
fn read_tcp_protoinfo(tcp: &[u8], entry: &mut CtEntry) -> Result<(), CtParseError> {
    let mut flags = [0u8; 2];
    let mut have_flags = false;
    for item in attributes(tcp, "CTA_PROTOINFO_TCP") {
        let (kind, value) = item?;
        match kind {
            CTA_PROTOINFO_TCP_STATE => {
                entry.tcp_state = Some(fixed::<1>(value, "CTA_PROTOINFO_TCP_STATE")?[0]);
            }
            // `struct nf_ct_tcp_flags`: flags, then mask.
            CTA_PROTOINFO_TCP_FLAGS_ORIGINAL => {
                flags[0] = fixed::<2>(value, "CTA_PROTOINFO_TCP_FLAGS_ORIGINAL")?[0];
                have_flags = true;
            }
            CTA_PROTOINFO_TCP_FLAGS_REPLY => {
                flags[1] = fixed::<2>(value, "CTA_PROTOINFO_TCP_FLAGS_REPLY")?[0];
                have_flags = true;
            }
            _ => {}
        }
    }
    if have_flags {
        entry.tcp_flags = Some(flags);
    }
    Ok(())
}

fn tuple_from(nest: &[u8], name: &'static str) -> Result<CtTuple, CtParseError> {
    let (mut src, mut dst, mut proto) = (None, None, None);
    let (mut sport, mut dport) = (0, 0);
    for part in attributes(nest, name) {
        let (kind, value) = part?;
        match kind {
            CTA_TUPLE_IP => {
                for ip in attributes(value, "CTA_TUPLE_IP") {
                    let (kind, a) = ip?;
                    match kind {
                        CTA_IP_V4_SRC => src = Some(v4(a, "CTA_IP_V4_SRC")?),
                        CTA_IP_V4_DST => dst = Some(v4(a, "CTA_IP_V4_DST")?),
                        CTA_IP_V6_SRC => src = Some(v6(a, "CTA_IP_V6_SRC")?),
                        CTA_IP_V6_DST => dst = Some(v6(a, "CTA_IP_V6_DST")?),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for p in attributes(value, "CTA_TUPLE_PROTO") {
                    let (kind, v) = p?;
                    match kind {
                        CTA_PROTO_NUM => proto = Some(fixed::<1>(v, "CTA_PROTO_NUM")?[0]),
                        CTA_PROTO_SRC_PORT => {
                            sport = u16::from_be_bytes(fixed(v, "CTA_PROTO_SRC_PORT")?);
                        }
                        CTA_PROTO_DST_PORT => {
                            dport = u16::from_be_bytes(fixed(v, "CTA_PROTO_DST_PORT")?);
                        }
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

fn v4(value: &[u8], name: &'static str) -> Result<IpAddr, CtParseError> {
    Ok(IpAddr::V4(Ipv4Addr::from(fixed::<4>(value, name)?)))
}

fn v6(value: &[u8], name: &'static str) -> Result<IpAddr, CtParseError> {
    Ok(IpAddr::V6(Ipv6Addr::from(fixed::<16>(value, name)?)))
}

/// A fixed-size attribute value.
fn fixed<const N: usize>(value: &[u8], name: &'static str) -> Result<[u8; N], CtParseError> {
    <[u8; N]>::try_from(value).map_err(|_| CtParseError::BadLength {
        name,
        len: value.len(),
        expected: N,
    })
}

#[cfg(test)]
mod tests;
